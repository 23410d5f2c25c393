// Header-only device helpers shared by every CUDA kernel: dtype tags, conversions to/from the float
// compute type, 16-byte vector packs, the online (max, sum) state and a block reduction.
// No ATen here: kernel files see raw pointers, sizes and a stream only (DESIGN.md §1).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace softmax_ops {

// Element dtypes as the launchers pass them to kernel entry points (mirrors the at::ScalarType subset).
enum class DType : int { kFloat32 = 0, kFloat16 = 1, kBFloat16 = 2, kFloat64 = 3 };

// torch's spelling: float32, float16, bfloat16, float64.
inline const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kFloat16:
      return "float16";
    case DType::kBFloat16:
      return "bfloat16";
    case DType::kFloat64:
      return "float64";
    case DType::kFloat32:
      break;
  }
  return "float32";
}

// Host compilers (the g++-built .cpp launchers) include this header for DType and dtype_name only; the device helpers
// below use CUDA intrinsics that exist in nvcc's device and host passes but not under g++.
#if defined(__CUDACC__)

namespace detail {

constexpr int kWarpSize = 32;

// exp(y) of the per-element terms in both families is ex2_approx(y * kLog2e): one MUFU.EX2 (~2 ulp;
// results below 2^-126 flush to 0).
constexpr float kLog2e = 1.4426950408889634f;

__device__ __forceinline__ float ex2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// float for half/bfloat16/float, double for double: the type the math is done in (DESIGN.md §3).
template <typename T> struct ComputeTypeOf { using type = float; };
template <> struct ComputeTypeOf<double> { using type = double; };
template <typename T> using compute_t = typename ComputeTypeOf<T>::type;

template <typename To, typename From>
__device__ __forceinline__ To convert(From v) { return static_cast<To>(v); }
template <> __device__ __forceinline__ float convert<float, __half>(__half v) { return __half2float(v); }
template <> __device__ __forceinline__ float convert<float, __nv_bfloat16>(__nv_bfloat16 v) {
  return __bfloat162float(v);
}
template <> __device__ __forceinline__ __half convert<__half, float>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 convert<__nv_bfloat16, float>(float v) {
  return __float2bfloat16_rn(v);
}

// Elements per 16-byte access.
template <typename T> constexpr int kVec16 = 16 / sizeof(T);

// An aligned pack of N elements, loaded/stored as one vector instruction when N * sizeof(T) is 4/8/16.
template <typename T, int N>
struct alignas(sizeof(T) * N) Pack {
  T v[N];
};

// NaN-propagating max (fmaxf drops NaN, torch's softmax propagates it).
template <typename C>
__device__ __forceinline__ C nan_max(C a, C b) { return (a != a || a > b) ? a : b; }

// Online softmax state of the softmax kernels (softmax_math.cuh): running max and sum of exp(x - max).
template <typename C>
struct MaxSum {
  C max;
  C sum;
};

// Block-wide all-reduce of one value with a binary op; `scratch` holds >= blockDim.x / 32 values.
// Every thread gets the result. Ends with a barrier, so scratch may be reused right after.
template <typename C, typename Op>
__device__ __forceinline__ C block_all_reduce(C v, C* scratch, Op op) {
  const int lane = threadIdx.x % kWarpSize;
  const int warp = threadIdx.x / kWarpSize;
  const int num_warps = (blockDim.x + kWarpSize - 1) / kWarpSize;
#pragma unroll
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) v = op(v, __shfl_xor_sync(0xffffffffu, v, offset));
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  C r = scratch[0];
  for (int w = 1; w < num_warps; ++w) r = op(r, scratch[w]);  // same order in every thread: deterministic
  __syncthreads();
  return r;
}

// ---- peeled rows --------------------------------------------------------------------------------------
//
// A row whose length is not a multiple of VEC elements of 16 bytes, or which starts off a 16-byte boundary
// for that reason, read as its aligned body of whole packs plus the few single elements around it ("edges"):
//
//     row:   [ head: < VEC elements | body: packs whole 16-byte packs | tail: < VEC elements ]
//
// Both families peel (softmax_kernel_common.cuh, topk_chunk.cuh); each says which kernels do and why.
template <int VEC>
struct RowEdges {
  int head;       // elements before the body: from the row's start to the next VEC-element boundary, < VEC
  int64_t packs;  // whole packs in the body
  int tail;       // elements after the body, < VEC

  __device__ __forceinline__ int count() const { return head + tail; }
  // The column of edge element e (0 <= e < count()): the head's first, then the tail's.
  __device__ __forceinline__ int64_t column(int e) const { return e < head ? e : head + packs * VEC + (e - head); }
};

// The edges of a row of n elements that starts at element `start` of memory (its address / element size):
// its body begins at the first multiple of VEC.
template <int VEC>
__device__ __forceinline__ RowEdges<VEC> row_edges_at(int64_t start, int64_t n) {
  const int64_t to_boundary = (VEC - start % VEC) % VEC;
  RowEdges<VEC> edges;
  edges.head = static_cast<int>(min(to_boundary, n));
  edges.packs = (n - edges.head) / VEC;
  edges.tail = static_cast<int>(n - edges.head - edges.packs * VEC);
  return edges;
}

// Global -> shared copy of one 16-byte pack that does not pass through registers (cp.async, sm_80+), so a
// thread has all of its shared-memory packs in flight at once. Through registers, the softmax block kernel's fill
// loop waited for every 4 loads before storing them: 9-12 packs per thread cost 3 DRAM round trips before
// any math, with at most 1-2 CTAs per SM to hide them. Completed by wait_async_copies (this thread's copies).
__device__ __forceinline__ void copy_async_16(void* smem, const void* gmem) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const uint32_t dst = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" : : "r"(dst), "l"(gmem) : "memory");
#else
  *reinterpret_cast<uint4*>(smem) = *reinterpret_cast<const uint4*>(gmem);
#endif
}

// 16 bytes from gmem where `valid`, else `fallback`, as an evict-first load (ld.global.cs, data read once): one
// predicated load into registers that already hold fallback. The usual form, a load and then `valid ? v :
// fallback`, puts a select on the loaded registers right after the load; a warp issues in order, so it waits there
// for the data and every later load waits with it (sm_90 SASS of the fused_topk rows kernel, session 32). Here
// nothing reads the registers before their first use. Not volatile and without a memory clobber, as a load of data
// that stays unchanged while the kernel runs: the compiler may merge two such loads of one address (the rows kernel's
// NaN / +inf reload then reads the same values), and a kernel launched as a programmatic dependent must not use it
// before griddepcontrol.wait.
__device__ __forceinline__ uint4 load_16_cs_or(const void* gmem, bool valid, uint4 fallback) {
  uint4 v = fallback;
  asm("{\n\t.reg .pred p;\n\tsetp.ne.b32 p, %4, 0;\n\t@p ld.global.cs.v4.u32 {%0, %1, %2, %3}, [%5];\n\t}"
      : "+r"(v.x), "+r"(v.y), "+r"(v.z), "+r"(v.w)
      : "r"(static_cast<int>(valid)), "l"(gmem));
  return v;
}

__device__ __forceinline__ void wait_async_copies() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_all;" : : : "memory");
#endif
}

}  // namespace detail

#endif  // defined(__CUDACC__)
}  // namespace softmax_ops
