// fused_topk "block" (one CTA per row) and "split_row" (several CTAs per row, the last to finish merges)
// kernels, both built on the chunk producer of topk_chunk.cuh.
// block: the CTA sorts its k candidates (bitonic) and writes probabilities and indices.
// split_row: each CTA writes its chunk's k best (unordered, padded with "none") and (max, sum) to a
// workspace and takes a ticket of its row; the CTA that takes the row's last ticket streams the other
// chunks' candidates through its buffer (the result is the exact top k of a total order, so it does not
// depend on which CTA merges), merges the (max, sum) in chunk order (deterministic), sorts and writes.
#include "topk_chunk.cuh"
#include "topk_dependent_launch.cuh"
#include "topk_launch.h"

namespace softmax_ops::topk {
namespace {

// The edges of row `row` of a peeled launch (plan.peel, with vector loads over each row's body).
template <typename TIn>
__device__ __forceinline__ RowEdges<detail::kVec16<TIn>> peeled_row_edges(const TIn* x, int64_t row, int64_t n) {
  const int64_t start = static_cast<int64_t>(reinterpret_cast<uintptr_t>(x) / sizeof(TIn)) + row * n;
  return row_edges_at<detail::kVec16<TIn>>(start, n);
}

// The tile and register budget of block / split_row instances: long tiles (TopkPlan::long_tiles), with the next one
// in flight, hold twice the registers; the dispatcher plans them where there are at most 2 CTAs per SM anyway (a
// forced split_row may launch more: slower, not wrong).
template <bool kLongTiles>
constexpr int kBlockFamilyTile = kLongTiles ? kLongTileElems : kTileElems;
template <typename TIn, bool kLongTiles>
constexpr int kBlockFamilyMinCtasPerSm = kLongTiles ? 2 : kBlockMinCtasPerSm<TIn>;
template <typename TIn, bool kVectorLoads, bool kLongTiles>
struct BlockFamilyChunk {
  static_assert(!kLongTiles || (kVectorLoads && sizeof(TIn) == 2), "long tiles: 16-bit rows read in vectors");
  using type = ChunkTopk<TIn, kVectorLoads, kBlockFamilyTile<kLongTiles>>;
};

// kPeel (with kVectorLoads): each row's body in vector tiles, its edges one per thread (topk_chunk.cuh).
template <typename TIn, typename TOut, bool kVectorLoads, bool kPeel = false, bool kLongTiles = false>
__global__ void __launch_bounds__(kBlockThreads, (kBlockFamilyMinCtasPerSm<TIn, kLongTiles>))
    topk_block_kernel(const TIn* __restrict__ x, TOut* __restrict__ values, int64_t* __restrict__ indices, int64_t n,
                      int k, int cap, bool renormalize) {
  using Chunk = typename BlockFamilyChunk<TIn, kVectorLoads, kLongTiles>::type;
  using C = typename Chunk::C;
  using Ops = typename Chunk::Ops;
  static_assert(sizeof(BlockScratch<C>) <= kBlockStaticSmem, "static shared memory over budget");
  extern __shared__ __align__(16) unsigned char smem_raw[];
  auto* buf = reinterpret_cast<typename Ops::Type*>(smem_raw);
  __shared__ BlockScratch<C> scratch;

  const int64_t row = blockIdx.x;
  RowStats<C> stats;
  typename Ops::Type kth = Ops::none();
  // Up to one candidate per thread are sorted outright (write_sorted_topk's rank sort since session 14): less
  // than a radix select down to k first (~3 barriers per digit). H100, session 13 (*session13-c11-*), with
  // the register network then: 2048 x 8192 k16 -7..-18%, 4096 x 4096 k32 -12..-25%.
  int count;
  if constexpr (kPeel) {
    const auto edges = peeled_row_edges(x, row, n);
    const int body_end = edges.head + static_cast<int>(edges.packs) * Chunk::V;
    count = Chunk::template run<true>(x + row * n, edges.head, body_end, k, buf, cap, scratch.select, stats, &kth,
                                      kBlockThreads, edge_value(x + row * n, edges, true));
  } else {
    count = Chunk::run(x + row * n, 0, static_cast<int>(n), k, buf, cap, scratch.select, stats, &kth,
                       kBlockThreads);
  }
  stats = block_merge_stats(stats, scratch.stats);
  write_sorted_topk<Ops>(buf, count, k, stats, renormalize, values + row * k, indices + row * k, scratch.sums);
}

// Where split_row's chunk results live: per (row, chunk) k candidates and a (max, sum); per row a ticket
// (zeroed before the launch) counting the chunks that have published.
template <typename C>
struct SplitWorkspace {
  typename CandFor<C>::Type* cand;  // [rows][splits][k]
  RowStats<C>* stats;               // [rows][splits]
  unsigned* tickets;                // [rows]
};

// The merging CTA: streams the other chunks' candidates (own chunk `own` is already in buf[0, count)) through
// the buffer, keeping those at or above `threshold` (a lower bound of the row's k-th best: the own chunk's
// k-th, or none), compacting when the next step could overflow. Returns the count of the row's k best.
template <typename Ops, bool kSideList>
__device__ int merge_chunk_candidates(const typename Ops::Type* row_cand, int splits, int own, int k, int cap,
                                      typename Ops::Type threshold, typename Ops::Type* buf, int count,
                                      SelectScratch& s) {
  using Cand = typename Ops::Type;
  constexpr int kPerThread = kMergeChunk / kBlockThreads;
  static_assert(kPerThread * kBlockThreads == kMergeChunk && kPerThread <= 32, "one mask bit per candidate");
  const int64_t total = static_cast<int64_t>(splits) * k;
  const int64_t own_lo = static_cast<int64_t>(own) * k;
  const int64_t own_hi = own_lo + k;
#pragma unroll 1
  for (int64_t base = 0; base < total; base += kMergeChunk) {
    // Invariant: count <= cap - kMergeChunk (this step appends at most kMergeChunk).
    Cand c[kPerThread];
    uint32_t take = 0;
#pragma unroll
    for (int j = 0; j < kPerThread; ++j) {
      const int64_t i = base + j * kBlockThreads + threadIdx.x;
      const bool mine = i >= own_lo && i < own_hi;
      c[j] = i < total && !mine ? Ops::load_cg(row_cand + i) : Ops::none();
      if (Ops::better(c[j], Ops::none()) && Ops::at_least(c[j], threshold)) take |= 1u << j;
    }
    append_selected<Ops>(buf, &s.count, take, [&](int b) { return pick(c, b); });
    __syncthreads();
    count = s.count;
    if (count > cap - kMergeChunk) {
      threshold = block_radix_threshold<Ops, kSideList>(buf, count, k, s);
      count = block_compact<Ops>(buf, count, threshold, s);
    } else {
      __syncthreads();  // every thread has read s.count before the next step appends
    }
  }
  if (count > k) {
    const Cand kth = block_radix_threshold<Ops, kSideList>(buf, count, k, s);
    count = block_compact<Ops>(buf, count, kth, s);
  }
  return count;
}

// One CTA per (row, chunk): the chunk's k best (padded with none) and its (max, sum) into the workspace;
// the CTA that finishes its row last merges the row and writes it (one launch, no second kernel).
// kPeel: chunk p covers [head + p * chunk, head + (p + 1) * chunk) of the row's body, the last one to the body's
// end (at most 2 (V - 1) more, see peeled_split_count), and chunk 0 also holds the edges.
template <typename TIn, typename TOut, bool kVectorLoads, bool kPeel = false, bool kLongTiles = false>
__global__ void __launch_bounds__(kBlockThreads, (kBlockFamilyMinCtasPerSm<TIn, kLongTiles>))
    topk_split_row_kernel(const TIn* __restrict__ x, TOut* __restrict__ values, int64_t* __restrict__ indices,
                          int64_t n, int k, int cap, int64_t chunk, int splits, bool renormalize,
                          SplitWorkspace<compute_t<TIn>> ws) {
  using Chunk = typename BlockFamilyChunk<TIn, kVectorLoads, kLongTiles>::type;
  using C = typename Chunk::C;
  using Ops = typename Chunk::Ops;
  using Cand = typename Ops::Type;
  static_assert(sizeof(BlockScratch<C>) <= kBlockStaticSmem, "static shared memory over budget");
  extern __shared__ __align__(16) unsigned char smem_raw[];
  auto* buf = reinterpret_cast<Cand*>(smem_raw);
  __shared__ BlockScratch<C> scratch;

  const int64_t row = blockIdx.x / splits;
  const int part = static_cast<int>(blockIdx.x % splits);
  RowStats<C> stats;
  Cand kth = Ops::none();
  int count;
  if constexpr (kPeel) {
    const auto edges = peeled_row_edges(x, row, n);
    const int64_t body_end = edges.head + edges.packs * Chunk::V;
    const int64_t lo = edges.head + part * chunk;
    const int64_t hi = part == splits - 1 ? body_end : lo + chunk;
    count = Chunk::template run<true>(x + row * n, static_cast<int>(lo), static_cast<int>(hi), k, buf, cap,
                                      scratch.select, stats, &kth, kBlockThreads,
                                      edge_value(x + row * n, edges, part == 0));
  } else {
    const int64_t lo = part * chunk;
    const int64_t hi = min(n, lo + chunk);
    count = Chunk::run(x + row * n, static_cast<int>(lo), static_cast<int>(hi), k, buf, cap, scratch.select, stats,
                       &kth, kBlockThreads);
  }
  // Up to one candidate per thread is left unselected (as in the block kernel; more were selected down to k):
  // sorted outright, the chunk's k best first. Its k-th then bounds the row's k-th best from below.
  if (count > k) {
    block_rank_sort_desc<Ops>(buf, count);
    kth = buf[k - 1];
    count = k;
  }
  stats = block_merge_stats(stats, scratch.stats);
  Cand* row_cand = ws.cand + row * splits * k;
  Cand* out = row_cand + static_cast<int64_t>(part) * k;
  for (int r = threadIdx.x; r < k; r += blockDim.x) out[r] = r < count ? buf[r] : Ops::none();
  if (threadIdx.x == 0) ws.stats[row * splits + part] = stats;
  wait_for_prerequisite_grid();  // the zero kernel's tickets
  if (!took_last_ticket(ws.tickets + row, splits, &scratch.merges)) return;

  stats = merged_row_stats(ws.stats + row * splits, splits, scratch.stats);
  // A chunk that kept k candidates bounds the row's k-th best from below: k distinct values reach its kth.
  count = merge_chunk_candidates<Ops, Chunk::kSideList>(row_cand, splits, part, k, cap, kth, buf, count,
                                                        scratch.select);
  write_sorted_topk<Ops>(buf, count, k, stats, renormalize, values + row * k, indices + row * k, scratch.sums);
}

// kLongTiles: the long-tile instances (the plan's long_tiles, where the instance reads vectors).
template <typename TIn, typename TOut, bool kVectorLoads, bool kPeel, bool kLongTiles = false>
cudaError_t launch_block_kernels(const TopkProblem& problem, const TopkPlan& plan, const TopkPointers& ptrs,
                                 cudaStream_t stream) {
  using C = compute_t<TIn>;
  using Cand = typename CandFor<C>::Type;
  const int k = static_cast<int>(problem.k);
  const int cap = static_cast<int>(candidate_capacity(problem.k, kBlockFamilyTile<kLongTiles>));
  const size_t smem = static_cast<size_t>(cap) * sizeof(Cand);
  const auto* x = static_cast<const TIn*>(ptrs.x);
  auto* values = static_cast<TOut*>(ptrs.values);
  if (plan.kernel == TopkKernel::kBlock) {
    const auto kernel = topk_block_kernel<TIn, TOut, kVectorLoads, kPeel, kLongTiles>;
    cudaError_t err = allow_dynamic_smem(kernel, smem);
    if (err != cudaSuccess) return err;
    kernel<<<static_cast<unsigned>(problem.rows), kBlockThreads, smem, stream>>>(x, values, ptrs.indices, problem.n, k,
                                                                                 cap, problem.renormalize);
    return cudaGetLastError();
  }
  const int64_t chunk = split_chunk_elems(problem.n, plan.splits);
  const int splits = static_cast<int>(kPeel ? peeled_split_count(problem.n, plan.splits, detail::kVec16<TIn>)
                                            : split_count(problem.n, plan.splits));
  const SplitWorkspaceLayout layout = split_workspace_layout(problem.in_dtype, problem.rows, problem.n, problem.k,
                                                             plan.splits);
  auto* base = static_cast<unsigned char*>(ptrs.workspace);
  SplitWorkspace<C> ws;
  ws.cand = reinterpret_cast<Cand*>(base + layout.cand_offset);
  ws.stats = reinterpret_cast<RowStats<C>*>(base + layout.stats_offset);
  ws.tickets = reinterpret_cast<unsigned*>(base + layout.tickets_offset);
  // The tickets start at 0 (the workspace comes uninitialised from the caching allocator): a zero kernel, and the
  // split_row kernel as its programmatic dependent (topk_dependent_launch.cuh), whose CTAs wait for it only
  // before they take a ticket.
  cudaError_t err = launch_zero_words(ws.tickets, problem.rows, stream);
  if (err != cudaSuccess) return err;
  const auto kernel = topk_split_row_kernel<TIn, TOut, kVectorLoads, kPeel, kLongTiles>;
  err = allow_dynamic_smem(kernel, smem);
  if (err != cudaSuccess) return err;
  bool programmatic = false;
  err = query_programmatic_launch(&programmatic);
  if (err != cudaSuccess) return err;
  return launch_dependent(programmatic, kernel, static_cast<unsigned>(problem.rows * splits), smem, stream, x, values,
                          ptrs.indices, problem.n, k, cap, chunk, splits, problem.renormalize, ws);
}

}  // namespace

cudaError_t launch_topk_block(const TopkProblem& problem, const TopkPlan& plan, const TopkPointers& ptrs,
                              cudaStream_t stream) {
  return dispatch_forward_instance(problem, plan, [&](auto in_tag, auto out_tag, auto vector_loads) {
    using TIn = typename decltype(in_tag)::type;
    using TOut = typename decltype(out_tag)::type;
    constexpr bool kVectorLoads = decltype(vector_loads)::value;
    // Peeled instances for the types the dispatcher peels (peel_min_n_for): float64 is not a speed target.
    constexpr bool kPeelable = !std::is_same_v<TIn, double>;
    // Long tiles for 16-bit rows read in vectors (aligned or peeled); scalar loads keep short ones.
    constexpr bool kLongTilesFit = sizeof(TIn) == 2;
    const bool peel = !kVectorLoads && plan.peel;
    const bool long_tiles = plan.long_tiles && (kVectorLoads || peel);
    if constexpr (kLongTilesFit) {
      if (long_tiles) {
        return peel ? launch_block_kernels<TIn, TOut, true, true, true>(problem, plan, ptrs, stream)
                    : launch_block_kernels<TIn, TOut, true, false, true>(problem, plan, ptrs, stream);
      }
    }
    if constexpr (!kVectorLoads && kPeelable) {
      if (peel) return launch_block_kernels<TIn, TOut, true, true>(problem, plan, ptrs, stream);
    }
    return launch_block_kernels<TIn, TOut, kVectorLoads, false>(problem, plan, ptrs, stream);
  });
}

}  // namespace softmax_ops::topk
