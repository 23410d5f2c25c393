// The chunk producer shared by the block-family fused_topk kernels (topk_block.cu: block, split_row;
// topk_split_hist.cu: split_hist's fallback): one CTA reads a range of a row once, in tiles of kTile elements, the
// next tile's loads in flight (raw 16-byte registers) while the current one is filtered:
//   * the whole tile folds into the thread's online (max, sum) at once (one max check, <= one rescale);
//   * a value joins the shared-memory candidate buffer only if it can still be in the top k: one unordered
//     compare against a bound derived from the threshold key (filter_bound), for 16-bit inputs two values at
//     a time on the raw words (raw_tile_take). Tiles are read in index order, so a later value with the
//     threshold's own key ranks below it (higher index) and is rejected;
//   * a thread appends its tile's passing values with one shared atomic for its slots (Reserve::kPerLane);
//   * one barrier per tile (__syncthreads_count) keeps an upper bound of the buffer's fill; only when the
//     next tile could overflow the buffer is the exact count read, and if needed a block radix select finds
//     the k-th best candidate, the buffer is compacted to the k best and the threshold rises to it;
//   * the first tile gets a threshold at once: a lower bound of the k-th best of the per-thread maxima (the
//     smallest of the warps' ceil(k / W)-th best: at least k distinct values reach it), so a row with small
//     k never floods the buffer; long ranges refresh it after 2, 4, 8, ... tiles, and after the last tile
//     the same floor over the whole range compacts the buffer before the final select.
// Tile layout (T = kBlockThreads, V = 16-byte vector, U = kTile / (T*V) vectors per thread; kTile is kTileElems
// but for long tiles, TopkPlan::long_tiles):
//   vector loads: thread t, step u, element j -> tile offset (u*T + t)*V + j
//   scalar loads: thread t, step u, element j -> tile offset (u*V + j)*T + t      (coalesced per scalar)
// Either way a thread holds U x 16 bytes (scalars packed as a vector load would have read them). Take-mask
// bits: b = u*V + j (valid_mask, candidate; split_hist uses these), except in run() for 16-bit inputs, which
// compares 32-bit words: see kPairs.
// Peeled rows (plan.peel; rows not a whole number of 16-byte vectors, or starting off one): the body of each
// row (RowEdges, device_utils.cuh) is read in vector tiles like an aligned row, and its < 2 V edge values, one
// per thread of the CTA that holds the row's first chunk, enter that CTA's (max, sum) before the first tile and
// its buffer in index order: the head's before the first tile, the tail's after the last (EdgeValue, run<true>).
// Also here: the block-family CTA's static scratch, and the per-row ticket and (max, sum) merge of the kernels
// that split a row over several CTAs.
#pragma once

#include "topk_device.cuh"
#include "topk_launch.h"

namespace softmax_ops::topk {

using detail::RowEdges;
using detail::row_edges_at;

// The bound of the tile filter for threshold key tau_key: !(x <= bound) (one unordered compare) passes
// every x whose key is above tau_key, and nothing that ranks at or below a threshold with a real value.
//   the key's value t is a number: x > t or x NaN. x == t (or -0 vs +0) has t's key and a higher index;
//   a key above +inf's (a NaN threshold, or a radix prefix between +inf and NaN): +inf, so only NaNs pass
//     (including later NaNs ranking below a NaN threshold: harmless extra candidates, the buffer only has
//     to be a superset of the top k);
//   a key below -inf's (0: no threshold yet, or a radix prefix under -inf): NaN, every value passes.
template <typename C>
__device__ __forceinline__ C filter_bound(typename OrderKey<C>::Key tau_key) {
  const C t = OrderKey<C>::value(tau_key);
  if (t == t) return t;
  const C inf = static_cast<C>(INFINITY);
  return tau_key > OrderKey<C>::of(inf) ? inf : quiet_nan<C>();
}

// One edge value of a peeled row, held by one thread of the CTA that holds the row's edges (edge_value).
template <typename C>
struct EdgeValue {
  C value;
  uint32_t column;
  int count = 0;  // the row's edge values in this CTA (the same in every thread; 0: it holds none)
  int head = 0;   // ... of which the first `head` (threads 0 .. head - 1) precede the body, the rest follow it
};

// Thread threadIdx.x's edge value of the row starting at `row` (edge number threadIdx.x: the head's first,
// then the tail's), where `holds_edges`; none elsewhere.
template <typename TIn, int V>
__device__ __forceinline__ EdgeValue<compute_t<TIn>> edge_value(const TIn* row, const RowEdges<V>& edges,
                                                                bool holds_edges) {
  EdgeValue<compute_t<TIn>> e;
  e.count = holds_edges ? edges.count() : 0;
  e.head = holds_edges ? edges.head : 0;
  const int t = static_cast<int>(threadIdx.x);
  if (t < e.count) {
    e.column = static_cast<uint32_t>(edges.column(t));
    e.value = load_scalar(row + e.column);
  }
  return e;
}

// kVectorLoads: the rows are 16-byte aligned (see the layout above). A template parameter so that every
// tile offset is the thread's base plus a constant: as a run-time flag the compiler kept the 16 offsets of
// both layouts in registers across the tile loop. kTile: elements per tile (a thread holds kTile / T of them,
// at most 32: one take-mask bit each).
template <typename TIn, bool kVectorLoads, int kTile = kTileElems>
struct ChunkTopk {
  using C = compute_t<TIn>;
  using Ops = CandFor<C>;
  using Cand = typename Ops::Type;
  using Key = typename OrderKey<C>::Key;
  static constexpr int V = 16 / sizeof(TIn);
  static constexpr int U = kTile / (kBlockThreads * V);
  static constexpr int kTileLen = kTile;    // for callers that walk the tiles themselves (split_hist)
  static constexpr int kPerThread = U * V;  // values of one thread per tile, one take-mask bit each
  static_assert(U >= 1 && U * kBlockThreads * V == kTile, "tile must be a whole number of vectors");
  static_assert(kPerThread <= 32 && (kPerThread & (kPerThread - 1)) == 0, "one mask bit per value");
  // Keep the next tile in flight while filtering this one (U x 16 bytes of registers more) where it fits in
  // 64 registers: 16-byte loads of 2- and 4-byte types. The scalar-load fallback (misaligned rows) needs a
  // register per value before packing, and float64 values take two: with prefetch both spilled (ptxas).
  static constexpr bool kPrefetch = kVectorLoads && sizeof(TIn) <= 4;
  // Ranges of at least this many tiles refresh the floor from the running maxima (run). H100, session 13
  // (*session13-c8-*): block 1024 x 50000 k50 (13 tiles) -6..-7%, 64 x 151936 k50 (37) -11..-15%, 256 x 32768
  // k64 (8) -5%; split_row's 5-tile chunks of 64 x 151936 +1..+3% (two more barriers than tiles they help).
  // Counted in tiles of either length: long tiles refreshing from 4 (32768 elements, as short ones do) lost
  // 2.5-5% on split_row chunks of 4-5 long tiles and nothing changed on block rows (session 30 call 7).
  static constexpr int kRefreshMinTiles = 8;
  // block_radix_threshold's side list pays for 16-bit inputs only (see there).
  static constexpr bool kSideList = sizeof(TIn) == 2;

  // A thread's share of a tile as loaded: U x 16 bytes of TIn.
  struct RawTile {
    uint4 w[U];
  };

  static __device__ __forceinline__ int tile_offset(int u, int j) {
    return kVectorLoads ? (u * kBlockThreads + static_cast<int>(threadIdx.x)) * V + j
                        : (u * V + j) * kBlockThreads + static_cast<int>(threadIdx.x);
  }
  static __device__ __forceinline__ int tile_offset(int b) {
    return tile_offset(b / V, b % V);
  }

  // The column of the value at `offset` in the tile starting at t0, in unsigned arithmetic: for padding
  // slots of a row's last tile near N = 2^31 - 1 the int sum would overflow (undefined behaviour, though
  // those candidates are masked out).
  static __device__ __forceinline__ uint32_t column(int t0, int offset) {
    return static_cast<uint32_t>(t0) + static_cast<uint32_t>(offset);
  }

  // Issues the loads of the tile at x (pads at offsets >= valid are -inf). With vector loads, valid is a
  // multiple of V.
  // kStream: evict-first loads (the data is read once); split_hist's first launch keeps the row in L2 for
  // its second.
  template <bool kStream = true>
  static __device__ __forceinline__ void load_tile(const TIn* x, int valid, RawTile& t) {
    constexpr ElementBits<TIn> kPad = neg_inf_bits<TIn>();
    if (kVectorLoads && valid >= kTile) {  // a whole tile: no predicates, no padding moves
#pragma unroll
      for (int u = 0; u < U; ++u) t.w[u] = load_raw16<TIn, kStream>(x + tile_offset(u, 0));
      return;
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if constexpr (kVectorLoads) {
        const int off = tile_offset(u, 0);
        t.w[u] = off < valid ? load_raw16<TIn, kStream>(x + off) : neg_inf_raw16<TIn>();
      } else {
        ElementBits<TIn> e[V];
#pragma unroll
        for (int j = 0; j < V; ++j) {
          const int off = tile_offset(u, j);
          e[j] = off < valid ? element_bits(kStream ? __ldcs(x + off) : x[off]) : kPad;
        }
        t.w[u] = pack_raw16<TIn>(e);
      }
    }
  }

  // The whole tile at once (one max check, at most one rescale). float64 folds per vector: its libm exp
  // over 16 values at once spilled (ptxas), and its rescale factors are exact enough either way.
  static __device__ __forceinline__ void fold_tile_stats(RowStats<C>& stats, const C (&v)[U][V]) {
    if constexpr (std::is_same_v<C, double>) {
#pragma unroll
      for (int u = 0; u < U; ++u) fold_stats(stats, v[u]);
    } else {
      fold_stats(stats, v);
    }
  }

  static __device__ __forceinline__ void unpack_tile(const RawTile& t, C (&v)[U][V]) {
#pragma unroll
    for (int u = 0; u < U; ++u) unpack_raw16<TIn>(t.w[u], v[u]);
  }

  // Bits of the values at offsets < valid (all of them except in a row's or chunk's last tile).
  static __device__ __forceinline__ uint32_t valid_mask(int valid) {
    uint32_t mask = 0;
#pragma unroll
    for (int b = 0; b < kPerThread; ++b) {
      if (tile_offset(b) < valid) mask |= 1u << b;
    }
    return mask;
  }

  // ---- run()'s view of a tile: the raw 16-byte words, unpacked only where a value's float is needed ----
  // 16-bit types take the tile's maximum and the filter two values at a time from the raw 32-bit words
  // (VHMNMX / HSET2 on sm_90, for 4096-element tiles: 7 instructions for the maximum of 16 values instead of 15,
  // 16 for the take mask instead of ~41; long tiles twice that), so their take-mask bit of value (u, j) is
  // pair_bit(u, j): word u * 4 + j / 2, the word's low value in the low 16 bits, its high value 16 bits above.
  // Other types: bit u * V + j (valid_mask's and candidate's layout, which split_hist also uses).
  static constexpr bool kPairs = sizeof(TIn) == 2;
  static_assert(!kPairs || U * 4 <= 16, "16 words per thread at most: one low and one high mask bit each");
  static __device__ __forceinline__ constexpr int pair_bit(int u, int j) { return (j % 2) * 16 + u * 4 + j / 2; }
  using Pair = std::conditional_t<std::is_same_v<TIn, __half>, __half2, __nv_bfloat162>;

  static __device__ __forceinline__ Pair as_pair(uint32_t w) { return *reinterpret_cast<const Pair*>(&w); }

  static __device__ __forceinline__ void words_of(const RawTile& t, uint32_t (&w)[U][4]) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      w[u][0] = t.w[u].x;
      w[u][1] = t.w[u].y;
      w[u][2] = t.w[u].z;
      w[u][3] = t.w[u].w;
    }
  }

  // The largest value of the tile (pads are -inf), skipping NaNs as fmax does: a number or -inf, also for a
  // tile of NaNs only (the maxima floor ranks these maxima).
  static __device__ __forceinline__ C raw_tile_max(const RawTile& t) {
    if constexpr (kPairs) {
      uint32_t w[U][4];
      words_of(t, w);
      Pair m = as_pair(w[0][0]);
#pragma unroll
      for (int i = 1; i < U * 4; ++i) m = __hmax2(m, as_pair(w[i / 4][i % 4]));
      return fmaxf(fmaxf(__low2float(m), __high2float(m)), -INFINITY);
    } else {
      C v[U][V];
      unpack_tile(t, v);
      C m = neg_inf<C>();
#pragma unroll
      for (int u = 0; u < U; ++u) {
#pragma unroll
        for (int j = 0; j < V; ++j) m = fmax(m, v[u][j]);
      }
      return m;
    }
  }

  // fold_tile_stats with the tile's maximum known (float64 keeps its per-vector fold).
  static __device__ __forceinline__ void fold_raw_tile(RowStats<C>& stats, const RawTile& t, C tile_max) {
    C v[U][V];
    unpack_tile(t, v);
    if constexpr (std::is_same_v<C, double>) {
      fold_tile_stats(stats, v);
    } else {
      fold_stats(stats, v, tile_max);
    }
  }

  // Mask of the values that pass filter bound `bound` (filter_bound's form: !(x <= bound)). For 16-bit types
  // the bound rounded down to TIn decides the same for every TIn value x (x <= b iff x <= round_down(b); NaN
  // stays NaN, so every value passes), compared two at a time (GTU: greater or unordered).
  static __device__ __forceinline__ uint32_t raw_tile_take(const RawTile& t, C bound) {
    if constexpr (kPairs) {
      Pair b;
      if constexpr (std::is_same_v<TIn, __half>) {
        b = __half2half2(__float2half_rd(bound));
      } else {
        b = __bfloat162bfloat162(__float2bfloat16_rd(bound));
      }
      uint32_t w[U][4];
      words_of(t, w);
      uint32_t take = 0;
      // Word i = u * 4 + p holds values (u, 2p) and (u, 2p + 1): pair_bit i and i + 16.
#pragma unroll
      for (int i = 0; i < U * 4; ++i) take |= __hgtu2_mask(as_pair(w[i / 4][i % 4]), b) & (0x00010001u << i);
      return take;
    } else {
      C v[U][V];
      unpack_tile(t, v);
      return tile_take(v, bound);
    }
  }

  // valid_mask in run()'s layout.
  static __device__ __forceinline__ uint32_t raw_valid_mask(int valid) {
    if constexpr (kPairs) {
      uint32_t mask = 0;
#pragma unroll
      for (int u = 0; u < U; ++u) {
#pragma unroll
        for (int j = 0; j < V; ++j) {
          if (tile_offset(u, j) < valid) mask |= 1u << pair_bit(u, j);
        }
      }
      return mask;
    } else {
      return valid_mask(valid);
    }
  }

  // The candidate of take-mask bit b in run()'s layout (pair_bit's inverse for 16-bit types).
  static __device__ __forceinline__ Cand raw_candidate(const RawTile& t, int b, int t0) {
    if constexpr (kPairs) {
      const unsigned bit = static_cast<unsigned>(b);
      const unsigned word = bit % 16u;
      const unsigned high = bit / 16u;
      uint32_t w[U][4];
      words_of(t, w);
      const uint32_t both = pick(w, static_cast<int>(word));
      const uint32_t bits = high ? both >> 16 : both & 0xffffu;
      float value;
      if constexpr (std::is_same_v<TIn, __half>) {
        value = __half2float(__ushort_as_half(static_cast<unsigned short>(bits)));
      } else {
        value = __uint_as_float(bits << 16);
      }
      const int offset = tile_offset(static_cast<int>(word / 4u), static_cast<int>((word % 4u) * 2u + high));
      return Ops::make(OrderKey<C>::of(value), column(t0, offset));
    } else {
      C v[U][V];
      unpack_tile(t, v);
      return candidate(v, b, t0);
    }
  }

  // A NaN threshold (rows with >= k NaNs): the unordered compare would pass every later NaN, each tile a
  // compaction; later NaNs rank below it, so nothing passes.
  static __device__ __forceinline__ bool is_nan_key(Key key) { return key == OrderKey<C>::of(quiet_nan<C>()); }

  static __device__ __forceinline__ Cand candidate(const C (&v)[U][V], int b, int t0) {
    const unsigned bit = static_cast<unsigned>(b);  // unsigned: b / V and b % V without sign fix-ups
    const int offset = tile_offset(static_cast<int>(bit / V), static_cast<int>(bit % V));
    return Ops::make(OrderKey<C>::of(pick(v, b)), column(t0, offset));
  }

  // The first tile's filter bound (filter_bound's form: !(x <= bound) passes), below which no value of the
  // range can be among its k best, from each thread's maximum over the tile, `mine` (pads are -inf): each warp
  // takes the ceil(k / W)-th largest of its lanes' maxima (kth_largest_across_lanes; W warps); the smallest
  // of those is reached by at least W * ceil(k / W) >= k distinct values. The maxima are numbers or -inf
  // (fmax drops NaN): the bound is the float just below that value (values equal to it pass), or NaN
  // (everything passes) when it is -inf, or when k > kBlockThreads. One CTA barrier, after which s.count == 0
  // is visible to every thread. The exact k-th maximum by a block radix select cost ~3 barriers per digit
  // pass (up to 8) on every row (see benchmarks/notes-topk-tuning.md, session 13).
  static __device__ C first_tile_bound(C mine, int k, SelectScratch& s) {
    if (k > kBlockThreads) {
      __syncthreads();
      return quiet_nan<C>();
    }
    return maxima_floor_bound(mine, k, s);
  }

  // first_tile_bound's floor from each thread's maximum `mine` over any part of the range seen so far
  // (a number or -inf). k <= kBlockThreads. One CTA barrier; callers separate calls by another.
  static __device__ C maxima_floor_bound(C mine, int k, SelectScratch& s) {
    constexpr int kWarps = kBlockThreads / kWarpSize;
    static_assert(kWarps <= 32, "one warp_floor slot per warp");
    // float64 maxima rounded down: the float floor stays at or below the values that reach it.
    float m = static_cast<float>(mine);
    if constexpr (std::is_same_v<C, double>) m = __double2float_rd(mine);
    const int rank = (k + kWarps - 1) / kWarps;  // 1..kWarpSize
    const float warp_floor = kth_largest_across_lanes<kWarpSize>(m, rank);
    if (threadIdx.x % kWarpSize == 0) s.warp_floor[threadIdx.x / kWarpSize] = warp_floor;
    __syncthreads();  // the next call's writes come after another barrier: no barrier after the reads
    float floor = s.warp_floor[0];
#pragma unroll
    for (int w = 1; w < kWarps; ++w) floor = fminf(floor, s.warp_floor[w]);
    if (!(floor > -INFINITY)) return quiet_nan<C>();
    if constexpr (std::is_same_v<C, double>) {
      return nextafter(static_cast<double>(floor), -static_cast<double>(INFINITY));
    } else {
      return nextafterf(floor, -INFINITY);
    }
  }

  // The tighter of two filter bounds (NaN: no bound).
  static __device__ __forceinline__ C tighter_bound(C a, C b) { return a != a || b > a ? b : a; }

  // Mask of the values that pass the running threshold: one unordered compare each (filter_bound).
  static __device__ __forceinline__ uint32_t tile_take(const C (&v)[U][V], C bound) {
    uint32_t take = 0;
#pragma unroll
    for (int u = 0; u < U; ++u) {
#pragma unroll
      for (int j = 0; j < V; ++j) {
        if (!(v[u][j] <= bound)) take |= 1u << (u * V + j);
      }
    }
    return take;
  }

  // The top min(k, hi - lo) candidates of row x over [lo, hi) (unordered) into buf[0, count), and this
  // thread's (max, sum) over its share. Returns count. When the chunk held more than max(k, keep) candidates,
  // they are selected down to the k best and *kth (every thread) gets a radix prefix that exactly those k
  // reach; else all of them stay (a superset of the k best: keep > k is for a caller that sorts them anyway)
  // and *kth is left alone.
  // cap >= candidate_capacity(k, kTile). Positions are 32-bit (the launcher limits rows to 2^31 - 1 elements); x is
  // the row's first element. Ends with a barrier.
  // kEdges (peeled rows): `edge` (edge_value) joins this thread's (max, sum) before the first tile, and the
  // buffer unfiltered (it only has to hold a superset of the k best; every floor below is reached by k distinct
  // values of the row either way, a thread's maximum being one of its values) in index order: a head value before
  // the first tile, a tail value after the last. The filter rejects a later value with the threshold's own key
  // because the threshold came earlier in the row: a tail value in the buffer from the start broke that (a body
  // value tied with a tail threshold ranks above it). Until then the tail waits in the buffer's last V - 1 slots.
  //
  // Overflow: before every tile s.count <= cap - kTile holds, since a tile appends at most kTile.
  // `fill_bound` (the same in every thread) bounds s.count from above: each thread that appended anything
  // added at most kPerThread. Only when it passes cap - kTile (the next tile could overflow) is the
  // exact count read (two barriers) and the buffer compacted if needed. With k = 50 (cap - kTile =
  // 2098) and ~13 candidates per 4096-element tile, that is about every 10th tile instead of every tile (long
  // tiles: every 2nd or 3rd, a bound twice as loose per appending thread).
  template <bool kEdges = false>
  static __device__ int run(const TIn* __restrict__ x, int lo, int hi, int k, Cand* buf, int cap,
                            SelectScratch& s, RowStats<C>& stats, Cand* kth, int keep = 0,
                            EdgeValue<C> edge = {}) {
    static_assert(!kEdges || kPrefetch, "peeled rows: vector tiles, the next one in flight");
    stats = empty_stats<C>();
    if (threadIdx.x == 0) s.count = 0;
    C bound = quiet_nan<C>();
    bool closed = false;  // the threshold is a NaN: no later value can rank above it
    int fill_bound = 0;
    const bool refresh = k <= kBlockThreads && hi - lo >= kRefreshMinTiles * kTile;
    // The tile to load next, as a pointer bumped once per tile: recomputed from x and t0, its 64-bit address
    // took ~20 instructions per tile (SASS).
    const TIn* next_x = x + lo;
    RawTile next;
    if constexpr (kPrefetch) load_tile(next_x, min(hi - lo, kTile), next);
    if constexpr (kEdges) {
      // After the first tile's loads are issued: in front of them, waiting for the edge's load cost a second
      // DRAM latency per CTA (H100, session 20 call 1: 4096 x 4095 k32 fp32 +10%, one tile per row).
      // The head's < V values, unfiltered: within the room the overflow invariant below keeps for k + slack. The
      // first tile's barrier (first_tile_bound) publishes them and the count before any append. Through the
      // first tile's filter instead (one more take-mask bit), the tile loop's extra work cost more than the
      // candidates it saved: 1024 x 50257 k50 fp16 60.2 us against 58.7 (session 20 calls 2, 3).
      // The tail's values wait in the buffer's last V - 1 slots, which the tile loop leaves alone (loop_cap):
      // kept in registers through the loop instead, they cost the fp32 split_row instance 12 more bytes of
      // spills and 2-3% (H100, session 21 call 1).
      const int t = static_cast<int>(threadIdx.x);
      if (t < edge.count) {
        const C one[1] = {edge.value};
        fold_stats(stats, one);
        const int slot = t < edge.head ? t : cap - (V - 1) + (t - edge.head);
        buf[slot] = Ops::make(OrderKey<C>::of(edge.value), edge.column);
      }
      if (t == 0) s.count = edge.head;
      fill_bound = edge.head;
    }
    // The buffer's room for the tile loop: a peeled row's tail holds the last V - 1 slots until after the loop.
    const int loop_cap = kEdges ? cap - (V - 1) : cap;
    // Leaves through the break after the last tile (lo < hi), before t0 + kTile could pass 2^31 - 1.
    for (int t0 = lo;; t0 += kTile) {
      const int valid = min(hi - t0, kTile);
      const bool more = hi - t0 > kTile;
      RawTile cur;
      if constexpr (kPrefetch) {
        cur = next;
        next_x += kTile;
        // The next tile's loads fly while this one is folded, filtered and appended (and during its barrier).
        if (more) load_tile(next_x, min(hi - t0 - kTile, kTile), next);
      } else {
        load_tile(next_x, valid, cur);
        next_x += kTile;
      }
      const C tile_max = raw_tile_max(cur);
      if (t0 == lo) bound = first_tile_bound(tile_max, k, s);
      fold_raw_tile(stats, cur, tile_max);
      // The floor again from the running maxima after 2, 4, 8, ... tiles of a range of at least
      // kRefreshMinTiles: each doubling of the values behind the maxima about halves the values of later tiles
      // that pass it (fewer appends and compactions).
      const int tile = (t0 - lo) / kTile;
      if (refresh && tile >= 2 && (tile & (tile - 1)) == 0) {
        bound = tighter_bound(bound, maxima_floor_bound(stats.max, k, s));
      }

      uint32_t take = closed ? 0u : raw_tile_take(cur, bound);
      if (valid < kTile) take &= raw_valid_mask(valid);
      const int appended = append_selected<Ops, Reserve::kPerLane>(buf, &s.count, take,
                                                [&](int b) { return raw_candidate(cur, b, t0); });
      if (!more) break;  // the final selection below reads the exact count
      fill_bound += kPerThread * __syncthreads_count(appended > 0);
      if (fill_bound > loop_cap - kTile) {
        const int count = s.count;
        if (count > loop_cap - kTile) {
          const Cand threshold = block_radix_threshold<Ops, kSideList>(buf, count, k, s);
          fill_bound = block_compact<Ops>(buf, count, threshold, s);
          bound = filter_bound<C>(Ops::key(threshold));
          closed = is_nan_key(Ops::key(threshold));
        } else {
          __syncthreads();  // every thread has read s.count before the next tile appends
          fill_bound = count;
        }
      }
    }
    Cand tail_value;
    const int tail = kEdges ? edge.count - edge.head : 0;
    if constexpr (kEdges) {
      if (static_cast<int>(threadIdx.x) < tail) tail_value = buf[loop_cap + threadIdx.x];
    }
    __syncthreads();
    int count = s.count;
    if constexpr (kEdges) {
      // The tail's values behind every body value (moved down: the two ranges may overlap, hence the read above
      // the barrier).
      if (static_cast<int>(threadIdx.x) < tail) buf[count + threadIdx.x] = tail_value;
      count += tail;
      __syncthreads();  // the tail is visible to the selection below, and every thread has read s.count
      if (threadIdx.x == 0) s.count = count;  // callers that append again (split_row's merge) start behind it
    }
    // The final floor from the threads' maxima over the whole range (maxima_floor_bound: >= k distinct values
    // reach it) drops most candidates the earlier, looser floors let in: on 50000-column rows with k = 50 ~400
    // candidates become ~100 (a numpy model of this loop), so the block kernel sorts them outright instead of
    // a radix select (~3.5 digit passes of ~3 barriers on every row: a quarter of its stall samples, ncu).
    if (count > k && count > keep && k <= kBlockThreads) {
      const C floor_bound = maxima_floor_bound(stats.max, k, s);
      // Keeps every candidate whose value is above the bound: keys above the bound's (NaN's key is the top).
      if (floor_bound == floor_bound) {
        count = block_compact<Ops>(buf, count, Ops::make(OrderKey<C>::of(floor_bound) + 1, ~0u), s);
      }
    }
    if (count > k && count > keep) {
      const Cand threshold = block_radix_threshold<Ops, kSideList>(buf, count, k, s);
      count = block_compact<Ops>(buf, count, threshold, s);
      *kth = threshold;
    } else {
      __syncthreads();  // every thread has read s.count before anyone appends again
    }
    return count;
  }
};

// CTAs per SM the register budget is set for: 4 is what the ~51 KB candidate buffer of k <= ~500 allows
// anyway (64 registers per thread); float64 (twice the registers per value, not a speed target) gets 2.
template <typename TIn>
constexpr int kBlockMinCtasPerSm = sizeof(TIn) == 8 ? 2 : 4;

// Static shared memory of the block-family kernels (kept under kBlockStaticSmem).
template <typename C>
struct BlockScratch {
  SelectScratch select;
  RowStats<C> stats[kBlockThreads / kWarpSize];
  C sums[kBlockThreads / kWarpSize];
  int merges;  // split_row: this CTA took its row's last ticket
};

// Makes this CTA's workspace writes visible device-wide, then takes a ticket of its row. True (in every
// thread) for the CTA that took the row's last ticket: every other chunk's results are then visible to it.
// One thread's acquire-release atomic after a CTA barrier, instead of a fence in every thread: the barrier
// orders the CTA's writes before the release (the PTX memory model's causality order is cumulative), and the
// barrier after it orders every thread's later reads after the acquire. The workspace is read with ld.cg
// (L2), never through a possibly stale L1. H100, 2026-11-22 (*session15-c3-compare-ticket*): split_hist
// 1 x 128256 k50 -3..-9%, split_row 8 x 65536 k16 -2.5%, the other split shapes -0.1..-1%.
__device__ __forceinline__ bool took_last_ticket(unsigned* ticket, int splits, int* merges) {
  __syncthreads();
  if (threadIdx.x == 0) {
    unsigned before;
    asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], 1;" : "=r"(before) : "l"(ticket) : "memory");
    *merges = before == static_cast<unsigned>(splits - 1) ? 1 : 0;
  }
  __syncthreads();
  return *merges != 0;
}

// The merging CTA: the row's (max, sum) from every chunk in chunk order (thread t merges chunks t, t + T,
// ... then the fixed block tree: the same bits whichever CTA merges).
template <typename C>
__device__ RowStats<C> merged_row_stats(const RowStats<C>* chunk_stats, int splits, RowStats<C>* scratch) {
  RowStats<C> stats = empty_stats<C>();
#pragma unroll 1
  for (int part = threadIdx.x; part < splits; part += blockDim.x) {
    stats = merge_stats(stats, load_stats_cg(chunk_stats + part));
  }
  return block_merge_stats(stats, scratch);
}

}  // namespace softmax_ops::topk
