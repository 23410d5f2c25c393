// Host-side launch helpers shared by the softmax and fused_topk launch functions: a compile-time integer
// choice from a run-time value, and the per-(kernel, device) opt-ins: more than 48 KB of dynamic shared
// memory, clusters of more than 8 CTAs.
// No ATen here (DESIGN.md §1).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <mutex>
#include <set>
#include <tuple>
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

// Runs set(device) for `kernel` once per (kernel, device, what) while it succeeds: function attributes are
// per function and per device (set with that device current), and each set is a driver call. Racing host
// threads serialise on the lock. Keyed by the kernel's address: instantiations of one signature share a
// function-pointer type. A failed set is not remembered (the next launch tries again and reports it).
enum class KernelAttribute : int { kDynamicSmem, kNonPortableCluster };
template <typename Kernel, typename Set>
cudaError_t set_once_per_device(Kernel kernel, KernelAttribute what, Set&& set) {
  static std::mutex mutex;
  static std::set<std::tuple<const void*, int, KernelAttribute>> done;
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  const std::tuple<const void*, int, KernelAttribute> key{reinterpret_cast<const void*>(kernel), device, what};
  std::lock_guard<std::mutex> lock(mutex);
  if (done.count(key) != 0) return cudaSuccess;
  err = set(device);
  if (err == cudaSuccess) done.insert(key);
  return err;
}

// Launch (or ask the occupancy API about) `bytes` of dynamic shared memory: the opt-in is set once per (kernel,
// device) to the device's maximum (the launch still requests only what it uses), so racing host threads all write
// the same value and no launch sees a smaller limit than it needs. Without it a kernel may take 48 KB of static and
// dynamic shared memory together, so a launch of exactly 48 KB of dynamic memory plus a few static buffers needs it
// too: the opt-in is taken for any dynamic shared memory, not only above 48 KB. (Skipping it up to 48 KB made the
// occupancy query refuse such plans until a larger launch of the same instance had opted in, so a process's plans
// depended on what it had run before; H100, session 43 call 7: 16-bit 64 x 151936 at 4 CTAs per row, 4 + 6 packs.)
template <typename Kernel>
cudaError_t allow_dynamic_smem(Kernel kernel, size_t bytes) {
  if (bytes == 0) return cudaSuccess;
  return set_once_per_device(kernel, KernelAttribute::kDynamicSmem, [&](int device) {
    int optin = 0;
    cudaError_t err = cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
    if (err != cudaSuccess) return err;
    cudaFuncAttributes attributes{};
    err = cudaFuncGetAttributes(&attributes, kernel);
    if (err != cudaSuccess) return err;
    return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                optin - static_cast<int>(attributes.sharedSizeBytes));
  });
}

// Clusters of more than the portable 8 CTAs: the opt-in, once per (kernel, device).
template <typename Kernel>
cudaError_t allow_non_portable_clusters(Kernel kernel) {
  return set_once_per_device(kernel, KernelAttribute::kNonPortableCluster, [&](int) {
    return cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
  });
}

}  // namespace softmax_ops::detail
