// Between ATen's ScalarType and the DType tag the kernel files take. Host code only (ATen): the CUDA
// launchers and the fused_topk explain text share it.
#pragma once

#include <c10/core/ScalarType.h>
#include <c10/util/Exception.h>

#include <optional>

#include "softmax_ops/device_utils.cuh"  // DType

namespace softmax_ops {

// The DType of a ScalarType the kernels are built for (float32, float16, bfloat16, float64), else nullopt.
inline std::optional<DType> dtype_tag_of(c10::ScalarType type) {
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
      return std::nullopt;
  }
}

// dtype_tag_of(type), or a TypeError that names `who` (the op's checks reject other dtypes first, so
// this only fires for callers that skip them, such as explain).
inline DType require_dtype_tag(c10::ScalarType type, const char* who) {
  const std::optional<DType> tag = dtype_tag_of(type);
  TORCH_CHECK_TYPE(tag.has_value(), who, ": dtype must be float32, float16, bfloat16 or float64, got ", type);
  return *tag;
}

}  // namespace softmax_ops
