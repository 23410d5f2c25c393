// Which dtype the softmax-family and fused_topk kernels read for a (input, result) dtype pair: shared by the
// launchers (op_checks.cpp: softmax_kernel_input; the CPU and CUDA softmax backwards; topk_cuda.cpp's backward)
// and the explain texts, so they cannot disagree. c10 only: the CPU-only build compiles op_checks.cpp too.
#pragma once

#include <c10/core/ScalarType.h>

namespace softmax_ops {

// The dtype the kernels read for an input of dtype `in` and a result of `result_dtype` (softmax's dtype=,
// fused_topk's too): float16 / bfloat16 -> float32 is read directly (an exact cast, no extra pass); any other
// change of dtype casts the input to result_dtype first, as torch does.
inline c10::ScalarType softmax_kernel_input_dtype(c10::ScalarType in, c10::ScalarType result_dtype) {
  const bool half_to_float = (in == c10::ScalarType::Half || in == c10::ScalarType::BFloat16) &&
                             result_dtype == c10::ScalarType::Float;
  return half_to_float ? in : result_dtype;
}

// The dtype a softmax backward writes for a forward input of `input_dtype` whose output has `output_dtype`:
// input_dtype where the kernels hold that pair (the same dtype, or float32 streams and a 16-bit gradient: the
// backward of the directly read forward above), else output_dtype, cast to input_dtype afterwards, as torch's
// autograd does through the forward's cast. The same pair rule, seen from the other side.
inline c10::ScalarType softmax_backward_write_dtype(c10::ScalarType output_dtype, c10::ScalarType input_dtype) {
  return softmax_kernel_input_dtype(input_dtype, output_dtype);
}

}  // namespace softmax_ops
