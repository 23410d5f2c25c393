// fused_topk device building blocks, part 3: exp and the online (max, sum) of a row with torch's NaN/inf
// rules: folding values, merging partial results (warp, block, chunks of a split row), the divisor.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "topk_elements.cuh"

namespace softmax_ops::topk {

// ---- exp and the online (max, sum) -------------------------------------------------------------------

using detail::ex2_approx;  // shared with the softmax family (device_utils.cuh)
using detail::kLog2e;

// exp(x - m) for the sums: the subtraction first (its rounding error scales with |x - m|, as in torch's
// exp(x - max)), then one MUFU.EX2 (~2 ulp). Results below 2^-126 flush to 0.
__device__ __forceinline__ float exp_shifted(float x, float m) { return ex2_approx((x - m) * kLog2e); }
__device__ __forceinline__ double exp_shifted(double x, double m) { return exp(x - m); }

// exp(x - m) for the k returned probabilities (and the backward's k fix-ups): libm accuracy.
__device__ __forceinline__ float exp_precise(float x) { return expf(x); }
__device__ __forceinline__ double exp_precise(double x) { return exp(x); }

// The factor exp(old_max - new_max) that rescales a partial sum to a new max. libm accuracy, unlike the
// per-element terms: a thread's partial sum is multiplied by ~10 such factors (rescales, the warp butterfly,
// the warp merges) on its way to the row total, so a systematic ~2 ulp bias of MUFU.EX2 would compound ~10x
// (the fp32 1024x50000 k50 accuracy failure, benchmarks/notes-topk-tuning.md section 5); one expf per
// rescale or merge costs ~6 instructions more and enters each partial sum once.
template <typename C>
__device__ __forceinline__ C rescale_factor(C old_max, C new_max) {
  return exp_precise(old_max - new_max);
}

// Running max and sum of exp(x - max). max == -inf means every value seen was -inf or NaN; then the sum
// holds 0, or NaN once a NaN was seen (NaN never becomes the max: fmax drops it, the sum keeps it).
// Torch's special values follow: a NaN or +inf in the row makes the sum NaN; an all -inf row is NaN
// (see probability_divisor); -inf entries contribute 0.
template <typename C>
struct RowStats {
  C max;
  C sum;
};

template <typename C>
__device__ __forceinline__ RowStats<C> empty_stats() {
  return {neg_inf<C>(), C(0)};
}

// Raises s.max to group_max (the max of values about to be added), rescaling the sum once.
template <typename C>
__device__ __forceinline__ void raise_max(RowStats<C>& s, C group_max) {
  if (group_max > s.max) {
    if (s.max != neg_inf<C>()) s.sum *= rescale_factor(s.max, group_max);
    s.max = group_max;
  }
}

// The shift for a group's terms: while the max is -inf every value so far is -inf or NaN, and exp(x - 0)
// gives 0 or NaN, never overflows.
template <typename C>
__device__ __forceinline__ C term_shift(const RowStats<C>& s) {
  return s.max == neg_inf<C>() ? C(0) : s.max;
}

// Folds V values (pads are -inf) with one exp each: max of the group first, then the sum.
template <typename C, int V>
__device__ __forceinline__ void fold_stats(RowStats<C>& s, const C (&x)[V]) {
  C group_max = x[0];
#pragma unroll
  for (int j = 1; j < V; ++j) group_max = fmax(group_max, x[j]);
  raise_max(s, group_max);
  const C shift = term_shift(s);
  C group_sum = C(0);  // see the U x V overload
#pragma unroll
  for (int j = 0; j < V; ++j) group_sum += exp_shifted(x[j], shift);
  s.sum += group_sum;
}

// Adds a U x V tile's terms exp(x - shift) to s (the shift already raised for them).
template <typename C, int U, int V>
__device__ __forceinline__ void add_terms(RowStats<C>& s, const C (&x)[U][V]) {
  const C shift = term_shift(s);
  // The tile is summed on its own first. Added one by one, terms far below the running sum's ulp were
  // rounded away, always downwards: a row with one dominant value (p_top = 0.81) lost 8.6e-7 of its sum in
  // fp32 (H200, 1024x50000 k50, benchmarks/diag_topk_accuracy.py), 3x torch's error.
  C tile_sum = C(0);
#pragma unroll
  for (int u = 0; u < U; ++u) {
#pragma unroll
    for (int j = 0; j < V; ++j) tile_sum += exp_shifted(x[u][j], shift);
  }
  s.sum += tile_sum;
}

// A whole U x V tile at once whose maximum (pads are -inf) the caller already has: one max check and at most
// one rescale per tile instead of one per vector.
template <typename C, int U, int V>
__device__ __forceinline__ void fold_stats(RowStats<C>& s, const C (&x)[U][V], C group_max) {
  raise_max(s, group_max);
  add_terms(s, x);
}

// A whole U x V tile at once: one max check and at most one rescale per tile instead of one per vector.
template <typename C, int U, int V>
__device__ __forceinline__ void fold_stats(RowStats<C>& s, const C (&x)[U][V]) {
  C group_max = x[0][0];
#pragma unroll
  for (int u = 0; u < U; ++u) {
#pragma unroll
    for (int j = 0; j < V; ++j) group_max = fmax(group_max, x[u][j]);
  }
  fold_stats(s, x, group_max);
}

// The online-softmax merge; a side whose max is -inf keeps its 0 (or NaN) unscaled.
template <typename C>
__device__ __forceinline__ RowStats<C> merge_stats(const RowStats<C>& a, const RowStats<C>& b) {
  const C m = fmax(a.max, b.max);
  const C sa = a.max == neg_inf<C>() ? a.sum : a.sum * rescale_factor(a.max, m);
  const C sb = b.max == neg_inf<C>() ? b.sum : b.sum * rescale_factor(b.max, m);
  return {m, sa + sb};
}

// A load through L2 only (another CTA of this launch wrote it).
template <typename C>
__device__ __forceinline__ RowStats<C> load_stats_cg(const RowStats<C>* p) {
  return {__ldcg(&p->max), __ldcg(&p->sum)};
}

// The divisor of the probabilities: the sum, or NaN for an all -inf row (torch: exp(-inf - -inf) = NaN).
template <typename C>
__device__ __forceinline__ C probability_divisor(const RowStats<C>& s) {
  return s.max == neg_inf<C>() ? quiet_nan<C>() : s.sum;
}

// Block-wide merge in a fixed order (deterministic); every thread gets the result. scratch >= 32 entries.
// The block's max first (no exp), then each thread's sum rescaled once to it (one expf) and added up: the tree
// of pairwise merges it replaces took two expf per level, ~24 per thread, on every row of the block kernels.
template <typename C>
__device__ __forceinline__ RowStats<C> block_merge_stats(RowStats<C> s, RowStats<C>* scratch) {
  const int lane = threadIdx.x % kWarpSize;
  const int warp = threadIdx.x / kWarpSize;
  const int num_warps = (blockDim.x + kWarpSize - 1) / kWarpSize;
  C m = s.max;
#pragma unroll
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) m = fmax(m, __shfl_xor_sync(kFullMask, m, offset));
  if (lane == 0) scratch[warp].max = m;
  __syncthreads();
  m = scratch[0].max;
  for (int w = 1; w < num_warps; ++w) m = fmax(m, scratch[w].max);
  // A side whose max is -inf keeps its 0 (or NaN) unscaled; +inf against +inf gives NaN, as torch does.
  C sum = s.max == neg_inf<C>() ? s.sum : s.sum * rescale_factor(s.max, m);
#pragma unroll
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) sum += __shfl_xor_sync(kFullMask, sum, offset);
  if (lane == 0) scratch[warp].sum = sum;  // lane 0's order: the same bits on every run
  __syncthreads();
  C total = scratch[0].sum;
  for (int w = 1; w < num_warps; ++w) total += scratch[w].sum;
  __syncthreads();
  return {m, total};
}

}  // namespace softmax_ops::topk
