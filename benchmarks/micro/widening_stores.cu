// 16-bit input, float32 output ("widening": softmax(x_fp16, dtype=torch.float32)): does the store pattern
// explain why the one-pass block / cluster / grid kernels run it at ~0.55-0.8 of copy while the warp kernel
// reaches 0.97? A stand-alone measurement (not part of the extension); the kernels only convert (x * scale),
// no reduction, so what is left is the memory access pattern and its phases.
//
//   copy        y = x of 6 bytes per element (3 read, 3 written), 16-byte packs: the bench's yardstick
//   stream8     grid-stride; a lane reads 16 bytes (8 values) and writes two adjacent 16-byte float4 (32 bytes
//               per lane, so one store instruction covers every other 16 bytes of 1 KB): today's pattern
//   stream4     grid-stride; a lane reads 8 bytes (4 values) and writes one float4 (a store instruction
//               covers 512 contiguous bytes)
//   stream8x    stream8 with lanes 2m and 2m + 1 trading halves first (4 shuffles per pack), so that each store
//               instruction writes whole 32-byte sectors: the extension's store_pack_where
//   phased8/4   a CTA caches its chunk in registers (P packs per thread, pack-strided like the block
//               kernel), meets at a barrier, then writes it all: the one-pass kernels' load-then-store
//               phases, with the 8- or 4-value pack
//
// Timing: CUDA events around one launch, L2 flushed (256 MB write) before each, median of 50.
// Build: nvcc -O3 -arch=sm_90a -std=c++17 -o widening_stores widening_stores.cu
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define CHECK(x)                                                                       \
  do {                                                                                 \
    cudaError_t err_ = (x);                                                            \
    if (err_ != cudaSuccess) {                                                         \
      std::printf("%s failed: %s (line %d)\n", #x, cudaGetErrorString(err_), __LINE__); \
      std::exit(1);                                                                    \
    }                                                                                  \
  } while (0)

// VEC halves as raw words: uint4 for 8, uint2 for 4.
template <int VEC>
struct Raw;
template <>
struct Raw<8> {
  using T = uint4;
};
template <>
struct Raw<4> {
  using T = uint2;
};

__device__ __forceinline__ void st4(float* p, float a, float b, float c, float d) {
  asm volatile("st.global.v4.f32 [%0], {%1, %2, %3, %4};" : : "l"(p), "f"(a), "f"(b), "f"(c), "f"(d) : "memory");
}

__device__ __forceinline__ float2 h2f(uint32_t w, float s) {
  __half2 h;
  __builtin_memcpy(&h, &w, 4);
  float2 f = __half22float2(h);
  return make_float2(f.x * s, f.y * s);
}

// Converts and writes one pack of VEC values at out (VEC floats).
__device__ __forceinline__ void write_pack(float* out, uint4 r, float s) {
  const float2 a = h2f(r.x, s), b = h2f(r.y, s), c = h2f(r.z, s), d = h2f(r.w, s);
  st4(out, a.x, a.y, b.x, b.y);
  st4(out + 4, c.x, c.y, d.x, d.y);
}
__device__ __forceinline__ void write_pack(float* out, uint2 r, float s) {
  const float2 a = h2f(r.x, s), b = h2f(r.y, s);
  st4(out, a.x, a.y, b.x, b.y);
}

// stream8x's store: lane 2m writes its lower half and lane 2m + 1 lane 2m's upper half, then lane 2m lane 2m + 1's
// lower half and lane 2m + 1 its upper half (every lane calls it; both packs of a pair valid).
__device__ __forceinline__ void write_pack_paired(float* out, uint4 r, float s) {
  const float2 a = h2f(r.x, s), b = h2f(r.y, s), c = h2f(r.z, s), d = h2f(r.w, s);
  const float v[8] = {a.x, a.y, b.x, b.y, c.x, c.y, d.x, d.y};
  const bool odd = threadIdx.x & 1;
  float got[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) got[j] = __shfl_xor_sync(0xffffffffu, odd ? v[j] : v[4 + j], 1);
  if (odd) {
    st4(out - 4, got[0], got[1], got[2], got[3]);
    st4(out + 4, v[4], v[5], v[6], v[7]);
  } else {
    st4(out, v[0], v[1], v[2], v[3]);
    st4(out + 8, got[0], got[1], got[2], got[3]);
  }
}

// packs is a multiple of 32, so every lane of a warp takes part in each step.
__global__ void stream_paired_kernel(const __half* __restrict__ x, float* __restrict__ y, long long packs, float s) {
  const uint4* in = reinterpret_cast<const uint4*>(x);
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < packs; i += (long long)gridDim.x * blockDim.x) {
    write_pack_paired(y + i * 8, __ldcs(in + i), s);
  }
}

__global__ void copy_kernel(const uint4* __restrict__ in, uint4* __restrict__ out, long long n) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
    out[i] = __ldcs(in + i);
  }
}

template <int VEC>
__global__ void stream_kernel(const __half* __restrict__ x, float* __restrict__ y, long long packs, float s) {
  using R = typename Raw<VEC>::T;
  const R* in = reinterpret_cast<const R*>(x);
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < packs; i += (long long)gridDim.x * blockDim.x) {
    write_pack(y + i * VEC, __ldcs(in + i), s);
  }
}

// One CTA per chunk of P * blockDim packs; pack p of thread t is chunk pack p * blockDim + t.
template <int VEC, int P>
__global__ void phased_kernel(const __half* __restrict__ x, float* __restrict__ y, long long packs, float s) {
  using R = typename Raw<VEC>::T;
  const R* in = reinterpret_cast<const R*>(x);
  const long long base = (long long)blockIdx.x * P * blockDim.x;
  R cache[P];
#pragma unroll
  for (int p = 0; p < P; ++p) {
    const long long k = base + p * blockDim.x + threadIdx.x;
    if (k < packs) cache[p] = __ldcs(in + k);
  }
  __syncthreads();  // where the one-pass kernels reduce the row
#pragma unroll
  for (int p = 0; p < P; ++p) {
    const long long k = base + p * blockDim.x + threadIdx.x;
    if (k < packs) write_pack(y + k * VEC, cache[p], s);
  }
}

struct Timer {
  void* flush;
  cudaEvent_t a, b;
  Timer() {
    CHECK(cudaMalloc(&flush, 256 << 20));
    CHECK(cudaEventCreate(&a));
    CHECK(cudaEventCreate(&b));
  }
  template <typename F>
  float median_us(F&& launch) {
    std::vector<float> t;
    for (int i = 0; i < 55; ++i) {
      CHECK(cudaMemsetAsync(flush, i, 256 << 20));
      CHECK(cudaEventRecord(a));
      launch();
      CHECK(cudaEventRecord(b));
      CHECK(cudaEventSynchronize(b));
      float ms;
      CHECK(cudaEventElapsedTime(&ms, a, b));
      if (i >= 5) t.push_back(ms * 1000.f);
    }
    CHECK(cudaGetLastError());
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
  }
};

int main() {
  int sms;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  cudaDeviceProp prop;
  CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("%s, %d SMs; times in us (median of 50, L2 flushed); x = copy time / time\n", prop.name, sms);
  Timer timer;
  const long long sizes[] = {64LL * 151936, 4096LL * 4096, 4LL * 8388608, 32768LL * 2048};
  const char* names[] = {"64x151936", "4096x4096", "4x8388608", "32768x2048"};
  for (int c = 0; c < 4; ++c) {
    const long long n = sizes[c];
    __half* x;
    float* y;
    CHECK(cudaMalloc(&x, n * 2));
    CHECK(cudaMalloc(&y, n * 4));
    CHECK(cudaMemset(x, 0x3c, n * 2));
    uint4* copy_buffer;  // the yardstick's source and destination, 3 bytes per element each
    CHECK(cudaMalloc(&copy_buffer, n * 6));
    const int grid = sms * 8, threads = 256;
    const long long copy_words = n * 3 / 16;  // 6 bytes per element moved: 3 read, 3 written
    const float copy = timer.median_us([&] {
      copy_kernel<<<grid, threads>>>(copy_buffer, copy_buffer + copy_words, copy_words);
    });
    const float s8 = timer.median_us([&] { stream_kernel<8><<<grid, threads>>>(x, y, n / 8, 1.5f); });
    const float s4 = timer.median_us([&] { stream_kernel<4><<<grid, threads>>>(x, y, n / 4, 1.5f); });
    const float s8x = timer.median_us([&] { stream_paired_kernel<<<grid, threads>>>(x, y, n / 8, 1.5f); });
    // lean-like: 256 threads, 16 values per thread; grid-like: 512 threads, 64 values per thread
    const auto chunks = [&](long long packs, int p, int t) { return (unsigned)((packs + (long long)p * t - 1) / ((long long)p * t)); };
    const float l8 = timer.median_us([&] { phased_kernel<8, 2><<<chunks(n / 8, 2, 256), 256>>>(x, y, n / 8, 1.5f); });
    const float l4 = timer.median_us([&] { phased_kernel<4, 4><<<chunks(n / 4, 4, 256), 256>>>(x, y, n / 4, 1.5f); });
    const float g8 = timer.median_us([&] { phased_kernel<8, 8><<<chunks(n / 8, 8, 512), 512>>>(x, y, n / 8, 1.5f); });
    const float g4 = timer.median_us([&] { phased_kernel<4, 16><<<chunks(n / 4, 16, 512), 512>>>(x, y, n / 4, 1.5f); });
    std::printf("%-11s copy %7.1f | stream8 %7.1f (x%.2f) stream4 %7.1f (x%.2f) stream8x %7.1f (x%.2f) | phased8 256x2 %7.1f (x%.2f) "
                "phased4 256x4 %7.1f (x%.2f) | phased8 512x8 %7.1f (x%.2f) phased4 512x16 %7.1f (x%.2f)\n",
                names[c], copy, s8, copy / s8, s4, copy / s4, s8x, copy / s8x, l8, copy / l8, l4, copy / l4, g8, copy / g8, g4,
                copy / g4);
    CHECK(cudaFree(x));
    CHECK(cudaFree(y));
    CHECK(cudaFree(copy_buffer));
  }
  return 0;
}
