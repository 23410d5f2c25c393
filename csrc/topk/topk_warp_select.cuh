// Selection building blocks of the fused_topk warp kernel (topk_warp.cu): the k rounds of row-wide arg-max
// over a row held in the registers of W lanes, written branch-free so that one round costs a few
// instructions per slot (no owner test, no divergence, no serial 32-step chain).
//
// Two ways to hold a slot, by input type:
//   16-bit inputs (fp16/bf16): one 32-bit word per slot, key16 << 16 | (0xffff - column). The word order is
//     the ranking (NaN first, larger logit, lower column on ties; N <= 1024 < 2^16), words of one row are
//     distinct, and 0 means "empty": a round is a max over the words, and the winner is cleared by equality
//     in every lane.
//   fp32/fp64: the value's order key per slot (the column is implied by the slot). A lane's best is the
//     first maximal key in slot order (= its lowest column), the lanes then compare (key, column) candidates
//     (PackedCand / WideCand), and the owner of the winning column clears that slot.
//
// The threshold pre-filter (both ways): the k-th largest of the W lane maxima is a lower bound of the
// row's k-th best (k lanes hold a value at least that large), so only slots at or above it can be selected.
// With W >= 2k lanes that leaves ~1.3k candidates per row on random logits (numpy, N(0, 9) rows of 64-1024),
// which are moved into kCandidates registers per lane; the k rounds then run over those. A warp where some
// lane has more candidates than registers runs the rounds over every slot instead (exact either way).
#pragma once

#include "topk_device.cuh"

namespace softmax_ops::topk::warp {

// Slots are visited in groups of this many, each group behind a launch-uniform test "does any lane of this
// launch hold a value there" (a branch, not a predicate): 60 or 160 experts cost what 64 or 128 do.
constexpr int kSlotGroup = 4;
// Candidate registers per lane after the pre-filter. Numpy, N(0, 9) rows, W = 2k lanes or more: a lane
// exceeds 4 in 1-2% of the rows of 128-512 columns (k = 8, W = 16), 0.1% with W = 32.
constexpr int kCandidates = 4;
// Below this many slots per lane the full rounds cost about what the filter costs, so it is skipped.
constexpr int kFilterMinSlots = 8;

// ---- 16-bit inputs: one word per slot ----------------------------------------------------------------

// Order key of a half / bfloat16 (both sign-magnitude): NaN highest, -0 as +0, never 0 (a negative NaN is
// canonicalised), so a valid word is >= 2^16.
__device__ __forceinline__ uint32_t order_key16(uint32_t bits, bool is_nan) {
  bits = bits == 0x8000u ? 0u : bits;
  const uint32_t key = (bits & 0x8000u) ? (~bits & 0xffffu) : (bits | 0x8000u);
  return is_nan ? 0xffffu : key;
}

template <typename T16>
__device__ __forceinline__ float value_of_key16(uint32_t key) {
  const uint32_t bits = (key & 0x8000u) ? (key & 0x7fffu) : (~key & 0xffffu);
  if constexpr (std::is_same_v<T16, __half>) {
    return __half2float(__ushort_as_half(static_cast<unsigned short>(bits)));
  } else {
    return __uint_as_float(bits << 16);
  }
}

struct WordCand {
  using Type = uint32_t;
  static __device__ __forceinline__ Type make(uint32_t key16, int column) {
    return (key16 << 16) | (0xffffu - static_cast<uint32_t>(column));
  }
  static __device__ __forceinline__ uint32_t key(Type c) { return c >> 16; }
  static __device__ __forceinline__ uint32_t index(Type c) { return 0xffffu - (c & 0xffffu); }
  static __device__ __forceinline__ Type none() { return 0u; }
  static __device__ __forceinline__ bool better(Type a, Type b) { return a > b; }
  static __device__ __forceinline__ Type shfl_xor(Type c, int lane_mask, int width) {
    return __shfl_xor_sync(kFullMask, c, lane_mask, width);
  }
};

// ---- candidate helpers shared by the three candidate types --------------------------------------------

template <typename Ops>
__device__ __forceinline__ typename Ops::Type best_of(const typename Ops::Type& a, const typename Ops::Type& b) {
  return Ops::better(b, a) ? b : a;
}

__device__ __forceinline__ bool same_cand(uint32_t a, uint32_t b) { return a == b; }
__device__ __forceinline__ bool same_cand(unsigned long long a, unsigned long long b) { return a == b; }
__device__ __forceinline__ bool same_cand(const WideCand::Type& a, const WideCand::Type& b) {
  return a.key == b.key && a.nidx == b.nidx;
}

// The row's best candidate in every one of its W lanes (xor butterfly).
template <typename Ops, int W>
__device__ __forceinline__ typename Ops::Type row_best(typename Ops::Type c) {
#pragma unroll
  for (int offset = W / 2; offset > 0; offset /= 2) c = best_of<Ops>(c, Ops::shfl_xor(c, offset, W));
  return c;
}

// Balanced max tree over N candidates (depth log2 N instead of a chain of N).
template <typename Ops, int N>
__device__ __forceinline__ typename Ops::Type tree_best(const typename Ops::Type (&c)[N]) {
  static_assert((N & (N - 1)) == 0, "tree over a power of two");
  typename Ops::Type level[N];
#pragma unroll
  for (int i = 0; i < N; ++i) level[i] = c[i];
#pragma unroll
  for (int width = N / 2; width > 0; width /= 2) {
#pragma unroll
    for (int i = 0; i < width; ++i) level[i] = best_of<Ops>(level[2 * i], level[2 * i + 1]);
  }
  return level[0];
}

// Moves cand(s) of every slot s (< used_slots) with selected(s) into c (kCandidates registers, empty ones
// Ops::none()). Returns false when this lane has more candidates than registers.
template <typename Ops, int S, typename Selected, typename CandAt>
__device__ __forceinline__ bool gather_candidates(int used_slots, typename Ops::Type (&c)[kCandidates],
                                                  Selected&& selected, CandAt&& cand_at) {
  int count = 0;
#pragma unroll
  for (int i = 0; i < kCandidates; ++i) c[i] = Ops::none();
#pragma unroll
  for (int g = 0; g < S / kSlotGroup; ++g) {
    if (g * kSlotGroup >= used_slots) break;  // launch-uniform
#pragma unroll
    for (int j = 0; j < kSlotGroup; ++j) {
      const int s = g * kSlotGroup + j;
      if (selected(s)) {  // rare: predicated moves, no real branch
#pragma unroll
        for (int i = kCandidates - 1; i > 0; --i) c[i] = c[i - 1];
        c[0] = cand_at(s);
        ++count;
      }
    }
  }
  return count <= kCandidates;
}

// k rounds over the gathered candidates; emit(r, winner) for rank r (winners distinct, best first).
template <typename Ops, int W, typename Emit>
__device__ __forceinline__ void candidate_rounds(typename Ops::Type (&c)[kCandidates], int k, Emit&& emit) {
  for (int r = 0; r < k; ++r) {
    const typename Ops::Type win = row_best<Ops, W>(tree_best<Ops>(c));
    emit(r, win);
#pragma unroll
    for (int i = 0; i < kCandidates; ++i) c[i] = same_cand(c[i], win) ? Ops::none() : c[i];
  }
}

// ---- full rounds over every slot (no pre-filter, or its fallback) ----------------------------------------
static_assert(kSlotGroup == 4, "the per-group trees below are written out for groups of 4");

// The lane's best word over its used slots (0 when it has none).
template <int S>
__device__ __forceinline__ uint32_t lane_best_word(const uint32_t (&word)[S], int used_slots) {
  uint32_t best = 0;
#pragma unroll
  for (int g = 0; g < S / kSlotGroup; ++g) {
    if (g * kSlotGroup >= used_slots) break;  // launch-uniform
    const int s = g * kSlotGroup;
    best = max(best, max(max(word[s], word[s + 1]), max(word[s + 2], word[s + 3])));
  }
  return best;
}

template <int W, int S, typename Emit>
__device__ __forceinline__ void word_rounds(uint32_t (&word)[S], int used_slots, int k, Emit&& emit) {
  for (int r = 0; r < k; ++r) {
    const uint32_t win = row_best<WordCand, W>(lane_best_word(word, used_slots));
    emit(r, win);
#pragma unroll
    for (int g = 0; g < S / kSlotGroup; ++g) {
      if (g * kSlotGroup >= used_slots) break;
#pragma unroll
      for (int j = 0; j < kSlotGroup; ++j) {
        uint32_t& w = word[g * kSlotGroup + j];
        w = w == win ? 0u : w;
      }
    }
  }
}

// (key, slot) of the lane's first maximal key over its used slots; key 0 when it has none.
template <typename Key>
struct KeySlot {
  Key key;
  int slot;
};

// a holds lower slots than b: b wins only when strictly larger (ties stay with the lower column).
template <typename Key>
__device__ __forceinline__ KeySlot<Key> first_max(const KeySlot<Key>& a, const KeySlot<Key>& b) {
  return b.key > a.key ? b : a;
}

template <typename Key, int S>
__device__ __forceinline__ KeySlot<Key> lane_best_key(const Key (&key)[S], int used_slots) {
  KeySlot<Key> best{Key(0), 0};
#pragma unroll
  for (int g = 0; g < S / kSlotGroup; ++g) {
    if (g * kSlotGroup >= used_slots) break;  // launch-uniform
    const int s = g * kSlotGroup;
    const KeySlot<Key> group = first_max(first_max(KeySlot<Key>{key[s], s}, KeySlot<Key>{key[s + 1], s + 1}),
                                         first_max(KeySlot<Key>{key[s + 2], s + 2}, KeySlot<Key>{key[s + 3], s + 3}));
    best = first_max(best, group);
  }
  return best;
}

template <typename Ops, int W, int S, typename Column, typename Emit>
__device__ __forceinline__ void key_rounds(typename Ops::Key (&key)[S], int used_slots, int k, Column&& column,
                                           Emit&& emit) {
  using Key = typename Ops::Key;
  for (int r = 0; r < k; ++r) {
    const KeySlot<Key> mine = lane_best_key(key, used_slots);
    const int my_column = column(mine.slot);
    const typename Ops::Type win =
        row_best<Ops, W>(mine.key == Key(0) ? Ops::none() : Ops::make(mine.key, static_cast<uint32_t>(my_column)));
    emit(r, win);
    // Columns are unique in a row, so the winner's column names its owner lane and slot.
    const int clear_slot = mine.key != Key(0) && Ops::index(win) == static_cast<uint32_t>(my_column) ? mine.slot : -1;
#pragma unroll
    for (int g = 0; g < S / kSlotGroup; ++g) {
      if (g * kSlotGroup >= used_slots) break;
#pragma unroll
      for (int j = 0; j < kSlotGroup; ++j) {
        const int s = g * kSlotGroup + j;
        key[s] = s == clear_slot ? Key(0) : key[s];
      }
    }
  }
}

}  // namespace softmax_ops::topk::warp
