// The boundary between the fused_topk host launcher (topk_cuda.cpp, g++) and the kernel files (*.cu, nvcc):
// plain structs, the sizes both sides must agree on, and launch functions taking raw pointers, sizes, DType
// tags and a stream. No ATen here.
//
// Kernel menu (DESIGN.md §4, "fused_topk has its own menu"):
//   warp      one warp or sub-warp (1-32 lanes) per row, the row in registers: router rows, N <= 1024.
//   rows      1-16 threads per row, each with up to 32 values and
//             a sorted top-K list in registers (k <= 8, N <= 512, 16/32-bit inputs): sorting networks, no
//             shared memory; the router shapes' kernel.
//   block     one CTA per row: online (max, sum) and a threshold-filtered candidate buffer in shared memory,
//             block radix select to compact it, bitonic sort of the final k.
//   split_row several CTAs per row each produce (max, sum) and their chunk's top-k into a workspace; the CTA
//             that finishes its row last (a per-row ticket) merges them, in one launch (few rows x huge N).
//   radix     any k <= N: radix select over order-preserving integer keys (8-bit digits, one launch per digit,
//             global histogram), gather of the k selected, sort, then a finalize kernel.
//   split_hist few rows x long rows (large k): several CTAs per row build one histogram of the keys' top
//             kHistBits bits and the row's (max, sum); the bin holding the k-th best gives a floor, a second
//             launch lists every value at or above it (the re-read hits L2) and the row's last CTA selects,
//             sorts and writes the k best. A row whose floor passes more than the buffer holds (mass ties)
//             runs the block kernel's producer over the whole row in that CTA instead (exact, slower).
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "softmax_ops/device_utils.cuh"  // DType (the device helpers are hidden from host compilers)

namespace softmax_ops::topk {

enum class TopkKernel : int { kWarp = 0, kBlock, kSplitRow, kRadix, kRows, kSplitHist };
constexpr int kNumTopkKernels = 6;
enum class TopkBackwardKernel : int { kBlock = 0, kSplit };
constexpr int kNumTopkBackwardKernels = 2;

// ---- sizes shared by the kernels and the dispatcher -------------------------------------------------

inline int dtype_bytes(DType t) {
  return t == DType::kFloat64 ? 8 : (t == DType::kFloat32 ? 4 : 2);
}
// Elements per 16-byte vector access.
inline int vec_elems(DType t) { return 16 / dtype_bytes(t); }
// Whether n elements of t fill whole 16-byte vectors (a row of them keeps the next row's start on a vector boundary).
inline bool whole_vectors(int64_t n, DType t) { return n % vec_elems(t) == 0; }

inline int64_t next_pow2(int64_t v) {
  int64_t p = 1;
  while (p < v) p <<= 1;
  return p;
}

// warp: 128-thread CTAs; each lane holds up to kWarpSlots values of its row in registers (16 for float64,
// whose values and keys take two registers each), so a row of lanes_per_row lanes holds
// lanes_per_row * slots values.
constexpr int kWarpKernelThreads = 128;
inline int warp_slots_per_lane(DType in) { return in == DType::kFloat64 ? 16 : 32; }
inline int64_t warp_max_n(DType in) { return 32 * static_cast<int64_t>(warp_slots_per_lane(in)); }
// Shared memory of the warp kernel: per row, the k results (compute-type probability + int32 index).
// k <= N <= lanes * slots bounds it by 128 * slots entries: <= 48 KB, no opt-in needed.
inline size_t warp_smem_bytes(DType in, int lanes_per_row, int64_t k) {
  const size_t entry = (in == DType::kFloat64 ? 8 : 4) + 4;
  return static_cast<size_t>(kWarpKernelThreads / lanes_per_row) * static_cast<size_t>(k) * entry;
}

// rows: 128-thread CTAs; each thread holds up to kRowsSlotsPerThread values of its row (T = 1..16 threads
// per row, a power of two), k <= kRowsMaxK; float16, bfloat16 and float32 inputs.
constexpr int kRowsThreads = 128;
constexpr int kRowsSlotsPerThread = 32;
constexpr int kRowsMaxThreadsPerRow = 16;
constexpr int64_t kRowsMaxK = 8;
constexpr int64_t kRowsMaxN = kRowsSlotsPerThread * kRowsMaxThreadsPerRow;
// ... or, for 16-bit rows read in 16-byte vectors whose top-K lists (K = k rounded up to a power of two) hold at
// least kRowsBatchedMinK words, rows of up to kRowsMaxN values on fewer threads: each thread then walks its share
// in batches of kRowsSlotsPerThread (topk_rows.cu).
constexpr int kRowsBatchedMinK = 4;
inline bool rows_batches_fit(DType in, int64_t k, bool vector_loads) {
  return (in == DType::kFloat16 || in == DType::kBFloat16) && vector_loads && next_pow2(k) >= kRowsBatchedMinK &&
         k <= kRowsMaxK;
}

// block / split_row: 256-thread CTAs reading tiles of 4096 elements (16 B per thread per unrolled step).
constexpr int kBlockThreads = 256;
constexpr int kTileElems = 4096;
// ... or twice that where the plan says long_tiles (16-bit rows read in 16-byte vectors, CTAs whose range holds
// several such tiles, at most 2 CTAs per SM): a CTA streams its range one tile behind a barrier, so with few CTAs per
// SM the bytes in flight per SM are about 2 tiles.
constexpr int kLongTileElems = 2 * kTileElems;
// Candidates the split_row merge (the last CTA of a row) streams per step (8 per thread).
constexpr int kMergeChunk = kBlockThreads * 8;
// Free slots kept beyond k + one tile, so that a compaction runs only after this many insertions.
constexpr int kCandidateSlack = 2048;
// Static shared memory of the block-family kernels (select scratch + reduction scratch), upper bound.
constexpr size_t kBlockStaticSmem = 3072;  // BlockScratch (topk_block.cu), with the select side list

// Bytes of one candidate: a 64-bit (key, ~index) word, or 16 bytes for float64's 64-bit keys.
inline size_t candidate_bytes(DType in) { return in == DType::kFloat64 ? 16 : 8; }
// Candidate buffer entries: room for k + one tile (+ slack) between compactions, and a power of two >= k
// for the final bitonic sort.
inline int64_t candidate_capacity(int64_t k, int tile = kTileElems) {
  return std::max<int64_t>(next_pow2(k), k + tile + kCandidateSlack);
}
inline size_t block_dynamic_smem_bytes(DType in, int64_t k, int tile = kTileElems) {
  return static_cast<size_t>(candidate_capacity(k, tile)) * candidate_bytes(in);
}

// Rows split into chunks (split_row, split_hist, radix, the backward's split): ceil(n / splits) rounded up to a
// multiple of `align`, and the number of chunks of that length a row of n needs (fewer than `splits` when the
// rounding grew them; the last chunk may be shorter).
inline int64_t aligned_chunk_elems(int64_t n, int64_t splits, int64_t align) {
  const int64_t want = (n + splits - 1) / splits;
  return (want + align - 1) / align * align;
}
inline int64_t chunk_count(int64_t n, int64_t chunk) { return (n + chunk - 1) / chunk; }

// split_row: chunk length (whole 4096-element tiles, at least one; long tiles may end in half a tile) and the
// number of chunks actually launched.
inline int64_t split_chunk_elems(int64_t n, int64_t splits) {
  return std::max<int64_t>(kTileElems, aligned_chunk_elems(n, splits, kTileElems));
}
inline int64_t split_count(int64_t n, int64_t splits) { return chunk_count(n, split_chunk_elems(n, splits)); }
// split_row on peeled rows (TopkPlan::peel): each row's body, whose length depends on the row's phase and is at
// least n - 2 (V - 1), in chunks of split_chunk_elems, the last one running to the body's end: as many as the
// shortest body needs, so that no chunk is empty. At most split_count (the workspace's layout).
inline int64_t peeled_split_count(int64_t n, int64_t splits, int vec) {
  return chunk_count(n - 2 * (vec - 1), split_chunk_elems(n, splits));
}
// The shortest rows the peeled kernels take: one whole vector in the body (n - 2 (V - 1) >= 1).
inline int64_t peel_min_n(DType in) { return 2 * vec_elems(in) - 1; }
// Per (row, chunk): k candidates, then per (row, chunk) the chunk's (max, sum) as two compute-type values
// (16-byte slots), then per row a 32-bit ticket (zeroed by a kernel launched in front of it).
struct SplitWorkspaceLayout {
  size_t cand_offset = 0;
  size_t stats_offset = 0;
  size_t tickets_offset = 0;
  size_t bytes = 0;
};
inline SplitWorkspaceLayout split_workspace_layout(DType in, int64_t rows, int64_t n, int64_t k, int64_t splits) {
  const size_t chunks = static_cast<size_t>(rows) * static_cast<size_t>(split_count(n, splits));
  SplitWorkspaceLayout layout;
  layout.stats_offset = chunks * static_cast<size_t>(k) * candidate_bytes(in);
  layout.tickets_offset = layout.stats_offset + chunks * 16;
  layout.bytes = layout.tickets_offset + static_cast<size_t>(rows) * 4;
  return layout;
}
inline size_t split_workspace_bytes(DType in, int64_t rows, int64_t n, int64_t k, int64_t splits) {
  return split_workspace_layout(in, rows, n, k, splits).bytes;
}

// split_hist: chunks of a multiple of 256 elements (whole 16-byte vectors of every dtype; the last tile of a
// chunk may be partial: unlike split_row's, its chunks write no candidates, so there is no reason to round
// them up to whole tiles and leave SMs idle). Per row a 32-byte state and a kHistBins-bin int32 histogram (both
// zeroed before the first launch), per (row, chunk) a partial (max, sum), per row a list of up to
// candidate_capacity(k) candidates.
constexpr int kHistBits = 12;
constexpr int kHistBins = 1 << kHistBits;
constexpr int64_t kSplitHistChunkAlign = 256;
inline int64_t split_hist_chunk_elems(int64_t n, int64_t splits) {
  return aligned_chunk_elems(n, splits, kSplitHistChunkAlign);
}
inline int64_t split_hist_count(int64_t n, int64_t splits) { return chunk_count(n, split_hist_chunk_elems(n, splits)); }
constexpr size_t kSplitHistStateBytes = 32;
struct SplitHistWorkspaceLayout {
  size_t hist_offset = 0;         // after the row states at offset 0
  size_t chunk_stats_offset = 0;  // == the bytes to zero
  size_t list_offset = 0;
  size_t bytes = 0;
};
inline SplitHistWorkspaceLayout split_hist_workspace_layout(DType in, int64_t rows, int64_t n, int64_t k,
                                                            int64_t splits) {
  const size_t r = static_cast<size_t>(rows);
  SplitHistWorkspaceLayout layout;
  layout.hist_offset = r * kSplitHistStateBytes;
  layout.chunk_stats_offset = layout.hist_offset + r * kHistBins * sizeof(int32_t);
  layout.list_offset = layout.chunk_stats_offset + r * static_cast<size_t>(split_hist_count(n, splits)) * 16;
  layout.bytes = layout.list_offset + r * static_cast<size_t>(candidate_capacity(k)) * candidate_bytes(in);
  return layout;
}

// radix: per row a 64-byte state and a 256-bin int32 histogram; per (row, chunk) a partial (max, sum).
constexpr int kRadixThreads = 256;
constexpr size_t kRadixStateBytes = 64;
inline int64_t radix_chunk_elems(int64_t n, int64_t splits) { return aligned_chunk_elems(n, splits, 1); }
inline int64_t radix_count(int64_t n, int64_t splits) { return chunk_count(n, radix_chunk_elems(n, splits)); }
inline size_t radix_workspace_bytes(int64_t rows, int64_t n, int64_t splits) {
  return static_cast<size_t>(rows) * (kRadixStateBytes + 256 * 4 + 16 * static_cast<size_t>(radix_count(n, splits)));
}

// backward: CTAs of `threads`; split: chunks of a multiple of 16 elements, partial (max, sum) per chunk.
inline int64_t backward_chunk_elems(int64_t n, int64_t splits) { return aligned_chunk_elems(n, splits, 16); }
inline int64_t backward_split_count(int64_t n, int64_t splits) {
  return chunk_count(n, backward_chunk_elems(n, splits));
}

// ---- problems and plans -------------------------------------------------------------------------------

// Forward: rows of n contiguous elements of in_dtype (the reduced dim last); values [rows, k] in out_dtype,
// indices [rows, k] int64. in_dtype == out_dtype, or float16/bfloat16 read directly into float32 results.
struct TopkProblem {
  DType in_dtype = DType::kFloat32;
  DType out_dtype = DType::kFloat32;
  int64_t rows = 0;
  int64_t n = 0;
  int64_t k = 0;
  bool renormalize = false;
};

struct TopkPlan {
  TopkKernel kernel = TopkKernel::kBlock;
  int lanes_per_row = 32;       // warp: lanes sharing one row (1..32, a power of two); rows: threads (1..16)
  int64_t splits = 1;           // split_row / split_hist / radix: chunks per row (before rounding, see *_count)
  bool vector_loads = false;    // x is 16-byte aligned and n * element size is a multiple of 16
  int64_t peel_min_n = 0;       // block / split_row: rows of at least this many elements that are not vector_loads
                                // read each row's body in vectors (RowEdges); 0: never
  bool peel = false;            // the launcher's decision from peel_min_n and the pointer
  bool long_tiles = false;      // block / split_row: tiles of kLongTileElems where the rows are read in vectors
  size_t smem_bytes = 0;        // dynamic shared memory per CTA
  size_t workspace_bytes = 0;   // split_row / split_hist / radix: bytes the caller allocates
};

// block / split_row: the tile length of `plan` (where its rows are read in vectors).
inline int plan_tile_elems(const TopkPlan& plan) { return plan.long_tiles ? kLongTileElems : kTileElems; }

// Whether `plan` reads rows of n elements peeled where they are not vector_loads (TopkPlan::peel_min_n).
inline bool plan_peels_length(const TopkPlan& plan, int64_t n) { return plan.peel_min_n > 0 && n >= plan.peel_min_n; }

struct TopkPointers {
  const void* x = nullptr;
  void* values = nullptr;
  int64_t* indices = nullptr;
  void* workspace = nullptr;
};

// Backward: x [rows, n] and dx [rows, n] in dtype (what the forward kernel read); grad and values [rows, k]
// in the compute type (float32, or float64 when dtype is float64); indices [rows, k] int64.
struct TopkBackwardProblem {
  DType dtype = DType::kFloat32;
  int64_t rows = 0;
  int64_t n = 0;
  int64_t k = 0;
  bool renormalize = false;
};

struct TopkBackwardPlan {
  TopkBackwardKernel kernel = TopkBackwardKernel::kBlock;
  int threads = 256;
  int64_t splits = 1;
  bool vector_loads = false;
  size_t workspace_bytes = 0;   // split: partial (max, sum) per chunk
};

struct TopkBackwardPointers {
  const void* x = nullptr;
  const void* grad = nullptr;
  const void* values = nullptr;
  const int64_t* indices = nullptr;
  void* dx = nullptr;
  void* workspace = nullptr;
};

// Each returns the first CUDA error of its launches (cudaSuccess when all launched).
cudaError_t launch_topk_warp(const TopkProblem& problem, const TopkPlan& plan, const TopkPointers& ptrs,
                             cudaStream_t stream);
cudaError_t launch_topk_rows(const TopkProblem& problem, const TopkPlan& plan, const TopkPointers& ptrs,
                             cudaStream_t stream);
// block and split_row (plan.kernel says which).
cudaError_t launch_topk_block(const TopkProblem& problem, const TopkPlan& plan, const TopkPointers& ptrs,
                              cudaStream_t stream);
// split_hist (two launches after a memset of the row states and histograms).
cudaError_t launch_topk_split_hist(const TopkProblem& problem, const TopkPlan& plan, const TopkPointers& ptrs,
                                   cudaStream_t stream);
// radix, first half: select the k best of every row into sel_key (int64 keys whose signed order is the
// ranking order) and sel_idx, both [rows, k], in no particular order. The caller sorts them (key
// descending, ties by index ascending) and calls the second half with the sorted arrays.
cudaError_t launch_topk_radix_select(const TopkProblem& problem, const TopkPlan& plan, const TopkPointers& ptrs,
                                     int64_t* sel_key, int64_t* sel_idx, cudaStream_t stream);
cudaError_t launch_topk_radix_finalize(const TopkProblem& problem, const TopkPlan& plan,
                                       const TopkPointers& ptrs, const int64_t* sorted_key,
                                       const int64_t* sorted_idx, cudaStream_t stream);

cudaError_t launch_topk_backward(const TopkBackwardProblem& problem, const TopkBackwardPlan& plan,
                                 const TopkBackwardPointers& ptrs, cudaStream_t stream);

}  // namespace softmax_ops::topk
