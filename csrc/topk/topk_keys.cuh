// fused_topk device building blocks, part 2: order-preserving keys and (key, index) candidates.
//
// Ranking (a total order, so the k selected indices are always distinct and in range): NaN first (as in
// torch.topk), then larger logit first, equal logits (-0 == +0) to the lower index. Selection is by logit:
// softmax is monotone, so the k largest probabilities belong to the k best logits and only those k
// probabilities are ever computed.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "topk_elements.cuh"

namespace softmax_ops::topk {

// ---- order-preserving keys --------------------------------------------------------------------------

// key(a) > key(b) iff a ranks before b by value: NaN (any payload) above +inf, -0 == +0. Key 0 is never
// produced (it would be a negative NaN, which is canonicalised), so 0 serves as "no candidate".
template <typename C>
struct OrderKey;

template <>
struct OrderKey<float> {
  using Key = uint32_t;
  static __device__ __forceinline__ Key of(float v) {
    uint32_t bits = __float_as_uint(v);
    if ((bits & 0x7fffffffu) > 0x7f800000u) return 0xffffffffu;
    if (bits == 0x80000000u) bits = 0u;
    return (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
  }
  // Inverse of `of` (NaN keys give a NaN, -0 gives +0).
  static __device__ __forceinline__ float value(Key key) {
    return __uint_as_float((key & 0x80000000u) ? (key & 0x7fffffffu) : ~key);
  }
  // The key as an int64 whose signed order is the key order (for the radix path's sort).
  static __device__ __forceinline__ int64_t sortable(Key key) { return static_cast<int64_t>(key); }
  static __device__ __forceinline__ Key from_sortable(int64_t s) { return static_cast<Key>(s); }
};

template <>
struct OrderKey<double> {
  using Key = unsigned long long;
  static __device__ __forceinline__ Key of(double v) {
    Key bits = static_cast<Key>(__double_as_longlong(v));
    if ((bits & 0x7fffffffffffffffull) > 0x7ff0000000000000ull) return ~0ull;
    if (bits == 0x8000000000000000ull) bits = 0ull;
    return (bits & 0x8000000000000000ull) ? ~bits : (bits | 0x8000000000000000ull);
  }
  static __device__ __forceinline__ double value(Key key) {
    const Key bits = (key & 0x8000000000000000ull) ? (key & 0x7fffffffffffffffull) : ~key;
    return __longlong_as_double(static_cast<long long>(bits));
  }
  static __device__ __forceinline__ int64_t sortable(Key key) {
    return static_cast<int64_t>(key ^ 0x8000000000000000ull);
  }
  static __device__ __forceinline__ Key from_sortable(int64_t s) {
    return static_cast<Key>(s) ^ 0x8000000000000000ull;
  }
};

// ---- candidates: (key, index) ordered by key, then by the LOWER index ------------------------------
//
// Interface (both types): make, key, index, none (ranks below every real candidate), better (strict),
// at_least, shfl_xor, and the radix view: kDigits 8-bit digits, most significant first; a radix "prefix"
// is a candidate value whose digits beyond `depth` are zero.

// float compute: one 64-bit word, key in the high half, ~index in the low half: one unsigned compare.
struct PackedCand {
  using Type = unsigned long long;
  using Key = uint32_t;
  static constexpr int kDigits = 8;
  static __device__ __forceinline__ Type make(Key key, uint32_t index) {
    return (static_cast<Type>(key) << 32) | static_cast<Type>(~index);
  }
  static __device__ __forceinline__ Key key(Type c) { return static_cast<Key>(c >> 32); }
  static __device__ __forceinline__ uint32_t index(Type c) { return ~static_cast<uint32_t>(c); }
  static __device__ __forceinline__ Type none() { return 0ull; }
  // A load through L2 only (another CTA of this launch wrote it).
  static __device__ __forceinline__ Type load_cg(const Type* p) { return __ldcg(p); }
  static __device__ __forceinline__ bool better(Type a, Type b) { return a > b; }
  static __device__ __forceinline__ bool at_least(Type a, Type b) { return a >= b; }
  static __device__ __forceinline__ Type shfl_xor(Type c, int lane_mask, int width) {
    return __shfl_xor_sync(kFullMask, c, lane_mask, width);
  }
  static __device__ __forceinline__ int digit(Type c, int d) { return static_cast<int>((c >> (56 - 8 * d)) & 0xffu); }
  static __device__ __forceinline__ bool prefix_matches(Type c, Type prefix, int depth) {
    return depth == 0 || ((c ^ prefix) >> (64 - 8 * depth)) == 0;
  }
  static __device__ __forceinline__ Type with_digit(Type prefix, int d, int digit) {
    return prefix | (static_cast<Type>(digit) << (56 - 8 * d));
  }
};

// float64 compute: 64-bit key + ~index (12 digits).
struct WideCand {
  struct Type {
    unsigned long long key;
    uint32_t nidx;  // ~index
  };
  using Key = unsigned long long;
  static constexpr int kDigits = 12;
  static __device__ __forceinline__ Type make(Key key, uint32_t index) { return {key, ~index}; }
  static __device__ __forceinline__ Key key(const Type& c) { return c.key; }
  static __device__ __forceinline__ uint32_t index(const Type& c) { return ~c.nidx; }
  static __device__ __forceinline__ Type none() { return {0ull, 0u}; }
  static __device__ __forceinline__ Type load_cg(const Type* p) { return {__ldcg(&p->key), __ldcg(&p->nidx)}; }
  static __device__ __forceinline__ bool better(const Type& a, const Type& b) {
    return a.key > b.key || (a.key == b.key && a.nidx > b.nidx);
  }
  static __device__ __forceinline__ bool at_least(const Type& a, const Type& b) { return !better(b, a); }
  static __device__ __forceinline__ Type shfl_xor(const Type& c, int lane_mask, int width) {
    return {__shfl_xor_sync(kFullMask, c.key, lane_mask, width), __shfl_xor_sync(kFullMask, c.nidx, lane_mask, width)};
  }
  static __device__ __forceinline__ int digit(const Type& c, int d) {
    return static_cast<int>(d < 8 ? (c.key >> (56 - 8 * d)) & 0xffu : (c.nidx >> (24 - 8 * (d - 8))) & 0xffu);
  }
  static __device__ __forceinline__ bool prefix_matches(const Type& c, const Type& prefix, int depth) {
    if (depth == 0) return true;
    if (depth <= 8) return ((c.key ^ prefix.key) >> (64 - 8 * depth)) == 0;
    return c.key == prefix.key && ((c.nidx ^ prefix.nidx) >> (32 - 8 * (depth - 8))) == 0;
  }
  static __device__ __forceinline__ Type with_digit(Type prefix, int d, int digit) {
    if (d < 8) {
      prefix.key |= static_cast<unsigned long long>(digit) << (56 - 8 * d);
    } else {
      prefix.nidx |= static_cast<uint32_t>(digit) << (24 - 8 * (d - 8));
    }
    return prefix;
  }
};

template <typename C>
using CandFor = std::conditional_t<std::is_same_v<C, double>, WideCand, PackedCand>;

}  // namespace softmax_ops::topk
