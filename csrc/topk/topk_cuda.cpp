// CUDA implementations of fused_topk and fused_topk_backward: argument checks (the same as the CPU
// kernels, via op_checks.h), the dim-last layout, outputs and workspaces from the caching allocator, the
// dispatcher's plan, and a launch check after every launch. No host synchronisation anywhere, so both ops
// can be captured in CUDA graphs.
//
// Layout: the kernels see rows of n contiguous elements. A reduced dim that is not last is moved last
// with one transposing copy in (and the [.., k] results moved back with one small copy out); this is the
// documented cost of dim != -1 for fused_topk, whose outputs are only k per row.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <limits>
#include <string>
#include <tuple>
#include <vector>

#include "softmax_ops/dtype_rules.h"
#include "softmax_ops/dtype_tags.h"
#include "softmax_ops/op_checks.h"
#include "topk_dispatch.h"
#include "topk_launch.h"

namespace softmax_ops::topk {
namespace {

DType dtype_tag(at::ScalarType t) { return require_dtype_tag(t, "softmax_ops (CUDA)"); }

// `t` with `wrapped_dim` moved last (a view; 0-d stays 0-d).
at::Tensor dim_last(const at::Tensor& t, int64_t wrapped_dim) {
  return t.dim() == 0 ? t : t.movedim(wrapped_dim, -1);
}

std::vector<int64_t> with_last(const at::Tensor& t, int64_t last) {
  std::vector<int64_t> shape = t.sizes().vec();
  if (!shape.empty()) shape.back() = last;
  return shape;
}

// 16-byte vector loads need every row start aligned: an aligned base and rows of whole 16-byte vectors.
bool rows_are_vector_aligned(const void* ptr, int64_t n, DType dtype) {
  return reinterpret_cast<uintptr_t>(ptr) % 16 == 0 && whole_vectors(n, dtype);
}

// Rows that are not rows_are_vector_aligned, read as each row's aligned body of vectors and its < 2 V edge
// elements singly (topk_chunk.cuh), where the plan peels rows of this length (TopkPlan::peel_min_n, from the
// dispatcher) and the data is element-aligned.
bool plan_peels_rows(const TopkPlan& plan, const void* ptr, int64_t n, DType dtype) {
  return plan_peels_length(plan, n) && !plan.vector_loads && reinterpret_cast<uintptr_t>(ptr) % dtype_bytes(dtype) == 0;
}

void check_row_length(int64_t n, const char* op) {
  TORCH_CHECK_VALUE(n <= std::numeric_limits<int32_t>::max(), "softmax_ops.", op,
                    ": rows longer than 2^31 - 1 elements are not supported on CUDA (N = ", std::to_string(n), ")");
}

void launch_plan(const TopkProblem& problem, TopkPlan plan, const at::Tensor& input, at::Tensor& values,
                 at::Tensor& indices, cudaStream_t stream) {
  TopkPointers ptrs;
  ptrs.x = input.const_data_ptr();
  ptrs.values = values.mutable_data_ptr();
  ptrs.indices = indices.mutable_data_ptr<int64_t>();
  plan.vector_loads = rows_are_vector_aligned(ptrs.x, problem.n, problem.in_dtype);
  plan.peel = plan_peels_rows(plan, ptrs.x, problem.n, problem.in_dtype);
  at::Tensor workspace;
  if (plan.workspace_bytes > 0) {
    workspace = at::empty({static_cast<int64_t>(plan.workspace_bytes)}, input.options().dtype(at::kByte));
    ptrs.workspace = workspace.mutable_data_ptr();
  }
  switch (plan.kernel) {
    case TopkKernel::kWarp:
      C10_CUDA_CHECK(launch_topk_warp(problem, plan, ptrs, stream));
      return;
    case TopkKernel::kRows:
      C10_CUDA_CHECK(launch_topk_rows(problem, plan, ptrs, stream));
      return;
    case TopkKernel::kBlock:
    case TopkKernel::kSplitRow:
      C10_CUDA_CHECK(launch_topk_block(problem, plan, ptrs, stream));
      return;
    case TopkKernel::kSplitHist:
      C10_CUDA_CHECK(launch_topk_split_hist(problem, plan, ptrs, stream));
      return;
    case TopkKernel::kRadix: {
      // Select the k best of each row (unordered), sort them by key descending with ties by index ascending
      // (a stable sort by key after a sort by index), then compute the probabilities.
      const auto long_options = input.options().dtype(at::kLong);
      at::Tensor sel_key = at::empty({problem.rows, problem.k}, long_options);
      at::Tensor sel_idx = at::empty({problem.rows, problem.k}, long_options);
      C10_CUDA_CHECK(launch_topk_radix_select(problem, plan, ptrs, sel_key.mutable_data_ptr<int64_t>(),
                                              sel_idx.mutable_data_ptr<int64_t>(), stream));
      const at::Tensor by_index = sel_idx.argsort(/*stable=*/false, /*dim=*/-1, /*descending=*/false);
      const at::Tensor keys = sel_key.gather(-1, by_index);
      const at::Tensor idx = sel_idx.gather(-1, by_index);
      const at::Tensor by_key = std::get<1>(keys.sort(/*stable=*/true, /*dim=*/-1, /*descending=*/true));
      const at::Tensor sorted_key = keys.gather(-1, by_key).contiguous();
      const at::Tensor sorted_idx = idx.gather(-1, by_key).contiguous();
      C10_CUDA_CHECK(launch_topk_radix_finalize(problem, plan, ptrs, sorted_key.const_data_ptr<int64_t>(),
                                                sorted_idx.const_data_ptr<int64_t>(), stream));
      return;
    }
  }
}

std::tuple<at::Tensor, at::Tensor> fused_topk_cuda(const at::Tensor& self, int64_t k, int64_t dim, bool renormalize,
                                                   c10::optional<at::ScalarType> dtype) {
  const at::ScalarType result_dtype = softmax_result_dtype(self, dtype, "fused_topk");
  const int64_t wrapped = wrap_dim(self, dim, "fused_topk");
  const int64_t n = check_topk_k(self, wrapped, k);
  check_row_length(n, "fused_topk");
  const c10::cuda::CUDAGuard guard(self.device());
  const at::Tensor input = softmax_kernel_input(dim_last(self, wrapped), result_dtype);
  const std::vector<int64_t> shape = with_last(input, k);
  at::Tensor values = at::empty(shape, input.options().dtype(result_dtype));
  at::Tensor indices = at::empty(shape, input.options().dtype(at::kLong));
  const int64_t rows = n == 0 ? 0 : input.numel() / n;
  if (rows > 0) {
    TopkProblem problem;
    problem.in_dtype = dtype_tag(input.scalar_type());
    problem.out_dtype = dtype_tag(result_dtype);
    problem.rows = rows;
    problem.n = n;
    problem.k = k;
    problem.renormalize = renormalize;
    const TopkPlan plan = resolve_topk_plan(rows, n, k, problem.in_dtype, topk_device_props());
    launch_plan(problem, plan, input, values, indices, c10::cuda::getCurrentCUDAStream().stream());
  }
  return {restore_dim_order(values, wrapped), restore_dim_order(indices, wrapped)};
}

// The gradient is computed in the dtype the forward kernel read (self's, or the forward's dtype= when that
// was a real cast: values' dtype says which) and cast to self's dtype at the end, like torch's autograd
// through the cast.
at::Tensor fused_topk_backward_cuda(const at::Tensor& grad_values, const at::Tensor& self, const at::Tensor& values,
                                   const at::Tensor& indices, int64_t dim, bool renormalize) {
  const int64_t wrapped = check_topk_backward_args(grad_values, self, values, indices, dim);
  const c10::cuda::CUDAGuard guard(self.device());
  const at::ScalarType self_dtype = self.scalar_type();
  const at::ScalarType values_dtype = values.scalar_type();
  const at::ScalarType work_dtype = softmax_kernel_input_dtype(self_dtype, values_dtype);
  const at::ScalarType compute_dtype = work_dtype == at::kDouble ? at::kDouble : at::kFloat;
  const at::Tensor self_last = dim_last(self, wrapped);
  const int64_t n = self.dim() == 0 ? 1 : self.size(wrapped);
  check_row_length(n, "fused_topk_backward");
  // The renormalised gradient never reads x: only its shape is needed.
  const at::Tensor x = renormalize ? at::Tensor() : self_last.to(work_dtype).contiguous();
  const at::Tensor idx = dim_last(indices, wrapped).contiguous();
  const at::Tensor g = dim_last(grad_values, wrapped).to(compute_dtype).contiguous();
  const at::Tensor v = dim_last(values, wrapped).to(compute_dtype).contiguous();
  const int64_t k = indices.dim() == 0 ? 1 : indices.size(wrapped);
  at::Tensor grad_self = at::empty(self_last.sizes(), self.options().dtype(work_dtype));
  const int64_t rows = n == 0 ? 0 : grad_self.numel() / n;
  if (rows > 0) {
    TopkBackwardProblem problem;
    problem.dtype = dtype_tag(work_dtype);
    problem.rows = rows;
    problem.n = n;
    problem.k = k;
    problem.renormalize = renormalize;
    TopkBackwardPlan plan = resolve_topk_backward_plan(rows, n, problem.dtype, topk_device_props());
    TopkBackwardPointers ptrs;
    ptrs.x = renormalize ? nullptr : x.const_data_ptr();
    ptrs.grad = g.const_data_ptr();
    ptrs.values = v.const_data_ptr();
    ptrs.indices = idx.const_data_ptr<int64_t>();
    ptrs.dx = grad_self.mutable_data_ptr();
    const void* probe = renormalize ? ptrs.dx : ptrs.x;
    plan.vector_loads = rows_are_vector_aligned(probe, n, problem.dtype) &&
                        rows_are_vector_aligned(ptrs.dx, n, problem.dtype);
    at::Tensor workspace;
    if (plan.workspace_bytes > 0) {
      workspace = at::empty({static_cast<int64_t>(plan.workspace_bytes)}, self.options().dtype(at::kByte));
      ptrs.workspace = workspace.mutable_data_ptr();
    }
    C10_CUDA_CHECK(launch_topk_backward(problem, plan, ptrs, c10::cuda::getCurrentCUDAStream().stream()));
  }
  const at::Tensor restored = restore_dim_order(grad_self, wrapped);
  return work_dtype == self_dtype ? restored : restored.to(self_dtype);
}

}  // namespace
}  // namespace softmax_ops::topk

TORCH_LIBRARY_IMPL(softmax_ops, CUDA, m) {
  m.impl("fused_topk", &softmax_ops::topk::fused_topk_cuda);
  m.impl("fused_topk_backward", &softmax_ops::topk::fused_topk_backward_cuda);
}
