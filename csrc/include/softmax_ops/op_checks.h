// Argument checks and layout helpers shared by the CPU and CUDA implementations of every op, so that
// both backends raise the same errors and agree on shapes and dtypes (meta/ states the same rules).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/Optional.h>

#include <cstdint>

namespace softmax_ops {

// A contiguous tensor seen as [outer, n, inner] with the reduction over n.
// inner == 1 means rows are contiguous; inner > 1 means the reduced dim is strided by `inner`.
struct RowLayout {
  int64_t outer = 1;
  int64_t n = 1;
  int64_t inner = 1;
  int64_t rows() const { return outer * inner; }
};

// Raises unless `t` is float32/float16/bfloat16/float64; `arg` names it in the message.
void check_floating(const at::Tensor& t, const char* op, const char* arg);

// Wraps a possibly negative dim; a 0-d tensor accepts dim in {-1, 0}. Raises IndexError-style message.
int64_t wrap_dim(const at::Tensor& self, int64_t dim, const char* op);

// Layout of a CONTIGUOUS tensor around the (wrapped) dim. 0-d tensors are one row of length 1.
RowLayout row_layout(const at::Tensor& contiguous, int64_t wrapped_dim);

// A result computed with `wrapped_dim` moved last (a fresh tensor of at::empty's strides), back in the caller's
// dim order with the strides torch gives its results: contiguous, size-1 dims included, as the fake kernels say.
// movedim(...).contiguous() alone kept the dim-last strides of size-1 dims (a result of shape (4, 1, 6) over dim 1
// came back with strides (6, 1, 1) where torch has (6, 6, 1)), since such a tensor already counts as contiguous.
// Copies only where the memory order differs.
at::Tensor restore_dim_order(const at::Tensor& dim_last_result, int64_t wrapped_dim);

// The dtype of softmax(self, dim, dtype): dtype if given, else self's dtype (checked floating). It also
// refuses a dual tensor (forward-mode AD), as check_softmax_backward_args and check_topk_backward_args do.
at::ScalarType softmax_result_dtype(const at::Tensor& self, c10::optional<at::ScalarType> dtype,
                                    const char* op);

// What the kernel reads for softmax(self, dim, dtype): torch casts the input to dtype first. For
// float16/bfloat16 -> float32 the cast is exact and the kernels read the narrow input directly (the
// router's `softmax(x, dtype=torch.float32)` costs no extra pass); every other change of dtype is cast
// here first, which is what torch does. Always returns a contiguous tensor.
at::Tensor softmax_kernel_input(const at::Tensor& self, at::ScalarType result_dtype);

// Checks k against the size of dim (k in [1, N]); returns N.
int64_t check_topk_k(const at::Tensor& self, int64_t wrapped_dim, int64_t k);

// Checks grad_output against output (same shape and device, floating) and input_dtype (floating).
void check_softmax_backward_args(const at::Tensor& grad_output, const at::Tensor& output,
                                 at::ScalarType input_dtype, const char* op);

// Checks the fused_topk_backward arguments (dtypes, dim, devices, shapes, in that order, as meta/ states them);
// returns the wrapped dim.
int64_t check_topk_backward_args(const at::Tensor& grad_values, const at::Tensor& self, const at::Tensor& values,
                                 const at::Tensor& indices, int64_t dim);

// Shape of self with the size at wrapped_dim replaced by k (0-d stays 0-d).
std::vector<int64_t> topk_output_shape(const at::Tensor& self, int64_t wrapped_dim, int64_t k);

}  // namespace softmax_ops
