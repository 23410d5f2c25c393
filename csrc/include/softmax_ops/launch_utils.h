// Host-side launch helpers shared by the softmax and fused_topk launch functions: a compile-time integer
// choice from a run-time value, and the opt-in for more than 48 KB of dynamic shared memory.
// No ATen here (DESIGN.md §1).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <mutex>
#include <set>
#include <type_traits>
#include <utility>

namespace softmax_ops::detail {

// Calls f(std::integral_constant<int, V>{}) for the V of Vs equal to value (cudaErrorInvalidValue if none).
template <int... Vs, typename F>
cudaError_t dispatch_int(int value, F&& f) {
  cudaError_t result = cudaErrorInvalidValue;
  static_cast<void>(((value == Vs ? (result = f(std::integral_constant<int, Vs>{}), true) : false) || ...));
  return result;
}

// The same over a named list of candidates (e.g. a register-bucket sequence).
template <int... Vs, typename F>
cudaError_t dispatch_int(std::integer_sequence<int, Vs...>, int value, F&& f) {
  return dispatch_int<Vs...>(value, std::forward<F>(f));
}

// Launch with dynamic shared memory above the 48 KB default: the opt-in must be set per function, per
// device. It is set once per (kernel, device) to the device's maximum (the launch still requests only what
// it uses), so racing host threads all write the same value and no launch sees a smaller limit than it
// needs. Keyed by the kernel's address: instantiations of one signature share a function-pointer type.
template <typename Kernel>
cudaError_t allow_dynamic_smem(Kernel kernel, size_t bytes) {
  if (bytes <= 48 * 1024) return cudaSuccess;
  static std::mutex mutex;
  static std::set<std::pair<const void*, int>> configured;
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  const std::pair<const void*, int> key{reinterpret_cast<const void*>(kernel), device};
  std::lock_guard<std::mutex> lock(mutex);
  if (configured.count(key) != 0) return cudaSuccess;
  int optin = 0;
  err = cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
  if (err != cudaSuccess) return err;
  cudaFuncAttributes attributes{};
  err = cudaFuncGetAttributes(&attributes, kernel);
  if (err != cudaSuccess) return err;
  err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             optin - static_cast<int>(attributes.sharedSizeBytes));
  if (err == cudaSuccess) configured.insert(key);
  return err;
}

}  // namespace softmax_ops::detail
