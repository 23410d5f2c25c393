// Between ATen's ScalarType and the DType tag the kernel files take. Host code only (ATen): the CUDA
// launchers and the fused_topk explain text share it.
#pragma once

#include <c10/core/ScalarType.h>
#include <c10/util/Exception.h>

#include "softmax_ops/device_utils.cuh"  // DType

namespace softmax_ops {

// The DType of a ScalarType the kernels are built for (float32, float16, bfloat16, float64); any other
// raises a NotImplementedError that names `who` (the ops' own checks reject other dtypes first, so this fires
// only for callers that skip them, such as explain).
inline DType require_dtype_tag(c10::ScalarType type, const char* who) {
  switch (type) {
    case c10::ScalarType::Float:
      return DType::kFloat32;
    case c10::ScalarType::Half:
      return DType::kFloat16;
    case c10::ScalarType::BFloat16:
      return DType::kBFloat16;
    case c10::ScalarType::Double:
      return DType::kFloat64;
    default:
      TORCH_CHECK_NOT_IMPLEMENTED(false, who, ": dtype must be float32, float16, bfloat16 or float64, got ", type);
  }
}

}  // namespace softmax_ops
