// choose_softmax_kernel: the ONE table of heuristics of the softmax family, and the rules that apply it.
#include "softmax_dispatch.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <mutex>
#include <optional>
#include <tuple>

namespace softmax_ops {
namespace {

// ===================================================================================================
// Heuristics. Next to each number: the measurement behind it (GPU, date or session, results file under
// benchmarks/results/) or, where none was made (kGridWaves, kPrefetchMaxWaves, kFewRowsPerSm, the two-pass,
// split-row and strided CTA shapes), the reasoning. benchmarks/tune_softmax.py times every kernel against the
// choice; benchmarks/explain_snapshot.py lists the plans a change moves.
// ===================================================================================================
struct Heuristics {
  // warp kernel for rows of at most this many bytes per input stream (f32 1024 / f16 2048 / f64 512
  // columns). At 8 packs per lane a warp still holds such a row in 32 registers of data, and the warp
  // kernel needs no __syncthreads; OneFlow switches from warp to block at 1024 f32 columns, PyTorch's
  // persistent warp softmax at 1024 columns too. Longer rows want more threads per row for bytes in flight.
  static constexpr int64_t kWarpMaxRowBytes = 4096;
  // The backward holds two streams per lane: 8 packs of each cost the warp kernel ~130 registers (3 CTAs
  // per SM). Measured on H200 (2026-11-22), rows of 4 KB per stream: warp 0.63-0.82 of copy, block 0.88-1.0
  // (2048x2048 and 32768x2048 fp16); at 2 KB the two are even (0.84-0.93).
  static constexpr int64_t kWarpMaxRowBytesBackward = 2048;
  // Rows per SM the 8-pack warp kernel holds at once (4 CTAs of 4 warps, one row per warp): see
  // warp_max_row_bytes.
  static constexpr int64_t kWarpRowsPerSmOneWave = 16;
  // Packs per lane for rows of at most 32 packs (see plan_warp), forward and backward. The backward reads
  // two streams per pack: one pack per lane (more lanes and CTAs, shorter chains) measured best there. H100,
  // 2026-11-22, two interleaved runs of 4 / 2 / 1 packs per lane (*session7-ab3-*.json), 65536 x 64:
  // softmax_backward fp16 0.88 / 0.93 / 0.99, bf16 0.74-0.87 / 0.89 / 0.94, fp32 0.89 / 0.94 / 0.96,
  // log_softmax_backward 0.78-0.87 / 0.85-0.96 / 0.90-0.97; 16384 x 128, 16384 x 160 and 65536 x 256 within
  // the run-to-run noise of these small shapes (+-0.1).
  static constexpr int kWarpShortRowPacks = 4;
  static constexpr int kWarpShortRowPacksBackward = 1;
  // float32 forward rows: 2 packs per lane. H100, session 21 call 6 (two interleaved runs, 4 -> 2 packs, us, means;
  // *session21-c6-compare-fp32-short-rows-v2.txt*): softmax 65536 x 60 18.8 -> 16.7 (torch.compile 16.2, eager
  // 17.0 in call 5), 16384 x 64 -6%, 4096 x 60 -4%, 256 x 128 -4%, 65536 x 100 -3%, 65536 x 64 -2%; log_softmax
  // 65536 x 60 -14%, 16384 x 64 -10%; 16384 x 128 / 160 +2% / -1%, within the noise. One pack per lane lost up
  // to 25% (log_softmax 65536 x 96).
  static constexpr int kWarpShortRowPacksFloat = 2;
  // 16-bit forward rows of 13-16 whole packs (104-128 columns): 2 packs per lane on 8 lanes, not 4 on 4. H100,
  // session 24 call 2, three rounds in turns (*session24-c2-compare-mid-rows.txt*, us means, 4 -> 2 packs per
  // lane, fp16 / bf16): softmax 16384 x 128 9.2 -> 7.9 / 8.9 -> 8.2, 256 x 128 -6 / -8%, 131072 x 128 -4 / -2%;
  // log_softmax 16384 x 128 -10 / -4%, 256 x 128 -2 / -8%; 32768 x 112, 1024 x 120, 4096 x 128 and 65536 x 128
  // within +-5%, mixed; 2048 x 128 +7 / -1% (new rounds 5.5, 5.5, 8.3 us against 6.3, 6.2, 5.6), log_softmax +3 /
  // +4%. Call 1 agreed on 16384 x 128 (-11 / -7%, log_softmax -4 / -4%). Rows of 9-12 packs lost
  // (log_softmax 16384 x 72 +14 / +8%, 65536 x 80 +5 / +8%: 8 lanes holding 1-2 packs each pay a third level of
  // (max, sum) merges) and keep 4; so did 20 packs (16384 x 160 softmax +10 / +4%, call 1).
  // Widening forward rows (16-bit input, float32 result: softmax(x, dtype=torch.float32), the MoE router's form)
  // write twice the bytes they read. Rows of at most 32 whole packs take 2 packs per lane from
  // kWideningManyRowsPerSm rows per SM, else 4 (also for 13-16 packs); peeled rows keep the same-dtype rule
  // (not measured). H100, session 26 call 2 (two rounds in turns, 4 packs -> 2, us,
  // softmax fp16 / bf16, *session26-c2-compare-widening-2-packs.txt*): 65536 x 64 20.1 / 20.4 -> 13.5 / 13.3
  // (torch.compile 12.7 in call 1), 65536 x 128 -9 / -4%, 65536 x 256 -3 / 0%, log_softmax alike; but 16384 x 128
  // +4 / +6% and 16384 x 160 +12 / +11%. One pack per lane: the same or slower. Call 3 (this rule against the
  // rules before it, two rounds in turns, *session26-c3-compare-widening.txt*): 65536 x 64 -30..-34% for both
  // ops and dtypes, 65536 x 256 -2%, 65536 x 128 and the 16384-row shapes (unchanged plans) within +-6%.
  static constexpr int kWarpShortRowPacksWidening = 4;
  static constexpr int kWarpShortRowPacksWideningManyRows = 2;
  static constexpr int64_t kWideningManyRowsPerSm = 256;
  // Widening rows in clusters of 2: see Chooser::widening_cluster_rows.
  static constexpr int64_t kWideningClusterMinPacks = 2048;
  static constexpr int64_t kWideningClusterMinRowsPerSm = 8;
  // Widening rows cached by a cluster or grid group: 4 register packs per thread, not the 8 of the largest
  // bucket (more threads, or more shared memory). Written in lane pairs (store_pack_where's whole-sector stores
  // of float32 results), the 8-pack instance spilled 64-80 bytes (ptxas, nvcc 13.0) and ran 6-14% slower than
  // before the pairs on vocabulary rows, so it keeps plain stores. H100, session 27 call 4 (two rounds in turns, softmax fp16 / bf16 ->
  // float32, against the unpaired 8-pack plans, *session27-c4-compare-r4.txt*): 8192 x 32000 609 -> 540 us
  // (-11%), 4096 x 32000 -14 / -13%, 8192 x 16384 -13 / -11%, 2048 x 131072 -18 / -23%, 64 x 151936 (grid) 45 ->
  // 31 us (-31 / -33%). Call 9 (the plans whose cluster size changed with it, against session 26's,
  // *session27-c9-compare-vocab-and-peeled.txt*): 4096 x 151936 (clusters of 3, were 2) 1606 -> 1301 us, 512 x
  // 151936 -26 / -28%, 100 x 262144 (4, were 3) -38%, 1024 x 262144 -24 / -27%. Peeled widening rows, and bodies
  // planned to be run peeled (64 x 151935: 47 -> 35 us), keep the largest bucket unless peel_few_rows spreads them.
  static constexpr int kWideningGroupRegPacks = 4;
  // 16-bit forward rows cached by a cluster or grid group whose chunk needs shared-memory packs besides the
  // registers: 4 register packs per thread, not 8, the rest in shared memory (more of it), where that fits the
  // shared-memory budget (the CTAs per row then follow the occupancy answer). The 8-pack instance sits at the
  // 64-register cap, where a small change to it made grid and cluster launches 3-9% slower (session 43 call 2). H100,
  // session 43 call 5 (an override of the register packs, one build, 3 rounds in turns, softmax, us,
  // *session43-c5-compare-group-reg-packs.txt*): 4 x 4194304 (8 + 8 -> 4 + 12 packs) fp16 36.7 -> 34.8 (-5.2%), bf16
  // -5.5%; 64 x 151936 (8 + 2 -> 4 + 6) -3.1 / -4.3%; 2048 x 131072 (8 + 8 -> 4 + 12) -0.8 / -0.9%; 2 register packs:
  // -3.7 / -4.2%, -1.8 / -2.6%, -0.7 / -0.7%. float32 keeps 8: 64 x 151936 became a cluster of 5 (+3.2%) and 4 x
  // 262144 4 + 4 packs (+4.9%); 2048 x 131072 -1.7%. The sweep of the rule (call 6, *session43-c6-bench-forward.txt*)
  // against session 41's sweep: 64 x 151936 16-bit -3.0..-4.5% (0.73-0.75 -> 0.77-0.78 of copy). 64 x 151936 at 4
  // CTAs per row caches 4 + 6 packs, exactly 48 KB of dynamic shared memory: until session 44's opt-in fix
  // (allow_dynamic_smem, launch_utils.h) a fresh process planned 3 CTAs per row (4 + 9 packs), 27.6 / 28.1 us against
  // 23.6 / 23.9 at 4 (session 44 call 1, *session44-c1-compare-opt-in-and-peeled-groups.txt*, fresh processes, 3
  // runs in turns). Peeled rows (the aligned body in packs, the edges singly) take the rule too since session 44
  // (same call, base 8 register packs): 4 x 4194303 (8 + 8 -> 4 + 12) 38.1 -> 35.4 / 40.4 -> 35.8 us (-6.9 /
  // -11.1%), 2048 x 131071 -1.1 / -8.9%, 64 x 151935 (8 + 2 -> 4 + 6) +1.1 / -7.0%.
  static constexpr int kGroupSharedRegPacks16 = 4;
  static constexpr int64_t kWarpFullRowMinPacks16 = 13;
  static constexpr int64_t kWarpFullRowMaxPacks16 = 16;
  static constexpr int kWarpFullRowPacks16 = 2;
  // 16-bit forward rows of 4, 7 or 8 whole packs (32, 56 or 64 columns): one pack per lane on 4 or 8 lanes, not 4
  // packs on 1 or 2, where the lanes that hold a row are all busy but at most one (kWarpOnePackMaxIdleLanes). H100,
  // session 41 (an override of the packs per lane, one build, in turns; us, mean change softmax / log_softmax, fp16
  // / bf16): call 2 (3 rounds, *session41-c2-compare-warp-short16-auto-p1.txt*) 65536 x 64 softmax 12.4 -> 11.4
  // (-7.9%) / -5.9%, log_softmax 12.4 -> 11.2 (-9.2%) / -5.2%; 16384 x 64 -3.5 / -4.3%, -4.6 / -4.5%; 262144 x 64
  // -6.0 / -4.9%, -2.8 / +1.9%. Call 3 (2 rounds, *session41-c3-compare-warp-short16-auto-p1.txt*): 65536 x 32 -5.8
  // / -6.3%, -10.7 / -10.3%; 65536 x 56 -5.3 / -7.8%, -7.2 / -2.8%; 1024 x 64, 4096 x 64 -3.8..-6.1%; 131072 x 64
  // -8.0 / -6.7%, -7.8 / -3.7%; 262144 x 64 -6.6 / -4.7%, -2.5 / +2.5% (the one loss, bfloat16 log_softmax on
  // 262144 rows, in both calls). Rows with more idle lanes lost: 65536 x 40 (5 packs on 8 lanes) +1.1 / +6.0%,
  // +7.6 / +17.9%; 65536 x 48 (6 packs) log_softmax +3.4 / +5.9% (softmax -5.7 / -4.2%); so did 16 packs (65536
  // x 128 log_softmax +5.3 / +8.1%, kWarpFullRowPacks16 above). Rows of 1-3 packs were not measured and keep theirs.
  static constexpr int64_t kWarpOnePackMinPacks16 = 4;
  static constexpr int64_t kWarpOnePackMaxPacks16 = 8;
  static constexpr int64_t kWarpOnePackMaxIdleLanes = 1;

  // block kernel: every thread caches the most register packs it can (max_block_reg_packs), and the CTA
  // has just enough threads for the row; beyond kSharedCtaMaxThreads the rest goes to shared memory. An
  // SM needs ~64 KB of loads in flight to reach copy bandwidth (H200: ~1.5-2 us per loaded DRAM round trip
  // at ~3.9 TB/s over 132 SMs), and each CTA only loads, then reduces, then stores, so what counts is bytes
  // per thread: 64 registers per thread allow 1024 threads per SM, x 8 packs = 128 KB. Measured on H200
  // (2026-11-22): 256 threads x 2 packs (fp16, 4096 columns) 0.62-0.66 of copy; 128 x 4: 0.80; fp32 with 8
  // packs 0.93-0.97.

  // A CTA that caches a row should leave room for a second CTA on its SM, so one CTA's loads overlap
  // the other's reduction and stores: at most 512 threads (64 registers each = half the register file)
  // and half the SM's shared memory. Rows larger than that use a cluster (or a CTA that owns the SM).
  static constexpr int kSharedCtaMaxThreads = 512;
  static constexpr int kSmemReservePerCta = 2048;  // static shared memory (<= 800 B, float64 1584) + driver reserve
  // Rows that would take the warp kernel but are this few per SM spread over a CTA (spread_small_rows).
  static constexpr int64_t kSmallRowsPerSm = 2;
  static constexpr int kSmallRowSpreadThreads = 256;
  // Many 16-bit rows of kLeanMinPacks..kLeanCtaThreads x kLeanRegPacks packs (2048-8192 columns) take the
  // block kernel's lean instance (softmax and log_softmax): a CTA per row, 2 packs per thread, <= 32 registers (lean_rows).
  static constexpr int64_t kLeanMinPacks = 256;
  // Above this many packs (6144 16-bit columns) the lean instance's wide form: 256 threads x 4 packs, which
  // halves the per-element share of its two block reductions. H200, 2026-11-22, two interleaved A/B runs
  // against 512 x 2 (*session6-ab4-*.json): 2048 x 8192 softmax fp16 / bf16 0.86 / 0.87 -> 0.93 / 0.95,
  // log_softmax 0.82 / 0.83 -> 0.93 / 0.92, 4096 x 8192 +0.06..+0.10; but 2048 x 6144 (768 packs) softmax
  // 0.90 / 0.90 -> 0.86 / 0.88.
  static constexpr int64_t kLeanWideMinPacks = 768;
  // Few forward rows (fewer than SMs, 16-bit or float32, whole or peeled) of kLeanFewMinColumns..kLeanFewMaxColumns
  // columns (float32 results: from kLeanFewFloatResultMinColumns; the aligned body of a peeled row) take a CTA per row
  // of the lean instance: the two-pack form up to 512 threads (16-bit rows of 32-1024 packs, float32 of 128-1024),
  // the float form's 8 packs beyond (float32 rows of 1025-2048 packs, up to 256 threads). Before, the warp kernel held
  // a row in one warp at 2-8 packs per lane (one of the SM's four schedulers), spread_small_rows 256 threads of one
  // pack, the 64-register instance 8 packs per thread in CTAs of 32-128 threads, and clusters split rows of 16 KB or
  // more: now the row's loads and exponentials spread over more of one SM, with no cluster barrier. H100, three rounds
  // in turns each (us; percentages of the means; the files list every round, which overlap on some small changes):
  // - session 38 calls 3-4, 16-bit rows of 64-256 packs (*session38-c3-compare-lean-few-forward-rows.txt*, float32
  //   results *-c4-*): softmax 128 x 1024 5.5-5.7 -> 5.2-5.4 (float32 results 5.8-6.0 -> 5.3-5.5), 8 x 2048 -11%
  //   (-13%), 128 x 1001 (peeled) -11% (-8%); log_softmax -2..-13%;
  // - session 39 call 1, float32 rows of 128-512 packs (*session39-c1-compare-lean-few-float-forward.txt*): softmax
  //   128 x 1024 6.0-6.2 -> 5.3-5.6, 131 x 2048 6.9-7.0 -> 5.9-6.0, 8 x 2048 -17%, 64 x 512 -6%; log_softmax -5..-15%;
  // - session 39 call 2 (*session39-c2-compare-lean-two-pack-ranges.txt*): 16-bit 257-512 packs softmax fp16 / bf16 8 x
  //   4096 7.3-7.5 -> 5.2-5.3 / -26%, 64 x 3000 -28 / -26%, 131 x 4096 -27 / -25%, 64 x 4095 (peeled) -32 / -32%;
  //   32-63 packs 128 x 256 -2 / -4%, 1 x 256 -7 / -9%, 128 x 384 -2 / -2% (fp16's rounds overlapping); log_softmax
  //   -24..-34% and -1..-6%; float32 513-1024 packs 8 x 4096 (a cluster of 8 before) -9%, 131 x 4096 8.1-8.3 ->
  //   6.9-7.1, 64 x 3000 -11%; peeled 8 x 2047 -19%, 64 x 1001 -6%; log_softmax -9..-18%;
  // - session 39 call 3 (*session39-c3-compare-lean-few-long-rows-16bit.txt*): 16-bit 513-1024 packs softmax fp16 /
  //   bf16 8 x 8192 (a cluster of 8 before) 6.2-6.4 -> 5.7-5.9 / -7%, 100 x 8192 (clusters of 8) -11 / -9%, 64 x 6000
  //   -25 / -24%, 131 x 5000 -22 / -21%, 32 x 8191 (peeled) -27 / -26%; log_softmax -8..-27%;
  // - session 39 call 4 (*session39-c4-compare-lean-few-long-rows-float32.txt*): float32 1025-2048 packs (the float
  //   form) 8 x 8192 (a cluster of 16 before) -7%, 100 x 8192 -14%, 64 x 6000 -14%, 131 x 5000 -13%, 32 x 8191 -21%, 8 x
  //   4104 -11%; float32 results of float16 rows (bfloat16 was not timed beyond 2048 columns) 8 x 4096 7.3-7.4 ->
  //   5.4-6.0, 64 x 3000 -25%, 131 x 4096 -23%, 64 x 4095 -35%, 64 x 6000 -20%, 1 x 256 -5%, 128 x 256 -2% and 8 x
  //   8192 -0.1% (the last two's rounds overlapping); log_softmax alike.
  // float32 results of rows under 512 columns stay as they were (0.7-6% faster measured there): the lean sum's float32
  // roundings (a chain per thread, then a plain butterfly) reached 2.5e-7 on a 263-column float32 row whose largest
  // probability is 0.99 (call 4's GPU test), above the tests' bound of twice torch's error (1e-8 there) plus 2e-7; the
  // warp kernel gave 1.1e-7 on that row (call 5). The cut at 512 columns does not remove that risk: a 512-column row
  // runs the same CTA shape, and the sum's error depends on the row's largest probability, not its length (float32
  // emulation: up to 1.7e-7 on random rows of 263-4096 columns). Their GPU tests pass, rows with one dominant element
  // on every lean form included (session 40 call 1). A compensated sum (pairwise chains, a TwoSum butterfly) cost
  // +1.5..+8.3% on few-microsecond float32 shapes (fp32 8 x 4096, 128 x 1024, 1000 x 1000) and bought -0.5..-8% on
  // the 256-511 columns it would open (session 40 call 1, *session40-c1-compare-compensated-lean-sum.txt*): not taken.
  // Float32 rows of 32 packs (128 x 128) measured +0.6 / -0.3%.
  static constexpr int64_t kLeanFewMinColumns = 256;
  static constexpr int64_t kLeanFewFloatResultMinColumns = 512;
  static constexpr int64_t kLeanFewMaxColumns = 8192;
  // Many float32 rows (at least one per SM) of kLeanOneWaveFloatMinPacks..kLeanFloatMinPacks whole packs (512-1024
  // columns) take the two-pack form too where its CTAs fit on the device at once (one wave), instead of the warp
  // kernel (255 packs or fewer) or the float form's 8 packs per thread in one-warp CTAs (256). H100, session 39 call
  // 2 (as above): softmax / log_softmax 1000 x 1000 8.4-8.6 -> 7.9-8.1 / -5.8%, 2048 x 1024 -1.5 / -0.7%, 2048 x 512
  // -1.9 / -2.3%, 132 x 1024 -2.7 / -3.7% (rounds overlapping or tied on the last three); but over more than one
  // wave: 4096 x 1000 +4.3 / +3.8%, 16384 x 1024 +2.4 / +2.2%, 8192 x 768 -0.3 / -1.4%, 16384 x 512 +0.3 / +0.2%.
  static constexpr int64_t kLeanOneWaveFloatMinPacks = 128;
  // float32 forward rows from this many packs (1024 columns) take the lean instance's float form (see
  // lean_rows), before the warp kernel would (but rows of exactly this many that fit in one wave: the two-pack form,
  // kLeanOneWaveFloatMinPacks). H100, session 17 call 9, three interleaved runs against the
  // warp kernel (1024) and the 64-register instance (1280-2044), softmax / log_softmax: 2048 x 1024 -6.0 / -5.2%,
  // 16384 x 1024 -1.6 / -1.7%, 8192 x 1280 -4.5 / -3.0%, 4096 x 1536 -5.0 / -3.3%, 2048 x 2044 -6.1 / -7.0%
  // (*session17-c9-compare-lean-float-short.txt*).
  static constexpr int64_t kLeanFloatMinPacks = 256;
  // Many 16-bit forward rows (same-dtype result, whole packs) of kLeanOnePackMinPacks..kLeanMinPacks - 1 packs
  // (512-2040 columns) whose one-pack CTAs fit in one wave run the lean instance's one-pack form: a CTA per row,
  // one 16-byte pack per thread (Liger's Triton kernel's shape on 1024 columns: 4 warps per row), instead of the warp
  // kernel (up to 8 packs per lane). In one wave each thread's chain from its load to its store is the kernel's time;
  // one pack per thread makes it the shortest. H100, session 46 call 1 (tune_softmax.py, three runs in turns, us,
  // warp -> one-pack, fp16 / bf16, *session46-c1-compare-lean-one-pack.txt*): softmax 1000 x 2040 8.8-9.0 / 8.9-9.1
  // -> 7.9-8.0 / 7.8-7.9 (-11 / -12%), 200 x 2040 -11 / -10%, 132 x 1024 -4 / -5%, 2048 x 768 -3 / -4%, 2048 x 1024
  // 7.9-8.1 / 8.0-8.2 -> 7.7-7.9 / 7.9-8.0 (-2.3 / -1.7%), 1000 x 1000 -1 / -3%, 2048 x 512 -0.7 / -1.0%; log_softmax
  // -0.6..-12%, 2048 x 512 fp16 +0.3%. The same form for fewer rows than SMs (in place of the two-pack form) gained
  // nothing: 128 x 1024 -0.7 / +0.3%, 64 x 1001 -1.0 / 0%, and lost on longer rows: 64 x 2048 +0.6 / +1.1%, 128 x
  // 4096 +0.8 / +0.7%, 4 x 4096 +2.5 / +2.3% (log_softmax alike): not taken.
  static constexpr int64_t kLeanOnePackMinPacks = 64;
  // float32 backward rows (aligned) take the lean instance from this many packs (768 columns), and
  // also in fewer rows than SMs of 192-256 packs (8 KB of two streams; since session 40 few rows of any stream
  // dtype from kLeanFewBackwardMinColumns, below), where the 64-register instance held 4 packs of each stream per
  // thread in CTAs of fewer threads (64 against the lean instance's 96 at 192 packs, 128 at 256). H100, session 35
  // call 1 (three rounds in turns, us, that plan -> lean; the experiment patch's switch SOFTMAX_OPS_EXP_BW_SPREAD=l2:64,
  // *session35-c1-compare-backward-spread-lean2.txt*), softmax_backward / log_softmax_backward: 1000 x 1000 (250
  // packs) 10.4-11.0 / 10.6-11.3 -> 9.4-9.5 / 9.7-10.4, 128 x 1024 (a row per SM) 6.2-6.6 / 6.5-7.1 -> 5.8-6.6 / 5.9,
  // 256 x 768 (192 packs) 6.6-6.8 / 6.8-7.6 -> 6.1-6.9 / 6.3: faster on 4 of 6, even on 2, slower on none, where
  // cells of unchanged plans in the same call moved -2.3..+6.7%. Shorter rows, which the warp kernel takes, did not
  // gain: 1000 x 500 (125 packs) +2.3 / -3.6%, 4096 x 512 (128 packs) +1.1 / +0.9%. Not measured, extrapolated:
  // fewer rows than 128 (at 128 rows each SM already held a single CTA, a row, as it does with fewer). Few rows of
  // more than 256 packs and few peeled rows kept the 64-register instance (or clusters) until session 40's few-row
  // rule (kLeanFewBackwardMinColumns) measured the lean form faster on them.
  // Since session 38 also float32 streams with a 16-bit result (the backward of softmax(x_16bit, dtype=float32)),
  // whose rows of 192-255 packs and few rows of 768-1024 columns had kept the 64-register instance. H100, session
  // 38 call 2 (three rounds in turns, us, softmax_backward fp16 / bf16 result, every new round faster than every
  // base round; *session38-c2-compare-lean-widening-backward.txt*): 1000 x 1000 10.3-10.5 -> 9.3-9.5, 128 x 1024
  // 6.4-6.6 -> 5.8-6.0, 256 x 768 -9.6%, 4096 x 1000 -7.4..-7.7%, 8 x 1000 -8..-10%, 1 x 1024 -11%, 32768 x 900
  // -1.1%; log_softmax_backward -7.0..-10.0% on the same shapes but 32768 x 900 (-1.1 / -1.2%); unchanged plans
  // within +-0.4%.
  static constexpr int64_t kLeanFloatBackwardMinPacks = 192;
  // Few backward rows (fewer than SMs, any stream dtype, whole or peeled) of kLeanFewBackwardMinColumns up to the
  // two-pack form's 1024 packs (8192 16-bit columns, 4096 float32; the aligned body of a peeled row), and many 16-bit
  // backward rows of kLeanOneWaveBackwardMinPacks..kLeanMinPacks - 1 whole packs (512-2040 columns) whose CTAs fit in
  // one wave, take a CTA per row of the lean two-pack form. Before, the warp kernel held rows of up to 2 KB per stream
  // (16-bit rows of up to 1024 columns, float32 of 512) in one warp at 2-4 packs per lane, the 64-register instance
  // took longer rows at the same CTA shape as now (16-bit rows of 129-255 packs) or at 4 float32 packs per thread (up
  // to 2047 float32 columns), and clusters of 2-16 CTAs split rows of 16 KB or more. H100, session 40, 3 rounds in
  // turns each (us; percentages of the means, softmax_backward / log_softmax_backward; "overlapping": some base round
  // at or below some new round):
  // - call 2 (*session40-c2-compare-lean-backward.txt*): fp16 few rows 8 x 4096 5.9-6.0 -> 5.2-5.5 (-9.2 / -7.3%), 64 x
  //   3000 -8.3 / -5.7%, 100 x 8192 8.2-8.4 -> 7.4 (-10.4 / -8.1%), 64 x 1001 (peeled) -9.6 / -10.3%, 128 x 1024 -3.7 /
  //   -1.4% (overlapping); fp16 one wave 1000 x 1000 -3.1 / -3.9%, 2048 x 1024 -2.9 / -2.6%, 4096 x 1000 -3.4 / -1.9%
  //   (overlapping); float32 streams 8 x 4096 -4.9 / -6.6%, 64 x 3000 -11%, 131 x 4096 -9 / -11%, 64 x 2047 (peeled)
  //   7.2-7.4 -> 6.1-6.2 (-16 / -18%), 8 x 2048 -9 / -10%; float32 streams with a float16 gradient (2 rounds) 8 x 4096
  //   -7%, 64 x 3000 -12 / -11%;
  // - call 3 (*session40-c3-compare-lean-backward-edges.txt*): bf16 8 x 4096 -7%, 100 x 8192 -9 / -7%, 128 x 1024 -3%,
  //   1000 x 1000 -2 / -4%, 2048 x 1024 -2% (128 x 1024 and the softmax_backward one-wave cells overlapping); fp16 one
  //   wave 2048 x 512 / 4096 x 512 / 4000 x 768 -1..-2% (the first two overlapping); few fp16 rows of 512 / 768 columns
  //   -1.6 / -0.4%, -1.9 / -2.3% (overlapping but 768's log_softmax_backward), float32 streams of 512 -0.4..-2%
  //   (overlapping);
  // - call 7 (*session40-c7-compare-lean-backward-129-255-packs.txt*, against the same base): fp16 rows of 129-255
  //   packs, where the CTA shape was already 2 packs per thread: one wave 2048 x 1536 -5.2 / -4.9%, 1000 x 2040 -6.4 /
  //   -5.7%, 1500 x 1280 -7.7 / -6.4%; few 128 x 1536 -8.2 / -6.8%, 64 x 2040 -7.3 / -7.1%; every new round below every
  //   base round.
  // Not taken: shorter rows, even (fp16 128 x 256 +0.5 / +1.0%, 128 x 384 +0.2 / -0.5%; float16 -> float32 1 x 256 and
  // 128 x 256 within -1.2..+0.5%). The cut at 512 columns is not sharp: 512-768 columns gain 0.4-2.3% with overlapping
  // rounds, and one-wave rows under 512 columns (64 packs) were not measured. Unchanged plans in the same calls (8192 x
  // 1024 fp16, over a wave) within +-0.3%.
  static constexpr int64_t kLeanFewBackwardMinColumns = 512;
  static constexpr int64_t kLeanOneWaveBackwardMinPacks = 64;
  // Row prefetch (add_row_prefetch) up to this many waves of rows.
  static constexpr int64_t kPrefetchMaxWaves = 4;

  // Fewer rows than SMs: one CTA per row leaves SMs idle (PERF.md: 4 x 262144 runs at 0.10 of copy in
  // torch eager for exactly this reason), so rows are split over a cluster of CTAs -- beyond the rows lean_rows
  // keeps in one CTA (forward up to kLeanFewMaxColumns, backward up to 1024 packs: kLeanFewBackwardMinColumns).
  static constexpr double kFewRowsPerSm = 1.0;

  // Cluster chunk of at least 2 KB per CTA (see widest_cluster; a 16 KB minimum measured worse). Clusters
  // up to 8 CTAs are portable; 16 needs the non-portable opt-in and a whole GPC, so it is only used when
  // the occupancy API says they fit.
  static constexpr int64_t kClusterMinChunkBytes = 2 * 1024;
  // Threads per CTA a few-rows cluster spreads its chunk over before adding register packs per thread.
  // H200, 2026-11-22 (benchmarks/micro/few_rows_sync.cu, 4 x 65536 fp16, clusters of 16): 512 threads x 1
  // pack and 256 x 2 took 6.4 us, 128 x 4 6.6 us; 4 x 262144: 512 x 4 8.7 us, 1024 x 2 9.4 us.
  static constexpr int kSpreadThreads = 512;
  // Few rows (16-byte packs) of at most kMaxClusterCtas x this many bytes go to a cluster before a grid group:
  // its barrier is the hardware's, not an atomic in global memory. H200, 2026-11-22, micro benchmark above
  // (fp16, best configuration of each): 4 x 16384 cluster 5.7 us vs grid group 6.6 us, 4 x 65536 6.4 vs
  // 6.8 us; at 4 x 262144 (32 KB per CTA) the grid group was faster (8.3 vs 8.7 us), at 8 x 262144 too
  // (9.9 vs 10.6 us). Tune (benchmarks/results/*session5-tune-few-rows-*.json, xCopy grid -> cluster, all
  // four ops): 16-bit 4 x 16384 and 4 x 32768 +0.05..+0.18 in 14 of 16 cases; fp32 mixed (-0.09..+0.10,
  // mean +0.02); odd rows (single elements, 3 x 100003 16-bit) 0.04-0.08 slower, so they keep the grid.
  static constexpr int64_t kClusterFirstMaxChunkBytes = 16 * 1024;
  // ... and of at most kMaxClusterCtas x this many bytes while their clusters of kMaxClusterCtas CTAs take at
  // most half the SMs (4 rows on an H100), which the push exchange (ClusterInbox, session 16) made the faster
  // choice.
  // H100, session 17 call 1, two interleaved runs of tune_softmax.py against the 16 KB rule alone (us, grid ->
  // cluster): softmax 4 x 114688 fp32 10.3 / 10.2 -> 8.2 / 8.8, 4 x 262144 fp16 10.1 / 9.9 -> 8.9 / 9.0, bf16
  // 10.0 / 9.9 -> 9.1 / 9.8, fp32 12.1 / 11.2 -> 11.7 / 11.9; softmax_backward 4 x 65536 fp32 9.4 / 8.5 -> 8.6 /
  // 8.3, 4 x 114688 -5..-9%, 4 x 262144 fp16 / bf16 -7.5 / -10.6%; call 2's two more runs: the same direction
  // for each (4 x 262144 fp32 softmax, +1% here, -3% there: even). With 8 rows (clusters on every SM) the grid
  // group stayed faster: 8 x 262144 softmax +4..+7% as clusters (*session17-c1-*, *session17-c2-*).
  static constexpr int64_t kClusterFirstFewMaxChunkBytes = 64 * 1024;
  // ... and rows of single elements (lengths or offsets that break 16-byte vectors: GPT-2's 50257-word
  // vocabulary) of at most kMaxClusterCtas x this many bytes, on the same up-to-4 rows. H100, session 17 call 3,
  // two interleaved runs of tune_softmax.py, grid group -> cluster (us): softmax 4 x 16383 fp16 8.6 / 7.9 -> 7.3 /
  // 6.6, fp32 8.4 / 7.7 -> 6.8 / 6.7; 4 x 50001 fp16 9.1 / 8.4 -> 7.7 / 7.9; softmax_backward 4 x 16383 -11..-15%.
  // Larger chunks lost as clusters: 4 x 50001 softmax_backward fp16 (12.5 KB) +12%, 3 x 100003 softmax fp16 / fp32
  // +10 / +8%, softmax_backward +9..+26%, 2 x 300007 softmax fp16 +62% (*session17-c3-*).
  static constexpr int64_t kClusterFirstScalarMaxChunkBytes = 8 * 1024;
  // Few float32 rows that break 16-byte packs and that peel_few_rows leaves to single elements (their aligned
  // body's plan spreads over more threads with fewer packs than the float32 peeled instances hold): same-dtype
  // forwards run the peeled cluster that force_kernel("softmax", "cluster_onepass") plans (clusters that fill the
  // SMs, each CTA holding its chunk in the peeled instances' 8 register packs) where its CTAs have at least this many
  // threads and no shared-memory packs. H100, session 33 calls 3-4 (tune_softmax.py, two runs each, us, automatic
  // single elements -> forced peeled cluster; *session33-c4-tune-few-rows-cluster{1,2}*): wins from 128 threads:
  // 1 x 50257 (128) 9.1 -> 7.6, 8 x 50257 (128) 10.2 -> 9.2, 4 x 65537 (128) 9.2-9.3 -> 8.0-9.0, 3 x 100003 (224)
  // 9.0 -> 8.1-9.0, 4 x 114687 (224) 9.6-10.6 -> 8.7-9.6, 16 x 100003 (352) 14.1 -> 12.0, 32 x 50257 (320) 14.2 ->
  // 12.1, 1 x 128257 10.3-10.6 -> 8.0-8.6, 8 x 262143 17.1-17.2 -> 15.3-16.3; even at 64 (8 x 32001 8.6 -> 8.5);
  // slower with shared-memory packs (2 x 300007: 512 threads and 2 packs in shared memory, 10.6 -> 11.2).
  // Call 5, this rule against the rules before it (A/B in turns, two rounds, us, *session33-c5-compare-peeled-
  // cluster.txt*): 32 x 50257 -17%, 16 x 100003 -14%, 8 x 262143 -8%, 131 x 16385 -24%, 4 x 114687 -15%, 8 x 50257
  // -10%, 1 x 128257 -18%, 1 x 50257 -12%. Call 9, rows of one or two (two rounds in turns, best of two, us;
  // *session33-c9-compare-fp32-one-two-rows.txt*): softmax 1 x 128257 9.6 -> 7.8, 1 x 100003 8.6 -> 7.8, 2 x 114687
  // 9.2 -> 7.9, 2 x 50257 8.6 -> 7.6, 2 x 65537 8.1 -> 8.2, the other five -2..-9%; log_softmax -3..-29% on all ten.
  // 16-bit rows ran this cluster too in session 33 (from 160 threads and 3 rows: 64 x 50257 fp16 18.3 -> 13.8 us)
  // until their peeled instances below the most packs (peeled_instance, session 34) let peel_few_rows run
  // their aligned body's own plan, which beat this cluster on 81 of 88 16-bit softmax cases (forced, same call;
  // *session34-c1-tune-new-vs-cluster*; the other 7 within 0-11%).
  // Not included: the backward and widening forwards (peel_few_rows runs their rows at fewer packs where
  // peeled_instance compiles them), float64 (not measured).
  static constexpr int kPeeledClusterMinThreads = 128;
  // Few rows are split over a cluster only from this many bytes per row (all streams): 128 x 1024 fp32
  // backward (8 KB rows) measured 0.91 of copy with one CTA per row and 0.68 split in clusters of 4
  // (H200, 2026-11-22), 4 x 16384 fp16 (32 KB) 0.57 split vs 0.58 unsplit. (Rows lean_rows takes never get here.)
  static constexpr int64_t kFewRowsSplitMinRowBytes = 16 * 1024;

  // grid_onepass (few rows, cooperative launch): every resident CTA slot of the device gets a chunk of a
  // row, with CTAs of up to kGridCtaThreads threads (two per SM), few packs per thread, chunks of at least
  // kClusterMinChunkBytes. Clusters stop at 16 CTAs, so 4 rows kept 64 of 132 SMs busy.
  static constexpr int kGridCtaThreads = 512;
  // ... and when even that cannot cache whole chunks, it streams the rest of chunks up to this many times
  // what it caches (grid_group_streamed); split_row beyond.
  static constexpr int64_t kGridStreamMaxChunkPerCache = 7;

  // two_pass (one CTA per row, re-read from L2) rather than split_row when rows are at least this many
  // per SM: every SM is busy anyway and one launch beats two.
  static constexpr double kTwoPassMinRowsPerSm = 2.0;
  static constexpr int kTwoPassThreads = 512;

  // split_row: about 2 CTAs per SM in total (balance across SMs), each taking at least 64 KB of input (the
  // partials pass then costs one merge per 64 KB; smaller parts are launch-latency bound anyway). A CTA's
  // share is every chunks-th block of its row (softmax_streaming_kernels.cuh: split_part), not a contiguous
  // chunk.
  static constexpr double kSplitCtasPerSm = 2.0;
  static constexpr int64_t kSplitMinChunkBytes = 64 * 1024;
  static constexpr int kSplitThreads = 512;

  // strided kernel: 256 threads per CTA (32 columns x 8 along n, or inner x 256/inner), 512 when there
  // are fewer tiles than 2 x SMs (more threads per tile then is the only parallelism left).
  static constexpr int kStridedThreads = 256;
  static constexpr int kStridedThreadsFewTiles = 512;

  // Peeled one-warp CTAs only with at least this many rows per SM (Chooser::too_few_warps).
  static constexpr double kPeelOneWarpMinRowsPerSm = 16.0;

  // Persistent-style grids: at most this many waves of resident CTAs; each CTA loops over the rest.
  static constexpr int kGridWaves = 8;
};

constexpr const char* kKernelNames[kNumSoftmaxKernels] = {"warp",     "block_onepass", "cluster_onepass", "grid_onepass",
                                                          "two_pass", "split_row",     "strided"};

int dtype_bytes(DType dtype) {
  switch (dtype) {
    case DType::kFloat16:
    case DType::kBFloat16:
      return 2;
    case DType::kFloat64:
      return 8;
    case DType::kFloat32:
      break;
  }
  return 4;
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
int64_t round_up(int64_t a, int64_t b) { return ceil_div(a, b) * b; }
int64_t pow2_ceil(int64_t v) {
  int64_t p = 1;
  while (p < v) p *= 2;
  return p;
}
int64_t pow2_floor(int64_t v) {
  int64_t p = 1;
  while (p * 2 <= v) p *= 2;
  return p;
}

std::string kib(int64_t bytes) {
  if (bytes >= 1024 * 1024) return std::to_string((bytes + 512 * 1024) / (1024 * 1024)) + " MB";
  if (bytes >= 1024) return std::to_string((bytes + 512) / 1024) + " KB";
  return std::to_string(bytes) + " B";
}

// Per-problem quantities every rule reads.
struct Geometry {
  int streams;         // input arrays read per element: 1 forward, 2 backward
  int in_bytes;
  bool widening;       // a forward whose result is wider than its input (16-bit -> float32), in 16-byte packs
  int vec;             // elements per pack
  bool peel;           // 16-byte packs for a row whose length or start breaks them: its aligned body (n_packs is
                       // the longest body's) plus single edge elements (plan.peel)
  bool body;           // the longest aligned body planned as if it were the row, to be run peeled (RowView::kBody)
  int max_edges;       // peel: edge elements a row of this launch has at most (max_row_edges), else 0
  int pack_bytes;      // bytes per pack of one stream
  int64_t n_packs;     // packs per row
  int64_t rows;
  int64_t row_bytes;   // bytes of one row, all streams: what a one-pass kernel caches
  int max_reg_packs;   // block kernel register cache (max_block_reg_packs)
};

bool whole_packs(const SoftmaxRequest& request) {
  const SoftmaxProblem& p = request.problem;
  return p.inner == 1 && request.vector_aligned && p.n % (16 / dtype_bytes(p.in_dtype)) == 0;
}

// Rows that break 16-byte packs but can be read peeled: the reduced dim last, every pointer in one element phase.
// That phase is 0: the output is a fresh allocation (the caching allocator's blocks start 512-byte aligned). The
// launchers check the pointers they are given against the plan (softmax_warp.cu: max_row_edges).
constexpr int64_t kPeeledFirstPhase = 0;
bool peelable(const SoftmaxRequest& request) {
  return request.problem.inner == 1 && request.rows_share_phase && !whole_packs(request);
}

// How the plans see a row: kNatural, whole 16-byte packs where every row allows them, else single elements;
// kPeeled (a peelable request), 16-byte packs of each row's aligned body, run peeled; kBody, the longest
// aligned body alone as if it were the row (Chooser::peel_few_rows: the whole-pack rules' plan, then peeled).
enum class RowView { kNatural, kPeeled, kBody };

Geometry geometry_of(const SoftmaxRequest& request, RowView view = RowView::kNatural) {
  const SoftmaxProblem& p = request.problem;
  Geometry g;
  g.streams = p.backward ? 2 : 1;
  g.in_bytes = dtype_bytes(p.in_dtype);
  const int vec16 = 16 / g.in_bytes;
  const bool body = view != RowView::kNatural && peelable(request);
  g.peel = body && view == RowView::kPeeled;
  g.body = body && view == RowView::kBody;
  g.vec = whole_packs(request) || body ? vec16 : 1;
  // Only rows read in 16-byte packs (whole or peeled): the widening rules were measured on those, and their
  // thresholds count packs (single elements would meet a pack threshold 8x sooner).
  g.widening = !p.backward && dtype_bytes(p.out_dtype) > g.in_bytes && g.vec > 1;
  g.pack_bytes = g.vec * g.in_bytes;
  g.max_edges = g.peel ? max_row_edges(kPeeledFirstPhase, p.n, p.rows(), vec16) : 0;
  g.n_packs = body ? p.n / g.vec : ceil_div(p.n, g.vec);  // a body: the longest one (a row with no head)
  g.rows = p.rows();
  g.row_bytes = p.n * g.in_bytes * g.streams;
  g.max_reg_packs = max_block_reg_packs(p.in_dtype, p.backward);
  return g;
}

// Threads of a CTA that holds `packs` packs at `reg_packs` per thread: whole warps.
int64_t cta_threads(int64_t packs, int reg_packs) { return round_up(ceil_div(packs, reg_packs), 32); }

// CTAs of `threads` threads that one SM holds by its thread count (at least one).
int64_t ctas_per_sm(const DeviceProps& props, int64_t threads) {
  return std::max<int64_t>(1, props.max_threads_per_sm / threads);
}

// ... and by the SM's resident-CTA limit too (32 on Hopper): the CTAs of one wave. ctas_per_sm leaves that limit out
// (64 CTAs of 32 threads). The grid caps built on it (grid_cap) keep it: capping them would move 1156 of
// explain_snapshot's plans (CTAs under 64 threads get half the grid), none of them measured (session 40).
int64_t resident_ctas_per_sm(const DeviceProps& props, int64_t threads) {
  return std::min<int64_t>(ctas_per_sm(props, threads), props.max_ctas_per_sm);
}

// CTAs launched at most: kGridWaves waves of the CTAs that fit on the device at once.
int64_t grid_cap(const DeviceProps& props, int threads) {
  return std::max<int64_t>(1, props.sm_count * ctas_per_sm(props, threads) * Heuristics::kGridWaves);
}

// ---- kernel plans ---------------------------------------------------------------------------------

int widening_short_row_packs(const Geometry& g, const DeviceProps& props) {
  const bool many_rows = g.rows >= Heuristics::kWideningManyRowsPerSm * props.sm_count;
  return many_rows ? Heuristics::kWarpShortRowPacksWideningManyRows : Heuristics::kWarpShortRowPacksWidening;
}

SoftmaxPlan plan_warp(const Geometry& g, const DeviceProps& props) {
  SoftmaxPlan plan;
  plan.kernel = SoftmaxKernel::kWarp;
  plan.vec = g.vec;
  plan.peel = g.peel;
  plan.threads = kWarpKernelThreads;
  if (g.n_packs <= 32) {
    // Short rows (MoE routers, N = 8..256): up to kWarpShortRowPacks packs per lane and just enough lanes,
    // so a warp holds several rows. One pack per lane (the first version) put only 512 bytes per warp in
    // flight: fp16 x 256 columns reached 0.67 of copy on H200, fp32 (2 packs per lane) 0.98.
    // 16-bit forward rows by their pack count (the backward and widening rows have their own rules, taken first).
    const auto unpeeled_16bit_of = [&](int64_t min_packs, int64_t max_packs) {
      return g.in_bytes == 2 && !g.peel && g.n_packs >= min_packs && g.n_packs <= max_packs;
    };
    const bool full_16bit_row =
        unpeeled_16bit_of(Heuristics::kWarpFullRowMinPacks16, Heuristics::kWarpFullRowMaxPacks16);
    const bool one_pack_16bit_row =
        g.vec > 1 && unpeeled_16bit_of(Heuristics::kWarpOnePackMinPacks16, Heuristics::kWarpOnePackMaxPacks16) &&
        pow2_ceil(g.n_packs) - g.n_packs <= Heuristics::kWarpOnePackMaxIdleLanes;
    const int short_packs = g.streams == 2        ? Heuristics::kWarpShortRowPacksBackward
                            : g.in_bytes == 4     ? Heuristics::kWarpShortRowPacksFloat
                            : g.widening && !g.peel ? widening_short_row_packs(g, props)
                            : full_16bit_row      ? Heuristics::kWarpFullRowPacks16
                            : one_pack_16bit_row  ? 1
                                                  : Heuristics::kWarpShortRowPacks;
    plan.reg_packs = static_cast<int>(std::min<int64_t>(short_packs, pow2_ceil(std::max<int64_t>(g.n_packs, 1))));
    plan.lanes_per_row = static_cast<int>(pow2_ceil(ceil_div(std::max<int64_t>(g.n_packs, 1), plan.reg_packs)));
  } else {
    plan.lanes_per_row = 32;
    plan.reg_packs = static_cast<int>(pow2_ceil(ceil_div(g.n_packs, 32)));
  }
  // A peeled row's edge elements. float32 and float64 rows: one per lane, 2 (vec - 1) lanes at least (8 and 2):
  // with as few as their edges need, float32 65536 x 30 ran 11.1 -> 12.3 us (softmax), +9% (log_softmax), +4%
  // (backward; H100, session 21 call 4).
  //
  // 16-bit rows (up to 14 edges) whose edges outnumber their lanes first spread their packs to at most
  // kWarpPeelMultiEdgeMaxPacks per lane, then hold up to kWarpPeelMaxEdgesPerLane edge elements per lane. Session
  // 21 gave them a lane per edge element (65536 x 60 19.1 -> 11.5 us, 65536 x 100 19.2 -> 16.0 against 16 lanes of
  // one pack), which left rows of a few packs on up to 16 lanes of one pack (65536 x 30: 8 lanes, log_softmax 12.6
  // us against torch.compile's 8.9; session 21 call 5). H100, session 22 call 1 (two interleaved rounds,
  // *session22-c1-compare-peel-edges-{new,v2}.txt*, us fp16 / bf16 means, lane per edge -> this rule): softmax
  // 65536 x 9 18.0 / 18.4 -> 9.1 / 9.3, 65536 x 33 18.7 / 18.7 -> 9.7 / 9.6, 65536 x 30 -18 / -27%, 65536 x 101
  // (8 lanes of 2 edges) -16 / -14%, log_softmax -21..-53% on those, softmax_backward 65536 x 9 / 33 -36..-46%.
  // Four packs per lane lost where a lane per edge had given 2: 65536 x 60 +15 / +6% (2 lanes of 4 packs), 65536 x
  // 127 +7 / +2%, 16384 x 36 +14 / +8% (1 lane of 4): so those keep their plans, or 2 packs (16384 x 36: -4%).
  // This rule against session 21's (call 2, two rounds, *session22-c2-compare-peel-edges-final.txt*): every row
  // length whose plan changed (7, 9, 30, 31, 33, 36, 99, 101) up to 52% faster or within 2%, but 16384 x 36 bf16
  // log_softmax +5% (6 us).
  auto spread_over = [&](int64_t lanes) {
    plan.lanes_per_row = static_cast<int>(lanes);
    plan.reg_packs = static_cast<int>(pow2_ceil(ceil_div(std::max<int64_t>(g.n_packs, 1), lanes)));
  };
  if (g.peel && g.vec != 8) {
    const int64_t peel_lanes = pow2_ceil(2 * (g.vec - 1));
    if (plan.lanes_per_row < peel_lanes) spread_over(peel_lanes);
  } else if (g.peel) {
    const int64_t edges = std::max(g.max_edges, 1);
    const int multi_edge_max_packs =
        g.streams == 2 ? kWarpPeelMultiEdgeMaxPacksBackward : kWarpPeelMultiEdgeMaxPacks;
    while (edges > plan.lanes_per_row && plan.reg_packs > multi_edge_max_packs) spread_over(2 * plan.lanes_per_row);
    const int64_t edge_lanes = pow2_ceil(ceil_div(edges, kWarpPeelMaxEdgesPerLane));
    if (plan.lanes_per_row < edge_lanes) spread_over(edge_lanes);
    plan.edges_per_lane = static_cast<int>(pow2_ceil(ceil_div(edges, plan.lanes_per_row)));
  }
  // Fewer rows than SMs x 4 warps: CTAs of fewer warps, so the rows spread over more SMs. 128 x 1024 (one row
  // per warp) ran on 32 SMs in CTAs of 4 warps, each SM's share of the loads and stores queued behind one
  // another, and torch.compile (a CTA per row) was 1.4-1.5x faster there at 16 and 32 bits (H200, 2026-11-22).
  const int64_t rows_per_warp = 32 / plan.lanes_per_row;
  int warps = kWarpKernelThreads / 32;
  while (warps > 1 && ceil_div(g.rows, warps * rows_per_warp) < props.sm_count) warps /= 2;
  plan.threads = warps * 32;
  plan.grid = std::min(ceil_div(g.rows, warps * rows_per_warp), grid_cap(props, plan.threads));
  return plan;
}

// How a CTA caches `packs` packs (per stream) of a row: threads, register packs, shared-memory packs.
struct CacheShape {
  int threads;
  int reg_packs;
  int smem_packs;
  size_t smem_bytes;
};

// spread_threads > 0 (few rows, latency-bound): the fewest register packs per thread that keep the CTA
// within that many threads, so each thread's dependent chain of max / sum steps stays short. group: the CTA caches
// a chunk of a row for a cluster or grid group.
std::optional<CacheShape> cache_shape(int64_t packs, const Geometry& g, int max_threads, int64_t smem_budget,
                                      int spread_threads = 0, bool group = false) {
  packs = std::max<int64_t>(packs, 1);
  // The peeled view plans the most register packs only (its forced plans, and the rules that peel many rows; but for
  // 16-bit group rows with shared-memory packs, below); the kBody view spreads too, and peel_few_rows runs such a plan peeled where softmax_block.cu compiles its bucket.
  if (spread_threads > 0 && g.vec > 1 && !g.peel) {
    for (int reg_packs = 1; reg_packs < g.max_reg_packs; reg_packs *= 2) {
      const int64_t threads = cta_threads(packs, reg_packs);
      if (threads <= spread_threads) return CacheShape{static_cast<int>(threads), reg_packs, 0, 0};
    }
  }
  // The largest bucket (see the heuristic above; the only one for single elements and for the peeled view), but for
  // widening groups (Heuristics::kWideningGroupRegPacks) outside the peeled and kBody views.
  const bool runs_peeled = g.peel || g.body;
  const int reg_packs = g.widening && group && !runs_peeled ? Heuristics::kWideningGroupRegPacks : g.max_reg_packs;
  const int64_t threads = cta_threads(packs, reg_packs);
  if (threads <= max_threads) return CacheShape{static_cast<int>(threads), reg_packs, 0, 0};
  // Shared-memory packs: reg_packs in registers, the rest in shared memory, within the budget.
  const auto with_shared_packs = [&](int regs) -> std::optional<CacheShape> {
    const int64_t smem_packs = ceil_div(packs, max_threads) - regs;
    const int64_t smem_bytes = smem_packs * max_threads * g.pack_bytes * g.streams;
    if (smem_bytes > smem_budget) return std::nullopt;
    return CacheShape{max_threads, regs, static_cast<int>(smem_packs), static_cast<size_t>(smem_bytes)};
  };
  // 16-byte packs only: single elements have instances at the largest bucket alone (softmax_block.cu). Peeled rows
  // too: peeled_instance compiles their 16-bit forward buckets below the largest.
  const bool forward16 = g.streams == 1 && g.in_bytes == 2 && !g.widening && g.vec > 1;
  if (group && forward16 && reg_packs > Heuristics::kGroupSharedRegPacks16) {
    if (auto shape = with_shared_packs(Heuristics::kGroupSharedRegPacks16)) return shape;
  }
  return with_shared_packs(reg_packs);
}

// Budget for a CTA that must leave room for another on its SM, and for one that may own the SM.
int64_t shared_smem_budget(const DeviceProps& props) {
  return props.smem_per_sm / 2 - Heuristics::kSmemReservePerCta;
}
int64_t exclusive_smem_budget(const DeviceProps& props) {
  return props.smem_per_block_optin - Heuristics::kSmemReservePerCta;
}

// Many rows whose row fits in registers: CTAs take rows in turn, at least two each, and each prefetches its
// next row into shared memory (cp.async) while it reduces and writes the current one. With one row per CTA
// every CTA of the single wave loads, then computes, then stores at the same time, and DRAM idles through
// the math (Nsight Compute, H200, 2048 x 4096 fp16: 2048 CTAs in 0.97 waves, 24% DRAM throughput).
// Only 16-bit inputs (twice the elements, so twice the math, per byte) and up to kPrefetchMaxWaves waves
// of rows: beyond, later waves of one-row CTAs already overlap the earlier ones' math. H200, 2026-11-22
// (xCopy without -> with prefetch): 2048x4096 fp16 0.80 -> 0.83, 4096x4096 fp16 0.81 -> 0.85; fp32 neutral
// to worse (2048x4096 0.92 -> 0.94, 4096x4096 0.95 -> 0.94, 2048x2048 1.00 -> 0.92); 32768x2048 (8-16
// waves) fp16 0.92 -> 0.88, fp32 0.96 -> 0.90. Forced block_onepass always prefetches (the tests' way in).
void add_row_prefetch(SoftmaxPlan& plan, const Geometry& g, const DeviceProps& props, bool forced) {
  // Forward only (a compiled variant per forward dtype pair), register-only rows, 16-byte packs.
  if (g.streams != 1 || plan.cluster != 1 || plan.smem_packs != 0 || g.vec == 1 || g.peel || g.rows < 2) return;
  if (plan.reg_packs != g.max_reg_packs) return;
  const int64_t staging = static_cast<int64_t>(plan.reg_packs) * plan.threads * g.pack_bytes * g.streams;
  // Resident CTAs per SM: the 64-register budget (1024 threads), 32 CTAs, and shared memory.
  const int64_t by_smem = props.smem_per_sm / (staging + Heuristics::kSmemReservePerCta);
  const int64_t per_sm = std::min<int64_t>({32, kBlockKernelMaxThreads / plan.threads, by_smem});
  if (per_sm < 1) return;
  if (!forced && (g.in_bytes != 2 || g.rows > Heuristics::kPrefetchMaxWaves * per_sm * props.sm_count)) return;
  plan.prefetch = true;
  plan.smem_bytes = static_cast<size_t>(staging);
  plan.grid = std::min(ceil_div(g.rows, 2), per_sm * props.sm_count);
}

// The one-pass kernels' common fields: which kernel, and how each CTA caches its (chunk of a) row.
SoftmaxPlan one_pass_plan(SoftmaxKernel kernel, const Geometry& g, const CacheShape& shape) {
  SoftmaxPlan plan;
  plan.kernel = kernel;
  plan.vec = g.vec;
  plan.peel = g.peel;
  plan.threads = shape.threads;
  plan.reg_packs = shape.reg_packs;
  plan.smem_packs = shape.smem_packs;
  plan.smem_bytes = shape.smem_bytes;
  return plan;
}

SoftmaxPlan plan_cached(const Geometry& g, const DeviceProps& props, const CacheShape& shape, int cluster) {
  SoftmaxPlan plan =
      one_pass_plan(cluster > 1 ? SoftmaxKernel::kClusterOnePass : SoftmaxKernel::kBlockOnePass, g, shape);
  plan.cluster = cluster;
  const int64_t clusters = std::min(g.rows, std::max<int64_t>(1, grid_cap(props, shape.threads) / cluster));
  plan.grid = clusters * cluster;
  return plan;
}

SoftmaxPlan plan_two_pass(const Geometry& g, const DeviceProps& props) {
  SoftmaxPlan plan;
  plan.kernel = SoftmaxKernel::kTwoPass;
  plan.vec = g.vec;
  plan.peel = g.peel;
  plan.threads = static_cast<int>(std::clamp<int64_t>(round_up(g.n_packs, 32), 32, Heuristics::kTwoPassThreads));
  plan.grid = std::min(g.rows, grid_cap(props, plan.threads));
  return plan;
}

// Bytes of one partial accumulator (the kernels' Op::Acc): MaxSum<float> / MaxSum<double> forward, a
// double dot product backward.
int64_t partial_bytes(const Geometry& g) { return g.streams == 1 ? 2 * (g.in_bytes == 8 ? 8 : 4) : 8; }

SoftmaxPlan plan_grid_group(const Geometry& g, const CacheShape& shape, int64_t ctas_per_row) {
  SoftmaxPlan plan = one_pass_plan(SoftmaxKernel::kGridOnePass, g, shape);
  plan.chunks = ctas_per_row;
  plan.grid = g.rows * ctas_per_row;
  plan.workspace_bytes = static_cast<size_t>(g.rows * ctas_per_row * partial_bytes(g));
  return plan;
}

SoftmaxPlan plan_split_row(const Geometry& g, const DeviceProps& props, bool forced) {
  SoftmaxPlan plan;
  plan.kernel = SoftmaxKernel::kSplitRow;
  plan.vec = g.vec;
  plan.peel = g.peel;
  const int64_t want = static_cast<int64_t>(Heuristics::kSplitCtasPerSm * props.sm_count / g.rows + 0.999);
  const int64_t most = std::max<int64_t>(1, g.n_packs * g.pack_bytes / Heuristics::kSplitMinChunkBytes);
  int64_t chunks = std::clamp<int64_t>(want, 1, most);
  if (forced) chunks = std::max<int64_t>(chunks, 2);  // a forced split_row really splits (tests)
  chunks = std::max<int64_t>(1, std::min(chunks, g.n_packs));  // a peeled row's body may have no pack
  const int64_t chunk_packs = ceil_div(std::max<int64_t>(g.n_packs, 1), chunks);
  plan.chunks = ceil_div(std::max<int64_t>(g.n_packs, 1), chunk_packs);  // CTAs per row: about chunk_packs packs each
  plan.threads = static_cast<int>(std::clamp<int64_t>(round_up(chunk_packs, 32), 32, Heuristics::kSplitThreads));
  plan.grid = std::min(g.rows * plan.chunks, grid_cap(props, plan.threads));
  plan.workspace_bytes = static_cast<size_t>(g.rows * plan.chunks * partial_bytes(g));
  return plan;
}

SoftmaxPlan plan_strided(const SoftmaxProblem& p, const DeviceProps& props) {
  SoftmaxPlan plan;
  plan.kernel = SoftmaxKernel::kStrided;
  plan.vec = 1;
  plan.block_x = static_cast<int>(std::min<int64_t>(p.inner, 32));
  const int64_t tiles = p.outer * ceil_div(p.inner, plan.block_x);
  const int target = tiles < 2 * props.sm_count ? Heuristics::kStridedThreadsFewTiles : Heuristics::kStridedThreads;
  const int64_t block_y = std::min(pow2_floor(std::max(1, target / plan.block_x)), pow2_ceil(p.n));
  plan.threads = static_cast<int>(plan.block_x * block_y);
  plan.grid = std::min(tiles, grid_cap(props, plan.threads));
  return plan;
}

// ---- the decision ---------------------------------------------------------------------------------

class Chooser {
 public:
  Chooser(const SoftmaxRequest& request, const DeviceProps& props, RowView view = RowView::kNatural)
      : request_(request), p_(request.problem), props_(props), g_(geometry_of(request, view)) {}

  SoftmaxChoice choose() {
    if (!request_.forced.empty()) return forced();
    SoftmaxChoice choice = choose_automatic();
    if (choice.plan.peel) choice.reason += peel_note();
    return choice;
  }

 private:
  SoftmaxChoice choose_automatic() {
    if (p_.inner > 1) return ok(plan_strided(p_, props_), "the reduced dim is not the last one (inner size " +
                                                             std::to_string(p_.inner) +
                                                             "): threads run across inner, coalesced, no transpose");
    if (auto lean = lean_rows()) return *lean;
    // Many rows that break 16-byte packs, of the lean forms' lengths: the lean instances, peeled. H100, session
    // 19 (two interleaved runs each, us, the plain peeled instance -> the lean one): call 5, softmax 4096 x 4095
    // fp16 / bf16 / fp32 32.4 / 31.6 -> 28.6 / 27.8, 35.8 / 35.6 -> 28.8 / 27.9, 51.7 / 51.4 -> 50.5 / 49.6; 2048 x
    // 8191 -11 / -18 / -3%, 300 x 4095 -21 / -29 / -12%, log_softmax alike (*session19-c5-compare*); call 8, the
    // backward at 3 CTAs per SM (softmax_block_kernel.cuh: kLeanPeeledBackwardMinCtas): softmax_backward 4096 x
    // 4095 46.8 / 47.5 -> 40.6 / 40.5, -14 / -6% (bf16 / fp32), 2048 x 8191 -17 / -18 / -1%, 2048 x 2049 -8 / -12 /
    // -13%, log_softmax_backward alike (*session19-c8-compare*). At 4 CTAs per SM (32 registers) the 16-bit
    // backward spilled and ran 13-49% slower (call 5).
    // Shorter ones, of warp lengths in packs: the warp kernel, peeled (peeled_warp_rows).
    if (peelable(request_)) {
      Chooser peeled(request_, props_, RowView::kPeeled);
      if (auto lean = peeled.lean_rows()) return *lean;
      if (auto warp = peeled.peeled_warp_rows()) return *warp;
    }
    if (auto warp = warp_rows()) {
      if (auto spread = spread_small_rows()) return *spread;
      return *warp;
    }
    const bool few_rows = static_cast<double>(g_.rows) < Heuristics::kFewRowsPerSm * props_.sm_count;
    if (few_rows) {
      if (peelable(request_)) {
        if (auto choice = peel_few_rows()) return *choice;
        if (auto choice = Chooser(request_, props_, RowView::kPeeled).peeled_cluster_rows()) return *choice;
      }
      return choose_few_rows();
    }
    // Many rows that break 16-byte packs: peeled.
    if (peelable(request_)) {
      Chooser peeled(request_, props_, RowView::kPeeled);
      SoftmaxChoice choice = peeled.choose_many_rows();
      if (!peeled.too_few_warps(choice.plan)) return choice;
    }
    return choose_many_rows();
  }

  // Rows that break 16-byte packs, of the warp kernel's lengths in packs: the warp kernel, peeled (an edge
  // element per lane), except few 16-bit forward rows that whole packs would spread over a CTA
  // (spread_small_rows). Before it such rows of at most 32 x 8 elements ran as single elements in the warp
  // kernel, longer ones as peeled one-warp CTAs of 8 packs per thread (8192 x 1023 fp16 0.72 of copy, 10-20%
  // behind torch.compile; session 19). H100, session 20 calls 5 and 6 (three interleaved rounds,
  // *session20-c{5,6}-compare-peeled-warp*, us, fp16 / bf16 / fp32, before -> peeled warp, rounds 2-3): softmax
  // 8192 x 1023 23.1 / 25.5 / 30.2 -> 17.3 / 17.4 / 28.1, 16384 x 513 -47 / -48 / -8%, 32768 x 777 -40 / -35 / -3%,
  // 65536 x 100 -31 / -30 / -2%, 1000 x 1001 -20 / -20 / -5%, 37 x 1023 -34 / -20 / -14%; log_softmax alike;
  // softmax_backward (16-bit: float32 rows of 513-1023 kept the block kernel, beyond the backward's 2 KB warp
  // rows, until session 21: warp_max_row_bytes) 8192 x 1023 -8 / -6%, 65536 x 100 -20 / -19%; few-microsecond
  // cases that did not separate: 300 x 2047 bf16 softmax +9% (8.1 -> 8.9; fp16 -2%), 133 x 1001 between -10% and
  // +7% from round to round.
  std::optional<SoftmaxChoice> peeled_warp_rows() {
    if (few_small_rows_to_spread()) return std::nullopt;
    return warp_rows();
  }

  // The warp kernel, for rows it holds within warp_max_row_bytes.
  std::optional<SoftmaxChoice> warp_rows() {
    if (!warp_takes_rows()) return std::nullopt;
    return ok(plan_warp(g_, props_), "rows of " + kib(p_.n * g_.in_bytes) + " per input (<= " +
                                         kib(warp_max_row_bytes()) + "): one warp or sub-warp per row, " +
                                         "row in registers, no block barrier");
  }

  // A peeled plan of one-warp CTAs (rows of at most 32 x 8 packs: the peeled instances hold the most register
  // packs per thread) with fewer than kPeelOneWarpMinRowsPerSm rows per SM: a few warps per SM, each with a
  // long chain per thread, where single elements spread the row over 4x the threads. H100, session 19 call 2
  // (two interleaved runs each, us, single elements -> peeled; *session19-c2-compare*): softmax 1000 x 1001 (7.6
  // rows per SM) fp16 8.3 / 8.3 -> 9.0 / 9.1, bf16 9.0 / 8.3 -> 9.9 / 9.3, fp32 9.5 / 8.9 -> 9.8 / 9.8, but 8192 x
  // 1023 (62 per SM) fp16 32.5 / 32.3 -> 23.4 / 23.4, fp32 34.6 / 34.4 -> 30.2 / 29.6; the backward's peeled CTAs
  // there have two warps (softmax_backward 1000 x 1001 fp16 13.6 / 13.6 -> 8.4 / 9.1).
  bool too_few_warps(const SoftmaxPlan& plan) const {
    return plan.peel && plan.kernel == SoftmaxKernel::kBlockOnePass && plan.threads <= 32 &&
           static_cast<double>(g_.rows) < Heuristics::kPeelOneWarpMinRowsPerSm * props_.sm_count;
  }

  // Few rows that break 16-byte packs: the plan the rules make for their longest aligned body, run peeled, where a
  // peeled instance holds its register packs: the most (long rows), or any fewer for 16-bit forwards (a 16-bit or
  // float32 result), the same-dtype 16-bit backward and the same-dtype float32 backward (peeled_instance); where
  // it would stream (the grid group's streamed form has no peeled instance) or split, the peeled split_row. Shorter
  // rows of the other dtype pairs (the float32 forward, float32 gradients of 16-bit inputs) keep single elements (the
  // float32 forward: or peeled_cluster_rows): the whole-pack rules spread them over more threads with fewer packs each
  // (latency-bound), which single elements do too.
  // H100, session 19 call 3 (single elements against the aligned neighbour, xCopy, fp16 / fp32 softmax): 4 x 33554431
  // 0.34 / 0.37 vs 0.63 / 0.64 (split_row), 4 x 8388607 0.44 / 0.47 vs 0.68 / 0.68 (streamed grid group), 64 x 151935
  // 0.52 / 0.58 vs 0.76 / 0.79; 8 x 262143 0.72 / 0.80 vs 0.64 / 0.78. A/B of this rule (call 4, two interleaved runs,
  // softmax / both backwards, fp16 and fp32, *session19-c4-compare*): 4 x 33554431 -39..-46%, 4 x 8388607 -27..-37%
  // (peeled split_row), 64 x 151935 -21..-46%, 8 x 262143 16-bit backward -21..-23%; 2 x 300007 fp16 softmax +6.8% (a
  // peeled cluster of 16).
  // 16-bit rows spread over fewer packs, against single elements or session 33's peeled cluster of 8 packs: H100,
  // session 34 call 1 (A/B in turns against 21fb4f0, two rounds, us, fp16 / bf16;
  // *session34-c1-compare-peeled-spread.txt*): softmax 3 x 100003 9.2 / 8.6-8.7 -> 8.3-8.8 / 7.3-8.2, 1 x 262143
  // 10.5-11.0 / 11.2 -> 8.8-9.0 / 8.6-9.1, 4 x 1048575 21.1-21.9 / 21.2-22.0 -> 15.4-15.5 / 15.1-15.7, 48 x 24577 -18 /
  // -23%, 4 x 151935 -13 / -19%, 8 x 32001 -13 / -18%, 1 x 128257 -12 / -14%, 16 x 262143 -4 / -12%, 64 x 50257 -6 /
  // -11%; softmax_backward 16 x 65537 12.8-13.6 / 13.5-13.6 -> 10.3-10.4 / 10.3-10.4, 1 x 1048575 15.3-15.4 / 14.7-15.3
  // -> 12.4 / 12.4-13.1, 4 x 65537 -17 / -11%, 8 x 32001 -17 / -14%, 8 x 100003 -14 / -15%, 1 x 32001 -21 / -11%.
  // Within the few-microsecond spread (up to 12% for one plan against itself in the same call: 3 x 100000
  // softmax_backward fp16): 1 x 32001 softmax fp16 +7% (bf16 -3%), 8 x 262143 fp16 +5% (bf16 -4%).
  // The float32 backward so spread, against single elements (session 34 call 2, same protocol, us,
  // *session34-c2-compare-peeled-spread-fp32.txt*): softmax_backward 8 x 16383 8.5-8.7 -> 6.8-7.0, 1 x 50257 8.9-9.0 ->
  // 7.1-7.6, 24 x 32001 12.5 -> 10.1-10.2, 4 x 24577 -17%, 48 x 16385 -16%, 16 x 32001 -14%, 4 x 65537 -13%, 1 x 32001
  // -10%; within the spread: 8 x 65537 +5%, 1 x 300007 +4%.
  // 16-bit forwards with a float32 result so spread, against single elements (session 34 call 6, same protocol, us,
  // fp16 / bf16, softmax; *session34-c6-compare-peeled-spread-widening.txt*): 64 x 50257 18.8-19.4 -> 13.8-14.7, 24 x
  // 100003 16.2-16.8 -> 12.5-13.5, 4 x 1048575 22.6-23.2 -> 17.8-18.8, 16 x 100003 -13 / -17%, 1 x 128257 -11 / -13%, 8
  // x 262143 -8 / -11%, 32 x 50257 -19 / -4%, log_softmax alike; 3 x 262143 softmax +10 / +9% (log_softmax +4 / -2%),
  // within the spread of that call's unchanged plans (3 x 100000 -6..+14%).
  std::optional<SoftmaxChoice> peel_few_rows() const {
    SoftmaxChoice choice = Chooser(request_, props_, RowView::kBody).choose_few_rows();
    if (!choice.error.empty()) return std::nullopt;
    const SoftmaxPlan& plan = choice.plan;
    if (plan.kernel == SoftmaxKernel::kSplitRow || plan.stream_rest) {
      return ok(plan_split_row(geometry_of(request_, RowView::kPeeled), props_, false),
                few_rows_note() + " and a row (" + kib(g_.row_bytes) + ") too long for every CTA slot to cache its " +
                    "chunk: two launches, partial (max, sum) per part merged in fixed order, then normalise");
    }
    const bool one_pass = plan.kernel == SoftmaxKernel::kBlockOnePass || plan.kernel == SoftmaxKernel::kClusterOnePass ||
                          plan.kernel == SoftmaxKernel::kGridOnePass;
    const bool compiled = peeled_instance(p_.in_dtype, p_.out_dtype, p_.backward, plan.reg_packs);
    if (!one_pass || plan.lean || plan.prefetch || !compiled) return std::nullopt;
    choice.plan.peel = true;
    return choice;
  }

  // Few float32 same-dtype forward rows that break 16-byte packs, where peel_few_rows keeps single elements: the
  // peeled cluster (the forced cluster_onepass plan; this Chooser's view is kPeeled) where its CTAs have at least
  // kPeeledClusterMinThreads threads and hold their chunk in registers. (peel_few_rows takes every such 16-bit row.)
  std::optional<SoftmaxChoice> peeled_cluster_rows() {
    if (g_.streams != 1 || g_.widening || g_.in_bytes != 4) return std::nullopt;
    std::optional<SoftmaxChoice> choice = filling_clusters();
    if (!choice) return std::nullopt;
    if (choice->plan.threads < Heuristics::kPeeledClusterMinThreads || choice->plan.smem_packs != 0) {
      return std::nullopt;
    }
    choice->reason = few_rows_note() + ": " + choice->reason + " (" + std::to_string(choice->plan.threads) +
                     " threads per CTA at " + std::to_string(choice->plan.reg_packs) +
                     " register packs each: the peeled instances')";
    return choice;
  }

  // How the few-rows plans' reasons begin.
  std::string few_rows_note() const {
    return std::to_string(g_.rows) + " rows < " + std::to_string(props_.sm_count) + " SMs";
  }

  // What a peeled plan adds to its reason (choose).
  std::string peel_note() const {
    const int vec = 16 / g_.in_bytes;
    const int edges = geometry_of(request_, RowView::kPeeled).max_edges;
    return "; the row (" + std::to_string(p_.n) + " columns) breaks " + std::to_string(vec) + "-element packs: each " +
           "row's aligned body in packs, the up to " + std::to_string(edges) + " elements around it singly";
  }

  // Widening rows of at least kWideningClusterMinPacks packs, at least kWideningClusterMinRowsPerSm per SM: a
  // cluster of 2 CTAs per row before one CTA of 512 threads, half the output per CTA. H100, session 26 (two rounds
  // in turns, us): call 3, forced cluster_onepass against the automatic choice, fp16 / bf16, softmax 8192 x 32000
  // 645 / 643 -> 609 / 608, log_softmax -5 / -6%; call 4, this rule from 769 packs against the rules before it,
  // bf16 (*session26-c4-compare-widening-vocab.txt*): 2048 x 16384 99.4 -> 85.6 (-14%), 4096 x 32000 -7%, 2048 x
  // 50257 -2%, 512 x 151936 and 1024 x 128256 (4-8 rows per SM) 0%, 264 x 6152 (2 per SM) +18 / +22%.
  // Shorter rows keep the lean and block instances: there the cluster's 64-128-thread CTAs exceeded the accuracy
  // bound on float16 -> float32 (2048 x 8192 softmax 4.6e-7 against 2x torch's error + 2e-7 = 4.0e-7, call 4's
  // bench; 4096 x 4096 and 2048 x 8192 in call 3's forced runs), though they were 4-8% faster.
  std::optional<SoftmaxChoice> widening_cluster_rows() {
    if (!g_.widening || g_.n_packs < Heuristics::kWideningClusterMinPacks) return std::nullopt;
    if (g_.rows < Heuristics::kWideningClusterMinRowsPerSm * props_.sm_count) return std::nullopt;
    auto choice = try_clusters(2, /*exclusive=*/false);
    if (choice) {
      choice->reason = "many rows of " + std::to_string(p_.n) + " columns with a float32 result (twice the bytes " +
                       "written as read): " + choice->reason;
    }
    return choice;
  }

  SoftmaxChoice choose_many_rows() {
    if (auto choice = widening_cluster_rows()) return *choice;
    if (auto shape = cache_shape(g_.n_packs, g_, Heuristics::kSharedCtaMaxThreads, shared_smem_budget(props_))) {
      SoftmaxPlan plan = plan_cached(g_, props_, *shape, 1);
      add_row_prefetch(plan, g_, props_, /*forced=*/false);
      return ok(plan, "enough rows for every SM; a row (" + kib(g_.row_bytes) + ") fits on chip in one CTA that " +
                          "leaves room for a second per SM: one read, one write" +
                          (plan.prefetch ? "; each CTA prefetches its next row while it works on one" : ""));
    }
    if (auto choice = try_clusters(2, /*exclusive=*/false)) {
      choice->reason = "enough rows, but a row (" + kib(g_.row_bytes) + ") is too large for one CTA: " +
                       choice->reason;
      return *choice;
    }
    if (auto shape = cache_shape(g_.n_packs, g_, kBlockKernelMaxThreads, exclusive_smem_budget(props_))) {
      return ok(plan_cached(g_, props_, *shape, 1),
                "a row (" + kib(g_.row_bytes) + ") fits on chip only in a CTA that owns its SM: one read, one write");
    }
    if (auto choice = try_clusters(2, /*exclusive=*/true)) return *choice;
    if (static_cast<double>(g_.rows) >= Heuristics::kTwoPassMinRowsPerSm * props_.sm_count) {
      return ok(plan_two_pass(g_, props_), "a row (" + kib(g_.row_bytes) + ") does not fit on chip even in a " +
                                               "cluster; rows keep every SM busy: one CTA per row, online " +
                                               "(max, sum) pass then a re-read");
    }
    return ok(plan_split_row(g_, props_, false), "a row (" + kib(g_.row_bytes) + ") does not fit on chip even " +
                                                     "in a cluster, and rows alone cannot fill the SMs: " +
                                                     "partials per chunk, merged in fixed order, then a re-read");
  }

  SoftmaxChoice choose_few_rows() {
    const std::string why_few = few_rows_note();
    const bool worth_splitting = ceil_div(props_.sm_count, g_.rows) > 1 &&
                                 g_.row_bytes >= Heuristics::kFewRowsSplitMinRowBytes;
    if (!worth_splitting || !clusters_supported()) {
      if (auto shape = cache_shape(g_.n_packs, g_, kBlockKernelMaxThreads, exclusive_smem_budget(props_))) {
        return ok(plan_cached(g_, props_, *shape, 1),
                  why_few + ", but a row (" + kib(g_.row_bytes) +
                      (!worth_splitting ? ") is too small to split" : ") cannot be split (no thread-block clusters)") +
                      ": one CTA per row, one read, one write");
      }
    }
    if (worth_splitting) {
      const bool clusters_on_half_the_sms = 2 * g_.rows * kMaxClusterCtas <= props_.sm_count;
      int64_t cluster_first_chunk = 0;  // single elements on more rows: the grid group first
      if (g_.vec > 1) {
        cluster_first_chunk = clusters_on_half_the_sms ? Heuristics::kClusterFirstFewMaxChunkBytes
                                                       : Heuristics::kClusterFirstMaxChunkBytes;
      } else if (clusters_on_half_the_sms) {
        cluster_first_chunk = Heuristics::kClusterFirstScalarMaxChunkBytes;
      }
      const bool cluster_first = g_.row_bytes <= kMaxClusterCtas * cluster_first_chunk;
      std::optional<SoftmaxChoice> choice;
      if (cluster_first) choice = widest_cluster();
      if (!choice) choice = grid_group(/*forced=*/false);
      if (!choice && !cluster_first) choice = widest_cluster();
      if (!choice) choice = try_clusters(2, /*exclusive=*/false);
      if (!choice) choice = try_clusters(2, /*exclusive=*/true);
      if (!choice) choice = grid_group_streamed(/*forced=*/false);
      if (choice) {
        choice->reason = why_few + ": " + choice->reason;
        return *choice;
      }
    }
    return ok(plan_split_row(g_, props_, false),
              why_few + " and a row (" + kib(g_.row_bytes) + ") does not fit on chip in a cluster: " +
                  "two launches, partial (max, sum) per chunk merged in fixed order, then normalise");
  }

  // Few rows: the widest cluster (most CTAs per row, up to kMaxClusterCtas) whose chunks are at least
  // kClusterMinChunkBytes and whose clusters all fit on the device at once, first with CTAs that leave room
  // for a second on their SM, then with CTAs that own it; its CTAs use up to kSpreadThreads threads with
  // few packs each. Few rows are latency-bound, not bandwidth-bound: each CTA loads, then folds its chunk
  // in a dependent chain, then stores, so the more CTAs and threads share a row the shorter that chain.
  // H200, 2026-11-22: clusters of 16 (1 pack per thread) against the 16 KB-chunk rule's 2-8 gave
  // 4x32768 bf16 0.64 vs 0.54 of copy, 4x65536 bf16 0.69 vs 0.61, 3x100003 fp16 0.50 vs 0.43.
  std::optional<SoftmaxChoice> widest_cluster() {
    for (const bool exclusive : {false, true}) {
      const int max_threads = exclusive ? kBlockKernelMaxThreads : Heuristics::kSharedCtaMaxThreads;
      const int64_t budget = exclusive ? exclusive_smem_budget(props_) : shared_smem_budget(props_);
      for (int cluster = kMaxClusterCtas; cluster >= 2; --cluster) {
        const int64_t chunk = ceil_div(g_.n_packs, cluster);
        const int64_t chunk_bytes = chunk * g_.pack_bytes * g_.streams;
        if (chunk_bytes < Heuristics::kClusterMinChunkBytes) continue;
        const auto shape = cache_shape(chunk, g_, max_threads, budget, Heuristics::kSpreadThreads, /*group=*/true);
        if (!shape) continue;
        const SoftmaxPlan plan = plan_cached(g_, props_, *shape, cluster);
        if (resident(plan) < g_.rows) continue;
        return ok(plan, "a cluster of " + std::to_string(cluster) + " CTAs per row (the most that fit in one " +
                            "wave), each caching " + kib(chunk_bytes) + " on chip; partial (max, sum) merged " +
                            "through distributed shared memory in fixed order: one read, one write");
      }
    }
    return std::nullopt;
  }

  // Softmax and log_softmax of many 16-bit rows of 2048-8192 columns (16-byte packs, at least one row per
  // SM; since sessions 38-39 also fewer rows of 256-8192 columns, kLeanFewMinColumns): a CTA per row of
  // ceil(packs / 2) threads with 2 register packs each, exp(x - max) taken once and kept in registers (the lean
  // instance, exp_once_rows). H200, 2026-11-22: the 64-register instance (8 packs per
  // thread, row prefetch, each exponential taken twice) gave 2048 x 4096 fp16 0.73-0.76 of copy, 2048 x 8192
  // 0.77-0.81, 4096 x 4096 0.79-0.82, against Liger's Triton kernel at 0.92-0.98, 0.97-1.00, 0.97-1.02. The
  // same lean CTA shape with the twice-taken exponentials was slower still (0.73, 0.67, 0.69: results
  // *session5-ab-lean-block-*.json). Float rows of 2048-4096 columns through the same instance (session 6 A/B,
  // two runs each): 2048 x 2048 0.94 -> 1.00, but 4096 x 4096 0.95 -> 0.92 and 32768 x 2048 0.98 -> 0.95; not
  // taken. log_softmax (session 6 A/B against the prefetching 8-pack instance, two runs each, fp16 / bf16):
  // 2048 x 4096 0.82 / 0.82 -> 0.86 / 0.88, 4096 x 4096 0.80 / 0.77 -> 0.87 / 0.86, 32768 x 2048 0.94 / 0.88 ->
  // 0.99 / 0.99.
  //
  // The backward ops take the same CTA shape (2 packs of each stream per thread, no wide form: 4 packs of
  // two streams do not fit 32 registers) in lean_backward_rows: up to 2048 threads per SM. For 16-bit streams
  // that is twice the loads in flight of the 64-register instance (2 packs per thread there too, 1024 threads);
  // float32 streams (256..1024 packs of 4: 1024-4096 columns) had 4 packs per thread there, about as many
  // packs in flight as here, so their gain comes from elsewhere (shorter per-thread chains, more CTAs; not
  // profiled). H100, 2026-11-22, two interleaved A/B runs each against the 64-register instance: 16-bit
  // (*session7-ab2-*.json) 2048 x 2048 .. 32768 x 2048 softmax_backward geomean 0.94-0.95 -> 0.97-0.98 of
  // copy, log_softmax_backward 0.94-0.95 -> 0.97-0.98; float32 (*session7-ab5-*.json) 2048 x 1024 0.85-0.91 ->
  // 0.99-1.02, 2048 x 2048 log_softmax_backward 0.88-0.91 -> 1.00, 4096 x 4096 0.95 -> 0.98-0.99.
  //
  // Fewer forward rows than SMs of 256-8192 columns (kLeanFewMinColumns), and many float32 rows of 512-1024 columns
  // that fit in one wave (kLeanOneWaveFloatMinPacks), take the two-pack form, or float32 rows of 4097-8192 columns in
  // fewer rows the float form (sessions 38-39). Fewer backward rows than SMs of 512 columns up to 1024 packs, and many
  // 16-bit backward rows of 64-255 packs in one wave, take the two-pack form too (session 40,
  // kLeanFewBackwardMinColumns).
  //
  // float32 forward rows of 256-2048 packs (1024-8192 columns) take the lean instance's float form: the
  // 64-register instance's CTA shape (8 packs per thread: 128 KB in flight per SM; 256 or 512 threads with
  // fewer packs measured 1-75% slower, *session17-c4-*), with the row max first and each exp(x - max) taken
  // once instead of the online (max, sum) merge in every shuffle step. H100, session 17 call 6, three
  // interleaved runs (us, 64-register instance -> lean): softmax 2048 x 2048 17.3 / 17.1 / 17.2 -> 15.4 / 15.9 /
  // 15.0, 2048 x 4096 -6.7%, 4096 x 4096 -3.8%, 2048 x 8192 -4.3%, 32768 x 2048 186 -> 183, 1024 x 6000 -7.9%;
  // log_softmax -2..-8% on the same shapes (*session17-c6-compare-lean-float-forward.txt*). Liger's Triton
  // softmax had been 2-7% faster than the 64-register instance on these shapes (session 17 call 3's bench).
  std::optional<SoftmaxChoice> lean_rows() {
    // Hopper only: measured there, and compiled for 4 CTAs of 512 threads per SM (other archs hold fewer).
    if (props_.cc_major < 9 || g_.vec == 1) return std::nullopt;
    const bool float_backward = p_.backward && g_.in_bytes == 4 && !g_.peel;  // any result dtype (BackwardPairs)
    const bool few_rows = g_.rows < props_.sm_count;
    // Few forward rows of kLeanFewMinColumns..kLeanFewMaxColumns (kLeanFewFloatResultMinColumns for a float32 result),
    // and many float32 rows of 128-256 whole packs that fit in one wave (float64 has no lean form: lean_form_exists).
    const int64_t columns = g_.n_packs * g_.vec;  // a peeled row's aligned body
    const bool float_result = g_.in_bytes == 4 || g_.widening;
    const bool few_forward =
        few_rows && !p_.backward && columns <= Heuristics::kLeanFewMaxColumns &&
        columns >= (float_result ? Heuristics::kLeanFewFloatResultMinColumns : Heuristics::kLeanFewMinColumns);
    // Whether every row's CTA of `reg_packs` packs per thread is resident at once (asked only of rows of at least
    // one pack).
    const auto ctas_fit_one_wave = [&](int reg_packs) {
      return g_.rows <= props_.sm_count * resident_ctas_per_sm(props_, cta_threads(g_.n_packs, reg_packs));
    };
    const bool two_packs_hold = g_.n_packs <= lean_max_row_packs(kLeanRegPacks);
    const bool one_wave_float_forward =
        !few_rows && !p_.backward && g_.in_bytes == 4 && !g_.peel &&
        g_.n_packs >= Heuristics::kLeanOneWaveFloatMinPacks && g_.n_packs <= Heuristics::kLeanFloatMinPacks &&
        ctas_fit_one_wave(kLeanRegPacks);
    // Few backward rows of kLeanFewBackwardMinColumns up to the two-pack form's packs (any stream dtype), and many
    // 16-bit backward rows of kLeanOneWaveBackwardMinPacks..kLeanMinPacks - 1 whole packs in one wave (session 40).
    const bool few_backward =
        few_rows && p_.backward && columns >= Heuristics::kLeanFewBackwardMinColumns && two_packs_hold;
    const bool one_wave_16bit_backward =
        !few_rows && p_.backward && g_.in_bytes == 2 && !g_.peel &&
        g_.n_packs >= Heuristics::kLeanOneWaveBackwardMinPacks && g_.n_packs < Heuristics::kLeanMinPacks &&
        ctas_fit_one_wave(kLeanRegPacks);
    // Many whole 16-bit forward rows (same-dtype result) of kLeanOnePackMinPacks..kLeanMinPacks - 1 packs whose
    // one-pack CTAs fit in one wave (session 46).
    const bool one_pack_one_wave =
        !few_rows && !p_.backward && g_.in_bytes == 2 && !g_.widening && !g_.peel &&
        g_.n_packs >= Heuristics::kLeanOnePackMinPacks && g_.n_packs < Heuristics::kLeanMinPacks &&
        ctas_fit_one_wave(kLeanOnePackRegPacks);
    if (few_rows && !few_forward && !few_backward) return std::nullopt;
    // Widening rows (a float32 result) of up to 4 KB per input take the warp kernel (warp_max_row_bytes). H100,
    // session 26 call 3 (two rounds in turns, us, lean -> warp, softmax fp16 / bf16,
    // *session26-c3-compare-widening.txt*): 32768 x 2048 165.8 / 164.7 -> 143.5 / 143.3, 8192 x 2048 -13 / -10%,
    // 2048 x 2048 -19 / -2%, 65536 x 1536 (8 packs per thread in the 64-register instance before) -10 / -7%;
    // log_softmax alike.
    // Not the few rows spread_small_rows would take from the warp kernel (132-264 rows: not measured), and not
    // fewer rows than SMs of 512-8192 columns (few_forward: the lean instance measured faster, sessions 38-39).
    if (g_.widening && !few_forward && warp_takes_rows() && !few_small_rows_to_spread()) return std::nullopt;
    // 16-bit forward rows of more than kLeanWideMinPacks packs: the wide form, 4 packs per thread; float32
    // forward rows: the float form, 8 packs per thread (the 64-register instance's CTA shape, without its
    // online (max, sum) merge); the backward, whatever its dtypes, and the few and one-wave rows above: 2, where
    // 512 threads hold the row (softmax_launch.h).
    const bool float_forward = !p_.backward && g_.in_bytes == 4;
    const LeanForm form = one_pack_one_wave                       ? LeanForm::kOnePack
                          : p_.backward || one_wave_float_forward ? LeanForm::kTwoPacks
                          : few_forward                         ? (two_packs_hold ? LeanForm::kTwoPacks : LeanForm::kFloat)
                          : float_forward                       ? LeanForm::kFloat
                          : g_.n_packs > Heuristics::kLeanWideMinPacks ? LeanForm::kWide
                                                                       : LeanForm::kTwoPacks;
    if (!lean_form_exists(g_.in_bytes, p_.backward, form, g_.widening)) return std::nullopt;  // float64
    const int reg_packs = lean_reg_packs(form);
    const bool range_checked =
        few_forward || one_wave_float_forward || few_backward || one_wave_16bit_backward || one_pack_one_wave;
    const int64_t min_packs = range_checked    ? 1
                              : float_forward  ? Heuristics::kLeanFloatMinPacks
                              : float_backward ? Heuristics::kLeanFloatBackwardMinPacks
                                               : Heuristics::kLeanMinPacks;
    if (g_.n_packs < min_packs || g_.n_packs > lean_max_row_packs(reg_packs)) return std::nullopt;
    const int threads = static_cast<int>(cta_threads(g_.n_packs, reg_packs));
    SoftmaxPlan plan = one_pass_plan(SoftmaxKernel::kBlockOnePass, g_, CacheShape{threads, reg_packs, 0, 0});
    plan.lean = true;
    plan.grid = std::min(g_.rows, grid_cap(props_, plan.threads));
    const bool one_wave = one_wave_float_forward || one_wave_16bit_backward || one_pack_one_wave;
    const std::string rows = few_rows ? "fewer rows than SMs, of " : one_wave ? "rows whose CTAs fit in one wave, of "
                                                                              : "many rows of ";
    const std::string shape = rows + kib(g_.row_bytes) + " (" + std::to_string(p_.n) + " columns): a CTA per row, " +
                              std::to_string(reg_packs) + (reg_packs == 1 ? " pack per thread" : " packs per thread");
    if (p_.backward) {
      // The peeled backward instance runs at 3 CTAs per SM, up to 40 registers (kLeanPeeledBackwardMinCtas).
      const std::string budget = g_.peel ? " and stream in at most 40 registers: up to 1536 threads per SM"
                                         : " and stream in at most 32 registers: up to 2048 threads per SM";
      const std::string before = few_rows                  ? "the warp kernel, clusters and the 64-register instance"
                                 : one_wave_16bit_backward ? "the warp kernel and the 64-register instance"
                                                           : "the 64-register instance";
      return ok(plan, shape + budget + " (measured faster than " + before + " on such rows)");
    }
    return ok(plan, shape + ", max first, then each exp(x - max) taken once" +
                        (p_.log ? " for the sum" : " and kept in registers for the sum and the output"));
  }

  // The rows spread_small_rows is for: few 16-bit forward rows of more than 4 packs per lane of a warp.
  bool few_small_rows_to_spread() const {
    return !p_.backward && g_.in_bytes == 2 && g_.rows <= Heuristics::kSmallRowsPerSm * props_.sm_count &&
           g_.n_packs > 4 * 32;
  }

  // Few 16-bit warp-sized rows that would need 8 packs per lane (a few warps per SM): nothing hides a lane's
  // chain of 8 packs, so a CTA per row spreads the row over up to kSmallRowSpreadThreads threads, one pack
  // each. H200, 2026-11-22, softmax xCopy warp -> spread: 37 x 2048 fp16 0.69 -> 0.87, bf16 0.67 -> 0.78;
  // 128 x 2048 fp16 0.78 -> 0.89, bf16 0.77 -> 0.90. With 4 packs per lane or fp32 rows the warp kernel
  // was as fast or faster (128 x 1024 fp16 0.85 vs 0.77, 264 x 512 fp16 0.96 vs 0.81, fp32 0.91 vs 0.83).
  // Since session 38 fewer rows than SMs take the lean instance first (lean_rows, kLeanFewMinColumns), so this
  // plan runs 132-264 rows of 129-255 packs.
  std::optional<SoftmaxChoice> spread_small_rows() {
    if (g_.vec == 1 || g_.peel || !few_small_rows_to_spread()) return std::nullopt;
    const auto shape = cache_shape(g_.n_packs, g_, Heuristics::kSharedCtaMaxThreads, shared_smem_budget(props_),
                                   Heuristics::kSmallRowSpreadThreads);
    if (!shape || shape->smem_packs != 0) return std::nullopt;
    return ok(plan_cached(g_, props_, *shape, 1),
              std::to_string(g_.rows) + " rows of " + kib(g_.row_bytes) + " (<= " +
                  std::to_string(Heuristics::kSmallRowsPerSm) + " per SM): a CTA per row spreads it over " +
                  std::to_string(shape->threads) + " threads, so each thread's chain stays short");
  }

  // Few rows over every SM: the most CTAs per row such that all rows' CTAs are resident at once (the
  // occupancy API's answer) and each chunk has at least kClusterMinChunkBytes (forced: at least 2 CTAs
  // per row, any chunk). CTAs of up to kGridCtaThreads threads with the fewest packs per thread, or up to
  // 1024 threads owning their SM when a chunk does not fit otherwise.
  std::optional<SoftmaxChoice> grid_group(bool forced) {
    if (!clusters_supported()) return std::nullopt;  // planned (and compiled) for sm_90 only
    for (const bool exclusive : {false, true}) {
      const int max_threads = exclusive ? kBlockKernelMaxThreads : Heuristics::kGridCtaThreads;
      const int64_t budget = exclusive ? exclusive_smem_budget(props_) : shared_smem_budget(props_);
      const int64_t slots = props_.sm_count * (exclusive ? 1 : 2);
      int64_t ctas_per_row = slots / g_.rows;
      if (!forced) {
        const int64_t most = g_.n_packs * g_.pack_bytes * g_.streams / Heuristics::kClusterMinChunkBytes;
        ctas_per_row = std::min(ctas_per_row, most);
      }
      ctas_per_row = std::min(ctas_per_row, g_.n_packs);
      for (; ctas_per_row >= 2; --ctas_per_row) {
        const int64_t chunk = ceil_div(g_.n_packs, ctas_per_row);
        const auto shape = cache_shape(chunk, g_, max_threads, budget, max_threads, /*group=*/true);
        if (!shape) break;  // fewer CTAs only make the chunk larger
        const SoftmaxPlan plan = plan_grid_group(g_, *shape, ctas_per_row);
        if (resident(plan) < plan.grid) continue;
        return ok(plan, std::to_string(ctas_per_row) + " CTAs per row over every SM (one cooperative launch), each " +
                            "caching " + kib(chunk * g_.pack_bytes * g_.streams) + " on chip; partial results " +
                            "merged in fixed order after one grid barrier: one read, one write");
      }
    }
    return std::nullopt;
  }

  // Few rows too long for every CTA slot of the device to cache its chunk (millions of elements): the grid
  // group of grid_group with CTAs that cache what fits (kGridCtaThreads threads, a few register packs, all
  // of their shared-memory share) and fold the rest of their chunk straight from global memory, then re-read
  // it. One launch instead of split_row's two, at least a seventh of the row never re-read (the rule
  // below), and each chunk re-read by the CTA that read it first.
  //
  // Automatic only while a CTA caches at least 1 / kGridStreamMaxChunkPerCache of its chunk. H200, 2026-11-22
  // (softmax xCopy, grid streamed vs split_row): 3 x 5000000 fp16 0.77 vs 0.58, fp32 0.73 vs 0.59 (chunk
  // 1.2-2.5x the cache); 4 x 8388608 fp16 0.63 vs 0.54, fp32 0.65 vs 0.59 (1.9x, 3.9x); 4 x 33554432 fp16
  // 0.51 vs 0.51, fp32 0.51 vs 0.54 (7.8x, 15.6x): with little cached, split_row's 8 packs in flight per
  // thread in its folding pass (the grid kernel holds 4 under its 64-register budget) win. Up to 4x then;
  // 7x since split_row's interleaved parts (session 18, H100, two runs, forced kernels,
  // *session18-c6-tune-*): at 6.9x the grid group still wins (float32 4 x 8388608 and 8 x 4194304
  // softmax_backward 224.6 / 225.1 vs 236.9 / 236.6 us, log_softmax_backward 188.6 / 189.5 vs 194.0 /
  // 193.3); at 7.8x split_row now wins (*session18-c8-tune-7x*: softmax 4 x 33554432 fp16 292.8 vs 326.5 us,
  // 8 x 8388608 fp32 287.9 vs 316.0), and at 3.9x the grid group (8 x 8388608 fp16 146.1 vs 151.6).
  std::optional<SoftmaxChoice> grid_group_streamed(bool forced) {
    if (!clusters_supported() || g_.peel) return std::nullopt;  // no peeled streaming instance
    const int64_t ctas_per_row = std::min<int64_t>(2 * props_.sm_count / g_.rows, g_.n_packs);
    if (ctas_per_row < 2) return std::nullopt;
    const int threads = Heuristics::kGridCtaThreads;
    const int reg_packs = grid_stream_reg_packs(p_.in_dtype, p_.backward, g_.vec > 1);
    const int64_t slot_bytes = static_cast<int64_t>(threads) * g_.pack_bytes * g_.streams;
    const int64_t chunk = ceil_div(g_.n_packs, ctas_per_row);
    // All of the CTA's share of shared memory, less a pack per thread at a time while two CTAs do not fit
    // (the static shared memory of the float64 instances exceeds kSmemReservePerCta).
    for (int64_t smem_packs = shared_smem_budget(props_) / slot_bytes; smem_packs >= 0; --smem_packs) {
      const int64_t cached = static_cast<int64_t>(threads) * (reg_packs + smem_packs);
      if (!forced && chunk > Heuristics::kGridStreamMaxChunkPerCache * cached) return std::nullopt;
      const CacheShape shape{threads, reg_packs, static_cast<int>(smem_packs),
                             static_cast<size_t>(smem_packs * slot_bytes)};
      SoftmaxPlan plan = plan_grid_group(g_, shape, ctas_per_row);
      plan.stream_rest = true;
      if (resident(plan) < plan.grid) continue;
      return ok(plan, std::to_string(ctas_per_row) + " CTAs per row over every SM (one cooperative launch), each " +
                          "caching " + kib(cached * g_.pack_bytes * g_.streams) + " of its " +
                          kib(chunk * g_.pack_bytes * g_.streams) + " chunk on chip and re-reading the rest; " +
                          "partial results merged in fixed order after one grid barrier");
    }
    return std::nullopt;
  }

  // The first cluster size, trying first, first + 1, ..., kMaxClusterCtas, then first - 1, ..., 2, whose
  // per-CTA chunk fits (shared or exclusive budget) and which the device can schedule.
  std::optional<SoftmaxChoice> try_clusters(int first, bool exclusive) {
    if (!clusters_supported()) return std::nullopt;
    const int max_threads = exclusive ? kBlockKernelMaxThreads : Heuristics::kSharedCtaMaxThreads;
    const int64_t budget = exclusive ? exclusive_smem_budget(props_) : shared_smem_budget(props_);
    first = std::clamp(first, 2, kMaxClusterCtas);
    for (int step = 0; step <= kMaxClusterCtas - 2; ++step) {
      const int cluster = first + step <= kMaxClusterCtas ? first + step : kMaxClusterCtas - step;
      const int64_t chunk = ceil_div(g_.n_packs, cluster);
      auto shape = cache_shape(chunk, g_, max_threads, budget, /*spread_threads=*/0, /*group=*/true);
      if (!shape) continue;
      SoftmaxPlan plan = plan_cached(g_, props_, *shape, cluster);
      if (resident(plan) == 0) continue;  // the device cannot schedule one cluster of this size
      return ok(plan, "a cluster of " + std::to_string(cluster) + " CTAs per row, each caching " +
                          kib(chunk * g_.pack_bytes * g_.streams) + " on chip; partial (max, sum) merged through " +
                          "distributed shared memory in fixed order: one read, one write");
    }
    return std::nullopt;
  }

  bool clusters_supported() const { return props_.cc_major >= 9; }

  // Clusters from the size that spreads the rows over every SM (2 at least, kMaxClusterCtas at most), then from
  // 2; CTAs that leave room for a second on their SM first (try_clusters). The forced cluster_onepass plan.
  std::optional<SoftmaxChoice> filling_clusters() {
    if (!clusters_supported()) return std::nullopt;
    const int64_t fill = std::max<int64_t>(2, ceil_div(props_.sm_count, g_.rows));
    const int first = static_cast<int>(std::min<int64_t>(fill, kMaxClusterCtas));
    for (int start : {first, 2}) {
      if (auto choice = try_clusters(start, false)) return choice;
      if (auto choice = try_clusters(start, true)) return choice;
    }
    return std::nullopt;
  }

  // Row groups of `plan` the device holds at once: clusters for a cluster plan, CTAs otherwise. The occupancy
  // API's answer (non-portable cluster sizes need a GPC with that many free SMs), cached per configuration.
  // Without a device (explain on a CPU machine), an estimate: two CTAs per SM when each leaves room for a
  // second, one otherwise.
  int64_t resident(const SoftmaxPlan& plan) const {
    if (props_.assumed) {
      const bool shares_sm = plan.threads <= Heuristics::kSharedCtaMaxThreads &&
                             static_cast<int64_t>(plan.smem_bytes) <= shared_smem_budget(props_);
      return props_.sm_count * (shares_sm ? 2 : 1) / plan.cluster;
    }
    using Key = std::tuple<int, int, int, bool, int, int, int, size_t, int, bool, bool, bool, bool>;
    static std::mutex mutex;
    static std::map<Key, int> known;
    int device = 0;
    if (cudaGetDevice(&device) != cudaSuccess) return 0;
    const Key key{device,      static_cast<int>(p_.in_dtype), static_cast<int>(p_.out_dtype), p_.backward,
                  plan.vec,    plan.reg_packs,                plan.threads,                   plan.smem_bytes,
                  plan.cluster, plan.prefetch, plan.stream_rest, plan.lean, plan.peel};
    std::lock_guard<std::mutex> lock(mutex);
    auto it = known.find(key);
    if (it == known.end()) it = known.emplace(key, softmax_max_resident(p_, plan, props_.sm_count)).first;
    return it->second;
  }

  bool warp_fits() const { return g_.n_packs <= 32 * kWarpKernelMaxPacks; }

  // Whether warp_rows takes these rows: they fit a warp, within warp_max_row_bytes.
  bool warp_takes_rows() const { return warp_fits() && p_.n * g_.in_bytes <= warp_max_row_bytes(); }

  // The longest row (bytes per input) the warp kernel takes. 16-bit forward rows of 2-4 KB need 8 packs
  // per lane (~123 registers, 16 warps per SM): one wave of rows runs best there (no barrier), but with
  // more rows the block kernel's 32 threads x 8 packs at 64 registers (32 warps per SM) wins. H200,
  // 2026-11-22: 2048x2048 fp16 warp 0.90 / block 0.81 of copy; 32768x2048 fp16 0.85 / 0.92, bf16 0.70 / 0.94.
  // Widening rows (a float32 result) keep the warp kernel, but for the few that spread_small_rows or (fewer rows
  // than SMs) the lean instance takes: see lean_rows.
  int64_t warp_max_row_bytes() const {
    const bool one_wave = g_.rows <= Heuristics::kWarpRowsPerSmOneWave * props_.sm_count;
    if (p_.backward) {
      // Many float32 rows of 2-4 KB that break packs: the peeled warp kernel, where the peeled block kernel runs
      // CTAs of 64 threads with 4 packs each. H100, session 21 call 6 (one run, us, the automatic block_onepass ->
      // forced warp; *session21-c6-fp32-backward-warp-vs-block.txt*): softmax_backward / log_softmax_backward 8192 x
      // 1023 46.0 / 45.7 -> 41.7 / 42.1 (torch.compile 40.4 in call 5), 16384 x 513 44.7 / 45.8 -> 41.2 / 41.7;
      // whole packs keep the block kernel (8192 x 1024 40.1 / 39.5 against warp 41.2 / 41.0).
      if (g_.peel && g_.in_bytes == 4 && !one_wave) return Heuristics::kWarpMaxRowBytes;
      return Heuristics::kWarpMaxRowBytesBackward;
    }
    if (g_.in_bytes == 2 && !one_wave && !g_.widening) return Heuristics::kWarpMaxRowBytes / 2;
    return Heuristics::kWarpMaxRowBytes;
  }

  SoftmaxChoice forced() {
    const std::string& name = request_.forced;
    // The kernels with a peeled form run peelable rows peeled when they can (grid_onepass: unless its chunks
    // must be streamed); the others, and those cases, with single elements.
    const bool has_peeled_form = name == "warp" || name == "block_onepass" || name == "cluster_onepass" ||
                                 name == "grid_onepass" || name == "two_pass" || name == "split_row";
    if (!g_.peel && has_peeled_form && peelable(request_)) {
      SoftmaxChoice choice = Chooser(request_, props_, RowView::kPeeled).forced();
      if (choice.error.empty()) return choice;
    }
    const std::string prefix = "the forced kernel '" + name + "' (softmax_ops.force_kernel) cannot run this " +
                               "problem (rows=" + std::to_string(g_.rows) + ", n=" + std::to_string(p_.n) +
                               ", inner=" + std::to_string(p_.inner) + ", " + dtype_name(p_.in_dtype) + "): ";
    if (name == "strided") return ok(plan_strided(p_, props_), "forced");
    if (p_.inner > 1) {
      return fail(prefix + "it needs the reduced dim to be the last (contiguous) one, but here every " +
                  std::to_string(p_.inner) + " elements separate two of a row's; force 'strided' or let the " +
                  "dispatcher choose");
    }
    if (name == "warp") {
      if (!warp_fits()) {
        return fail(prefix + "a warp holds at most 32 lanes x " + std::to_string(kWarpKernelMaxPacks) + " packs x " +
                    std::to_string(g_.vec) + " elements = " + std::to_string(32 * kWarpKernelMaxPacks * g_.vec) +
                    " columns");
      }
      return ok(plan_warp(g_, props_), "forced");
    }
    if (name == "block_onepass") {
      if (auto shape = cache_shape(g_.n_packs, g_, kBlockKernelMaxThreads, exclusive_smem_budget(props_))) {
        SoftmaxPlan plan = plan_cached(g_, props_, *shape, 1);
        add_row_prefetch(plan, g_, props_, /*forced=*/true);  // tests reach the prefetching instance here
        return ok(plan, "forced");
      }
      return fail(prefix + "the row (" + kib(g_.row_bytes) + ") exceeds one CTA's registers + shared memory");
    }
    if (name == "cluster_onepass") {
      if (!clusters_supported()) {
        return fail(prefix + "thread-block clusters need compute capability 9.0, this device has " +
                    std::to_string(props_.cc_major) + "." + std::to_string(props_.cc_minor));
      }
      if (auto choice = filling_clusters()) return *choice;
      return fail(prefix + "the row (" + kib(g_.row_bytes) + ") exceeds the registers + shared memory of a " +
                  "cluster of " + std::to_string(kMaxClusterCtas) + " CTAs");
    }
    if (name == "grid_onepass") {
      if (auto choice = grid_group(/*forced=*/true)) return *choice;
      if (auto choice = grid_group_streamed(/*forced=*/true)) return *choice;
      return fail(prefix + "it needs compute capability 9.0 and at least 2 resident CTAs per row; " +
                  std::to_string(props_.sm_count) + " SMs hold too few for " + std::to_string(g_.rows) + " rows");
    }
    if (name == "two_pass") return ok(plan_two_pass(g_, props_), "forced");
    if (name == "split_row") return ok(plan_split_row(g_, props_, true), "forced");
    return fail("unknown softmax kernel '" + name + "'");
  }

  static SoftmaxChoice ok(const SoftmaxPlan& plan, std::string reason) { return {plan, std::move(reason), ""}; }
  static SoftmaxChoice fail(std::string error) { return {SoftmaxPlan{}, "", std::move(error)}; }

  const SoftmaxRequest& request_;
  const SoftmaxProblem& p_;
  const DeviceProps& props_;
  const Geometry g_;
};

DeviceProps query_device_props(int device) {
  DeviceProps props;
  auto attribute = [&](cudaDeviceAttr attr, int fallback) {
    int value = 0;
    return cudaDeviceGetAttribute(&value, attr, device) == cudaSuccess ? value : fallback;
  };
  props.sm_count = attribute(cudaDevAttrMultiProcessorCount, props.sm_count);
  props.l2_bytes = attribute(cudaDevAttrL2CacheSize, static_cast<int>(props.l2_bytes));
  props.smem_per_block_optin = attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin, props.smem_per_block_optin);
  props.smem_per_sm = attribute(cudaDevAttrMaxSharedMemoryPerMultiprocessor, props.smem_per_sm);
  props.max_threads_per_sm = attribute(cudaDevAttrMaxThreadsPerMultiProcessor, props.max_threads_per_sm);
  props.max_ctas_per_sm = attribute(cudaDevAttrMaxBlocksPerMultiprocessor, props.max_ctas_per_sm);
  props.cc_major = attribute(cudaDevAttrComputeCapabilityMajor, props.cc_major);
  props.cc_minor = attribute(cudaDevAttrComputeCapabilityMinor, props.cc_minor);
  // Not cudaGetDeviceProperties: its struct layout follows the headers, and the runtime torch loads may be
  // another CUDA version than the toolkit compiled against (a mismatch overruns the struct).
  props.name = "CUDA device " + std::to_string(device);
  props.assumed = false;
  (void)cudaGetLastError();  // a failed attribute query falls back to the default; leave no error behind
  return props;
}

}  // namespace

const DeviceProps& device_props(int device) {
  static std::mutex mutex;
  static std::map<int, DeviceProps> cache;  // node-based: references stay valid as devices are added
  std::lock_guard<std::mutex> lock(mutex);
  auto it = cache.find(device);
  if (it == cache.end()) it = cache.emplace(device, query_device_props(device)).first;
  return it->second;
}

SoftmaxChoice choose_softmax_kernel(const SoftmaxRequest& request, const DeviceProps& props) {
  return Chooser(request, props).choose();
}

bool pointers_share_phase(const SoftmaxProblem& problem, const SoftmaxPointers& ptrs) {
  const uintptr_t vec = static_cast<uintptr_t>(16 / dtype_bytes(problem.in_dtype));
  auto phase = [&](const void* ptr, DType dtype) {
    const uintptr_t bytes = static_cast<uintptr_t>(dtype_bytes(dtype));
    const uintptr_t address = reinterpret_cast<uintptr_t>(ptr);
    return address % bytes != 0 ? ~uintptr_t{0} : address / bytes % vec;  // misaligned elements: no phase
  };
  const uintptr_t first = phase(ptrs.in0, problem.in_dtype);
  if (first == ~uintptr_t{0} || phase(ptrs.out, problem.out_dtype) != first) return false;
  return ptrs.in1 == nullptr || phase(ptrs.in1, problem.in_dtype) == first;
}

bool pointers_vector_aligned(const SoftmaxProblem& problem, const SoftmaxPointers& ptrs) {
  const int in_bytes = dtype_bytes(problem.in_dtype);
  const uintptr_t out_pack = static_cast<uintptr_t>(16 / in_bytes * dtype_bytes(problem.out_dtype));
  auto aligned = [](const void* ptr, uintptr_t bytes) { return reinterpret_cast<uintptr_t>(ptr) % bytes == 0; };
  return aligned(ptrs.in0, 16) && aligned(ptrs.in1, 16) && aligned(ptrs.out, out_pack);
}

const char* softmax_kernel_name(SoftmaxKernel kernel) { return kKernelNames[static_cast<int>(kernel)]; }

std::vector<std::string> softmax_kernel_names() {
  return std::vector<std::string>(std::begin(kKernelNames), std::end(kKernelNames));
}

// Text is built with std::string and std::to_string, not iostreams: on the GPU machine (torch 2.11, GCC 13)
// a std::ostringstream << integer inside the extension crashed (reported to the lead).
std::string describe_plan(const SoftmaxPlan& plan) {
  using std::to_string;
  std::string s = std::string(softmax_kernel_name(plan.kernel)) + ": " + to_string(plan.grid) + " CTAs x " +
                  to_string(plan.threads) + " threads, " + to_string(plan.vec) + " element(s) per access";
  switch (plan.kernel) {
    case SoftmaxKernel::kWarp:
      s += ", " + to_string(plan.lanes_per_row) + " lane(s) per row, " + to_string(plan.reg_packs) + " pack(s) per lane";
      if (plan.edges_per_lane > 1) s += ", " + to_string(plan.edges_per_lane) + " edge element slots per lane";
      break;
    case SoftmaxKernel::kBlockOnePass:
    case SoftmaxKernel::kClusterOnePass:
    case SoftmaxKernel::kGridOnePass:
      if (plan.cluster > 1) s += ", clusters of " + to_string(plan.cluster) + " CTAs per row";
      if (plan.kernel == SoftmaxKernel::kGridOnePass) s += ", " + to_string(plan.chunks) + " CTAs per row (cooperative)";
      s += ", " + to_string(plan.reg_packs) + " pack(s) per thread in registers + " + to_string(plan.smem_packs) +
           " in shared memory (" + kib(static_cast<int64_t>(plan.smem_bytes)) + " dynamic)";
      if (plan.prefetch) s += ", next row prefetched into shared memory";
      if (plan.stream_rest) s += ", the rest of each chunk streamed and re-read";
      if (plan.lean) {
        s += ", lean instance (a CTA per row, <= " + std::to_string(lean_max_registers(plan.reg_packs)) + " registers)";
      }
      break;
    case SoftmaxKernel::kSplitRow:
      s += ", " + to_string(plan.chunks) + " CTAs per row (its blocks of " + to_string(plan.threads) +
           " packs round robin), 2 launches, " + kib(static_cast<int64_t>(plan.workspace_bytes)) + " workspace";
      break;
    case SoftmaxKernel::kStrided:
      s += " (" + to_string(plan.block_x) + " across inner x " + to_string(plan.threads / plan.block_x) + " along n)";
      break;
    case SoftmaxKernel::kTwoPass:
      break;
  }
  if (plan.peel) s += ", rows peeled (aligned body in packs, edge elements singly)";
  return s;
}

cudaError_t launch_softmax_plan(const SoftmaxProblem& problem, const SoftmaxPlan& plan, const SoftmaxPointers& ptrs,
                                cudaStream_t stream) {
  switch (plan.kernel) {
    case SoftmaxKernel::kWarp:
      return launch_softmax_warp(problem, plan, ptrs, stream);
    case SoftmaxKernel::kBlockOnePass:
    case SoftmaxKernel::kClusterOnePass:
    case SoftmaxKernel::kGridOnePass:
      return launch_softmax_block(problem, plan, ptrs, stream);
    case SoftmaxKernel::kTwoPass:
    case SoftmaxKernel::kSplitRow:
    case SoftmaxKernel::kStrided:
      return launch_softmax_streaming(problem, plan, ptrs, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace softmax_ops
