// The boundary between the host launcher (softmax_cuda.cpp, g++) and the kernel files (*.cu, nvcc):
// plain structs and launch functions taking raw pointers, sizes, DType tags and a stream. No ATen here.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <initializer_list>

#include "softmax_ops/device_utils.cuh"  // DType (the device helpers are hidden from host compilers)

namespace softmax_ops {

// The menu (DESIGN.md §4). Names as the registry shows them are in softmax_dispatch.cpp.
enum class SoftmaxKernel : int {
  kWarp = 0,         // 1-32 lanes per row, row in registers, several rows per warp
  kBlockOnePass,     // one CTA per row, row cached in registers (+ dynamic shared memory), one read
  kClusterOnePass,   // a thread-block cluster per row, chunks cached on chip, partials merged via DSMEM
  kGridOnePass,      // few rows: a cooperative launch, many CTAs per row, chunks cached on chip (stream_rest:
                     // as much as fits, the rest read twice), partials merged through a global workspace
                     // after one grid barrier
  kTwoPass,          // one CTA per row, any n: online (max, sum) pass, then re-read (L2) and write
  kSplitRow,         // two launches, any n: per-chunk partials to a workspace, then merge + normalise
  kStrided,          // reduced dim not last ([outer, n, inner > 1]): threads across inner, loop over n
};
constexpr int kNumSoftmaxKernels = 7;

// One softmax-family problem on a contiguous tensor seen as [outer, n, inner].
// Forward: in0 = x (in_dtype), out = result (out_dtype); log selects log_softmax.
// Backward: in0 = grad_output, in1 = output (both in_dtype), out = grad_input (out_dtype).
struct SoftmaxProblem {
  bool backward = false;
  bool log = false;
  DType in_dtype = DType::kFloat32;
  DType out_dtype = DType::kFloat32;
  int64_t outer = 1;
  int64_t n = 1;
  int64_t inner = 1;
  int64_t rows() const { return outer * inner; }
};

// A complete launch configuration chosen by choose_softmax_kernel (softmax_dispatch.h).
struct SoftmaxPlan {
  SoftmaxKernel kernel = SoftmaxKernel::kTwoPass;
  int vec = 1;              // elements per vector access: 16 bytes of in_dtype, or 1 (unaligned/odd n)
  int threads = 256;        // threads per CTA (strided: blockDim.x * blockDim.y)
  int block_x = 1;          // strided: threads across inner (blockDim.x); threads / block_x along n
  int lanes_per_row = 32;   // warp: lanes sharing one row (power of two, 1..32)
  int reg_packs = 1;        // warp: vector packs per lane; block/cluster/grid: packs per thread in registers
  int edges_per_lane = 1;   // warp, peeled: a row's edge elements each lane holds (1, or 2 / 4 for 16-bit rows)
  int smem_packs = 0;       // block/cluster/grid: further packs per thread (per input stream) in shared memory
  int cluster = 1;          // cluster: CTAs per row (thread-block cluster size)
  int64_t chunks = 1;       // split_row, grid_onepass: CTAs per row
  int64_t grid = 1;         // CTAs launched (cluster: a multiple of `cluster`)
  size_t smem_bytes = 0;    // dynamic shared memory per CTA
  size_t workspace_bytes = 0;  // split_row, grid_onepass: the per-chunk partials, allocated by the caller
  bool prefetch = false;    // block: each CTA's next row streams into shared memory (smem_bytes) meanwhile
  bool stream_rest = false; // grid_onepass: a chunk exceeds the cache; its rest is read twice from global memory
  bool lean = false;        // block: the lean instance (kLean): forward max-first / exp-once, backward lean_backward_rows
  bool peel = false;        // block/cluster/grid (not streamed, not prefetching; lean included), two_pass, split_row:
                            // vec = 16 bytes for rows whose length or start breaks 16-byte packs; each row's
                            // aligned body in packs, the < vec elements before and after it singly
                            // (softmax_kernel_common.cuh: RowEdges)
};

// Launch-shape limits compiled into the kernels (__launch_bounds__), read by the dispatcher too.
constexpr int kMaxClusterCtas = 16;            // cluster_onepass: CTAs per row (16: the non-portable opt-in)
constexpr int kWarpKernelThreads = 128;       // warp kernel: 4 warps per CTA
constexpr int kWarpKernelMaxPacks = 8;        // warp kernel: packs per lane (row <= 32 x 8 packs)
// Peeled warp rows of 16-bit elements: edge elements per lane at most (2 and 4 compiled), in lanes of up to
// kWarpPeelMultiEdgeMaxPacks packs (...Backward in the backward; softmax_dispatch.cpp: plan_warp says why).
constexpr int kWarpPeelMaxEdgesPerLane = 4;
constexpr int kWarpPeelMultiEdgeMaxPacks = 2;
constexpr int kWarpPeelMultiEdgeMaxPacksBackward = 1;
// Peeled rows: the most edge elements (head + tail: RowEdges, device_utils.cuh) that any of `rows` rows of n
// elements has, the first starting at element phase `phase` (its address / element size, modulo vec) and each
// row right after the one before. Row r starts at phase + r n (mod vec), so the first vec rows show every phase
// there is: 4 for 16-bit rows of 100 or 60 (phases 0 and 4: a head or a tail of 4), up to 2 (vec - 1) when n is
// odd. The peeled warp kernel gives a row at least that many edge slots (lanes x edge elements per lane).
inline int max_row_edges(int64_t phase, int64_t n, int64_t rows, int vec) {
  int most = 0;
  for (int64_t r = 0; r < rows && r < vec; ++r) {
    const int64_t start = (phase + r * (n % vec)) % vec;
    const int64_t head = (vec - start) % vec < n ? (vec - start) % vec : n;
    const int edges = static_cast<int>(head + (n - head) % vec);
    most = edges > most ? edges : most;
  }
  return most;
}
constexpr int kBlockKernelMaxThreads = 1024;  // block/cluster kernel: <= 64 registers per thread
// The block kernel's lean instance (kLean): CTAs of up to 512 threads, 4 per SM, <= 32 registers per thread.
constexpr int kLeanCtaThreads = 512;
constexpr int kLeanMinCtas = 4;
constexpr int kLeanRegPacks = 2;
// ... and its wide form for the longest of those rows (softmax_dispatch.cpp: kLeanWideMinPacks): 4 packs per
// thread, CTAs of up to 256 threads (8 warps: half the per-element reduction work), 4 per SM, <= 64 registers.
constexpr int kLeanWideCtaThreads = 256;
constexpr int kLeanWideRegPacks = 4;
// ... and its float32 forward form (softmax_dispatch.cpp: lean_rows): 8 packs per thread, the 64-register
// instance's bytes in flight (128 KB per SM), CTAs of up to 256 threads, 4 per SM, <= 64 registers.
constexpr int kLeanFloatCtaThreads = 256;
constexpr int kLeanFloatRegPacks = 8;
// ... and its one-pack form (softmax_dispatch.cpp: lean_rows): many whole 16-bit forward rows of one wave, one
// 16-byte pack per thread, so that each thread's chain from load to store is as short as it gets.
constexpr int kLeanOnePackRegPacks = 1;
// The lean instance's forms. lean_rows (softmax_dispatch.cpp) picks one per plan; softmax_block.cu compiles the
// instance of every form an op has (lean_instance), and no other.
enum class LeanForm {
  kTwoPacks,  // kLeanRegPacks per thread: the backward (16- or 32-bit streams, whatever its result dtype), 16-bit
              // forward rows, float32 forward rows of few rows (up to 4096 columns) or of one wave (session 39)
  kWide,      // kLeanWideRegPacks: many 16-bit forward rows of more than kLeanWideMinPacks packs
  kFloat,     // kLeanFloatRegPacks: other float32 forward rows
  kOnePack,   // kLeanOnePackRegPacks: many whole 16-bit forward rows of one wave (lean_rows; never peeled)
};
constexpr int lean_reg_packs(LeanForm form) {
  return form == LeanForm::kWide      ? kLeanWideRegPacks
         : form == LeanForm::kFloat   ? kLeanFloatRegPacks
         : form == LeanForm::kOnePack ? kLeanOnePackRegPacks
                                      : kLeanRegPacks;
}
// Whether rows of `in_bytes`-byte input streams have `form` (float64 has none); `widening`: a 16-bit forward input
// with a float32 result, which has no one-pack form.
constexpr bool lean_form_exists(int in_bytes, bool backward, LeanForm form, bool widening) {
  if (in_bytes != 2 && in_bytes != 4) return false;
  if (backward || form == LeanForm::kTwoPacks) return form == LeanForm::kTwoPacks;
  if (form == LeanForm::kOnePack) return in_bytes == 2 && !widening;
  return form == (in_bytes == 4 ? LeanForm::kFloat : LeanForm::kWide);
}
// Whether one of those forms holds `reg_packs` per thread: the lean instances softmax_block.cu compiles, whole
// (peel false) or peeled (every form but the one-pack form, which lean_rows gives whole rows only).
constexpr bool lean_instance(int in_bytes, bool backward, int reg_packs, bool widening, bool peel) {
  for (LeanForm form : {LeanForm::kTwoPacks, LeanForm::kWide, LeanForm::kFloat, LeanForm::kOnePack}) {
    if (peel && form == LeanForm::kOnePack) continue;
    if (lean_form_exists(in_bytes, backward, form, widening) && lean_reg_packs(form) == reg_packs) return true;
  }
  return false;
}
// Launch bounds of the lean instance with PREG register packs.
constexpr int lean_cta_threads(int reg_packs) {
  return reg_packs == kLeanWideRegPacks    ? kLeanWideCtaThreads
         : reg_packs == kLeanFloatRegPacks ? kLeanFloatCtaThreads
                                           : kLeanCtaThreads;
}
// ... the registers per thread those bounds leave (kLeanMinCtas CTAs per SM in a 64K-register file), and the
// packs per row (per stream) one CTA holds.
constexpr int lean_max_registers(int reg_packs) { return 65536 / (kLeanMinCtas * lean_cta_threads(reg_packs)); }
constexpr int lean_max_row_packs(int reg_packs) { return lean_cta_threads(reg_packs) * reg_packs; }
constexpr int kStreamingMaxThreads = 512;     // two_pass, split_row, strided: <= 128 registers per thread

// Vector packs per thread the block/cluster kernel keeps in registers (it is compiled for 1024 threads,
// i.e. at most 64 registers per thread). Measured with `nvcc -Xptxas -v` (sm_90, nvcc 13.0): 8 packs of
// one input stream (32 registers of data) for float and, since the cache stays packed (cached_element),
// for 16-bit types too (half -> float output: 20 bytes of spill, the 32-byte output pack); double: 1 (the
// fp64 exp/log polynomials need the registers). Backward caches two streams: float 4 packs each, 16-bit 2
// (4 spill). Bytes in flight per SM are what the one-pass kernel lives on: 1024 threads x 8 packs x 16 B
// = 128 KB per SM, where 16-bit rows had half of that with 4 packs (0.80 of copy against 0.95 for fp32 on
// H200). The vector-width 1 path always uses this maximum (odd n / unaligned inputs are not worth more
// instantiations).
constexpr int max_block_reg_packs(DType in_dtype, bool backward) {
  if (in_dtype == DType::kFloat64) return 1;
  const bool narrow = in_dtype == DType::kFloat16 || in_dtype == DType::kBFloat16;
  if (backward) return narrow ? 2 : 4;
  return 8;
}

// Which peeled instances (plan.peel) of the block kernel exist: the most register packs for every dtype pair, and below
// the most: 16-bit rows with a 16-bit result (forward 1, 2 and 4 packs, backward 1), 16-bit forwards with a float32
// result (1, 2 and 4) and the float32 backward (1 and 2). Few such rows spread over more threads with fewer packs each
// (cache_shape's spread, the plan of their aligned body), which peel_few_rows then runs peeled; before these instances
// it could peel only the largest bucket, and such rows read single elements (H100: 3 x 100003 fp16 softmax at 0.55 of
// copy in session 33's sweep, its aligned neighbour 3 x 100000 at 0.70 in session 34 call 1). The float32 forward has
// none: spread, it lost to its peeled cluster of 8 packs (peeled_cluster_rows) on 8 of 16 shapes by 6-23% and was even
// on the rest (8 x 65537 8.6-9.3 -> 10.9-11.0 us, 16 x 100003 +11%; H100, session 34 call 2,
// *session34-c2-compare-peeled-spread-fp32.txt*). softmax_block.cu compiles exactly these.
constexpr bool peeled_instance(DType in_dtype, DType out_dtype, bool backward, int reg_packs) {
  if (reg_packs == max_block_reg_packs(in_dtype, backward)) return true;
  const bool narrow = in_dtype == DType::kFloat16 || in_dtype == DType::kBFloat16;
  const bool narrow_forward = narrow && !backward && (out_dtype == in_dtype || out_dtype == DType::kFloat32);
  const bool narrow_backward = narrow && backward && out_dtype == in_dtype;
  const bool float32_backward = in_dtype == DType::kFloat32 && backward && out_dtype == in_dtype;
  return (narrow_forward || narrow_backward || float32_backward) && reg_packs < max_block_reg_packs(in_dtype, backward);
}

// Register packs per thread of the grid kernel's streaming instance (chunks larger than the cache): its
// folding loop keeps kStreamUnroll packs in flight next to the cache, under the same 64-register budget.
// nvcc 13.0, sm_90 (-Xptxas -v): 2 packs spill nothing (fp32 forward) to 20 bytes (fp16); 8 spilled 100-280
// bytes. Single elements keep the only bucket they have.
constexpr int grid_stream_reg_packs(DType in_dtype, bool backward, bool vector) {
  const int most = max_block_reg_packs(in_dtype, backward);
  return vector && most > 2 ? 2 : most;
}

struct SoftmaxPointers {
  const void* in0 = nullptr;
  const void* in1 = nullptr;
  void* out = nullptr;
  void* workspace = nullptr;
};

// Each returns the first CUDA error of its launches (cudaSuccess when all launched). One per .cu file.
cudaError_t launch_softmax_warp(const SoftmaxProblem& problem, const SoftmaxPlan& plan,
                                const SoftmaxPointers& ptrs, cudaStream_t stream);
cudaError_t launch_softmax_block(const SoftmaxProblem& problem, const SoftmaxPlan& plan,
                                 const SoftmaxPointers& ptrs, cudaStream_t stream);
cudaError_t launch_softmax_streaming(const SoftmaxProblem& problem, const SoftmaxPlan& plan,
                                     const SoftmaxPointers& ptrs, cudaStream_t stream);

// How many of `plan`'s row groups the current device holds at once: clusters for a cluster plan (sizes above 8
// CTAs are non-portable and need a whole GPC), CTAs for any other (per SM x sm_count); 0: none. Queries the
// occupancy API (no sync).
int softmax_max_resident(const SoftmaxProblem& problem, const SoftmaxPlan& plan, int sm_count);

}  // namespace softmax_ops
