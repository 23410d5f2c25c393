// Block / cluster / grid one-pass kernel: a row (or, split over a group of CTAs, a contiguous chunk of a
// row per CTA) is read once, cached on chip, reduced, then normalised from the cache and written once.
//
//   group of C CTAs per row (C = 1: plain block-per-row), T threads per CTA; the group is a thread-block
//   cluster (cluster_onepass, C <= 16) or a run of C consecutive CTAs of a cooperative launch
//   (grid_onepass, any C, every CTA resident at once):
//
//     row packs:  [ chunk of CTA 0 | chunk of CTA 1 | ... | chunk of CTA C-1 ]   chunk = ceil(packs / C)
//     in a chunk, thread t holds packs t, t + T, t + 2T, ...: the first PREG in registers, the next
//     `smem_packs` in dynamic shared memory (its own slots only, so the cache needs no barrier).
//
//   reduction: warp butterfly -> per-warp partials in shared memory -> every warp merges the partials
//   with the same butterfly (block_all_reduce); with C > 1 in a cluster, lane i of warp 0 writes the CTA's
//   result into peer i's inbox through distributed shared memory (ClusterInbox: st.async, counted on the
//   peer's mbarrier), warp 0 waits for its own inbox to fill and merges the C results with a fixed
//   butterfly, so every CTA of the cluster gets bitwise the same row result. A grid group publishes its
//   results to a global workspace [rows][C] instead, then a grid barrier; every CTA of the row then merges
//   the C results in the same fixed order (lane i folds results i, i + 32, ..., then a butterfly), so it
//   too gets bitwise the same row result.
//
//   kStreamRest (grid groups whose chunk exceeds what a CTA can cache; few rows of millions of elements):
//   the cache holds the first threads x (PREG + smem_packs) packs of the chunk, the rest is folded straight
//   from global memory after the cache's loads are issued, and re-read (last part first, where L2 still
//   has it, see write_packs) before the cached part is written. The same CTA reads its chunk both times,
//   and one launch replaces split_row's two (the dispatcher's rule: grid_group_streamed).
//
// Shared buffers (and inbox slots) alternate by row parity, which lets one barrier per step protect them
// (see block_all_reduce and ClusterInbox). A cluster CTA exits only after its inbox received every peer's
// last result, so no peer writes into the shared memory of an exited CTA.
#pragma once

#include <cooperative_groups.h>

#include "softmax_streaming_kernels.cuh"

namespace softmax_ops::detail {

// Size and rank of this CTA's cluster: (1, 0) when launched without clusters or compiled for pre-Hopper.
struct ClusterPosition {
  unsigned size;
  unsigned rank;
};

__device__ __forceinline__ ClusterPosition cluster_position() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const cooperative_groups::cluster_group cluster = cooperative_groups::this_cluster();
  return {cluster.num_blocks(), cluster.block_rank()};
#else
  return {1u, 0u};
#endif
}

// The cluster barrier split in two, with relaxed arrival: ClusterInbox's set-up (mbarriers initialised, then
// fence.mbarrier_init) is all a peer needs to see before it may send, and the wait comes late, after the
// CTA's loads and reduction.
__device__ __forceinline__ void cluster_arrive_relaxed() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
#endif
}
__device__ __forceinline__ void cluster_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.wait.aligned;" ::: "memory");
#else
  __syncthreads();
#endif
}

// A row's partial results within a cluster, pushed rather than pulled: each CTA writes its (block-reduced)
// partial into slot [parity][its rank] of every peer's inbox with st.async, which also counts the bytes on
// that peer's mbarrier for the row's parity; each CTA waits on its own mbarrier only, then merges its slots in
// rank order (bitwise the same row result in every CTA). No cluster-wide barrier per row: the pulled form
// (publish, cluster barrier with release / acquire, read the peers through distributed shared memory) spent
// 11% of a 4 x 16384 fp16 launch's stall samples in the release's ERRBAR alone and another 17% waiting at the
// barrier and its convergence (Nsight Compute, H100, session 16, *session16-c6-ncu-softmax-cluster-*). A/B
// against the pulled form (H100, session 16 call 9, three interleaved runs, *session16-c9-compare-inbox-*):
// softmax 4 x 16384 .. 4 x 114688 -2..-13%, softmax_backward -4..-12%, 64 x 151936 softmax_backward (clusters of
// 2) -2..-7%; float32 64 x 151936 softmax (a grid group, the same instance) +4%, 2048 x 131072 +1.6%.
// Slots alternate by row parity: a peer can send row r + 2 only after it received this CTA's row r + 1
// partial, which this CTA sends after it has read its row r slots. A CTA exits only after receiving every
// peer's last partial, so no peer writes into an exited CTA.
template <typename Acc>
struct alignas(16) ClusterInbox {  // 16: the float64 partials go as one v4 store
  Acc slot[2][kMaxClusterCtas];
  unsigned long long arrived[2];  // mbarriers: one arrival (this CTA's expect) + the bytes of every partial

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  static __device__ __forceinline__ uint32_t local_address(const void* p) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
  }
  static __device__ __forceinline__ uint32_t peer_address(uint32_t local, unsigned rank) {
    uint32_t remote;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(local), "r"(rank));
    return remote;
  }

  // Thread 0, before the CTA's cluster_arrive_relaxed (every CTA waits on that barrier before its first send).
  __device__ __forceinline__ void init() {
#pragma unroll
    for (int p = 0; p < 2; ++p) asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(local_address(&arrived[p])));
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  // Thread 0: this CTA's arrival for the row of `parity`, expecting `senders` partials.
  __device__ __forceinline__ void expect(int parity, unsigned senders) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(local_address(&arrived[parity])),
                 "r"(static_cast<uint32_t>(senders * sizeof(Acc)))
                 : "memory");
  }
  // This CTA's partial (sender rank `from`) into slot [parity][from] of peer `to`.
  __device__ __forceinline__ void send(const Acc& partial, int parity, unsigned from, unsigned to) {
    static_assert(sizeof(Acc) % sizeof(uint32_t) == 0, "sent as 32-bit words");
    const uint32_t slot_address = peer_address(local_address(&slot[parity][from]), to);
    const uint32_t barrier = peer_address(local_address(&arrived[parity]), to);
    uint32_t words[sizeof(Acc) / sizeof(uint32_t)];
    __builtin_memcpy(words, &partial, sizeof(Acc));
#pragma unroll
    for (int i = 0; i < static_cast<int>(sizeof(Acc) / sizeof(uint32_t)); ++i) {
      asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [%0], %1, [%2];"
                   ::"r"(slot_address + 4 * i), "r"(words[i]), "r"(barrier)
                   : "memory");
    }
  }
  // Until phase `phase` of the parity's mbarrier has completed: every partial of the row has landed, and is
  // visible to the calling thread (acquire at cluster scope).
  __device__ __forceinline__ void wait(int parity, unsigned phase) {
    uint32_t done = 0;
    while (!done) {
      asm volatile(
          "{\n .reg .pred p;\n mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], %2;\n"
          " selp.u32 %0, 1, 0, p;\n}"
          : "=r"(done)
          : "r"(local_address(&arrived[parity])), "r"(phase)
          : "memory");
    }
  }
#else
  // Clusters are planned (and launched) for sm_90 only: anywhere else a call is a dispatcher bug, not a no-op.
  __device__ void init() { __trap(); }
  __device__ void expect(int, unsigned) { __trap(); }
  __device__ void send(const Acc&, int, unsigned, unsigned) { __trap(); }
  __device__ void wait(int, unsigned) { __trap(); }
#endif
};

// Reads a value another CTA wrote before a grid barrier from L2 (ld.global.cg): the L1 of this SM is
// not coherent with other SMs' stores.
template <typename T>
__device__ __forceinline__ T load_from_l2(const T* ptr) {
  static_assert(sizeof(T) % sizeof(unsigned) == 0, "read as 32-bit words");
  T value;
  const unsigned* src = reinterpret_cast<const unsigned*>(ptr);
  unsigned* dst = reinterpret_cast<unsigned*>(&value);
#pragma unroll
  for (int i = 0; i < static_cast<int>(sizeof(T) / sizeof(unsigned)); ++i) dst[i] = __ldcg(src + i);
  return value;
}

__device__ __forceinline__ void grid_barrier() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 700
  cooperative_groups::this_grid().sync();  // release / acquire at gpu scope: global writes become visible
#else
  __trap();  // grid groups are planned for sm_90 only
#endif
}

// grid_group_size == 0: the group is the thread-block cluster (size 1 without one). grid_group_size = C > 0:
// the launch is cooperative, gridDim.x = rows * C, and `partials` holds rows * C accumulators.
struct BlockOptions {
  int grid_group_size = 0;
  void* partials = nullptr;
};

// kPrefetch (CTAs of several rows whose row fits in registers, smem_packs == 0, 16-byte packs): while a
// row is reduced and written, the CTA's next row is already on its way into shared memory (cp.async, the
// thread's own PREG slots per stream); the next iteration reads it from there instead of from DRAM. A
// template parameter, not a flag: its live state made ptxas spill the register cache of the other
// instances (backward fp32, 4 packs: 64 bytes).
//
// The lean instance's CTA all-reduce of one float: a warp butterfly, the per-warp results to `slots`, ONE
// barrier, then every thread folds all the slots from 16-byte shared loads in a fixed order (bitwise the same
// result in every thread). One barrier suffices because the max and the sum use different slot buffers: a
// warp writes the max buffer of row r + 1 only after the sum barrier of row r, which every warp reaches only
// after reading the max buffer of row r; likewise the sum buffer across the max barrier of row r + 1.
// Warp 0 pads the slots up to the fold width with the identity. The earlier form (every thread reading the
// partials one by one in a loop over the warp count, then a second barrier) cost ~60 instructions per
// reduction with its loop control; the whole kernel executed 416 warp instructions per warp on 4096 x 4096
// fp16 against 304 for Liger's Triton kernel (Nsight Compute, H100, 2026-11-22). The loads stay independent
// (a butterfly over the warps' results, 4 dependent shuffles, measured slower in session 6: *session6-ab3-*).
constexpr int kLeanMaxWarps = kLeanCtaThreads / kWarpSize;

// Folds slots [0, kWidth) four at a time (a pairwise tree within each 16-byte load, then group after group):
// few live registers, as the lean instance holds its row's floats across the sum's reduction.
template <int kWidth, typename Combine>
__device__ __forceinline__ float fold_slots(const float* slots, Combine&& combine) {
  auto fold4 = [&](int i) {
    const float4 four = *reinterpret_cast<const float4*>(slots + i);
    return combine(combine(four.x, four.y), combine(four.z, four.w));
  };
  float acc = fold4(0);
#pragma unroll
  for (int i = 4; i < kWidth; i += 4) acc = combine(acc, fold4(i));
  return acc;
}

template <typename Combine>
__device__ __forceinline__ float lean_all_reduce(float v, float identity, float* slots, Combine&& combine) {
  const int lane = threadIdx.x % kWarpSize;
  const int warp = threadIdx.x / kWarpSize;
  const int num_warps = blockDim.x / kWarpSize;  // lean CTAs are whole warps (lean_rows)
  v = warp_all_reduce_with(v, kWarpSize, combine);
  const int width = num_warps <= 4 ? 4 : num_warps <= 8 ? 8 : kLeanMaxWarps;
  if (lane == 0) slots[warp] = v;
  if (warp == 0 && lane >= num_warps && lane < width) slots[lane] = identity;
  __syncthreads();
  if (width == 4) return fold_slots<4>(slots, combine);
  if (width == 8) return fold_slots<8>(slots, combine);
  return fold_slots<kLeanMaxWarps>(slots, combine);
}

// The max of a thread's cached 16-bit packs, taken on the packed pairs (HMNMX2, NaN-propagating: exact, as
// any max), then widened once.
template <typename In, int VEC, int PREG>
__device__ __forceinline__ float packed_row_max(const Pack<In, VEC> (&packs)[PREG]) {
  static_assert(sizeof(In) == 2 && VEC % 2 == 0, "16-bit packs of pairs");
  using Pair = std::conditional_t<std::is_same_v<In, __half>, __half2, __nv_bfloat162>;
  const Pair* pairs = reinterpret_cast<const Pair*>(&packs[0]);
  Pair m = pairs[0];
#pragma unroll
  for (int i = 1; i < PREG * VEC / 2; ++i) m = __hmax2_nan(m, pairs[i]);
  return row_max(convert<float>(m.x), convert<float>(m.y));
}

// The max (NaN-propagating) of a thread's cached packs as floats, in kIlp independent chains.
template <typename In, int VEC, int PREG>
__device__ __forceinline__ float cached_max(const Pack<In, VEC> (&packs)[PREG]) {
  float maxes[kIlp];
#pragma unroll
  for (int i = 0; i < kIlp; ++i) maxes[i] = negative_infinity<float>();
#pragma unroll
  for (int p = 0; p < PREG; ++p) {
#pragma unroll
    for (int j = 0; j < VEC; ++j) maxes[j % kIlp] = row_max(maxes[j % kIlp], cached_element<float>(packs[p], j));
  }
  return reduce_ilp(maxes, [](float a, float b) { return row_max(a, b); });
}

// The lean forward's thread max: 16-bit pairs packed (packed_row_max), float32 values as cached_max.
template <typename In, int VEC, int PREG>
__device__ __forceinline__ float lean_thread_max(const Pack<In, VEC> (&packs)[PREG]) {
  if constexpr (sizeof(In) == 2) {
    return packed_row_max(packs);
  } else {
    return cached_max(packs);
  }
}

// One row of the lean forward (see exp_once_rows). kFull: the CTA's threads x PREG packs are exactly the row
// (every power-of-two row), so no load is predicated and no pack padded with -inf. kPeel: the row's aligned body
// in packs, its edge elements one per thread (RowEdges), folded into the thread's max and sum and written singly.
template <typename Op, int VEC, int PREG, bool kLog, bool kFull, bool kPeel = false>
__device__ __forceinline__ void lean_forward_row(const RowArgs<Op>& args, int64_t row, float (*slots)[kLeanMaxWarps]) {
  using In = typename Op::In;
  using Out = typename Op::Out;
  using PackIn = Pack<In, VEC>;
  static_assert(!(kPeel && kFull), "a peeled row is never a whole number of the CTA's packs");
  // 32-bit offsets within the row (lean rows have at most kLeanCtaThreads x kLeanRegPacks packs): the 64-bit
  // ones spilled at 32 registers.
  const int threads = blockDim.x;
  const int tid = threadIdx.x;
  int n_packs = static_cast<int>(args.n / VEC);
  int64_t row_offset = row * args.n + static_cast<int64_t>(tid) * VEC;  // this thread's first pack
  [[maybe_unused]] RowEdges<VEC> edges{};
  [[maybe_unused]] float edge[1];
  if constexpr (kPeel) {
    edges = row_edges<VEC>(args, row);
    load_edge(args, row * args.n, edges, tid, edge);
    n_packs = static_cast<int>(edges.packs);
    row_offset += edges.head;
  }
  const In* in = args.in[0] + row_offset;
  auto in_row = [&](int p) { return kFull || p * threads + tid < n_packs; };
  PackIn packs[PREG];
#pragma unroll
  for (int p = 0; p < PREG; ++p) {
    packs[p] = in_row(p) ? load_vec<In, VEC>(in + p * threads * VEC) : filled_pack<In, VEC>(negative_infinity<float>());
  }
  float thread_max = lean_thread_max(packs);
  if constexpr (kPeel) thread_max = row_max(thread_max, edge[0]);  // -inf where the thread holds no edge
  const float m = lean_all_reduce(thread_max, negative_infinity<float>(), slots[0],
                                  [](float a, float b) { return row_max(a, b); });
  // A NaN or +inf anywhere makes the sum NaN, an all -inf row gives exp(NaN): every output NaN, as torch.
  // softmax keeps the exponentials (its output) as floats, log_softmax the packed inputs (its output is
  // (x - max) - log(sum)): as floats they and log(sum)'s temporaries spilled at 32 registers.
  float v[PREG][VEC];
  float sum = 0.0f;
#pragma unroll
  for (int p = 0; p < PREG; ++p) {
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      const float e = ExpMath<float>::exp_from(cached_element<float>(packs[p], j), m);
      if constexpr (!kLog) v[p][j] = e;
      sum += e;
    }
  }
  [[maybe_unused]] float edge_exp = 0.0f;
  if constexpr (kPeel) {
    edge_exp = ExpMath<float>::exp_from(edge[0], m);  // 0 for the padding (-inf), as the padded packs
    sum += edge_exp;
  }
  sum = lean_all_reduce(sum, 0.0f, slots[1], [](float a, float b) { return a + b; });
  const float inv_sum = ExpMath<float>::reciprocal(sum);
  const float log_sum = kLog ? ExpMath<float>::log_sum(sum) : 0.0f;
  if constexpr (kPeel) {
    if (tid < edges.count()) {
      const float y = kLog ? (edge[0] - m) - log_sum : edge_exp * inv_sum;
      args.out[row * args.n + edges.column(tid)] = convert<Out>(y);
    }
  }
#pragma unroll
  for (int p = 0; p < PREG; ++p) {
    const auto address = [&] { return args.out + row_offset + p * threads * VEC; };
    store_pack_where<Out, VEC>(in_row(p), address, [&](auto&& arrange) {
      Pack<Out, VEC> result;
      // torch's association: exp(x - max) * (1 / sum), and (x - max) - log(sum)
      if constexpr (kLog) {
        const PackIn in = arrange(packs[p]);
#pragma unroll
        for (int j = 0; j < VEC; ++j) result.v[j] = convert<Out>((cached_element<float>(in, j) - m) - log_sum);
        return result;
      } else {
#pragma unroll
        for (int j = 0; j < VEC; ++j) result.v[j] = convert<Out>(v[p][j] * inv_sum);
        return arrange(result);  // the exponentials are floats already
      }
    });
  }
}

// kLean (softmax and log_softmax of many 16-bit rows of 2-8K columns and of fewer rows than SMs of 256-8192 columns:
// a CTA per row, kLeanRegPacks or kLeanWideRegPacks packs per thread; float32 rows of 1-8K columns: kLeanFloatRegPacks,
// or kLeanRegPacks for few rows and rows of one wave, softmax_dispatch.cpp lean_rows): the row max first, then
// exp(x - max) ONCE per element, kept in float registers for the sum
// and the output (log_softmax keeps the packed inputs instead, its output (x - max) - log(sum) needs no exponential).
// The online (max, sum) form of the other instances takes each exponential twice (sum, then output): at 16
// bits that second MUFU + FADD + FMUL per element is what separated softmax (2048 x 4096 fp16 0.76 of copy on
// H200) from log_softmax (0.86-0.90); Liger's Triton kernel, which keeps exp(x - max) in registers, reached
// 0.92-0.98 in the same bench runs. log_softmax gains from the CTA shape and the max-first order alone (no
// per-chunk rescale, 2048 threads per SM): H200, 2026-11-22, two interleaved A/B runs, 2048 x 2048 .. 32768 x
// 2048 16-bit +0.03..+0.12 of copy in all 10 cases (*session6-ab-log-lean-*.json). Compiled for up to
// kLeanCtaThreads threads at kLeanMinCtas CTAs per SM (<= 32 registers). softmax / log_softmax and whole /
// partial rows are four compile-time bodies behind uniform branches: a runtime `log` cost a select per
// element (the kept value) and the partial rows' padding ~24 byte permutes per thread. With those, the packed
// max and lean_all_reduce: 35% fewer instructions (4096 x 4096 fp16, Nsight Compute, H100, 2026-11-22) and in
// three interleaved bench runs 2048 x 8192 16-bit softmax -2..-4%, the other lean shapes within +-1%
// (*session12-c3-*): at boost clocks these shapes already run at about copy speed. float32 rows (session 17,
// H100): -2..-10% against the 64-register instance with the same 8 packs per thread (see lean_rows).
// kPeel: peeled rows (never full), softmax and log_softmax bodies only.
template <typename Op, int VEC, int PREG, bool kPeel = false>
__device__ __forceinline__ void exp_once_rows(const RowArgs<Op>& args) {
  static_assert(Op::kStreams == 1 && std::is_same_v<typename Op::C, float>,
                "forward 16- or 32-bit rows with float math");
  __shared__ __align__(16) float slots[2][kLeanMaxWarps];  // the max's, the sum's (see lean_all_reduce)
  const int64_t n_packs = args.n / VEC;
  const int64_t cached = static_cast<int64_t>(blockDim.x) * PREG;
  if (cached < n_packs || blockDim.x % kWarpSize != 0 || blockDim.x > kLeanCtaThreads) __trap();  // dispatcher bug guard
  auto rows = [&](auto log, auto full) {
    for (int64_t row = blockIdx.x; row < args.rows; row += gridDim.x) {
      lean_forward_row<Op, VEC, PREG, decltype(log)::value, decltype(full)::value, kPeel>(args, row, slots);
    }
  };
  using True = std::true_type;
  using False = std::false_type;
  if constexpr (kPeel) {
    args.op.log ? rows(True{}, False{}) : rows(False{}, False{});
  } else {
    const bool full = cached == n_packs;
    if (args.op.log) {
      full ? rows(True{}, True{}) : rows(True{}, False{});
    } else {
      full ? rows(False{}, True{}) : rows(False{}, False{});
    }
  }
}

// kLean for the backward ops (softmax_backward and log_softmax_backward of many rows of 256-1024 packs, 16-
// or 32-bit, and of float32 streams from 192 packs, also fewer than SMs: see lean_rows; the forward's CTA
// shape: a CTA per row, kLeanRegPacks packs of each stream per thread): the same accumulate / finalize / apply as
// every other instance, without the cluster, grid-group and shared-memory machinery, so it fits 32 registers and
// up to 2048 threads per SM: for 16-bit streams twice the loads in flight of the 64-register instance (4 CTAs of
// 256 threads per SM on 4096 columns); see lean_rows.
// kPeel: rows read as an aligned body of packs plus single edge elements, one per thread (RowEdges). The edges
// live only where they are used: folded into the thread's sum as soon as they land, and read again (L1) for their
// results after the row's reduction (kept live across it at 32 registers, the 16-bit instances spilled 56-76 bytes
// and ran 13-49% slower than the plain peeled instance: session 19 call 5; see kLeanPeeledBackwardMinCtas).
template <typename Op, int VEC, int PREG, bool kPeel = false>
__device__ __forceinline__ void lean_backward_rows(const RowArgs<Op>& args) {
  using In = typename Op::In;
  using Out = typename Op::Out;
  using C = typename Op::C;
  using Acc = typename Op::Acc;
  using PackIn = Pack<In, VEC>;
  constexpr int S = Op::kStreams;
  static_assert(S == 2, "backward rows: grad_output and output");
  __shared__ Acc scratch[kWarpSize];  // block_all_reduce ends with a barrier
  const Op op = args.op;
  const int threads = blockDim.x;
  const int tid = threadIdx.x;
  // A row fits the CTA (<= 8192 columns): offsets within it are 32-bit (64-bit ones spilled under the
  // 32-register cap, ptxas nvcc 13.0).
  int n_packs = static_cast<int>(args.n / VEC);
  if (static_cast<int64_t>(threads) * PREG < args.n / VEC) __trap();  // dispatcher bug guard: a row must fit
  for (int64_t row = blockIdx.x; row < args.rows; row += gridDim.x) {
    int64_t row_offset = row * args.n;
    if constexpr (kPeel) {
      const RowEdges<VEC> edges = row_edges<VEC>(args, row);
      n_packs = static_cast<int>(edges.packs);
      row_offset += edges.head;
    }
    PackIn cache[S][PREG];
#pragma unroll
    for (int p = 0; p < PREG; ++p) {
      const int k = p * threads + tid;
#pragma unroll
      for (int s = 0; s < S; ++s) {
        cache[s][p] = load_vec_or<In, VEC>(k < n_packs, [&] { return args.in[s] + row_offset + k * VEC; }, Op::pad(s));
      }
    }
    Acc acc = Op::identity();
    if constexpr (kPeel) {
      C edge[S];
      load_edge(args, row * args.n, row_edges<VEC>(args, row), tid, edge);
      acc = edge_partial(op, edge);
    }
    // Two chains: with the default count the float16 instance spilled under the 32-register cap (ptxas).
    acc = op.template accumulate<2>(acc, [&](auto&& fn) {
#pragma unroll
      for (int p = 0; p < PREG; ++p) visit_elements<C>(cache, p, fn);
    });
    acc = block_all_reduce(acc, scratch, [](Acc a, Acc b) { return Op::merge(a, b); });
    const typename Op::Row row_consts = op.finalize(acc);
    if constexpr (kPeel) {
      const RowEdges<VEC> edges = row_edges<VEC>(args, row);
      C edge[S];
      load_edge(args, row * args.n, edges, tid, edge);
      store_edge(args, row * args.n, edges, tid, row_consts, edge);
    }
    with_fixed_mode(op, [&](const auto& fixed) {  // one formula per element, not both
#pragma unroll
      for (int p = 0; p < PREG; ++p) {
        const int k = p * threads + tid;
        if (k < n_packs) {
          Pack<Out, VEC> result;
          visit_elements<C>(cache, p, [&](const C* v, int j) { result.v[j] = fixed.apply(row_consts, v); });
          store_vec<Out, VEC>(args.out + row_offset + k * VEC, result);
        }
      }
    });
  }
}

// kPeel: rows read as an aligned body of packs plus single edge elements (RowEdges, plan.peel); the group's
// first CTA holds the edges, one per thread. Not with kPrefetch or kStreamRest (never planned). The lean
// backward peeled runs at kLeanPeeledBackwardMinCtas CTAs per SM (40 registers, 0-8 bytes of spill): at the lean
// forms' 32 registers it spilled 52-84 bytes (16-bit) even with its edges read twice instead of kept (ptxas, nvcc
// 13.0); at 3 CTAs per SM it runs 1-18% faster than the plain peeled instance (H100, session 19 call 8).
constexpr int kLeanPeeledBackwardMinCtas = 3;
template <typename Op, int VEC, int PREG, bool kPrefetch = false, bool kStreamRest = false, bool kLean = false,
          bool kPeel = false>
__global__ void __launch_bounds__(kLean ? lean_cta_threads(PREG) : kBlockKernelMaxThreads,
                                  kLean ? (kPeel && Op::kStreams == 2 ? kLeanPeeledBackwardMinCtas : kLeanMinCtas) : 1)
    softmax_block_kernel(RowArgs<Op> args, int smem_packs, BlockOptions options) {
  using In = typename Op::In;
  using Out = typename Op::Out;
  using C = typename Op::C;
  using Acc = typename Op::Acc;
  using PackIn = Pack<In, VEC>;
  constexpr int S = Op::kStreams;
  // Widening results in lane pairs (store_pack_where), but not from the largest register bucket: there the pairs
  // spilled 64-80 bytes (ptxas, nvcc 13.0) and vocabulary rows ran 6-14% slower than with plain stores (H100,
  // session 27 calls 2-4); the dispatcher caches widening groups in 4 packs (kWideningGroupRegPacks) instead.
  // Peeled widening rows have that bucket unless spread over fewer packs (peel_few_rows), and gained: 2048 x 50257
  // -9 / -24% (fp16 / bf16, call 4).
  constexpr bool kPairStores = kLanePairStores<Out, VEC> && (kPeel || PREG < kMaxRegPacks<Op>);
  static_assert(PREG <= kMaxRegPacks<Op>, "register cache above the 64-register budget of 1024 threads");
  static_assert(!(kPeel && (kPrefetch || kStreamRest)), "peeled rows: the plain and lean instances only");
  if constexpr (kLean) {
    if constexpr (S == 1) {
      exp_once_rows<Op, VEC, PREG, kPeel>(args);
    } else {
      lean_backward_rows<Op, VEC, PREG, kPeel>(args);
    }
    return;
  }

  extern __shared__ __align__(16) unsigned char dynamic_smem[];
  PackIn* const spill = reinterpret_cast<PackIn*>(dynamic_smem);  // [S][smem_packs][T]
  __shared__ Acc partials[2][kWarpSize];
  __shared__ Acc row_result[2];  // the merged cluster / grid-group result, broadcast to the CTA

  const Op op = args.op;
  const int threads = blockDim.x;
  const int tid = threadIdx.x;
  const bool in_grid_group = options.grid_group_size > 0;
  const ClusterPosition cluster = in_grid_group
                                      ? ClusterPosition{static_cast<unsigned>(options.grid_group_size),
                                                        blockIdx.x % static_cast<unsigned>(options.grid_group_size)}
                                      : cluster_position();
  Acc* const grid_partials = static_cast<Acc*>(options.partials);
  const int64_t n_packs = args.n / VEC;
  const int64_t chunk = (n_packs + cluster.size - 1) / cluster.size;
  const int64_t begin = min(n_packs, static_cast<int64_t>(cluster.rank) * chunk);
  const int64_t end = min(n_packs, begin + chunk);
  const int64_t clusters_in_grid = gridDim.x / cluster.size;
  // Packs [begin, cached_end) of the chunk are cached on chip; kStreamRest streams [cached_end, end).
  const int64_t cached_end = min(end, begin + static_cast<int64_t>(threads) * (PREG + smem_packs));
  if (!kStreamRest && cached_end < end) __trap();  // dispatcher bug guard
  static_assert(!(kPrefetch && kStreamRest), "a prefetching CTA caches whole rows");
  // Every CTA of a grid group must pass the grid barrier exactly once: one row per group.
  if (in_grid_group && clusters_in_grid != args.rows) __trap();
  auto spill_slot = [&](int s, int p) -> PackIn& { return spill[(static_cast<int64_t>(s) * smem_packs + p) * threads + tid]; };
  // The prefetch buffer [S][PREG][T] uses the same dynamic shared memory (smem_packs == 0 then).
  constexpr bool kAsyncFill = sizeof(PackIn) == 16;
  static_assert(!kPrefetch || kAsyncFill, "the prefetch copies 16-byte packs");
  if (kPrefetch && smem_packs != 0) __trap();  // dispatcher bug guard: the buffer is the whole dynamic smem
  auto staged_pack = [&](int s, int p) -> PackIn& { return spill[(s * PREG + p) * threads + tid]; };
  auto prefetch_row = [&](int64_t row) {
#pragma unroll
    for (int p = 0; p < PREG; ++p) {
      const int64_t k = begin + static_cast<int64_t>(p) * threads + tid;
#pragma unroll
      for (int s = 0; s < S; ++s) {
        if (k < cached_end) {
          copy_async_16(&staged_pack(s, p), args.in[s] + row * args.n + k * VEC);
        } else {
          staged_pack(s, p) = filled_pack<In, VEC>(Op::pad(s));
        }
      }
    }
  };
  bool row_prefetched = false;  // this row is in the prefetch buffer

  // The prefetching and the streaming instances never run in a cluster (the dispatcher plans them with one CTA
  // per row group; the grid group is not a cluster): the cluster exchange is compiled out of them, which keeps
  // its barrier state from costing their register allocation (the bfloat16 prefetching instance spilled 12
  // bytes with it, none without).
  constexpr bool kClusterCapable = !kPrefetch && !kStreamRest;
  if (!kClusterCapable && !in_grid_group && cluster.size > 1) __trap();  // dispatcher bug guard
  const bool cluster_exchange = kClusterCapable && !in_grid_group && cluster.size > 1;
  __shared__ ClusterInbox<Acc> inbox;
  if (cluster_exchange) {
    if (cluster.size > kMaxClusterCtas) __trap();  // dispatcher bug guard: the inbox's slots
    if (tid == 0) inbox.init();
    cluster_arrive_relaxed();  // waited for before the first send (every peer's mbarriers initialised)
  }
  // inboxes_ready and parity could be derived from exchanges (== 0, & 1); kept apart because ptxas, at the
  // 64-register cap, spilled 4-36 bytes more in the float32 instances with the derived forms (session 16).
  bool inboxes_ready = false;  // this CTA has waited for its peers' inbox set-up
  int parity = 0;              // the row's: picks its shared buffers and inbox slots
  unsigned exchanges = 0;      // rows exchanged: each parity's inbox mbarrier is in phase (exchanges / 2) % 2
  for (int64_t row = blockIdx.x / cluster.size; row < args.rows; row += clusters_in_grid, parity ^= 1) {
    int64_t row_offset = row * args.n;  // of the packs: the row's start, or its body's (kPeel)
    // This row's cached packs of the chunk, [chunk_begin, chunk_cached_end): kPeel rows' bodies differ in length
    // by a pack, so their chunks are set per row; the row's edges, and the one this thread holds (the group's
    // first CTA, a thread per edge).
    int64_t chunk_begin = begin;
    int64_t chunk_cached_end = cached_end;
    [[maybe_unused]] RowEdges<VEC> edges{};
    [[maybe_unused]] C edge[S];
    if constexpr (kPeel) {
      edges = row_edges<VEC>(args, row);
      const int64_t row_chunk = (edges.packs + cluster.size - 1) / cluster.size;
      chunk_begin = min(edges.packs, static_cast<int64_t>(cluster.rank) * row_chunk);
      const int64_t chunk_end = min(edges.packs, chunk_begin + row_chunk);
      chunk_cached_end = min(chunk_end, chunk_begin + static_cast<int64_t>(threads) * (PREG + smem_packs));
      if (chunk_cached_end < chunk_end) __trap();  // dispatcher bug guard
      load_edge(args, row_offset, edges, cluster.rank == 0 ? tid : -1, edge);
      row_offset += edges.head;
    }

    // The register packs, in flight before anything uses them. Where the chunk fills every thread's packs (CTA-
    // uniform) they load with no bound to check and no -inf to merge: the merge of the padding into the loaded
    // registers (a select, or PRMT merges of 16-bit halves) came right after the first loads and held back the
    // later ones (sm_90 SASS; the same in fused_topk's rows kernel, where lifting it took 65536 x 256 k8 float32
    // from 58.8 to 43.8 us, H100, session 31).
    // float32 in and out only, and not peeled rows: H100, session 31 call 5 (A/B in turns, softmax / softmax_backward,
    // us): float32 4x262144 11.9 -> 10.8, 4x65536 -6%, 3x100003 -6%, 64x151936 -3%, 4x1048576 -3%, 2048x131072 -2%,
    // backward 64x151936 -4%, 4x65536..4x114688 -6..-11%; but 16-bit 64x151936 +5%, 2048x131072 bf16 +4.5% and
    // float32 64x151935 (peeled) +10%, where ptxas spilled 16-32 bytes more (the 16-bit instances stay as they were).
    constexpr bool kRegistersFirst =
        !kStreamRest && !kPrefetch && !kPeel && std::is_same_v<In, float> && std::is_same_v<typename Op::Out, float>;
    PackIn cache[S][PREG];
    const auto load_register_packs = [&] {
      if (kRegistersFirst && chunk_begin + static_cast<int64_t>(PREG) * threads <= chunk_cached_end) {
#pragma unroll
        for (int p = 0; p < PREG; ++p) {
          const int64_t k = chunk_begin + static_cast<int64_t>(p) * threads + tid;
#pragma unroll
          for (int s = 0; s < S; ++s) cache[s][p] = load_vec<In, VEC>(args.in[s] + row_offset + k * VEC);
        }
        return;
      }
#pragma unroll
      for (int p = 0; p < PREG; ++p) {
        const int64_t k = chunk_begin + static_cast<int64_t>(p) * threads + tid;
#pragma unroll
        for (int s = 0; s < S; ++s) {
          cache[s][p] = k < chunk_cached_end ? load_vec<In, VEC>(args.in[s] + row_offset + k * VEC)
                                       : filled_pack<In, VEC>(Op::pad(s));
        }
      }
    };
    // Before the shared-memory copies below where nothing else comes between: the wait for those copies (sm_90
    // SASS: DEPBAR) was placed ahead of the register loads that followed them. The streaming instances fold the
    // rest of the chunk first (the registers are not live yet); the prefetching ones (many rows, no shared-memory
    // packs: nothing to reorder) read a prefetched row from shared memory.
    if constexpr (kRegistersFirst) load_register_packs();

    // Shared-memory packs, as asynchronous copies when they are 16 bytes (no registers held while they fly), in
    // flight together with the register packs' loads (issued above, or below in the other instances). Each thread
    // reads back only its own slots: no barrier, just a wait.
    for (int p = 0; p < smem_packs; ++p) {
      const int64_t k = chunk_begin + static_cast<int64_t>(PREG + p) * threads + tid;
#pragma unroll
      for (int s = 0; s < S; ++s) {
        if (k >= chunk_cached_end) {
          spill_slot(s, p) = filled_pack<In, VEC>(Op::pad(s));
        } else if constexpr (kAsyncFill) {
          copy_async_16(&spill_slot(s, p), args.in[s] + row_offset + k * VEC);
        } else {
          spill_slot(s, p) = load_vec<In, VEC>(args.in[s] + row_offset + k * VEC);
        }
      }
    }
    // The rest of an over-long chunk, folded while the shared-memory packs above are in flight and before
    // the register packs load (their registers are not live yet).
    const In* row_in[S];
    row_pointers(args, row, row_in);
    Acc streamed = Op::identity();
    // kStreamUnroll, not the folding kernels' 2x: the 64-register budget of this kernel spilled with 2x.
    if constexpr (kStreamRest) {
      streamed = fold_packs<Op, VEC, kStreamUnroll<Op, VEC>>(op, row_in, cached_end, end, tid, threads);
    }

    if (kPrefetch && row_prefetched) {
      wait_async_copies();  // only this thread's prefetch of this row is outstanding
#pragma unroll
      for (int p = 0; p < PREG; ++p) {
#pragma unroll
        for (int s = 0; s < S; ++s) cache[s][p] = load_vec<In, VEC>(staged_pack(s, p).v);
      }
    } else if constexpr (!kRegistersFirst) {
      load_register_packs();
    }
    if constexpr (kPrefetch) {
      // The slots were just read into registers (same thread, program order); DRAM now serves the next
      // row while this one is reduced and written, instead of idling through the math of every CTA.
      const int64_t next = row + clusters_in_grid;
      row_prefetched = next < args.rows;
      if (row_prefetched) prefetch_row(next);
    }

    // A shared-memory slot is read as whole 16-byte words into registers first: element-wise reads of a
    // bfloat16 pack compiled to 8 LDS.U16 per visit (3 visits per element) instead of one LDS.128.
    struct StagedSlot {
      PackIn stream[S];
    };
    auto staged_slot = [&](int p) {
      StagedSlot staged;
#pragma unroll
      for (int s = 0; s < S; ++s) staged.stream[s] = load_vec<In, VEC>(spill_slot(s, p).v);
      return staged;
    };
    auto visit = [&](auto&& fn) {
      auto visit_pack = [&](auto&& pack_of_stream) {
#pragma unroll
        for (int j = 0; j < VEC; ++j) {
          C v[S];
#pragma unroll
          for (int s = 0; s < S; ++s) v[s] = cached_element<C>(pack_of_stream(s), j);
          fn(v, j);
        }
      };
#pragma unroll
      for (int p = 0; p < PREG; ++p) visit_pack([&](int s) -> const PackIn& { return cache[s][p]; });
      // The shared-memory packs' copies are waited for here, after the register packs are in use, not right after
      // the loads: there ptxas placed the wait (sm_90 SASS: DEPBAR) ahead of the 16-bit instances' register loads,
      // which then waited for the copies before they were issued. The first visit waits; later ones find nothing
      // outstanding (the prefetching instances have no shared-memory packs).
      if constexpr (kAsyncFill) {
        if (smem_packs > 0) wait_async_copies();
      }
      for (int p = 0; p < smem_packs; ++p) {
        const auto staged = staged_slot(p);
        visit_pack([&](int s) -> const PackIn& { return staged.stream[s]; });
      }
    };
    // One chain for 8 cached packs of half: with more, ptxas spilled (20 bytes) under the 64-register cap,
    // and on H200 fp16 rows of 4096-8192 ran 5-8% slower than with one chain.
    constexpr int kChains = (std::is_same_v<In, __half> && PREG == 8) ? 1 : kIlp;
    // Softmax with 16-bit output, whole chunk in at most 16 floats per thread (kExpLocal; 32 spilled 54-146
    // bytes under the 64-register cap, nvcc 13.0 sm_90): each exponential is
    // taken ONCE, relative to the thread's own max m_t, and kept: exp(x - M) / S = exp(x - m_t) * (exp(m_t - M)
    // / S) with the row's (M, S) from the same single exchange. The online form takes every exponential twice,
    // and in a group of CTAs that exchange once, every SM computes at the same time, with no other CTA's memory
    // traffic to hide it: Nsight Compute (H200, 2026-11-22) had the exponential pipe (XU) 32-42% busy over
    // whole few-rows launches (8 x 262144, 64 x 151936, 4 x 8388608 fp16). The two extra roundings (of
    // exp(m_t - M) / S and of the product) are ~1e-7 relative: far below a 16-bit result's ulp, and float
    // results keep torch's association. A/B (H200, 2026-11-22, two runs each, xCopy): fp16 4 x 16384 0.65 ->
    // 0.78, 4 x 32768 0.63 -> 0.76, 4 x 262144 0.60 -> 0.66, 128 x 2048 0.77 -> 0.86, others within noise;
    // bf16 within noise (-0.04..+0.03) except 128 x 2048 0.90 -> 0.77 (*session6-ab3-*.json).
    constexpr bool kExpLocal = Op::kStreams == 1 && std::is_same_v<C, float> && sizeof(Out) == 2 && VEC > 1 &&
                               PREG * VEC <= 16 && !kPrefetch && !kStreamRest && !kPeel;
    const bool exp_local = kExpLocal && !op.log && smem_packs == 0;
    float local_exp[kExpLocal ? PREG : 1][VEC];
    float local_max = 0.0f;
    Acc acc = Op::identity();
    if constexpr (kExpLocal) {
      if (exp_local) {
        local_max = cached_max(cache[0]);
        // A thread of -inf only (or padding): exponentials relative to 0 are exact zeros (relative to -inf,
        // NaN), and (-inf, 0) is the identity. NaN / +inf make the sum NaN, as in accumulate.
        const float shift = local_max == negative_infinity<float>() ? 0.0f : local_max;
        float sums[kIlp] = {};
#pragma unroll
        for (int p = 0; p < PREG; ++p) {
#pragma unroll
          for (int j = 0; j < VEC; ++j) {
            local_exp[p][j] = ExpMath<float>::exp_from(cached_element<float>(cache[0][p], j), shift);
            sums[j % kIlp] += local_exp[p][j];
          }
        }
        acc = Acc{local_max, reduce_ilp(sums, [](float a, float b) { return a + b; })};
      }
    }
    if (!exp_local) acc = op.template accumulate<kChains>(Op::identity(), visit);
    if constexpr (kStreamRest) acc = Op::merge(acc, streamed);
    if constexpr (kPeel) acc = Op::merge(acc, edge_partial(op, edge));
    acc = block_all_reduce<Op>(acc, partials, parity);

    if (in_grid_group) {
      const Acc* const row_partials = grid_partials + row * cluster.size;
      if (tid == 0) grid_partials[row * cluster.size + cluster.rank] = acc;
      grid_barrier();
      if (tid < kWarpSize) {
        Acc peer = Op::identity();
        for (unsigned i = tid; i < cluster.size; i += kWarpSize) peer = Op::merge(peer, load_from_l2(row_partials + i));
        peer = warp_all_reduce<Op>(peer, kWarpSize);
        if (tid == 0) row_result[parity] = peer;
      }
      __syncthreads();
      acc = row_result[parity];
    } else if (cluster_exchange) {
      if (!inboxes_ready) {
        cluster_wait();
        inboxes_ready = true;
      }
      // acc is the CTA's reduced partial in every thread: lane i of warp 0 sends it to peer i.
      if (tid < kWarpSize) {
        if (tid < static_cast<int>(cluster.size)) inbox.send(acc, parity, cluster.rank, tid);
        if (tid == 0) inbox.expect(parity, cluster.size);
        inbox.wait(parity, (exchanges >> 1) & 1u);
        Acc peer = tid < static_cast<int>(cluster.size) ? inbox.slot[parity][tid] : Op::identity();
        peer = warp_all_reduce<Op>(peer, kWarpSize);  // merging the identity leaves a value unchanged
        if (tid == 0) row_result[parity] = peer;
      }
      ++exchanges;
      __syncthreads();
      acc = row_result[parity];
    }
    const typename Op::Row row_consts = op.finalize(acc);
    if constexpr (kPeel) store_edge(args, row * args.n, edges, cluster.rank == 0 ? tid : -1, row_consts, edge);

    if constexpr (kExpLocal) {
      if (exp_local) {
        // exp(m_t - M) is 0 for a thread of -inf only (its zeros stay zeros), NaN for an all -inf row (torch: NaN).
        const float scale = ExpMath<float>::exp_from(local_max, row_consts.max) * row_consts.inv_sum;
#pragma unroll
        for (int p = 0; p < PREG; ++p) {
          const int64_t k = chunk_begin + static_cast<int64_t>(p) * threads + tid;
          if (k < chunk_cached_end) {  // 16-bit results: never lane pairs
            Pack<Out, VEC> result;
#pragma unroll
            for (int j = 0; j < VEC; ++j) result.v[j] = convert<Out>(local_exp[p][j] * scale);
            store_vec<Out, VEC>(args.out + row_offset + k * VEC, result);
          }
        }
        continue;
      }
    }

    auto write_pack = [&](int64_t k, bool cached, auto&& pack_of_stream) {
      const auto address = [&] { return args.out + row_offset + k * VEC; };
      store_pack_where<Out, VEC, kPairStores>(cached, address, [&](auto&& arrange) {
        Pack<Out, VEC> result;
        if constexpr (kPairStores) {  // a forward: one stream, its 16-bit inputs swapped
          static_assert(S == 1, "lane pairs for float32 results of 16-bit inputs: forwards only");
          const PackIn in[1][1] = {{arrange(pack_of_stream(0))}};
          visit_elements<C>(in, 0, [&](const C* v, int j) { result.v[j] = op.apply(row_consts, v); });
        } else {
#pragma unroll
          for (int j = 0; j < VEC; ++j) {
            C v[S];
#pragma unroll
            for (int s = 0; s < S; ++s) v[s] = cached_element<C>(pack_of_stream(s), j);
            result.v[j] = op.apply(row_consts, v);
          }
        }
        return result;
      });
    };
    // The streamed rest first: what is left of it in L2 is evicted by every line the writes allocate.
    if constexpr (kStreamRest) write_packs<Op, VEC>(op, row_consts, row_in, args.out + row_offset, cached_end, end, tid, threads);
    // Lane pairs (kPairStores, store_pack_where): every lane makes a pack, past the chunk from its padding, never
    // stored.
#pragma unroll
    for (int p = 0; p < PREG; ++p) {
      const int64_t k = chunk_begin + static_cast<int64_t>(p) * threads + tid;
      const bool cached = k < chunk_cached_end;
      if (kPairStores || cached) write_pack(k, cached, [&](int s) -> const PackIn& { return cache[s][p]; });
    }
    for (int p = 0; p < smem_packs; ++p) {
      const int64_t k = chunk_begin + static_cast<int64_t>(PREG + p) * threads + tid;
      const bool cached = k < chunk_cached_end;
      if (kPairStores || cached) {
        const auto staged = staged_slot(p);
        write_pack(k, cached, [&](int s) -> const PackIn& { return staged.stream[s]; });
      }
    }
  }
}

}  // namespace softmax_ops::detail
