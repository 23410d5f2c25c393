// The softmax-family dispatcher: which kernel of the menu runs a problem on a device, with which launch
// configuration, and why. Plain C++ (g++), no ATen: the launcher (softmax_cuda.cpp) and the explain
// function both call choose_softmax_kernel.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "softmax_launch.h"

namespace softmax_ops {

// What the dispatcher reads from the device (cached per device at first use).
struct DeviceProps {
  std::string name = "NVIDIA H100 (assumed: no CUDA device visible)";
  int sm_count = 132;
  int64_t l2_bytes = 50 * 1024 * 1024;
  int smem_per_block_optin = 227 * 1024;
  int smem_per_sm = 228 * 1024;
  int max_threads_per_sm = 2048;
  int max_ctas_per_sm = 32;  // resident CTAs per SM, whatever their size
  int cc_major = 9;
  int cc_minor = 0;
  bool assumed = true;  // true: the H100 defaults above, not a queried device
};

// The properties of CUDA device `device`, queried once (cudaDeviceGetAttribute) and cached.
const DeviceProps& device_props(int device);

struct SoftmaxRequest {
  SoftmaxProblem problem;
  bool vector_aligned = true;  // every pointer allows 16-byte packs (see pointers_vector_aligned)
  bool rows_share_phase = true;  // every pointer in one element phase: rows can be peeled (pointers_share_phase)
  std::string forced;          // a kernel name from softmax_ops::kernel_override, "" = automatic
};

struct SoftmaxChoice {
  SoftmaxPlan plan;
  std::string reason;  // why this kernel and configuration (for explain)
  std::string error;   // non-empty: the forced kernel cannot run this problem; nothing may be launched
};

SoftmaxChoice choose_softmax_kernel(const SoftmaxRequest& request, const DeviceProps& props);

// Whether in0/in1/out allow 16-byte packs of the input dtype (and the matching output packs).
bool pointers_vector_aligned(const SoftmaxProblem& problem, const SoftmaxPointers& ptrs);

// Whether in0/in1/out share one element phase (address / element size, modulo the input's 16-byte pack): then
// every row's aligned body starts at the same column for all of them, and rows can be peeled (plan.peel).
bool pointers_share_phase(const SoftmaxProblem& problem, const SoftmaxPointers& ptrs);

const char* softmax_kernel_name(SoftmaxKernel kernel);
std::vector<std::string> softmax_kernel_names();

// One line with the launch configuration of `plan`.
std::string describe_plan(const SoftmaxPlan& plan);

// Launches `plan` (the kernel files' entry points); returns the first CUDA error.
cudaError_t launch_softmax_plan(const SoftmaxProblem& problem, const SoftmaxPlan& plan, const SoftmaxPointers& ptrs,
                                cudaStream_t stream);

}  // namespace softmax_ops
