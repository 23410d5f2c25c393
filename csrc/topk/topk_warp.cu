// fused_topk "warp" kernel: router rows (N up to 1024, any N). W lanes (1..32) share one row, which lives in
// their registers; softmax (max, then sum) with shuffles; then k rounds of arg-max over the row's lanes.
//
// Values of one row (W lanes, S slots per lane, V elements per 16-byte vector):
//
//   vector loads (x 16-byte aligned, n % V == 0): lane l, slot p*V + j holds column (p*W + l)*V + j
//       columns  | l0: 0..V-1 | l1: V..2V-1 | ... | l(W-1) | l0: W*V..(W+1)*V-1 | ...
//   scalar loads (any n, any alignment): lane l, slot s holds column s*W + l (coalesced across the lanes)
//
// In both layouts a lane's columns increase with its slot and its valid slots are a prefix, so a lane's
// local best (first maximum in slot order) is its lowest-index best. Each round, the row's lanes reduce
// their local bests with a butterfly (key, then lower index), every lane learns the winner, the owner
// clears that slot and rescans its own slots. 60 or 160 experts cost what 64 or 128 do: the loads and
// the scans stop at each lane's last valid slot.
#include "topk_device.cuh"
#include "topk_launch.h"

namespace softmax_ops::topk {
namespace {

template <typename TIn>
constexpr int kSlotsPerLane = std::is_same_v<TIn, double> ? 16 : 32;  // == warp_slots_per_lane()

template <typename TIn, typename TOut, int W>
__global__ void __launch_bounds__(kWarpKernelThreads)
    topk_warp_kernel(const TIn* __restrict__ x, TOut* __restrict__ values, int64_t* __restrict__ indices,
                     int64_t rows, int n, int k, bool renormalize, bool vector_loads) {
  using C = compute_t<TIn>;
  using Ops = CandFor<C>;
  using Cand = typename Ops::Type;
  using Key = typename OrderKey<C>::Key;
  constexpr int V = 16 / sizeof(TIn);
  constexpr int S = kSlotsPerLane<TIn>;
  constexpr int P = S / V;
  constexpr int kRowsPerBlock = kWarpKernelThreads / W;
  static_assert(S % V == 0 && kWarpSize % W == 0, "bad warp-kernel configuration");

  // The k results of each row, written by the row's lane 0, then stored by all of its lanes.
  extern __shared__ __align__(16) unsigned char smem_raw[];
  C* stash_p = reinterpret_cast<C*>(smem_raw);
  int* stash_i = reinterpret_cast<int*>(stash_p + kRowsPerBlock * k);

  const int lane = threadIdx.x % W;
  const int group = threadIdx.x / W;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + group;
  // Rows past the end still run (with no data) so that every lane takes part in the shuffles.
  const bool active = row < rows;
  const TIn* xr = x + (active ? row : 0) * static_cast<int64_t>(n);

  int valid_slots;
  if (vector_loads) {
    const int packs = n / V;
    valid_slots = packs > lane ? min(P, (packs - lane + W - 1) / W) * V : 0;
  } else {
    valid_slots = n > lane ? min(S, (n - lane + W - 1) / W) : 0;
  }
  if (!active) valid_slots = 0;
  auto column = [&](int slot) {
    return vector_loads ? ((slot / V) * W + lane) * V + slot % V : slot * W + lane;
  };

  C v[S];
  if (vector_loads) {
#pragma unroll
    for (int p = 0; p < P; ++p) {
      C pack[V];
      if (p * V < valid_slots) {
        load_vec16<TIn, true>(xr + (p * W + lane) * V, pack);
      } else {
#pragma unroll
        for (int j = 0; j < V; ++j) pack[j] = neg_inf<C>();
      }
#pragma unroll
      for (int j = 0; j < V; ++j) v[p * V + j] = pack[j];
    }
  } else {
#pragma unroll
    for (int s = 0; s < S; ++s) v[s] = s < valid_slots ? load_scalar(xr + s * W + lane) : neg_inf<C>();
  }

  // Softmax statistics: max over the row, then the sum of exp(x - max) (one exp per value).
  C m = v[0];
#pragma unroll
  for (int s = 1; s < S; ++s) m = fmax(m, v[s]);
#pragma unroll
  for (int offset = W / 2; offset > 0; offset /= 2) m = fmax(m, __shfl_xor_sync(kFullMask, m, offset, W));
  const C shift = m == neg_inf<C>() ? C(0) : m;  // an all -inf/NaN row: no overflow, NaN via the divisor
  C sum = C(0);
#pragma unroll
  for (int s = 0; s < S; ++s) {
    if (s < valid_slots) sum += exp_shifted(v[s], shift);
  }
#pragma unroll
  for (int offset = W / 2; offset > 0; offset /= 2) sum += __shfl_xor_sync(kFullMask, sum, offset, W);
  const C divisor = probability_divisor(RowStats<C>{m, sum});

  Key key[S];
#pragma unroll
  for (int s = 0; s < S; ++s) key[s] = s < valid_slots ? OrderKey<C>::of(v[s]) : Key(0);

  Key best_key = 0;
  int best_slot = 0;
  auto rescan = [&]() {
    best_key = 0;
    best_slot = 0;
#pragma unroll
    for (int s = 0; s < S; ++s) {
      if (s >= valid_slots) break;
      if (key[s] > best_key) {  // strict: the first (lowest-column) of equal keys stays
        best_key = key[s];
        best_slot = s;
      }
    }
  };
  rescan();

  C total = C(0);
  for (int r = 0; r < k; ++r) {
    Cand best = Ops::make(best_key, static_cast<uint32_t>(column(best_slot)));
#pragma unroll
    for (int offset = W / 2; offset > 0; offset /= 2) {
      const Cand other = Ops::shfl_xor(best, offset, W);
      if (Ops::better(other, best)) best = other;
    }
    const C p = exp_precise(OrderKey<C>::value(Ops::key(best)) - m) / divisor;
    total += p;  // the same sum, in rank order, in every lane
    if (lane == 0 && active) {
      stash_p[group * k + r] = p;
      stash_i[group * k + r] = static_cast<int>(Ops::index(best));
    }
    if (best_key != 0 && Ops::index(best) == static_cast<uint32_t>(column(best_slot))) {
#pragma unroll
      for (int s = 0; s < S; ++s) {
        if (s == best_slot) key[s] = 0;
      }
      rescan();
    }
  }
  __syncwarp();
  if (active) {
    TOut* vr = values + row * k;
    int64_t* ir = indices + row * k;
    for (int r = lane; r < k; r += W) {
      const C p = stash_p[group * k + r];
      vr[r] = detail::convert<TOut>(renormalize ? p / total : p);
      ir[r] = stash_i[group * k + r];
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
      const int64_t blocks = (problem.rows + kRowsPerBlock - 1) / kRowsPerBlock;
      topk_warp_kernel<TIn, TOut, W><<<static_cast<unsigned>(blocks), kWarpKernelThreads, plan.smem_bytes, stream>>>(
          static_cast<const TIn*>(ptrs.x), static_cast<TOut*>(ptrs.values), ptrs.indices, problem.rows,
          static_cast<int>(problem.n), static_cast<int>(problem.k), problem.renormalize, plan.vector_loads);
      return cudaGetLastError();
    });
  });
}

}  // namespace softmax_ops::topk
