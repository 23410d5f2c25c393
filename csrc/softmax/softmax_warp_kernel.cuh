// Warp kernel: rows up to 32 lanes x 8 packs, held in registers; no __syncthreads at all.
//
//   lanes_per_row = 2^lanes_log2 (1..32); a warp holds 32 / lanes_per_row rows at once:
//
//     warp lanes   0 .. L-1 | L .. 2L-1 | ...          (L = lanes_per_row)
//     row          r        | r + 1     | ...
//     lane l of a row holds packs l, l + L, l + 2L, ... (PACKS of them, VEC elements each), so consecutive
//     lanes read consecutive 16-byte packs: one coalesced 512-byte access per pack index and warp.
//
// Reductions are butterflies over the L lanes of a row (shuffle width L). The grid strides over groups of
// rows (a CTA of W warps holds W * 32 / L rows per step; few rows get CTAs of 1-2 warps, see plan_warp).
//
// Softmax (not log_softmax) takes each exponential ONCE where the floats fit beside the cache (float rows:
// in place of it; 16-bit rows of up to 4 packs per lane): the row max first, then exp(x - max) kept in
// registers for the sum and the output (exp_once_row). The online (max, sum) form takes it twice, and at 16
// exponentials per clock per SM (Hopper) the second one is most of a short row's math: the warp kernel's rows
// were the shapes torch.compile still won (2048 x 1024 16-bit, 65536 x 64, 1000 x 1000; H200, 2026-11-22).
#pragma once

#include "softmax_kernel_common.cuh"

namespace softmax_ops::detail {

// Widening results (16-bit rows, float32 out) go out in lane pairs (store_swapped_lane_pair: whole 32-byte sectors
// per store instruction) when a row has 2 lanes or more: lanes 2m and 2m + 1 then hold adjacent packs of one row.
// Rows of one lane have no partner in their row and store plainly (a run-time choice: `lanes` is the launch's).
// Not in the peeled 8-pack instances: with pairs the bfloat16 one took 168 registers instead of 122 (3 CTAs per SM
// instead of 4; nvcc 13.0, sm_90).
template <typename Op, int VEC, int PACKS, int EDGES>
constexpr bool kWarpPairStores =
    kLanePairStores<typename Op::Out, VEC> && Op::kStreams == 1 && !(EDGES > 0 && PACKS == kWarpKernelMaxPacks);

// Pad-first loads (load_vec_or) where the result has the input's dtype, and for bfloat16 rows with float32 results
// below 8 packs per lane; float16 rows with float32 results, and bfloat16 ones at 8 packs, keep the select. Measured
// on an H100 (session 37, A/Bs of both forms, 3 runs each, softmax and log_softmax):
// - 8 packs per lane: the select takes 117-128 registers where pad-first took 167-168, and made float16 -> float32
//   rows of 1032-2048 columns 2.6-12.8% faster (4096 x 1032, 8192 x 1280, 2048 x 2048: 10.5-12.8%), bfloat16 ones
//   -8.6..+1.3%; 1000 x 2000 and the rows at copy speed (32768 and 65536 x 2048) 0.2-1.4% slower;
// - 1-4 packs per lane (11 shapes): 2048 x 1024 float16 -6.1 / -9.0% with the select, bfloat16 +9.2 / +10.1%; every
//   other shape within +-3.5% (the few-microsecond ones; the 38-56 us ones within +-0.6%).
template <typename Op, int PACKS>
constexpr bool kWarpPadFirstLoads =
    std::is_same_v<typename Op::In, typename Op::Out> ||
    (std::is_same_v<typename Op::In, __nv_bfloat16> && PACKS < kWarpKernelMaxPacks);

// Every lane of the warp calls it (the shuffles need all 32); rows past the end compute on padding.
// EDGES > 0 (a peeled row): edge[i] is the lane's i-th edge element (the padding where it holds none), its
// result written to edge_out[i] where that is not null.
template <typename Op, int VEC, int PACKS, int EDGES = 0>
__device__ __forceinline__ void exp_once_row(const Pack<typename Op::In, VEC> (&cache)[PACKS], int lanes,
                                             int lane_in_row, int64_t n_packs, bool row_valid, bool pairs,
                                             typename Op::Out* out, const float* edge = nullptr,
                                             typename Op::Out* const* edge_out = nullptr) {
  using Out = typename Op::Out;
  float e[PACKS][VEC];
  float maxes[kIlp];  // independent chains, see ForwardOp::accumulate
#pragma unroll
  for (int i = 0; i < kIlp; ++i) maxes[i] = negative_infinity<float>();
#pragma unroll
  for (int p = 0; p < PACKS; ++p) {
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      e[p][j] = cached_element<float>(cache[p], j);
      maxes[j % kIlp] = row_max(maxes[j % kIlp], e[p][j]);
    }
  }
#pragma unroll
  for (int i = 0; i < EDGES; ++i) maxes[i % kIlp] = row_max(maxes[i % kIlp], edge[i]);
  const float m = warp_all_reduce_with(reduce_ilp(maxes, [](float a, float b) { return row_max(a, b); }), lanes,
                                       [](float a, float b) { return row_max(a, b); });
  // A NaN or +inf in the row makes the sum NaN, an all -inf row exp(NaN): every output NaN, as torch.
  float sums[kIlp] = {};
#pragma unroll
  for (int p = 0; p < PACKS; ++p) {
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      e[p][j] = ExpMath<float>::exp_from(e[p][j], m);
      sums[j % kIlp] += e[p][j];
    }
  }
  [[maybe_unused]] float edge_e[EDGES > 0 ? EDGES : 1];
#pragma unroll
  for (int i = 0; i < EDGES; ++i) {
    edge_e[i] = ExpMath<float>::exp_from(edge[i], m);
    sums[i % kIlp] += edge_e[i];
  }
  const float sum = warp_all_reduce_with(reduce_ilp(sums, [](float a, float b) { return a + b; }), lanes,
                                         [](float a, float b) { return a + b; });
  const float inv_sum = ExpMath<float>::reciprocal(sum);
#pragma unroll
  for (int p = 0; p < PACKS; ++p) {
    const int64_t k = static_cast<int64_t>(p) * lanes + lane_in_row;
    const auto result = [&] {
      Pack<Out, VEC> pack;
#pragma unroll
      for (int j = 0; j < VEC; ++j) pack.v[j] = convert<Out>(e[p][j] * inv_sum);  // torch: exp(x - max) * (1 / sum)
      return pack;
    };
    if constexpr (kWarpPairStores<Op, VEC, PACKS, EDGES>) {
      if (pairs) {
        store_swapped_lane_pair<VEC>(out + k * VEC, result(), row_valid && k < n_packs);
        continue;
      }
    }
    if (row_valid && k < n_packs) store_vec<Out, VEC>(out + k * VEC, result());
  }
#pragma unroll
  for (int i = 0; i < EDGES; ++i) {
    if (edge_out[i] != nullptr) *edge_out[i] = convert<Out>(edge_e[i] * inv_sum);
  }
}

// Forward float math with at most 32 floats of exponentials per lane (16-bit: <= 4 packs; float: the cache).
template <typename Op, int VEC, int PACKS>
constexpr bool kWarpExpOnce = Op::kStreams == 1 && std::is_same_v<typename Op::C, float> && PACKS * VEC <= 32;

// EDGES > 0 (peeled, plan.peel): rows read as an aligned body of packs plus single edge elements (RowEdges),
// up to EDGES per lane (plan.edges_per_lane): lane l of a row holds edge elements l, l + lanes, ... The plan
// gives a row enough lanes x EDGES for the most edge elements any row of the launch has (max_row_edges; the
// launcher refuses a plan with fewer, from the pointer it launches on: a check per row here cost registers,
// up to 17 more and 40 bytes of spills). Edge elements are folded into the lane's partial and written singly.
template <typename Op, int VEC, int PACKS, int EDGES = 0>
__global__ void __launch_bounds__(kWarpKernelThreads) softmax_warp_kernel(RowArgs<Op> args, int lanes_log2) {
  using In = typename Op::In;
  using Out = typename Op::Out;
  using C = typename Op::C;
  constexpr int S = Op::kStreams;
  constexpr bool kPeel = EDGES > 0;
  constexpr int kEdgeSlots = kPeel ? EDGES : 1;
  const Op op = args.op;
  const int lanes = 1 << lanes_log2;
  const int lane = threadIdx.x % kWarpSize;
  const int lane_in_row = lane & (lanes - 1);
  const int rows_per_warp = kWarpSize >> lanes_log2;
  const int row_in_block = static_cast<int>(threadIdx.x / kWarpSize) * rows_per_warp + (lane >> lanes_log2);
  const int64_t rows_per_block = static_cast<int64_t>(blockDim.x / kWarpSize) * rows_per_warp;
  // VEC > 1 only when VEC divides n, or peeled: the longest body.
  const int64_t max_packs = args.n / VEC;
  if (max_packs > static_cast<int64_t>(PACKS) * lanes) __trap();  // a dispatcher bug, never a wrong answer

  for (int64_t first = blockIdx.x * rows_per_block; first < args.rows;
       first += static_cast<int64_t>(gridDim.x) * rows_per_block) {
    const int64_t row = first + row_in_block;
    const bool row_valid = row < args.rows;
    int64_t row_offset = row * args.n;
    int64_t n_packs = max_packs;
    [[maybe_unused]] RowEdges<VEC> edges{};
    [[maybe_unused]] C edge[kEdgeSlots][S];
    if constexpr (kPeel) {
      edges = row_edges<VEC>(args, row);
#pragma unroll
      for (int i = 0; i < EDGES; ++i) load_edge(args, row_offset, edges, row_valid ? lane_in_row + i * lanes : -1, edge[i]);
      n_packs = edges.packs;
      row_offset += edges.head;
    }

    Pack<In, VEC> cache[S][PACKS];
#pragma unroll
    for (int p = 0; p < PACKS; ++p) {
      const int64_t k = static_cast<int64_t>(p) * lanes + lane_in_row;
#pragma unroll
      for (int s = 0; s < S; ++s) {
        cache[s][p] = load_vec_or<In, VEC, kWarpPadFirstLoads<Op, PACKS>>(
            row_valid && k < n_packs, [&] { return args.in[s] + row_offset + k * VEC; }, Op::pad(s));
      }
    }
    // Pairs trade the halves of their 16-bit inputs before any math: a row's reductions see the same values, and
    // each result is computed in the lane that stores it. Padding (-inf) swapped into a valid pack is never stored.
    const bool pairs = kWarpPairStores<Op, VEC, PACKS, EDGES> && lanes > 1;
    if constexpr (kWarpPairStores<Op, VEC, PACKS, EDGES>) {
      if (pairs) {
#pragma unroll
        for (int p = 0; p < PACKS; ++p) cache[0][p] = swap_halves_in_lane_pairs(cache[0][p]);
      }
    }

    if constexpr (kWarpExpOnce<Op, VEC, PACKS>) {
      if (!op.log) {
        if constexpr (kPeel) {
          float edge_value[EDGES];
          Out* edge_out[EDGES];
#pragma unroll
          for (int i = 0; i < EDGES; ++i) {
            const int e = lane_in_row + i * lanes;
            edge_value[i] = edge[i][0];
            edge_out[i] = row_valid && e < edges.count() ? args.out + row * args.n + edges.column(e) : nullptr;
          }
          exp_once_row<Op, VEC, PACKS, EDGES>(cache[0], lanes, lane_in_row, n_packs, row_valid, pairs,
                                              args.out + row_offset, edge_value, edge_out);
        } else {
          exp_once_row<Op, VEC, PACKS>(cache[0], lanes, lane_in_row, n_packs, row_valid, pairs,
                                       args.out + row_offset);
        }
        continue;
      }
    }

    auto visit = [&](auto&& fn) {
#pragma unroll
      for (int p = 0; p < PACKS; ++p) {
#pragma unroll
        for (int j = 0; j < VEC; ++j) {
          C v[S];
#pragma unroll
          for (int s = 0; s < S; ++s) v[s] = cached_element<C>(cache[s][p], j);
          fn(v, j);
        }
      }
    };
    typename Op::Acc acc = op.accumulate(Op::identity(), visit);
    if constexpr (kPeel) acc = Op::merge(acc, edge_partial(op, edge));
    acc = warp_all_reduce<Op>(acc, lanes);  // every lane, valid row or not: the shuffles need all 32
    const typename Op::Row row_consts = op.finalize(acc);
#pragma unroll
    for (int i = 0; i < EDGES; ++i) {
      store_edge(args, row * args.n, edges, row_valid ? lane_in_row + i * lanes : -1, row_consts, edge[i]);
    }

    if constexpr (kWarpPairStores<Op, VEC, PACKS, EDGES>) {
      if (pairs) {  // every lane stores, its packs made from padding where not valid
#pragma unroll
        for (int p = 0; p < PACKS; ++p) {
          const int64_t k = static_cast<int64_t>(p) * lanes + lane_in_row;
          Pack<Out, VEC> result;
          visit_elements<C>(cache, p, [&](const C* v, int j) { result.v[j] = op.apply(row_consts, v); });
          store_swapped_lane_pair<VEC>(args.out + row_offset + k * VEC, result, row_valid && k < n_packs);
        }
        continue;
      }
    }
    // The loop below is the one every other instance runs; it keeps its own copy of the apply loop (sharing one
    // lambda with the pairs' loop moved the register allocation of same-dtype and float64 instances). It runs
    // with the mode fixed (with_fixed_mode: one formula per element, not both).
    with_fixed_mode(op, [&](const auto& fixed) {
#pragma unroll
      for (int p = 0; p < PACKS; ++p) {
        const int64_t k = static_cast<int64_t>(p) * lanes + lane_in_row;
        if (row_valid && k < n_packs) {
          Pack<Out, VEC> result;
#pragma unroll
          for (int j = 0; j < VEC; ++j) {
            C v[S];
#pragma unroll
            for (int s = 0; s < S; ++s) v[s] = cached_element<C>(cache[s][p], j);
            result.v[j] = fixed.apply(row_consts, v);
          }
          store_vec<Out, VEC>(args.out + row_offset + k * VEC, result);
        }
      }
    });
  }
}

}  // namespace softmax_ops::detail
