// The math of the softmax family, separated from memory access (OneFlow's functor idea): every kernel
// body in the softmax_*_kernel.cuh headers is written once against this "row op" interface and
// instantiated for forward (softmax / log_softmax) and backward (softmax_backward / log_softmax_backward).
//
// A row op provides:
//   In, Out, C (compute type), kStreams (input arrays per element: 1 forward, 2 backward), Acc (the
//   reduction state), Row (per-row constants), pad(stream) (a value that leaves Acc unchanged),
//   identity(), accumulate(acc, visit) (fold the values `visit` yields into acc), merge(a, b) (associative,
//   commutative: every reduction below uses a fixed order, so results are bitwise reproducible),
//   finalize(acc) -> Row, apply(row, v[kStreams]) -> Out.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "softmax_ops/device_utils.cuh"

namespace softmax_ops::detail {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

__device__ __forceinline__ float ex2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// Exponentials relative to a row maximum m, computed against a "base" exponent.
// float: base = m * log2(e) (rounded once, always by the same expression, so every partial sum of a row
// agrees on it) and exp(x - m) is 2^(fma(x, log2e, -base)): one FFMA + one MUFU per element (cheaper
// than __expf(x - m), which is FADD + FMUL + MUFU, and one rounding instead of two in the argument, i.e.
// torch's accuracy). The factor 2^(m*log2e - base) this introduces is common to every element and to the
// sum, so it cancels in softmax; log_softmax removes it exactly in log_sum (fma gives the residual).
// double: base = m, plain exp/log (fp64 math for fp64 inputs, DESIGN.md §3).
template <typename C>
struct ExpMath;

template <>
struct ExpMath<float> {
  static __device__ __forceinline__ float base_of(float m) { return m * kLog2e; }
  static __device__ __forceinline__ float exp_from(float x, float base) {
    return ex2_approx(fmaf(x, kLog2e, -base));
  }
  // Converts a sum taken against base `from` to base `to`.
  static __device__ __forceinline__ float rebase(float from, float to) { return ex2_approx(from - to); }
  // log of sum_i exp(x_i - m), given the sum against base: log1pf is not replaced by an approximation
  // under --use_fast_math (logf is), and runs once per row.
  static __device__ __forceinline__ float log_sum(float sum, float m, float base) {
    return log1pf(sum - 1.0f) - fmaf(m, kLog2e, -base) * kLn2;
  }
  static __device__ __forceinline__ float exp(float y) { return ex2_approx(y * kLog2e); }
  static __device__ __forceinline__ float reciprocal(float d) { return __frcp_rn(d); }
};

template <>
struct ExpMath<double> {
  static __device__ __forceinline__ double base_of(double m) { return m; }
  static __device__ __forceinline__ double exp_from(double x, double base) { return ::exp(x - base); }
  static __device__ __forceinline__ double rebase(double from, double to) { return ::exp(from - to); }
  static __device__ __forceinline__ double log_sum(double sum, double, double) { return ::log(sum); }
  static __device__ __forceinline__ double exp(double y) { return ::exp(y); }
  static __device__ __forceinline__ double reciprocal(double d) { return __drcp_rn(d); }
};

template <typename C>
__device__ __forceinline__ C negative_infinity() {
  return -static_cast<C>(INFINITY);
}

// softmax / log_softmax forward. Acc is the online (max, sum) state; sum is taken against base_of(max).
template <typename In_, typename Out_>
struct ForwardOp {
  using In = In_;
  using Out = Out_;
  using C = compute_t<In>;
  using Exp = ExpMath<C>;
  static constexpr int kStreams = 1;
  using Acc = MaxSum<C>;
  struct Row {
    C max;
    C base;
    C inv_sum;
    C log_sum;
  };

  bool log;

  static __device__ __forceinline__ C pad(int) { return negative_infinity<C>(); }
  static __device__ __forceinline__ Acc identity() { return {negative_infinity<C>(), C(0)}; }

  // Folds a chunk into the running state with one exponential per element plus one per chunk (the
  // rescale of the running sum), never three per element as a per-element online update would.
  // `visit(f)` calls f(const C* v) for every element of the chunk.
  template <typename Visit>
  __device__ __forceinline__ Acc accumulate(Acc acc, Visit&& visit) const {
    C chunk_max = negative_infinity<C>();
    visit([&](const C* v) { chunk_max = nan_max(chunk_max, v[0]); });
    // All -inf (or padding): nothing to add. A NaN compares false and goes on to poison the sum.
    if (chunk_max == negative_infinity<C>()) return acc;
    const C m = nan_max(acc.max, chunk_max);
    const C base = Exp::base_of(m);
    // exp2(-inf) = 0 covers the empty running state; the factor is exactly 1 when the max did not move.
    C sum = acc.sum * Exp::rebase(Exp::base_of(acc.max), base);
    visit([&](const C* v) { sum += Exp::exp_from(v[0], base); });
    return {m, sum};
  }

  static __device__ __forceinline__ Acc merge(Acc a, Acc b) {
    const C m = nan_max(a.max, b.max);
    const C base = Exp::base_of(m);
    // An empty side (sum 0, max -inf) contributes 0 even when the other max is -inf too (no inf - inf).
    const C sa = a.sum == C(0) ? C(0) : a.sum * Exp::rebase(Exp::base_of(a.max), base);
    const C sb = b.sum == C(0) ? C(0) : b.sum * Exp::rebase(Exp::base_of(b.max), base);
    return {m, sa + sb};
  }

  // An all -inf row ends as (-inf, 0): base -inf, 1/0 = inf and exp(-inf - -inf) = NaN give NaN, which is
  // torch's answer. A NaN or +inf anywhere makes the sum NaN, and so every output (torch's answer too).
  __device__ __forceinline__ Row finalize(Acc acc) const {
    Row row;
    row.max = acc.max;
    row.base = Exp::base_of(acc.max);
    row.inv_sum = Exp::reciprocal(acc.sum);
    row.log_sum = log ? Exp::log_sum(acc.sum, acc.max, row.base) : C(0);
    return row;
  }

  __device__ __forceinline__ Out apply(const Row& row, const C* v) const {
    // Same association as torch's epilogues: exp(x - max) * (1 / sum) and (x - max) - log(sum).
    const C y = log ? (v[0] - row.max) - row.log_sum : Exp::exp_from(v[0], row.base) * row.inv_sum;
    return convert<Out>(y);
  }
};

// softmax_backward / log_softmax_backward. Streams: v[0] = grad_output, v[1] = output.
//   softmax:     grad_input = y * (g - sum(g * y))
//   log_softmax: grad_input = g - exp(y) * sum(g)
template <typename In_, typename Out_>
struct BackwardOp {
  using In = In_;
  using Out = Out_;
  using C = compute_t<In>;
  using Exp = ExpMath<C>;
  static constexpr int kStreams = 2;
  using Acc = C;
  struct Row {
    C sum;
  };

  bool log;

  static __device__ __forceinline__ C pad(int) { return C(0); }
  static __device__ __forceinline__ Acc identity() { return C(0); }

  template <typename Visit>
  __device__ __forceinline__ Acc accumulate(Acc acc, Visit&& visit) const {
    if (log) {
      visit([&](const C* v) { acc += v[0]; });
    } else {
      visit([&](const C* v) { acc += v[0] * v[1]; });
    }
    return acc;
  }

  static __device__ __forceinline__ Acc merge(Acc a, Acc b) { return a + b; }
  __device__ __forceinline__ Row finalize(Acc acc) const { return {acc}; }

  __device__ __forceinline__ Out apply(const Row& row, const C* v) const {
    const C y = log ? v[0] - Exp::exp(v[1]) * row.sum : v[1] * (v[0] - row.sum);
    return convert<Out>(y);
  }
};

// ---- reductions of Acc (MaxSum<C> or C) -------------------------------------------------------------

template <typename C>
__device__ __forceinline__ C shfl_xor(C v, int offset, int width) {
  return __shfl_xor_sync(0xffffffffu, v, offset, width);
}
template <typename C>
__device__ __forceinline__ MaxSum<C> shfl_xor(MaxSum<C> v, int offset, int width) {
  return {__shfl_xor_sync(0xffffffffu, v.max, offset, width), __shfl_xor_sync(0xffffffffu, v.sum, offset, width)};
}

// All-reduce over groups of `width` consecutive lanes (a power of two, 1..32). Every lane of the warp
// must call it. Both lanes of a butterfly pair merge the same two values (merge is commutative), so every
// lane of a group ends with bitwise the same result.
template <typename Op, typename Acc>
__device__ __forceinline__ Acc warp_all_reduce(Acc acc, int width) {
  for (int offset = width / 2; offset > 0; offset /= 2) acc = Op::merge(acc, shfl_xor(acc, offset, width));
  return acc;
}

// All-reduce over the CTA. `partials` holds 2 x 32 Acc in shared memory; `parity` alternates between
// consecutive calls, so one barrier per call suffices (a warp cannot reach the write of call i+2 before
// every warp has passed the barrier of call i+1, i.e. finished reading call i's buffer).
template <typename Op, typename Acc>
__device__ __forceinline__ Acc block_all_reduce(Acc acc, Acc (*partials)[kWarpSize], int parity) {
  const int lane = threadIdx.x % kWarpSize;
  const int warp = threadIdx.x / kWarpSize;
  const int num_warps = (blockDim.x + kWarpSize - 1) / kWarpSize;
  acc = warp_all_reduce<Op>(acc, kWarpSize);
  if (lane == 0) partials[parity][warp] = acc;
  __syncthreads();
  Acc total = partials[parity][0];
  for (int w = 1; w < num_warps; ++w) total = Op::merge(total, partials[parity][w]);  // fixed order
  return total;
}

}  // namespace softmax_ops::detail
