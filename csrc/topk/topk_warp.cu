// fused_topk "warp" kernel: router rows (N up to 1024, any N). W lanes (1..32) share one row, which lives in
// their registers; softmax (max, then sum) with shuffles; then k branch-free rounds of row-wide arg-max
// (topk_warp_select.cuh), over a few pre-filtered candidates per lane when W >= 2k; the k probabilities are
// computed at the end, lane r computing rank r.
//
// Values of one row (W lanes, S slots per lane, V elements per 16-byte vector):
//
//   vector loads (x 16-byte aligned, n % V == 0, n >= W * V): lane l, slot p*V + j holds column (p*W + l)*V + j
//       columns  | l0: 0..V-1 | l1: V..2V-1 | ... | l(W-1) | l0: W*V..(W+1)*V-1 | ...
//   scalar loads (any n, any alignment): lane l, slot s holds column s*W + l (coalesced across the lanes)
//
// In both layouts a lane's columns increase with its slot and its valid slots are a prefix. Slots past the
// last one any lane of the launch uses are skipped by launch-uniform branches (groups of kSlotGroup).
#include "topk_device.cuh"
#include "topk_launch.h"
#include "topk_warp_select.cuh"

namespace softmax_ops::topk {
namespace {

template <typename TIn>
constexpr int kSlotsPerLane = std::is_same_v<TIn, double> ? 16 : 32;  // == warp_slots_per_lane()
template <typename TIn>
constexpr bool kIs16Bit = sizeof(TIn) == 2;

// 8 CTAs of 128 threads per SM (32 warps, half of Hopper's 64) caps the kernel at 64 registers: after the
// exps only the S keys (or words) stay alive, and the rounds need a handful more.
constexpr int kWarpKernelMinBlocks = 8;

// Where this lane's values of its row sit (see the diagram above).
template <typename TIn, int W>
struct LaneSlots {
  static constexpr int V = 16 / sizeof(TIn);
  int lane;
  bool vector;
  int valid;  // this lane's slots holding a column: a prefix
  int used;   // the most slots any lane of the launch holds (launch-uniform)

  __device__ __forceinline__ LaneSlots(int n, int lane_, bool vector_, bool active) : lane(lane_), vector(vector_) {
    if (vector) {
      const int packs = n / V;
      used = (packs + W - 1) / W * V;
      valid = packs > lane ? (packs - lane + W - 1) / W * V : 0;
    } else {
      used = (n + W - 1) / W;
      valid = n > lane ? (n - lane + W - 1) / W : 0;
    }
    if (!active) valid = 0;
  }
  __device__ __forceinline__ bool group_used(int slot) const {
    return slot / warp::kSlotGroup * warp::kSlotGroup < used;
  }
  __device__ __forceinline__ int column(int slot) const {
    return vector ? ((slot / V) * W + lane) * V + slot % V : slot * W + lane;
  }
};

// One lane's S values as loaded: fp16/bf16 stay packed two per register (their bits give the order keys),
// wider types one per register. Slots of used groups past `valid` hold -inf; slots of unused groups are
// never written or read.
template <typename TIn, int S>
struct LaneValues {
  using C = compute_t<TIn>;
  static constexpr int kPerReg = kIs16Bit<TIn> ? 2 : 1;
  using Reg = std::conditional_t<kIs16Bit<TIn>, uint32_t, C>;
  Reg reg[S / kPerReg];

  template <int W>
  __device__ __forceinline__ void load(const TIn* row, const LaneSlots<TIn, W>& at) {
    constexpr int V = LaneSlots<TIn, W>::V;
    if (at.vector) {
#pragma unroll
      for (int p = 0; p < S / V; ++p) {
        if (!at.group_used(p * V)) continue;
        const uint4 raw = p * V < at.valid ? __ldcs(reinterpret_cast<const uint4*>(row + (p * W + at.lane) * V))
                                           : neg_inf_raw16<TIn>();
        store_vector(p, raw);
      }
    } else {
#pragma unroll
      for (int s = 0; s < S; ++s) {
        if (!at.group_used(s)) continue;
        if constexpr (kIs16Bit<TIn>) {
          const uint32_t bits = s < at.valid ? reinterpret_cast<const unsigned short*>(row)[s * W + at.lane]
                                             : uint32_t{neg_inf_bits<TIn>()};
          reg[s / 2] = s % 2 ? (reg[s / 2] | (bits << 16)) : bits;
        } else {
          reg[s] = s < at.valid ? row[s * W + at.lane] : neg_inf<C>();
        }
      }
    }
  }

  __device__ __forceinline__ C value(int s) const {
    if constexpr (std::is_same_v<TIn, __half>) {
      return __half2float(__ushort_as_half(static_cast<unsigned short>(bits16(s))));
    } else if constexpr (std::is_same_v<TIn, __nv_bfloat16>) {
      return __uint_as_float(s % 2 ? (reg[s / 2] & 0xffff0000u) : (reg[s / 2] << 16));
    } else {
      return reg[s];
    }
  }
  __device__ __forceinline__ uint32_t bits16(int s) const { return (reg[s / 2] >> (16 * (s % 2))) & 0xffffu; }

 private:
  __device__ __forceinline__ void store_vector(int p, const uint4& raw) {
    const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
    if constexpr (kIs16Bit<TIn>) {
#pragma unroll
      for (int i = 0; i < 4; ++i) reg[p * 4 + i] = w[i];
    } else if constexpr (std::is_same_v<TIn, float>) {
#pragma unroll
      for (int i = 0; i < 4; ++i) reg[p * 4 + i] = __uint_as_float(w[i]);
    } else {
#pragma unroll
      for (int i = 0; i < 2; ++i) reg[p * 2 + i] = __hiloint2double(static_cast<int>(w[2 * i + 1]), static_cast<int>(w[2 * i]));
    }
  }
};

// Softmax statistics of the row: max (NaN dropped by fmax), then the sum of exp(x - max), one exp per value.
template <int W, typename TIn, int S>
__device__ __forceinline__ RowStats<compute_t<TIn>> row_stats(const LaneValues<TIn, S>& x,
                                                               const LaneSlots<TIn, W>& at) {
  using C = compute_t<TIn>;
  C m = neg_inf<C>();
#pragma unroll
  for (int s = 0; s < S; ++s) {
    if (at.group_used(s)) m = fmax(m, x.value(s));
  }
#pragma unroll
  for (int offset = W / 2; offset > 0; offset /= 2) m = fmax(m, __shfl_xor_sync(kFullMask, m, offset, W));
  const C shift = m == neg_inf<C>() ? C(0) : m;  // an all -inf/NaN row: no overflow, NaN via the divisor
  C sum = C(0);
#pragma unroll
  for (int s = 0; s < S; ++s) {
    if (at.group_used(s)) sum += exp_shifted(x.value(s), shift);  // pads are -inf: + 0
  }
#pragma unroll
  for (int offset = W / 2; offset > 0; offset /= 2) sum += __shfl_xor_sync(kFullMask, sum, offset, W);
  return {m, sum};
}

// The pre-filter pays off with W >= 2k lanes (see topk_warp_select.cuh) and enough slots per lane.
template <int W>
__device__ __forceinline__ bool filter_applies(int k, int used_slots) {
  return 2 * k <= W && used_slots >= warp::kFilterMinSlots;
}

// fp16/bf16: rounds over 32-bit words. emit(r, winner word).
template <int W, typename TIn, int S, typename Emit>
__device__ __forceinline__ void select_by_words(const LaneValues<TIn, S>& x, const LaneSlots<TIn, W>& at, int k,
                                                Emit&& emit) {
  using warp::WordCand;
  uint32_t word[S];
#pragma unroll
  for (int s = 0; s < S; ++s) {
    if (!at.group_used(s)) continue;
    const float v = x.value(s);
    const uint32_t w = WordCand::make(warp::order_key16(x.bits16(s), v != v), at.column(s));
    word[s] = w & (s < at.valid ? ~0u : 0u);  // a mask, not a branch per slot
  }
  if (filter_applies<W>(k, at.used)) {
    const uint32_t threshold = max(1u, kth_largest_across_lanes<W>(warp::lane_best_word(word, at.used), k));
    uint32_t cand[warp::kCandidates];
    const bool fits = warp::gather_candidates<WordCand, S>(
        at.used, cand, [&](int s) { return word[s] >= threshold; }, [&](int s) { return word[s]; });
    if (__all_sync(kFullMask, fits)) {
      warp::candidate_rounds<WordCand, W>(cand, k, emit);
      return;
    }
  }
  warp::word_rounds<W>(word, at.used, k, emit);
}

// fp32/fp64: rounds over order keys, candidates (key, column). emit(r, winner candidate).
template <int W, typename TIn, int S, typename Emit>
__device__ __forceinline__ void select_by_keys(const LaneValues<TIn, S>& x, const LaneSlots<TIn, W>& at, int k,
                                               Emit&& emit) {
  using C = compute_t<TIn>;
  using Ops = CandFor<C>;
  using Key = typename Ops::Key;
  Key key[S];
#pragma unroll
  for (int s = 0; s < S; ++s) {
    if (at.group_used(s)) key[s] = OrderKey<C>::of(x.value(s)) & (s < at.valid ? ~Key(0) : Key(0));
  }
  auto column = [&](int s) { return at.column(s); };
  if (filter_applies<W>(k, at.used)) {
    const Key lane_max = warp::lane_best_key(key, at.used).key;
    const Key threshold = max(Key(1), kth_largest_across_lanes<W>(lane_max, k));
    typename Ops::Type cand[warp::kCandidates];
    const bool fits = warp::gather_candidates<Ops, S>(
        at.used, cand, [&](int s) { return key[s] >= threshold; },
        [&](int s) { return Ops::make(key[s], static_cast<uint32_t>(at.column(s))); });
    if (__all_sync(kFullMask, fits)) {
      warp::candidate_rounds<Ops, W>(cand, k, emit);
      return;
    }
  }
  warp::key_rounds<Ops, W>(key, at.used, k, column, emit);
}

template <typename TIn, typename TOut, int W>
__global__ void __launch_bounds__(kWarpKernelThreads, kWarpKernelMinBlocks)
    topk_warp_kernel(const TIn* __restrict__ x, TOut* __restrict__ values, int64_t* __restrict__ indices,
                     int64_t rows, int n, int k, bool renormalize, bool vector_loads) {
  using C = compute_t<TIn>;
  using Key = typename OrderKey<C>::Key;  // fp16/bf16: the 16-bit key in a 32-bit word
  constexpr int S = kSlotsPerLane<TIn>;
  constexpr int kRowsPerBlock = kWarpKernelThreads / W;
  static_assert(S % LaneSlots<TIn, W>::V == 0 && S % warp::kSlotGroup == 0 && kWarpSize % W == 0,
                "bad warp-kernel configuration");
  static_assert(sizeof(Key) == sizeof(C), "the stash reuses a key's bytes for its probability");

  // The k winners of each row (order key + column), written by the row's lane 0 round by round; then each
  // lane turns its ranks into probabilities in place.
  extern __shared__ __align__(16) unsigned char smem_raw[];
  Key* stash_key = reinterpret_cast<Key*>(smem_raw);
  int* stash_i = reinterpret_cast<int*>(stash_key + kRowsPerBlock * k);

  const int lane = threadIdx.x % W;
  const int group = threadIdx.x / W;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + group;
  // Rows past the end still run (with no data) so that every lane takes part in the shuffles.
  const bool active = row < rows;
  const TIn* xr = x + (active ? row : 0) * static_cast<int64_t>(n);
  const LaneSlots<TIn, W> at(n, lane, vector_loads, active);

  LaneValues<TIn, S> xv;
  xv.load(xr, at);
  const RowStats<C> stats = row_stats(xv, at);
  const C divisor = probability_divisor(stats);

  Key* row_key = stash_key + group * k;
  int* row_index = stash_i + group * k;
  if constexpr (kIs16Bit<TIn>) {
    select_by_words(xv, at, k, [&](int r, uint32_t win) {
      if (lane == 0 && active) {
        row_key[r] = warp::WordCand::key(win);
        row_index[r] = static_cast<int>(warp::WordCand::index(win));
      }
    });
  } else {
    using Ops = CandFor<C>;
    select_by_keys(xv, at, k, [&](int r, const typename Ops::Type& win) {
      if (lane == 0 && active) {
        row_key[r] = Ops::key(win);
        row_index[r] = static_cast<int>(Ops::index(win));
      }
    });
  }
  __syncwarp();

  // Rank r's probability, accurately (exp_precise, IEEE division): lane r % W computes it.
  auto probability = [&](Key key) {
    C logit;
    if constexpr (kIs16Bit<TIn>) {
      logit = warp::value_of_key16<TIn>(key);
    } else {
      logit = OrderKey<C>::value(key);
    }
    return exp_precise(logit - stats.max) / divisor;
  };
  C* row_p = reinterpret_cast<C*>(row_key);
  TOut* vr = values + (active ? row : 0) * k;
  int64_t* ir = indices + (active ? row : 0) * k;
  C partial = C(0);
  if (active) {
    for (int r = lane; r < k; r += W) {
      const C p = probability(row_key[r]);
      partial += p;
      ir[r] = row_index[r];
      if (renormalize) {
        row_p[r] = p;  // this lane's own entry: no other lane reads it
      } else {
        vr[r] = detail::convert<TOut>(p);
      }
    }
  }
  if (renormalize) {  // kernel-uniform: every lane shuffles
    C total = partial;
#pragma unroll
    for (int offset = W / 2; offset > 0; offset /= 2) total += __shfl_xor_sync(kFullMask, total, offset, W);
    if (active) {
      for (int r = lane; r < k; r += W) vr[r] = detail::convert<TOut>(row_p[r] / total);
    }
  }
}

}  // namespace

cudaError_t launch_topk_warp(const TopkProblem& problem, const TopkPlan& plan, const TopkPointers& ptrs,
                             cudaStream_t stream) {
  return dispatch_in_out(problem.in_dtype, problem.out_dtype, [&](auto in_tag, auto out_tag) {
    using TIn = typename decltype(in_tag)::type;
    using TOut = typename decltype(out_tag)::type;
    return dispatch_int<1, 2, 4, 8, 16, 32>(plan.lanes_per_row, [&](auto lanes) {
      constexpr int W = decltype(lanes)::value;
      constexpr int kRowsPerBlock = kWarpKernelThreads / W;
      if (problem.n > W * kSlotsPerLane<TIn>) return cudaErrorInvalidValue;
      // The vector layout needs a whole 16-byte vector in every lane; a row of fewer values than lanes x
      // vector (tiny rows spread over many lanes for latency) uses the scalar layout.
      const bool vector_layout = plan.vector_loads && problem.n >= W * LaneSlots<TIn, W>::V;
      const int64_t blocks = (problem.rows + kRowsPerBlock - 1) / kRowsPerBlock;
      topk_warp_kernel<TIn, TOut, W><<<static_cast<unsigned>(blocks), kWarpKernelThreads, plan.smem_bytes, stream>>>(
          static_cast<const TIn*>(ptrs.x), static_cast<TOut*>(ptrs.values), ptrs.indices, problem.rows,
          static_cast<int>(problem.n), static_cast<int>(problem.k), problem.renormalize, vector_layout);
      return cudaGetLastError();
    });
  });
}

}  // namespace softmax_ops::topk
