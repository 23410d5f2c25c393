// Dtype dispatch and row layout for the CPU kernels. Every CPU op sees its operand as contiguous rows with
// the reduced dim last; the kernels themselves take raw pointers and sizes only.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Exception.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cstdint>

namespace softmax_ops::cpu {

// Carries a C++ element type into a generic lambda: `[&](auto tag) { using T = typename decltype(tag)::type; }`.
template <typename T>
struct TypeTag {
  using type = T;
};

// Calls fn(TypeTag<T>{}) with the C++ type of one of the four supported floating dtypes.
template <typename Fn>
void dispatch_floating(at::ScalarType dtype, Fn&& fn) {
  switch (dtype) {
    case at::kFloat:
      return fn(TypeTag<float>{});
    case at::kDouble:
      return fn(TypeTag<double>{});
    case at::kHalf:
      return fn(TypeTag<c10::Half>{});
    case at::kBFloat16:
      return fn(TypeTag<c10::BFloat16>{});
    default:
      TORCH_CHECK_NOT_IMPLEMENTED(false, "softmax_ops (CPU): unsupported dtype ", dtype);
  }
}

// Calls fn(TypeTag<First>{}, TypeTag<Second>{}) for the dtype pairs the kernels are instantiated for: the
// same dtype twice, or float16/bfloat16 paired with float32 (torch's half_to_float case). kNarrowFirst says
// which side the float16/bfloat16 is on: the forward reads narrow and writes float32, the backward reads
// float32 and writes narrow. The op code has already reduced every other pair to the same-dtype case.
template <bool kNarrowFirst, typename Fn>
void dispatch_dtype_pair(at::ScalarType first, at::ScalarType second, Fn&& fn) {
  if (first == second) {
    return dispatch_floating(first, [&](auto tag) { fn(tag, tag); });
  }
  const at::ScalarType narrow = kNarrowFirst ? first : second;
  const at::ScalarType wide = kNarrowFirst ? second : first;
  TORCH_CHECK(wide == at::kFloat && (narrow == at::kHalf || narrow == at::kBFloat16),
              "softmax_ops (CPU): internal error, no kernel for dtypes ", first, " and ", second);
  auto call = [&](auto narrow_tag) {
    if constexpr (kNarrowFirst) {
      fn(narrow_tag, TypeTag<float>{});
    } else {
      fn(TypeTag<float>{}, narrow_tag);
    }
  };
  if (narrow == at::kHalf) {
    call(TypeTag<c10::Half>{});
  } else {
    call(TypeTag<c10::BFloat16>{});
  }
}

// `t` with `wrapped_dim` moved last, as a view (for callers that copy anyway, e.g. softmax_kernel_input).
inline at::Tensor dim_last_view(const at::Tensor& t, int64_t wrapped_dim) {
  return t.dim() == 0 ? t : t.movedim(wrapped_dim, -1);
}

// `t` with `wrapped_dim` moved last, contiguous: a free view when dim is already last and t is contiguous.
// CPU speed for a non-last dim is not a goal (DESIGN.md §4 is about CUDA), so one copy in and one out is fine.
inline at::Tensor with_dim_last(const at::Tensor& t, int64_t wrapped_dim) {
  return dim_last_view(t, wrapped_dim).contiguous();
}

// Length of the last dim of a dim-last tensor (a 0-d tensor is one row of length 1).
inline int64_t row_length(const at::Tensor& t) { return t.dim() == 0 ? 1 : t.size(-1); }

// Rows of length n in a tensor of numel elements (0 for an empty tensor).
inline int64_t row_count(int64_t numel, int64_t n) { return n == 0 ? 0 : numel / n; }

// Rows per at::parallel_for task: about 32K elements each, so a small tensor stays on one thread
// (the fork costs more than the work) and a big one splits evenly.
inline int64_t rows_grain(int64_t n) {
  constexpr int64_t kElementsPerTask = 32 * 1024;
  return std::max<int64_t>(1, kElementsPerTask / std::max<int64_t>(n, 1));
}

}  // namespace softmax_ops::cpu
