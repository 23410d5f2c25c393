// fused_topk "split_hist": few rows x long rows with a large k (vocabulary sampling: 8 x 262144, k = 1024).
//
// split_row gives every chunk its own top k and merges rows x chunks x k candidates in one CTA per row; with
// k = 1024 that merge (32 x 1024 candidates, several radix selects over them) was ~2/3 of the kernel's time
// (benchmarks/notes-topk-tuning.md, session 7). Here the chunks agree on ONE row-wide floor first:
//   launch 1 (CTA per (row, chunk)): the chunk's (max, sum) and a shared-memory histogram of the top kHistBits
//     bits of every value's order key, added into the row's histogram in global memory (zeroed by a small
//     kernel that launch 1 follows as a programmatic dependent launch).
//   launch 2 (CTA per (row, chunk), a programmatic dependent launch on Hopper: its CTAs are scheduled while
//     launch 1 drains and wait for its results): each CTA finds the bin holding the row's k-th best from the
//     row's histogram (every CTA of a row computes the same answer; one CTA doing it and publishing it cost a
//     ticket and two more L2 round trips), reads its chunk again (from L2 where it fits) and appends the
//     values at or above that bin's lowest key to the row's list. The row's last CTA (a ticket) merges the
//     chunks' (max, sum) in chunk order, loads the list into shared memory, selects the k best (radix select
//     + compaction), sorts them and writes probabilities and indices.
// The bins are monotone in the ranking order (NaN on top, -0 == +0), so the floor never drops a value of the
// top k, and the final selection is exact under the total order of topk_device.cuh: the result does not
// depend on the list's (atomic, run-dependent) order. When the floor passes more values than the buffer
// holds (mass ties or constant rows), launch 2 lists nothing for that row and its last CTA runs the block
// kernel's producer over the whole row instead: exact, slower.
#include <algorithm>
#include <utility>

#include "topk_chunk.cuh"
#include "topk_dependent_launch.cuh"
#include "topk_launch.h"

namespace softmax_ops::topk {
namespace {

// Per row, zeroed before launch 1.
struct SplitHistRowState {
  unsigned select_ticket;  // launch 2: chunks that listed their candidates
  int fill;                // launch 2: entries in the row's list
  int pad[6];
};
static_assert(sizeof(SplitHistRowState) == kSplitHistStateBytes, "row state size is part of the layout");

template <typename C>
struct SplitHistWorkspace {
  SplitHistRowState* states;            // [rows]
  int* hist;                            // [rows][kHistBins]
  RowStats<C>* chunk_stats;             // [rows][splits]
  typename CandFor<C>::Type* lists;     // [rows][cap]
};

// The histogram bin of an order key: its top kHistBits bits (monotone in the key).
template <typename Key>
__device__ __forceinline__ int hist_bin(Key key) {
  return static_cast<int>(key >> (8 * sizeof(Key) - kHistBits));
}
// The lowest key of bin b.
template <typename Key>
__device__ __forceinline__ Key bin_floor_key(int b) {
  return static_cast<Key>(b) << (8 * sizeof(Key) - kHistBits);
}

// Calls fn(v, t0, valid) for the tiles of x[lo, hi) (lo < hi) in order: v the tile's values as ChunkTopk lays
// them out, valid how many of its offsets lie in the range (the rest are -inf pads). The next tile's loads
// are in flight during fn where ChunkTopk prefetches. kStream: evict-first loads (the last read).
template <typename TIn, bool kVectorLoads, bool kStream, typename TileFn>
__device__ __forceinline__ void for_each_tile(const TIn* __restrict__ x, int lo, int hi, TileFn&& fn) {
  using Chunk = ChunkTopk<TIn, kVectorLoads>;
  typename Chunk::RawTile next;
  constexpr int kTile = Chunk::kTileLen;
  if constexpr (Chunk::kPrefetch) Chunk::template load_tile<kStream>(x + lo, min(hi - lo, kTile), next);
  for (int t0 = lo;; t0 += kTile) {
    const int valid = min(hi - t0, kTile);
    const bool more = hi - t0 > kTile;
    if constexpr (!Chunk::kPrefetch) Chunk::template load_tile<kStream>(x + t0, valid, next);
    typename Chunk::C v[Chunk::U][Chunk::V];
    Chunk::unpack_tile(next, v);
    if (Chunk::kPrefetch && more) {
      Chunk::template load_tile<kStream>(x + t0 + kTile, min(hi - t0 - kTile, kTile), next);
    }
    fn(v, t0, valid);
    if (!more) break;
  }
}

// Take-mask bits of the offsets < valid (all of them for a full tile).
template <typename Chunk>
__device__ __forceinline__ uint32_t in_range_mask(int valid) {
  constexpr uint32_t kAll = Chunk::kPerThread == 32 ? ~0u : (1u << Chunk::kPerThread) - 1u;
  return valid < Chunk::kTileLen ? Chunk::valid_mask(valid) : kAll;
}

// The bin holding the k-th best value of a row histogram that launch 1 wrote (read through L2), and how many
// values lie in that bin and above (>= k). Thread t owns the kPer bins below
// kHistBins - t * kPer: a block scan of the threads' totals in that order, then the thread whose range
// reaches k walks its bins down. Every thread returns the answer.
struct FloorBin {
  int bin;
  int candidates;
};
__device__ FloorBin find_floor_bin(const int* hist, int k, int* scratch /* kBlockThreads / 32 + 2 */) {
  constexpr int kPer = kHistBins / kBlockThreads;
  constexpr int kWarps = kBlockThreads / kWarpSize;
  static_assert(kPer * kBlockThreads == kHistBins && kPer % 4 == 0, "whole int4 loads per thread");
  const int first = kHistBins - kPer * (static_cast<int>(threadIdx.x) + 1);
  int h[kPer];
  int total = 0;
#pragma unroll
  for (int q = 0; q < kPer / 4; ++q) {
    const int4 w = __ldcg(reinterpret_cast<const int4*>(hist + first) + q);
    h[4 * q] = w.x;
    h[4 * q + 1] = w.y;
    h[4 * q + 2] = w.z;
    h[4 * q + 3] = w.w;
    total += w.x + w.y + w.z + w.w;
  }
  const int lane = threadIdx.x % kWarpSize;
  const int warp = threadIdx.x / kWarpSize;
  int inclusive = total;
#pragma unroll
  for (int offset = 1; offset < kWarpSize; offset *= 2) {
    const int other = __shfl_up_sync(kFullMask, inclusive, offset);
    if (lane >= offset) inclusive += other;
  }
  if (lane == kWarpSize - 1) scratch[warp] = inclusive;
  __syncthreads();
  int above = inclusive - total;
  for (int w = 0; w < warp; ++w) above += scratch[w];
  if (above < k && above + total >= k) {  // exactly one thread: the row has n >= k values
    bool found = false;
#pragma unroll
    for (int j = kPer - 1; j >= 0; --j) {
      if (!found && above + h[j] >= k) {
        found = true;
        scratch[kWarps] = first + j;
        scratch[kWarps + 1] = above + h[j];
      }
      above += h[j];
    }
  }
  __syncthreads();
  return {scratch[kWarps], scratch[kWarps + 1]};
}

// Launch 1: one CTA per (row, chunk).
template <typename TIn, bool kVectorLoads>
__global__ void __launch_bounds__(kBlockThreads, kBlockMinCtasPerSm<TIn>)
    topk_hist_kernel(const TIn* __restrict__ x, int64_t n, int64_t chunk, int splits,
                     SplitHistWorkspace<compute_t<TIn>> ws) {
  using Chunk = ChunkTopk<TIn, kVectorLoads>;
  using C = typename Chunk::C;
  __shared__ int hist[kHistBins];
  __shared__ RowStats<C> stats_scratch[kBlockThreads / kWarpSize];
  allow_dependent_launch();
  for (int i = threadIdx.x; i < kHistBins; i += kBlockThreads) hist[i] = 0;
  __syncthreads();

  const int64_t row = blockIdx.x / splits;
  const int part = static_cast<int>(blockIdx.x % splits);
  const int lo = static_cast<int>(part * chunk);
  const int hi = static_cast<int>(min(n, part * chunk + chunk));
  RowStats<C> stats = empty_stats<C>();
  for_each_tile<TIn, kVectorLoads, false>(x + row * n, lo, hi, [&](const C (&v)[Chunk::U][Chunk::V], int, int valid) {
    Chunk::fold_tile_stats(stats, v);
    const uint32_t mask = in_range_mask<Chunk>(valid);
#pragma unroll
    for (int u = 0; u < Chunk::U; ++u) {
#pragma unroll
      for (int j = 0; j < Chunk::V; ++j) {
        if (mask & (1u << (u * Chunk::V + j))) atomicAdd(&hist[hist_bin(OrderKey<C>::of(v[u][j]))], 1);
      }
    }
  });
  stats = block_merge_stats(stats, stats_scratch);  // its barriers also complete the histogram
  if (threadIdx.x == 0) ws.chunk_stats[row * splits + part] = stats;
  int* row_hist = ws.hist + row * kHistBins;
  wait_for_prerequisite_grid();  // the zero kernel's writes
  for (int i = threadIdx.x; i < kHistBins; i += kBlockThreads) {
    const int count = hist[i];
    if (count != 0) atomicAdd(row_hist + i, count);
  }
}

// CTAs per SM launch 2's register budget is set for: its candidate buffer (k + 6144 entries, >= 49 KB) allows
// at most 4 anyway, and at 64 registers (4 per SM) the 16-bit instances spilled 32-56 bytes (ptxas, nvcc 13.0).
template <typename TIn>
constexpr int kSelectMinCtasPerSm = sizeof(TIn) == 8 ? 2 : 3;

// Launch 2: one CTA per (row, chunk); the row's last CTA selects and writes.
template <typename TIn, typename TOut, bool kVectorLoads>
__global__ void __launch_bounds__(kBlockThreads, kSelectMinCtasPerSm<TIn>)
    topk_hist_select_kernel(const TIn* __restrict__ x, TOut* __restrict__ values, int64_t* __restrict__ indices,
                            int64_t n, int k, int cap, int64_t chunk, int splits, bool renormalize,
                            SplitHistWorkspace<compute_t<TIn>> ws) {
  using Chunk = ChunkTopk<TIn, kVectorLoads>;
  using C = typename Chunk::C;
  using Ops = typename Chunk::Ops;
  using Cand = typename Ops::Type;
  using Key = typename OrderKey<C>::Key;
  static_assert(sizeof(BlockScratch<C>) <= kBlockStaticSmem, "static shared memory over budget");
  extern __shared__ __align__(16) unsigned char smem_raw[];
  auto* buf = reinterpret_cast<Cand*>(smem_raw);
  __shared__ BlockScratch<C> scratch;

  __shared__ int floor_scratch[kBlockThreads / kWarpSize + 2];

  const int64_t row = blockIdx.x / splits;
  const int part = static_cast<int>(blockIdx.x % splits);
  const TIn* row_x = x + row * n;
  SplitHistRowState& state = ws.states[row];
  wait_for_prerequisite_grid();
  const FloorBin floor = find_floor_bin(ws.hist + row * kHistBins, k, floor_scratch);
  const int candidates = floor.candidates;
  const bool listed = candidates <= cap;  // the same in every CTA of the row
  Cand* list = ws.lists + row * cap;
  if (listed) {
    const Key floor_key = bin_floor_key<Key>(floor.bin);
    const int lo = static_cast<int>(part * chunk);
    const int hi = static_cast<int>(min(n, part * chunk + chunk));
    for_each_tile<TIn, kVectorLoads, true>(row_x, lo, hi, [&](const C (&v)[Chunk::U][Chunk::V], int t0, int valid) {
      uint32_t take = 0;
#pragma unroll
      for (int u = 0; u < Chunk::U; ++u) {
#pragma unroll
        for (int j = 0; j < Chunk::V; ++j) {
          if (OrderKey<C>::of(v[u][j]) >= floor_key) take |= 1u << (u * Chunk::V + j);
        }
      }
      take &= in_range_mask<Chunk>(valid);
      append_selected<Ops>(list, &state.fill, take, [&](int b) { return Chunk::candidate(v, b, t0); });
    });
  }
  if (!took_last_ticket(&state.select_ticket, splits, &scratch.merges)) return;

  const RowStats<C> stats = merged_row_stats(ws.chunk_stats + row * splits, splits, scratch.stats);
  int count;
  if (listed) {
    for (int i = threadIdx.x; i < candidates; i += kBlockThreads) buf[i] = Ops::load_cg(list + i);
    __syncthreads();
    count = candidates;
    // Up to one candidate per thread, sorting them all beats selecting the k best first (64 x 151936 k50,
    // ~70 candidates: 51-52 us against 56-58 us). Beyond, selecting first wins: 8 x 262144 k1024 (~1600
    // candidates) took 48-52 us sorting all 2048 in registers, 43-46 us selecting 1024 first (H100,
    // *session9-c5-*).
    const bool sort_all = max(kWarpSize, next_pow2_device(count)) <= kBlockThreads;
    if (count > k && !sort_all) {
      const Cand kth = block_radix_threshold<Ops, Chunk::kSideList>(buf, count, k, scratch.select);
      count = block_compact<Ops>(buf, count, kth, scratch.select);
    }
  } else {
    RowStats<C> unused;
    Cand kth = Ops::none();
    count = Chunk::run(row_x, 0, static_cast<int>(n), k, buf, cap, scratch.select, unused, &kth);
  }
  write_sorted_topk<Ops>(buf, count, k, stats, renormalize, values + row * k, indices + row * k, scratch.sums);
}

template <typename TIn, typename TOut, bool kVectorLoads>
cudaError_t launch_split_hist_kernels(const TopkProblem& problem, const TopkPlan& plan, const TopkPointers& ptrs,
                                      cudaStream_t stream) {
  using C = compute_t<TIn>;
  using Cand = typename CandFor<C>::Type;
  const int k = static_cast<int>(problem.k);
  const int cap = static_cast<int>(candidate_capacity(problem.k));
  const size_t smem = static_cast<size_t>(cap) * sizeof(Cand);
  const int64_t chunk = split_hist_chunk_elems(problem.n, plan.splits);
  const int splits = static_cast<int>(split_hist_count(problem.n, plan.splits));
  const SplitHistWorkspaceLayout layout =
      split_hist_workspace_layout(problem.in_dtype, problem.rows, problem.n, problem.k, plan.splits);
  auto* base = static_cast<unsigned char*>(ptrs.workspace);
  SplitHistWorkspace<C> ws;
  ws.states = reinterpret_cast<SplitHistRowState*>(base);
  ws.hist = reinterpret_cast<int*>(base + layout.hist_offset);
  ws.chunk_stats = reinterpret_cast<RowStats<C>*>(base + layout.chunk_stats_offset);
  ws.lists = reinterpret_cast<Cand*>(base + layout.list_offset);
  // Row states and histograms start at 0 (the workspace comes uninitialised from the caching allocator).
  static_assert(kSplitHistStateBytes % 16 == 0 && kHistBins * sizeof(int) % 16 == 0, "whole 16-byte words");
  const auto words = static_cast<int64_t>(layout.chunk_stats_offset / 16);
  cudaError_t err = launch_zero_words(reinterpret_cast<uint4*>(base), words, stream);
  if (err != cudaSuccess) return err;
  const auto* x = static_cast<const TIn*>(ptrs.x);
  const auto blocks = static_cast<unsigned>(problem.rows * splits);
  bool programmatic = false;
  err = query_programmatic_launch(&programmatic);
  if (err != cudaSuccess) return err;
  err = launch_dependent(programmatic, topk_hist_kernel<TIn, kVectorLoads>, blocks, 0, stream, x, problem.n, chunk,
                         splits, ws);
  if (err != cudaSuccess) return err;
  const auto select = topk_hist_select_kernel<TIn, TOut, kVectorLoads>;
  err = allow_dynamic_smem(select, smem);
  if (err != cudaSuccess) return err;
  return launch_dependent(programmatic, select, blocks, smem, stream, x, static_cast<TOut*>(ptrs.values), ptrs.indices,
                          problem.n, k, cap, chunk, splits, problem.renormalize, ws);
}

}  // namespace

cudaError_t launch_topk_split_hist(const TopkProblem& problem, const TopkPlan& plan, const TopkPointers& ptrs,
                                   cudaStream_t stream) {
  return dispatch_forward_instance(problem, plan, [&](auto in_tag, auto out_tag, auto vector_loads) {
    using TIn = typename decltype(in_tag)::type;
    using TOut = typename decltype(out_tag)::type;
    return launch_split_hist_kernels<TIn, TOut, decltype(vector_loads)::value>(problem, plan, ptrs, stream);
  });
}

}  // namespace softmax_ops::topk
