// fused_topk "rows" kernel: router rows of N <= 512 with k <= 8, float16/bfloat16/float32. T threads share
// one row (T = 1..16, a power of two; 16 / T rows per half-warp), each holding up to 32 of its values in
// registers (16-byte loads: 64-128 bytes in flight per thread). No barriers; shuffles only between the T threads
// of a row (log2 T merge steps). Batched instances (16-bit rows in 16-byte vectors, K >= 4): rows longer than
// T x 32, each thread walking its share in batches of T x 32 columns (select_row_batched). No shared memory.
// (Session 29's staged instances, which passed each thread's packs through an 8 KB shared buffer by cp.async in a
// persistent grid, were retired in session 33: on the same threads the plain instances were as fast or faster,
// topk_dispatch.cpp rows_one_wave_warps_per_sm.)
//
// Values of one row (T threads, V elements per 16-byte vector, slot s of thread t):
//   vector loads (x 16-byte aligned, n % V == 0): slot p*V + j holds column ((p*T) + t)*V + j
//   scalar loads (any n, any alignment):         slot s holds column s*T + t
// Slots past the row hold -inf; their columns lie past N, so they rank below every real value (ties go to
// the lower column) and are never selected (k <= N).
//
// Per thread: the max (shuffled over T), then per group of 8 slots the sum of exp(x - max) on its own
// (added to the thread's sum) and a word per slot whose unsigned order is the ranking order: NaN first, larger
// value, lower column on ties; -0 == +0; words of a row are distinct. Each group of K words is sorted by an
// odd-even merge network and merged into the thread's sorted top-K list (K = k rounded up to a power of two):
// c[i] = max(list[i], group[K-1-i]) is bitonic and holds the K best of both; a half-cleaner sorts it. The T
// lists are merged the same way across the row's threads (every thread ends with the row's list).
//   float16/bfloat16 words: 32 bits, 16-bit order key << 16 | 0xffff - col (see Words)
//   float32 words, first:   32 bits, the order key's top 23 bits | 0x1ff - col (TruncFloatWords); exact only
//                           where no two values near the k-th rank share those bits (trunc_selection_exact)
//   float32 words, exact:   64 bits, order key << 32 | ~col; the only words where a thread holds <= 8 values
//                           (kExactFloat instances: no exactness check, no reload of the exact values)
// Fast path: the keys of NaN are not canonicalised (NaN payloads and signs would rank apart). A row holding
// NaN or +inf has a NaN sum; a warp holding such a row (or, for float32, a row whose truncated words were not
// exact) redoes the selection with exact NaN-aware words, from a reload of the rows (rare).
#include <array>
#include <utility>

#include "topk_device.cuh"
#include "topk_launch.h"

namespace softmax_ops::topk {
namespace {

constexpr int kSlots = kRowsSlotsPerThread;  // 32
constexpr int kGroup = 8;                    // slots per accuracy group of the sum
// CTAs of 128 threads per SM at least, i.e. the register budget (ptxas -v, nvcc 13.0, sm_90). Many-row shapes
// (65536x256: 31 CTAs per SM to run) are latency-bound at the occupancy registers allow (Nsight Compute, H100,
// fp16: 10.5 cycles per issued instruction, issue slots 59% busy, 44% occupancy; session 11), so each instance
// gets the most CTAs it takes without spilling:
//   16-bit, K = 8: 8 (<= 64 registers; at 48 the vector instance spills 36 bytes; left free, the bfloat16
//                  instances took 70 registers and 7 CTAs per SM, and ran slower on an H100 than with 64)
//   16-bit, K = 4: 10 (<= 48); K <= 2: 12 (<= 40)
//   float32, vector loads: 8 (<= 64; 72-78 at 4); scalar loads: 4 (at 8 they spill 400-500 bytes)
//   batched 16-bit rows (K >= 4): 8 (at 10 the K = 4 instances spilled 16 bytes)
template <typename TIn, int K, bool kVector, bool kBatched = false>
constexpr int kRowsMinBlocks = sizeof(TIn) == 2 ? (K >= 8 || kBatched ? 8 : K == 4 ? 10 : 12) : (kVector ? 8 : 4);

template <typename TIn>
constexpr bool kIs16 = sizeof(TIn) == 2;

template <typename W>
__device__ __forceinline__ void cas_desc(W& a, W& b) {
  const W hi = max(a, b);
  b = min(a, b);
  a = hi;
}

// Batcher's odd-even merge sort as a compile-time list of compare-exchanges (K a power of two): 19 for
// K = 8 and 5 for K = 4, against 24 and 6 for a bitonic sort. The kernel is bound by the ALU pipe, where each
// exchange is two integer min/max (Nsight Compute, H100, 65536 x 256 k8 fp16: ALU pipe 77% busy, DRAM 25%;
// session 8), so every exchange saved counts.
struct Exchange {
  int lo;  // gets the larger word
  int hi;
};

template <int K>
constexpr int odd_even_exchanges(Exchange* out) {
  int count = 0;
  for (int p = 1; p < K; p *= 2) {          // merge sorted blocks of p into blocks of 2p
    for (int d = p; d >= 1; d /= 2) {       // compare at distance d ...
      for (int j = d % p; j + d < K; j += 2 * d) {
        for (int i = 0; i < d && i + j + d < K; ++i) {
          if ((i + j) / (2 * p) == (i + j + d) / (2 * p)) {  // ... within one block of 2p
            if (out != nullptr) out[count] = Exchange{i + j, i + j + d};
            ++count;
          }
        }
      }
    }
  }
  return count;
}

template <int K>
struct OddEvenNetwork {
  static constexpr int kSize = odd_even_exchanges<K>(nullptr);
  static constexpr std::array<Exchange, kSize> kExchanges = [] {
    std::array<Exchange, kSize> list{};
    odd_even_exchanges<K>(list.data());
    return list;
  }();
};

template <>
struct OddEvenNetwork<1> {  // nothing to exchange (an empty kExchanges drew nvcc's "never referenced" warning)
  static constexpr int kSize = 0;
};

template <int Lo, int Hi, int K, typename W>
__device__ __forceinline__ void exchange_at(W (&c)[K]) {
  cas_desc(c[Lo], c[Hi]);
}

template <int K, typename W, size_t... I>
__device__ __forceinline__ void apply_network(W (&c)[K], std::index_sequence<I...>) {
  using Net = OddEvenNetwork<K>;
  (exchange_at<Net::kExchanges[I].lo, Net::kExchanges[I].hi>(c), ...);
}

// Sorts K words descending.
template <int K, typename W>
__device__ __forceinline__ void sort_desc(W (&c)[K]) {
  apply_network(c, std::make_index_sequence<OddEvenNetwork<K>::kSize>{});
}

// list (sorted descending) becomes the K best of list and other (both sorted descending), sorted.
template <int K, typename W>
__device__ __forceinline__ void keep_best(W (&list)[K], const W (&other)[K]) {
#pragma unroll
  for (int i = 0; i < K; ++i) list[i] = max(list[i], other[K - 1 - i]);
#pragma unroll
  for (int stride = K / 2; stride > 0; stride /= 2) {
#pragma unroll
    for (int i = 0; i < K; ++i) {
      const int j = i ^ stride;
      if (j > i) cas_desc(list[i], list[j]);
    }
  }
}

// Order key of a float: larger value, larger key; -0 as +0 (the addition); NaN highest when kNanAware.
template <bool kNanAware>
__device__ __forceinline__ uint32_t float_key(float f) {
  const uint32_t b = __float_as_uint(f + 0.0f);
  const uint32_t key = b ^ (static_cast<uint32_t>(static_cast<int32_t>(b) >> 31) | 0x80000000u);
  if constexpr (kNanAware) return f != f ? 0xffffffffu : key;
  return key;
}

// 16-bit inputs: the 16-bit order key in the high half, 0xffff - column in the low half (N <= 512). The key of
// canonical bits (-0 made +0): the sign flipped for a positive value, every bit for a negative one; NaN-aware
// words give every NaN the top key. The fast path makes the keys of a register's two values at once from its
// raw bits (key_pair: a packed add, a byte permute, a logic op; then one byte permute per word): one ALU
// instruction per value fewer than from the float (sm_90 SASS: 151 -> 139 instructions per group of 8 values).
template <typename TIn>
struct Words {
  static_assert(kIs16<TIn>, "16-bit inputs here; float32 below");
  using W = uint32_t;
  static __device__ __forceinline__ uint32_t key16(uint32_t bits) {
    return (bits & 0x8000u) ? (~bits & 0xffffu) : (bits | 0x8000u);
  }
  template <bool kNanAware>
  static __device__ __forceinline__ W make(float f, int column) {
    uint32_t bits;  // f is a TIn value: the round trip is exact
    if constexpr (std::is_same_v<TIn, __half>) {
      bits = __half_as_ushort(__float2half_rn(f + 0.0f));
    } else {
      bits = __bfloat16_as_ushort(__float2bfloat16_rn(f + 0.0f));
    }
    const uint32_t key = kNanAware && f != f ? 0xffffu : key16(bits);
    return (key << 16) | (0xffffu - static_cast<uint32_t>(column));
  }
  // The keys of both values of a raw register (low half: the even slot), NaN not canonicalised.
  static __device__ __forceinline__ uint32_t key_pair(uint32_t raw) {
    using Pair = std::conditional_t<std::is_same_v<TIn, __half>, __half2, __nv_bfloat162>;
    Pair v;
    __builtin_memcpy(&v, &raw, sizeof(v));
    Pair zero;
    const uint32_t zero_bits = 0;
    __builtin_memcpy(&zero, &zero_bits, sizeof(zero));
    v = __hadd2(v, zero);  // -0 + +0 = +0; everything else unchanged (subnormals included)
    uint32_t canon;
    __builtin_memcpy(&canon, &v, sizeof(canon));
    uint32_t negative;  // 0xffff in each half whose sign bit is set (prmt's sign-replicating selector)
    asm("prmt.b32 %0, %1, %2, 0xbb99;" : "=r"(negative) : "r"(canon), "r"(0u));
    return canon ^ (negative | 0x80008000u);
  }
  // The word of the value in half `half` of a register whose key_pair is keys.
  static __device__ __forceinline__ W word(uint32_t keys, int half, int column) {
    return __byte_perm(0xffffu - static_cast<uint32_t>(column), keys, half ? 0x7610 : 0x5410);
  }
  static __device__ __forceinline__ float value(W w) {
    const uint32_t key = w >> 16;
    const uint32_t bits = (key & 0x8000u) ? (key ^ 0x8000u) : (key ^ 0xffffu);
    if constexpr (std::is_same_v<TIn, __half>) {
      return __half2float(__ushort_as_half(static_cast<unsigned short>(bits)));
    } else {
      return __uint_as_float(bits << 16);
    }
  }
  static __device__ __forceinline__ int column(W w) { return static_cast<int>(0xffffu - (w & 0xffffu)); }
};

template <>
struct Words<float> {
  using W = unsigned long long;
  template <bool kNanAware>
  static __device__ __forceinline__ W make(float f, int column) {
    return (static_cast<W>(float_key<kNanAware>(f)) << 32) | static_cast<W>(~static_cast<uint32_t>(column));
  }
  static __device__ __forceinline__ float value(W w) {
    const uint32_t key = static_cast<uint32_t>(w >> 32);
    return __uint_as_float((key & 0x80000000u) ? (key & 0x7fffffffu) : ~key);
  }
  static __device__ __forceinline__ int column(W w) { return static_cast<int>(~static_cast<uint32_t>(w)); }
};

// float32's first try: 32-bit words of the key's top 23 bits and a 9-bit column (N <= 512), through the same
// 32-bit networks as 16-bit inputs. A 64-bit compare-exchange is a compare pair and four selects where a
// 32-bit one is two min/max, and the kernel is bound by the ALU pipe. The truncation ties values whose keys
// agree in their top 23 bits (relative differences below ~2^-14) and ranks them by column instead:
// trunc_selection_exact finds the rows where such a tie touches the selection, and they are redone with the
// exact 64-bit words.
struct TruncFloatWords {
  using W = uint32_t;
  static constexpr uint32_t kColumnMask = 0x1ffu;
  static_assert(kRowsMaxN <= kColumnMask + 1, "a row's columns must fit the word's low bits");
  template <bool kNanAware>
  static __device__ __forceinline__ W make(float f, int column) {
    return (float_key<kNanAware>(f) & ~kColumnMask) | (kColumnMask - static_cast<uint32_t>(column));
  }
  static __device__ __forceinline__ int column(W w) { return static_cast<int>(kColumnMask - (w & kColumnMask)); }
  static __device__ __forceinline__ uint32_t truncated_key(W w) { return w & ~kColumnMask; }
  // The smallest float whose key has w's top 23 bits.
  static __device__ __forceinline__ float lowest_value(W w) {
    const uint32_t key = truncated_key(w);
    return __uint_as_float((key & 0x80000000u) ? (key & 0x7fffffffu) : ~key);
  }
};

// Slots any thread of a launch holds (vector layout: whole vectors of V values), rounded up to kGroup: the
// kernel's loop bound, and the launcher's choice of the float32 instance.
__host__ __device__ constexpr int rows_used_slots(int n, int T, int V, bool vector) {
  const int per_thread = vector ? (n / V + T - 1) / T * V : (n + T - 1) / T;
  return (per_thread + kGroup - 1) / kGroup * kGroup;
}

// The thread's slots of its row (see the diagram above) and their raw bits: 16-bit values two per register.
// kVector: the 16-byte layout (else scalar loads). A template parameter, not a run-time flag: each key
// carries its column, and a run-time layout cost a select per value (and the scalar path's registers in the
// vector kernel). The scalar float32 instances spill 16-76 bytes (ptxas, nvcc 13.0): rows whose length is
// not a multiple of 4 values or whose data is not 16-byte aligned.
template <typename TIn, bool kVector, int kCapacity = kSlots>
struct RowSlots {
  static_assert(kCapacity % kGroup == 0 && kCapacity <= kSlots, "whole groups, at most kSlots");
  static constexpr int V = 16 / sizeof(TIn);
  static constexpr int kRegs = kCapacity * sizeof(TIn) / 4;
  int t;       // thread in the row
  int T;       // threads per row
  int used;    // slots any thread of the launch holds, rounded up to kGroup (launch-uniform)
  int first;   // the row's column of this span's column 0 (a batch of a batched row; else 0)
  uint32_t raw[kRegs];

  // n: the span's length (the row, or one batch of it).
  __device__ __forceinline__ RowSlots(int n, int t_, int T_, int first_ = 0)
      : t(t_), T(T_), used(rows_used_slots(n, T_, V, kVector)), first(first_) {}
  __device__ __forceinline__ bool group_used(int g) const { return g * kGroup < used; }
  // The layout is a template parameter: a run-time choice cost a select per value in the key's column.
  __device__ __forceinline__ int column(int s) const {
    return first + (kVector ? ((s / V) * T + t) * V + s % V : s * T + t);
  }

  // The 16-byte layout's used packs from fetch(p) (pack p of this thread: the row's vector p * T + t), the packs
  // past the row (or all, active == false) -inf: fetch_or(p, valid, pad) is fetch(p) where valid, else pad. One
  // caller since the staged instances went (session 33); folding the loads in here changed ptxas's schedule in 21
  // of the 56 instances, whose measured code this form keeps.
  template <typename Fetch, typename FetchOr>
  __device__ __forceinline__ void load_packs(int n, bool active, Fetch&& fetch, FetchOr&& fetch_or) {
    // Spans whose every used slot lies in the row (used * T == n: e.g. 256 float32 values on 8 threads): the
    // packs as they are, with no bound to check and no -inf to select, which took ~190 of the ~1390 instructions
    // a warp issued on 65536 x 256 k8 float32 (Nsight Compute, H100, session 31).
    if (active && used * T == n) {
#pragma unroll
      for (int p = 0; p < kCapacity / V; ++p) {
        if (!group_used(p * V / kGroup)) continue;
        const uint4 v = fetch(p);
        raw[p * 4 + 0] = v.x;
        raw[p * 4 + 1] = v.y;
        raw[p * 4 + 2] = v.z;
        raw[p * 4 + 3] = v.w;
      }
      return;
    }
    const int packs = active ? n / V : 0;
#pragma unroll
    for (int p = 0; p < kCapacity / V; ++p) {
      if (!group_used(p * V / kGroup)) continue;
      const uint4 v = fetch_or(p, p * T + t < packs, neg_inf_raw16<TIn>());
      raw[p * 4 + 0] = v.x;
      raw[p * 4 + 1] = v.y;
      raw[p * 4 + 2] = v.z;
      raw[p * 4 + 3] = v.w;
    }
  }

  // Loads the row (active == false: every slot -inf).
  __device__ __forceinline__ void load(const TIn* row, int n, bool active) {
    if constexpr (kVector) {
      const uint4* packs = reinterpret_cast<const uint4*>(row);
      load_packs(
          n, active, [&](int p) { return __ldcs(packs + p * T + t); },
          [&](int p, bool valid, uint4 pad) { return detail::load_16_cs_or(packs + p * T + t, valid, pad); });
    } else {
      const int limit = active ? n : 0;
#pragma unroll
      for (int s = 0; s < kCapacity; ++s) {
        if (!group_used(s / kGroup)) continue;
        const int col = s * T + t;
        if constexpr (kIs16<TIn>) {
          const uint32_t bits = col < limit ? reinterpret_cast<const unsigned short*>(row)[col]
                                        : uint32_t{neg_inf_bits<TIn>()};
          raw[s / 2] = s % 2 ? (raw[s / 2] | (bits << 16)) : bits;
        } else {
          raw[s] = col < limit ? __float_as_uint(row[col]) : neg_inf_bits<TIn>();
        }
      }
    }
  }

  // The largest value of the thread's used slots (NaN ignored, as fmaxf; -inf when there is none). 16-bit
  // values two at a time (HMNMX2 on the raw pairs: half the ALU instructions of a float max per value).
  __device__ __forceinline__ float max_value() const {
    if constexpr (kIs16<TIn>) {
      using Pair = std::conditional_t<std::is_same_v<TIn, __half>, __half2, __nv_bfloat162>;
      const auto pair = [&](int r) {
        Pair v;
        __builtin_memcpy(&v, &raw[r], sizeof(v));
        return v;
      };
      Pair best[2] = {pair(0), pair(1)};  // group 0 (slots 0-7, registers 0-3) is always used
#pragma unroll
      for (int r = 2; r < kRegs; ++r) {
        if (group_used(2 * r / kGroup)) best[r % 2] = __hmax2(best[r % 2], pair(r));
      }
      const Pair m = __hmax2(best[0], best[1]);
      return fmaxf(__low2float(m), __high2float(m));
    } else {
      float m = -INFINITY;
#pragma unroll
      for (int s = 0; s < kCapacity; ++s) {
        if (group_used(s / kGroup)) m = fmaxf(m, value(s));
      }
      return m;
    }
  }

  __device__ __forceinline__ float value(int s) const {
    if constexpr (std::is_same_v<TIn, __half>) {
      return __half2float(__ushort_as_half(static_cast<unsigned short>(raw[s / 2] >> (16 * (s % 2)))));
    } else if constexpr (std::is_same_v<TIn, __nv_bfloat16>) {
      return __uint_as_float(s % 2 ? (raw[s / 2] & 0xffff0000u) : (raw[s / 2] << 16));
    } else {
      return __uint_as_float(raw[s]);
    }
  }
};

// Adds the thread's slots to its sorted top-K word list. kFresh: the list is empty (its first chunk becomes
// the list). sum != nullptr: *sum = the slots' sum of exp(x - shift) (groups of 8 terms summed on their own
// first).
template <int K, bool kNanAware, typename Wd, bool kFresh, typename TIn, bool kVector, int kCapacity>
__device__ __forceinline__ void add_slots(const RowSlots<TIn, kVector, kCapacity>& at, float shift, float* sum,
                                          typename Wd::W (&list)[K]) {
  using W = typename Wd::W;
  // 16-bit fast words from the raw registers, two keys at a time.
  constexpr bool kPairKeys = kIs16<TIn> && !kNanAware && std::is_same_v<Wd, Words<TIn>>;
  if constexpr (kFresh) {
    // Also keeps list defined for the compiler, which cannot see that group 0 is always used (without it the
    // SASS changed, session 8).
#pragma unroll
    for (int i = 0; i < K; ++i) list[i] = W(0);
  }
  float total = 0.0f;
#pragma unroll
  for (int g = 0; g < kCapacity / kGroup; ++g) {
    if (!at.group_used(g)) break;  // launch-uniform
    float group_sum = 0.0f;
#pragma unroll
    for (int c = 0; c < kGroup; c += K) {
      W chunk[K];
#pragma unroll
      for (int i = 0; i < K; ++i) {
        const int s = g * kGroup + c + i;
        const float f = at.value(s);
        if (sum != nullptr) group_sum += exp_shifted(f, shift);
        if constexpr (kPairKeys) {
          chunk[i] = Wd::word(Wd::key_pair(at.raw[s / 2]), s % 2, at.column(s));
        } else {
          chunk[i] = Wd::template make<kNanAware>(f, at.column(s));
        }
      }
      sort_desc(chunk);
      if (kFresh && g == 0 && c == 0) {  // the first chunk is the list: no merge with an empty one
#pragma unroll
        for (int i = 0; i < K; ++i) list[i] = chunk[i];
      } else {
        keep_best(list, chunk);
      }
    }
    total += group_sum;
  }
  if (sum != nullptr) *sum = total;
}

// Every thread of the row gets the row's top-K list from the T threads' lists.
template <int K, typename W>
__device__ __forceinline__ void merge_row_lists(W (&list)[K], int T) {
  for (int offset = 1; offset < T; offset *= 2) {
    W other[K];
#pragma unroll
    for (int i = 0; i < K; ++i) other[i] = __shfl_xor_sync(kFullMask, list[i], offset);
    keep_best(list, other);
  }
}

// The row's top-K words, sorted, in every thread of the row; sum != nullptr: also the thread's sum of
// exp(x - shift).
template <int K, bool kNanAware, typename Wd, typename TIn, bool kVector, int kCapacity>
__device__ __forceinline__ void select_row(const RowSlots<TIn, kVector, kCapacity>& at, float shift, float* sum,
                                           typename Wd::W (&list)[K]) {
  add_slots<K, kNanAware, Wd, true>(at, shift, sum, list);
  merge_row_lists(list, at.T);
}

// float32's fast words chose exactly what the exact words would when the k chosen have distinct truncated
// keys and no other value of the row shares the k-th's: then exactly k values are at or above the lowest
// value with the k-th's truncated key (every value with a larger truncated key was chosen). One compare per
// value, summed over the row's T threads; every thread of the warp calls it.
template <int K, bool kVector, int kCapacity>
__device__ __forceinline__ bool trunc_selection_exact(const RowSlots<float, kVector, kCapacity>& at,
                                                      const uint32_t (&list)[K], int k) {
  using Wd = TruncFloatWords;
  bool distinct = true;
#pragma unroll
  for (int i = 0; i + 1 < K; ++i) {
    if (i + 1 < k) distinct = distinct && Wd::truncated_key(list[i]) != Wd::truncated_key(list[i + 1]);
  }
  const float floor = Wd::lowest_value(pick(list, k - 1));
  int at_or_above = 0;
#pragma unroll
  for (int s = 0; s < kCapacity; ++s) {
    if (at.group_used(s / kGroup)) at_or_above += at.value(s) >= floor ? 1 : 0;
  }
  for (int offset = 1; offset < at.T; offset *= 2) at_or_above += __shfl_xor_sync(kFullMask, at_or_above, offset);
  return distinct && at_or_above == k;
}

// This thread's ranks r = t + j*T (r < k) of a sorted word list: the column from the word, the value from
// value_of(word, column) (the word itself where it holds the exact value).
template <typename Wd, int K, typename ValueOf>
__device__ __forceinline__ void take_ranks(const typename Wd::W (&list)[K], int t, int T, int k, ValueOf&& value_of,
                                           float (&v)[K], int (&col)[K]) {
#pragma unroll
  for (int j = 0; j < K; ++j) {
    if (j * T < K) {  // launch-uniform
      const int r = t + j * T;
      const typename Wd::W w = pick(list, r);  // list[r] for a run-time r, without local memory
      if (r < k) {
        col[j] = Wd::column(w);
        v[j] = value_of(w, col[j]);
      }
    }
  }
}

// take_ranks' value_of for words that hold the exact value.
template <typename Wd>
__device__ __forceinline__ float word_value(typename Wd::W w, int) {
  return Wd::value(w);
}

// Rows longer than the T threads' slots (16-bit inputs, 16-byte layout): each thread walks its share of the row
// in batches of T x kSlots columns, each laid out like a whole row of that length, with a running (max, sum)
// (the sum rescaled when a batch raises the max) and one top-K list; then the T threads' (max, sum) and lists are
// merged. Fewer threads per row than a row of N / kSlots threads need fewer merges across them: each is K
// shuffles and a merge network, where a thread adds a group of 8 more values with 8 / K sorts of K and merges.
// Returns the row's (max, sum); list: the row's top-K words in every thread of the row.
// Calls visit(first, fresh) for the first column of each batch of span columns of a row of n: fresh is
// std::true_type for the first batch (it starts the list), std::false_type for the rest.
template <typename Visit>
__device__ __forceinline__ void for_each_batch(int n, int span, Visit&& visit) {
  visit(0, std::true_type{});
#pragma unroll 1
  for (int first = span; first < n; first += span) visit(first, std::false_type{});
}

template <int K, typename TIn>
__device__ __forceinline__ RowStats<float> select_row_batched(const TIn* xr, int n, bool active, int t, int T,
                                                              typename Words<TIn>::W (&list)[K]) {
  using Wd = Words<TIn>;
  const int span = T * kSlots;
  RowStats<float> stats = empty_stats<float>();
  // The first batch starts the list; a batch's terms are shifted by the running max including the batch.
  for_each_batch(n, span, [&](int first, auto fresh) {
    RowSlots<TIn, true> at(min(span, n - first), t, T, first);
    at.load(xr + first, min(span, n - first), active);
    raise_max(stats, at.max_value());  // NaN dropped, as by fmaxf
    float part;
    add_slots<K, false, Wd, decltype(fresh)::value>(at, term_shift(stats), &part, list);
    stats.sum += part;
  });
  // The row's max first, then each thread's sum rescaled once to it and added up: the same operands in every
  // thread of the row at every step (a + b == b + a), so every thread gets the same (max, sum) bits, which a
  // pairwise merge_stats does not promise (its products may contract into either side's fma).
  float m = stats.max;
  for (int offset = 1; offset < T; offset *= 2) m = fmaxf(m, __shfl_xor_sync(kFullMask, m, offset));
  float sum = stats.max == -INFINITY ? stats.sum : stats.sum * rescale_factor(stats.max, m);  // keeps 0 or NaN
  for (int offset = 1; offset < T; offset *= 2) sum += __shfl_xor_sync(kFullMask, sum, offset);
  stats = RowStats<float>{m, sum};
  merge_row_lists(list, T);
  // NaN or +inf somewhere in the row (sum NaN): the fast keys may have ranked NaNs apart. Warp-uniform.
  if (__any_sync(kFullMask, stats.sum != stats.sum)) {
    for_each_batch(n, span, [&](int first, auto fresh) {
      RowSlots<TIn, true> at(min(span, n - first), t, T, first);
      at.load(xr + first, min(span, n - first), active);
      add_slots<K, true, Wd, decltype(fresh)::value>(at, 0.0f, nullptr, list);
    });
    merge_row_lists(list, T);
  }
  return stats;
}

// The row's probabilities from its (max m, sum) and this thread's ranks (take_ranks), written out.
template <int K, typename TOut>
__device__ __forceinline__ void write_row(float m, float sum, const float (&v)[K], const int (&col)[K], int t, int T,
                                          int k, int64_t row, bool active, TOut* __restrict__ values,
                                          int64_t* __restrict__ indices, bool renormalize) {
  const float divisor = probability_divisor(RowStats<float>{m, sum});

  // The probabilities accurately (expf, IEEE division).
  float p[K];
  float partial = 0.0f;
#pragma unroll
  for (int j = 0; j < K; ++j) {
    p[j] = 0.0f;
    if (j * T < K && t + j * T < k) {
      p[j] = exp_precise(v[j] - m) / divisor;
      partial += p[j];
    }
  }
  TOut* vr = values + (active ? row : 0) * k;
  int64_t* ir = indices + (active ? row : 0) * k;
  float total = 1.0f;
  if (renormalize) {  // kernel-uniform: every thread shuffles
    total = partial;
    for (int offset = 1; offset < T; offset *= 2) total += __shfl_xor_sync(kFullMask, total, offset);
  }
  if (!active) return;
#pragma unroll
  for (int j = 0; j < K; ++j) {
    const int r = t + j * T;
    if (j * T < K && r < k) {
      vr[r] = detail::convert<TOut>(renormalize ? p[j] / total : p[j]);
      ir[r] = col[j];
    }
  }
}

// An unbatched row whose slots `at` holds (loaded from xr, the row's data): its max, selection, probabilities and
// results.
template <int K, bool kExactFloat, typename TIn, typename TOut, bool kVector, int kCapacity>
__device__ __forceinline__ void rank_row(RowSlots<TIn, kVector, kCapacity>& at, const TIn* xr, int n, int k, int t,
                                         int T, int64_t row, bool active, TOut* __restrict__ values,
                                         int64_t* __restrict__ indices, bool renormalize) {
  float m = at.max_value();  // NaN dropped, as by fmaxf
  for (int offset = 1; offset < T; offset *= 2) m = fmaxf(m, __shfl_xor_sync(kFullMask, m, offset));
  const float shift = m == -INFINITY ? 0.0f : m;  // an all -inf/NaN row: no overflow, NaN via the divisor

  // Rank r = t + j*T is this thread's: its value and column.
  float v[K];
  int col[K];
#pragma unroll
  for (int j = 0; j < K; ++j) {
    v[j] = 0.0f;
    col[j] = 0;
  }
  float sum;
  if constexpr (kIs16<TIn>) {
    typename Words<TIn>::W list[K];
    select_row<K, false, Words<TIn>>(at, shift, &sum, list);
    for (int offset = 1; offset < T; offset *= 2) sum += __shfl_xor_sync(kFullMask, sum, offset);
    // NaN or +inf somewhere in the row (sum NaN): the fast keys may have ranked NaNs apart. Warp-uniform.
    if (__any_sync(kFullMask, sum != sum)) {
      at.load(xr, n, active);
      select_row<K, true, Words<TIn>>(at, shift, nullptr, list);
    }
    take_ranks<Words<TIn>>(list, t, T, k, word_value<Words<TIn>>, v, col);
  } else if constexpr (kExactFloat) {
    // At most 8 values per thread: the exact words' wider networks cost less than the truncated words'
    // exactness check and the L2 round trip for the exact values.
    typename Words<float>::W list[K];
    select_row<K, false, Words<float>>(at, shift, &sum, list);
    for (int offset = 1; offset < T; offset *= 2) sum += __shfl_xor_sync(kFullMask, sum, offset);
    if (__any_sync(kFullMask, sum != sum)) {  // NaN / +inf in the row: NaN-aware words, as for 16-bit inputs
      at.load(xr, n, active);
      select_row<K, true, Words<float>>(at, shift, nullptr, list);
    }
    take_ranks<Words<float>>(list, t, T, k, word_value<Words<float>>, v, col);
  } else {
    uint32_t fast[K];
    select_row<K, false, TruncFloatWords>(at, shift, &sum, fast);
    for (int offset = 1; offset < T; offset *= 2) sum += __shfl_xor_sync(kFullMask, sum, offset);
    const bool exact = trunc_selection_exact(at, fast, k);
    // NaN / +inf in the row, or a tie of truncated keys at the selection: the exact (NaN-aware) words.
    if (__any_sync(kFullMask, sum != sum || !exact)) {
      at.load(xr, n, active);
      typename Words<float>::W list[K];
      select_row<K, true, Words<float>>(at, shift, nullptr, list);
      take_ranks<Words<float>>(list, t, T, k, word_value<Words<float>>, v, col);
    } else {
      // The exact value from memory: the word kept 23 bits of its key.
      take_ranks<TruncFloatWords>(fast, t, T, k, [&](uint32_t, int c) { return __ldg(xr + c); }, v, col);
    }
  }
  write_row<K>(m, sum, v, col, t, T, k, row, active, values, indices, renormalize);
}

// kExactFloat (float32 inputs whose threads hold at most kGroup values each): the exact 64-bit words at once.
// A separate instance: in the same kernel their registers raised every float32 instance to 96 (ptxas).
// kBatched: 16-bit rows of more than T x kSlots values (select_row_batched).
template <typename TIn, typename TOut, int K, bool kVector, bool kExactFloat, bool kBatched = false>
__global__ void __launch_bounds__(kRowsThreads, kRowsMinBlocks<TIn, K, kVector, kBatched>)
    topk_rows_kernel(const TIn* __restrict__ x, TOut* __restrict__ values, int64_t* __restrict__ indices,
                     int64_t rows, int n, int k, int T, bool renormalize) {
  static_assert(K >= 1 && K <= kGroup && (K & (K - 1)) == 0, "K: a power of two <= 8");
  static_assert(!kBatched || (kIs16<TIn> && kVector), "batched rows: 16-bit inputs in 16-byte vectors");
  const int t = threadIdx.x & (T - 1);
  const int64_t row = (static_cast<int64_t>(blockIdx.x) * kRowsThreads + threadIdx.x) / T;
  // Rows past the end still run (with no data): every thread takes part in the shuffles.
  const bool active = row < rows;
  const TIn* xr = x + (active ? row : 0) * static_cast<int64_t>(n);

  if constexpr (kBatched) {
    typename Words<TIn>::W list[K];
    const RowStats<float> stats = select_row_batched<K>(xr, n, active, t, T, list);
    float v[K];
    int col[K];
#pragma unroll
    for (int j = 0; j < K; ++j) {
      v[j] = 0.0f;
      col[j] = 0;
    }
    take_ranks<Words<TIn>>(list, t, T, k, word_value<Words<TIn>>, v, col);
    write_row<K>(stats.max, stats.sum, v, col, t, T, k, row, active, values, indices, renormalize);
  } else {
    RowSlots<TIn, kVector, kExactFloat ? kGroup : kSlots> at(n, t, T);
    at.load(xr, n, active);
    rank_row<K, kExactFloat>(at, xr, n, k, t, T, row, active, values, indices, renormalize);
  }
}

}  // namespace

cudaError_t launch_topk_rows(const TopkProblem& problem, const TopkPlan& plan, const TopkPointers& ptrs,
                             cudaStream_t stream) {
  return dispatch_in_out(problem.in_dtype, problem.out_dtype, [&](auto in_tag, auto out_tag) {
    using TIn = typename decltype(in_tag)::type;
    using TOut = typename decltype(out_tag)::type;
    if constexpr (std::is_same_v<TIn, double>) {
      return cudaErrorInvalidValue;
    } else {
      int T = plan.lanes_per_row;
      if (problem.n > kRowsMaxN || problem.k > kRowsMaxK || T < 1 || T > 16 || (T & (T - 1)) != 0) {
        return cudaErrorInvalidValue;
      }
      // A plan in batches for rows that cannot take them (the pointer is not 16-byte aligned, so the rows are
      // read in scalars): the fewest threads that hold the row instead.
      if (problem.n > static_cast<int64_t>(T) * kSlots &&
          !rows_batches_fit(problem.in_dtype, problem.k, plan.vector_loads)) {
        T = static_cast<int>(next_pow2((problem.n + kSlots - 1) / kSlots));
      }
      const bool batched = problem.n > static_cast<int64_t>(T) * kSlots;
      const int K = static_cast<int>(next_pow2(problem.k));
      return dispatch_int<1, 2, 4, 8>(K, [&](auto k_tag) {
        constexpr int kK = decltype(k_tag)::value;
        // float32 rows whose threads hold <= kGroup values take the exact-word instances (16-bit inputs have
        // none: for them kHasExact names the same instances as the other branch).
        constexpr bool kHasExact = std::is_same_v<TIn, float>;
        const int used = rows_used_slots(static_cast<int>(problem.n), T, detail::kVec16<TIn>, plan.vector_loads);
        const bool exact = kHasExact && used <= kGroup;
        auto kernel = plan.vector_loads ? (exact ? topk_rows_kernel<TIn, TOut, kK, true, kHasExact>
                                                 : topk_rows_kernel<TIn, TOut, kK, true, false>)
                                        : (exact ? topk_rows_kernel<TIn, TOut, kK, false, kHasExact>
                                                 : topk_rows_kernel<TIn, TOut, kK, false, false>);
        const int64_t rows_per_block = kRowsThreads / T;
        const int64_t blocks = (problem.rows + rows_per_block - 1) / rows_per_block;  // a CTA per group of rows
        // Batched instances (16-bit vector rows, K >= 4) only where rows_batches_fit, which was checked above.
        if constexpr (kIs16<TIn> && kK >= kRowsBatchedMinK) {
          if (batched) kernel = topk_rows_kernel<TIn, TOut, kK, true, false, true>;
        } else if (batched) {
          return cudaErrorInvalidValue;  // never reached while rows_batches_fit matches the instances
        }
        kernel<<<static_cast<unsigned>(blocks), kRowsThreads, 0, stream>>>(
            static_cast<const TIn*>(ptrs.x), static_cast<TOut*>(ptrs.values), ptrs.indices, problem.rows,
            static_cast<int>(problem.n), static_cast<int>(problem.k), T, problem.renormalize);
        return cudaGetLastError();
      });
    }
  });
}

}  // namespace softmax_ops::topk
