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
// rows (a block of 4 warps holds 4 * 32 / L rows per step).
#pragma once

#include "softmax_kernel_common.cuh"

namespace softmax_ops::detail {

template <typename Op, int VEC, int PACKS>
__global__ void __launch_bounds__(kWarpKernelThreads) softmax_warp_kernel(RowArgs<Op> args, int lanes_log2) {
  using In = typename Op::In;
  using Out = typename Op::Out;
  using C = typename Op::C;
  constexpr int S = Op::kStreams;
  const Op op = args.op;
  const int lanes = 1 << lanes_log2;
  const int lane = threadIdx.x % kWarpSize;
  const int lane_in_row = lane & (lanes - 1);
  const int rows_per_warp = kWarpSize >> lanes_log2;
  const int row_in_block = static_cast<int>(threadIdx.x / kWarpSize) * rows_per_warp + (lane >> lanes_log2);
  const int64_t rows_per_block = static_cast<int64_t>(blockDim.x / kWarpSize) * rows_per_warp;
  const int64_t n_packs = args.n / VEC;  // VEC > 1 only when VEC divides n
  if (n_packs > static_cast<int64_t>(PACKS) * lanes) __trap();  // a dispatcher bug, never a wrong answer

  for (int64_t first = blockIdx.x * rows_per_block; first < args.rows;
       first += static_cast<int64_t>(gridDim.x) * rows_per_block) {
    const int64_t row = first + row_in_block;
    const bool row_valid = row < args.rows;
    const int64_t row_offset = row * args.n;

    Pack<In, VEC> cache[S][PACKS];
#pragma unroll
    for (int p = 0; p < PACKS; ++p) {
      const int64_t k = static_cast<int64_t>(p) * lanes + lane_in_row;
#pragma unroll
      for (int s = 0; s < S; ++s) {
        if (row_valid && k < n_packs) {
          cache[s][p] = load_vec<In, VEC>(args.in[s] + row_offset + k * VEC);
        } else {
          cache[s][p] = filled_pack<In, VEC>(Op::pad(s));
        }
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
    acc = warp_all_reduce<Op>(acc, lanes);  // every lane, valid row or not: the shuffles need all 32
    const typename Op::Row row_consts = op.finalize(acc);

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
          result.v[j] = op.apply(row_consts, v);
        }
        store_vec<Out, VEC>(args.out + row_offset + k * VEC, result);
      }
    }
  }
}

}  // namespace softmax_ops::detail
