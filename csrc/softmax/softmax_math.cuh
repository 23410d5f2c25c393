// The math of the softmax family, separated from memory access (OneFlow's functor idea): every kernel
// body in the kernel headers (softmax_*_kernel*.cuh) is written once against this "row op" interface and
// instantiated for forward (softmax / log_softmax) and backward (softmax_backward / log_softmax_backward).
//
// A row op provides:
//   In, Out, C (compute type), kStreams (input arrays per element: 1 forward, 2 backward), Acc (the
//   reduction state), Row (per-row constants), pad(stream) (a value that leaves Acc unchanged),
//   identity(), accumulate(acc, visit) (fold the values `visit` yields into acc), merge(a, b) (associative,
//   commutative: every reduction below uses a fixed order, so results are bitwise reproducible),
//   finalize(acc) -> Row, apply(row, v[kStreams]) -> Out, and apply_as<kLog>(row, v), apply with the mode
//   (the op's run-time `log`) fixed at compile time (with_fixed_mode, below).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "softmax_ops/device_utils.cuh"

namespace softmax_ops::detail {

// Exponentials relative to a row maximum m: exp_from(x, m) = exp(x - m), log_sum(sum) = log(sum).
// float: exp(d) = 2^(d * log2 e) with d = x - m (rounded once, as torch's expf(x - max)): FADD + FMUL +
// MUFU.EX2. The product's rounding is relative to |d * log2 e|, so it stays below 1e-7 relative for the
// large probabilities that dominate the error (d in [-3, 0]); for small ones it is tiny in absolute terms.
// (An earlier fma(x, log2e, -m * log2e) form saved the FADD but, once the compiler contracted m * log2e
// differently in two places, made fp32 errors 5-10x torch's.) At x == max the argument is exactly 0: a
// row's maximum contributes exactly 1, so a one-element row gives exactly 1 and 0, as torch.
// double: plain exp/log (fp64 math for fp64 inputs, DESIGN.md §3).
template <typename C>
struct ExpMath;

template <>
struct ExpMath<float> {
  static __device__ __forceinline__ float exp_from(float x, float m) {
    return ex2_approx(__fsub_rn(x, m) * kLog2e);
  }
  // log1pf is not replaced by an approximation under --use_fast_math (logf is); once per row.
  static __device__ __forceinline__ float log_sum(float sum) { return log1pf(sum - 1.0f); }
  static __device__ __forceinline__ float reciprocal(float d) { return __frcp_rn(d); }
  // exp(y) for any y (log_softmax_backward's exp(output)): the CUDA math library's expf, the function
  // torch's own kernel calls. It replaced a hand-made range-reduced ex2.approx + ldexpf (same speed on H200,
  // log_softmax_backward fp32 geomean 0.77 of copy). It did NOT fix a 3 x 1441793 row whose error is 5x
  // torch's (a strict xfail in tests/test_cuda_softmax.py: KNOWN_ACCURACY_GAPS).
  static __device__ __forceinline__ float exp(float y) { return expf(y); }
};

template <>
struct ExpMath<double> {
  static __device__ __forceinline__ double exp_from(double x, double m) { return ::exp(x - m); }
  static __device__ __forceinline__ double log_sum(double sum) { return ::log(sum); }
  static __device__ __forceinline__ double reciprocal(double d) { return __drcp_rn(d); }
  static __device__ __forceinline__ double exp(double y) { return ::exp(y); }
};

// NaN-propagating max: one max.NaN instruction for float (sm_80+), nan_max's compare-select otherwise.
__device__ __forceinline__ float row_max(float a, float b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  float r;
  asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
#else
  return nan_max(a, b);
#endif
}
__device__ __forceinline__ double row_max(double a, double b) { return nan_max(a, b); }

template <typename C>
__device__ __forceinline__ C negative_infinity() {
  return -static_cast<C>(INFINITY);
}

// Independent accumulator chains per thread in accumulate (see ForwardOp::accumulate). A kernel may ask
// for fewer where the extra live registers spill (softmax_block_kernel).
constexpr int kIlp = 4;

// Combines N (1, 2 or 4) accumulators pairwise, in a fixed order (bitwise reproducible).
template <int N, typename T, typename F>
__device__ __forceinline__ T reduce_ilp(const T (&parts)[N], F&& combine) {
  static_assert(N == 1 || N == 2 || N == 4, "1, 2 or 4 chains");
  if constexpr (N == 1) {
    return parts[0];
  } else if constexpr (N == 2) {
    return combine(parts[0], parts[1]);
  } else {
    return combine(combine(parts[0], parts[1]), combine(parts[2], parts[3]));
  }
}

// softmax / log_softmax forward. Acc is the online (max, sum) state: sum of exp(x - max).
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
    C inv_sum;
    C log_sum;
  };

  bool log;

  static __device__ __forceinline__ C pad(int) { return negative_infinity<C>(); }
  static __device__ __forceinline__ Acc identity() { return {negative_infinity<C>(), C(0)}; }
  // Whether accumulate reads stream s (see BackwardOp).
  __device__ __forceinline__ bool reduces_stream(int) const { return true; }

  // Folds a chunk into the running state with one exponential per element plus one per chunk (the
  // rescale of the running sum), never three per element as a per-element online update would.
  // `visit(f)` calls f(const C* v, int j) for every element of the chunk, j being the element's place in
  // its pack (a compile-time constant once unrolled): element j feeds accumulator j % Chains, so the max
  // and the sum run as Chains independent chains. One chain made a thread with 64 cached values wait ~4
  // cycles per element (Nsight Compute, H200: 5.6 cycles per issued instruction, a 16 KB-per-CTA kernel 8 us).
  template <int Chains = kIlp, typename Visit>
  __device__ __forceinline__ Acc accumulate(Acc acc, Visit&& visit) const {
    C maxes[Chains];
#pragma unroll
    for (int i = 0; i < Chains; ++i) maxes[i] = negative_infinity<C>();
    visit([&](const C* v, int j) { maxes[j % Chains] = row_max(maxes[j % Chains], v[0]); });
    const C chunk_max = reduce_ilp(maxes, [](C a, C b) { return row_max(a, b); });
    // All -inf (or padding): nothing to add. A NaN compares false and goes on to poison the sum.
    if (chunk_max == negative_infinity<C>()) return acc;
    const C m = nan_max(acc.max, chunk_max);
    // The chunk is summed on its own first: a long row then adds one chunk sum at a time to the running
    // sum, not thousands of terms far below its ulp (which would be lost, biasing the sum low).
    C sums[Chains] = {};
    visit([&](const C* v, int j) { sums[j % Chains] += Exp::exp_from(v[0], m); });
    const C chunk_sum = reduce_ilp(sums, [](C a, C b) { return a + b; });
    // exp(-inf) = 0 covers the empty running state; the factor is exactly 1 when the max did not move.
    return {m, acc.sum * Exp::exp_from(acc.max, m) + chunk_sum};
  }

  static __device__ __forceinline__ Acc merge(Acc a, Acc b) {
    const C m = nan_max(a.max, b.max);
    // An empty side (sum 0, max -inf) contributes 0 even when the other max is -inf too (no inf - inf).
    const C sa = a.sum == C(0) ? C(0) : a.sum * Exp::exp_from(a.max, m);
    const C sb = b.sum == C(0) ? C(0) : b.sum * Exp::exp_from(b.max, m);
    return {m, sa + sb};
  }

  // An all -inf row ends as (-inf, 0): 1/0 = inf and exp(-inf - -inf) = NaN give NaN, which is torch's
  // answer. A NaN or +inf anywhere makes the sum NaN, and so every output (torch's answer too).
  __device__ __forceinline__ Row finalize(Acc acc) const {
    Row row;
    row.max = acc.max;
    row.inv_sum = Exp::reciprocal(acc.sum);
    row.log_sum = log ? Exp::log_sum(acc.sum) : C(0);
    return row;
  }

  // kLog: log_softmax (else softmax), fixed at compile time (with_fixed_mode); apply() reads the run-time flag.
  template <bool kLog>
  static __device__ __forceinline__ C result(const Row& row, const C* v) {
    // Same association as torch's epilogues: exp(x - max) * (1 / sum) and (x - max) - log(sum).
    return kLog ? (v[0] - row.max) - row.log_sum : Exp::exp_from(v[0], row.max) * row.inv_sum;
  }
  template <bool kLog>
  __device__ __forceinline__ Out apply_as(const Row& row, const C* v) const {
    return convert<Out>(result<kLog>(row, v));
  }
  // One conversion after the select: converting in each arm gave the 8-pack bfloat16 block instance 16 bytes of
  // stack (nvcc 13.0, sm_90).
  __device__ __forceinline__ Out apply(const Row& row, const C* v) const {
    return convert<Out>(log ? result<true>(row, v) : result<false>(row, v));
  }
};

// softmax_backward / log_softmax_backward. Streams: v[0] = grad_output, v[1] = output.
//   softmax:     grad_input = y * (g - sum(g * y))
//   log_softmax: grad_input = g - exp(y) * sum(g)
// The sum is accumulated in double for float inputs: log_softmax_backward multiplies it by exp(y), so its
// error reaches the result amplified by up to |sum(g)| ~ sqrt(n); an fp32 sum of 1e5 terms is only as good as
// torch's own, which made "within 2x of torch's error" a coin toss per input (measured on H200, n = 45052 /
// 100003; float chains of ~11 terms per thread, then double, still gave 3.5e-6 against torch's 1.0e-6 at
// n = 45052). 16-bit inputs sum in float within one call of accumulate (a thread's cache or one streaming
// step) and in double across calls: a 16-bit value, and g * y of two, is exact in float, and a conversion to
// or from double runs at 16 per clock per SM on Hopper, as slow as an exponential; one per element (two for
// softmax_backward) made the 16-bit backward instruction-bound (H200, 2026-11-22, A/B: softmax_backward 16-bit
// block shapes +0.03..+0.07 of copy).
template <typename In_, typename Out_>
struct BackwardOp {
  using In = In_;
  using Out = Out_;
  using C = compute_t<In>;
  using Exp = ExpMath<C>;
  static constexpr int kStreams = 2;
  using Acc = double;
  struct Row {
    C sum;
  };

  bool log;

  static __device__ __forceinline__ C pad(int) { return C(0); }
  static __device__ __forceinline__ Acc identity() { return 0.0; }
  // Whether accumulate reads stream s: log_softmax_backward's sum is over grad_output alone, so a pass that
  // only reduces (the streaming kernels' first pass) need not load the output stream.
  __device__ __forceinline__ bool reduces_stream(int s) const { return s == 0 || !log; }

  template <int Chains = kIlp, typename Visit>
  __device__ __forceinline__ Acc accumulate(Acc acc, Visit&& visit) const {
    // Chain type: float for 16-bit inputs, double otherwise (see above).
    using Chain = std::conditional_t<sizeof(In) == 2, float, double>;
    Chain sums[Chains] = {};  // independent chains, see ForwardOp::accumulate
    if (log) {
      visit([&](const C* v, int j) { sums[j % Chains] += static_cast<Chain>(v[0]); });
    } else {
      visit([&](const C* v, int j) {
        sums[j % Chains] = fma(static_cast<Chain>(v[0]), static_cast<Chain>(v[1]), sums[j % Chains]);
      });
    }
    double total = acc;
#pragma unroll
    for (int i = 0; i < Chains; ++i) total += static_cast<double>(sums[i]);
    return total;
  }

  static __device__ __forceinline__ Acc merge(Acc a, Acc b) { return a + b; }
  __device__ __forceinline__ Row finalize(Acc acc) const { return {static_cast<C>(acc)}; }

  // kLog: log_softmax_backward (else softmax_backward), fixed at compile time (with_fixed_mode).
  template <bool kLog>
  static __device__ __forceinline__ C result(const Row& row, const C* v) {
    return kLog ? v[0] - exp_of_output(v[1]) * row.sum : v[1] * (v[0] - row.sum);
  }
  template <bool kLog>
  __device__ __forceinline__ Out apply_as(const Row& row, const C* v) const {
    return convert<Out>(result<kLog>(row, v));
  }
  __device__ __forceinline__ Out apply(const Row& row, const C* v) const {
    return convert<Out>(log ? result<true>(row, v) : result<false>(row, v));
  }

  // exp(output) of log_softmax_backward. A 16-bit result is rounded to 2^-11 relative or coarser, so the
  // bare MUFU.EX2 (relative error ~|y| * 6e-8 from rounding y * log2 e, plus 2 ulp of float) is far below
  // it; a full-range exp (range reduction and scaling: ~12 more instructions per element when measured with
  // the earlier hand-made form) made this op instruction-bound at 16 bits (0.53-0.68 of copy bandwidth on
  // H200 against 0.87 for softmax_backward).
  // ex2.approx gives 0 for -inf and large negative y, inf for large y, and NaN for NaN, like exp.
  static __device__ __forceinline__ C exp_of_output(C y) {
    if constexpr (sizeof(Out) == 2) {
      return ex2_approx(y * kLog2e);
    } else {
      return Exp::exp(y);
    }
  }
};

// ---- the op's mode fixed at compile time -------------------------------------------------------------

// `op` with its mode (softmax or log_softmax, forward or backward) a compile-time constant: apply() is that
// mode's formula alone. The warp kernel's output loop (not its lane-pair one) and the lean backward instance's run
// as with_fixed_mode(op, [&](const auto& fixed) { ... fixed.apply(row, v) ... }), the loop compiled once per mode
// behind one uniform branch; the other kernels' loops still call op.apply (in the main block kernel the two copies
// gave 64-register instances 8-24 bytes more spill). With the run-time flag inside the loop, nvcc issued both
// formulas for every element, one predicated off (the 16-bit warp kernel's softmax_backward: 7.5 instructions per
// element where its own formula needs 4.5, log_softmax_backward's exponential included), or branched around the
// other formula element by element (float32), which leaves nothing to interleave. Nsight Compute had put the warp
// and lean kernels 12-40% behind torch.compile's on 128 x 1024, 1000 x 1000 and 2048 x 1024 backward (H100,
// session 36); this and load_vec_or took 2-10% off (notes-softmax-tuning.md).
template <typename Op, bool kLog>
struct FixedMode {
  const Op& op;
  __device__ __forceinline__ typename Op::Out apply(const typename Op::Row& row, const typename Op::C* v) const {
    return op.template apply_as<kLog>(row, v);
  }
};

template <typename Op, typename F>
__device__ __forceinline__ void with_fixed_mode(const Op& op, F&& fn) {
  if (op.log) {
    fn(FixedMode<Op, true>{op});
  } else {
    fn(FixedMode<Op, false>{op});
  }
}

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

// The same butterfly for one float or double and any commutative `combine` (max or sum of the exp-once
// kernels): both lanes of a pair compute combine(a, b) and combine(b, a), bitwise equal for max and +.
template <typename C, typename Combine>
__device__ __forceinline__ C warp_all_reduce_with(C v, int width, Combine&& combine) {
  for (int offset = width / 2; offset > 0; offset /= 2) v = combine(v, __shfl_xor_sync(0xffffffffu, v, offset, width));
  return v;
}

// All-reduce over the CTA. `partials` holds 2 x 32 Acc in shared memory; `parity` alternates between
// consecutive calls, so one barrier per call suffices (a warp cannot reach the write of call i+2 before
// every warp has passed the barrier of call i+1, i.e. finished reading call i's buffer).
// Every warp merges the per-warp partials with the same butterfly (lane l reads partial l mod width), so
// every thread gets bitwise the same result in log2(warps) merges. Merging them one after another in
// every thread cost 15 dependent merges (two exponentials each) for 16 warps: ~19% of the stall samples
// of a 4 x 262144 fp16 grid_onepass launch (Nsight Compute, H200).
template <typename Op, typename Acc>
__device__ __forceinline__ Acc block_all_reduce(Acc acc, Acc (*partials)[kWarpSize], int parity) {
  const int lane = threadIdx.x % kWarpSize;
  const int warp = threadIdx.x / kWarpSize;
  const int num_warps = (blockDim.x + kWarpSize - 1) / kWarpSize;
  acc = warp_all_reduce<Op>(acc, kWarpSize);
  if (lane == 0) partials[parity][warp] = acc;
  __syncthreads();
  int width = 1;
  while (width < num_warps) width *= 2;
  const int slot = lane & (width - 1);
  const Acc mine = slot < num_warps ? partials[parity][slot] : Op::identity();
  return warp_all_reduce<Op>(mine, width);
}

}  // namespace softmax_ops::detail
