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
    return dispatch_vec<typename Op::In>(plan.vec, [&](auto vec) -> cudaError_t {
      constexpr int kVec = std::decay_t<decltype(vec)>::value;
      if (plan.kernel == SoftmaxKernel::kTwoPass) {
        if (plan.peel) {
          if constexpr (kVec > 1) {
            softmax_two_pass_kernel<Op, kVec, /*kPeel=*/true><<<grid, plan.threads, 0, stream>>>(args);
            return cudaGetLastError();
          } else {
            return cudaErrorInvalidValue;  // never planned: peeled rows read their body in 16-byte packs
          }
        }
        softmax_two_pass_kernel<Op, kVec><<<grid, plan.threads, 0, stream>>>(args);
        return cudaGetLastError();
      }
      if (plan.kernel != SoftmaxKernel::kSplitRow || ptrs.workspace == nullptr) return cudaErrorInvalidValue;
      Acc* partials = static_cast<Acc*>(ptrs.workspace);
      auto launch_split = [&](auto peel) -> cudaError_t {
        constexpr bool kPeel = decltype(peel)::value;
        softmax_split_partials_kernel<Op, kVec, kPeel><<<grid, plan.threads, 0, stream>>>(args, plan.chunks, partials);
        cudaError_t err = cudaGetLastError();
        if (err != cudaSuccess) return err;
        softmax_split_apply_kernel<Op, kVec, kPeel><<<grid, plan.threads, 0, stream>>>(args, plan.chunks, partials);
        return cudaGetLastError();
      };
      if (plan.peel) {
        if constexpr (kVec > 1) {
          return launch_split(std::true_type{});
        } else {
          return cudaErrorInvalidValue;  // never planned: peeled rows read their body in 16-byte packs
        }
      }
      return launch_split(std::false_type{});
    });
  });
}

}  // namespace softmax_ops
