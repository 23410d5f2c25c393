// fused_topk device building blocks, part 1: the basics every kernel shares (full warp mask, -inf, NaN) and
// element loads and stores: 16-byte vectors kept raw or unpacked to the compute type, scalars, -inf padding.
// CUDA headers only (no ATen); topk_device.cuh includes every part.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "softmax_ops/device_utils.cuh"

namespace softmax_ops::topk {

using detail::compute_t;
using detail::kWarpSize;
constexpr unsigned kFullMask = 0xffffffffu;

template <typename C>
__device__ __forceinline__ C neg_inf() {
  return -static_cast<C>(INFINITY);
}
template <typename C>
__device__ __forceinline__ C quiet_nan() {
  return static_cast<C>(NAN);
}

// ---- element loads and stores ---------------------------------------------------------------------

// 16 bytes of T, as loaded (no conversion yet): lets a kernel keep the next tile in flight in half the
// registers its compute-type values would take. `kStream`: evict-first (data read once).
template <typename T, bool kStream>
__device__ __forceinline__ uint4 load_raw16(const T* ptr) {
  return kStream ? __ldcs(reinterpret_cast<const uint4*>(ptr)) : *reinterpret_cast<const uint4*>(ptr);
}

// The bits of one T, and of T's -inf (the pad value of partial tiles).
template <typename T>
using ElementBits = std::conditional_t<sizeof(T) == 2, uint16_t, std::conditional_t<sizeof(T) == 4, uint32_t, uint64_t>>;

template <typename T>
__device__ __forceinline__ ElementBits<T> element_bits(T v) {
  if constexpr (std::is_same_v<T, float>) {
    return __float_as_uint(v);
  } else if constexpr (std::is_same_v<T, double>) {
    return static_cast<uint64_t>(__double_as_longlong(v));
  } else if constexpr (std::is_same_v<T, __half>) {
    return __half_as_ushort(v);
  } else {
    return __bfloat16_as_ushort(v);
  }
}

template <typename T>
__device__ __forceinline__ constexpr ElementBits<T> neg_inf_bits() {
  if constexpr (std::is_same_v<T, float>) {
    return 0xff800000u;
  } else if constexpr (std::is_same_v<T, double>) {
    return 0xfff0000000000000ull;
  } else if constexpr (std::is_same_v<T, __half>) {
    return 0xfc00u;
  } else {
    return 0xff80u;
  }
}

// 16 / sizeof(T) element bits packed as a 16-byte load would have read them (element 0 lowest).
template <typename T>
__device__ __forceinline__ uint4 pack_raw16(const ElementBits<T> (&e)[16 / sizeof(T)]) {
  uint32_t w[4];
  if constexpr (sizeof(T) == 2) {
#pragma unroll
    for (int i = 0; i < 4; ++i) w[i] = static_cast<uint32_t>(e[2 * i]) | (static_cast<uint32_t>(e[2 * i + 1]) << 16);
  } else if constexpr (sizeof(T) == 4) {
#pragma unroll
    for (int i = 0; i < 4; ++i) w[i] = e[i];
  } else {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      w[2 * i] = static_cast<uint32_t>(e[i]);
      w[2 * i + 1] = static_cast<uint32_t>(e[i] >> 32);
    }
  }
  return make_uint4(w[0], w[1], w[2], w[3]);
}

// 16 bytes of T's -inf, as load_raw16 would have read padding: the pad of partial vector tiles.
template <typename T>
__device__ __forceinline__ uint4 neg_inf_raw16() {
  ElementBits<T> pad[16 / sizeof(T)];
#pragma unroll
  for (int j = 0; j < static_cast<int>(16 / sizeof(T)); ++j) pad[j] = neg_inf_bits<T>();
  return pack_raw16<T>(pad);
}

// 16 bytes of T (as load_raw16 returns them) as compute-type values.
template <typename T>
__device__ __forceinline__ void unpack_raw16(uint4 raw, compute_t<T> (&out)[16 / sizeof(T)]) {
  const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
  if constexpr (std::is_same_v<T, float>) {
#pragma unroll
    for (int i = 0; i < 4; ++i) out[i] = __uint_as_float(w[i]);
  } else if constexpr (std::is_same_v<T, double>) {
#pragma unroll
    for (int i = 0; i < 2; ++i) out[i] = __hiloint2double(static_cast<int>(w[2 * i + 1]), static_cast<int>(w[2 * i]));
  } else if constexpr (std::is_same_v<T, __half>) {
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      out[i] = __half2float(__ushort_as_half(static_cast<unsigned short>(w[i / 2] >> (16 * (i % 2)))));
    }
  } else {
    static_assert(std::is_same_v<T, __nv_bfloat16>, "unsupported element type");
#pragma unroll
    for (int i = 0; i < 8; ++i) out[i] = __uint_as_float(i % 2 ? (w[i / 2] & 0xffff0000u) : (w[i / 2] << 16));
  }
}

// 16 bytes of T as compute-type values. `stream`: evict-first (data read once).
template <typename T, bool kStream>
__device__ __forceinline__ void load_vec16(const T* ptr, compute_t<T> (&out)[16 / sizeof(T)]) {
  unpack_raw16<T>(load_raw16<T, kStream>(ptr), out);
}

template <typename T>
__device__ __forceinline__ compute_t<T> load_scalar(const T* ptr) {
  return detail::convert<compute_t<T>>(*ptr);
}

// Bits of one T rounded from its compute type (round to nearest even).
template <typename T>
__device__ __forceinline__ uint32_t narrow_bits(float v) {
  if constexpr (std::is_same_v<T, __half>) {
    return __half_as_ushort(__float2half_rn(v));
  } else {
    return __bfloat16_as_ushort(__float2bfloat16_rn(v));
  }
}

template <typename T>
__device__ __forceinline__ void store_vec16(T* ptr, const compute_t<T> (&v)[16 / sizeof(T)]) {
  uint32_t w[4];
  if constexpr (std::is_same_v<T, float>) {
#pragma unroll
    for (int i = 0; i < 4; ++i) w[i] = __float_as_uint(v[i]);
  } else if constexpr (std::is_same_v<T, double>) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      w[2 * i] = static_cast<uint32_t>(__double2loint(v[i]));
      w[2 * i + 1] = static_cast<uint32_t>(__double2hiint(v[i]));
    }
  } else {
#pragma unroll
    for (int i = 0; i < 4; ++i) w[i] = narrow_bits<T>(v[2 * i]) | (narrow_bits<T>(v[2 * i + 1]) << 16);
  }
  *reinterpret_cast<uint4*>(ptr) = make_uint4(w[0], w[1], w[2], w[3]);
}

template <typename T, typename C>
__device__ __forceinline__ void store_scalar(T* ptr, C v) {
  *ptr = detail::convert<T>(v);
}

}  // namespace softmax_ops::topk
