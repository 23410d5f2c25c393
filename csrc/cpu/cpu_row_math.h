// Per-row math shared by the CPU kernels: a vectorisable float exp and lane-parallel row reductions.
//
// Why not std::exp and a plain `sum += x` loop: GCC calls libm per element (no vectors without
// -ffast-math), and it may not reorder a serial float sum, so such a loop runs scalar. Here exp is a
// branch-free polynomial and every reduction keeps kLanes independent partial results, which GCC turns into
// vector registers at -O3 while staying IEEE (and deterministic: the combine order is fixed).
#pragma once

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

// The row kernels are compiled three times (AVX-512, AVX2+FMA, baseline SSE2) and the loader picks the best
// one the CPU supports (GCC function multi-versioning), so the JIT build needs no -march flag and the
// cached .so stays valid on any x86-64. GCC < 12 lacks the x86-64-vN names; other compilers get baseline.
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__) && __GNUC__ >= 12
#define SOFTMAX_OPS_CPU_MULTIVERSION __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#elif defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__)
#define SOFTMAX_OPS_CPU_MULTIVERSION __attribute__((target_clones("avx2", "default")))
#else
#define SOFTMAX_OPS_CPU_MULTIVERSION
#endif

namespace softmax_ops::cpu {

// Independent partial results per reduction: 16 floats = one AVX-512 or two AVX2 registers.
constexpr int64_t kLanes = 16;

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

inline float float_from_bits(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

inline uint32_t bits_of_float(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof(bits));
  return bits;
}

// float16 <-> float32 and bfloat16 <- float32 without branches. c10's conversions branch (NaN test, subnormal
// path) or use a scalar F16C intrinsic chosen at compile time, either of which keeps GCC from vectorising
// the row loops; these are the classic bit-manipulation forms, exact and round-to-nearest-even.
inline float float_from_half_bits(uint16_t h) {
  const uint32_t w = static_cast<uint32_t>(h) << 16;
  const uint32_t sign = w & 0x80000000u;
  const uint32_t two_w = w + w;
  // Normal and inf/NaN: move the exponent into place and rescale by 2^-112 (exact).
  const float normal = float_from_bits((two_w >> 4) + (0xE0u << 23)) * 0x1.0p-112f;
  // Subnormal: the mantissa under an exponent of 2^-1 magic, minus that magic (exact).
  const float subnormal = float_from_bits((two_w >> 17) | (126u << 23)) - 0.5f;
  const uint32_t magnitude = two_w < (1u << 27) ? bits_of_float(subnormal) : bits_of_float(normal);
  return float_from_bits(sign | magnitude);
}

inline uint16_t half_bits_from_float(float f) {
  const uint32_t w = bits_of_float(f);
  const uint32_t shl1_w = w + w;
  const uint32_t sign = w & 0x80000000u;
  // Scaling up then down lets the FPU do the rounding to 10 mantissa bits (and overflow to inf).
  float base = (std::fabs(f) * 0x1.0p+112f) * 0x1.0p-110f;
  uint32_t bias = shl1_w & 0xFF000000u;
  bias = bias < 0x71000000u ? 0x71000000u : bias;
  base = float_from_bits((bias >> 1) + 0x07800000u) + base;
  const uint32_t bits = bits_of_float(base);
  const uint32_t nonsign = ((bits >> 13) & 0x00007C00u) + (bits & 0x00000FFFu);
  return static_cast<uint16_t>((sign >> 16) | (shl1_w > 0xFF000000u ? 0x7E00u : nonsign));
}

inline uint16_t bfloat16_bits_from_float(float f) {
  const uint32_t w = bits_of_float(f);
  const uint32_t rounded = (w + 0x7FFFu + ((w >> 16) & 1u)) >> 16;
  return static_cast<uint16_t>(f != f ? 0x7FC0u : rounded);
}

// Element -> accumulation type.
template <typename Acc, typename T>
inline Acc to_acc(T v) {
  return static_cast<Acc>(v);
}
template <>
inline float to_acc<float, c10::Half>(c10::Half v) {
  return float_from_half_bits(v.x);
}
template <>
inline float to_acc<float, c10::BFloat16>(c10::BFloat16 v) {
  return float_from_bits(static_cast<uint32_t>(v.x) << 16);
}

// Accumulation type -> element, rounded to nearest even.
template <typename Out, typename Acc>
inline Out from_acc(Acc v) {
  return static_cast<Out>(v);
}
template <>
inline c10::Half from_acc<c10::Half, float>(float v) {
  return c10::Half(half_bits_from_float(v), c10::Half::from_bits());
}
template <>
inline c10::BFloat16 from_acc<c10::BFloat16, float>(float v) {
  return c10::BFloat16(bfloat16_bits_from_float(v), c10::BFloat16::from_bits());
}

// exp(x) in float32 within ~1 ulp, branch-free so loops calling it vectorise.
//  - range reduction: x = n*ln2 + r, |r| <= ln2/2, n rounded with the 1.5*2^23 trick (no float->int
//    conversion, which is undefined for NaN), ln2 split in two (Cody-Waite) so n*ln2_hi is exact;
//  - exp(r) = 1 + r + r^2 * P(r), P of degree 5 (the classic Cephes expf minimax coefficients);
//  - 2^n applied as two factors 2^(n/2) * 2^(n - n/2) so results down in the subnormal range are rounded
//    once and correctly, and large x overflow to +inf.
// Special values: -inf and x < -104 give exactly 0, +inf gives +inf, NaN gives NaN (the clamps below
// compare with `<`/`>`, which are false for NaN, so NaN flows through the polynomial).
inline float fast_exp(float x) {
  constexpr float kLog2e = 1.44269504088896341f;
  constexpr float kLn2Hi = 0.693359375f;     // 8 significant bits: n * kLn2Hi is exact for |n| <= 2^15
  constexpr float kLn2Lo = -2.12194440e-4f;  // ln2 - kLn2Hi
  constexpr float kRoundMagic = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer in the low bits
  x = x < -104.0f ? -104.0f : x;  // exp(-104) < 2^-150 rounds to 0; keeps n in range
  x = x > 89.0f ? 89.0f : x;      // exp(89) > FLT_MAX: still overflows to +inf below
  const float shifted = x * kLog2e + kRoundMagic;
  const float n = shifted - kRoundMagic;
  const int32_t n_int = static_cast<int32_t>(bits_of_float(shifted) - bits_of_float(kRoundMagic));
  float r = x - n * kLn2Hi;
  r = r - n * kLn2Lo;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * (r * r) + r + 1.0f;
  const int32_t half_n = n_int >> 1;  // n in [-150, 129]: both halves are normal exponents
  const float scale_a = float_from_bits(static_cast<uint32_t>(half_n + 127) << 23);
  const float scale_b = float_from_bits(static_cast<uint32_t>(n_int - half_n + 127) << 23);
  return p * scale_a * scale_b;
}

// float64 is supported for correctness, not speed: libm's exp.
inline double fast_exp(double x) { return std::exp(x); }

// max over the row. NaN is skipped here (`v > m` is false for NaN); a NaN anywhere still turns the row's
// sum of exp(x - max) into NaN, so the whole row comes out NaN exactly as in torch.
template <typename Acc, typename T>
inline Acc row_max(const T* __restrict x, int64_t n) {
  constexpr Acc kNegInf = -std::numeric_limits<Acc>::infinity();
  Acc lanes[kLanes];
  for (int64_t j = 0; j < kLanes; ++j) lanes[j] = kNegInf;
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int64_t j = 0; j < kLanes; ++j) {
      const Acc v = to_acc<Acc>(x[i + j]);
      lanes[j] = v > lanes[j] ? v : lanes[j];
    }
  }
  Acc m = kNegInf;
  for (; i < n; ++i) {
    const Acc v = to_acc<Acc>(x[i]);
    m = v > m ? v : m;
  }
  for (int64_t j = 0; j < kLanes; ++j) m = lanes[j] > m ? lanes[j] : m;
  return m;
}

// Pairwise sum of the lane partials plus the tail: a fixed order, so results are bit-reproducible.
template <typename Acc>
inline Acc combine_lanes(Acc* lanes, Acc tail) {
  for (int64_t width = kLanes / 2; width >= 1; width /= 2) {
    for (int64_t j = 0; j < width; ++j) lanes[j] += lanes[j + width];
  }
  return lanes[0] + tail;
}

// sum_i exp(x_i - m); with kStore also writes exp(x_i - m) to e (e may alias x only when T == Acc).
template <bool kStore, typename Acc, typename T>
inline Acc row_sum_exp(const T* x, Acc m, int64_t n, Acc* e) {
  Acc lanes[kLanes];
  for (int64_t j = 0; j < kLanes; ++j) lanes[j] = 0;
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int64_t j = 0; j < kLanes; ++j) {
      const Acc v = fast_exp(to_acc<Acc>(x[i + j]) - m);
      if constexpr (kStore) e[i + j] = v;
      lanes[j] += v;
    }
  }
  Acc tail = 0;
  for (; i < n; ++i) {
    const Acc v = fast_exp(to_acc<Acc>(x[i]) - m);
    if constexpr (kStore) e[i] = v;
    tail += v;
  }
  return combine_lanes(lanes, tail);
}

// sum_i a_i * b_i (kProduct) or sum_i a_i (!kProduct), lane-parallel.
template <bool kProduct, typename Acc, typename T>
inline Acc row_dot(const T* __restrict a, const T* __restrict b, int64_t n) {
  Acc lanes[kLanes];
  for (int64_t j = 0; j < kLanes; ++j) lanes[j] = 0;
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int64_t j = 0; j < kLanes; ++j) {
      const Acc v = to_acc<Acc>(a[i + j]);
      lanes[j] += kProduct ? v * to_acc<Acc>(b[i + j]) : v;
    }
  }
  Acc tail = 0;
  for (; i < n; ++i) {
    const Acc v = to_acc<Acc>(a[i]);
    tail += kProduct ? v * to_acc<Acc>(b[i]) : v;
  }
  return combine_lanes(lanes, tail);
}

}  // namespace softmax_ops::cpu
