// What every softmax kernel file shares: vector loads/stores of packs, the kernel argument struct, and the
// small template dispatchers (dtype pair -> row op, vector width, packs per thread) that instantiate
// exactly the kernels a launch can ask for. CUDA headers only (no ATen).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <tuple>
#include <type_traits>
#include <utility>

#include "softmax_launch.h"
#include "softmax_math.cuh"
#include "softmax_ops/device_utils.cuh"
#include "softmax_ops/launch_utils.h"

namespace softmax_ops::detail {

// ---- memory access --------------------------------------------------------------------------------

// Moves a Pack as machine words of its own size (2/4/8/16 bytes, or several 16-byte words), so a 16-byte
// pack of half/bfloat16 becomes one LDG.128 whatever the element type's copy semantics.
template <int Bytes>
struct Word;
template <> struct Word<2> { using type = unsigned short; };
template <> struct Word<4> { using type = unsigned int; };
template <> struct Word<8> { using type = uint2; };
template <> struct Word<16> { using type = uint4; };

template <typename T, int N>
constexpr int kPackBytes = static_cast<int>(sizeof(T)) * N;
template <typename T, int N>
constexpr int kWordBytes = kPackBytes<T, N> >= 16 ? 16 : kPackBytes<T, N>;

// kLastUse: the data is not read again (second pass of a re-reading kernel): an evict-first load keeps
// L2 for what is still to be re-read.
template <typename T, int N, bool kLastUse = false>
__device__ __forceinline__ Pack<T, N> load_vec(const T* ptr) {
  using W = typename Word<kWordBytes<T, N>>::type;
  constexpr int kWords = kPackBytes<T, N> / kWordBytes<T, N>;
  Pack<T, N> out;
  const W* src = reinterpret_cast<const W*>(ptr);
  W* dst = reinterpret_cast<W*>(&out);
#pragma unroll
  for (int i = 0; i < kWords; ++i) {
    if constexpr (kLastUse) {
      dst[i] = __ldcs(src + i);
    } else {
      dst[i] = src[i];
    }
  }
  return out;
}

// load_vec where `valid`, else a pack of `pad`. 16-bit elements: the pad is written first and the load lands on it
// word by word (a predicated LDG into the same registers). Selecting between two whole packs made NVVM merge
// 16-bit packs half by half once the loads had landed: 128 PRMT on the critical path of the 4-pack float16 warp
// softmax_backward (792 instructions; 928 with the mode fixed, 728 with this too; Nsight Compute had put it 19-40%
// behind torch.compile's kernel on 1000 x 1000 and 128 x 1024, H100, session 36). Wider elements fill whole
// registers: one SEL each, kept (the pad-first form gave the float32 lean backward instance 8 bytes of spill under
// its 32-register cap; nvcc 13.0, sm_90). kPadFirst = false keeps the select for 16-bit packs too: most widening
// forward warp instances (16-bit rows, float32 results) use it (softmax_warp_kernel.cuh kWarpPadFirstLoads), where
// pad-first loads took 8-50 more registers (8 packs per lane: 117-128 -> 167-168, 3 CTAs of 128 threads per SM
// instead of 4) and made float16 -> float32 rows of 1032-2048 columns up to 15% slower (H100, session 37: 4096 x
// 1032 17.8 against 15.6 us, 2048 x 2048 14.9 against 13.3).
// `address()` gives the pack's pointer; it is called only where the load is made or predicated (with the select,
// for wider elements and for 16-bit ones with kPadFirst = false, only when `valid`: a pointer computed
// unconditionally cost float32 warp instances up to 35 more registers and the float32 lean instance 16 bytes of
// spill).
template <typename T, int N, bool kPadFirst = true, typename Address, typename C>
__device__ __forceinline__ Pack<T, N> load_vec_or(bool valid, Address&& address, C pad);

// The bits of one element, as the integer word of its size.
__device__ __forceinline__ uint32_t element_bits(float v) { return __float_as_uint(v); }
__device__ __forceinline__ uint32_t element_bits(__half v) { return __half_as_ushort(v); }
__device__ __forceinline__ uint32_t element_bits(__nv_bfloat16 v) { return __bfloat16_as_ushort(v); }

// Stores a pack as whole vector words. A pack of 16-bit or 32-bit elements of 8 bytes or a multiple of 16
// is assembled into 32-bit words and written by st.global.v2 / v4: when the pack was built element by
// element (apply), a plain uint4 store let NVVM split most of them into 32-bit stores (PTX of the 8-pack
// warp kernel: 4 st.global.v4 and 48 st.global.u32), a quarter of the store throughput. The pointer is
// global memory aligned to the pack, as every vector store here is (pointers_vector_aligned).
template <typename T, int N>
__device__ __forceinline__ void store_vec(T* ptr, const Pack<T, N>& pack) {
  constexpr int kBytes = kPackBytes<T, N>;
  constexpr bool kAssemble = (sizeof(T) == 2 || sizeof(T) == 4) && (kBytes == 8 || kBytes % 16 == 0);
  if constexpr (kAssemble) {
    constexpr int kPerWord = 4 / static_cast<int>(sizeof(T));
    constexpr int kWords = kBytes / 4;
    uint32_t words[kWords];
#pragma unroll
    for (int w = 0; w < kWords; ++w) {
      words[w] = element_bits(pack.v[w * kPerWord]);
      if constexpr (kPerWord == 2) words[w] |= element_bits(pack.v[w * kPerWord + 1]) << 16;
    }
    if constexpr (kWords == 2) {
      asm volatile("st.global.v2.b32 [%0], {%1, %2};" : : "l"(ptr), "r"(words[0]), "r"(words[1]) : "memory");
    } else {
#pragma unroll
      for (int w = 0; w < kWords; w += 4) {
        asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};"
                     :
                     : "l"(reinterpret_cast<char*>(ptr) + 4 * w), "r"(words[w]), "r"(words[w + 1]),
                       "r"(words[w + 2]), "r"(words[w + 3])
                     : "memory");
      }
    }
  } else {
    using W = typename Word<kWordBytes<T, N>>::type;
    constexpr int kWords = kPackBytes<T, N> / kWordBytes<T, N>;
    const W* src = reinterpret_cast<const W*>(&pack);
    W* dst = reinterpret_cast<W*>(ptr);
#pragma unroll
    for (int i = 0; i < kWords; ++i) dst[i] = src[i];
  }
}

// Widening packs: 8 values of a 16-bit input as 8 float32 results, 32 bytes per lane. store_vec writes one
// as two 16-byte stores, so each warp store instruction covers one half of every 32-byte sector it touches,
// and L2 takes two partial writes per sector. Nsight Compute counted 1.8-2x the L2 write sectors of the data
// on the one-pass block / grid kernels, which ran these rows at 0.54-0.86 of a copy; the pattern alone, with
// nothing computed, ran at 0.72-0.90, and 16 contiguous bytes per lane at 0.98-1.05 (H100, session 27 call 1,
// benchmarks/micro/widening_stores.cu).
template <typename Out, int VEC>
constexpr bool kLanePairStores = std::is_same_v<Out, float> && VEC == 8;

// Lane pairs trade pack halves: lane 2m's upper half and lane 2m + 1's lower half change places, so that lane 2m
// then holds both lower halves (its own, then its partner's) and lane 2m + 1 both upper halves. Applied to the
// 16-bit inputs of a widening pack it moves 8 bytes each way instead of the results' 16. Every lane of the warp
// calls it (the shuffles name all 32).
template <typename T, int N>
__device__ __forceinline__ Pack<T, N> swap_halves_in_lane_pairs(Pack<T, N> pack) {
  constexpr int kWords = kPackBytes<T, N> / 4;
  static_assert(kWords % 2 == 0, "two halves of whole 32-bit words");
  uint32_t words[kWords];
  __builtin_memcpy(words, &pack, sizeof(words));
  const bool odd = (threadIdx.x & 1) != 0;  // the lane's parity: CTAs are whole warps
#pragma unroll
  for (int i = 0; i < kWords / 2; ++i) {
    const uint32_t received = __shfl_xor_sync(0xffffffffu, odd ? words[i] : words[kWords / 2 + i], 1);
    words[i] = odd ? received : words[i];
    words[kWords / 2 + i] = odd ? words[kWords / 2 + i] : received;
  }
  __builtin_memcpy(&pack, words, sizeof(words));
  return pack;
}

// Stores a widening pack whose halves swap_halves_in_lane_pairs arranged (before or after computing it: the ops
// are element-wise), in whole sectors: lanes 2m and 2m + 1 hold adjacent packs (lane 2m + 1's ptr is lane 2m's +
// VEC); the first store instruction writes lane 2m's pack, the second lane 2m + 1's, 16 bytes from each lane.
// Each half goes out where the pack it belongs to is valid. Every lane of the warp calls it.
template <int VEC>
__device__ __forceinline__ void store_swapped_lane_pair(float* ptr, const Pack<float, VEC>& swapped, bool valid) {
  static_assert(VEC == 8, "a pack of two 16-byte halves");
  const bool odd = (threadIdx.x & 1) != 0;
  const bool partner_valid = __shfl_xor_sync(0xffffffffu, static_cast<int>(valid), 1) != 0;
  Pack<float, 4> lower;  // lane 2m's pack
  Pack<float, 4> upper;  // lane 2m + 1's pack
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    lower.v[j] = swapped.v[j];
    upper.v[j] = swapped.v[4 + j];
  }
  float* const first = odd ? ptr - 4 : ptr;  // where lane 2m's pack's half from this lane goes
  if (odd ? partner_valid : valid) store_vec<float, 4>(first, lower);
  if (odd ? valid : partner_valid) store_vec<float, 4>(first + VEC, upper);
}

// Writes the result pack make(arrange) returns at address() where `valid`; make applies arrange to the packs it
// computes from (or to its result) and returns the result. Widening packs go out in lane pairs, arranged by
// swap_halves_in_lane_pairs: then every lane of the warp calls this for its own pack, and make() runs in every
// lane, on padding where the pack is not valid. Other packs: a plain store, arrange the identity, address and
// pack made only where valid (lambdas, so that those instances compile as the store they replace).
template <typename Out, int VEC, bool kPairs = kLanePairStores<Out, VEC>, typename Address, typename MakePack>
__device__ __forceinline__ void store_pack_where(bool valid, Address&& address, MakePack&& make) {
  if constexpr (kPairs) {
    const auto swap = [](auto pack) { return swap_halves_in_lane_pairs(pack); };
    store_swapped_lane_pair<VEC>(address(), make(swap), valid);
  } else if (valid) {
    const Pack<Out, VEC> pack = make([](auto same) { return same; });  // first, then the address: as before
    store_vec<Out, VEC>(address(), pack);
  }
}

// Element j of a cached pack in the compute type. bfloat16 -> float is a single shift, so the compiler
// hoists it: it converted a warp's 64 cached values once and kept all 64 floats (or 64 16-bit halves, one
// register each) alive across the max, sum and apply visits: 146-150 registers for the 8-pack warp kernel
// against 111 for half, one CTA per SM fewer. Taking the element straight from its 32-bit word with an
// opaque instruction redoes the shift at each visit instead, and the cache stays packed.
template <typename C, typename T, int N>
__device__ __forceinline__ C cached_element(const Pack<T, N>& pack, int j) {
  if constexpr (std::is_same_v<T, __nv_bfloat16> && std::is_same_v<C, float> && N % 2 == 0) {
    const uint32_t word = element_bits(pack.v[j & ~1]) | (element_bits(pack.v[j | 1]) << 16);
    uint32_t bits;
    if (j % 2 == 0) {
      asm volatile("shl.b32 %0, %1, 16;" : "=r"(bits) : "r"(word));
    } else {
      asm volatile("and.b32 %0, %1, 0xffff0000;" : "=r"(bits) : "r"(word));
    }
    return __uint_as_float(bits);
  } else {
    return convert<C>(pack.v[j]);
  }
}

// Calls fn(v, j) for each element j of pack p of every stream: v[s] = element j of packs[s][p] in the
// compute type C. The lean backward and the streaming passes visit through it (compiled to the same SASS as
// their former copies, nvcc 13.0 sm_90). The warp kernel keeps its own loops: through this helper ptxas
// allocated its registers differently (SASS of up to 25 of its 96 instances changed), which needs a GPU A/B
// (session 6's exp-once refactor moved register allocation and measured slower on fp16 warp shapes).
template <typename C, int S, typename T, int N, int P, typename Fn>
__device__ __forceinline__ void visit_elements(const Pack<T, N> (&packs)[S][P], int p, Fn&& fn) {
#pragma unroll
  for (int j = 0; j < N; ++j) {
    C v[S];
#pragma unroll
    for (int s = 0; s < S; ++s) v[s] = cached_element<C>(packs[s][p], j);
    fn(v, j);
  }
}

// visit_elements of packs[.][p] after arrange (store_pack_where's make): arrange(pack) per stream.
template <typename C, typename T, int N, int S, int P, typename Arrange, typename Fn>
__device__ __forceinline__ void visit_arranged_elements(const Pack<T, N> (&packs)[S][P], int p, Arrange&& arrange,
                                                        Fn&& fn) {
  Pack<T, N> arranged[S][1];
#pragma unroll
  for (int s = 0; s < S; ++s) arranged[s][0] = arrange(packs[s][p]);
  visit_elements<C>(arranged, 0, fn);
}

template <typename T, int N, typename C>
__device__ __forceinline__ Pack<T, N> filled_pack(C value) {
  Pack<T, N> out;
#pragma unroll
  for (int j = 0; j < N; ++j) out.v[j] = convert<T>(value);
  return out;
}

template <typename T, int N, bool kPadFirst, typename Address, typename C>
__device__ __forceinline__ Pack<T, N> load_vec_or(bool valid, Address&& address, C pad) {
  if constexpr (kPadFirst && sizeof(T) == 2) {
    using W = typename Word<kWordBytes<T, N>>::type;
    constexpr int kWords = kPackBytes<T, N> / kWordBytes<T, N>;
    Pack<T, N> out = filled_pack<T, N>(pad);
    // Word by word into the padded pack: assigning a whole loaded pack (load_vec) brought the half-by-half merges
    // back (4006 PRMT in the warp kernels instead of 747), so load_vec's word loop is repeated here.
    const W* src = reinterpret_cast<const W*>(address());
    W* dst = reinterpret_cast<W*>(&out);
    if (valid) {
#pragma unroll
      for (int i = 0; i < kWords; ++i) dst[i] = src[i];
    }
    return out;
  } else {
    return valid ? load_vec<T, N>(address()) : filled_pack<T, N>(pad);
  }
}

// ---- kernel arguments -----------------------------------------------------------------------------

// Rows of `n` elements; row r starts at r * n (inner == 1 kernels). The strided kernel reads `rows` as
// outer and uses `inner`. Element offsets are 64-bit everywhere: rows * n may exceed 2^31.
template <typename Op>
struct RowArgs {
  const typename Op::In* in[Op::kStreams];
  typename Op::Out* out;
  int64_t rows;
  int64_t n;
  int64_t inner;
  Op op;
};

template <typename Op>
RowArgs<Op> make_row_args(const Op& op, const SoftmaxProblem& problem, const SoftmaxPointers& ptrs) {
  RowArgs<Op> args;
  args.in[0] = static_cast<const typename Op::In*>(ptrs.in0);
  if constexpr (Op::kStreams == 2) args.in[1] = static_cast<const typename Op::In*>(ptrs.in1);
  args.out = static_cast<typename Op::Out*>(ptrs.out);
  args.rows = problem.inner == 1 ? problem.rows() : problem.outer;
  args.n = problem.n;
  args.inner = problem.inner;
  args.op = op;
  return args;
}

// ---- peeled rows ----------------------------------------------------------------------------------
//
// Rows whose length is not a multiple of VEC (GPT-2's 50257 words, 4095, 1001), or which start off a 16-byte
// boundary for that reason, are read as their aligned body plus edge elements (RowEdges, device_utils.cuh;
// plan.peel). The kernels run the body exactly as they run an aligned row, from the body's first element, and
// up to 2 (VEC - 1) threads take one edge element each, folded into their partial and written singly. Single-
// element access to the whole row instead (vec 1) ran 2048 x 50257 fp16 softmax at 0.43 of copy against 0.92
// for 2048 x 50256, slower than torch eager (H100, session 19 call 1, *session19-c1-bench-odd*). The body is
// aligned for every pointer when they all share one element phase (address / element size, modulo VEC): the
// launcher plans peeling only then (pointers_share_phase), and the phase is read from the first input.
// row_edges_at's arithmetic, written out: called through it, ptxas scheduled 11 peeled block-kernel backward
// instances differently (cuobjdump, session 20), whose speed was measured in this form.
template <int VEC, typename Op>
__device__ __forceinline__ RowEdges<VEC> row_edges(const RowArgs<Op>& args, int64_t row) {
  using In = typename Op::In;
  const int64_t start = static_cast<int64_t>(reinterpret_cast<uintptr_t>(args.in[0]) / sizeof(In)) + row * args.n;
  const int64_t to_boundary = (VEC - start % VEC) % VEC;
  RowEdges<VEC> edges;
  edges.head = static_cast<int>(min(to_boundary, args.n));
  edges.packs = (args.n - edges.head) / VEC;
  edges.tail = static_cast<int>(args.n - edges.head - edges.packs * VEC);
  return edges;
}

// Edge element `e` of the row starting at element `row_start` (every stream, in the compute type), or the
// padding when e is not an edge of this row (the thread holds none).
template <typename Op, int VEC>
__device__ __forceinline__ void load_edge(const RowArgs<Op>& args, int64_t row_start, const RowEdges<VEC>& edges,
                                          int e, typename Op::C (&v)[Op::kStreams]) {
  const bool mine = e >= 0 && e < edges.count();
#pragma unroll
  for (int s = 0; s < Op::kStreams; ++s) {
    v[s] = mine ? convert<typename Op::C>(args.in[s][row_start + edges.column(e)]) : Op::pad(s);
  }
}

// The partial of one edge element (the identity for the padding).
template <typename Op>
__device__ __forceinline__ typename Op::Acc edge_partial(const Op& op, const typename Op::C (&v)[Op::kStreams]) {
  return op.template accumulate<1>(Op::identity(), [&](auto&& fn) { fn(v, 0); });
}

// The partial of a thread's EDGES edge elements (the warp kernel's lanes hold up to 4), one chunk of them.
template <typename Op, int EDGES>
__device__ __forceinline__ typename Op::Acc edge_partial(const Op& op,
                                                         const typename Op::C (&v)[EDGES][Op::kStreams]) {
  return op.template accumulate<1>(Op::identity(), [&](auto&& fn) {
#pragma unroll
    for (int i = 0; i < EDGES; ++i) fn(v[i], 0);
  });
}

template <typename Op, int VEC>
__device__ __forceinline__ void store_edge(const RowArgs<Op>& args, int64_t row_start, const RowEdges<VEC>& edges,
                                           int e, const typename Op::Row& row_consts,
                                           const typename Op::C (&v)[Op::kStreams]) {
  if (e >= 0 && e < edges.count()) args.out[row_start + edges.column(e)] = args.op.apply(row_consts, v);
}

template <typename T> constexpr DType kDTypeOf = DType::kFloat32;
template <> constexpr DType kDTypeOf<__half> = DType::kFloat16;
template <> constexpr DType kDTypeOf<__nv_bfloat16> = DType::kBFloat16;
template <> constexpr DType kDTypeOf<double> = DType::kFloat64;

// Register packs per thread of the block kernel for this row op (see max_block_reg_packs).
template <typename Op>
constexpr int kMaxRegPacks = max_block_reg_packs(kDTypeOf<typename Op::In>, Op::kStreams == 2);

// ---- template dispatch ----------------------------------------------------------------------------

template <DType D> struct CudaTypeOf;
template <> struct CudaTypeOf<DType::kFloat32> { using type = float; };
template <> struct CudaTypeOf<DType::kFloat16> { using type = __half; };
template <> struct CudaTypeOf<DType::kBFloat16> { using type = __nv_bfloat16; };
template <> struct CudaTypeOf<DType::kFloat64> { using type = double; };

template <DType In, DType Out>
struct DTypePair {
  static constexpr DType kIn = In;
  static constexpr DType kOut = Out;
};

// The (read, write) dtype pairs with kernels. Forward: same dtype, or float16/bfloat16 read and float32
// written (torch's half_to_float). Backward: same dtype, or float32 grad/output and a float16/bfloat16
// grad_input. The launcher reduces every other combination to one of these (op_checks.h, DESIGN.md §3).
using ForwardPairs = std::tuple<DTypePair<DType::kFloat32, DType::kFloat32>,
                                DTypePair<DType::kFloat16, DType::kFloat16>,
                                DTypePair<DType::kBFloat16, DType::kBFloat16>,
                                DTypePair<DType::kFloat64, DType::kFloat64>,
                                DTypePair<DType::kFloat16, DType::kFloat32>,
                                DTypePair<DType::kBFloat16, DType::kFloat32>>;
using BackwardPairs = std::tuple<DTypePair<DType::kFloat32, DType::kFloat32>,
                                 DTypePair<DType::kFloat16, DType::kFloat16>,
                                 DTypePair<DType::kBFloat16, DType::kBFloat16>,
                                 DTypePair<DType::kFloat64, DType::kFloat64>,
                                 DTypePair<DType::kFloat32, DType::kFloat16>,
                                 DTypePair<DType::kFloat32, DType::kBFloat16>>;

template <template <typename, typename> class OpT, typename... Pairs, typename F>
bool dispatch_pairs(std::tuple<Pairs...>*, const SoftmaxProblem& problem, F& fn) {
  auto try_pair = [&](auto pair) {
    using P = decltype(pair);
    if (problem.in_dtype != P::kIn || problem.out_dtype != P::kOut) return false;
    fn(OpT<typename CudaTypeOf<P::kIn>::type, typename CudaTypeOf<P::kOut>::type>{problem.log});
    return true;
  };
  return (try_pair(Pairs{}) || ...);
}

// Calls fn(op) with the row op of `problem` (ForwardOp<In, Out> or BackwardOp<In, Out>); returns fn's
// result, or cudaErrorInvalidValue for a dtype pair without kernels.
template <typename F>
cudaError_t dispatch_row_op(const SoftmaxProblem& problem, F&& fn) {
  cudaError_t result = cudaErrorInvalidValue;
  auto call = [&](auto op) { result = fn(op); };
  if (problem.backward) {
    dispatch_pairs<BackwardOp>(static_cast<BackwardPairs*>(nullptr), problem, call);
  } else {
    dispatch_pairs<ForwardOp>(static_cast<ForwardPairs*>(nullptr), problem, call);
  }
  return result;
}

// Vector widths: a 16-byte pack of In, or single elements (unaligned pointers or n not a multiple).
template <typename In, typename F>
cudaError_t dispatch_vec(int vec, F&& fn) {
  return dispatch_int(std::integer_sequence<int, kVec16<In>, 1>{}, vec, std::forward<F>(fn));
}

// Registers-per-thread buckets of the warp and block kernels (runtime masking covers sizes in between).
using RegPackBuckets = std::integer_sequence<int, 1, 2, 4, 8>;

}  // namespace softmax_ops::detail
