// The one place where every softmax_ops schema is defined. Backends register their kernels with
// TORCH_LIBRARY_IMPL in their own files (cpu/, softmax/, topk/); fake impls and autograd live in Python.
#include <torch/library.h>

#include "softmax_ops/kernel_registry.h"

TORCH_LIBRARY(softmax_ops, m) {
  // softmax over `dim`; with dtype the input is cast to dtype first, exactly like torch.softmax.
  m.def("softmax(Tensor self, int dim, ScalarType? dtype=None) -> Tensor");
  // log_softmax over `dim`, same dtype rule as softmax.
  m.def("log_softmax(Tensor self, int dim, ScalarType? dtype=None) -> Tensor");
  // grad_input = output * (grad_output - sum(grad_output * output)), returned in input_dtype.
  m.def("softmax_backward(Tensor grad_output, Tensor output, int dim, ScalarType input_dtype) -> Tensor");
  // grad_input = grad_output - exp(output) * sum(grad_output), returned in input_dtype.
  m.def("log_softmax_backward(Tensor grad_output, Tensor output, int dim, ScalarType input_dtype) -> Tensor");
  // The k largest softmax probabilities along dim (sorted, ties to the lower index), optionally renormalised.
  m.def("fused_topk(Tensor self, int k, int dim=-1, bool renormalize=False, ScalarType? dtype=None) -> (Tensor values, Tensor indices)");
  // Gradient of fused_topk's values w.r.t. self; reads self at most twice, never stores the probability row.
  m.def("fused_topk_backward(Tensor grad_values, Tensor self, Tensor values, Tensor indices, int dim, bool renormalize) -> Tensor");

  // Kernel-menu controls (no tensors, not traced): force a kernel of a family, list a family, explain a choice.
  m.def("_set_kernel_override(str family, str kernel) -> ()", &softmax_ops::set_kernel_override);
  m.def("_get_kernel_override(str family) -> str", &softmax_ops::kernel_override);
  m.def("_list_kernels(str family) -> str[]", &softmax_ops::list_kernels);
  m.def("_explain(str op, int[] shape, int dim, ScalarType dtype, int k=0, ScalarType? out_dtype=None) -> str",
        &softmax_ops::explain);
}
