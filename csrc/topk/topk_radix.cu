// fused_topk "radix" path: any k <= N (k = N included), any number of rows, few huge rows included.
//
// Radix select over the rank of every element, the candidate word (order-preserving key, ~index): its
// digits are distinct per element, so the k-th best is a unique value and the k selected are exactly the
// elements at or above it: ties at the threshold key resolve to the lower indices, as the contract says.
//   init       per row: prefix 0, remaining k; histograms zeroed.
//   digit d    (one launch per 8-bit digit, most significant first, several CTAs per row): each CTA counts,
//              in shared memory, the next digit of the elements matching the row's prefix and adds its
//              counts to the row's global histogram; the first digit also folds the (max, sum) per chunk.
//   scan d     one warp per row picks the bucket holding the remaining-th best, extends the prefix and
//              marks the row done when that bucket holds exactly what is still needed (later digits then
//              return at once). The first scan merges the chunks' (max, sum) in chunk order.
//   gather     every element at or above the final prefix is appended to the row's [k] outputs (order
//              arbitrary: the caller sorts by key, ties by index, which makes the result deterministic).
//   finalize   probabilities of the sorted k (renormalised: divided by their sum) and indices.
// Integer atomics only: histograms and slot counters are exact, whatever the order.
#include "topk_device.cuh"
#include "topk_launch.h"

namespace softmax_ops::topk {
namespace {

template <typename C>
struct RadixRowState {
  typename CandFor<C>::Type prefix;
  int remaining;
  int done;
  int selected;
  RowStats<C> stats;
};
static_assert(sizeof(RadixRowState<float>) <= kRadixStateBytes && sizeof(RadixRowState<double>) <= kRadixStateBytes,
              "radix row state over its workspace slot");

template <typename C>
struct RadixWorkspace {
  RadixRowState<C>* states;  // [rows], kRadixStateBytes apart
  int* hist;                 // [rows][256]
  RowStats<C>* partial;      // [rows][chunks], 16 bytes apart
};

template <typename C>
RadixWorkspace<C> radix_workspace(void* base, int64_t rows) {
  auto* bytes = static_cast<unsigned char*>(base);
  static_assert(kRadixStateBytes % alignof(RadixRowState<C>) == 0, "state slots must stay aligned");
  RadixWorkspace<C> ws;
  ws.states = reinterpret_cast<RadixRowState<C>*>(bytes);
  ws.hist = reinterpret_cast<int*>(bytes + rows * kRadixStateBytes);
  ws.partial = reinterpret_cast<RowStats<C>*>(bytes + rows * (kRadixStateBytes + 256 * 4));
  return ws;
}

template <typename C>
__device__ __forceinline__ RadixRowState<C>& state_of(RadixRowState<C>* states, int64_t row) {
  return *reinterpret_cast<RadixRowState<C>*>(reinterpret_cast<unsigned char*>(states) + row * kRadixStateBytes);
}

template <typename C>
__device__ __forceinline__ RowStats<C>& partial_of(RowStats<C>* partial, int64_t slot) {
  return *reinterpret_cast<RowStats<C>*>(reinterpret_cast<unsigned char*>(partial) + slot * 16);
}

template <typename C>
__global__ void radix_init_kernel(RadixWorkspace<C> ws, int64_t rows, int k) {
  using Ops = CandFor<C>;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < rows * 256; i += stride) {
    ws.hist[i] = 0;
    if (i < rows) {
      RadixRowState<C>& st = state_of(ws.states, i);
      st.prefix = Ops::none();
      st.remaining = k;
      st.done = 0;
      st.selected = 0;
      st.stats = empty_stats<C>();
    }
  }
}

template <typename TIn>
__global__ void __launch_bounds__(kRadixThreads)
    radix_histogram_kernel(const TIn* __restrict__ x, int64_t n, int64_t chunk, int splits, int digit,
                           RadixWorkspace<compute_t<TIn>> ws) {
  using C = compute_t<TIn>;
  using Ops = CandFor<C>;
  __shared__ int counts[256];
  __shared__ RowStats<C> reduce_scratch[kRadixThreads / kWarpSize];
  const int64_t row = blockIdx.x / splits;
  const int64_t part = blockIdx.x % splits;
  const RadixRowState<C>& st = state_of(ws.states, row);
  if (st.done) return;  // the same answer for the whole CTA
  const typename Ops::Type prefix = st.prefix;
  const int64_t lo = part * chunk;
  const int64_t hi = min(n, lo + chunk);
  const TIn* xr = x + row * n;
  for (int i = threadIdx.x; i < 256; i += blockDim.x) counts[i] = 0;
  __syncthreads();
  RowStats<C> stats = empty_stats<C>();
  constexpr int kUnroll = 4;
  for (int64_t base = lo; base < hi; base += kUnroll * static_cast<int64_t>(blockDim.x)) {
    C v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t i = base + u * static_cast<int64_t>(blockDim.x) + threadIdx.x;
      v[u] = i < hi ? load_scalar(xr + i) : neg_inf<C>();
    }
    if (digit == 0) fold_stats(stats, v);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t i = base + u * static_cast<int64_t>(blockDim.x) + threadIdx.x;
      const auto c = Ops::make(OrderKey<C>::of(v[u]), static_cast<uint32_t>(i));
      if (i < hi && Ops::prefix_matches(c, prefix, digit)) atomicAdd(&counts[Ops::digit(c, digit)], 1);
    }
  }
  __syncthreads();
  for (int b = threadIdx.x; b < 256; b += blockDim.x) {
    if (counts[b] != 0) atomicAdd(&ws.hist[row * 256 + b], counts[b]);
  }
  if (digit == 0) {
    stats = block_merge_stats(stats, reduce_scratch);
    if (threadIdx.x == 0) partial_of(ws.partial, row * splits + part) = stats;
  }
}

// One warp per row.
template <typename C>
__global__ void radix_scan_kernel(RadixWorkspace<C> ws, int splits, int digit) {
  using Ops = CandFor<C>;
  const int64_t row = blockIdx.x;
  RadixRowState<C>& st = state_of(ws.states, row);
  if (st.done) return;
  int* hist = ws.hist + row * 256;
  const DigitChoice choice = warp_choose_digit(hist, st.remaining);
  __syncwarp();
  for (int b = threadIdx.x; b < 256; b += kWarpSize) hist[b] = 0;
  if (threadIdx.x == 0) {
    if (digit == 0) {
      RowStats<C> stats = empty_stats<C>();
      for (int part = 0; part < splits; ++part) stats = merge_stats(stats, partial_of(ws.partial, row * splits + part));
      st.stats = stats;
    }
    st.prefix = Ops::with_digit(st.prefix, digit, choice.digit);
    st.remaining = choice.remaining;
    st.done = (choice.done || digit == Ops::kDigits - 1) ? 1 : 0;
  }
}

template <typename TIn>
__global__ void __launch_bounds__(kRadixThreads)
    radix_gather_kernel(const TIn* __restrict__ x, int64_t n, int64_t chunk, int splits,
                        RadixWorkspace<compute_t<TIn>> ws, int64_t* __restrict__ sel_key,
                        int64_t* __restrict__ sel_idx, int64_t k) {
  using C = compute_t<TIn>;
  using Ops = CandFor<C>;
  const int64_t row = blockIdx.x / splits;
  const int64_t part = blockIdx.x % splits;
  RadixRowState<C>& st = state_of(ws.states, row);
  const typename Ops::Type prefix = st.prefix;
  const int64_t lo = part * chunk;
  const int64_t hi = min(n, lo + chunk);
  const TIn* xr = x + row * n;
  const int lane = threadIdx.x % kWarpSize;
  for (int64_t base = lo; base < hi; base += blockDim.x) {
    const int64_t i = base + threadIdx.x;
    const bool valid = i < hi;
    const typename OrderKey<C>::Key key = OrderKey<C>::of(valid ? load_scalar(xr + i) : neg_inf<C>());
    const bool take = valid && Ops::at_least(Ops::make(key, static_cast<uint32_t>(i)), prefix);
    const unsigned mask = __ballot_sync(kFullMask, take);
    if (mask == 0) continue;
    const int leader = __ffs(mask) - 1;
    int slot = 0;
    if (lane == leader) slot = atomicAdd(&st.selected, __popc(mask));
    slot = __shfl_sync(kFullMask, slot, leader) + __popc(mask & ((1u << lane) - 1u));
    if (take && slot < k) {
      sel_key[row * k + slot] = OrderKey<C>::sortable(key);
      sel_idx[row * k + slot] = i;
    }
  }
}

template <typename C, typename TOut>
__global__ void __launch_bounds__(kRadixThreads)
    radix_finalize_kernel(const int64_t* __restrict__ sorted_key, const int64_t* __restrict__ sorted_idx,
                          RadixWorkspace<C> ws, int64_t k, bool renormalize, TOut* __restrict__ values,
                          int64_t* __restrict__ indices) {
  __shared__ C reduce_scratch[kRadixThreads / kWarpSize];
  const int64_t row = blockIdx.x;
  const RowStats<C> stats = state_of(ws.states, row).stats;
  const C divisor = probability_divisor(stats);
  const int64_t* keys = sorted_key + row * k;
  auto probability = [&](int64_t r) {
    return exp_precise(OrderKey<C>::value(OrderKey<C>::from_sortable(keys[r])) - stats.max) / divisor;
  };
  C total = C(1);
  if (renormalize) {
    C local = C(0);
    for (int64_t r = threadIdx.x; r < k; r += blockDim.x) local += probability(r);
    total = detail::block_all_reduce(local, reduce_scratch, [](C a, C b) { return a + b; });
  }
  for (int64_t r = threadIdx.x; r < k; r += blockDim.x) {
    const C p = probability(r);
    values[row * k + r] = detail::convert<TOut>(renormalize ? p / total : p);
    indices[row * k + r] = sorted_idx[row * k + r];
  }
}

}  // namespace

cudaError_t launch_topk_radix_select(const TopkProblem& problem, const TopkPlan& plan, const TopkPointers& ptrs,
                                     int64_t* sel_key, int64_t* sel_idx, cudaStream_t stream) {
  return dispatch_dtype(problem.in_dtype, [&](auto tag) {
    using TIn = typename decltype(tag)::type;
    using C = compute_t<TIn>;
    const RadixWorkspace<C> ws = radix_workspace<C>(ptrs.workspace, problem.rows);
    const int64_t chunk = radix_chunk_elems(problem.n, plan.splits);
    const int splits = static_cast<int>(radix_count(problem.n, plan.splits));
    const auto* x = static_cast<const TIn*>(ptrs.x);
    const int64_t init_blocks = std::min<int64_t>(problem.rows, 4096);
    radix_init_kernel<C><<<static_cast<unsigned>(init_blocks), 256, 0, stream>>>(ws, problem.rows,
                                                                                 static_cast<int>(problem.k));
    cudaError_t err = cudaGetLastError();
    const unsigned blocks = static_cast<unsigned>(problem.rows * splits);
    for (int digit = 0; digit < CandFor<C>::kDigits && err == cudaSuccess; ++digit) {
      radix_histogram_kernel<TIn><<<blocks, kRadixThreads, 0, stream>>>(x, problem.n, chunk, splits, digit, ws);
      err = cudaGetLastError();
      if (err != cudaSuccess) break;
      radix_scan_kernel<C><<<static_cast<unsigned>(problem.rows), kWarpSize, 0, stream>>>(ws, splits, digit);
      err = cudaGetLastError();
    }
    if (err != cudaSuccess) return err;
    radix_gather_kernel<TIn><<<blocks, kRadixThreads, 0, stream>>>(x, problem.n, chunk, splits, ws, sel_key, sel_idx,
                                                                   problem.k);
    return cudaGetLastError();
  });
}

cudaError_t launch_topk_radix_finalize(const TopkProblem& problem, const TopkPlan& plan,
                                       const TopkPointers& ptrs, const int64_t* sorted_key,
                                       const int64_t* sorted_idx, cudaStream_t stream) {
  static_cast<void>(plan);
  return dispatch_in_out(problem.in_dtype, problem.out_dtype, [&](auto in_tag, auto out_tag) {
    using C = compute_t<typename decltype(in_tag)::type>;
    using TOut = typename decltype(out_tag)::type;
    const RadixWorkspace<C> ws = radix_workspace<C>(ptrs.workspace, problem.rows);
    radix_finalize_kernel<C, TOut><<<static_cast<unsigned>(problem.rows), kRadixThreads, 0, stream>>>(
        sorted_key, sorted_idx, ws, problem.k, problem.renormalize, static_cast<TOut*>(ptrs.values), ptrs.indices);
    return cudaGetLastError();
  });
}

}  // namespace softmax_ops::topk
