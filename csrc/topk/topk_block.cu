// fused_topk "block" (one CTA per row) and "split_row" (several CTAs per row + a merge kernel) kernels.
//
// Both run the same chunk producer over a range of a row, reading it once in tiles of kTileElems:
//   * every value folds into the thread's online (max, sum);
//   * a value joins the shared-memory candidate buffer only if it beats the running threshold: a float
//     compare first (!(x < t): NaN passes), then the exact key. Tiles are read in index order, so a later
//     value with the threshold's own key ranks below it (higher index) and is rejected;
//   * when the buffer could overflow on the next tile, a block radix select finds the k-th best candidate,
//     the buffer is compacted to the k best and the threshold rises to that candidate's key;
//   * the first tile gets a threshold at once: the k-th best of the per-thread maxima (k distinct values
//     reach it), so a row with small k never floods the buffer.
// Tile layout (T = kBlockThreads, V = 16-byte vector, U = kTileElems / (T*V) vectors per thread):
//   vector loads: thread t, step u, element j -> tile offset (u*T + t)*V + j
//   scalar loads: thread t, step u, element j -> tile offset (u*V + j)*T + t      (coalesced per scalar)
// block: the CTA then sorts its k candidates (bitonic) and writes probabilities and indices.
// split_row: each CTA writes its chunk's k best (unordered, padded with "none") and (max, sum) to a
// workspace; the merge kernel streams a row's candidates through the same buffer/threshold/compaction,
// merges the (max, sum) in chunk order (deterministic), sorts and writes.
#include "topk_device.cuh"
#include "topk_launch.h"

namespace softmax_ops::topk {
namespace {

template <typename TIn>
struct ChunkTopk {
  using C = compute_t<TIn>;
  using Ops = CandFor<C>;
  using Cand = typename Ops::Type;
  using Key = typename OrderKey<C>::Key;
  static constexpr int V = 16 / sizeof(TIn);
  static constexpr int U = kTileElems / (kBlockThreads * V);
  static_assert(U >= 1 && U * kBlockThreads * V == kTileElems, "tile must be a whole number of vectors");

  static __device__ __forceinline__ int tile_offset(bool vector_loads, int u, int j) {
    return vector_loads ? (u * kBlockThreads + static_cast<int>(threadIdx.x)) * V + j
                        : (u * V + j) * kBlockThreads + static_cast<int>(threadIdx.x);
  }

  // Values of the tile at x (pads at offsets >= valid are -inf). With vector loads, valid is a multiple of V.
  static __device__ __forceinline__ void load_tile(const TIn* x, int valid, bool vector_loads, C (&v)[U][V]) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (vector_loads) {
        const int off = tile_offset(true, u, 0);
        if (off < valid) {
          load_vec16<TIn, true>(x + off, v[u]);
        } else {
#pragma unroll
          for (int j = 0; j < V; ++j) v[u][j] = neg_inf<C>();
        }
      } else {
#pragma unroll
        for (int j = 0; j < V; ++j) {
          const int off = tile_offset(false, u, j);
          v[u][j] = off < valid ? load_scalar(x + off) : neg_inf<C>();
        }
      }
    }
  }

  // The top min(k, hi - lo) candidates of row x over [lo, hi) (unordered) into buf[0, count), and this
  // thread's (max, sum) over its share. Returns count. cap >= candidate_capacity(k). Positions are 32-bit
  // (the launcher limits rows to 2^31 - 1 elements); x is the row's first element.
  static __device__ int run(const TIn* __restrict__ x, int lo, int hi, int k, bool vector_loads, Cand* buf, int cap,
                            SelectScratch& s, RowStats<C>& stats) {
    static_assert(U * V <= 32, "one bit per value of a thread's tile");
    stats = empty_stats<C>();
    Key tau_key = 0;               // accept every value (every real key is > 0)
    C tau_value = quiet_nan<C>();  // !(x < NaN) holds for every x
    if (threadIdx.x == 0) s.count = 0;
    bool first = true;
    for (int64_t tile = lo; tile < hi; tile += kTileElems) {
      const int t0 = static_cast<int>(tile);
      const int valid = min(hi - t0, kTileElems);
      C v[U][V];
      load_tile(x + t0, valid, vector_loads, v);
#pragma unroll
      for (int u = 0; u < U; ++u) fold_stats(stats, v[u]);

      if (first) {
        // k distinct values reach the k-th best per-thread maximum: nothing below it can be in the top k.
        Cand mine = Ops::none();
#pragma unroll
        for (int u = 0; u < U; ++u) {
#pragma unroll
          for (int j = 0; j < V; ++j) {
            const int off = tile_offset(vector_loads, u, j);
            const Cand c = Ops::make(OrderKey<C>::of(v[u][j]), static_cast<uint32_t>(t0 + off));
            if (off < valid && Ops::better(c, mine)) mine = c;
          }
        }
        __syncthreads();  // s.count = 0 is visible; buf is free
        buf[threadIdx.x] = mine;
        __syncthreads();
        const Cand floor = k <= kBlockThreads ? block_radix_threshold<Ops>(buf, kBlockThreads, k, s) : Ops::none();
#pragma unroll
        for (int u = 0; u < U; ++u) {
#pragma unroll
          for (int j = 0; j < V; ++j) {
            const int off = tile_offset(vector_loads, u, j);
            const Cand c = Ops::make(OrderKey<C>::of(v[u][j]), static_cast<uint32_t>(t0 + off));
            warp_append<Ops>(buf, &s.count, off < valid && Ops::at_least(c, floor), c);
          }
        }
        tau_key = Ops::key(floor);
        tau_value = OrderKey<C>::value(tau_key);
        first = false;
      } else {
        // The common case once the threshold has risen: nothing passes, one vote per warp and tile.
        uint32_t take = 0;
#pragma unroll
        for (int u = 0; u < U; ++u) {
#pragma unroll
          for (int j = 0; j < V; ++j) {
            if (tile_offset(vector_loads, u, j) < valid && !(v[u][j] < tau_value) &&
                OrderKey<C>::of(v[u][j]) > tau_key) {
              take |= 1u << (u * V + j);
            }
          }
        }
        if (__any_sync(kFullMask, take != 0)) {
#pragma unroll
          for (int u = 0; u < U; ++u) {
#pragma unroll
            for (int j = 0; j < V; ++j) {
              const uint32_t index = static_cast<uint32_t>(t0 + tile_offset(vector_loads, u, j));
              warp_append<Ops>(buf, &s.count, (take >> (u * V + j)) & 1u, Ops::make(OrderKey<C>::of(v[u][j]), index));
            }
          }
        }
      }
      __syncthreads();
      const int count = s.count;
      if (count > cap - kTileElems) {
        const Cand kth = block_radix_threshold<Ops>(buf, count, k, s);
        block_compact<Ops>(buf, count, kth, s);
        tau_key = Ops::key(kth);
        tau_value = OrderKey<C>::value(tau_key);
      } else {
        __syncthreads();  // every thread has read s.count before the next tile appends
      }
    }
    __syncthreads();
    int count = s.count;
    if (count > k) {
      const Cand kth = block_radix_threshold<Ops>(buf, count, k, s);
      count = block_compact<Ops>(buf, count, kth, s);
    }
    return count;
  }
};

// Static shared memory of the block-family kernels (kept under kBlockStaticSmem).
template <typename C>
struct BlockScratch {
  SelectScratch select;
  RowStats<C> stats[kBlockThreads / kWarpSize];
  C sums[kBlockThreads / kWarpSize];
};

template <typename TIn, typename TOut>
__global__ void __launch_bounds__(kBlockThreads)
    topk_block_kernel(const TIn* __restrict__ x, TOut* __restrict__ values, int64_t* __restrict__ indices, int64_t n,
                      int k, int cap, bool renormalize, bool vector_loads) {
  using Chunk = ChunkTopk<TIn>;
  using C = typename Chunk::C;
  using Ops = typename Chunk::Ops;
  static_assert(sizeof(BlockScratch<C>) <= kBlockStaticSmem, "static shared memory over budget");
  extern __shared__ __align__(16) unsigned char smem_raw[];
  auto* buf = reinterpret_cast<typename Ops::Type*>(smem_raw);
  __shared__ BlockScratch<C> scratch;

  const int64_t row = blockIdx.x;
  RowStats<C> stats;
  const int count = Chunk::run(x + row * n, 0, static_cast<int>(n), k, vector_loads, buf, cap, scratch.select, stats);
  stats = block_merge_stats(stats, scratch.stats);
  write_sorted_topk<Ops>(buf, count, k, stats, renormalize, values + row * k, indices + row * k, scratch.sums);
}

// One CTA per (row, chunk): the chunk's k best (padded with none) and its (max, sum).
template <typename TIn>
__global__ void __launch_bounds__(kBlockThreads)
    topk_split_chunk_kernel(const TIn* __restrict__ x, int64_t n, int k, int cap, int64_t chunk, int splits,
                            bool vector_loads, typename ChunkTopk<TIn>::Cand* __restrict__ ws_cand,
                            RowStats<compute_t<TIn>>* __restrict__ ws_stats) {
  using Chunk = ChunkTopk<TIn>;
  using C = typename Chunk::C;
  using Ops = typename Chunk::Ops;
  static_assert(sizeof(BlockScratch<C>) <= kBlockStaticSmem, "static shared memory over budget");
  extern __shared__ __align__(16) unsigned char smem_raw[];
  auto* buf = reinterpret_cast<typename Ops::Type*>(smem_raw);
  __shared__ BlockScratch<C> scratch;

  const int64_t row = blockIdx.x / splits;
  const int64_t part = blockIdx.x % splits;
  const int64_t lo = part * chunk;
  const int64_t hi = min(n, lo + chunk);
  RowStats<C> stats;
  const int count = Chunk::run(x + row * n, static_cast<int>(lo), static_cast<int>(hi), k, vector_loads, buf, cap,
                               scratch.select, stats);
  stats = block_merge_stats(stats, scratch.stats);
  typename Ops::Type* out = ws_cand + (row * splits + part) * k;
  for (int r = threadIdx.x; r < k; r += blockDim.x) out[r] = r < count ? buf[r] : Ops::none();
  if (threadIdx.x == 0) ws_stats[row * splits + part] = stats;
}

// One CTA per row: merges the row's `splits` chunk results.
template <typename C, typename TOut>
__global__ void __launch_bounds__(kBlockThreads)
    topk_split_merge_kernel(const typename CandFor<C>::Type* __restrict__ ws_cand,
                            const RowStats<C>* __restrict__ ws_stats, int splits, int k, int cap, bool renormalize,
                            TOut* __restrict__ values, int64_t* __restrict__ indices) {
  using Ops = CandFor<C>;
  using Cand = typename Ops::Type;
  constexpr int kPerThread = kMergeChunk / kBlockThreads;
  static_assert(sizeof(BlockScratch<C>) <= kBlockStaticSmem, "static shared memory over budget");
  extern __shared__ __align__(16) unsigned char smem_raw[];
  auto* buf = reinterpret_cast<Cand*>(smem_raw);
  __shared__ BlockScratch<C> scratch;
  SelectScratch& s = scratch.select;

  const int64_t row = blockIdx.x;
  // (max, sum): thread t merges chunks t, t + T, ... in order, then the fixed block tree.
  RowStats<C> stats = empty_stats<C>();
  for (int part = threadIdx.x; part < splits; part += blockDim.x) stats = merge_stats(stats, ws_stats[row * splits + part]);
  stats = block_merge_stats(stats, scratch.stats);

  const int64_t total = static_cast<int64_t>(splits) * k;
  const Cand* src = ws_cand + row * total;
  Cand threshold = Ops::none();  // at_least(c, none) with better(c, none): every real candidate
  if (threadIdx.x == 0) s.count = 0;
  __syncthreads();
  for (int64_t base = 0; base < total; base += kMergeChunk) {
#pragma unroll
    for (int j = 0; j < kPerThread; ++j) {
      const int64_t i = base + j * kBlockThreads + threadIdx.x;
      const Cand c = i < total ? src[i] : Ops::none();
      warp_append<Ops>(buf, &s.count, Ops::better(c, Ops::none()) && Ops::at_least(c, threshold), c);
    }
    __syncthreads();
    const int count = s.count;
    if (count > cap - kMergeChunk) {
      threshold = block_radix_threshold<Ops>(buf, count, k, s);
      block_compact<Ops>(buf, count, threshold, s);
    } else {
      __syncthreads();
    }
  }
  __syncthreads();
  int count = s.count;
  if (count > k) {
    const Cand kth = block_radix_threshold<Ops>(buf, count, k, s);
    count = block_compact<Ops>(buf, count, kth, s);
  }
  write_sorted_topk<Ops>(buf, count, k, stats, renormalize, values + row * k, indices + row * k, scratch.sums);
}

template <typename TIn, typename TOut>
cudaError_t launch_block_kernels(const TopkProblem& problem, const TopkPlan& plan, const TopkPointers& ptrs,
                                 cudaStream_t stream) {
  using C = compute_t<TIn>;
  using Cand = typename CandFor<C>::Type;
  const int k = static_cast<int>(problem.k);
  const int cap = static_cast<int>(candidate_capacity(problem.k));
  const size_t smem = static_cast<size_t>(cap) * sizeof(Cand);
  const auto* x = static_cast<const TIn*>(ptrs.x);
  auto* values = static_cast<TOut*>(ptrs.values);
  if (plan.kernel == TopkKernel::kBlock) {
    cudaError_t err = allow_dynamic_smem(topk_block_kernel<TIn, TOut>, smem);
    if (err != cudaSuccess) return err;
    topk_block_kernel<TIn, TOut><<<static_cast<unsigned>(problem.rows), kBlockThreads, smem, stream>>>(
        x, values, ptrs.indices, problem.n, k, cap, problem.renormalize, plan.vector_loads);
    return cudaGetLastError();
  }
  const int64_t chunk = split_chunk_elems(problem.n, plan.splits);
  const int splits = static_cast<int>(split_count(problem.n, plan.splits));
  auto* ws_cand = static_cast<Cand*>(ptrs.workspace);
  auto* ws_stats = reinterpret_cast<RowStats<C>*>(ws_cand + problem.rows * splits * problem.k);
  cudaError_t err = allow_dynamic_smem(topk_split_chunk_kernel<TIn>, smem);
  if (err != cudaSuccess) return err;
  topk_split_chunk_kernel<TIn><<<static_cast<unsigned>(problem.rows * splits), kBlockThreads, smem, stream>>>(
      x, problem.n, k, cap, chunk, splits, plan.vector_loads, ws_cand, ws_stats);
  err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  err = allow_dynamic_smem(topk_split_merge_kernel<C, TOut>, smem);
  if (err != cudaSuccess) return err;
  topk_split_merge_kernel<C, TOut><<<static_cast<unsigned>(problem.rows), kBlockThreads, smem, stream>>>(
      ws_cand, ws_stats, splits, k, cap, problem.renormalize, values, ptrs.indices);
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_topk_block(const TopkProblem& problem, const TopkPlan& plan, const TopkPointers& ptrs,
                              cudaStream_t stream) {
  return dispatch_in_out(problem.in_dtype, problem.out_dtype, [&](auto in_tag, auto out_tag) {
    return launch_block_kernels<typename decltype(in_tag)::type, typename decltype(out_tag)::type>(problem, plan,
                                                                                                 ptrs, stream);
  });
}

}  // namespace softmax_ops::topk
