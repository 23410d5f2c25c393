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
      return dispatch_int(RegPackBuckets{}, plan.reg_packs, [&](auto packs) {
        softmax_warp_kernel<Op, std::decay_t<decltype(vec)>::value, std::decay_t<decltype(packs)>::value>
            <<<static_cast<unsigned>(plan.grid), plan.threads, 0, stream>>>(args, lanes_log2);
        return cudaGetLastError();
      });
    });
  });
}

}  // namespace softmax_ops
