// The fused_topk dispatcher: ONE heuristics table, the choice, forced kernels, explain() and the
// registration of the "topk" and "topk_backward" kernel families.
#include "topk_dispatch.h"
#include "softmax_ops/text.h"

#include <c10/util/Exception.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <string>
#include <memory>
#include <mutex>
#include <vector>

#include "softmax_ops/dtype_rules.h"
#include "softmax_ops/dtype_tags.h"
#include "softmax_ops/kernel_registry.h"

namespace softmax_ops::topk {
namespace {

// ---- the heuristics table ------------------------------------------------------------------------------
// Each threshold's comment says where it was measured (GPU, session, results file); one without a measurement
// is an initial estimate.
struct TopkHeuristics {
  // warp: rows up to warp_max_n(dtype) values (32 lanes x 32 registers; 16 for float64) and k up to this.
  // Each of the k rounds is a log2(lanes)-step butterfly plus one lane's rescan of its 32 slots; beyond
  // ~64 rounds the block kernel's filter + bitonic sort of k should be cheaper.
  int64_t warp_max_k = 64;
  // Lanes per row: the fewest that hold the row, raised to 2k (at most 32) so that the warp kernel's
  // threshold pre-filter applies: the k-th largest of >= 2k lane maxima leaves ~1.3k candidates per row and
  // a lane overflows its 4 candidate registers in 1-2% of rows, where with W = k it overflows in most rows
  // (numpy, N(0, 9) rows of 64-512, topk_warp_select.cuh). Then doubled while the grid has fewer than
  // warp_min_warps_per_sm warps per SM (latency hiding for few-row problems like 256x128), never past the
  // row's 16-byte vectors by that doubling. Past the vectors the kernel reads scalars.
  int64_t warp_min_warps_per_sm = 8;
  // Rows of at most this many values get one lane per value (scalar loads, one-slot rounds): 16384x8 k2
  // then runs 4096 warps instead of 512 (one 4-warp CTA per SM was pure latency: notes-topk-tuning.md §4).
  int64_t warp_scalar_max_n = 32;
  // rows (the router kernel, topk_rows.cu): k <= kRowsMaxK, N <= kRowsMaxN, 16/32-bit inputs. Threads per
  // row: the fewest that hold the row in 32 slots each, doubled while the grid has fewer than
  // rows_min_warps_per_sm warps per SM and each thread keeps a whole 16-byte vector (16384x64 fp16: 4
  // threads of 16 values). Fewer threads per row cost fewer merge steps (each ~K shuffles + a half-cleaner).
  // Rows that are not a whole number of 16-byte vectors take scalar loads, where a thread's share need not
  // be a vector: they double while each thread keeps rows_scalar_min_values. H100, 2026-11-22 (session 10,
  // one process, 3 interleaved rounds, *session10-c4-rows-sweep*): 4096x60 k4 fp16 / bf16 at 4 threads
  // (the vector rule) 7.9-8.5 us, at 8 or 16 threads 6.8-7.4; 16384-row shapes keep their threads (their
  // warps already reach the target), and the vector rule measured best or within noise on every aligned case.
  int64_t rows_min_warps_per_sm = 8;
  int64_t rows_scalar_min_values = 2;
  // ... and a thread still holding more than 16 values doubles once more if the grid stays within one wave of
  // this many warps per SM (the rows instances' register budgets fit 8 CTAs of 4 warps): a one-wave shape is
  // one dependent chain per row, longest where a thread sorts 32 values. H100, 2026-11-22 (session 11, one
  // process, 3 interleaved rounds, *session11-c4-rows-sweep*): 16384x128 k8 at 8 threads vs 4: fp16 10.32
  // vs 10.37 us, bf16 10.88 vs 11.14, fp32 16.58 vs 17.44; 65536x256 (4 waves at 16 threads) stays at 8.
  // 16-bit rows that could take batches (rows_batches_fit: whole 16-byte vectors, k > 2) no longer double: since
  // their loads stopped waiting for each other (sessions 31-32) they run fastest on the threads that hold the row.
  // H100, 2026-11-24 (session 33 call 1, one process, 3 interleaved rounds, fp16 / bf16, us,
  // *session33-c1-sweep-rows-staged-16bit*): 16384x72 k6 T4 8.70 / 8.77 against T8 10.18 / 10.34, 16384x96 k8
  // 9.06 / 9.54 against 10.58 / 9.98, 16384x120 k8 9.95 / 9.92 against 10.82 / 10.21, 16384x128 k8 10.59 / 9.86
  // against 9.95 / 10.02, 8192x128 k8 7.81 / 8.54 against 8.03 / 8.06. float32 keeps it (*-c1-sweep-rows-fp32*:
  // 16384x128 k8 T8 13.22 against T4 14.50, 16384x120 k8 14.40 against 16.26).
  // The same sweep retired session 29's staged instances (each CTA's rows copied into shared memory by cp.async,
  // a persistent grid prefetching a CTA's next rows): on the same threads they were as fast or slower everywhere
  // (16384x72 k6 S4 9.34 / 9.38 against T4 8.70 / 8.77, 65536x128 k8 20.13 / 20.69 against 18.94 / 19.07,
  // 16384x160 k6 S8 12.00 / 12.90 against T8 11.39 / 11.62, 16384x256 k8 13.28 / 13.18 against 13.06 / 13.15;
  // 1049x512 k4 S16 6.98 / 6.59 against T16 6.40 / 6.91).
  int64_t rows_one_wave_warps_per_sm = 32;
  // ... and 16-bit rows read in 16-byte vectors with k > 2 (rows_batches_fit) run on half the threads that hold
  // the row, each walking its share in two batches of 32 values, where the fewest threads that hold it are at
  // least rows_batch_min_threads and the halved grid still has rows_batch_min_warps_per_sm warps per SM: one
  // merge step fewer across threads for each row, at the price of a longer chain per thread. H100, 2026-11-24
  // (session 29 call 1, one process, 3 interleaved rounds, fp16 / bf16, us, *session29-c1-sweep*):
  //   65536x256 k8  T8 35.1 / 34.4 -> T4 in batches 33.4 / 33.0;   16384x512 k8 T16 22.2 / 22.3 -> T8 20.6 / 20.1
  //   16384x384 k8  T16 18.5 / 18.6 -> T8 17.1 / 17.2;            65536x512 k4 T16 48.2 / 49.7 -> T8 46.6 / 46.1
  // but slower where the halved grid is small or the row short: 16384x256 k8 T8 13.8 / 14.3 -> T4 15.1 / 14.6
  // (15.5 warps per SM), 65536x128 k8 T4 21.9 / 22.9 -> T2 24.0 / 23.3 (fewest threads 4). 16384x160 k6 (15.5
  // warps per SM at T4) measured 12.8 / 12.9 -> 11.9 / 12.1 in batches but stays at 8 threads by this rule.
  int64_t rows_batch_min_threads = 8;
  int64_t rows_batch_min_warps_per_sm = 24;
  // float32 rows longer than this go to the warp kernel (see rows_auto_max_n), unless they are whole 16-byte
  // vectors (rows_whole_vectors).
  int64_t rows_auto_max_n_fp32 = 256;
  // block / split_row hold k + one 4096-element tile + 2048 slack candidates in shared memory
  // (k = 4096: 80 KB fp32, 160 KB fp64; long tiles only where theirs fits); larger k goes to radix.
  int64_t candidate_max_k = 4096;
  // block: one CTA per row from this many rows per 100 SMs; fewer rows split (split_row / split_hist). The
  // split kernels' per-chunk selects and row merge cost more than the SMs a CTA per row leaves idle down to
  // about 0.6 rows per SM. H100, 2026-11-22 (*session14-c5-rows-threshold*, block vs split_row forced, fp16 /
  // fp32): 96 x 100000 k50 30.3 / 33.2 us vs 35.4 / 39.8, 128 x 32768 k64 17.9 / 19.5 vs 30.0 / 31.7,
  // 132 x 65536 k50 23.5 / 27.3 vs 33.0 / 36.5, 256 x 32768 k64 20.4 / 24.1 vs 39.8 / 43.1; but 64 x 151936 k50
  // (0.48 per SM) block 38.4 / 42.5 vs split_row 34.4 / 38.9 (*session14-c4-*).
  int64_t block_min_rows_per_100_sms = 60;
  // backward: rows below this many per SM split (its own kernels; not re-measured with the forward's change).
  int64_t backward_block_min_rows_per_sm = 2;
  // split_row: at most this many CTAs per SM over all rows (chunks per row rounded down; rounding the chunks up
  // to whole tiles can only lower it), each chunk >= max(split_min_chunk, split_chunk_per_k * k) elements (one
  // tile at least), since every chunk writes k candidates that the row's merge reads back. Fewer, longer
  // chunks: a chunk's epilogue and the row merge cost more than the streaming the extra CTAs would overlap.
  // H100, 2026-11-22 (*session15-c4-split-chunking*, split_row forced, two runs, fp16 / fp32 us), 2 (rounded
  // down) against the 4 (rounded up) before: 16 x 262144 k50 29.2-29.5 / 31.6-31.8 -> 23.6-24.1 / 23.1-23.9,
  // 32 x 131072 k64 28.8-28.9 / 31.2-31.4 -> 24.1 / 23.5-23.6, 4 x 1048576 k50 38.1-38.3 / 42.5-42.6 -> 27.2 /
  // 28.0, 48 x 100000 k50 30.1-30.3 / 30.7-30.8 -> 24.7-24.8 / 24.2, 64 x 151936 k50 (4 chunks instead of 8)
  // 30.8-31.0 / 34.7-34.8 -> 30.6 / 31.4-31.5; 8 x 65536, 16 x 65536, 32 x 32768, 2 x 262144 keep their plans.
  int64_t split_row_max_ctas_per_sm = 2;
  // block / split_row: 16-bit rows read in vectors take tiles of kLongTileElems (8192) where a CTA's range (a
  // split_row chunk, a block row) holds at least 3 of them, and the block kernel has at most
  // block_long_tile_max_rows_per_sm rows per SM (split_row plans have at most 2 CTAs per SM). Long tiles take a
  // buffer of k + 10240 candidates (80 KB at k = 50) and up to 92 registers: 2 CTAs per SM.
  // split_row: H100, 2026-11-24, long tiles on every chunk against 4096-element tiles, two rounds in turns,
  // fp16 / bf16 us (*session30-c2-compare-long-tiles-by-chunk*): chunks of 3 long tiles (64 x 98304 k50) 25.1 /
  // 26.0 -> 24.3 / 25.2, of 4 (64 x 131072, 32 x 262144) -5..-7%, of 5 (64 x 151936, 52 x 200000) 30.4 / 30.5 ->
  // 27.7 / 28.1 and -7..-8%, of 6.5 (64 x 200000) -4..-6%; but of 2.5 (48 x 100000) +2.6..+2.8% and of 2 (16 x
  // 262144, 4 x 1048576) +1.2..+2.0%. float32 with 8192-element tiles (call 1, *session30-c1-compare-split-row-
  // tiles*): -0.5% on 64 x 151936 and +3..+8% on the other split_row shapes, so it keeps 4096.
  int64_t long_tile_min_elems = 3 * kLongTileElems;
  // block: H100, 2026-11-24, long tiles against 4096-element tiles, two rounds in turns, fp16 / bf16 us
  // (*session30-c3-compare-block-long-tiles*): 80 x 100000 k50 28.4 / 28.1 -> 23.5 / 23.8, 96 x 100000 -17%,
  // 128 x 32768 k64 -8..-11%, 132 x 65536 k50 -14..-16%, 256 x 32768 k64 -6..-9%, 200 x 131072 k50 39.2 / 38.7 ->
  // 33.6 / 32.6, 264 x 50000 k50 (2 rows per SM) -4..-5%; but 512 x 50000 +11% and 1024 x 50000 58.0 / 57.9 ->
  // 66.5 / 65.2 (4 CTAs per SM of short tiles hold as many bytes in flight, and more rows at once).
  int64_t block_long_tile_max_rows_per_sm = 2;
  // ... and below block_min_rows_per_100_sms, 16-bit rows of up to block_long_max_tiles long tiles (k <=
  // split_hist_min_k) run one CTA per row in long tiles from block_long_min_rows_per_100_sms rather than split, and
  // rows of up to block_long_few_max_tiles from block_long_few_rows_per_100_sms. H100, 2026-11-24, both kernels
  // forced, two runs each, fp16 / bf16 us, k50 (*session30-c9-boundary1/2*, *session30-c11-boundary1/2*):
  //   24 x 65536 block 17.3-18.0 / 16.9-17.7 against split_row 22.2-22.3 / 22.0-22.5, 64 x 65536 -24..-26%, 24-64 x
  //   100000 -5..-19% (64 x 100000 24.0-24.1 / 23.0-23.1 against 26.7-26.8 / 26.8-26.9), 64 x 114688 -7..-9%, 72-78
  //   x 131072 -7..-14%, 48 x 131072 even (26.4-26.5 / 25.2-25.3 against 26.5-26.6 / 26.6); but 64 x 151936 (18.5
  //   long tiles) split_row 27.6-27.7 / 28.2 against block 29.9-30.0 / 28.7-29.5 (*session30-c5-boundary1/2*);
  //   8-20 rows: 16 x 32768 12.1-12.9 against 17.0-18.5 (-26..-31%), 8-20 x 65536 -9..-24%, 16-20 x 100000
  //   -7..-21%, 8 x 100000 even at fp16 (22.7-22.8 against 22.9-23.0) and -12..-15% at bf16; but 16-20 x 131072
  //   split_row 22.4-23.6 against block 24.9-26.2. Not measured below 8 rows.
  //   Smaller k (*session30-c13-smallk*, one run): block wins on 24 x 65536 k16 (16.5 / 15.8 against 18.8 / 19.6),
  //   16 x 32768 k16 (-27..-31%), 8-16 x 65536 k32 (-7..-13%), 8 x 65536 k8 (-8..-12%); mixed on 8-16 rows of
  //   65536-100000 at k16 (fp16 split_row 4-10% faster, bf16 block 2-6% faster).
  int64_t block_long_min_rows_per_100_sms = 18;
  int64_t block_long_max_tiles = 16;
  int64_t block_long_few_rows_per_100_sms = 6;
  int64_t block_long_few_max_tiles = 13;
  int64_t split_min_chunk = 4096;
  int64_t split_chunk_per_k = 8;
  // split_hist: CTAs per SM to aim for across rows x chunks, chunks >= this many elements (one tile).
  // Its chunks write no candidates, so they can be shorter than split_row's. H100, 2026-11-22
  // (*session9-c13-chunking-*, two runs): a target of 2 instead of 4 took 8 x 262144 k1024 from 41.5-44.5 us
  // to 37.8-41.6 (32 chunks of 8192 instead of 64 of 4096; 1 x 128256 k50 unchanged: 31 chunks either way);
  // chunks of >= 8192 instead lost 2 us on 1 x 128256.
  int64_t split_hist_target_ctas_per_sm = 2;
  int64_t split_hist_min_chunk = 4096;
  // Split rows with k above this go to split_hist instead of split_row: split_row's chunks then have no
  // first-tile floor (k > kBlockThreads) and its merge reads chunks x k candidates. H100, 2026-11-22,
  // tune_topk.py (*session9-c1-*, *session9-c2-v1-*): 8 x 262144 k1024 split_row 103-104 us (fp16/bf16), 90 (fp32)
  // vs split_hist 47-49; at k = 50 split_row won or tied: 64 x 151936 42-47 vs 56-65 us, 1 x 128256 22-28 vs
  // 22-25 (16-bit 2-3 us faster with split_hist, fp32 1-2 us slower).
  int64_t split_hist_min_k = kBlockThreads;
  // ... and so do single rows whatever k: split_row's one merging CTA is then the whole critical path. H100,
  // 2026-11-22 (*session9-c7-new*): 1 x 128256 k50 split_hist 21.0-21.9 us (fp16), 20.5-21.8 (bf16), 21.8-21.9
  // (fp32) vs split_row 24.4 / 27.2 / 22.5. Not measured between 2 and 7 rows; at 64 rows split_row wins.
  // Both only where the logits fit the L2 (split_hist reads them twice; from DRAM that would double the bytes).
  int64_t split_hist_max_rows = 1;
  // block / split_row on rows that are not whole 16-byte vectors: peeled (each row's body in vector tiles, the
  // < 2 V elements around it singly) when longer than this many tiles, single-element loads otherwise. H100,
  // 2026-11-23 (session 20 call 2, *session20-c2-compare-topk-peel.txt*, two interleaved runs per tree, auto
  // plans, fp16 / bf16 / fp32 us): 1024 x 50257 k50 74.0 / 84.5 / 93.8 -> 58.7 / 58.7 / 91.1, 64 x 151935
  // k50 (split_row) 34.9 / 38.7 / 35.3 -> 29.7 / 30.5 / 32.6, 256 x 32767 k64 24.4 / 27.0 / 26.8 -> 20.3 / 20.3 /
  // 23.8; but 4096 x 4095 k32 (one tile) 43.6 / 47.9 / 46.5 -> 44.9 / 45.2 / 48.8 and 2048 x 8191 k16 fp32 (two)
  // 39.7 -> 40.3 (fp16 34.6 -> 33.5).
  int64_t peel_min_tiles_16bit = 1;
  int64_t peel_min_tiles_fp32 = 2;
  // radix: CTAs per SM to aim for across rows x chunks, chunks >= this many elements.
  int64_t radix_target_ctas_per_sm = 2;
  int64_t radix_min_chunk = 16384;
  // backward: block CTAs of one thread per 16-byte vector (32..512); split for few rows into chunks of at
  // least backward_min_chunk, aiming for backward_split_target_ctas_per_sm CTAs per SM.
  int64_t backward_min_chunk = 16384;
  int64_t backward_split_target_ctas_per_sm = 4;
};
constexpr TopkHeuristics kHeuristics{};

// Forced-kernel names, in TopkKernel order.
constexpr const char* kTopkNames[kNumTopkKernels] = {"warp", "block", "split_row", "radix", "rows", "split_hist"};
constexpr const char* kTopkBackwardNames[kNumTopkBackwardKernels] = {"block", "split"};

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

int warp_lanes(int64_t rows, int64_t n, int64_t k, DType dtype, const TopkDeviceProps& props) {
  const int64_t slots = warp_slots_per_lane(dtype);
  const int64_t lanes_with_values = std::min<int64_t>(32, next_pow2(n));
  int64_t lanes = 1;
  while (lanes * slots < n) lanes *= 2;
  if (n <= kHeuristics.warp_scalar_max_n) return static_cast<int>(std::max(lanes, lanes_with_values));
  lanes = std::max(lanes, std::min(lanes_with_values, next_pow2(2 * k)));
  const int64_t max_lanes = std::min<int64_t>(32, next_pow2(ceil_div(n, vec_elems(dtype))));
  while (lanes < max_lanes && rows * lanes < kHeuristics.warp_min_warps_per_sm * props.sm_count * 32) lanes *= 2;
  return static_cast<int>(lanes);
}

bool rows_dtype(DType dtype) { return dtype != DType::kFloat64; }

bool rows_fits(int64_t n, int64_t k, DType dtype) {
  return rows_dtype(dtype) && n <= kRowsMaxN && k <= kRowsMaxK;
}

// The longest rows the dispatcher sends to the rows kernel (forcing it reaches kRowsMaxN). float32 rows
// rank by 32-bit words of a key's top 23 bits first (an exact 64-bit redo where a near-tie touches the
// selection); on an H100 (2026-11-22, tune_topk.py, *session8-ab7-*) they beat the warp kernel up to N = 256
// (65536x256 k8: 64.3 vs 67.2 us; 16384x64 k6: 12.4 vs 17.0), tied at 160 (16384x160 k6: 19.4 vs 19.0) and
// lost at 512 (16384x512 k8: 36.0 vs 32.4); 16-bit rows won everywhere up to 512.
int64_t rows_auto_max_n(DType dtype) { return dtype == DType::kFloat32 ? kHeuristics.rows_auto_max_n_fp32 : kRowsMaxN; }

// Whether float32 rows beyond rows_auto_max_n_fp32 run the rows kernel: rows of whole 16-byte vectors (n a multiple
// of 4), whose loads no longer wait for each other (topk_rows.cu, RowSlots::load_packs: whole spans unchecked since
// session 31, partial ones through predicated loads since session 32). There the rows kernel beats the warp kernel.
// H100, 2026-11-24, both forced, two runs, us: session 31 call 9 (whole spans) 16384x512 k8 rows 25.4 / 26.0 against
// warp 32.0 / 31.9, k2 19.6 against 24.5 / 24.4, 65536x512 k8 73.2 / 72.4 against 88.2 / 88.1, 16384x384 k8 22.5
// against 28.1; session 32 call 2 (partial spans, *session32-c2-fp32-rows-vs-warp1/2*) 16384x320 k8 22.5 / 22.9
// against 26.4 / 26.0, k4 17.3 / 17.1 against 21.4 / 20.7, 16384x288 k8 22.2 / 22.7 against 25.6 / 25.4, 16384x400
// k8 25.7 / 25.5 against 30.9 / 30.1, 16384x480 k8 27.1 / 26.9 against 31.9 / 32.5, 65536x320 k8 62.5 / 61.6 against
// 72.1 / 71.5; 8192x320 k6 even (16.4 / 15.6 against 16.0 / 16.1). Rows of single elements (n not a multiple of
// 4) were not measured and stay on the warp kernel. Rows of whole vectors whose data is not 16-byte aligned run the
// rows kernel's scalar instance, which was not timed against the warp kernel.
bool rows_whole_vectors(int64_t n, DType dtype) { return whole_vectors(n, dtype); }

// The rows kernel's threads per row.
int rows_threads(int64_t rows, int64_t n, int64_t k, DType dtype, const TopkDeviceProps& props) {
  int64_t threads = next_pow2(ceil_div(n, kRowsSlotsPerThread));
  // Rows of whole 16-byte vectors (the launcher's rows_are_vector_aligned also needs an aligned pointer, which the
  // plan does not see: a misaligned view of vector-sized rows keeps the vector rules below, and a plan in batches
  // falls back to `threads` in the launcher).
  const bool vector_sized = whole_vectors(n, dtype);
  const bool batches_fit = rows_batches_fit(dtype, k, vector_sized);
  // Many rows that take batches: half the threads.
  if (batches_fit && threads >= kHeuristics.rows_batch_min_threads &&
      rows * (threads / 2) >= kHeuristics.rows_batch_min_warps_per_sm * props.sm_count * 32) {
    return static_cast<int>(threads / 2);
  }
  // Values a thread must keep after a doubling: a whole 16-byte vector, or a few scalars when the rows cannot
  // take vector loads.
  const int64_t min_values = vector_sized ? vec_elems(dtype) : kHeuristics.rows_scalar_min_values;
  while (threads < kRowsMaxThreadsPerRow && n >= 2 * threads * min_values &&
         rows * threads < kHeuristics.rows_min_warps_per_sm * props.sm_count * 32) {
    threads *= 2;
  }
  const bool over_half_full = ceil_div(n, threads) > kRowsSlotsPerThread / 2;
  if (!batches_fit && threads < kRowsMaxThreadsPerRow && over_half_full && n >= 2 * threads * min_values &&
      rows * threads * 2 <= kHeuristics.rows_one_wave_warps_per_sm * props.sm_count * 32) {
    threads *= 2;
  }
  return static_cast<int>(threads);
}

// Chunks per row for a kernel that splits rows: enough for ctas_per_sm CTAs per SM over all rows, but chunks of
// at least min_chunk elements (and at least one chunk).
int64_t splits_for(int64_t rows, int64_t n, int64_t ctas_per_sm, int64_t min_chunk, const TopkDeviceProps& props) {
  const int64_t want = ceil_div(ctas_per_sm * props.sm_count, std::max<int64_t>(rows, 1));
  return std::max<int64_t>(1, std::min(want, n / min_chunk));
}

// Enough rows for the forward's block kernel (one CTA per row) rather than a split kernel.
bool block_rows_enough(int64_t rows, const TopkDeviceProps& props) {
  return rows * 100 >= kHeuristics.block_min_rows_per_100_sms * props.sm_count;
}

int64_t split_row_splits(int64_t rows, int64_t n, int64_t k, const TopkDeviceProps& props) {
  const int64_t min_chunk = std::max(kHeuristics.split_min_chunk, kHeuristics.split_chunk_per_k * k);
  const int64_t most = kHeuristics.split_row_max_ctas_per_sm * props.sm_count / std::max<int64_t>(rows, 1);
  return std::max<int64_t>(1, std::min(most, n / min_chunk));
}

// Long tiles (TopkPlan::long_tiles) for a CTA that reads `range` elements of a 16-bit row: enough of them, and
// the larger candidate buffer fits.
bool long_tiles_fit(int64_t range, int64_t k, DType dtype, const TopkDeviceProps& props) {
  const size_t bytes = block_dynamic_smem_bytes(dtype, k, kLongTileElems) + kBlockStaticSmem;
  return dtype_bytes(dtype) == 2 && range >= kHeuristics.long_tile_min_elems &&
         static_cast<int64_t>(bytes) <= props.smem_per_block_optin;
}

// split_row's long tiles: chunks of enough of them.
bool split_row_long_tiles(int64_t n, int64_t k, int64_t splits, DType dtype, const TopkDeviceProps& props) {
  return long_tiles_fit(split_chunk_elems(n, splits), k, dtype, props);
}

// ... and the block kernel's: few 16-bit rows of enough of them.
bool block_long_tiles(int64_t rows, int64_t n, int64_t k, DType dtype, const TopkDeviceProps& props) {
  return rows <= kHeuristics.block_long_tile_max_rows_per_sm * props.sm_count &&
         long_tiles_fit(n, k, dtype, props);
}

// The most long tiles per row for which one CTA per row beats splitting `rows` rows (0: none).
int64_t block_long_max_tiles_for(int64_t rows, const TopkDeviceProps& props) {
  if (rows * 100 >= kHeuristics.block_long_min_rows_per_100_sms * props.sm_count) {
    return kHeuristics.block_long_max_tiles;
  }
  if (rows * 100 >= kHeuristics.block_long_few_rows_per_100_sms * props.sm_count) {
    return kHeuristics.block_long_few_max_tiles;
  }
  return 0;
}

// Fewer rows than block_rows_enough that still run faster one CTA per row in long tiles than split (see
// block_long_min_rows_per_100_sms).
bool block_long_tiles_beat_splitting(int64_t rows, int64_t n, int64_t k, DType dtype, const TopkDeviceProps& props) {
  return n <= block_long_max_tiles_for(rows, props) * kLongTileElems && k <= kHeuristics.split_hist_min_k &&
         block_long_tiles(rows, n, k, dtype, props);
}

int64_t split_hist_splits(int64_t rows, int64_t n, const TopkDeviceProps& props) {
  return splits_for(rows, n, kHeuristics.split_hist_target_ctas_per_sm, kHeuristics.split_hist_min_chunk, props);
}

int64_t radix_splits(int64_t rows, int64_t n, const TopkDeviceProps& props) {
  return splits_for(rows, n, kHeuristics.radix_target_ctas_per_sm, kHeuristics.radix_min_chunk, props);
}

int backward_threads(int64_t n, DType dtype) {
  return static_cast<int>(std::clamp<int64_t>(next_pow2(ceil_div(n, vec_elems(dtype))), 32, 512));
}

std::string rows_unsupported_reason(int64_t n, int64_t k, DType dtype) {
  Text why;
  if (!rows_dtype(dtype)) why << "float64 input (the rows kernel reads float16, bfloat16 and float32)";
  if (n > kRowsMaxN) why << (why.str().empty() ? "" : "; ") << "N=" << n << " exceeds the " << kRowsMaxN << " values of 16 threads x " << kRowsSlotsPerThread;
  if (k > kRowsMaxK) why << (why.str().empty() ? "" : "; ") << "k=" << k << " > " << kRowsMaxK;
  return why.str();
}

// "" when `kernel` can run the problem, else why not.
std::string unsupported_reason(TopkKernel kernel, int64_t n, int64_t k, DType dtype, const TopkDeviceProps& props) {
  Text why;
  if (kernel == TopkKernel::kRows) return rows_unsupported_reason(n, k, dtype);
  if (kernel == TopkKernel::kWarp && n > warp_max_n(dtype)) {
    why << "N=" << n << " exceeds the " << warp_max_n(dtype) << " values a warp holds in registers (32 lanes x "
        << warp_slots_per_lane(dtype) << ")";
  }
  if (kernel == TopkKernel::kBlock || kernel == TopkKernel::kSplitRow || kernel == TopkKernel::kSplitHist) {
    const size_t bytes = block_dynamic_smem_bytes(dtype, k) + kBlockStaticSmem;
    if (static_cast<int64_t>(bytes) > props.smem_per_block_optin) {
      why << "k=" << k << " needs " << bytes / 1024 << " KB of shared memory for its candidates, the device allows "
          << props.smem_per_block_optin / 1024 << " KB per block (use 'radix')";
    }
  }
  return why.str();
}

// block / split_row: the shortest rows that read peeled (TopkPlan::peel_min_n). Forced, every length the kernels
// take (tests reach the edges of short rows); float64 never (not a speed target).
int64_t peel_min_n_for(DType dtype, bool forced) {
  if (dtype == DType::kFloat64) return 0;
  if (forced) return peel_min_n(dtype);
  const int64_t tiles = dtype == DType::kFloat32 ? kHeuristics.peel_min_tiles_fp32 : kHeuristics.peel_min_tiles_16bit;
  return std::max(peel_min_n(dtype), tiles * kTileElems + 1);
}

TopkPlan plan_for(TopkKernel kernel, int64_t rows, int64_t n, int64_t k, DType dtype, const TopkDeviceProps& props,
                  bool forced) {
  TopkPlan plan;
  plan.kernel = kernel;
  if (kernel == TopkKernel::kBlock || kernel == TopkKernel::kSplitRow) plan.peel_min_n = peel_min_n_for(dtype, forced);
  switch (kernel) {
    case TopkKernel::kWarp:
      plan.lanes_per_row = warp_lanes(rows, n, k, dtype, props);
      plan.smem_bytes = warp_smem_bytes(dtype, plan.lanes_per_row, k);
      break;
    case TopkKernel::kBlock:
      plan.long_tiles = block_long_tiles(rows, n, k, dtype, props);
      plan.smem_bytes = block_dynamic_smem_bytes(dtype, k, plan_tile_elems(plan));
      break;
    case TopkKernel::kSplitRow:
      // A forced split_row always splits when the row has more than one tile, so tests reach the merge.
      plan.splits = std::max<int64_t>(forced ? 2 : 1, split_row_splits(rows, n, k, props));
      plan.long_tiles = split_row_long_tiles(n, k, plan.splits, dtype, props);
      plan.smem_bytes = block_dynamic_smem_bytes(dtype, k, plan_tile_elems(plan));
      plan.workspace_bytes = split_workspace_bytes(dtype, rows, n, k, plan.splits);
      break;
    case TopkKernel::kSplitHist:
      // Forced, it splits rows of more than one tile too (tests reach the multi-chunk histogram).
      plan.splits = std::max<int64_t>(forced ? 2 : 1, split_hist_splits(rows, n, props));
      plan.smem_bytes = block_dynamic_smem_bytes(dtype, k);
      plan.workspace_bytes = split_hist_workspace_layout(dtype, rows, n, k, plan.splits).bytes;
      break;
    case TopkKernel::kRadix:
      plan.splits = std::max<int64_t>(forced ? 2 : 1, radix_splits(rows, n, props));
      plan.workspace_bytes = radix_workspace_bytes(rows, n, plan.splits);
      break;
    case TopkKernel::kRows:
      plan.lanes_per_row = rows_threads(rows, n, k, dtype, props);
      break;
  }
  return plan;
}

TopkBackwardPlan backward_plan_for(TopkBackwardKernel kernel, int64_t rows, int64_t n, DType dtype,
                                   const TopkDeviceProps& props, bool forced) {
  TopkBackwardPlan plan;
  plan.kernel = kernel;
  plan.threads = backward_threads(n, dtype);
  if (kernel == TopkBackwardKernel::kSplit) {
    const int64_t splits = splits_for(rows, n, kHeuristics.backward_split_target_ctas_per_sm,
                                      kHeuristics.backward_min_chunk, props);
    plan.splits = std::max<int64_t>(forced ? 2 : 1, splits);
    plan.threads = backward_threads(backward_chunk_elems(n, plan.splits), dtype);
    plan.workspace_bytes = static_cast<size_t>(rows) * static_cast<size_t>(backward_split_count(n, plan.splits)) * 16;
  }
  return plan;
}

std::string device_line(const TopkDeviceProps& props) {
  Text out;
  if (props.assumed) {
    out << "no CUDA device visible: assuming an " << props.name << " (" << props.sm_count << " SMs, "
        << props.l2_bytes / (1024 * 1024) << " MB L2, " << props.smem_per_block_optin / 1024
        << " KB shared memory per block)";
  } else {
    out << "device " << props.name << " (" << props.sm_count << " SMs, " << props.l2_bytes / (1024 * 1024)
        << " MB L2, " << props.smem_per_block_optin / 1024 << " KB shared memory per block)";
  }
  return out.str();
}

// rows and N of a tensor of `shape` reduced over `dim` (0-d: one row of one element).
std::pair<int64_t, int64_t> rows_and_n(const std::string& op, const std::vector<int64_t>& shape, int64_t dim) {
  const int64_t ndim = std::max<int64_t>(static_cast<int64_t>(shape.size()), 1);
  TORCH_CHECK_INDEX(dim >= -ndim && dim < ndim, "softmax_ops.explain: dim (got ", std::to_string(dim),
                    ") is out of range for ", op, " of a ", std::to_string(shape.size()), "-d shape");
  if (shape.empty()) return {1, 1};
  const int64_t wrapped = dim < 0 ? dim + ndim : dim;
  int64_t numel = 1;
  for (int64_t s : shape) numel *= s;
  const int64_t n = shape[wrapped];
  return {n == 0 ? 0 : numel / n, n};
}

std::string shape_text(const std::vector<int64_t>& shape) {
  Text out;
  out << "(";
  for (size_t i = 0; i < shape.size(); ++i) out << (i ? ", " : "") << shape[i];
  out << (shape.size() == 1 ? ",)" : ")");
  return out.str();
}

// The dtype the fused_topk kernels read for self's dtype and the forward's dtype= (out_dtype; its backward's
// values dtype): the launchers cast self to out_dtype first for any pair but float16 / bfloat16 -> float32.
DType explained_read_dtype(c10::ScalarType dtype, std::optional<c10::ScalarType> out_dtype) {
  const c10::ScalarType result = out_dtype.value_or(dtype);
  require_dtype_tag(result, out_dtype ? "softmax_ops.explain (out_dtype)" : "softmax_ops.explain");
  return require_dtype_tag(softmax_kernel_input_dtype(dtype, result), "softmax_ops.explain");
}

std::string explain_topk(const std::string& op, const std::vector<int64_t>& shape, int64_t dim, c10::ScalarType dtype,
                         int64_t k, std::optional<c10::ScalarType> out_dtype) {
  const DType in = explained_read_dtype(dtype, out_dtype);
  const auto [rows, n] = rows_and_n(op, shape, dim);
  TORCH_CHECK_VALUE(k >= 1 && k <= std::max<int64_t>(n, 1), "softmax_ops.explain: fused_topk needs k in [1, N] (N = ",
                    std::to_string(n), "), got k=", std::to_string(k), " (pass k=...)");
  const TopkDeviceProps& props = topk_device_props();
  Text out;
  out << op << " of shape " << shape_text(shape) << " " << dtype_name(in) << ", k=" << k << ", dim=" << dim << " ("
      << rows << (rows == 1 ? " row" : " rows") << " of N=" << n << "): ";
  std::string why;
  const TopkPlan plan = resolve_topk_plan(rows, n, k, in, props, &why);
  // The launcher peels by the actual pointer (plan_peels_rows, topk_cuda.cpp); a contiguous tensor's rows are
  // aligned exactly when they are whole vectors.
  const bool block_family = plan.kernel == TopkKernel::kBlock || plan.kernel == TopkKernel::kSplitRow;
  const bool vector_sized = whole_vectors(n, in);
  const bool peel = !vector_sized && plan_peels_length(plan, n);
  out << "kernel '" << topk_kernel_name(plan.kernel) << "'";
  switch (plan.kernel) {
    case TopkKernel::kRows: {
      out << " (" << plan.lanes_per_row << (plan.lanes_per_row == 1 ? " thread" : " threads") << " per row";
      const int64_t span = static_cast<int64_t>(plan.lanes_per_row) * kRowsSlotsPerThread;
      // The launcher's fallback for rows that cannot take batches (rows_batches_fit) applies to misaligned
      // pointers only: a contiguous tensor's rows of whole vectors are aligned.
      if (n > span) {
        out << ", each walking its share in " << ceil_div(n, span) << " batches of " << kRowsSlotsPerThread
            << " values";
      }
      out << ", top-" << next_pow2(k) << " lists in registers)";
      break;
    }
    case TopkKernel::kWarp:
      out << " (" << plan.lanes_per_row << (plan.lanes_per_row == 1 ? " lane" : " lanes") << " per row, "
          << 32 / plan.lanes_per_row << (plan.lanes_per_row == 32 ? " row" : " rows") << " per warp)";
      break;
    case TopkKernel::kBlock:
      out << " (one " << kBlockThreads << "-thread CTA per row in tiles of " << plan_tile_elems(plan) << ", "
          << plan.smem_bytes / 1024 << " KB candidate buffer)";
      break;
    case TopkKernel::kSplitRow:
      out << " (" << (peel ? peeled_split_count(n, plan.splits, vec_elems(in)) : split_count(n, plan.splits))
          << " CTAs per row of " << split_chunk_elems(n, plan.splits) << " elements in tiles of "
          << plan_tile_elems(plan) << ", then a merge CTA per row)";
      break;
    case TopkKernel::kSplitHist:
      out << " (" << split_hist_count(n, plan.splits) << " CTAs per row of " << split_hist_chunk_elems(n, plan.splits)
          << " elements build a " << kHistBins << "-bin histogram, then list the values at or above the k-th's bin; "
          << "the row's last CTA selects and sorts)";
      break;
    case TopkKernel::kRadix:
      out << " (" << radix_count(n, plan.splits) << " CTAs per row, up to " << (in == DType::kFloat64 ? 12 : 8)
          << " digit passes, then a sort of the k selected)";
      break;
  }
  out << ": " << why;
  if (plan.long_tiles) {
    out << "; tiles of " << kLongTileElems << ": 16-bit rows of >= " << kHeuristics.long_tile_min_elems
        << " elements per CTA and at most 2 CTAs per SM, where 4096-element tiles keep too few bytes in flight";
  }
  if (block_family && !vector_sized) {
    out << "; rows of " << n << " elements are not whole 16-byte vectors: "
        << (peel ? "each row's aligned body is read in vectors, the elements around it singly"
                 : "single-element loads");
    if (!peel && plan.peel_min_n > 0) out << " (peeled rows pay from N=" << plan.peel_min_n << ")";
  }
  out << ". [" << device_line(props) << "]";
  return out.str();
}

std::string explain_topk_backward(const std::string& op, const std::vector<int64_t>& shape, int64_t dim,
                                  c10::ScalarType dtype, int64_t k, std::optional<c10::ScalarType> out_dtype) {
  static_cast<void>(k);
  const DType in = explained_read_dtype(dtype, out_dtype);
  const auto [rows, n] = rows_and_n(op, shape, dim);
  const TopkDeviceProps& props = topk_device_props();
  std::string why;
  const TopkBackwardPlan plan = resolve_topk_backward_plan(rows, n, in, props, &why);
  Text out;
  out << op << " of shape " << shape_text(shape) << " " << dtype_name(in) << ", dim=" << dim << " (" << rows
      << (rows == 1 ? " row" : " rows") << " of N=" << n << "): kernel '" << topk_backward_kernel_name(plan.kernel) << "' (" << plan.threads
      << " threads per CTA";
  if (plan.kernel == TopkBackwardKernel::kSplit) out << ", " << backward_split_count(n, plan.splits) << " CTAs per row";
  out << "): " << why << ". [" << device_line(props) << "]";
  return out.str();
}

const bool kRegistered = [] {
  register_kernel_family("topk", {std::vector<std::string>(std::begin(kTopkNames), std::end(kTopkNames)), &explain_topk});
  register_kernel_family("topk_backward", {std::vector<std::string>(std::begin(kTopkBackwardNames),
                                                                    std::end(kTopkBackwardNames)),
                                           &explain_topk_backward});
  return true;
}();

}  // namespace

const char* topk_kernel_name(TopkKernel kernel) { return kTopkNames[static_cast<int>(kernel)]; }
const char* topk_backward_kernel_name(TopkBackwardKernel kernel) {
  return kTopkBackwardNames[static_cast<int>(kernel)];
}

const TopkDeviceProps& topk_device_props() {
  static const TopkDeviceProps kAssumedH100{};
  static const int device_count = [] {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess) {
      static_cast<void>(cudaGetLastError());  // leave no sticky error for the next CUDA call
      count = 0;
    }
    return count;
  }();
  int device = 0;
  if (device_count == 0 || cudaGetDevice(&device) != cudaSuccess || device >= device_count) {
    static_cast<void>(cudaGetLastError());
    return kAssumedH100;
  }
  // Queried once per device; entries are never moved or freed, so references stay valid.
  static std::mutex mutex;
  static std::vector<std::unique_ptr<TopkDeviceProps>> cache(device_count);
  std::lock_guard<std::mutex> lock(mutex);
  if (!cache[device]) {
    cudaDeviceProp prop{};
    int optin = 0;
    if (cudaGetDeviceProperties(&prop, device) != cudaSuccess ||
        cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) != cudaSuccess) {
      static_cast<void>(cudaGetLastError());
      return kAssumedH100;
    }
    cache[device] = std::make_unique<TopkDeviceProps>(
        TopkDeviceProps{prop.multiProcessorCount, prop.l2CacheSize, optin, prop.name, false});
  }
  return *cache[device];
}

TopkPlan choose_topk_kernel(int64_t rows, int64_t n, int64_t k, DType dtype, const TopkDeviceProps& props,
                            std::string* why) {
  Text reason(why != nullptr);  // described only when asked: this runs on every call
  if (rows_fits(n, k, dtype)) {
    const bool within = n <= rows_auto_max_n(dtype);
    if (within || rows_whole_vectors(n, dtype)) {
      const TopkPlan plan = plan_for(TopkKernel::kRows, rows, n, k, dtype, props, false);
      reason << "N=" << n << (within ? " <= " : " > ") << rows_auto_max_n(dtype)
             << (within ? "" : " in whole 16-byte vectors") << " and k=" << k << " <= " << kRowsMaxK
             << ": router rows, a sorted top-" << next_pow2(k) << " list per thread in registers";
      if (n > static_cast<int64_t>(plan.lanes_per_row) * kRowsSlotsPerThread) {
        reason << "; enough rows to fill the GPU on half the threads that hold a row, each thread in batches (one "
                  "merge step fewer per row)";
      }
      if (why != nullptr) *why = reason.str();
      return plan;
    }
  }
  TopkKernel kernel;
  if (n <= warp_max_n(dtype) && k <= kHeuristics.warp_max_k) {
    kernel = TopkKernel::kWarp;
    reason << "N=" << n << " <= " << warp_max_n(dtype) << " fits a (sub-)warp's registers and k=" << k
           << " <= " << kHeuristics.warp_max_k << " rounds of warp arg-max";
  } else if (k > kHeuristics.candidate_max_k || !unsupported_reason(TopkKernel::kBlock, n, k, dtype, props).empty()) {
    kernel = TopkKernel::kRadix;
    reason << "k=" << k << " > " << kHeuristics.candidate_max_k
           << " candidates (or beyond shared memory): radix select works for any k";
  } else if (block_rows_enough(rows, props) || split_row_splits(rows, n, k, props) < 2 ||
             block_long_tiles_beat_splitting(rows, n, k, dtype, props)) {
    kernel = TopkKernel::kBlock;
    reason << rows << " rows";
    if (block_rows_enough(rows, props)) {
      reason << " >= " << kHeuristics.block_min_rows_per_100_sms << " per 100 SMs: one CTA per row beats splitting";
    } else if (split_row_splits(rows, n, k, props) < 2) {
      reason << ": rows too short to split into chunks of >= "
             << std::max(kHeuristics.split_min_chunk, kHeuristics.split_chunk_per_k * k) << " elements";
    } else {
      reason << " of N=" << n << " <= " << block_long_max_tiles_for(rows, props) << " tiles of " << kLongTileElems
             << " (the most for this many rows): one CTA per row in long tiles beats splitting";
    }
  } else if ((k > kHeuristics.split_hist_min_k || rows <= kHeuristics.split_hist_max_rows) &&
             rows * n * dtype_bytes(dtype) <= props.l2_bytes) {
    kernel = TopkKernel::kSplitHist;
    reason << rows << " rows < " << kHeuristics.block_min_rows_per_100_sms << " per 100 SMs: each row is split; ";
    if (k > kHeuristics.split_hist_min_k) {
      reason << "k=" << k << " > " << kHeuristics.split_hist_min_k;
    } else {
      reason << rows << (rows == 1 ? " row" : " rows") << " <= " << kHeuristics.split_hist_max_rows;
    }
    reason << ": one row-wide histogram floor instead of every chunk's top k (the logits fit the "
           << props.l2_bytes / (1024 * 1024) << " MB L2, so its second read of them hits L2)";
  } else {
    kernel = TopkKernel::kSplitRow;
    reason << rows << " rows < " << kHeuristics.block_min_rows_per_100_sms << " per 100 SMs: one CTA per row would "
           << "leave too many SMs idle, so each row is split";
  }
  if (why != nullptr) *why = reason.str();
  return plan_for(kernel, rows, n, k, dtype, props, false);
}

TopkBackwardPlan choose_topk_backward_kernel(int64_t rows, int64_t n, DType dtype, const TopkDeviceProps& props,
                                             std::string* why) {
  const bool split = rows < kHeuristics.backward_block_min_rows_per_sm * props.sm_count &&
                     n >= 2 * kHeuristics.backward_min_chunk;
  if (why != nullptr) {
    Text reason;
    if (split) {
      reason << rows << " rows < " << kHeuristics.backward_block_min_rows_per_sm << " per SM and N=" << n
             << ": each row is split into chunks";
    } else {
      reason << "one CTA per row (" << rows << " rows, N=" << n << ")";
    }
    *why = reason.str();
  }
  return backward_plan_for(split ? TopkBackwardKernel::kSplit : TopkBackwardKernel::kBlock, rows, n, dtype, props,
                           false);
}

TopkPlan resolve_topk_plan(int64_t rows, int64_t n, int64_t k, DType dtype, const TopkDeviceProps& props,
                           std::string* why) {
  const std::string forced = kernel_override("topk");
  if (forced.empty()) return choose_topk_kernel(rows, n, k, dtype, props, why);
  const auto* it = std::find(std::begin(kTopkNames), std::end(kTopkNames), forced);
  TORCH_CHECK_VALUE(it != std::end(kTopkNames), "softmax_ops.fused_topk: unknown forced kernel '", forced, "'");
  const int index = static_cast<int>(it - std::begin(kTopkNames));
  const auto kernel = static_cast<TopkKernel>(index);
  const std::string reason = unsupported_reason(kernel, n, k, dtype, props);
  TORCH_CHECK_VALUE(reason.empty(), "softmax_ops.fused_topk: the forced kernel '", forced,
                    "' (softmax_ops.force_kernel) cannot handle N=", std::to_string(n), ", k=", std::to_string(k), ": ", reason);
  if (why != nullptr) *why = "forced with softmax_ops.force_kernel(\"topk\", \"" + forced + "\")";
  return plan_for(kernel, rows, n, k, dtype, props, true);
}

TopkBackwardPlan resolve_topk_backward_plan(int64_t rows, int64_t n, DType dtype, const TopkDeviceProps& props,
                                            std::string* why) {
  const std::string forced = kernel_override("topk_backward");
  if (forced.empty()) return choose_topk_backward_kernel(rows, n, dtype, props, why);
  const auto* it = std::find(std::begin(kTopkBackwardNames), std::end(kTopkBackwardNames), forced);
  TORCH_CHECK_VALUE(it != std::end(kTopkBackwardNames), "softmax_ops.fused_topk_backward: unknown forced kernel '",
                    forced, "'");
  if (why != nullptr) *why = "forced with softmax_ops.force_kernel(\"topk_backward\", \"" + forced + "\")";
  return backward_plan_for(static_cast<TopkBackwardKernel>(it - std::begin(kTopkBackwardNames)), rows, n, dtype, props,
                           true);
}

}  // namespace softmax_ops::topk
