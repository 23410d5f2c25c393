#include "softmax_ops/kernel_registry.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <map>
#include <mutex>

namespace softmax_ops {
namespace {

struct Registry {
  std::mutex mutex;
  std::map<std::string, KernelFamily> families;
  std::map<std::string, std::string> overrides;
};

// Function-local static: launchers register from their own static initialisers, whose order across
// translation units is unspecified.
Registry& registry() {
  static Registry instance;
  return instance;
}

std::string family_of_op(const std::string& op) {
  if (op == "softmax" || op == "log_softmax") return "softmax";
  if (op == "softmax_backward" || op == "log_softmax_backward") return "softmax_backward";
  if (op == "fused_topk") return "topk";
  if (op == "fused_topk_backward") return "topk_backward";
  TORCH_CHECK_VALUE(false, "softmax_ops.explain: unknown op '", op,
                    "' (expected softmax, log_softmax, softmax_backward, log_softmax_backward, fused_topk or "
                    "fused_topk_backward)");
}

}  // namespace

bool register_kernel_family(const std::string& family, KernelFamily info) {
  std::lock_guard<std::mutex> lock(registry().mutex);
  registry().families[family] = std::move(info);
  return true;
}

void set_kernel_override(const std::string& family, const std::string& kernel) {
  auto& reg = registry();
  std::lock_guard<std::mutex> lock(reg.mutex);
  auto it = reg.families.find(family);
  TORCH_CHECK_VALUE(it != reg.families.end(), "softmax_ops.force_kernel: unknown kernel family '", family,
                    "'", reg.families.empty() ? " (this is a CPU-only build: there is no CUDA kernel menu)" : "");
  const auto& names = it->second.kernels;
  TORCH_CHECK_VALUE(kernel.empty() || std::find(names.begin(), names.end(), kernel) != names.end(),
                    "softmax_ops.force_kernel: family '", family, "' has no kernel '", kernel, "'");
  reg.overrides[family] = kernel;
}

std::string kernel_override(const std::string& family) {
  auto& reg = registry();
  std::lock_guard<std::mutex> lock(reg.mutex);
  auto it = reg.overrides.find(family);
  return it == reg.overrides.end() ? std::string() : it->second;
}

std::vector<std::string> list_kernels(const std::string& family) {
  auto& reg = registry();
  std::lock_guard<std::mutex> lock(reg.mutex);
  auto it = reg.families.find(family);
  return it == reg.families.end() ? std::vector<std::string>{} : it->second.kernels;
}

std::string explain(const std::string& op, std::vector<int64_t> shape, int64_t dim, c10::ScalarType dtype,
                    int64_t k, std::optional<c10::ScalarType> out_dtype) {
  const std::string family = family_of_op(op);
  ExplainFn fn = nullptr;
  {
    auto& reg = registry();
    std::lock_guard<std::mutex> lock(reg.mutex);
    auto it = reg.families.find(family);
    if (it != reg.families.end()) fn = it->second.explain;
  }
  if (fn == nullptr) {
    return "CPU-only build: " + op + " runs the CPU kernel (one row per task, fp32 accumulation).";
  }
  return fn(op, shape, dim, dtype, k, out_dtype);
}

}  // namespace softmax_ops
