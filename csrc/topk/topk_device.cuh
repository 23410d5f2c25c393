// Device building blocks of the fused_topk kernels: element loads, order-preserving keys, (key, index)
// candidates, the online (max, sum) with its NaN/inf rules, and block-wide selection in shared memory
// (warp-aggregated append, radix threshold, compaction, bitonic sort). CUDA headers only (no ATen).
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

// ---- exp and the online (max, sum) -------------------------------------------------------------------

constexpr float kLog2e = 1.4426950408889634f;

__device__ __forceinline__ float ex2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

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

// A whole U x V tile at once: one max check and at most one rescale per tile instead of one per vector.
template <typename C, int U, int V>
__device__ __forceinline__ void fold_stats(RowStats<C>& s, const C (&x)[U][V]) {
  C group_max = x[0][0];
#pragma unroll
  for (int u = 0; u < U; ++u) {
#pragma unroll
    for (int j = 0; j < V; ++j) group_max = fmax(group_max, x[u][j]);
  }
  raise_max(s, group_max);
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

template <typename C>
__device__ __forceinline__ RowStats<C> shfl_xor_stats(const RowStats<C>& s, int lane_mask, int width) {
  return {__shfl_xor_sync(kFullMask, s.max, lane_mask, width), __shfl_xor_sync(kFullMask, s.sum, lane_mask, width)};
}

// Block-wide merge in a fixed order (deterministic); every thread gets the result. scratch >= 32 entries.
template <typename C>
__device__ __forceinline__ RowStats<C> block_merge_stats(RowStats<C> s, RowStats<C>* scratch) {
  const int lane = threadIdx.x % kWarpSize;
  const int warp = threadIdx.x / kWarpSize;
  const int num_warps = (blockDim.x + kWarpSize - 1) / kWarpSize;
#pragma unroll
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) s = merge_stats(s, shfl_xor_stats(s, offset, kWarpSize));
  if (lane == 0) scratch[warp] = s;
  __syncthreads();
  RowStats<C> r = scratch[0];
  for (int w = 1; w < num_warps; ++w) r = merge_stats(r, scratch[w]);
  __syncthreads();
  return r;
}

// ---- block-wide selection in shared memory -------------------------------------------------------

// Candidates of a small radix bucket, scanned instead of the whole buffer by block_radix_threshold's later
// digit passes (16 bytes per entry: float64's candidates; 8 for the others).
constexpr int kSelectSideEntries = 64;

struct SelectScratch {
  int hist[256];
  int count;       // entries in the candidate buffer
  int digit;       // radix step result, broadcast to the block
  int remaining;
  int done;
  int bucket;      // entries in the chosen bucket
  int side_count;  // entries copied into side by the current pass
  alignas(16) unsigned char side[kSelectSideEntries * 16];
};

// Appends c at a slot of buf taken from *counter with one atomic per warp. Every lane of the warp calls it.
template <typename Ops>
__device__ __forceinline__ void warp_append(typename Ops::Type* buf, int* counter, bool take,
                                            const typename Ops::Type& c) {
  const unsigned mask = __ballot_sync(kFullMask, take);
  if (mask == 0) return;
  const int lane = threadIdx.x % kWarpSize;
  const int leader = __ffs(mask) - 1;
  int base = 0;
  if (lane == leader) base = atomicAdd(counter, __popc(mask));
  base = __shfl_sync(kFullMask, base, leader);
  if (take) buf[base + __popc(mask & ((1u << lane) - 1u))] = c;
}

// Reserves `n` consecutive slots of a buffer for every lane of the warp with ONE shared atomic per warp
// (inclusive scan of n, the last lane adds the warp total); returns this lane's first slot. Every lane of
// the warp calls it; lanes with n == 0 get an unused slot number.
__device__ __forceinline__ int warp_reserve(int* counter, int n) {
  const int lane = threadIdx.x % kWarpSize;
  int inclusive = n;
#pragma unroll
  for (int offset = 1; offset < kWarpSize; offset *= 2) {
    const int other = __shfl_up_sync(kFullMask, inclusive, offset);
    if (lane >= offset) inclusive += other;
  }
  int base = 0;
  if (lane == kWarpSize - 1 && inclusive > 0) base = atomicAdd(counter, inclusive);
  base = __shfl_sync(kFullMask, base, kWarpSize - 1);
  return base + inclusive - n;
}

// v[b / N][b % N] for a run-time b < M * N without local memory (registers cannot be indexed): per row
// of v a chain of selects on b % N (the N - 1 compares shared by the M rows), then one on b / N: M
// independent chains of N - 1 selects instead of one of M * N - 1, and half the compares. A full select tree
// would be shallower still but keeps a second copy of the tile live (+18 registers in the block kernel,
// ptxas); this keeps M values. The block kernels' append runs it just before a barrier: its depth counts.
template <typename X, int M, int N>
__device__ __forceinline__ X pick(const X (&v)[M][N], int b) {
  const unsigned bit = static_cast<unsigned>(b);
  const unsigned col = bit % N;
  const unsigned row = bit / N;
  X in_row[M];
#pragma unroll
  for (int m = 0; m < M; ++m) {
    in_row[m] = v[m][0];
#pragma unroll
    for (int j = 1; j < N; ++j) in_row[m] = col == static_cast<unsigned>(j) ? v[m][j] : in_row[m];
  }
  X x = in_row[0];
#pragma unroll
  for (int m = 1; m < M; ++m) x = row == static_cast<unsigned>(m) ? in_row[m] : x;
  return x;
}

// flat[b] for a run-time b < N, as above.
template <typename X, int N>
__device__ __forceinline__ X pick(const X (&flat)[N], int b) {
  X x = flat[0];
#pragma unroll
  for (int i = 1; i < N; ++i) x = b == i ? flat[i] : x;
  return x;
}

// How append_selected reserves its slots.
enum class Reserve {
  kPerWarp,  // one atomic per warp after a warp scan (warp_reserve): for counters in global memory
  kPerLane,  // one atomic per lane that appends: for shared-memory counters, where the block kernels' tiles
             // append from 1-2 lanes of a warp and the scan's ~30 instructions (a shuffle chain) cost more
             // than the lanes' serialised shared atomics (H100, session 10: block 1024x50000 k50 fp16
             // 94.6 -> 89.2 us, *session10-c5-ab-*)
};

// Appends the candidates whose bits are set in `take` (candidate(b) builds number b) at reserved slots;
// returns popc(take). Every lane of the warp calls it. A lane usually has 0-1 bits set, so the write loop
// runs about once, against one vote + atomic + shuffle per value for warp_append. The slots' order varies
// from run to run either way (warps race): readers rank candidates by key, never by slot.
template <typename Ops, Reserve kReserve = Reserve::kPerWarp, typename MakeCandidate>
__device__ __forceinline__ int append_selected(typename Ops::Type* buf, int* counter, uint32_t take,
                                               MakeCandidate&& candidate) {
  int n;
  int slot;
  if constexpr (kReserve == Reserve::kPerLane) {
    if (take == 0) return 0;
    n = __popc(take);
    slot = atomicAdd(counter, n);
  } else {
    if (!__any_sync(kFullMask, take != 0)) return 0;
    n = __popc(take);
    slot = warp_reserve(counter, n);
  }
  while (take != 0) {
    const int b = __ffs(take) - 1;
    take &= take - 1;
    buf[slot++] = candidate(b);
  }
  return n;
}

struct DigitChoice {
  int digit;      // the bucket holding the remaining-th best entry
  int remaining;  // how many of that bucket's entries are still needed
  bool done;      // the bucket holds exactly that many: every entry with the prefix is selected
  int bucket;     // how many entries that bucket holds
};

// Called by all 32 lanes of one warp on a 256-bin histogram of the entries matching the current prefix:
// scanning buckets from 255 down, finds the one where the count of better entries reaches `remaining`.
// Lane l owns buckets 255 - 8l ... 248 - 8l. Every lane returns the same choice.
__device__ __forceinline__ DigitChoice warp_choose_digit(const int* hist, int remaining) {
  const int lane = threadIdx.x % kWarpSize;
  int h[8];
  int lane_total = 0;
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    h[j] = hist[255 - 8 * lane - j];
    lane_total += h[j];
  }
  int inclusive = lane_total;
#pragma unroll
  for (int offset = 1; offset < kWarpSize; offset *= 2) {
    const int other = __shfl_up_sync(kFullMask, inclusive, offset);
    if (lane >= offset) inclusive += other;
  }
  int above = inclusive - lane_total;
  int found = -1;
  int found_remaining = 0;
  bool found_done = false;
  int found_bucket = 0;
  if (above < remaining && remaining <= inclusive) {
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      if (found < 0 && above + h[j] >= remaining) {
        found = 255 - 8 * lane - j;
        found_remaining = remaining - above;
        found_done = h[j] == found_remaining;
        found_bucket = h[j];
      }
      above += h[j];
    }
  }
  const unsigned owner_mask = __ballot_sync(kFullMask, found >= 0);
  // A histogram without `remaining` entries cannot happen (callers guarantee count >= k); lane 0 then
  // answers bucket 0, which keeps the selection in range.
  const int owner = owner_mask ? __ffs(owner_mask) - 1 : 0;
  DigitChoice choice;
  choice.digit = __shfl_sync(kFullMask, found < 0 ? 0 : found, owner);
  choice.remaining = __shfl_sync(kFullMask, found < 0 ? remaining : found_remaining, owner);
  choice.done = __shfl_sync(kFullMask, found_done ? 1 : 0, owner) != 0;
  choice.bucket = __shfl_sync(kFullMask, found_bucket, owner);
  return choice;
}

// The k-th best entry of buf[0, count) as a radix prefix P (k <= count): with distinct entries exactly k of
// them satisfy at_least(c, P). MSB-first 8-bit digits with a shared-memory histogram; stops at the first
// digit whose bucket holds exactly the entries still needed. Duplicated entries (only "none" fillers) can
// keep it from stopping early; it then returns the full k-th value. Every thread returns P.
//
// Each pass counts only the entries matching the prefix, but reads them all. With kSideList, once the chosen
// bucket holds at most kSelectSideEntries entries, the next pass also copies the ones it counts (exactly that
// bucket) into s.side, and the passes after it scan that list instead of the buffer. 16-bit inputs need 7-8
// passes when the k-th value is tied (their keys' low digits never split, so index digits must): H100,
// 8 x 262144 k1024 fp16 122 -> 102 us, bf16 129 -> 102 (session 8, *session8-ab5-*). float32 keys split in
// 2-3 passes and lost there (91 -> 97 us), so their callers leave it off. Reading 4 entries per thread per
// iteration instead of 1 cost the k = 50 cases 2-7% (1024 x 50000, 64 x 151936) and was dropped.
template <typename Ops, bool kSideList>
__device__ typename Ops::Type block_radix_threshold(const typename Ops::Type* buf, int count, int k,
                                                    SelectScratch& s) {
  using Cand = typename Ops::Type;
  static_assert(sizeof(Cand) <= 16, "side list entries are 16 bytes at most");
  Cand* const side = reinterpret_cast<Cand*>(s.side);
  const Cand* src = buf;  // the entries the next pass scans: the buffer, or the side list
  int src_count = count;
  bool fill_side = false;  // block-uniform: the next pass copies what it counts into the side list
  Cand prefix = Ops::none();
  int remaining = k;
  for (int d = 0; d < Ops::kDigits; ++d) {
    for (int i = threadIdx.x; i < 256; i += blockDim.x) s.hist[i] = 0;
    if (threadIdx.x == 0) s.side_count = 0;
    __syncthreads();
    for (int i = threadIdx.x; i < src_count; i += blockDim.x) {
      const Cand c = src[i];
      if (Ops::prefix_matches(c, prefix, d)) {
        atomicAdd(&s.hist[Ops::digit(c, d)], 1);
        if (fill_side) side[atomicAdd(&s.side_count, 1)] = c;
      }
    }
    __syncthreads();
    if (fill_side) {  // s.side_count is reset only after the next barrier: every thread reads it here
      src = side;
      src_count = s.side_count;
      fill_side = false;
    }
    if (threadIdx.x < kWarpSize) {
      const DigitChoice choice = warp_choose_digit(s.hist, remaining);
      if (threadIdx.x == 0) {
        s.digit = choice.digit;
        s.remaining = choice.remaining;
        s.done = choice.done ? 1 : 0;
        s.bucket = choice.bucket;
      }
    }
    __syncthreads();
    prefix = Ops::with_digit(prefix, d, s.digit);
    remaining = s.remaining;
    const bool done = s.done != 0;
    // s.digit/remaining/done/bucket are rewritten only after two more barriers (next iteration), hist and
    // side_count after one.
    if (done) break;
    // The next pass counts exactly the chosen bucket's entries: when they fit, it copies them to the side list.
    if (kSideList && src != side && s.bucket <= kSelectSideEntries) fill_side = true;
  }
  __syncthreads();
  return prefix;
}

// Keeps the entries of buf[0, count) that are at_least(P), packed at the front (order not preserved, but
// every later use is order-independent). `count` must be what every thread read from s.count before this
// call. Returns the new count (also in s.count); ends with a barrier.
template <typename Ops>
__device__ int block_compact(typename Ops::Type* buf, int count, const typename Ops::Type& threshold,
                             SelectScratch& s) {
  using Cand = typename Ops::Type;
  __syncthreads();  // every thread has read s.count
  if (threadIdx.x == 0) s.count = 0;
  __syncthreads();
  for (int base = 0; base < count; base += blockDim.x) {
    const int i = base + threadIdx.x;
    const bool valid = i < count;
    const Cand c = valid ? buf[i] : Ops::none();
    // Writes land below base + blockDim.x: every entry there has been read (this barrier), and later
    // chunks are not written by this one.
    __syncthreads();
    warp_append<Ops>(buf, &s.count, valid && Ops::at_least(c, threshold), c);
  }
  __syncthreads();
  const int kept = s.count;
  __syncthreads();  // every thread has read s.count before anyone appends again
  return kept;
}

// Sorts buf[0, n2) best first; n2 a power of two, entries past the real ones must be Ops::none().
// Starts and ends with a barrier.
template <typename Ops>
__device__ void block_bitonic_sort_desc(typename Ops::Type* buf, int n2) {
  using Cand = typename Ops::Type;
  __syncthreads();
  for (int size = 2; size <= n2; size <<= 1) {
    for (int stride = size >> 1; stride > 0; stride >>= 1) {
      for (int i = threadIdx.x; i < n2 / 2; i += blockDim.x) {
        const int lo = 2 * i - (i & (stride - 1));
        const int hi = lo + stride;
        const bool descending = (lo & size) == 0;  // the last merge (size == n2) is descending everywhere
        const Cand a = buf[lo];
        const Cand b = buf[hi];
        if (descending ? Ops::better(b, a) : Ops::better(a, b)) {
          buf[lo] = b;
          buf[hi] = a;
        }
      }
      __syncthreads();
    }
  }
}

__device__ __forceinline__ int next_pow2_device(int v) {
  int p = 1;
  while (p < v) p <<= 1;
  return p;
}

// The largest sort block_sort_desc keeps in registers: 8 candidates per thread of a 256-thread CTA.
constexpr int kRegisterSortMaxPerThread = 8;

// One compare-exchange of the bitonic network on entry i (its partner is i ^ stride, and `other` its
// value): the entry at the lower index of a pair keeps the better candidate when the block of `size`
// containing it sorts descending ((i & size) == 0), the worse one otherwise.
template <typename Ops>
__device__ __forceinline__ typename Ops::Type bitonic_keep(const typename Ops::Type& mine,
                                                           const typename Ops::Type& other, int i, int size,
                                                           int stride) {
  const bool descending = (i & size) == 0;
  const bool lower = (i & stride) == 0;
  const bool keep_better = lower == descending;
  return Ops::better(mine, other) == keep_better ? mine : other;
}

// The shared-memory slot of thread t's e-th entry inside register_bitonic_sort_desc: t * E + e permuted
// within the thread's E slots so that one warp access to the same e touches 16 distinct 8-byte bank pairs
// (t * E alone makes lanes 16 / E apart collide: a 2E-way conflict for E = 8; H100, session 9: the unswizzled
// sort of 2048 candidates made split_hist 7 us slower than a radix select + shared-memory sort of 1024).
// The partner of an exchange through shared memory (stride >= 32 * E) is thread t ^ (a multiple of 32), whose
// permutation is the same.
template <int E>
__device__ __forceinline__ int sort_slot(int t, int e) {
  static_assert(E >= 1 && E <= 16 && (E & (E - 1)) == 0, "E is a power of two <= 16");
  return t * E + (e ^ ((t / (16 / E)) % E));
}

// Sorts buf[0, n) best first (n a power of two, 32 * E <= n <= E * blockDim.x; entries past the real ones
// must be Ops::none()). Thread t holds entries t*E .. t*E + E - 1 in registers: the exchanges of stride < E
// stay in the thread, those of stride < 32 * E are warp shuffles, and only the longer ones go through shared
// memory (two barriers each). H100: the shared-memory network took ~100 ns per stage in a single CTA
// (10 us for 1024 candidates, session 9's split_hist timeline); n = 1024 needs 6 of its 55 stages here.
// Starts and ends with a barrier; every thread of the block calls it.
template <typename Ops, int E>
__device__ void register_bitonic_sort_desc(typename Ops::Type* buf, int n) {
  using Cand = typename Ops::Type;
  const int t = threadIdx.x;
  const bool active = t * E < n;  // whole warps: n / E is a multiple of 32
  __syncthreads();
  Cand c[E];
#pragma unroll
  for (int e = 0; e < E; ++e) c[e] = active ? buf[sort_slot<E>(t, e)] : Ops::none();  // any bijection will do
  for (int size = 2; size <= n; size <<= 1) {
    for (int stride = size >> 1; stride > 0; stride >>= 1) {
      if (stride >= kWarpSize * E) {  // block-uniform: every thread takes the barriers
        __syncthreads();  // the previous readers of buf are done
        if (active) {
#pragma unroll
          for (int e = 0; e < E; ++e) buf[sort_slot<E>(t, e)] = c[e];
        }
        __syncthreads();
        if (active) {
          const int partner = t ^ (stride / E);
#pragma unroll
          for (int e = 0; e < E; ++e) {
            c[e] = bitonic_keep<Ops>(c[e], buf[sort_slot<E>(partner, e)], t * E + e, size, stride);
          }
        }
      } else if (stride >= E) {
        if (active) {
#pragma unroll
          for (int e = 0; e < E; ++e) {
            const Cand other = Ops::shfl_xor(c[e], stride / E, kWarpSize);
            c[e] = bitonic_keep<Ops>(c[e], other, t * E + e, size, stride);
          }
        }
      } else if (active) {
#pragma unroll
        for (int e = 0; e < E; ++e) {
#pragma unroll
          for (int s = 1; s < E; s <<= 1) {
            if (s == stride && (e & s) == 0) {
              const Cand a = c[e];
              const Cand b = c[e | s];
              const bool descending = ((t * E + e) & size) == 0;
              if (descending ? Ops::better(b, a) : Ops::better(a, b)) {
                c[e] = b;
                c[e | s] = a;
              }
            }
          }
        }
      }
    }
  }
  __syncthreads();  // the last shared-memory step's reads are done
  if (active) {
#pragma unroll
    for (int e = 0; e < E; ++e) buf[t * E + e] = c[e];
  }
  __syncthreads();
}

// Sorts buf[0, count) best first (capacity >= max(32, next_pow2(count))): in registers where the padded
// length fits kRegisterSortMaxPerThread per thread, else the shared-memory network. Returns the sorted length
// (entries past count are none). Starts and ends with a barrier.
template <typename Ops>
__device__ int block_sort_desc(typename Ops::Type* buf, int count) {
  const int n = max(kWarpSize, next_pow2_device(count));
  for (int i = count + threadIdx.x; i < n; i += blockDim.x) buf[i] = Ops::none();
  const int threads = static_cast<int>(blockDim.x);
  if (n <= threads) {
    register_bitonic_sort_desc<Ops, 1>(buf, n);
  } else if (n <= 2 * threads) {
    register_bitonic_sort_desc<Ops, 2>(buf, n);
  } else if (n <= 4 * threads) {
    register_bitonic_sort_desc<Ops, 4>(buf, n);
  } else if (n <= kRegisterSortMaxPerThread * threads) {
    register_bitonic_sort_desc<Ops, kRegisterSortMaxPerThread>(buf, n);
  } else {
    block_bitonic_sort_desc<Ops>(buf, n);
  }
  return n;
}

// Sorts the count (>= k) candidates of buf (capacity >= max(32, next_pow2(count))) and writes the k best as
// probabilities exp(x - max) / sum (renormalised: divided by their fp32/fp64 sum, rounded once) and indices.
template <typename Ops, typename C, typename TOut>
__device__ void write_sorted_topk(typename Ops::Type* buf, int count, int k, const RowStats<C>& stats,
                                  bool renormalize, TOut* values, int64_t* indices, C* reduce_scratch) {
  block_sort_desc<Ops>(buf, count);
  const C divisor = probability_divisor(stats);
  C total = C(1);
  if (renormalize) {
    C local = C(0);
    for (int r = threadIdx.x; r < k; r += blockDim.x) {
      local += exp_precise(OrderKey<C>::value(Ops::key(buf[r])) - stats.max) / divisor;
    }
    total = detail::block_all_reduce(local, reduce_scratch, [](C a, C b) { return a + b; });
  }
  for (int r = threadIdx.x; r < k; r += blockDim.x) {
    const typename Ops::Type c = buf[r];
    const C p = exp_precise(OrderKey<C>::value(Ops::key(c)) - stats.max) / divisor;
    values[r] = detail::convert<TOut>(renormalize ? p / total : p);
    indices[r] = static_cast<int64_t>(Ops::index(c));
  }
}

}  // namespace softmax_ops::topk

// ---- host-side template dispatch (used by the .cu launch functions) ------------------------------------

namespace softmax_ops::topk {

template <typename T>
struct TypeTag {
  using type = T;
};

// Calls f(TypeTag<T>{}) with the element type of t.
template <typename F>
cudaError_t dispatch_dtype(DType t, F&& f) {
  switch (t) {
    case DType::kFloat32:
      return f(TypeTag<float>{});
    case DType::kFloat16:
      return f(TypeTag<__half>{});
    case DType::kBFloat16:
      return f(TypeTag<__nv_bfloat16>{});
    case DType::kFloat64:
      return f(TypeTag<double>{});
  }
  return cudaErrorInvalidValue;
}

// Calls f(TypeTag<In>{}, TypeTag<Out>{}) for the pairs the forward kernels are built for: the same dtype
// twice, or float16/bfloat16 read directly into float32 results (softmax's dtype=torch.float32).
template <typename F>
cudaError_t dispatch_in_out(DType in, DType out, F&& f) {
  if (in == out) return dispatch_dtype(in, [&](auto tag) { return f(tag, tag); });
  if (out == DType::kFloat32 && in == DType::kFloat16) return f(TypeTag<__half>{}, TypeTag<float>{});
  if (out == DType::kFloat32 && in == DType::kBFloat16) return f(TypeTag<__nv_bfloat16>{}, TypeTag<float>{});
  return cudaErrorInvalidValue;
}

// Calls f(TypeTag<In>{}, TypeTag<Out>{}, std::bool_constant<kVectorLoads>{}) for a forward problem's dtype pair
// (dispatch_in_out) and its plan's load width: the instance a launch function runs.
template <typename Problem, typename Plan, typename F>
cudaError_t dispatch_forward_instance(const Problem& problem, const Plan& plan, F&& f) {
  return dispatch_in_out(problem.in_dtype, problem.out_dtype, [&](auto in_tag, auto out_tag) {
    return plan.vector_loads ? f(in_tag, out_tag, std::true_type{}) : f(in_tag, out_tag, std::false_type{});
  });
}

// Calls f(std::integral_constant<int, V>{}) for the V of Vs equal to value (cudaErrorInvalidValue if none).
template <int... Vs, typename F>
cudaError_t dispatch_int(int value, F&& f) {
  cudaError_t result = cudaErrorInvalidValue;
  static_cast<void>(((value == Vs ? (result = f(std::integral_constant<int, Vs>{}), true) : false) || ...));
  return result;
}

// Lets a kernel use more than 48 KB of dynamic shared memory. Called before every such launch: a cheap host
// call, legal during CUDA graph capture, and correct on every device of a multi-GPU process.
template <typename Kernel>
cudaError_t allow_dynamic_smem(Kernel kernel, size_t bytes) {
  if (bytes <= 48 * 1024) return cudaSuccess;
  return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes));
}

}  // namespace softmax_ops::topk
