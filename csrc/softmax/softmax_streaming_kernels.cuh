// Kernels that stream a row instead of caching it, so they handle ANY n:
//   two_pass: one CTA per row; pass 1 folds the row into (max, sum) chunk by chunk, the CTA merges, pass 2
//             re-reads (from L2 when the row is still there) and writes.
//   split_row: two launches for few rows x huge n. Launch 1: CTA (row, c) folds part c of the row (every
//             parts-th block of blockDim.x packs, see split_part) into a partial, written to a workspace
//             [rows][parts]. Launch 2: CTA (row, c) merges the row's partials in a fixed order (bitwise
//             reproducible), re-reads part c and writes it.
//   strided:  the reduced dim is not last ([outer, n, inner > 1]): threads map to the inner index, so
//             every warp load is contiguous across inner, and loop over n; no transpose copy.
//
// Each thread keeps U packs in flight per step (kStreamUnroll writing, kFoldUnroll folding) and folds them with one exponential per
// element plus one per step (ForwardOp::accumulate), never a per-element online update. fold_packs and
// write_packs also serve the block kernel's streaming grid instance (softmax_block_kernel.cuh, kStreamRest).
#pragma once

#include "softmax_kernel_common.cuh"

namespace softmax_ops::detail {

// Packs in flight per thread and step of a pass that also writes: 4 x 16 bytes for one stream, 2 x 16 bytes
// each for the backward's two; single elements 8 (4 each). More gains nothing at 512 threads (>= 32 KB in
// flight per CTA) and costs registers. fp64 16-byte packs hold 2 elements: 4 of them as well. The block
// kernel's streaming instance folds with this count too (its 64-register budget spilled with kFoldUnroll).
template <typename Op, int VEC>
constexpr int kStreamUnroll = (VEC > 1 ? 4 : 8) / Op::kStreams;
// The folding pass has no stores to overlap with its loads, so it keeps twice as many in flight.
template <typename Op, int VEC>
constexpr int kFoldUnroll = 2 * kStreamUnroll<Op, VEC>;

// Folds the CTA's packs of one row below `end`: blocks of `threads` packs starting at begin, begin + stride,
// begin + 2 stride, ... (kInterleaved, split_row's parts: see split_part); else stride is threads, the
// contiguous range [begin, end) (a compile-time case: a run-time stride changed the other kernels' code).
// This thread takes pack tid of each block, U blocks per stream at a time.
template <typename Op, int VEC, int U = kFoldUnroll<Op, VEC>, bool kInterleaved = false>
__device__ __forceinline__ typename Op::Acc fold_packs(const Op& op, const typename Op::In* const* in, int64_t begin,
                                                     int64_t end, int tid, int threads, int stride = 0) {
  if constexpr (!kInterleaved) stride = threads;
  using In = typename Op::In;
  using C = typename Op::C;
  constexpr int S = Op::kStreams;
  // Steps are folded into a segment accumulator that is merged into the total every kSegmentSteps: the
  // running sum of a thread that walks millions of elements stays short (accuracy, see accumulate).
  constexpr int kSegmentSteps = 32;
  const int64_t step = static_cast<int64_t>(U) * stride;
  typename Op::Acc total = Op::identity();
  for (int64_t segment = begin + tid; segment < end; segment += kSegmentSteps * step) {
    typename Op::Acc acc = Op::identity();
    const int64_t segment_end = min(end, segment + kSegmentSteps * step);
    for (int64_t first = segment; first < segment_end; first += step) {
      Pack<In, VEC> packs[S][U];
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int64_t k = first + static_cast<int64_t>(u) * stride;
#pragma unroll
        for (int s = 0; s < S; ++s) {
          // log_softmax_backward reduces grad_output only: its output stream is not read here (the pass
          // then moves N bytes instead of 2N; the re-read in write_packs takes both).
          const bool load = k < end && op.reduces_stream(s);
          packs[s][u] = load ? load_vec<In, VEC>(in[s] + k * VEC) : filled_pack<In, VEC>(Op::pad(s));
        }
      }
      acc = op.accumulate(acc, [&](auto&& fn) {
#pragma unroll
        for (int u = 0; u < U; ++u) visit_elements<C>(packs, u, fn);
      });
    }
    total = Op::merge(total, acc);
  }
  return total;
}

// Second pass over the packs fold_packs folded (the same begin, end, stride, kInterleaved): re-read (last use:
// evict-first), normalise, write. It walks them from the END: the first pass ended there, so that part is
// the likeliest still in L2, and reading it first keeps the re-read of the beginning from evicting it
// (walking forwards, a row larger than its share of L2 misses on every re-read: the split_row apply pass
// read 3N bytes against copy's 2N).
template <typename Op, int VEC, bool kInterleaved = false>
__device__ __forceinline__ void write_packs(const Op& op, const typename Op::Row& row_consts,
                                            const typename Op::In* const* in, typename Op::Out* out,
                                            int64_t begin, int64_t end, int tid, int threads, int stride = 0) {
  using In = typename Op::In;
  using Out = typename Op::Out;
  using C = typename Op::C;
  constexpr int S = Op::kStreams;
  constexpr int U = kStreamUnroll<Op, VEC>;
  if constexpr (!kInterleaved) stride = threads;
  const int64_t step = static_cast<int64_t>(U) * stride;
  // Contiguous: the steps of the range, as before kInterleaved existed (the same code).
  const int64_t steps = kInterleaved ? ((end > begin ? (end - begin + stride - 1) / stride : 0) + U - 1) / U
                                     : (end - begin + step - 1) / step;
  for (int64_t step_index = steps - 1; step_index >= 0; --step_index) {
    const int64_t first = begin + step_index * step + tid;
    Pack<In, VEC> packs[S][U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t k = first + static_cast<int64_t>(u) * stride;
      if (k < end) {
#pragma unroll
        for (int s = 0; s < S; ++s) packs[s][u] = load_vec<In, VEC, /*kLastUse=*/true>(in[s] + k * VEC);
      } else if constexpr (kLanePairStores<Out, VEC>) {
#pragma unroll
        for (int s = 0; s < S; ++s) packs[s][u] = filled_pack<In, VEC>(Op::pad(s));  // made, never stored
      }
    }
    // Every thread of the CTA takes the same steps (the range is the CTA's), as lane pairs need.
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t k = first + static_cast<int64_t>(u) * stride;
      store_pack_where<Out, VEC>(k < end, [&] { return out + k * VEC; }, [&](auto&& arrange) {
        Pack<Out, VEC> result;
        visit_arranged_elements<C>(packs, u, arrange,
                                   [&](const C* v, int j) { result.v[j] = op.apply(row_consts, v); });
        return result;
      });
    }
  }
}

template <typename Op>
__device__ __forceinline__ void row_pointers(const RowArgs<Op>& args, int64_t row, const typename Op::In** in) {
#pragma unroll
  for (int s = 0; s < Op::kStreams; ++s) in[s] = args.in[s] + row * args.n;
}

// kPeel: rows read as an aligned body of packs plus single edge elements, one per thread (RowEdges).
template <typename Op, int VEC, bool kPeel = false>
__global__ void __launch_bounds__(kStreamingMaxThreads) softmax_two_pass_kernel(RowArgs<Op> args) {
  using Acc = typename Op::Acc;
  __shared__ Acc partials[2][kWarpSize];
  const Op op = args.op;
  int64_t n_packs = args.n / VEC;
  int parity = 0;
  for (int64_t row = blockIdx.x; row < args.rows; row += gridDim.x, parity ^= 1) {
    const typename Op::In* in[Op::kStreams];
    row_pointers(args, row, in);
    typename Op::Out* out = args.out + row * args.n;
    [[maybe_unused]] RowEdges<VEC> edges{};
    [[maybe_unused]] typename Op::C edge[Op::kStreams];
    if constexpr (kPeel) {
      edges = row_edges<VEC>(args, row);
      load_edge(args, row * args.n, edges, threadIdx.x, edge);
      n_packs = edges.packs;
#pragma unroll
      for (int s = 0; s < Op::kStreams; ++s) in[s] += edges.head;
      out += edges.head;
    }
    Acc acc = fold_packs<Op, VEC>(op, in, 0, n_packs, threadIdx.x, blockDim.x);
    if constexpr (kPeel) acc = Op::merge(acc, edge_partial(op, edge));
    acc = block_all_reduce<Op>(acc, partials, parity);
    const typename Op::Row row_consts = op.finalize(acc);
    if constexpr (kPeel) store_edge(args, row * args.n, edges, threadIdx.x, row_consts, edge);
    write_packs<Op, VEC>(op, row_consts, in, out, 0, n_packs, threadIdx.x, blockDim.x);
  }
}

// Work item `item` of the split-row launches is part item % parts of row item / parts. A part is not a
// contiguous chunk: the row's packs go round robin in blocks of blockDim.x packs (block b to part b % parts),
// so the row's CTAs sweep it side by side, a window of parts x blockDim.x x (packs per step) at a time: the
// partials pass forwards, the apply pass backwards from the row's end, where the partials pass left its
// last reads in L2. Contiguous chunks (one per CTA: 264 streams 1 MB apart on 4 x 33554432 fp16) kept DRAM
// at 72% (apply) and 81% (partials) of its peak, the interleaved parts at 80% and 85% (Nsight Compute, H100,
// session 18); three interleaved bench runs per tree (*session18-c5-*): 4 x 33554432 softmax -10.9 / -11.3 /
// -12.0% (fp16 / bf16 / fp32), softmax_backward -9.6 / -9.5 / -11.6%, log_softmax_backward -11.0 / -11.1 /
// -13.2%.
struct SplitPart {
  int64_t row;
  int64_t begin;   // the part's first pack in the row
  int stride;      // between its blocks (parts x blockDim.x: at most a few hundred thousand)
};

__device__ __forceinline__ SplitPart split_part(int64_t item, int64_t parts) {
  return {item / parts, (item % parts) * blockDim.x, static_cast<int>(parts * blockDim.x)};
}

// split_row's partials pass over 16-bit streams at two CTAs of 512 threads per SM (<= 64 registers), each
// thread folding half the default packs at a time (the full count spilled 48-148 bytes there; ptxas, nvcc
// 13.0): at one CTA per SM (93 registers) half of its 2-per-SM grid ran as a second wave. H100, session 18
// (*session18-c4-*; Nsight Compute, 4 x 33554432): the fp16 softmax fold 110 -> 99 us, the fp16
// softmax_backward fold 214 -> 191 us; two interleaved bench runs: softmax fp16 / bf16 -1.7 / -2.0%,
// softmax_backward fp16 -4.2%, bf16 -0.3%. float32 backward (two streams) keeps the two CTAs it had at the
// default bound (64 registers; the interleaved parts took it to 66 without the bound, 64 and 8 bytes of
// spill with it). float32 and float64 forward keep the default bound (0: none; an explicit 1 changed their
// code): float32 at two CTAs folded 188 us against 185 (softmax +0.4%), float64 spilled 384 bytes.
template <typename Op>
constexpr int kSplitPartialsMinCtas =
    sizeof(typename Op::In) == 2 || (sizeof(typename Op::In) == 4 && Op::kStreams == 2) ? 2 : 0;
template <typename Op, int VEC>
constexpr int kSplitPartialsUnroll =
    kFoldUnroll<Op, VEC> / (Op::kStreams == 1 && sizeof(typename Op::In) == 2 ? 2 : 1);

// kPeel (both launches): rows read as an aligned body of packs plus single edge elements (RowEdges); a row's
// first part holds its edges, a thread each.
template <typename Op, int VEC>
struct PeeledSplitRow {
  const typename Op::In* in[Op::kStreams];  // the row's body
  RowEdges<VEC> edges;
  int edge_index;  // this thread's edge element, or -1
  typename Op::C edge[Op::kStreams];
};

template <typename Op, int VEC>
__device__ __forceinline__ PeeledSplitRow<Op, VEC> peeled_split_row(const RowArgs<Op>& args, const SplitPart& part) {
  PeeledSplitRow<Op, VEC> view;
  row_pointers(args, part.row, view.in);
  view.edges = row_edges<VEC>(args, part.row);
  view.edge_index = part.begin == 0 ? static_cast<int>(threadIdx.x) : -1;
  load_edge(args, part.row * args.n, view.edges, view.edge_index, view.edge);
#pragma unroll
  for (int s = 0; s < Op::kStreams; ++s) view.in[s] += view.edges.head;
  return view;
}

template <typename Op, int VEC, bool kPeel = false>
__global__ void __launch_bounds__(kStreamingMaxThreads, kSplitPartialsMinCtas<Op>)
    softmax_split_partials_kernel(RowArgs<Op> args, int64_t parts, typename Op::Acc* partials_out) {
  using Acc = typename Op::Acc;
  __shared__ Acc partials[2][kWarpSize];
  const Op op = args.op;
  const int64_t n_packs = args.n / VEC;
  const int64_t items = args.rows * parts;
  int parity = 0;
  for (int64_t item = blockIdx.x; item < items; item += gridDim.x, parity ^= 1) {
    const SplitPart part = split_part(item, parts);
    Acc acc;
    if constexpr (kPeel) {
      const PeeledSplitRow<Op, VEC> view = peeled_split_row<Op, VEC>(args, part);
      acc = fold_packs<Op, VEC, kSplitPartialsUnroll<Op, VEC>, /*kInterleaved=*/true>(
          op, view.in, part.begin, view.edges.packs, threadIdx.x, blockDim.x, part.stride);
      acc = Op::merge(acc, edge_partial(op, view.edge));
    } else {
      const typename Op::In* in[Op::kStreams];
      row_pointers(args, part.row, in);
      acc = fold_packs<Op, VEC, kSplitPartialsUnroll<Op, VEC>, /*kInterleaved=*/true>(
          op, in, part.begin, n_packs, threadIdx.x, blockDim.x, part.stride);
    }
    acc = block_all_reduce<Op>(acc, partials, parity);
    if (threadIdx.x == 0) partials_out[item] = acc;
  }
}

template <typename Op, int VEC, bool kPeel = false>
__global__ void __launch_bounds__(kStreamingMaxThreads)
    softmax_split_apply_kernel(RowArgs<Op> args, int64_t parts, const typename Op::Acc* partials_in) {
  using Acc = typename Op::Acc;
  __shared__ Acc partials[2][kWarpSize];
  const Op op = args.op;
  const int64_t n_packs = args.n / VEC;
  const int64_t items = args.rows * parts;
  int parity = 0;
  for (int64_t step = blockIdx.x; step < items; step += gridDim.x, parity ^= 1) {
    // Backwards: with more items than CTAs, the partials launch finished with the highest rows.
    const int64_t item = items - 1 - step;
    const SplitPart part = split_part(item, parts);
    // Every CTA of a row merges the same partials in the same order: identical row constants.
    Acc acc = Op::identity();
    for (int64_t c = threadIdx.x; c < parts; c += blockDim.x) acc = Op::merge(acc, partials_in[part.row * parts + c]);
    acc = block_all_reduce<Op>(acc, partials, parity);
    if constexpr (kPeel) {
      const PeeledSplitRow<Op, VEC> view = peeled_split_row<Op, VEC>(args, part);
      const typename Op::Row row_consts = op.finalize(acc);
      store_edge(args, part.row * args.n, view.edges, view.edge_index, row_consts, view.edge);
      write_packs<Op, VEC, /*kInterleaved=*/true>(op, row_consts, view.in, args.out + part.row * args.n + view.edges.head,
                                                  part.begin, view.edges.packs, threadIdx.x, blockDim.x, part.stride);
    } else {
      const typename Op::In* in[Op::kStreams];
      row_pointers(args, part.row, in);
      write_packs<Op, VEC, /*kInterleaved=*/true>(op, op.finalize(acc), in, args.out + part.row * args.n, part.begin,
                                                  n_packs, threadIdx.x, blockDim.x, part.stride);
    }
  }
}

// Strided layout: CTA (outer index o, tile of blockDim.x inner columns); thread (x, y) owns column x and
// the n-indices y, y + blockDim.y, ...:
//
//     element (o, j, i) lives at (o * n + j) * inner + i
//     blockDim.x == inner (inner < 32): a warp covers 32 consecutive elements (several j, all i)
//     blockDim.x == 32   (inner >= 32): a warp covers 32 consecutive i of one j
//
// The blockDim.y partial results per column are merged by a fixed tree in shared memory.
template <typename Op>
constexpr int kStridedUnroll = 8 / Op::kStreams;  // scalar loads in flight per thread (all streams: 8)

template <typename Op>
__global__ void __launch_bounds__(kStreamingMaxThreads) softmax_strided_kernel(RowArgs<Op> args) {
  using In = typename Op::In;
  using C = typename Op::C;
  using Acc = typename Op::Acc;
  constexpr int S = Op::kStreams;
  constexpr int U = kStridedUnroll<Op>;
  __shared__ Acc tree[kStreamingMaxThreads];
  const Op op = args.op;
  const int64_t n = args.n;
  const int64_t inner = args.inner;
  const int tx = threadIdx.x;
  const int ty = threadIdx.y;
  const int bx = blockDim.x;
  const int by = blockDim.y;  // a power of two
  const int64_t tiles_per_outer = (inner + bx - 1) / bx;
  const int64_t tiles = args.rows * tiles_per_outer;

  for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    const int64_t outer = tile / tiles_per_outer;
    const int64_t column = (tile % tiles_per_outer) * bx + tx;
    const bool column_valid = column < inner;
    const int64_t base = outer * n * inner + column;

    Acc acc = Op::identity();
    for (int64_t first = ty; first < n; first += static_cast<int64_t>(U) * by) {
      C values[S][U];
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int64_t j = first + static_cast<int64_t>(u) * by;
#pragma unroll
        for (int s = 0; s < S; ++s) {
          values[s][u] = column_valid && j < n ? convert<C>(args.in[s][base + j * inner]) : Op::pad(s);
        }
      }
      acc = op.accumulate(acc, [&](auto&& fn) {
#pragma unroll
        for (int u = 0; u < U; ++u) {
          C v[S];
#pragma unroll
          for (int s = 0; s < S; ++s) v[s] = values[s][u];
          fn(v, u);
        }
      });
    }

    tree[ty * bx + tx] = acc;
    __syncthreads();
    for (int half = by / 2; half > 0; half /= 2) {
      if (ty < half) tree[ty * bx + tx] = Op::merge(tree[ty * bx + tx], tree[(ty + half) * bx + tx]);
      __syncthreads();
    }
    const typename Op::Row row_consts = op.finalize(tree[tx]);
    __syncthreads();  // tree is rewritten by the next tile

    if (column_valid) {
      for (int64_t first = ty; first < n; first += static_cast<int64_t>(U) * by) {
        In raw[S][U];
#pragma unroll
        for (int u = 0; u < U; ++u) {
          const int64_t j = first + static_cast<int64_t>(u) * by;
          if (j < n) {
#pragma unroll
            for (int s = 0; s < S; ++s) raw[s][u] = args.in[s][base + j * inner];
          }
        }
#pragma unroll
        for (int u = 0; u < U; ++u) {
          const int64_t j = first + static_cast<int64_t>(u) * by;
          if (j < n) {
            C v[S];
#pragma unroll
            for (int s = 0; s < S; ++s) v[s] = convert<C>(raw[s][u]);
            args.out[base + j * inner] = op.apply(row_consts, v);
          }
        }
      }
    }
  }
}

}  // namespace softmax_ops::detail
