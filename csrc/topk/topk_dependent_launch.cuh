// Programmatic dependent launch (sm_90+) for the fused_topk kernels that need zeroed global state (split_row's
// row tickets, split_hist's row histograms): a small zero kernel runs first, and the kernel after it is
// launched as its programmatic dependent, so that its CTAs are scheduled at once, read and filter their chunks
// meanwhile, and wait (wait_for_prerequisite_grid) only before they touch the zeroed words. split_row zeroed
// its tickets with a cudaMemsetAsync in front of the kernel before: H100, 2026-11-22 (*session15-c1-*, -c2-),
// tickets nobody had to zero (an unsafe experiment) were 1-4% faster on 64 x 151936 .. 16 x 262144 k50; this
// launch pair recovers 0.5-2% of it.
// On older GPUs (or without the launch attribute) both device calls are no-ops in effect: the dependent kernel
// starts after the zero kernel as usual.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <utility>

#include "topk_launch.h"

namespace softmax_ops::topk {

// Lets the stream's next kernel, if launched as a programmatic dependent, be scheduled now.
__device__ __forceinline__ void allow_dependent_launch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Waits until the prerequisite kernel has completed and its writes are visible (returns at once when this
// kernel was launched normally).
__device__ __forceinline__ void wait_for_prerequisite_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// Zeroes `count` words; lets its dependent start at once.
template <typename Word>
__global__ void zero_words_kernel(Word* words, int64_t count) {
  allow_dependent_launch();
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    words[i] = Word{};
  }
}

// Launches zero_words_kernel over `count` words (at most 1024 CTAs of kBlockThreads: a grid-stride loop).
template <typename Word>
cudaError_t launch_zero_words(Word* words, int64_t count, cudaStream_t stream) {
  const int64_t wanted = (count + kBlockThreads - 1) / kBlockThreads;
  const auto blocks = static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>(wanted, 1024)));
  zero_words_kernel<Word><<<blocks, kBlockThreads, 0, stream>>>(words, count);
  return cudaGetLastError();
}

// Whether the current device takes programmatic dependent launches (sm_90+).
inline cudaError_t query_programmatic_launch(bool* supported) {
  int device = 0;
  int major = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  *supported = err == cudaSuccess && major >= 9;
  return err;
}

// Launches kernel<<<blocks, kBlockThreads, smem, stream>>>(args...) as a programmatic dependent launch of the
// stream's previous kernel where `programmatic` (its CTAs may start before that kernel ends and must call
// wait_for_prerequisite_grid before touching its results), as an ordinary launch elsewhere.
template <typename... Params, typename... Args>
cudaError_t launch_dependent(bool programmatic, void (*kernel)(Params...), unsigned blocks, size_t smem,
                             cudaStream_t stream, Args&&... args) {
  cudaLaunchAttribute attribute[1];
  attribute[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(blocks);
  config.blockDim = dim3(kBlockThreads);
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  config.attrs = attribute;
  config.numAttrs = programmatic ? 1 : 0;
  return cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
}

}  // namespace softmax_ops::topk
