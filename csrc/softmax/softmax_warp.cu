// Launches the warp kernel (forward and backward) for the plan chosen in softmax_dispatch.cpp.
#include "softmax_warp_kernel.cuh"

namespace softmax_ops {

cudaError_t launch_softmax_warp(const SoftmaxProblem& problem, const SoftmaxPlan& plan,
                                const SoftmaxPointers& ptrs, cudaStream_t stream) {
  using namespace detail;
  int lanes_log2 = 0;
  while ((1 << lanes_log2) < plan.lanes_per_row) ++lanes_log2;
  if ((1 << lanes_log2) != plan.lanes_per_row || lanes_log2 > 5) return cudaErrorInvalidValue;
  return dispatch_row_op(problem, [&](auto op) {
    using Op = decltype(op);
    const RowArgs<Op> args = make_row_args(op, problem, ptrs);
    return dispatch_vec<typename Op::In>(plan.vec, [&](auto vec) {
      constexpr int kVec = std::decay_t<decltype(vec)>::value;
      return dispatch_int(RegPackBuckets{}, plan.reg_packs, [&](auto packs) -> cudaError_t {
        constexpr int kPacks = std::decay_t<decltype(packs)>::value;
        // Peeled rows read their body in 16-byte packs and their edge elements singly, edges_per_lane per lane:
        // single-element instances have no peeled form, and a row needs a slot per edge element (never planned
        // otherwise). Several edge elements per lane are compiled for 16-bit rows of a few packs per lane only.
        if (plan.peel) {
          if constexpr (kVec > 1) {
            const int64_t phase = static_cast<int64_t>(reinterpret_cast<uintptr_t>(ptrs.in0) /
                                                       sizeof(typename Op::In) % kVec);
            if (static_cast<int64_t>(plan.lanes_per_row) * plan.edges_per_lane <
                max_row_edges(phase, problem.n, problem.outer, kVec)) {
              return cudaErrorInvalidValue;
            }
            auto launch = [&](auto edges) -> cudaError_t {
              constexpr int kEdges = std::decay_t<decltype(edges)>::value;
              softmax_warp_kernel<Op, kVec, kPacks, kEdges>
                  <<<static_cast<unsigned>(plan.grid), plan.threads, 0, stream>>>(args, lanes_log2);
              return cudaGetLastError();
            };
            if (plan.edges_per_lane == 1) return launch(std::integral_constant<int, 1>{});
            constexpr int kMultiEdgeMaxPacks =
                Op::kStreams == 2 ? kWarpPeelMultiEdgeMaxPacksBackward : kWarpPeelMultiEdgeMaxPacks;
            static_assert(kWarpPeelMaxEdgesPerLane == 4, "instances for 2 and 4 edge elements per lane");
            if constexpr (kVec == 8 && kPacks <= kMultiEdgeMaxPacks) {
              if (plan.edges_per_lane == 2) return launch(std::integral_constant<int, 2>{});
              if (plan.edges_per_lane == 4) return launch(std::integral_constant<int, 4>{});
            }
            return cudaErrorInvalidValue;
          } else {
            return cudaErrorInvalidValue;
          }
        }
        softmax_warp_kernel<Op, kVec, kPacks><<<static_cast<unsigned>(plan.grid), plan.threads, 0, stream>>>(
            args, lanes_log2);
        return cudaGetLastError();
      });
    });
  });
}

}  // namespace softmax_ops
