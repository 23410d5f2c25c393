// Few rows x mid N softmax (fp16): how much does the cross-CTA exchange cost, per way of doing it?
// A stand-alone measurement (not part of the extension), to choose the design of the few-rows kernel.
//
//   copy        y = x, 16-byte packs (the PERF.md yardstick)
//   nosync      load -> CTA reduce -> store, no exchange between the CTAs of a row (wrong result: the floor)
//   grid_cg     cooperative launch, partials in global memory, cooperative_groups grid.sync()
//   grid_row    cooperative launch, partials in global memory, a per-row arrival counter (self-resetting,
//               generation word), so a row waits only for its own CTAs
//   grid_flag   cooperative launch, each partial carries the launch's epoch; readers spin until all the
//               row's partials carry it (no counter, one L2 round trip)
//   cluster     a cluster of C CTAs per row, partials through distributed shared memory (cg cluster.sync)
//
// Timing: CUDA events around one launch, L2 flushed (256 MB write) before each, median of 200.
// Build: nvcc -O3 -arch=sm_90a -std=c++17 -o few_rows_sync few_rows_sync.cu
#include <cooperative_groups.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace cg = cooperative_groups;

#define CHECK(x)                                                                                    \
  do {                                                                                              \
    cudaError_t err_ = (x);                                                                            \
    if (err_ != cudaSuccess) {                                                                         \
      std::printf("%s failed: %s (line %d)\n", #x, cudaGetErrorString(err_), __LINE__);                \
      std::exit(1);                                                                                 \
    }                                                                                               \
  } while (0)

struct MS {
  float m, s;
};
__device__ __forceinline__ MS merge(MS a, MS b) {
  const float m = fmaxf(a.m, b.m);
  if (m == -INFINITY) return {m, 0.f};
  return {m, a.s * __expf(a.m - m) + b.s * __expf(b.m - m)};
}
__device__ __forceinline__ MS warp_reduce(MS v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    MS p{__shfl_xor_sync(~0u, v.m, o), __shfl_xor_sync(~0u, v.s, o)};
    v = merge(v, p);
  }
  return v;
}
__device__ MS block_reduce(MS v) {
  __shared__ MS warps[32];
  v = warp_reduce(v);
  const int w = threadIdx.x / 32, l = threadIdx.x % 32;
  if (l == 0) warps[w] = v;
  __syncthreads();
  MS r = l < (int)(blockDim.x / 32) ? warps[l] : MS{-INFINITY, 0.f};
  return warp_reduce(r);
}

struct Args {
  const uint4* x;
  uint4* y;
  int rows;
  int packs;  // per row (8 halves each)
  int C;      // CTAs per row
  MS* partials;
  unsigned* counters;  // [rows] arrivals
  unsigned* gens;      // [rows] generations
  unsigned epoch;
};

template <int P>
struct Chunk {
  uint4 v[P];
};

template <int P>
__device__ __forceinline__ MS load_reduce(const Args& a, int row, int rank, Chunk<P>& c, int& begin) {
  const int chunk = (a.packs + a.C - 1) / a.C;
  begin = rank * chunk;
  const int end = min(a.packs, begin + chunk);
  MS acc{-INFINITY, 0.f};
#pragma unroll
  for (int p = 0; p < P; ++p) {
    const int k = begin + p * blockDim.x + threadIdx.x;
    c.v[p] = k < end ? a.x[(size_t)row * a.packs + k] : make_uint4(0xfc00fc00u, 0xfc00fc00u, 0xfc00fc00u, 0xfc00fc00u);
  }
  float m = -INFINITY;
#pragma unroll
  for (int p = 0; p < P; ++p) {
    const __half2* h = reinterpret_cast<const __half2*>(&c.v[p]);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      float2 f = __half22float2(h[j]);
      m = fmaxf(m, fmaxf(f.x, f.y));
    }
  }
  float s = 0.f;
#pragma unroll
  for (int p = 0; p < P; ++p) {
    const __half2* h = reinterpret_cast<const __half2*>(&c.v[p]);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      float2 f = __half22float2(h[j]);
      s += __expf(f.x - m) + __expf(f.y - m);
    }
  }
  acc = {m, m == -INFINITY ? 0.f : s};
  return block_reduce(acc);
}

template <int P>
__device__ __forceinline__ void store(const Args& a, int row, int begin, const Chunk<P>& c, MS r) {
  const int chunk = (a.packs + a.C - 1) / a.C;
  const int end = min(a.packs, begin + chunk);
  const float inv = 1.f / r.s;
#pragma unroll
  for (int p = 0; p < P; ++p) {
    const int k = begin + p * blockDim.x + threadIdx.x;
    if (k >= end) continue;
    uint4 o;
    const __half2* h = reinterpret_cast<const __half2*>(&c.v[p]);
    __half2* q = reinterpret_cast<__half2*>(&o);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      float2 f = __half22float2(h[j]);
      q[j] = __floats2half2_rn(__expf(f.x - r.m) * inv, __expf(f.y - r.m) * inv);
    }
    a.y[(size_t)row * a.packs + k] = o;
  }
}

__device__ __forceinline__ MS merge_partials(const Args& a, int row) {
  __shared__ MS result;
  if (threadIdx.x < 32) {
    MS v{-INFINITY, 0.f};
    for (int i = threadIdx.x; i < a.C; i += 32) {
      const float2 f = __ldcg(reinterpret_cast<const float2*>(a.partials + row * a.C + i));
      v = merge(v, MS{f.x, f.y});
    }
    v = warp_reduce(v);
    if (threadIdx.x == 0) result = v;
  }
  __syncthreads();
  return result;
}

__global__ void copy_kernel(const uint4* x, uint4* y, size_t n) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) y[i] = x[i];
}

enum Mode { kNoSync, kGridCg, kGridRow, kGridFlag };

template <int P, Mode M>
__global__ void __launch_bounds__(1024) grid_kernel(Args a) {
  const int row = blockIdx.x / a.C, rank = blockIdx.x % a.C;
  Chunk<P> c;
  int begin;
  MS r = load_reduce<P>(a, row, rank, c, begin);
  if constexpr (M == kGridCg) {
    if (threadIdx.x == 0) a.partials[row * a.C + rank] = r;
    cg::this_grid().sync();
    r = merge_partials(a, row);
  } else if constexpr (M == kGridRow) {
    if (threadIdx.x == 0) {
      a.partials[row * a.C + rank] = r;
      volatile unsigned* gen = a.gens + row;
      const unsigned g = *gen;
      __threadfence();
      const unsigned arrived = atomicAdd(a.counters + row, 1u);
      if (arrived == (unsigned)a.C - 1) {
        a.counters[row] = 0;
        __threadfence();
        atomicExch(a.gens + row, g + 1);
      } else {
        while (*gen == g) {
        }
      }
      __threadfence();
    }
    __syncthreads();
    r = merge_partials(a, row);
  } else if constexpr (M == kGridFlag) {
    // partial slot = (m, s, epoch, pad) written as one 16-byte store: readers see all or nothing.
    uint4* slots = reinterpret_cast<uint4*>(a.partials);
    if (threadIdx.x == 0) {
      uint4 v = make_uint4(__float_as_uint(r.m), __float_as_uint(r.s), a.epoch, 0u);
      asm volatile("st.release.gpu.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(slots + row * a.C + rank),
                   "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
                   : "memory");
    }
    __shared__ MS result;
    if (threadIdx.x < 32) {
      MS acc{-INFINITY, 0.f};
      for (int i = threadIdx.x; i < a.C; i += 32) {
        uint4 v;
        do {
          asm volatile("ld.acquire.gpu.global.v4.u32 {%0, %1, %2, %3}, [%4];"
                       : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                       : "l"(slots + row * a.C + i)
                       : "memory");
        } while (v.z != a.epoch);
        acc = merge(acc, MS{__uint_as_float(v.x), __uint_as_float(v.y)});
      }
      acc = warp_reduce(acc);
      if (threadIdx.x == 0) result = acc;
    }
    __syncthreads();
    r = result;
  }
  store<P>(a, row, begin, c, r);
}

template <int P>
__global__ void __launch_bounds__(1024) cluster_kernel(Args a) {
  cg::cluster_group cluster = cg::this_cluster();
  const int row = blockIdx.x / a.C, rank = cluster.block_rank();
  __shared__ MS mine;
  __shared__ MS result;
  Chunk<P> c;
  int begin;
  MS r = load_reduce<P>(a, row, rank, c, begin);
  if (threadIdx.x == 0) mine = r;
  cluster.sync();
  if (threadIdx.x < 32) {
    MS v = threadIdx.x < (unsigned)a.C ? *cluster.map_shared_rank(&mine, threadIdx.x) : MS{-INFINITY, 0.f};
    v = warp_reduce(v);
    if (threadIdx.x == 0) result = v;
  }
  // arrive now (relaxed: nothing of ours to publish), wait before exit: peers may still read `mine`.
  __syncthreads();
  asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
  r = result;
  store<P>(a, row, begin, c, r);
  asm volatile("barrier.cluster.wait.aligned;" ::: "memory");
}

struct Timer {
  cudaEvent_t b, e;
  void* flush;
  Timer() {
    CHECK(cudaEventCreate(&b));
    CHECK(cudaEventCreate(&e));
    CHECK(cudaMalloc(&flush, 256 << 20));
  }
  template <typename F>
  float median_us(F&& f) {
    for (int i = 0; i < 20; ++i) f();
    std::vector<float> t;
    for (int i = 0; i < 200; ++i) {
      CHECK(cudaMemsetAsync(flush, i, 256 << 20));
      CHECK(cudaEventRecord(b));
      f();
      CHECK(cudaEventRecord(e));
      CHECK(cudaEventSynchronize(e));
      float ms;
      CHECK(cudaEventElapsedTime(&ms, b, e));
      t.push_back(ms * 1000.f);
    }
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
  }
};

template <int P>
void run_shape(Timer& timer, int rows, int n, int C, int T) {
  const int packs = n / 8;
  const size_t bytes = (size_t)rows * n * 2;
  std::vector<__half> hx((size_t)rows * n);
  srand(1);
  for (auto& v : hx) v = __float2half(3.f * ((rand() / (float)RAND_MAX) * 2.f - 1.f));
  Args a{};
  CHECK(cudaMalloc((void**)&a.x, bytes));
  CHECK(cudaMalloc((void**)&a.y, bytes));
  CHECK(cudaMemcpy((void*)a.x, hx.data(), bytes, cudaMemcpyHostToDevice));
  CHECK(cudaMalloc((void**)&a.partials, rows * C * 16));
  CHECK(cudaMemset(a.partials, 0, rows * C * 16));
  CHECK(cudaMalloc((void**)&a.counters, rows * 4));
  CHECK(cudaMalloc((void**)&a.gens, rows * 4));
  CHECK(cudaMemset(a.counters, 0, rows * 4));
  CHECK(cudaMemset(a.gens, 0, rows * 4));
  a.rows = rows;
  a.packs = packs;
  a.C = C;
  if ((size_t)((packs + C - 1) / C) > (size_t)P * T) {
    std::printf("%dx%d C=%d T=%d P=%d: chunk does not fit\n", rows, n, C, T, P);
    return;
  }
  // reference row sums check: sum of outputs of row 0 ~ 1
  auto check = [&](const char* name) {
    std::vector<__half> hy((size_t)n);
    CHECK(cudaMemcpy(hy.data(), a.y, (size_t)n * 2, cudaMemcpyDeviceToHost));
    double s = 0;
    for (auto v : hy) s += __half2float(v);
    return s;
  };
  const float copy = timer.median_us([&] { copy_kernel<<<264, 512>>>(a.x, a.y, bytes / 16); });
  auto coop = [&](auto kernel) {
    void* params[] = {&a};
    CHECK(cudaLaunchCooperativeKernel((void*)kernel, rows * C, T, params, 0, 0));
  };
  const float nosync_plain = timer.median_us([&] { grid_kernel<P, kNoSync><<<rows * C, T>>>(a); });
  const float nosync_coop = timer.median_us([&] { coop(grid_kernel<P, kNoSync>); });
  const float gcg = timer.median_us([&] { coop(grid_kernel<P, kGridCg>); });
  const double s_cg = check("grid_cg");
  const float grow = timer.median_us([&] { coop(grid_kernel<P, kGridRow>); });
  const double s_row = check("grid_row");
  const float gflag = timer.median_us([&] {
    ++a.epoch;
    coop(grid_kernel<P, kGridFlag>);
  });
  const double s_flag = check("grid_flag");
  float clus = -1.f;
  double s_clus = -1;
  if (C <= 16) {
    auto k = cluster_kernel<P>;
    CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
    cudaLaunchConfig_t cfg{};
    cfg.gridDim = dim3(rows * C);
    cfg.blockDim = dim3(T);
    cudaLaunchAttribute attr;
    attr.id = cudaLaunchAttributeClusterDimension;
    attr.val.clusterDim.x = C;
    attr.val.clusterDim.y = 1;
    attr.val.clusterDim.z = 1;
    cfg.attrs = &attr;
    cfg.numAttrs = 1;
    int clusters = 0;
    CHECK(cudaOccupancyMaxActiveClusters(&clusters, k, &cfg));
    if (clusters >= rows) {
      clus = timer.median_us([&] { CHECK(cudaLaunchKernelEx(&cfg, k, a)); });
      s_clus = check("cluster");
    }
  }
  std::printf(
      "%4dx%-8d C=%3d T=%4d P=%d | copy %6.2f | nosync plain %6.2f coop %6.2f | grid_cg %6.2f grid_row %6.2f "
      "grid_flag %6.2f cluster %6.2f us | row0 sums %.3f %.3f %.3f %.3f\n",
      rows, n, C, T, P, copy, nosync_plain, nosync_coop, gcg, grow, gflag, clus, s_cg, s_row, s_flag, s_clus);
  cudaFree((void*)a.x);
  cudaFree(a.y);
  cudaFree(a.partials);
  cudaFree(a.counters);
  cudaFree(a.gens);
}

int main() {
  Timer timer;
  cudaDeviceProp prop;
  CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("%s, %d SMs\n", prop.name, prop.multiProcessorCount);
  // 4 x 16384: 2048 packs per row
  run_shape<1>(timer, 4, 16384, 16, 128);
  run_shape<1>(timer, 4, 16384, 8, 256);
  run_shape<2>(timer, 4, 16384, 16, 64);
  run_shape<1>(timer, 4, 16384, 32, 64);
  // 4 x 65536: 8192 packs
  run_shape<1>(timer, 4, 65536, 64, 128);
  run_shape<1>(timer, 4, 65536, 16, 512);
  run_shape<2>(timer, 4, 65536, 16, 256);
  run_shape<4>(timer, 4, 65536, 16, 128);
  run_shape<1>(timer, 4, 65536, 32, 256);
  // 4 x 262144: 32768 packs
  run_shape<1>(timer, 4, 262144, 66, 512);
  run_shape<2>(timer, 4, 262144, 16, 1024);
  run_shape<4>(timer, 4, 262144, 16, 512);
  run_shape<2>(timer, 4, 262144, 32, 512);
  run_shape<2>(timer, 4, 262144, 64, 256);
  // 8 x 262144
  run_shape<2>(timer, 8, 262144, 33, 512);
  run_shape<4>(timer, 8, 262144, 16, 512);
  run_shape<1>(timer, 8, 262144, 16, 1024);  // does not fit: chunk 2048 packs > 1024
  run_shape<2>(timer, 8, 262144, 16, 1024);
  // 4 x 1048576: 131072 packs
  run_shape<4>(timer, 4, 1048576, 66, 512);
  return 0;
}
