// Launches the kernels that stream rows (two_pass, split_row, strided), forward and backward.
#include "softmax_streaming_kernels.cuh"

namespace softmax_ops {

cudaError_t launch_softmax_streaming(const SoftmaxProblem& problem, const SoftmaxPlan& plan,
                                     const SoftmaxPointers& ptrs, cudaStream_t stream) {
  using namespace detail;
  const unsigned grid = static_cast<unsigned>(plan.grid);
  return dispatch_row_op(problem, [&](auto op) -> cudaError_t {
    using Op = decltype(op);
    using Acc = typename Op::Acc;
    const RowArgs<Op> args = make_row_args(op, problem, ptrs);
    if (plan.kernel == SoftmaxKernel::kStrided) {
      if (plan.block_x < 1 || plan.threads % plan.block_x != 0) return cudaErrorInvalidValue;
      const dim3 block(plan.block_x, plan.threads / plan.block_x);
      softmax_strided_kernel<Op><<<grid, block, 0, stream>>>(args);
      return cudaGetLastError();
    }
    // Whole warps: the lane-pair stores of widening results shuffle over all 32 lanes (store_pack_where).
    if (plan.threads % 32 != 0) return cudaErrorInvalidValue;
    return dispatch_vec<typename Op::In>(plan.vec, [&](auto vec) -> cudaError_t {
      constexpr int kVec = std::decay_t<decltype(vec)>::value;
      // launch(std::bool_constant<kPeel>) with the plan's peeling: peeled rows read their body in 16-byte packs,
      // so single-element instances have no peeled form (never planned).
      auto with_peel = [&](auto&& launch) -> cudaError_t {
        if (!plan.peel) return launch(std::false_type{});
        if constexpr (kVec > 1) {
          return launch(std::true_type{});
        } else {
          return cudaErrorInvalidValue;
        }
      };
      if (plan.kernel == SoftmaxKernel::kTwoPass) {
        return with_peel([&](auto peel) -> cudaError_t {
          softmax_two_pass_kernel<Op, kVec, decltype(peel)::value><<<grid, plan.threads, 0, stream>>>(args);
          return cudaGetLastError();
        });
      }
      if (plan.kernel != SoftmaxKernel::kSplitRow || ptrs.workspace == nullptr) return cudaErrorInvalidValue;
      Acc* partials = static_cast<Acc*>(ptrs.workspace);
      return with_peel([&](auto peel) -> cudaError_t {
        constexpr bool kPeel = decltype(peel)::value;
        softmax_split_partials_kernel<Op, kVec, kPeel><<<grid, plan.threads, 0, stream>>>(args, plan.chunks, partials);
        cudaError_t err = cudaGetLastError();
        if (err != cudaSuccess) return err;
        softmax_split_apply_kernel<Op, kVec, kPeel><<<grid, plan.threads, 0, stream>>>(args, plan.chunks, partials);
        return cudaGetLastError();
      });
    });
  });
}

}  // namespace softmax_ops
