// Registry of the CUDA kernel menus: which kernels each family offers, the user's override, and the
// explainer that says which kernel the dispatcher would pick. Families: "softmax" (softmax and
// log_softmax forward), "softmax_backward", "topk" (fused_topk forward), "topk_backward".
// Built in every configuration; in a CPU-only build no family is registered and explain says so.
#pragma once

#include <c10/core/ScalarType.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace softmax_ops {

// Says which kernel the family's dispatcher picks for this problem on the current CUDA device, and why.
// out_dtype is the result's dtype where it can differ from dtype: a forward's dtype=, a softmax backward's
// input_dtype (dtype is then grad_output's and output's), fused_topk_backward's forward dtype=; nullopt: dtype.
using ExplainFn = std::string (*)(const std::string& op, const std::vector<int64_t>& shape, int64_t dim,
                                  c10::ScalarType dtype, int64_t k, std::optional<c10::ScalarType> out_dtype);

struct KernelFamily {
  std::vector<std::string> kernels;  // names accepted by set_kernel_override
  ExplainFn explain = nullptr;
};

// Called from static initialisers of the CUDA launchers.
bool register_kernel_family(const std::string& family, KernelFamily info);

// "" means automatic choice. Setting an unknown family or kernel raises.
void set_kernel_override(const std::string& family, const std::string& kernel);
std::string kernel_override(const std::string& family);
std::vector<std::string> list_kernels(const std::string& family);
std::string explain(const std::string& op, std::vector<int64_t> shape, int64_t dim, c10::ScalarType dtype,
                    int64_t k, std::optional<c10::ScalarType> out_dtype);

}  // namespace softmax_ops
