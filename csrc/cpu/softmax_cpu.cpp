// CPU kernels of softmax, log_softmax and their backward ops: one row at a time, rows spread over threads.
// Arguments, result dtype and layout come from op_checks.h so CPU and CUDA raise the same errors.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <type_traits>
#include <vector>

#include "cpu_dispatch.h"
#include "cpu_row_math.h"
#include "softmax_ops/dtype_rules.h"
#include "softmax_ops/op_checks.h"

namespace softmax_ops::cpu {
namespace {

// Longest row whose exp(x - m) is kept in a float scratch row (256 KB per thread); longer rows with a
// float16/bfloat16 result recompute exp rather than allocate a row-sized buffer.
constexpr int64_t kMaxScratchRow = 64 * 1024;

// softmax (kLog = false) or log_softmax (kLog = true) of rows [begin, end) of length n:
//   m = max(x), s = sum exp(x - m);  softmax = exp(x - m) * (1 / s),  log_softmax = (x - m) - log(s).
// softmax computes exp(x - m) once and keeps it between the passes in the result itself when that has the
// compute type, else in the scratch row, so a narrow result is rounded once (computing exp twice instead
// made bfloat16 2048x4096 ~1.6x slower than torch). fused_topk's values use the same formula, bit for bit.
template <bool kLog, typename In, typename Out>
SOFTMAX_OPS_CPU_MULTIVERSION void softmax_rows(const In* x, Out* y, int64_t n, int64_t begin, int64_t end) {
  using Acc = acc_type<In>;
  constexpr bool kNarrowResult = !kLog && !std::is_same_v<Out, Acc>;
  std::vector<Acc> scratch(kNarrowResult && n <= kMaxScratchRow ? n : 0);
  for (int64_t row = begin; row < end; ++row) {
    const In* xr = x + row * n;
    Out* yr = y + row * n;
    const Acc m = row_max(xr, n);
    if constexpr (kLog) {
      const Acc log_sum = std::log(row_sum_exp(xr, m, n));
      map_row(xr, yr, n, [=](auto v) { return (v - m) - log_sum; });
    } else if constexpr (std::is_same_v<Out, Acc>) {
      const Acc sum = map_row_and_sum(xr, yr, n, [=](auto v) { return fast_exp(v - m); });
      scale_row(yr, n, Acc(1) / sum);
    } else if (!scratch.empty()) {
      const Acc sum = map_row_and_sum(xr, scratch.data(), n, [=](auto v) { return fast_exp(v - m); });
      const Acc inv_sum = Acc(1) / sum;
      map_row(scratch.data(), yr, n, [=](auto v) { return v * inv_sum; });
    } else {
      const Acc inv_sum = Acc(1) / row_sum_exp(xr, m, n);
      map_row(xr, yr, n, [=](auto v) { return fast_exp(v - m) * inv_sum; });
    }
  }
}

// softmax_backward (kLog = false): grad_input = y * (g - sum(g * y));
// log_softmax_backward (kLog = true): grad_input = g - exp(y) * sum(g).
template <bool kLog, typename T, typename Result>
SOFTMAX_OPS_CPU_MULTIVERSION void softmax_backward_rows(const T* g, const T* y, Result* grad_input, int64_t n,
                                                        int64_t begin, int64_t end) {
  using Acc = acc_type<T>;
  for (int64_t row = begin; row < end; ++row) {
    const T* gr = g + row * n;
    const T* yr = y + row * n;
    Result* out = grad_input + row * n;
    if constexpr (kLog) {
      const Acc sum = sum_row(gr, n, [](auto v) { return v; });
      map_row2(gr, yr, out, n, [=](auto gv, auto yv) { return gv - fast_exp(yv) * sum; });
    } else {
      const Acc dot = sum_row2(gr, yr, n, [](auto gv, auto yv) { return gv * yv; });
      map_row2(gr, yr, out, n, [=](auto gv, auto yv) { return yv * (gv - dot); });
    }
  }
}

template <bool kLog>
at::Tensor softmax_forward(const at::Tensor& self, int64_t dim, c10::optional<at::ScalarType> dtype) {
  const char* op = kLog ? "log_softmax" : "softmax";
  const at::ScalarType result_dtype = softmax_result_dtype(self, dtype, op);
  const int64_t wrapped = wrap_dim(self, dim, op);
  const at::Tensor input = softmax_kernel_input(dim_last_view(self, wrapped), result_dtype);
  at::Tensor result = at::empty(input.sizes(), input.options().dtype(result_dtype));
  const int64_t n = row_length(input);
  const int64_t rows = row_count(input.numel(), n);
  if (rows > 0) {
    dispatch_dtype_pair<true>(input.scalar_type(), result_dtype, [&](auto in_tag, auto out_tag) {
      using In = typename decltype(in_tag)::type;
      using Out = typename decltype(out_tag)::type;
      const In* x = input.const_data_ptr<In>();
      Out* y = result.mutable_data_ptr<Out>();
      at::parallel_for(0, rows, rows_grain(n), [&](int64_t begin, int64_t end) {
        softmax_rows<kLog>(x, y, n, begin, end);
      });
    });
  }
  return restore_dim_order(result, wrapped);
}

// torch's rule: when the forward widened float16/bfloat16 to float32 (or did not change dtype) the
// backward writes input_dtype directly from the compute type; any other dtype change is a cast of the
// forward's input, whose backward is a cast of the gradient computed in output's dtype.
template <bool kLog>
at::Tensor softmax_backward(const at::Tensor& grad_output, const at::Tensor& output, int64_t dim,
                            at::ScalarType input_dtype) {
  const char* op = kLog ? "log_softmax_backward" : "softmax_backward";
  check_softmax_backward_args(grad_output, output, input_dtype, op);
  const int64_t wrapped = wrap_dim(output, dim, op);
  const at::ScalarType output_dtype = output.scalar_type();
  const at::ScalarType written_dtype = softmax_backward_write_dtype(output_dtype, input_dtype);
  const at::Tensor y = with_dim_last(output, wrapped);
  const at::Tensor g = with_dim_last(grad_output.to(output_dtype), wrapped);
  at::Tensor grad_input = at::empty(y.sizes(), y.options().dtype(written_dtype));
  const int64_t n = row_length(y);
  const int64_t rows = row_count(y.numel(), n);
  if (rows > 0) {
    dispatch_dtype_pair<false>(output_dtype, written_dtype, [&](auto t_tag, auto result_tag) {
      using T = typename decltype(t_tag)::type;
      using Result = typename decltype(result_tag)::type;
      const T* g_ptr = g.const_data_ptr<T>();
      const T* y_ptr = y.const_data_ptr<T>();
      Result* out = grad_input.mutable_data_ptr<Result>();
      at::parallel_for(0, rows, rows_grain(n), [&](int64_t begin, int64_t end) {
        softmax_backward_rows<kLog>(g_ptr, y_ptr, out, n, begin, end);
      });
    });
  }
  at::Tensor restored = restore_dim_order(grad_input, wrapped);
  return written_dtype == input_dtype ? restored : restored.to(input_dtype);
}

}  // namespace
}  // namespace softmax_ops::cpu

TORCH_LIBRARY_IMPL(softmax_ops, CPU, m) {
  m.impl("softmax", &softmax_ops::cpu::softmax_forward<false>);
  m.impl("log_softmax", &softmax_ops::cpu::softmax_forward<true>);
  m.impl("softmax_backward", &softmax_ops::cpu::softmax_backward<false>);
  m.impl("log_softmax_backward", &softmax_ops::cpu::softmax_backward<true>);
}
