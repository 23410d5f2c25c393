// fused_topk device building blocks, part 4: block-wide selection in shared memory: appends (per warp or
// per lane), run-time register picks, radix threshold, compaction, bitonic sorts (shared memory and
// registers) and the write of a sorted top-k.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "topk_keys.cuh"
#include "topk_stats.cuh"

namespace softmax_ops::topk {

// ---- warp-wide selection -------------------------------------------------------------------------------

// The k-th largest (1 <= k <= W) of the W lanes' values (NaN-free), in every lane: a bitonic sort across the
// lanes (log2(W) (log2(W) + 1) / 2 shuffle steps), descending, then lane k-1's value. The warp kernel's
// thresholds and the block family's floor from the threads' maxima (ChunkTopk).
template <int W, typename T>
__device__ __forceinline__ T kth_largest_across_lanes(T v, int k) {
  const int lane = threadIdx.x % W;
#pragma unroll
  for (int size = 2; size <= W; size *= 2) {
#pragma unroll
    for (int stride = size / 2; stride > 0; stride /= 2) {
      const T other = __shfl_xor_sync(kFullMask, v, stride, W);
      const bool keep_larger = ((lane & stride) == 0) == ((lane & size) == 0);
      v = keep_larger ? max(v, other) : min(v, other);
    }
  }
  return __shfl_sync(kFullMask, v, k - 1, W);
}

// ---- block-wide selection in shared memory -------------------------------------------------------

// Candidates of a small radix bucket, scanned instead of the whole buffer by block_radix_threshold's later
// digit passes (16 bytes per entry: float64's candidates; 8 for the others).
constexpr int kSelectSideEntries = 64;

struct SelectScratch {
  int hist[256];
  int count;       // entries in the candidate buffer
  int digit;       // radix step result, broadcast to the block
  int remaining;
  int done;
  int bucket;      // entries in the chosen bucket
  int side_count;  // entries copied into side by the current pass
  alignas(16) unsigned char side[kSelectSideEntries * 16];
  float warp_floor[32];  // ChunkTopk's maxima floor (first tile, refreshes): one value per warp
};

// Appends c at a slot of buf taken from *counter with one atomic per warp. Every lane of the warp calls it.
template <typename Ops>
__device__ __forceinline__ void warp_append(typename Ops::Type* buf, int* counter, bool take,
                                            const typename Ops::Type& c) {
  const unsigned mask = __ballot_sync(kFullMask, take);
  if (mask == 0) return;
  const int lane = threadIdx.x % kWarpSize;
  const int leader = __ffs(mask) - 1;
  int base = 0;
  if (lane == leader) base = atomicAdd(counter, __popc(mask));
  base = __shfl_sync(kFullMask, base, leader);
  if (take) buf[base + __popc(mask & ((1u << lane) - 1u))] = c;
}

// Reserves `n` consecutive slots of a buffer for every lane of the warp with ONE shared atomic per warp
// (inclusive scan of n, the last lane adds the warp total); returns this lane's first slot. Every lane of
// the warp calls it; lanes with n == 0 get an unused slot number.
__device__ __forceinline__ int warp_reserve(int* counter, int n) {
  const int lane = threadIdx.x % kWarpSize;
  int inclusive = n;
#pragma unroll
  for (int offset = 1; offset < kWarpSize; offset *= 2) {
    const int other = __shfl_up_sync(kFullMask, inclusive, offset);
    if (lane >= offset) inclusive += other;
  }
  int base = 0;
  if (lane == kWarpSize - 1 && inclusive > 0) base = atomicAdd(counter, inclusive);
  base = __shfl_sync(kFullMask, base, kWarpSize - 1);
  return base + inclusive - n;
}

// v[b / N][b % N] for a run-time b < M * N without local memory (registers cannot be indexed): per row
// of v a chain of selects on b % N (the N - 1 compares shared by the M rows), then one on b / N: M
// independent chains of N - 1 selects instead of one of M * N - 1, and half the compares. A full select tree
// would be shallower still but keeps a second copy of the tile live (+18 registers in the block kernel,
// ptxas); this keeps M values. The block kernels' append runs it just before a barrier: its depth counts.
template <typename X, int M, int N>
__device__ __forceinline__ X pick(const X (&v)[M][N], int b) {
  const unsigned bit = static_cast<unsigned>(b);
  const unsigned col = bit % N;
  const unsigned row = bit / N;
  X in_row[M];
#pragma unroll
  for (int m = 0; m < M; ++m) {
    in_row[m] = v[m][0];
#pragma unroll
    for (int j = 1; j < N; ++j) in_row[m] = col == static_cast<unsigned>(j) ? v[m][j] : in_row[m];
  }
  X x = in_row[0];
#pragma unroll
  for (int m = 1; m < M; ++m) x = row == static_cast<unsigned>(m) ? in_row[m] : x;
  return x;
}

// flat[b] for a run-time b < N, as above.
template <typename X, int N>
__device__ __forceinline__ X pick(const X (&flat)[N], int b) {
  X x = flat[0];
#pragma unroll
  for (int i = 1; i < N; ++i) x = b == i ? flat[i] : x;
  return x;
}

// How append_selected reserves its slots.
enum class Reserve {
  kPerWarp,  // one atomic per warp after a warp scan (warp_reserve): for counters in global memory
  kPerLane,  // one atomic per lane that appends: for shared-memory counters, where the block kernels' tiles
             // append from 1-2 lanes of a warp and the scan's ~30 instructions (a shuffle chain) cost more
             // than the lanes' serialised shared atomics (H100, session 10: block 1024x50000 k50 fp16
             // 94.6 -> 89.2 us, *session10-c5-ab-*)
};

// Appends the candidates whose bits are set in `take` (candidate(b) builds number b) at reserved slots;
// returns popc(take). Every lane of the warp calls it. A lane usually has 0-1 bits set, so the write loop
// runs about once, against one vote + atomic + shuffle per value for warp_append. The slots' order varies
// from run to run either way (warps race): readers rank candidates by key, never by slot.
template <typename Ops, Reserve kReserve = Reserve::kPerWarp, typename MakeCandidate>
__device__ __forceinline__ int append_selected(typename Ops::Type* buf, int* counter, uint32_t take,
                                               MakeCandidate&& candidate) {
  int n;
  int slot;
  if constexpr (kReserve == Reserve::kPerLane) {
    if (take == 0) return 0;
    n = __popc(take);
    slot = atomicAdd(counter, n);
  } else {
    if (!__any_sync(kFullMask, take != 0)) return 0;
    n = __popc(take);
    slot = warp_reserve(counter, n);
  }
  while (take != 0) {
    const int b = __ffs(take) - 1;
    take &= take - 1;
    buf[slot++] = candidate(b);
  }
  return n;
}

struct DigitChoice {
  int digit;      // the bucket holding the remaining-th best entry
  int remaining;  // how many of that bucket's entries are still needed
  bool done;      // the bucket holds exactly that many: every entry with the prefix is selected
  int bucket;     // how many entries that bucket holds
};

// Called by all 32 lanes of one warp on a 256-bin histogram of the entries matching the current prefix:
// scanning buckets from 255 down, finds the one where the count of better entries reaches `remaining`.
// Lane l owns buckets 255 - 8l ... 248 - 8l. Every lane returns the same choice.
__device__ __forceinline__ DigitChoice warp_choose_digit(const int* hist, int remaining) {
  const int lane = threadIdx.x % kWarpSize;
  int h[8];
  int lane_total = 0;
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    h[j] = hist[255 - 8 * lane - j];
    lane_total += h[j];
  }
  int inclusive = lane_total;
#pragma unroll
  for (int offset = 1; offset < kWarpSize; offset *= 2) {
    const int other = __shfl_up_sync(kFullMask, inclusive, offset);
    if (lane >= offset) inclusive += other;
  }
  int above = inclusive - lane_total;
  int found = -1;
  int found_remaining = 0;
  bool found_done = false;
  int found_bucket = 0;
  if (above < remaining && remaining <= inclusive) {
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      if (found < 0 && above + h[j] >= remaining) {
        found = 255 - 8 * lane - j;
        found_remaining = remaining - above;
        found_done = h[j] == found_remaining;
        found_bucket = h[j];
      }
      above += h[j];
    }
  }
  const unsigned owner_mask = __ballot_sync(kFullMask, found >= 0);
  // A histogram without `remaining` entries cannot happen (callers guarantee count >= k); lane 0 then
  // answers bucket 0, which keeps the selection in range.
  const int owner = owner_mask ? __ffs(owner_mask) - 1 : 0;
  DigitChoice choice;
  choice.digit = __shfl_sync(kFullMask, found < 0 ? 0 : found, owner);
  choice.remaining = __shfl_sync(kFullMask, found < 0 ? remaining : found_remaining, owner);
  choice.done = __shfl_sync(kFullMask, found_done ? 1 : 0, owner) != 0;
  choice.bucket = __shfl_sync(kFullMask, found_bucket, owner);
  return choice;
}

// The k-th best entry of buf[0, count) as a radix prefix P (k <= count): with distinct entries exactly k of
// them satisfy at_least(c, P). MSB-first 8-bit digits with a shared-memory histogram; stops at the first
// digit whose bucket holds exactly the entries still needed. Duplicated entries (only "none" fillers) can
// keep it from stopping early; it then returns the full k-th value. Every thread returns P.
//
// Each pass counts only the entries matching the prefix, but reads them all. With kSideList, once the chosen
// bucket holds at most kSelectSideEntries entries, the next pass also copies the ones it counts (exactly that
// bucket) into s.side, and the passes after it scan that list instead of the buffer. 16-bit inputs need 7-8
// passes when the k-th value is tied (their keys' low digits never split, so index digits must): H100,
// 8 x 262144 k1024 fp16 122 -> 102 us, bf16 129 -> 102 (session 8, *session8-ab5-*). float32 keys split in
// 2-3 passes and lost there (91 -> 97 us), so their callers leave it off. Reading 4 entries per thread per
// iteration instead of 1 cost the k = 50 cases 2-7% (1024 x 50000, 64 x 151936) and was dropped.
template <typename Ops, bool kSideList>
__device__ typename Ops::Type block_radix_threshold(const typename Ops::Type* buf, int count, int k,
                                                    SelectScratch& s) {
  using Cand = typename Ops::Type;
  static_assert(sizeof(Cand) <= 16, "side list entries are 16 bytes at most");
  Cand* const side = reinterpret_cast<Cand*>(s.side);
  const Cand* src = buf;  // the entries the next pass scans: the buffer, or the side list
  int src_count = count;
  bool fill_side = false;  // block-uniform: the next pass copies what it counts into the side list
  Cand prefix = Ops::none();
  int remaining = k;
  for (int d = 0; d < Ops::kDigits; ++d) {
    for (int i = threadIdx.x; i < 256; i += blockDim.x) s.hist[i] = 0;
    if (threadIdx.x == 0) s.side_count = 0;
    __syncthreads();
    for (int i = threadIdx.x; i < src_count; i += blockDim.x) {
      const Cand c = src[i];
      if (Ops::prefix_matches(c, prefix, d)) {
        atomicAdd(&s.hist[Ops::digit(c, d)], 1);
        if (fill_side) side[atomicAdd(&s.side_count, 1)] = c;
      }
    }
    __syncthreads();
    if (fill_side) {  // s.side_count is reset only after the next barrier: every thread reads it here
      src = side;
      src_count = s.side_count;
      fill_side = false;
    }
    if (threadIdx.x < kWarpSize) {
      const DigitChoice choice = warp_choose_digit(s.hist, remaining);
      if (threadIdx.x == 0) {
        s.digit = choice.digit;
        s.remaining = choice.remaining;
        s.done = choice.done ? 1 : 0;
        s.bucket = choice.bucket;
      }
    }
    __syncthreads();
    prefix = Ops::with_digit(prefix, d, s.digit);
    remaining = s.remaining;
    const bool done = s.done != 0;
    // s.digit/remaining/done/bucket are rewritten only after two more barriers (next iteration), hist and
    // side_count after one.
    if (done) break;
    // The next pass counts exactly the chosen bucket's entries: when they fit, it copies them to the side list.
    if (kSideList && src != side && s.bucket <= kSelectSideEntries) fill_side = true;
  }
  __syncthreads();
  return prefix;
}

// Keeps the entries of buf[0, count) that are at_least(P), packed at the front (order not preserved, but
// every later use is order-independent). `count` must be what every thread read from s.count before this
// call. Returns the new count (also in s.count); ends with a barrier.
template <typename Ops>
__device__ int block_compact(typename Ops::Type* buf, int count, const typename Ops::Type& threshold,
                             SelectScratch& s) {
  using Cand = typename Ops::Type;
  __syncthreads();  // every thread has read s.count
  if (threadIdx.x == 0) s.count = 0;
  __syncthreads();
  for (int base = 0; base < count; base += blockDim.x) {
    const int i = base + threadIdx.x;
    const bool valid = i < count;
    const Cand c = valid ? buf[i] : Ops::none();
    // Writes land below base + blockDim.x: every entry there has been read (this barrier), and later
    // chunks are not written by this one.
    __syncthreads();
    warp_append<Ops>(buf, &s.count, valid && Ops::at_least(c, threshold), c);
  }
  __syncthreads();
  const int kept = s.count;
  __syncthreads();  // every thread has read s.count before anyone appends again
  return kept;
}

// Sorts buf[0, n2) best first; n2 a power of two, entries past the real ones must be Ops::none().
// Starts and ends with a barrier.
template <typename Ops>
__device__ void block_bitonic_sort_desc(typename Ops::Type* buf, int n2) {
  using Cand = typename Ops::Type;
  __syncthreads();
  for (int size = 2; size <= n2; size <<= 1) {
    for (int stride = size >> 1; stride > 0; stride >>= 1) {
      for (int i = threadIdx.x; i < n2 / 2; i += blockDim.x) {
        const int lo = 2 * i - (i & (stride - 1));
        const int hi = lo + stride;
        const bool descending = (lo & size) == 0;  // the last merge (size == n2) is descending everywhere
        const Cand a = buf[lo];
        const Cand b = buf[hi];
        if (descending ? Ops::better(b, a) : Ops::better(a, b)) {
          buf[lo] = b;
          buf[hi] = a;
        }
      }
      __syncthreads();
    }
  }
}

__device__ __forceinline__ int next_pow2_device(int v) {
  int p = 1;
  while (p < v) p <<= 1;
  return p;
}

// The largest sort block_sort_desc keeps in registers: 8 candidates per thread of a 256-thread CTA.
constexpr int kRegisterSortMaxPerThread = 8;

// One compare-exchange of the bitonic network on entry i (its partner is i ^ stride, and `other` its
// value): the entry at the lower index of a pair keeps the better candidate when the block of `size`
// containing it sorts descending ((i & size) == 0), the worse one otherwise.
template <typename Ops>
__device__ __forceinline__ typename Ops::Type bitonic_keep(const typename Ops::Type& mine,
                                                           const typename Ops::Type& other, int i, int size,
                                                           int stride) {
  const bool descending = (i & size) == 0;
  const bool lower = (i & stride) == 0;
  const bool keep_better = lower == descending;
  return Ops::better(mine, other) == keep_better ? mine : other;
}

// The shared-memory slot of thread t's e-th entry inside register_bitonic_sort_desc: t * E + e permuted
// within the thread's E slots so that one warp access to the same e touches 16 distinct 8-byte bank pairs
// (t * E alone makes lanes 16 / E apart collide: a 2E-way conflict for E = 8; H100, session 9: the unswizzled
// sort of 2048 candidates made split_hist 7 us slower than a radix select + shared-memory sort of 1024).
// The partner of an exchange through shared memory (stride >= 32 * E) is thread t ^ (a multiple of 32), whose
// permutation is the same.
template <int E>
__device__ __forceinline__ int sort_slot(int t, int e) {
  static_assert(E >= 1 && E <= 16 && (E & (E - 1)) == 0, "E is a power of two <= 16");
  return t * E + (e ^ ((t / (16 / E)) % E));
}

// Sorts buf[0, n) best first (n a power of two, 32 * E <= n <= E * blockDim.x; entries past the real ones
// must be Ops::none()). Thread t holds entries t*E .. t*E + E - 1 in registers: the exchanges of stride < E
// stay in the thread, those of stride < 32 * E are warp shuffles, and only the longer ones go through shared
// memory (two barriers each). H100: the shared-memory network took ~100 ns per stage in a single CTA
// (10 us for 1024 candidates, session 9's split_hist timeline); n = 1024 needs 6 of its 55 stages here.
// Starts and ends with a barrier; every thread of the block calls it.
template <typename Ops, int E>
__device__ void register_bitonic_sort_desc(typename Ops::Type* buf, int n) {
  using Cand = typename Ops::Type;
  const int t = threadIdx.x;
  const bool active = t * E < n;  // whole warps: n / E is a multiple of 32
  __syncthreads();
  Cand c[E];
#pragma unroll
  for (int e = 0; e < E; ++e) c[e] = active ? buf[sort_slot<E>(t, e)] : Ops::none();  // any bijection will do
  for (int size = 2; size <= n; size <<= 1) {
    for (int stride = size >> 1; stride > 0; stride >>= 1) {
      if (stride >= kWarpSize * E) {  // block-uniform: every thread takes the barriers
        __syncthreads();  // the previous readers of buf are done
        if (active) {
#pragma unroll
          for (int e = 0; e < E; ++e) buf[sort_slot<E>(t, e)] = c[e];
        }
        __syncthreads();
        if (active) {
          const int partner = t ^ (stride / E);
#pragma unroll
          for (int e = 0; e < E; ++e) {
            c[e] = bitonic_keep<Ops>(c[e], buf[sort_slot<E>(partner, e)], t * E + e, size, stride);
          }
        }
      } else if (stride >= E) {
        if (active) {
#pragma unroll
          for (int e = 0; e < E; ++e) {
            const Cand other = Ops::shfl_xor(c[e], stride / E, kWarpSize);
            c[e] = bitonic_keep<Ops>(c[e], other, t * E + e, size, stride);
          }
        }
      } else if (active) {
#pragma unroll
        for (int e = 0; e < E; ++e) {
#pragma unroll
          for (int s = 1; s < E; s <<= 1) {
            if (s == stride && (e & s) == 0) {
              const Cand a = c[e];
              const Cand b = c[e | s];
              const bool descending = ((t * E + e) & size) == 0;
              if (descending ? Ops::better(b, a) : Ops::better(a, b)) {
                c[e] = b;
                c[e | s] = a;
              }
            }
          }
        }
      }
    }
  }
  __syncthreads();  // the last shared-memory step's reads are done
  if (active) {
#pragma unroll
    for (int e = 0; e < E; ++e) buf[t * E + e] = c[e];
  }
  __syncthreads();
}

// Sorts buf[0, count) best first for count <= blockDim.x by rank: thread i counts the entries that rank above
// its own (candidates are distinct: the ranks are 0 .. count - 1) and writes its entry there. Two barriers and
// count broadcast shared loads per thread, where the register bitonic network of 128 entries took 28 dependent
// exchange steps in a loop over run-time strides, 3 of them through shared memory: ~18% of the block kernel's
// stall samples on 1024 x 50000 k50 (H100, session 14 call 9). Starts and ends with a barrier.
template <typename Ops>
__device__ void block_rank_sort_desc(typename Ops::Type* buf, int count) {
  using Cand = typename Ops::Type;
  __syncthreads();  // buf is complete
  const int i = static_cast<int>(threadIdx.x);
  const bool active = i < count;
  const Cand mine = active ? buf[i] : Ops::none();
  int rank = 0;
  if (active) {
    int j = 0;
    // Four independent compares per step: the loads are broadcasts (every lane reads the same entry).
    int above[4] = {0, 0, 0, 0};
    for (; j + 4 <= count; j += 4) {
#pragma unroll
      for (int u = 0; u < 4; ++u) above[u] += Ops::better(buf[j + u], mine) ? 1 : 0;
    }
    for (; j < count; ++j) above[0] += Ops::better(buf[j], mine) ? 1 : 0;
    rank = above[0] + above[1] + above[2] + above[3];
  }
  __syncthreads();  // every thread has read buf
  if (active) buf[rank] = mine;
  __syncthreads();
}

// Sorts buf[0, count) best first (capacity >= max(32, next_pow2(count))): up to one entry per thread by rank,
// in registers where the padded length fits kRegisterSortMaxPerThread per thread, else the shared-memory
// network (entries past count up to the padded length become none). Starts and ends with a barrier.
template <typename Ops>
__device__ void block_sort_desc(typename Ops::Type* buf, int count) {
  const int threads = static_cast<int>(blockDim.x);
  if (count <= threads) {
    block_rank_sort_desc<Ops>(buf, count);
    return;
  }
  const int n = next_pow2_device(count);
  for (int i = count + threadIdx.x; i < n; i += blockDim.x) buf[i] = Ops::none();
  if (n <= 2 * threads) {
    register_bitonic_sort_desc<Ops, 2>(buf, n);
  } else if (n <= 4 * threads) {
    register_bitonic_sort_desc<Ops, 4>(buf, n);
  } else if (n <= kRegisterSortMaxPerThread * threads) {
    register_bitonic_sort_desc<Ops, kRegisterSortMaxPerThread>(buf, n);
  } else {
    block_bitonic_sort_desc<Ops>(buf, n);
  }
}

// Sorts the count (>= k) candidates of buf (capacity >= max(32, next_pow2(count))) and writes the k best as
// probabilities exp(x - max) / sum (renormalised: divided by their fp32/fp64 sum, rounded once) and indices.
template <typename Ops, typename C, typename TOut>
__device__ void write_sorted_topk(typename Ops::Type* buf, int count, int k, const RowStats<C>& stats,
                                  bool renormalize, TOut* values, int64_t* indices, C* reduce_scratch) {
  block_sort_desc<Ops>(buf, count);
  const C divisor = probability_divisor(stats);
  C total = C(1);
  if (renormalize) {
    C local = C(0);
    for (int r = threadIdx.x; r < k; r += blockDim.x) {
      local += exp_precise(OrderKey<C>::value(Ops::key(buf[r])) - stats.max) / divisor;
    }
    total = detail::block_all_reduce(local, reduce_scratch, [](C a, C b) { return a + b; });
  }
  for (int r = threadIdx.x; r < k; r += blockDim.x) {
    const typename Ops::Type c = buf[r];
    const C p = exp_precise(OrderKey<C>::value(Ops::key(c)) - stats.max) / divisor;
    values[r] = detail::convert<TOut>(renormalize ? p / total : p);
    indices[r] = static_cast<int64_t>(Ops::index(c));
  }
}

}  // namespace softmax_ops::topk
