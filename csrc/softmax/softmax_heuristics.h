// The softmax family's heuristics: every tuned number of the dispatcher in ONE table, which the rules in
// softmax_dispatch.cpp apply (included there only). Next to each number: the measurement behind it (GPU, date or
// session, results file under benchmarks/results/) or, where none was made (kGridWaves, kPrefetchMaxWaves,
// kFewRowsPerSm, the two-pass, split-row and strided CTA shapes), the reasoning. benchmarks/tune_softmax.py times
// every kernel against the choice; benchmarks/explain_snapshot.py lists the plans a change moves.
#pragma once

#include <cstdint>

namespace softmax_ops {

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

}  // namespace softmax_ops
