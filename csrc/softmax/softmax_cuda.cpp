// CUDA implementations of softmax, log_softmax and their backward ops: argument checks (shared with the
// CPU backend, op_checks.h), device guard, current stream, output allocation through the caching
// allocator, the dispatcher's choice, the launch and its check. Also registers the "softmax" and
// "softmax_backward" kernel families (names + explain) with the kernel registry.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "softmax_dispatch.h"
#include "softmax_ops/dtype_rules.h"
#include "softmax_ops/dtype_tags.h"
#include "softmax_ops/kernel_registry.h"
#include "softmax_ops/op_checks.h"

namespace softmax_ops {
namespace {

DType cuda_dtype(at::ScalarType type) { return require_dtype_tag(type, "softmax_ops (CUDA)"); }

const char* family_of(bool backward) { return backward ? "softmax_backward" : "softmax"; }

// The dispatcher's choice for a request on a device, remembered: a model calls the same few shapes over and
// over, and the choice builds its explanation text and may query the occupancy API (microseconds of host
// time per call otherwise). Bounded: a workload with ever-new shapes (dynamic sequence lengths) starts
// over every kMaxEntries choices. Returns the plan, or sets *error when the (forced) kernel cannot run it.
// With `replacement`, stores that choice for the request instead (a plan that launched where the cached
// one was refused).
SoftmaxPlan cached_plan(const SoftmaxRequest& request, int device, std::string* error,
                        const SoftmaxChoice* replacement = nullptr) {
  using Key = std::tuple<int, bool, bool, int, int, int64_t, int64_t, int64_t, bool, bool, std::string>;
  constexpr size_t kMaxEntries = 4096;
  static std::mutex mutex;
  static std::map<Key, SoftmaxChoice> choices;
  const SoftmaxProblem& p = request.problem;
  const Key key{device, p.backward, p.log, static_cast<int>(p.in_dtype), static_cast<int>(p.out_dtype),
                p.outer, p.n, p.inner, request.vector_aligned, request.rows_share_phase, request.forced};
  std::lock_guard<std::mutex> lock(mutex);
  if (replacement != nullptr) {
    choices[key] = *replacement;
    return replacement->plan;
  }
  auto it = choices.find(key);
  if (it == choices.end()) {
    if (choices.size() >= kMaxEntries) choices.clear();
    it = choices.emplace(key, choose_softmax_kernel(request, device_props(device))).first;
  }
  if (!it->second.error.empty()) *error = it->second.error;
  return it->second.plan;
}

// Allocates the plan's workspace if any and launches it on the current stream; returns the launch's error.
cudaError_t launch(const SoftmaxProblem& problem, const SoftmaxPlan& plan, SoftmaxPointers ptrs,
                   const at::TensorOptions& options, cudaStream_t stream) {
  at::Tensor workspace;  // freed after the launch: the caching allocator orders its reuse on this stream
  if (plan.workspace_bytes > 0) {
    workspace = at::empty({static_cast<int64_t>(plan.workspace_bytes)}, options.dtype(at::kByte));
    ptrs.workspace = workspace.data_ptr();
  }
  return launch_softmax_plan(problem, plan, ptrs, stream);
}

// Chooses, launches on the current stream, checks the launch.
void run(const char* op, const SoftmaxProblem& problem, SoftmaxPointers ptrs, const at::TensorOptions& options) {
  const int device = c10::cuda::current_device();
  SoftmaxRequest request;
  request.problem = problem;
  request.vector_aligned = pointers_vector_aligned(problem, ptrs);
  request.rows_share_phase = pointers_share_phase(problem, ptrs);
  request.forced = kernel_override(family_of(problem.backward));
  std::string error;
  const SoftmaxPlan plan = cached_plan(request, device, &error);
  TORCH_CHECK(error.empty(), "softmax_ops.", op, ": ", error);
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(device).stream();
  cudaError_t err = launch(problem, plan, ptrs, options, stream);
  if (err == cudaErrorCooperativeLaunchTooLarge && plan.kernel == SoftmaxKernel::kGridOnePass && request.forced.empty()) {
    // Fewer SMs usable than the device reports (MPS limits, another context): the grid group cannot be
    // resident at once. A cluster per row, or else the split-row kernel, needs no co-residency; the first
    // that launches replaces the cached plan, so later calls go straight to it.
    for (const char* fallback : {"cluster_onepass", "split_row"}) {
      (void)cudaGetLastError();  // the refused launch's error is not sticky
      SoftmaxRequest retry = request;
      retry.forced = fallback;
      SoftmaxChoice choice = choose_softmax_kernel(retry, device_props(device));
      if (!choice.error.empty()) continue;
      err = launch(problem, choice.plan, ptrs, options, stream);
      if (err == cudaSuccess) {
        choice.reason = "the cooperative launch of grid_onepass was refused; fell back to " + std::string(fallback);
        std::string ignored;
        cached_plan(request, device, &ignored, &choice);
        break;
      }
    }
  }
  C10_CUDA_CHECK(err);
}

at::Tensor forward(const at::Tensor& self, int64_t dim, std::optional<at::ScalarType> dtype, bool log) {
  const char* op = log ? "log_softmax" : "softmax";
  const at::ScalarType result_dtype = softmax_result_dtype(self, dtype, op);
  const int64_t wrapped = wrap_dim(self, dim, op);
  const c10::cuda::CUDAGuard guard(self.device());
  // Contiguous, and cast first unless the kernels read the input dtype directly (f16/bf16 -> f32).
  const at::Tensor input = softmax_kernel_input(self, result_dtype);
  at::Tensor out = at::empty(input.sizes(), input.options().dtype(result_dtype));
  if (out.numel() == 0) return out;
  const RowLayout layout = row_layout(input, wrapped);
  SoftmaxProblem problem;
  problem.log = log;
  problem.in_dtype = cuda_dtype(input.scalar_type());
  problem.out_dtype = cuda_dtype(result_dtype);
  problem.outer = layout.outer;
  problem.n = layout.n;
  problem.inner = layout.inner;
  SoftmaxPointers ptrs;
  ptrs.in0 = input.data_ptr();
  ptrs.out = out.data_ptr();
  run(op, problem, ptrs, out.options());
  return out;
}

// Backward dtype rule: the result has input_dtype. When input_dtype equals output's dtype, or output is
// float32 and input_dtype float16/bfloat16 (the half_to_float forward), the kernel writes input_dtype
// directly; otherwise it computes and writes output's dtype and the result is cast, as torch does
// (softmax_backward_write_dtype).
at::Tensor backward(const at::Tensor& grad_output, const at::Tensor& output, int64_t dim,
                    at::ScalarType input_dtype, bool log) {
  const char* op = log ? "log_softmax_backward" : "softmax_backward";
  check_softmax_backward_args(grad_output, output, input_dtype, op);
  const int64_t wrapped = wrap_dim(output, dim, op);
  const c10::cuda::CUDAGuard guard(output.device());
  const at::ScalarType compute = output.scalar_type();
  const at::ScalarType write_dtype = softmax_backward_write_dtype(compute, input_dtype);
  const bool direct = write_dtype == input_dtype;
  const at::Tensor grad = grad_output.to(compute).contiguous();
  const at::Tensor out_c = output.contiguous();
  at::Tensor grad_input = at::empty(out_c.sizes(), out_c.options().dtype(write_dtype));
  if (grad_input.numel() > 0) {
    const RowLayout layout = row_layout(out_c, wrapped);
    SoftmaxProblem problem;
    problem.backward = true;
    problem.log = log;
    problem.in_dtype = cuda_dtype(compute);
    problem.out_dtype = cuda_dtype(write_dtype);
    problem.outer = layout.outer;
    problem.n = layout.n;
    problem.inner = layout.inner;
    SoftmaxPointers ptrs;
    ptrs.in0 = grad.data_ptr();
    ptrs.in1 = out_c.data_ptr();
    ptrs.out = grad_input.data_ptr();
    run(op, problem, ptrs, grad_input.options());
  }
  return direct ? grad_input : grad_input.to(input_dtype);
}

at::Tensor softmax_cuda(const at::Tensor& self, int64_t dim, std::optional<at::ScalarType> dtype) {
  return forward(self, dim, dtype, /*log=*/false);
}
at::Tensor log_softmax_cuda(const at::Tensor& self, int64_t dim, std::optional<at::ScalarType> dtype) {
  return forward(self, dim, dtype, /*log=*/true);
}
at::Tensor softmax_backward_cuda(const at::Tensor& grad_output, const at::Tensor& output, int64_t dim,
                                 at::ScalarType input_dtype) {
  return backward(grad_output, output, dim, input_dtype, /*log=*/false);
}
at::Tensor log_softmax_backward_cuda(const at::Tensor& grad_output, const at::Tensor& output, int64_t dim,
                                     at::ScalarType input_dtype) {
  return backward(grad_output, output, dim, input_dtype, /*log=*/true);
}

// A dtype's name as explain prints it: the kernels' names (float32, ...), ATen's for others (an integer input).
std::string dtype_text(at::ScalarType type) {
  const bool kernel_dtype = type == at::kFloat || type == at::kHalf || type == at::kBFloat16 || type == at::kDouble;
  return kernel_dtype ? dtype_name(cuda_dtype(type)) : c10::toString(type);
}

// softmax_ops.explain for the softmax family: the choice for a fresh contiguous tensor of `shape` on the
// current device (or an assumed H100 when no device is visible, e.g. on a CPU-only machine). `out_dtype` is a
// forward's dtype= or a backward's input_dtype; the kernel runs the dtype pair the launchers above would.
std::string explain_softmax(const std::string& op, const std::vector<int64_t>& shape, int64_t dim,
                            c10::ScalarType dtype, int64_t /*k*/, std::optional<c10::ScalarType> out_dtype) {
  const bool backward = op.find("backward") != std::string::npos;
  const bool log = op.rfind("log_", 0) == 0;
  const at::ScalarType result = out_dtype.value_or(dtype);
  require_dtype_tag(result, out_dtype ? "softmax_ops.explain (out_dtype)" : "softmax_ops.explain");
  // A forward casts any other input (integers and bool too, with a float dtype=) to its result dtype first.
  const at::ScalarType read = backward ? dtype : softmax_kernel_input_dtype(dtype, result);
  require_dtype_tag(read, "softmax_ops.explain");
  const at::ScalarType written = backward ? softmax_backward_write_dtype(dtype, result) : result;
  // A pair without kernel instances is cast in front (forward) or behind (backward), as the launchers do.
  std::string casts;
  if (read != dtype) casts = "\n  cast: the input is cast to " + std::string(dtype_name(cuda_dtype(read))) + " first";
  if (written != result) {
    casts = "\n  cast: the kernel writes " + std::string(dtype_name(cuda_dtype(written))) + ", cast to " +
            dtype_name(cuda_dtype(result)) + " afterwards";
  }
  const int64_t rank = static_cast<int64_t>(shape.size());
  const int64_t ndim = std::max<int64_t>(rank, 1);
  TORCH_CHECK_INDEX(dim >= -ndim && dim < ndim, "softmax_ops.explain: dim (got ", dim,
                    ") is out of range for a shape with ", rank, " dimensions");
  const int64_t wrapped = dim < 0 ? dim + ndim : dim;
  SoftmaxProblem problem;
  problem.backward = backward;
  problem.log = log;
  problem.in_dtype = cuda_dtype(read);
  problem.out_dtype = cuda_dtype(written);
  for (int64_t d = 0; d < rank; ++d) {
    TORCH_CHECK_VALUE(shape[d] >= 0, "softmax_ops.explain: negative size in shape");
    if (d < wrapped) problem.outer *= shape[d];
    if (d == wrapped) problem.n = shape[d];
    if (d > wrapped) problem.inner *= shape[d];
  }
  // std::string, not iostreams: see describe_plan in softmax_dispatch.cpp.
  using std::to_string;
  std::string text = op + " of shape [";
  for (int64_t d = 0; d < rank; ++d) text += (d ? ", " : "") + to_string(shape[d]);
  text += "] over dim " + to_string(wrapped) + " (" + to_string(problem.rows()) + " rows of " + to_string(problem.n) +
          (problem.inner > 1 ? ", strided by " + to_string(problem.inner) : std::string()) + "), " +
          dtype_text(dtype) +
          (result != dtype ? std::string(" -> ") + dtype_name(cuda_dtype(result)) : std::string());
  if (problem.rows() * problem.n == 0) return text + ": empty, nothing is launched.";
  const bool has_device = c10::cuda::device_count() > 0;
  const DeviceProps props = has_device ? device_props(c10::cuda::current_device()) : DeviceProps{};
  text += " on " + props.name + " (" + to_string(props.sm_count) + " SMs, " +
          to_string(props.l2_bytes / (1024 * 1024)) + " MB L2, " + to_string(props.smem_per_block_optin / 1024) +
          " KB shared memory per block, " + to_string(props.max_threads_per_sm) + " threads and " +
          to_string(props.max_ctas_per_sm) + " CTAs per SM, sm_" +
          to_string(props.cc_major) + to_string(props.cc_minor) + ")";
  SoftmaxRequest request;
  request.problem = problem;
  request.forced = kernel_override(family_of(backward));
  const SoftmaxChoice choice = choose_softmax_kernel(request, props);
  if (!choice.error.empty()) return text + ": " + choice.error + ".";
  text += ":\n  kernel " + describe_plan(choice.plan) + "\n  why: " +
          (request.forced.empty() ? choice.reason : "forced with softmax_ops.force_kernel / set_kernel") + casts;
  return text;
}

const bool kFamiliesRegistered = [] {
  register_kernel_family("softmax", KernelFamily{softmax_kernel_names(), &explain_softmax});
  register_kernel_family("softmax_backward", KernelFamily{softmax_kernel_names(), &explain_softmax});
  return true;
}();

}  // namespace
}  // namespace softmax_ops

TORCH_LIBRARY_IMPL(softmax_ops, CUDA, m) {
  m.impl("softmax", &softmax_ops::softmax_cuda);
  m.impl("log_softmax", &softmax_ops::log_softmax_cuda);
  m.impl("softmax_backward", &softmax_ops::softmax_backward_cuda);
  m.impl("log_softmax_backward", &softmax_ops::log_softmax_backward_cuda);
}
