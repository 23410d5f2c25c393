// fused_topk_backward kernels: the gradient of the k returned values w.r.t. the logits.
//   plain:        dx_j = p_j * (G_j - S), S = sum_m g_m v_m (v = the stored values), G_j = g_m where
//                 indices_m == j, else 0. p is recomputed from the logits: pass 1 (max, sum), pass 2 writes
//                 -p_j * S everywhere, then the k selected positions are overwritten with p_j * (g_m - S).
//   renormalised: dx_{i_m} = w_m * (g_m - sum_n g_n w_n) (w = the stored values), 0 elsewhere; the logits
//                 are never read.
// The logits are read at most twice (the second read is evict-first), the gradient written once (+ k
// fix-ups), and no probability tensor exists. Indices must be distinct (fused_topk's always are): each
// position is fixed up by the single CTA whose chunk holds it, after that CTA's own pass-2 writes (barrier).
// Out-of-range indices are skipped (checking them would need a device-to-host sync).
//   block: one CTA per row, both passes in one kernel (chunk = the row).
//   split: CTAs per (row, chunk): a stats kernel writes each chunk's (max, sum), the main kernel merges the
//          row's partials in chunk order (deterministic), then writes its chunk.
#include "topk_device.cuh"
#include "topk_launch.h"

namespace softmax_ops::topk {
namespace {

constexpr int kMaxBackwardThreads = 512;

template <typename T>
__device__ RowStats<compute_t<T>> chunk_stats(const T* __restrict__ xr, int64_t lo, int64_t hi, bool vector_loads) {
  using C = compute_t<T>;
  constexpr int V = 16 / sizeof(T);
  RowStats<C> stats = empty_stats<C>();
  if (vector_loads) {
    for (int64_t off = lo + static_cast<int64_t>(threadIdx.x) * V; off < hi; off += static_cast<int64_t>(blockDim.x) * V) {
      C v[V];
      load_vec16<T, false>(xr + off, v);
      fold_stats(stats, v);
    }
  } else {
    constexpr int kUnroll = 4;
    for (int64_t base = lo; base < hi; base += kUnroll * static_cast<int64_t>(blockDim.x)) {
      C v[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t i = base + u * static_cast<int64_t>(blockDim.x) + threadIdx.x;
        v[u] = i < hi ? load_scalar(xr + i) : neg_inf<C>();
      }
      fold_stats(stats, v);
    }
  }
  return stats;
}

template <typename T>
__global__ void __launch_bounds__(kMaxBackwardThreads)
    topk_backward_stats_kernel(const T* __restrict__ x, int64_t n, int64_t chunk, int splits, bool vector_loads,
                               RowStats<compute_t<T>>* __restrict__ partial) {
  using C = compute_t<T>;
  __shared__ RowStats<C> scratch[kMaxBackwardThreads / kWarpSize];
  const int64_t row = blockIdx.x / splits;
  const int64_t part = blockIdx.x % splits;
  const int64_t lo = part * chunk;
  const int64_t hi = min(n, lo + chunk);
  const RowStats<C> stats = block_merge_stats(chunk_stats(x + row * n, lo, hi, vector_loads), scratch);
  if (threadIdx.x == 0) partial[row * splits + part] = stats;
}

// partial == nullptr: the CTA owns the whole row (splits == 1) and computes the statistics itself.
template <typename T>
__global__ void __launch_bounds__(kMaxBackwardThreads)
    topk_backward_kernel(const T* __restrict__ x, const compute_t<T>* __restrict__ grad,
                         const compute_t<T>* __restrict__ values, const int64_t* __restrict__ indices,
                         T* __restrict__ dx, int64_t n, int64_t k, int64_t chunk, int splits, bool renormalize,
                         bool vector_loads, const RowStats<compute_t<T>>* __restrict__ partial) {
  using C = compute_t<T>;
  constexpr int V = 16 / sizeof(T);
  __shared__ RowStats<C> stats_scratch[kMaxBackwardThreads / kWarpSize];
  __shared__ C sum_scratch[kMaxBackwardThreads / kWarpSize];
  const int64_t row = blockIdx.x / splits;
  const int64_t part = blockIdx.x % splits;
  const int64_t lo = part * chunk;
  const int64_t hi = min(n, lo + chunk);
  const C* g = grad + row * k;
  const C* v = values + row * k;
  const int64_t* idx = indices + row * k;
  const T* xr = x + row * n;
  T* dxr = dx + row * n;

  C local = C(0);
  for (int64_t m = threadIdx.x; m < k; m += blockDim.x) local += g[m] * v[m];
  const C weighted = detail::block_all_reduce(local, sum_scratch, [](C a, C b) { return a + b; });

  RowStats<C> stats = empty_stats<C>();
  if (!renormalize) {
    if (partial != nullptr) {
      for (int p = threadIdx.x; p < splits; p += blockDim.x) stats = merge_stats(stats, partial[row * splits + p]);
    } else {
      stats = chunk_stats(xr, lo, hi, vector_loads);
    }
    stats = block_merge_stats(stats, stats_scratch);
  }
  const C divisor = probability_divisor(stats);
  const C inverse = C(1) / divisor;
  // Pass 2: -p_j * S everywhere (0 when renormalised).
  auto gradient = [&](C xv) { return renormalize ? C(0) : -(exp_shifted(xv, stats.max) * inverse) * weighted; };
  if (vector_loads) {
    for (int64_t off = lo + static_cast<int64_t>(threadIdx.x) * V; off < hi; off += static_cast<int64_t>(blockDim.x) * V) {
      C vals[V];
      if (renormalize) {
#pragma unroll
        for (int j = 0; j < V; ++j) vals[j] = C(0);
      } else {
        load_vec16<T, true>(xr + off, vals);
#pragma unroll
        for (int j = 0; j < V; ++j) vals[j] = gradient(vals[j]);
      }
      store_vec16(dxr + off, vals);
    }
  } else {
    for (int64_t i = lo + threadIdx.x; i < hi; i += blockDim.x) {
      store_scalar(dxr + i, renormalize ? C(0) : gradient(load_scalar(xr + i)));
    }
  }
  __syncthreads();  // this CTA's pass-2 writes precede its fix-ups of the same positions
  for (int64_t m = threadIdx.x; m < k; m += blockDim.x) {
    const int64_t j = idx[m];
    if (j < lo || j >= hi) continue;
    const C factor = g[m] - weighted;
    const C p = renormalize ? v[m] : exp_precise(load_scalar(xr + j) - stats.max) / divisor;
    store_scalar(dxr + j, p * factor);
  }
}

}  // namespace

cudaError_t launch_topk_backward(const TopkBackwardProblem& problem, const TopkBackwardPlan& plan,
                                 const TopkBackwardPointers& ptrs, cudaStream_t stream) {
  if (plan.threads < kWarpSize || plan.threads > kMaxBackwardThreads) return cudaErrorInvalidValue;
  return dispatch_dtype(problem.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    using C = compute_t<T>;
    const bool split = plan.kernel == TopkBackwardKernel::kSplit;
    const int64_t chunk = split ? backward_chunk_elems(problem.n, plan.splits) : problem.n;
    const int splits = split ? static_cast<int>(backward_split_count(problem.n, plan.splits)) : 1;
    const auto* x = static_cast<const T*>(ptrs.x);
    const unsigned blocks = static_cast<unsigned>(problem.rows * splits);
    RowStats<C>* partial = nullptr;
    if (split && !problem.renormalize) {
      partial = static_cast<RowStats<C>*>(ptrs.workspace);
      topk_backward_stats_kernel<T><<<blocks, plan.threads, 0, stream>>>(x, problem.n, chunk, splits,
                                                                         plan.vector_loads, partial);
      const cudaError_t err = cudaGetLastError();
      if (err != cudaSuccess) return err;
    }
    topk_backward_kernel<T><<<blocks, plan.threads, 0, stream>>>(
        x, static_cast<const C*>(ptrs.grad), static_cast<const C*>(ptrs.values), ptrs.indices,
        static_cast<T*>(ptrs.dx), problem.n, problem.k, chunk, splits, problem.renormalize, plan.vector_loads,
        partial);
    return cudaGetLastError();
  });
}

}  // namespace softmax_ops::topk
