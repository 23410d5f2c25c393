// Per-row math shared by the CPU kernels: a branch-free float exp, float16/bfloat16 conversions, and row
// loops (reductions and element-wise maps) written on 16-float vectors.
//
// Why explicit vectors: GCC calls libm's exp per element (no vectors without -ffast-math), may not reorder a
// serial float sum, and did not vectorise the reductions reliably from plain loops (measured: a bfloat16 max
// loop stayed scalar). GCC/Clang vector extensions (`vector_size(64)`) are lowered to whatever the
// function's ISA offers: one AVX-512 register, two AVX2 registers or four SSE2 registers. Reductions keep 16
// independent partial results combined in a fixed order, so results are bit-reproducible run to run.
// float64 rows use plain scalar loops: float64 is supported for correctness, not speed.
#pragma once

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

// The row kernels are compiled three times (AVX-512, AVX2+FMA, baseline SSE2) and the loader picks the best
// one the CPU supports (GCC function multi-versioning), so the JIT build needs no -march flag and a cached
// .so stays valid on any x86-64. GCC < 12 lacks the x86-64-vN names; other compilers get the baseline.
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__) && __GNUC__ >= 12
#define SOFTMAX_OPS_CPU_MULTIVERSION __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#elif defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__)
#define SOFTMAX_OPS_CPU_MULTIVERSION __attribute__((target_clones("avx2", "default")))
#else
#define SOFTMAX_OPS_CPU_MULTIVERSION
#endif

// Every helper is force-inlined: a helper GCC leaves out of line is compiled for the baseline ISA only and
// loses the multiversioned caller's AVX2/AVX-512 (measured: bfloat16 softmax several times slower that way).
#define SOFTMAX_OPS_CPU_INLINE inline __attribute__((always_inline))

namespace softmax_ops::cpu {

// 16 floats: one AVX-512 register. GCC's note that passing such a vector changes the ABI without AVX-512
// (-Wpsabi) cannot matter here: every function taking one is force-inlined into its caller.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wpsabi"
#endif
using FloatVec = float __attribute__((vector_size(64)));
using UintVec = uint32_t __attribute__((vector_size(64)));
using Uint16Vec = uint16_t __attribute__((vector_size(32)));
using IntVec = int32_t __attribute__((vector_size(64)));  // what comparing two FloatVec gives (-1 / 0)
constexpr int64_t kVecWidth = 16;

// Is any lane of a comparison result true?
SOFTMAX_OPS_CPU_INLINE bool any_lane(IntVec mask) {
  uint64_t words[8];
  std::memcpy(words, &mask, sizeof(words));
  return ((words[0] | words[1]) | (words[2] | words[3])) | ((words[4] | words[5]) | (words[6] | words[7]));
}

// Accumulation type: float32 for float16/bfloat16/float32, float64 for float64.
template <typename T>
struct AccTypeOf {
  using type = float;
};
template <>
struct AccTypeOf<double> {
  using type = double;
};
template <typename T>
using acc_type = typename AccTypeOf<T>::type;

template <typename To, typename From>
SOFTMAX_OPS_CPU_INLINE To bit_cast_to(const From& from) {
  static_assert(sizeof(To) == sizeof(From), "bit cast between types of different sizes");
  To to;
  std::memcpy(&to, &from, sizeof(To));
  return to;
}

// The generic functions below run on F = float with U = uint32_t (scalar tails) or F = FloatVec with
// U = UintVec (vector bodies), so both give identical bits. `cond ? a : b` is an element-wise select on
// vectors; `F{} + c` broadcasts a constant.

// exp(x) in float32 within ~1 ulp, branch-free.
//  - range reduction: x = n*ln2 + r, |r| <= ln2/2, n rounded with the 1.5*2^23 trick (no float->int
//    conversion, which is undefined for NaN), ln2 split in two (Cody-Waite) so n*ln2_hi is exact;
//  - exp(r) = 1 + r + r^2 * P(r), P of degree 5 (the classic Cephes expf minimax coefficients);
//  - 2^n applied as two factors 2^a * 2^(n-a), a = round(n/2), so results in the subnormal range are
//    rounded once and correctly and large x overflow to +inf.
// Special values: -inf and x < -104 give exactly 0, +inf gives +inf, NaN gives NaN (the clamps compare
// with `<`/`>`, false for NaN, so NaN flows through the polynomial).
template <typename F, typename U>
SOFTMAX_OPS_CPU_INLINE F exp_generic(F x) {
  constexpr float kLog2e = 1.44269504088896341f;
  constexpr float kLn2Hi = 0.693359375f;      // 8 significant bits: n * kLn2Hi is exact for |n| <= 2^15
  constexpr float kLn2Lo = -2.12194440e-4f;   // ln2 - kLn2Hi
  constexpr float kRoundMagic = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer in the low bits
  const F lowest = F{} + -104.0f;             // exp(-104) < 2^-150 rounds to 0; keeps n >= -150
  const F highest = F{} + 89.0f;              // exp(89) > FLT_MAX: still overflows to +inf below
  x = x < lowest ? lowest : x;
  x = x > highest ? highest : x;
  const F shifted = x * kLog2e + kRoundMagic;
  const F n = shifted - kRoundMagic;
  const F r = (x - n * kLn2Hi) - n * kLn2Lo;
  F p = F{} + 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * (r * r) + r + 1.0f;
  // Integer parts in two's complement via unsigned wrap-around: n in [-150, 129], a in [-75, 65].
  const U magic_bits = U{} + bit_cast_to<uint32_t>(kRoundMagic);
  const U n_int = bit_cast_to<U>(shifted) - magic_bits;
  const U a_int = bit_cast_to<U>(n * 0.5f + kRoundMagic) - magic_bits;
  const F scale_a = bit_cast_to<F>((a_int + 127u) << 23);
  const F scale_b = bit_cast_to<F>((n_int - a_int + 127u) << 23);
  return p * scale_a * scale_b;
}

// float16 bits (zero-extended in U) -> float32, exact: the classic bit-manipulation form.
template <typename F, typename U>
SOFTMAX_OPS_CPU_INLINE F float_from_half_bits(U h) {
  const U w = h << 16;
  const U sign = w & 0x80000000u;
  const U two_w = w + w;
  // Normal and inf/NaN: move the exponent into place and rescale by 2^-112 (exact).
  const F normal = bit_cast_to<F>((two_w >> 4) + (0xE0u << 23)) * 0x1.0p-112f;
  // Subnormal: the mantissa under a 2^-1 exponent, minus that 0.5 (exact).
  const F subnormal = bit_cast_to<F>((two_w >> 17) | (126u << 23)) - 0.5f;
  const U magnitude = two_w < (1u << 27) ? bit_cast_to<U>(subnormal) : bit_cast_to<U>(normal);
  return bit_cast_to<F>(sign | magnitude);
}

// float32 -> float16 bits (in the low half of U), round to nearest even, overflow to inf, NaN kept.
template <typename F, typename U>
SOFTMAX_OPS_CPU_INLINE U half_bits_from_float(F f) {
  const U w = bit_cast_to<U>(f);
  const U shl1_w = w + w;
  const U sign = w & 0x80000000u;
  // Scaling up then down lets the FPU do the rounding to 10 mantissa bits (and the overflow to inf).
  F base = (bit_cast_to<F>(w & 0x7FFFFFFFu) * 0x1.0p+112f) * 0x1.0p-110f;
  U bias = shl1_w & 0xFF000000u;
  bias = bias < 0x71000000u ? U{} + 0x71000000u : bias;
  base = bit_cast_to<F>((bias >> 1) + 0x07800000u) + base;
  const U bits = bit_cast_to<U>(base);
  const U nonsign = ((bits >> 13) & 0x00007C00u) + (bits & 0x00000FFFu);
  return (sign >> 16) | (shl1_w > 0xFF000000u ? U{} + 0x7E00u : nonsign);
}

// float32 -> bfloat16 bits (in the low half of U), round to nearest even, NaN kept quiet.
template <typename F, typename U>
SOFTMAX_OPS_CPU_INLINE U bfloat16_bits_from_float(F f) {
  const U w = bit_cast_to<U>(f);
  const U rounded = (w + 0x7FFFu + ((w >> 16) & 1u)) >> 16;
  return f != f ? U{} + 0x7FC0u : rounded;
}

SOFTMAX_OPS_CPU_INLINE float fast_exp(float x) { return exp_generic<float, uint32_t>(x); }
SOFTMAX_OPS_CPU_INLINE FloatVec fast_exp(FloatVec x) { return exp_generic<FloatVec, UintVec>(x); }
SOFTMAX_OPS_CPU_INLINE double fast_exp(double x) { return std::exp(x); }

// Element -> accumulation type.
template <typename Acc, typename T>
SOFTMAX_OPS_CPU_INLINE Acc to_acc(T v) {
  if constexpr (std::is_same_v<T, c10::Half>) {
    return float_from_half_bits<float, uint32_t>(v.x);
  } else if constexpr (std::is_same_v<T, c10::BFloat16>) {
    return bit_cast_to<float>(static_cast<uint32_t>(v.x) << 16);
  } else {
    return static_cast<Acc>(v);
  }
}

// Accumulation type -> element, rounded to nearest even.
template <typename Out, typename Acc>
SOFTMAX_OPS_CPU_INLINE Out from_acc(Acc v) {
  if constexpr (std::is_same_v<Out, c10::Half>) {
    return c10::Half(static_cast<uint16_t>(half_bits_from_float<float, uint32_t>(v)), c10::Half::from_bits());
  } else if constexpr (std::is_same_v<Out, c10::BFloat16>) {
    return c10::BFloat16(static_cast<uint16_t>(bfloat16_bits_from_float<float, uint32_t>(v)),
                         c10::BFloat16::from_bits());
  } else {
    return static_cast<Out>(v);
  }
}

// 16 consecutive elements as floats (unaligned).
template <typename T>
SOFTMAX_OPS_CPU_INLINE FloatVec load_vec(const T* p) {
  if constexpr (std::is_same_v<T, float>) {
    FloatVec v;
    std::memcpy(&v, p, sizeof(v));
    return v;
  } else {
    Uint16Vec h;
    std::memcpy(&h, p, sizeof(h));
    const UintVec wide = __builtin_convertvector(h, UintVec);
    if constexpr (std::is_same_v<T, c10::Half>) {
      return float_from_half_bits<FloatVec, UintVec>(wide);
    } else {
      return bit_cast_to<FloatVec>(wide << 16);
    }
  }
}

// 16 floats stored as consecutive elements of type T (unaligned), rounded to nearest even.
template <typename T>
SOFTMAX_OPS_CPU_INLINE void store_vec(T* p, FloatVec v) {
  if constexpr (std::is_same_v<T, float>) {
    std::memcpy(p, &v, sizeof(v));
  } else {
    UintVec bits;
    if constexpr (std::is_same_v<T, c10::Half>) {
      bits = half_bits_from_float<FloatVec, UintVec>(v);
    } else {
      bits = bfloat16_bits_from_float<FloatVec, UintVec>(v);
    }
    const Uint16Vec narrow = __builtin_convertvector(bits, Uint16Vec);
    std::memcpy(p, &narrow, sizeof(narrow));
  }
}

// y_i = f(x_i) in the accumulation type, for f a generic lambda accepting float, FloatVec or double.
template <typename T, typename Out, typename Fn>
SOFTMAX_OPS_CPU_INLINE void map_row(const T* __restrict x, Out* __restrict y, int64_t n, Fn&& f) {
  using Acc = acc_type<T>;
  int64_t i = 0;
  if constexpr (std::is_same_v<Acc, float>) {
    for (; i + kVecWidth <= n; i += kVecWidth) store_vec(y + i, f(load_vec(x + i)));
  }
  for (; i < n; ++i) y[i] = from_acc<Out>(f(to_acc<Acc>(x[i])));
}

// y_i = f(a_i, b_i) in the accumulation type.
template <typename T, typename Out, typename Fn>
SOFTMAX_OPS_CPU_INLINE void map_row2(const T* __restrict a, const T* __restrict b, Out* __restrict y, int64_t n,
                                     Fn&& f) {
  using Acc = acc_type<T>;
  int64_t i = 0;
  if constexpr (std::is_same_v<Acc, float>) {
    for (; i + kVecWidth <= n; i += kVecWidth) store_vec(y + i, f(load_vec(a + i), load_vec(b + i)));
  }
  for (; i < n; ++i) y[i] = from_acc<Out>(f(to_acc<Acc>(a[i]), to_acc<Acc>(b[i])));
}

// y_i = f(x_i) like map_row, returning sum_i y_i (summed before rounding to Out, in sum_row's order).
template <typename T, typename Out, typename Fn>
SOFTMAX_OPS_CPU_INLINE acc_type<T> map_row_and_sum(const T* __restrict x, Out* __restrict y, int64_t n, Fn&& f);

// Pairwise sum of the 16 vector lanes, then the scalar tail: a fixed order.
SOFTMAX_OPS_CPU_INLINE float sum_lanes(FloatVec v, float tail) {
  float lanes[kVecWidth];
  std::memcpy(lanes, &v, sizeof(v));
  for (int64_t width = kVecWidth / 2; width >= 1; width /= 2) {
    for (int64_t j = 0; j < width; ++j) lanes[j] += lanes[j + width];
  }
  return lanes[0] + tail;
}

// sum_i f(x_i) (or f(a_i, b_i)) in the accumulation type, 16 partial sums for float.
template <typename T, typename Fn>
SOFTMAX_OPS_CPU_INLINE acc_type<T> sum_row(const T* __restrict x, int64_t n, Fn&& f) {
  using Acc = acc_type<T>;
  int64_t i = 0;
  Acc tail = 0;
  if constexpr (std::is_same_v<Acc, float>) {
    FloatVec partial = FloatVec{};
    for (; i + kVecWidth <= n; i += kVecWidth) partial += f(load_vec(x + i));
    for (; i < n; ++i) tail += f(to_acc<Acc>(x[i]));
    return sum_lanes(partial, tail);
  } else {
    for (; i < n; ++i) tail += f(to_acc<Acc>(x[i]));
    return tail;
  }
}

template <typename T, typename Fn>
SOFTMAX_OPS_CPU_INLINE acc_type<T> sum_row2(const T* __restrict a, const T* __restrict b, int64_t n, Fn&& f) {
  using Acc = acc_type<T>;
  int64_t i = 0;
  Acc tail = 0;
  if constexpr (std::is_same_v<Acc, float>) {
    FloatVec partial = FloatVec{};
    for (; i + kVecWidth <= n; i += kVecWidth) partial += f(load_vec(a + i), load_vec(b + i));
    for (; i < n; ++i) tail += f(to_acc<Acc>(a[i]), to_acc<Acc>(b[i]));
    return sum_lanes(partial, tail);
  } else {
    for (; i < n; ++i) tail += f(to_acc<Acc>(a[i]), to_acc<Acc>(b[i]));
    return tail;
  }
}

template <typename T, typename Out, typename Fn>
SOFTMAX_OPS_CPU_INLINE acc_type<T> map_row_and_sum(const T* __restrict x, Out* __restrict y, int64_t n, Fn&& f) {
  using Acc = acc_type<T>;
  int64_t i = 0;
  Acc tail = 0;
  if constexpr (std::is_same_v<Acc, float>) {
    FloatVec partial = FloatVec{};
    for (; i + kVecWidth <= n; i += kVecWidth) {
      const FloatVec v = f(load_vec(x + i));
      store_vec(y + i, v);
      partial += v;
    }
    for (; i < n; ++i) {
      const Acc v = f(to_acc<Acc>(x[i]));
      y[i] = from_acc<Out>(v);
      tail += v;
    }
    return sum_lanes(partial, tail);
  } else {
    for (; i < n; ++i) {
      const Acc v = f(to_acc<Acc>(x[i]));
      y[i] = from_acc<Out>(v);
      tail += v;
    }
    return tail;
  }
}

// y_i *= s in place (y in the accumulation type).
template <typename Acc>
SOFTMAX_OPS_CPU_INLINE void scale_row(Acc* y, int64_t n, Acc s) {
  for (int64_t i = 0; i < n; ++i) y[i] *= s;
}

// max over the row. NaN is skipped here (`v > m` is false for NaN); a NaN anywhere still turns the row's
// sum of exp(x - max) into NaN, so the whole row comes out NaN exactly as in torch.
template <typename T>
SOFTMAX_OPS_CPU_INLINE acc_type<T> row_max(const T* __restrict x, int64_t n) {
  using Acc = acc_type<T>;
  constexpr Acc kNegInf = -std::numeric_limits<Acc>::infinity();
  Acc m = kNegInf;
  int64_t i = 0;
  if constexpr (std::is_same_v<Acc, float>) {
    FloatVec lanes = FloatVec{} + kNegInf;
    for (; i + kVecWidth <= n; i += kVecWidth) {
      const FloatVec v = load_vec(x + i);
      lanes = v > lanes ? v : lanes;
    }
    for (int64_t j = 0; j < kVecWidth; ++j) m = lanes[j] > m ? lanes[j] : m;
  }
  for (; i < n; ++i) {
    const Acc v = to_acc<Acc>(x[i]);
    m = v > m ? v : m;
  }
  return m;
}

// sum_i exp(x_i - m).
template <typename T>
SOFTMAX_OPS_CPU_INLINE acc_type<T> row_sum_exp(const T* __restrict x, acc_type<T> m, int64_t n) {
  return sum_row(x, n, [m](auto v) { return fast_exp(v - m); });
}

}  // namespace softmax_ops::cpu
