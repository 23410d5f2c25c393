#include "softmax_ops/op_checks.h"

#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>
#include <c10/util/strides.h>

#include <string>

#include "softmax_ops/dtype_rules.h"
#include "softmax_ops/text.h"

namespace softmax_ops {

// Unsupported dtypes raise NotImplementedError (a RuntimeError), as torch's own softmax does ("not implemented
// for 'Long'"): code that catches torch's error catches ours.
static bool is_supported_float(at::ScalarType t) {
  return t == at::kFloat || t == at::kHalf || t == at::kBFloat16 || t == at::kDouble;
}

// The ops have backward formulas only. A dual tensor (torch.autograd.forward_ad) reaches the kernels with its
// tangent, which they would drop: the result's tangent came out missing, silently. The public wrappers
// (ops.py) refuse it before the call; this catches direct torch.ops.softmax_ops calls. One forward-AD level
// exists at a time (level 0).
static void refuse_forward_grad(const at::Tensor& t, const char* op, const char* arg) {
  TORCH_CHECK(!t._fw_grad(/*level=*/0).defined(), "softmax_ops.", op, ": forward-mode AD is not supported (",
              arg, " is a dual tensor; the op has a backward formula only)");
}

void check_floating(const at::Tensor& t, const char* op, const char* arg) {
  TORCH_CHECK_NOT_IMPLEMENTED(is_supported_float(t.scalar_type()), "softmax_ops.", op, ": ", arg,
                              " must be float32, float16, bfloat16 or float64, got ", t.scalar_type());
}

int64_t wrap_dim(const at::Tensor& self, int64_t dim, const char* op) {
  const int64_t ndim = std::max<int64_t>(self.dim(), 1);  // 0-d behaves like 1-d for dim wrapping
  // Numbers go through std::to_string, never an iostream (see text.h).
  TORCH_CHECK_INDEX(dim >= -ndim && dim < ndim, "softmax_ops.", op, ": dim (got ", std::to_string(dim),
                    ") is out of range for a tensor with ", std::to_string(self.dim()),
                    " dimensions (expected in [", std::to_string(-ndim), ", ", std::to_string(ndim - 1), "])");
  return dim < 0 ? dim + ndim : dim;
}

RowLayout row_layout(const at::Tensor& contiguous, int64_t wrapped_dim) {
  RowLayout layout;
  if (contiguous.dim() == 0) return layout;
  const auto sizes = contiguous.sizes();
  for (int64_t d = 0; d < wrapped_dim; ++d) layout.outer *= sizes[d];
  layout.n = sizes[wrapped_dim];
  for (int64_t d = wrapped_dim + 1; d < contiguous.dim(); ++d) layout.inner *= sizes[d];
  return layout;
}

at::Tensor restore_dim_order(const at::Tensor& dim_last_result, int64_t wrapped_dim) {
  const at::Tensor& t = dim_last_result;
  if (t.dim() == 0 || wrapped_dim == t.dim() - 1) return t;
  // Below ADInplaceOrView: the copy's copy_ and the set_ below would each count as an in-place write of the
  // result (version 1), where torch's results start at version 0.
  const at::AutoDispatchBelowADInplaceOrView below_inplace_or_view;
  const at::Tensor moved = t.movedim(-1, wrapped_dim);
  if (!moved.is_contiguous()) return moved.contiguous();  // a copy, into at::empty's strides
  // The same memory order (the dims after wrapped_dim are all of size 1): only size-1 dims' strides differ.
  // The same storage under torch's strides; a tensor of its own, not a view of t (which the caller drops).
  at::Tensor restrided = at::empty({0}, t.options());
  restrided.set_(t.storage(), t.storage_offset(), moved.sizes(), c10::contiguous_strides(moved.sizes()));
  return restrided;
}

at::ScalarType softmax_result_dtype(const at::Tensor& self, c10::optional<at::ScalarType> dtype,
                                    const char* op) {
  refuse_forward_grad(self, op, "self");
  if (!dtype.has_value()) {
    check_floating(self, op, "self");
    return self.scalar_type();
  }
  TORCH_CHECK_NOT_IMPLEMENTED(is_supported_float(*dtype), "softmax_ops.", op,
                              ": dtype must be float32, float16, bfloat16 or float64, got ", *dtype);
  // torch casts the input to dtype first, so integer, bool, complex (its real part, with torch's warning) and
  // float8 inputs work with a float dtype= too (torch.softmax(torch.arange(3), 0, dtype=torch.float32));
  // softmax_kernel_input makes that cast.
  const at::ScalarType in = self.scalar_type();
  const bool castable =
      is_supported_float(in) || at::isIntegralType(in, true) || at::isComplexType(in) || at::isFloat8Type(in);
  TORCH_CHECK_NOT_IMPLEMENTED(castable, "softmax_ops.", op,
                              ": self must be float32, float16, bfloat16 or float64 (or an integer, bool, ",
                              "complex or float8 tensor with a float dtype=), got ", in);
  return *dtype;
}

at::Tensor softmax_kernel_input(const at::Tensor& self, at::ScalarType result_dtype) {
  const at::ScalarType read = softmax_kernel_input_dtype(self.scalar_type(), result_dtype);
  return (self.scalar_type() == read ? self : self.to(read)).contiguous();
}

int64_t check_topk_k(const at::Tensor& self, int64_t wrapped_dim, int64_t k) {
  const int64_t n = self.dim() == 0 ? 1 : self.size(wrapped_dim);
  TORCH_CHECK_VALUE(k >= 1 && k <= n, "softmax_ops.fused_topk: k (got ", std::to_string(k),
                    ") must be in [1, N] where N = ", std::to_string(n), " is the size of dim ",
                    std::to_string(wrapped_dim));
  return n;
}

void check_softmax_backward_args(const at::Tensor& grad_output, const at::Tensor& output,
                                 at::ScalarType input_dtype, const char* op) {
  check_floating(grad_output, op, "grad_output");
  check_floating(output, op, "output");
  refuse_forward_grad(grad_output, op, "grad_output");
  refuse_forward_grad(output, op, "output");
  TORCH_CHECK_NOT_IMPLEMENTED(is_supported_float(input_dtype), "softmax_ops.", op,
                              ": input_dtype must be float32, float16, bfloat16 or float64, got ", input_dtype);
  TORCH_CHECK(grad_output.device() == output.device(), "softmax_ops.", op,
              ": grad_output and output must be on the same device, got ", grad_output.device().str(), " and ",
              output.device().str());
  TORCH_CHECK_VALUE(grad_output.sizes() == output.sizes(), "softmax_ops.", op, ": grad_output shape ",
                    shape_str(grad_output.sizes()), " must equal output shape ", shape_str(output.sizes()));
}

int64_t check_topk_backward_args(const at::Tensor& grad_values, const at::Tensor& self, const at::Tensor& values,
                                 const at::Tensor& indices, int64_t dim) {
  check_floating(self, "fused_topk_backward", "self");
  check_floating(grad_values, "fused_topk_backward", "grad_values");
  const int64_t wrapped_dim = wrap_dim(self, dim, "fused_topk_backward");
  check_floating(values, "fused_topk_backward", "values");
  refuse_forward_grad(self, "fused_topk_backward", "self");
  refuse_forward_grad(grad_values, "fused_topk_backward", "grad_values");
  refuse_forward_grad(values, "fused_topk_backward", "values");
  TORCH_CHECK(indices.scalar_type() == at::kLong, "softmax_ops.fused_topk_backward: indices must be int64, got ",
              indices.scalar_type());
  for (const at::Tensor* t : {&grad_values, &values, &indices}) {
    TORCH_CHECK(t->device() == self.device(),
                "softmax_ops.fused_topk_backward: grad_values, values and indices must be on self's device ",
                self.device().str(), ", got ", t->device().str());
  }
  TORCH_CHECK_VALUE(grad_values.sizes() == indices.sizes() && values.sizes() == indices.sizes(),
                    "softmax_ops.fused_topk_backward: grad_values ", shape_str(grad_values.sizes()), ", values ",
                    shape_str(values.sizes()), " and indices ", shape_str(indices.sizes()),
                    " must have the same shape");
  const int64_t k = indices.dim() == 0 ? 1 : indices.size(wrapped_dim);
  TORCH_CHECK_VALUE(topk_output_shape(self, wrapped_dim, k) == indices.sizes().vec(),
                    "softmax_ops.fused_topk_backward: indices shape ", shape_str(indices.sizes()),
                    " does not match self shape ", shape_str(self.sizes()), " with dim ", std::to_string(wrapped_dim),
                    " of size k");
  return wrapped_dim;
}

std::vector<int64_t> topk_output_shape(const at::Tensor& self, int64_t wrapped_dim, int64_t k) {
  std::vector<int64_t> shape = self.sizes().vec();
  if (!shape.empty()) shape[wrapped_dim] = k;
  return shape;
}

}  // namespace softmax_ops
