// fused_topk host-side template dispatch, used by the .cu launch functions: dtype tags, the forward's
// (input, output) dtype pairs and load width; dispatch_int and allow_dynamic_smem from softmax_ops/launch_utils.h.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <type_traits>

#include "softmax_ops/device_utils.cuh"
#include "softmax_ops/launch_utils.h"

namespace softmax_ops::topk {

template <typename T>
struct TypeTag {
  using type = T;
};

// Calls f(TypeTag<T>{}) with the element type of t.
template <typename F>
cudaError_t dispatch_dtype(DType t, F&& f) {
  switch (t) {
    case DType::kFloat32:
      return f(TypeTag<float>{});
    case DType::kFloat16:
      return f(TypeTag<__half>{});
    case DType::kBFloat16:
      return f(TypeTag<__nv_bfloat16>{});
    case DType::kFloat64:
      return f(TypeTag<double>{});
  }
  return cudaErrorInvalidValue;
}

// Calls f(TypeTag<In>{}, TypeTag<Out>{}) for the pairs the forward kernels are built for: the same dtype
// twice, or float16/bfloat16 read directly into float32 results (softmax's dtype=torch.float32).
template <typename F>
cudaError_t dispatch_in_out(DType in, DType out, F&& f) {
  if (in == out) return dispatch_dtype(in, [&](auto tag) { return f(tag, tag); });
  if (out == DType::kFloat32 && in == DType::kFloat16) return f(TypeTag<__half>{}, TypeTag<float>{});
  if (out == DType::kFloat32 && in == DType::kBFloat16) return f(TypeTag<__nv_bfloat16>{}, TypeTag<float>{});
  return cudaErrorInvalidValue;
}

// Calls f(TypeTag<In>{}, TypeTag<Out>{}, std::bool_constant<kVectorLoads>{}) for a forward problem's dtype pair
// (dispatch_in_out) and its plan's load width: the instance a launch function runs.
template <typename Problem, typename Plan, typename F>
cudaError_t dispatch_forward_instance(const Problem& problem, const Plan& plan, F&& f) {
  return dispatch_in_out(problem.in_dtype, problem.out_dtype, [&](auto in_tag, auto out_tag) {
    return plan.vector_loads ? f(in_tag, out_tag, std::true_type{}) : f(in_tag, out_tag, std::false_type{});
  });
}

using detail::allow_dynamic_smem;  // softmax_ops/launch_utils.h
using detail::dispatch_int;

}  // namespace softmax_ops::topk
