// The fused_topk dispatcher: which kernel of the menu (topk_launch.h) runs a problem, with which
// parameters, and why. Pure host code (no ATen, no GPU needed): explain() works on a machine without a GPU
// by assuming an H100.
#pragma once

#include <cstdint>
#include <string>

#include "topk_launch.h"

namespace softmax_ops::topk {

// What the dispatcher reads from the device.
struct TopkDeviceProps {
  int sm_count = 132;
  int64_t l2_bytes = 50LL * 1024 * 1024;
  int64_t smem_per_block_optin = 227 * 1024;
  std::string name = "NVIDIA H100";
  bool assumed = true;  // true: no CUDA device visible, the H100 figures above are used
};

// The current CUDA device's properties (queried once per device), or the assumed H100 without a GPU.
const TopkDeviceProps& topk_device_props();

const char* topk_kernel_name(TopkKernel kernel);
const char* topk_backward_kernel_name(TopkBackwardKernel kernel);

// The automatic choice for rows x n, k, reading dtype (the kernel input dtype); `why` gets the reason.
TopkPlan choose_topk_kernel(int64_t rows, int64_t n, int64_t k, DType dtype, const TopkDeviceProps& props,
                            std::string* why = nullptr);
TopkBackwardPlan choose_topk_backward_kernel(int64_t rows, int64_t n, DType dtype, const TopkDeviceProps& props,
                                             std::string* why = nullptr);

// The plan the launcher runs: the kernel forced with softmax_ops.force_kernel("topk", name) when one is,
// else the automatic choice. A forced kernel that cannot handle the problem raises a ValueError naming it.
// vector_loads is left false: the launcher sets it from the actual pointer.
TopkPlan resolve_topk_plan(int64_t rows, int64_t n, int64_t k, DType dtype, const TopkDeviceProps& props,
                           std::string* why = nullptr);
TopkBackwardPlan resolve_topk_backward_plan(int64_t rows, int64_t n, DType dtype, const TopkDeviceProps& props,
                                            std::string* why = nullptr);

}  // namespace softmax_ops::topk
