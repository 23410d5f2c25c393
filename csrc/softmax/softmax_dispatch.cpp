// choose_softmax_kernel: the rules that apply the softmax family's ONE table of heuristics (softmax_heuristics.h).
#include "softmax_dispatch.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <mutex>
#include <optional>
#include <tuple>

#include "softmax_heuristics.h"

namespace softmax_ops {
namespace {

constexpr const char* kKernelNames[kNumSoftmaxKernels] = {"warp",     "block_onepass", "cluster_onepass", "grid_onepass",
                                                          "two_pass", "split_row",     "strided"};

int dtype_bytes(DType dtype) {
  switch (dtype) {
    case DType::kFloat16:
    case DType::kBFloat16:
      return 2;
    case DType::kFloat64:
      return 8;
    case DType::kFloat32:
      break;
  }
  return 4;
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
int64_t round_up(int64_t a, int64_t b) { return ceil_div(a, b) * b; }
int64_t pow2_ceil(int64_t v) {
  int64_t p = 1;
  while (p < v) p *= 2;
  return p;
}
int64_t pow2_floor(int64_t v) {
  int64_t p = 1;
  while (p * 2 <= v) p *= 2;
  return p;
}

std::string kib(int64_t bytes) {
  if (bytes >= 1024 * 1024) return std::to_string((bytes + 512 * 1024) / (1024 * 1024)) + " MB";
  if (bytes >= 1024) return std::to_string((bytes + 512) / 1024) + " KB";
  return std::to_string(bytes) + " B";
}

// Per-problem quantities every rule reads.
struct Geometry {
  int streams;         // input arrays read per element: 1 forward, 2 backward
  int in_bytes;
  bool widening;       // a forward whose result is wider than its input (16-bit -> float32), in 16-byte packs
  int vec;             // elements per pack
  bool peel;           // 16-byte packs for a row whose length or start breaks them: its aligned body (n_packs is
                       // the longest body's) plus single edge elements (plan.peel)
  bool body;           // the longest aligned body planned as if it were the row, to be run peeled (RowView::kBody)
  int max_edges;       // peel: edge elements a row of this launch has at most (max_row_edges), else 0
  int pack_bytes;      // bytes per pack of one stream
  int64_t n_packs;     // packs per row
  int64_t rows;
  int64_t row_bytes;   // bytes of one row, all streams: what a one-pass kernel caches
  int max_reg_packs;   // block kernel register cache (max_block_reg_packs)
};

bool whole_packs(const SoftmaxRequest& request) {
  const SoftmaxProblem& p = request.problem;
  return p.inner == 1 && request.vector_aligned && p.n % (16 / dtype_bytes(p.in_dtype)) == 0;
}

// Rows that break 16-byte packs but can be read peeled: the reduced dim last, every pointer in one element phase.
// That phase is 0: the output is a fresh allocation (the caching allocator's blocks start 512-byte aligned). The
// launchers check the pointers they are given against the plan (softmax_warp.cu: max_row_edges).
constexpr int64_t kPeeledFirstPhase = 0;
bool peelable(const SoftmaxRequest& request) {
  return request.problem.inner == 1 && request.rows_share_phase && !whole_packs(request);
}

// How the plans see a row: kNatural, whole 16-byte packs where every row allows them, else single elements;
// kPeeled (a peelable request), 16-byte packs of each row's aligned body, run peeled; kBody, the longest
// aligned body alone as if it were the row (Chooser::peel_few_rows: the whole-pack rules' plan, then peeled).
enum class RowView { kNatural, kPeeled, kBody };

Geometry geometry_of(const SoftmaxRequest& request, RowView view = RowView::kNatural) {
  const SoftmaxProblem& p = request.problem;
  Geometry g;
  g.streams = p.backward ? 2 : 1;
  g.in_bytes = dtype_bytes(p.in_dtype);
  const int vec16 = 16 / g.in_bytes;
  const bool body = view != RowView::kNatural && peelable(request);
  g.peel = body && view == RowView::kPeeled;
  g.body = body && view == RowView::kBody;
  g.vec = whole_packs(request) || body ? vec16 : 1;
  // Only rows read in 16-byte packs (whole or peeled): the widening rules were measured on those, and their
  // thresholds count packs (single elements would meet a pack threshold 8x sooner).
  g.widening = !p.backward && dtype_bytes(p.out_dtype) > g.in_bytes && g.vec > 1;
  g.pack_bytes = g.vec * g.in_bytes;
  g.max_edges = g.peel ? max_row_edges(kPeeledFirstPhase, p.n, p.rows(), vec16) : 0;
  g.n_packs = body ? p.n / g.vec : ceil_div(p.n, g.vec);  // a body: the longest one (a row with no head)
  g.rows = p.rows();
  g.row_bytes = p.n * g.in_bytes * g.streams;
  g.max_reg_packs = max_block_reg_packs(p.in_dtype, p.backward);
  return g;
}

// Threads of a CTA that holds `packs` packs at `reg_packs` per thread: whole warps.
int64_t cta_threads(int64_t packs, int reg_packs) { return round_up(ceil_div(packs, reg_packs), 32); }

// CTAs of `threads` threads that one SM holds by its thread count (at least one).
int64_t ctas_per_sm(const DeviceProps& props, int64_t threads) {
  return std::max<int64_t>(1, props.max_threads_per_sm / threads);
}

// ... and by the SM's resident-CTA limit too (32 on Hopper): the CTAs of one wave. ctas_per_sm leaves that limit out
// (64 CTAs of 32 threads). The grid caps built on it (grid_cap) keep it: capping them would move 1156 of
// explain_snapshot's plans (CTAs under 64 threads get half the grid), none of them measured (session 40).
int64_t resident_ctas_per_sm(const DeviceProps& props, int64_t threads) {
  return std::min<int64_t>(ctas_per_sm(props, threads), props.max_ctas_per_sm);
}

// CTAs launched at most: kGridWaves waves of the CTAs that fit on the device at once.
int64_t grid_cap(const DeviceProps& props, int threads) {
  return std::max<int64_t>(1, props.sm_count * ctas_per_sm(props, threads) * Heuristics::kGridWaves);
}

// ---- kernel plans ---------------------------------------------------------------------------------

int widening_short_row_packs(const Geometry& g, const DeviceProps& props) {
  const bool many_rows = g.rows >= Heuristics::kWideningManyRowsPerSm * props.sm_count;
  return many_rows ? Heuristics::kWarpShortRowPacksWideningManyRows : Heuristics::kWarpShortRowPacksWidening;
}

SoftmaxPlan plan_warp(const Geometry& g, const DeviceProps& props) {
  SoftmaxPlan plan;
  plan.kernel = SoftmaxKernel::kWarp;
  plan.vec = g.vec;
  plan.peel = g.peel;
  plan.threads = kWarpKernelThreads;
  if (g.n_packs <= 32) {
    // Short rows (MoE routers, N = 8..256): up to kWarpShortRowPacks packs per lane and just enough lanes,
    // so a warp holds several rows. One pack per lane (the first version) put only 512 bytes per warp in
    // flight: fp16 x 256 columns reached 0.67 of copy on H200, fp32 (2 packs per lane) 0.98.
    // 16-bit forward rows by their pack count (the backward and widening rows have their own rules, taken first).
    const auto unpeeled_16bit_of = [&](int64_t min_packs, int64_t max_packs) {
      return g.in_bytes == 2 && !g.peel && g.n_packs >= min_packs && g.n_packs <= max_packs;
    };
    const bool full_16bit_row =
        unpeeled_16bit_of(Heuristics::kWarpFullRowMinPacks16, Heuristics::kWarpFullRowMaxPacks16);
    const bool one_pack_16bit_row =
        g.vec > 1 && unpeeled_16bit_of(Heuristics::kWarpOnePackMinPacks16, Heuristics::kWarpOnePackMaxPacks16) &&
        pow2_ceil(g.n_packs) - g.n_packs <= Heuristics::kWarpOnePackMaxIdleLanes;
    const int short_packs = g.streams == 2        ? Heuristics::kWarpShortRowPacksBackward
                            : g.in_bytes == 4     ? Heuristics::kWarpShortRowPacksFloat
                            : g.widening && !g.peel ? widening_short_row_packs(g, props)
                            : full_16bit_row      ? Heuristics::kWarpFullRowPacks16
                            : one_pack_16bit_row  ? 1
                                                  : Heuristics::kWarpShortRowPacks;
    plan.reg_packs = static_cast<int>(std::min<int64_t>(short_packs, pow2_ceil(std::max<int64_t>(g.n_packs, 1))));
    plan.lanes_per_row = static_cast<int>(pow2_ceil(ceil_div(std::max<int64_t>(g.n_packs, 1), plan.reg_packs)));
  } else {
    plan.lanes_per_row = 32;
    plan.reg_packs = static_cast<int>(pow2_ceil(ceil_div(g.n_packs, 32)));
  }
  // A peeled row's edge elements. float32 and float64 rows: one per lane, 2 (vec - 1) lanes at least (8 and 2):
  // with as few as their edges need, float32 65536 x 30 ran 11.1 -> 12.3 us (softmax), +9% (log_softmax), +4%
  // (backward; H100, session 21 call 4).
  //
  // 16-bit rows (up to 14 edges) whose edges outnumber their lanes first spread their packs to at most
  // kWarpPeelMultiEdgeMaxPacks per lane, then hold up to kWarpPeelMaxEdgesPerLane edge elements per lane. Session
  // 21 gave them a lane per edge element (65536 x 60 19.1 -> 11.5 us, 65536 x 100 19.2 -> 16.0 against 16 lanes of
  // one pack), which left rows of a few packs on up to 16 lanes of one pack (65536 x 30: 8 lanes, log_softmax 12.6
  // us against torch.compile's 8.9; session 21 call 5). H100, session 22 call 1 (two interleaved rounds,
  // *session22-c1-compare-peel-edges-{new,v2}.txt*, us fp16 / bf16 means, lane per edge -> this rule): softmax
  // 65536 x 9 18.0 / 18.4 -> 9.1 / 9.3, 65536 x 33 18.7 / 18.7 -> 9.7 / 9.6, 65536 x 30 -18 / -27%, 65536 x 101
  // (8 lanes of 2 edges) -16 / -14%, log_softmax -21..-53% on those, softmax_backward 65536 x 9 / 33 -36..-46%.
  // Four packs per lane lost where a lane per edge had given 2: 65536 x 60 +15 / +6% (2 lanes of 4 packs), 65536 x
  // 127 +7 / +2%, 16384 x 36 +14 / +8% (1 lane of 4): so those keep their plans, or 2 packs (16384 x 36: -4%).
  // This rule against session 21's (call 2, two rounds, *session22-c2-compare-peel-edges-final.txt*): every row
  // length whose plan changed (7, 9, 30, 31, 33, 36, 99, 101) up to 52% faster or within 2%, but 16384 x 36 bf16
  // log_softmax +5% (6 us).
  auto spread_over = [&](int64_t lanes) {
    plan.lanes_per_row = static_cast<int>(lanes);
    plan.reg_packs = static_cast<int>(pow2_ceil(ceil_div(std::max<int64_t>(g.n_packs, 1), lanes)));
  };
  if (g.peel && g.vec != 8) {
    const int64_t peel_lanes = pow2_ceil(2 * (g.vec - 1));
    if (plan.lanes_per_row < peel_lanes) spread_over(peel_lanes);
  } else if (g.peel) {
    const int64_t edges = std::max(g.max_edges, 1);
    const int multi_edge_max_packs =
        g.streams == 2 ? kWarpPeelMultiEdgeMaxPacksBackward : kWarpPeelMultiEdgeMaxPacks;
    while (edges > plan.lanes_per_row && plan.reg_packs > multi_edge_max_packs) spread_over(2 * plan.lanes_per_row);
    const int64_t edge_lanes = pow2_ceil(ceil_div(edges, kWarpPeelMaxEdgesPerLane));
    if (plan.lanes_per_row < edge_lanes) spread_over(edge_lanes);
    plan.edges_per_lane = static_cast<int>(pow2_ceil(ceil_div(edges, plan.lanes_per_row)));
  }
  // Fewer rows than SMs x 4 warps: CTAs of fewer warps, so the rows spread over more SMs. 128 x 1024 (one row
  // per warp) ran on 32 SMs in CTAs of 4 warps, each SM's share of the loads and stores queued behind one
  // another, and torch.compile (a CTA per row) was 1.4-1.5x faster there at 16 and 32 bits (H200, 2026-11-22).
  const int64_t rows_per_warp = 32 / plan.lanes_per_row;
  int warps = kWarpKernelThreads / 32;
  while (warps > 1 && ceil_div(g.rows, warps * rows_per_warp) < props.sm_count) warps /= 2;
  plan.threads = warps * 32;
  plan.grid = std::min(ceil_div(g.rows, warps * rows_per_warp), grid_cap(props, plan.threads));
  return plan;
}

// How a CTA caches `packs` packs (per stream) of a row: threads, register packs, shared-memory packs.
struct CacheShape {
  int threads;
  int reg_packs;
  int smem_packs;
  size_t smem_bytes;
};

// spread_threads > 0 (few rows, latency-bound): the fewest register packs per thread that keep the CTA
// within that many threads, so each thread's dependent chain of max / sum steps stays short. group: the CTA caches
// a chunk of a row for a cluster or grid group.
std::optional<CacheShape> cache_shape(int64_t packs, const Geometry& g, int max_threads, int64_t smem_budget,
                                      int spread_threads = 0, bool group = false) {
  packs = std::max<int64_t>(packs, 1);
  // The peeled view plans the most register packs only (its forced plans, and the rules that peel many rows; but for
  // 16-bit group rows with shared-memory packs, below); the kBody view spreads too, and peel_few_rows runs such a plan peeled where softmax_block.cu compiles its bucket.
  if (spread_threads > 0 && g.vec > 1 && !g.peel) {
    for (int reg_packs = 1; reg_packs < g.max_reg_packs; reg_packs *= 2) {
      const int64_t threads = cta_threads(packs, reg_packs);
      if (threads <= spread_threads) return CacheShape{static_cast<int>(threads), reg_packs, 0, 0};
    }
  }
  // The largest bucket (see the heuristic above; the only one for single elements and for the peeled view), but for
  // widening groups (Heuristics::kWideningGroupRegPacks) outside the peeled and kBody views.
  const bool runs_peeled = g.peel || g.body;
  const int reg_packs = g.widening && group && !runs_peeled ? Heuristics::kWideningGroupRegPacks : g.max_reg_packs;
  const int64_t threads = cta_threads(packs, reg_packs);
  if (threads <= max_threads) return CacheShape{static_cast<int>(threads), reg_packs, 0, 0};
  // Shared-memory packs: reg_packs in registers, the rest in shared memory, within the budget.
  const auto with_shared_packs = [&](int regs) -> std::optional<CacheShape> {
    const int64_t smem_packs = ceil_div(packs, max_threads) - regs;
    const int64_t smem_bytes = smem_packs * max_threads * g.pack_bytes * g.streams;
    if (smem_bytes > smem_budget) return std::nullopt;
    return CacheShape{max_threads, regs, static_cast<int>(smem_packs), static_cast<size_t>(smem_bytes)};
  };
  // 16-byte packs only: single elements have instances at the largest bucket alone (softmax_block.cu). Peeled rows
  // too: peeled_instance compiles their 16-bit forward buckets below the largest.
  const bool forward16 = g.streams == 1 && g.in_bytes == 2 && !g.widening && g.vec > 1;
  if (group && forward16 && reg_packs > Heuristics::kGroupSharedRegPacks16) {
    if (auto shape = with_shared_packs(Heuristics::kGroupSharedRegPacks16)) return shape;
  }
  return with_shared_packs(reg_packs);
}

// Budget for a CTA that must leave room for another on its SM, and for one that may own the SM.
int64_t shared_smem_budget(const DeviceProps& props) {
  return props.smem_per_sm / 2 - Heuristics::kSmemReservePerCta;
}
int64_t exclusive_smem_budget(const DeviceProps& props) {
  return props.smem_per_block_optin - Heuristics::kSmemReservePerCta;
}

// Many rows whose row fits in registers: CTAs take rows in turn, at least two each, and each prefetches its
// next row into shared memory (cp.async) while it reduces and writes the current one. With one row per CTA
// every CTA of the single wave loads, then computes, then stores at the same time, and DRAM idles through
// the math (Nsight Compute, H200, 2048 x 4096 fp16: 2048 CTAs in 0.97 waves, 24% DRAM throughput).
// Only 16-bit inputs (twice the elements, so twice the math, per byte) and up to kPrefetchMaxWaves waves
// of rows: beyond, later waves of one-row CTAs already overlap the earlier ones' math. H200, 2026-11-22
// (xCopy without -> with prefetch): 2048x4096 fp16 0.80 -> 0.83, 4096x4096 fp16 0.81 -> 0.85; fp32 neutral
// to worse (2048x4096 0.92 -> 0.94, 4096x4096 0.95 -> 0.94, 2048x2048 1.00 -> 0.92); 32768x2048 (8-16
// waves) fp16 0.92 -> 0.88, fp32 0.96 -> 0.90. Forced block_onepass always prefetches (the tests' way in).
void add_row_prefetch(SoftmaxPlan& plan, const Geometry& g, const DeviceProps& props, bool forced) {
  // Forward only (a compiled variant per forward dtype pair), register-only rows, 16-byte packs.
  if (g.streams != 1 || plan.cluster != 1 || plan.smem_packs != 0 || g.vec == 1 || g.peel || g.rows < 2) return;
  if (plan.reg_packs != g.max_reg_packs) return;
  const int64_t staging = static_cast<int64_t>(plan.reg_packs) * plan.threads * g.pack_bytes * g.streams;
  // Resident CTAs per SM: the 64-register budget (1024 threads), 32 CTAs, and shared memory.
  const int64_t by_smem = props.smem_per_sm / (staging + Heuristics::kSmemReservePerCta);
  const int64_t per_sm = std::min<int64_t>({32, kBlockKernelMaxThreads / plan.threads, by_smem});
  if (per_sm < 1) return;
  if (!forced && (g.in_bytes != 2 || g.rows > Heuristics::kPrefetchMaxWaves * per_sm * props.sm_count)) return;
  plan.prefetch = true;
  plan.smem_bytes = static_cast<size_t>(staging);
  plan.grid = std::min(ceil_div(g.rows, 2), per_sm * props.sm_count);
}

// The one-pass kernels' common fields: which kernel, and how each CTA caches its (chunk of a) row.
SoftmaxPlan one_pass_plan(SoftmaxKernel kernel, const Geometry& g, const CacheShape& shape) {
  SoftmaxPlan plan;
  plan.kernel = kernel;
  plan.vec = g.vec;
  plan.peel = g.peel;
  plan.threads = shape.threads;
  plan.reg_packs = shape.reg_packs;
  plan.smem_packs = shape.smem_packs;
  plan.smem_bytes = shape.smem_bytes;
  return plan;
}

SoftmaxPlan plan_cached(const Geometry& g, const DeviceProps& props, const CacheShape& shape, int cluster) {
  SoftmaxPlan plan =
      one_pass_plan(cluster > 1 ? SoftmaxKernel::kClusterOnePass : SoftmaxKernel::kBlockOnePass, g, shape);
  plan.cluster = cluster;
  const int64_t clusters = std::min(g.rows, std::max<int64_t>(1, grid_cap(props, shape.threads) / cluster));
  plan.grid = clusters * cluster;
  return plan;
}

SoftmaxPlan plan_two_pass(const Geometry& g, const DeviceProps& props) {
  SoftmaxPlan plan;
  plan.kernel = SoftmaxKernel::kTwoPass;
  plan.vec = g.vec;
  plan.peel = g.peel;
  plan.threads = static_cast<int>(std::clamp<int64_t>(round_up(g.n_packs, 32), 32, Heuristics::kTwoPassThreads));
  plan.grid = std::min(g.rows, grid_cap(props, plan.threads));
  return plan;
}

// Bytes of one partial accumulator (the kernels' Op::Acc): MaxSum<float> / MaxSum<double> forward, a
// double dot product backward.
int64_t partial_bytes(const Geometry& g) { return g.streams == 1 ? 2 * (g.in_bytes == 8 ? 8 : 4) : 8; }

SoftmaxPlan plan_grid_group(const Geometry& g, const CacheShape& shape, int64_t ctas_per_row) {
  SoftmaxPlan plan = one_pass_plan(SoftmaxKernel::kGridOnePass, g, shape);
  plan.chunks = ctas_per_row;
  plan.grid = g.rows * ctas_per_row;
  plan.workspace_bytes = static_cast<size_t>(g.rows * ctas_per_row * partial_bytes(g));
  return plan;
}

SoftmaxPlan plan_split_row(const Geometry& g, const DeviceProps& props, bool forced) {
  SoftmaxPlan plan;
  plan.kernel = SoftmaxKernel::kSplitRow;
  plan.vec = g.vec;
  plan.peel = g.peel;
  const int64_t want = static_cast<int64_t>(Heuristics::kSplitCtasPerSm * props.sm_count / g.rows + 0.999);
  const int64_t most = std::max<int64_t>(1, g.n_packs * g.pack_bytes / Heuristics::kSplitMinChunkBytes);
  int64_t chunks = std::clamp<int64_t>(want, 1, most);
  if (forced) chunks = std::max<int64_t>(chunks, 2);  // a forced split_row really splits (tests)
  chunks = std::max<int64_t>(1, std::min(chunks, g.n_packs));  // a peeled row's body may have no pack
  const int64_t chunk_packs = ceil_div(std::max<int64_t>(g.n_packs, 1), chunks);
  plan.chunks = ceil_div(std::max<int64_t>(g.n_packs, 1), chunk_packs);  // CTAs per row: about chunk_packs packs each
  plan.threads = static_cast<int>(std::clamp<int64_t>(round_up(chunk_packs, 32), 32, Heuristics::kSplitThreads));
  plan.grid = std::min(g.rows * plan.chunks, grid_cap(props, plan.threads));
  plan.workspace_bytes = static_cast<size_t>(g.rows * plan.chunks * partial_bytes(g));
  return plan;
}

SoftmaxPlan plan_strided(const SoftmaxProblem& p, const DeviceProps& props) {
  SoftmaxPlan plan;
  plan.kernel = SoftmaxKernel::kStrided;
  plan.vec = 1;
  plan.block_x = static_cast<int>(std::min<int64_t>(p.inner, 32));
  const int64_t tiles = p.outer * ceil_div(p.inner, plan.block_x);
  const int target = tiles < 2 * props.sm_count ? Heuristics::kStridedThreadsFewTiles : Heuristics::kStridedThreads;
  const int64_t block_y = std::min(pow2_floor(std::max(1, target / plan.block_x)), pow2_ceil(p.n));
  plan.threads = static_cast<int>(plan.block_x * block_y);
  plan.grid = std::min(tiles, grid_cap(props, plan.threads));
  return plan;
}

// ---- the decision ---------------------------------------------------------------------------------

class Chooser {
 public:
  Chooser(const SoftmaxRequest& request, const DeviceProps& props, RowView view = RowView::kNatural)
      : request_(request), p_(request.problem), props_(props), g_(geometry_of(request, view)) {}

  SoftmaxChoice choose() {
    if (!request_.forced.empty()) return forced();
    SoftmaxChoice choice = choose_automatic();
    if (choice.plan.peel) choice.reason += peel_note();
    return choice;
  }

 private:
  SoftmaxChoice choose_automatic() {
    if (p_.inner > 1) return ok(plan_strided(p_, props_), "the reduced dim is not the last one (inner size " +
                                                             std::to_string(p_.inner) +
                                                             "): threads run across inner, coalesced, no transpose");
    if (auto lean = lean_rows()) return *lean;
    // Many rows that break 16-byte packs, of the lean forms' lengths: the lean instances, peeled. H100, session
    // 19 (two interleaved runs each, us, the plain peeled instance -> the lean one): call 5, softmax 4096 x 4095
    // fp16 / bf16 / fp32 32.4 / 31.6 -> 28.6 / 27.8, 35.8 / 35.6 -> 28.8 / 27.9, 51.7 / 51.4 -> 50.5 / 49.6; 2048 x
    // 8191 -11 / -18 / -3%, 300 x 4095 -21 / -29 / -12%, log_softmax alike (*session19-c5-compare*); call 8, the
    // backward at 3 CTAs per SM (softmax_block_kernel.cuh: kLeanPeeledBackwardMinCtas): softmax_backward 4096 x
    // 4095 46.8 / 47.5 -> 40.6 / 40.5, -14 / -6% (bf16 / fp32), 2048 x 8191 -17 / -18 / -1%, 2048 x 2049 -8 / -12 /
    // -13%, log_softmax_backward alike (*session19-c8-compare*). At 4 CTAs per SM (32 registers) the 16-bit
    // backward spilled and ran 13-49% slower (call 5).
    // Shorter ones, of warp lengths in packs: the warp kernel, peeled (peeled_warp_rows).
    if (peelable(request_)) {
      Chooser peeled(request_, props_, RowView::kPeeled);
      if (auto lean = peeled.lean_rows()) return *lean;
      if (auto warp = peeled.peeled_warp_rows()) return *warp;
    }
    if (auto warp = warp_rows()) {
      if (auto spread = spread_small_rows()) return *spread;
      return *warp;
    }
    const bool few_rows = static_cast<double>(g_.rows) < Heuristics::kFewRowsPerSm * props_.sm_count;
    if (few_rows) {
      if (peelable(request_)) {
        if (auto choice = peel_few_rows()) return *choice;
        if (auto choice = Chooser(request_, props_, RowView::kPeeled).peeled_cluster_rows()) return *choice;
      }
      return choose_few_rows();
    }
    // Many rows that break 16-byte packs: peeled.
    if (peelable(request_)) {
      Chooser peeled(request_, props_, RowView::kPeeled);
      SoftmaxChoice choice = peeled.choose_many_rows();
      if (!peeled.too_few_warps(choice.plan)) return choice;
    }
    return choose_many_rows();
  }

  // Rows that break 16-byte packs, of the warp kernel's lengths in packs: the warp kernel, peeled (an edge
  // element per lane), except few 16-bit forward rows that whole packs would spread over a CTA
  // (spread_small_rows). Before it such rows of at most 32 x 8 elements ran as single elements in the warp
  // kernel, longer ones as peeled one-warp CTAs of 8 packs per thread (8192 x 1023 fp16 0.72 of copy, 10-20%
  // behind torch.compile; session 19). H100, session 20 calls 5 and 6 (three interleaved rounds,
  // *session20-c{5,6}-compare-peeled-warp*, us, fp16 / bf16 / fp32, before -> peeled warp, rounds 2-3): softmax
  // 8192 x 1023 23.1 / 25.5 / 30.2 -> 17.3 / 17.4 / 28.1, 16384 x 513 -47 / -48 / -8%, 32768 x 777 -40 / -35 / -3%,
  // 65536 x 100 -31 / -30 / -2%, 1000 x 1001 -20 / -20 / -5%, 37 x 1023 -34 / -20 / -14%; log_softmax alike;
  // softmax_backward (16-bit: float32 rows of 513-1023 kept the block kernel, beyond the backward's 2 KB warp
  // rows, until session 21: warp_max_row_bytes) 8192 x 1023 -8 / -6%, 65536 x 100 -20 / -19%; few-microsecond
  // cases that did not separate: 300 x 2047 bf16 softmax +9% (8.1 -> 8.9; fp16 -2%), 133 x 1001 between -10% and
  // +7% from round to round.
  std::optional<SoftmaxChoice> peeled_warp_rows() {
    if (few_small_rows_to_spread()) return std::nullopt;
    return warp_rows();
  }

  // The warp kernel, for rows it holds within warp_max_row_bytes.
  std::optional<SoftmaxChoice> warp_rows() {
    if (!warp_takes_rows()) return std::nullopt;
    return ok(plan_warp(g_, props_), "rows of " + kib(p_.n * g_.in_bytes) + " per input (<= " +
                                         kib(warp_max_row_bytes()) + "): one warp or sub-warp per row, " +
                                         "row in registers, no block barrier");
  }

  // A peeled plan of one-warp CTAs (rows of at most 32 x 8 packs: the peeled instances hold the most register
  // packs per thread) with fewer than kPeelOneWarpMinRowsPerSm rows per SM: a few warps per SM, each with a
  // long chain per thread, where single elements spread the row over 4x the threads. H100, session 19 call 2
  // (two interleaved runs each, us, single elements -> peeled; *session19-c2-compare*): softmax 1000 x 1001 (7.6
  // rows per SM) fp16 8.3 / 8.3 -> 9.0 / 9.1, bf16 9.0 / 8.3 -> 9.9 / 9.3, fp32 9.5 / 8.9 -> 9.8 / 9.8, but 8192 x
  // 1023 (62 per SM) fp16 32.5 / 32.3 -> 23.4 / 23.4, fp32 34.6 / 34.4 -> 30.2 / 29.6; the backward's peeled CTAs
  // there have two warps (softmax_backward 1000 x 1001 fp16 13.6 / 13.6 -> 8.4 / 9.1).
  bool too_few_warps(const SoftmaxPlan& plan) const {
    return plan.peel && plan.kernel == SoftmaxKernel::kBlockOnePass && plan.threads <= 32 &&
           static_cast<double>(g_.rows) < Heuristics::kPeelOneWarpMinRowsPerSm * props_.sm_count;
  }

  // Few rows that break 16-byte packs: the plan the rules make for their longest aligned body, run peeled, where a
  // peeled instance holds its register packs: the most (long rows), or any fewer for 16-bit forwards (a 16-bit or
  // float32 result), the same-dtype 16-bit backward and the same-dtype float32 backward (peeled_instance); where
  // it would stream (the grid group's streamed form has no peeled instance) or split, the peeled split_row. Shorter
  // rows of the other dtype pairs (the float32 forward, float32 gradients of 16-bit inputs) keep single elements (the
  // float32 forward: or peeled_cluster_rows): the whole-pack rules spread them over more threads with fewer packs each
  // (latency-bound), which single elements do too.
  // H100, session 19 call 3 (single elements against the aligned neighbour, xCopy, fp16 / fp32 softmax): 4 x 33554431
  // 0.34 / 0.37 vs 0.63 / 0.64 (split_row), 4 x 8388607 0.44 / 0.47 vs 0.68 / 0.68 (streamed grid group), 64 x 151935
  // 0.52 / 0.58 vs 0.76 / 0.79; 8 x 262143 0.72 / 0.80 vs 0.64 / 0.78. A/B of this rule (call 4, two interleaved runs,
  // softmax / both backwards, fp16 and fp32, *session19-c4-compare*): 4 x 33554431 -39..-46%, 4 x 8388607 -27..-37%
  // (peeled split_row), 64 x 151935 -21..-46%, 8 x 262143 16-bit backward -21..-23%; 2 x 300007 fp16 softmax +6.8% (a
  // peeled cluster of 16).
  // 16-bit rows spread over fewer packs, against single elements or session 33's peeled cluster of 8 packs: H100,
  // session 34 call 1 (A/B in turns against 21fb4f0, two rounds, us, fp16 / bf16;
  // *session34-c1-compare-peeled-spread.txt*): softmax 3 x 100003 9.2 / 8.6-8.7 -> 8.3-8.8 / 7.3-8.2, 1 x 262143
  // 10.5-11.0 / 11.2 -> 8.8-9.0 / 8.6-9.1, 4 x 1048575 21.1-21.9 / 21.2-22.0 -> 15.4-15.5 / 15.1-15.7, 48 x 24577 -18 /
  // -23%, 4 x 151935 -13 / -19%, 8 x 32001 -13 / -18%, 1 x 128257 -12 / -14%, 16 x 262143 -4 / -12%, 64 x 50257 -6 /
  // -11%; softmax_backward 16 x 65537 12.8-13.6 / 13.5-13.6 -> 10.3-10.4 / 10.3-10.4, 1 x 1048575 15.3-15.4 / 14.7-15.3
  // -> 12.4 / 12.4-13.1, 4 x 65537 -17 / -11%, 8 x 32001 -17 / -14%, 8 x 100003 -14 / -15%, 1 x 32001 -21 / -11%.
  // Within the few-microsecond spread (up to 12% for one plan against itself in the same call: 3 x 100000
  // softmax_backward fp16): 1 x 32001 softmax fp16 +7% (bf16 -3%), 8 x 262143 fp16 +5% (bf16 -4%).
  // The float32 backward so spread, against single elements (session 34 call 2, same protocol, us,
  // *session34-c2-compare-peeled-spread-fp32.txt*): softmax_backward 8 x 16383 8.5-8.7 -> 6.8-7.0, 1 x 50257 8.9-9.0 ->
  // 7.1-7.6, 24 x 32001 12.5 -> 10.1-10.2, 4 x 24577 -17%, 48 x 16385 -16%, 16 x 32001 -14%, 4 x 65537 -13%, 1 x 32001
  // -10%; within the spread: 8 x 65537 +5%, 1 x 300007 +4%.
  // 16-bit forwards with a float32 result so spread, against single elements (session 34 call 6, same protocol, us,
  // fp16 / bf16, softmax; *session34-c6-compare-peeled-spread-widening.txt*): 64 x 50257 18.8-19.4 -> 13.8-14.7, 24 x
  // 100003 16.2-16.8 -> 12.5-13.5, 4 x 1048575 22.6-23.2 -> 17.8-18.8, 16 x 100003 -13 / -17%, 1 x 128257 -11 / -13%, 8
  // x 262143 -8 / -11%, 32 x 50257 -19 / -4%, log_softmax alike; 3 x 262143 softmax +10 / +9% (log_softmax +4 / -2%),
  // within the spread of that call's unchanged plans (3 x 100000 -6..+14%).
  std::optional<SoftmaxChoice> peel_few_rows() const {
    SoftmaxChoice choice = Chooser(request_, props_, RowView::kBody).choose_few_rows();
    if (!choice.error.empty()) return std::nullopt;
    const SoftmaxPlan& plan = choice.plan;
    if (plan.kernel == SoftmaxKernel::kSplitRow || plan.stream_rest) {
      return ok(plan_split_row(geometry_of(request_, RowView::kPeeled), props_, false),
                few_rows_note() + " and a row (" + kib(g_.row_bytes) + ") too long for every CTA slot to cache its " +
                    "chunk: two launches, partial (max, sum) per part merged in fixed order, then normalise");
    }
    const bool one_pass = plan.kernel == SoftmaxKernel::kBlockOnePass || plan.kernel == SoftmaxKernel::kClusterOnePass ||
                          plan.kernel == SoftmaxKernel::kGridOnePass;
    const bool compiled = peeled_instance(p_.in_dtype, p_.out_dtype, p_.backward, plan.reg_packs);
    if (!one_pass || plan.lean || plan.prefetch || !compiled) return std::nullopt;
    choice.plan.peel = true;
    return choice;
  }

  // Few float32 same-dtype forward rows that break 16-byte packs, where peel_few_rows keeps single elements: the
  // peeled cluster (the forced cluster_onepass plan; this Chooser's view is kPeeled) where its CTAs have at least
  // kPeeledClusterMinThreads threads and hold their chunk in registers. (peel_few_rows takes every such 16-bit row.)
  std::optional<SoftmaxChoice> peeled_cluster_rows() {
    if (g_.streams != 1 || g_.widening || g_.in_bytes != 4) return std::nullopt;
    std::optional<SoftmaxChoice> choice = filling_clusters();
    if (!choice) return std::nullopt;
    if (choice->plan.threads < Heuristics::kPeeledClusterMinThreads || choice->plan.smem_packs != 0) {
      return std::nullopt;
    }
    choice->reason = few_rows_note() + ": " + choice->reason + " (" + std::to_string(choice->plan.threads) +
                     " threads per CTA at " + std::to_string(choice->plan.reg_packs) +
                     " register packs each: the peeled instances')";
    return choice;
  }

  // How the few-rows plans' reasons begin.
  std::string few_rows_note() const {
    return std::to_string(g_.rows) + " rows < " + std::to_string(props_.sm_count) + " SMs";
  }

  // What a peeled plan adds to its reason (choose).
  std::string peel_note() const {
    const int vec = 16 / g_.in_bytes;
    const int edges = geometry_of(request_, RowView::kPeeled).max_edges;
    return "; the row (" + std::to_string(p_.n) + " columns) breaks " + std::to_string(vec) + "-element packs: each " +
           "row's aligned body in packs, the up to " + std::to_string(edges) + " elements around it singly";
  }

  // Widening rows of at least kWideningClusterMinPacks packs, at least kWideningClusterMinRowsPerSm per SM: a
  // cluster of 2 CTAs per row before one CTA of 512 threads, half the output per CTA. H100, session 26 (two rounds
  // in turns, us): call 3, forced cluster_onepass against the automatic choice, fp16 / bf16, softmax 8192 x 32000
  // 645 / 643 -> 609 / 608, log_softmax -5 / -6%; call 4, this rule from 769 packs against the rules before it,
  // bf16 (*session26-c4-compare-widening-vocab.txt*): 2048 x 16384 99.4 -> 85.6 (-14%), 4096 x 32000 -7%, 2048 x
  // 50257 -2%, 512 x 151936 and 1024 x 128256 (4-8 rows per SM) 0%, 264 x 6152 (2 per SM) +18 / +22%.
  // Shorter rows keep the lean and block instances: there the cluster's 64-128-thread CTAs exceeded the accuracy
  // bound on float16 -> float32 (2048 x 8192 softmax 4.6e-7 against 2x torch's error + 2e-7 = 4.0e-7, call 4's
  // bench; 4096 x 4096 and 2048 x 8192 in call 3's forced runs), though they were 4-8% faster.
  std::optional<SoftmaxChoice> widening_cluster_rows() {
    if (!g_.widening || g_.n_packs < Heuristics::kWideningClusterMinPacks) return std::nullopt;
    if (g_.rows < Heuristics::kWideningClusterMinRowsPerSm * props_.sm_count) return std::nullopt;
    auto choice = try_clusters(2, /*exclusive=*/false);
    if (choice) {
      choice->reason = "many rows of " + std::to_string(p_.n) + " columns with a float32 result (twice the bytes " +
                       "written as read): " + choice->reason;
    }
    return choice;
  }

  SoftmaxChoice choose_many_rows() {
    if (auto choice = widening_cluster_rows()) return *choice;
    if (auto shape = cache_shape(g_.n_packs, g_, Heuristics::kSharedCtaMaxThreads, shared_smem_budget(props_))) {
      SoftmaxPlan plan = plan_cached(g_, props_, *shape, 1);
      add_row_prefetch(plan, g_, props_, /*forced=*/false);
      return ok(plan, "enough rows for every SM; a row (" + kib(g_.row_bytes) + ") fits on chip in one CTA that " +
                          "leaves room for a second per SM: one read, one write" +
                          (plan.prefetch ? "; each CTA prefetches its next row while it works on one" : ""));
    }
    if (auto choice = try_clusters(2, /*exclusive=*/false)) {
      choice->reason = "enough rows, but a row (" + kib(g_.row_bytes) + ") is too large for one CTA: " +
                       choice->reason;
      return *choice;
    }
    if (auto shape = cache_shape(g_.n_packs, g_, kBlockKernelMaxThreads, exclusive_smem_budget(props_))) {
      return ok(plan_cached(g_, props_, *shape, 1),
                "a row (" + kib(g_.row_bytes) + ") fits on chip only in a CTA that owns its SM: one read, one write");
    }
    if (auto choice = try_clusters(2, /*exclusive=*/true)) return *choice;
    if (static_cast<double>(g_.rows) >= Heuristics::kTwoPassMinRowsPerSm * props_.sm_count) {
      return ok(plan_two_pass(g_, props_), "a row (" + kib(g_.row_bytes) + ") does not fit on chip even in a " +
                                               "cluster; rows keep every SM busy: one CTA per row, online " +
                                               "(max, sum) pass then a re-read");
    }
    return ok(plan_split_row(g_, props_, false), "a row (" + kib(g_.row_bytes) + ") does not fit on chip even " +
                                                     "in a cluster, and rows alone cannot fill the SMs: " +
                                                     "partials per chunk, merged in fixed order, then a re-read");
  }

  SoftmaxChoice choose_few_rows() {
    const std::string why_few = few_rows_note();
    const bool worth_splitting = ceil_div(props_.sm_count, g_.rows) > 1 &&
                                 g_.row_bytes >= Heuristics::kFewRowsSplitMinRowBytes;
    if (!worth_splitting || !clusters_supported()) {
      if (auto shape = cache_shape(g_.n_packs, g_, kBlockKernelMaxThreads, exclusive_smem_budget(props_))) {
        return ok(plan_cached(g_, props_, *shape, 1),
                  why_few + ", but a row (" + kib(g_.row_bytes) +
                      (!worth_splitting ? ") is too small to split" : ") cannot be split (no thread-block clusters)") +
                      ": one CTA per row, one read, one write");
      }
    }
    if (worth_splitting) {
      const bool clusters_on_half_the_sms = 2 * g_.rows * kMaxClusterCtas <= props_.sm_count;
      int64_t cluster_first_chunk = 0;  // single elements on more rows: the grid group first
      if (g_.vec > 1) {
        cluster_first_chunk = clusters_on_half_the_sms ? Heuristics::kClusterFirstFewMaxChunkBytes
                                                       : Heuristics::kClusterFirstMaxChunkBytes;
      } else if (clusters_on_half_the_sms) {
        cluster_first_chunk = Heuristics::kClusterFirstScalarMaxChunkBytes;
      }
      const bool cluster_first = g_.row_bytes <= kMaxClusterCtas * cluster_first_chunk;
      std::optional<SoftmaxChoice> choice;
      if (cluster_first) choice = widest_cluster();
      if (!choice) choice = grid_group(/*forced=*/false);
      if (!choice && !cluster_first) choice = widest_cluster();
      if (!choice) choice = try_clusters(2, /*exclusive=*/false);
      if (!choice) choice = try_clusters(2, /*exclusive=*/true);
      if (!choice) choice = grid_group_streamed(/*forced=*/false);
      if (choice) {
        choice->reason = why_few + ": " + choice->reason;
        return *choice;
      }
    }
    return ok(plan_split_row(g_, props_, false),
              why_few + " and a row (" + kib(g_.row_bytes) + ") does not fit on chip in a cluster: " +
                  "two launches, partial (max, sum) per chunk merged in fixed order, then normalise");
  }

  // Few rows: the widest cluster (most CTAs per row, up to kMaxClusterCtas) whose chunks are at least
  // kClusterMinChunkBytes and whose clusters all fit on the device at once, first with CTAs that leave room
  // for a second on their SM, then with CTAs that own it; its CTAs use up to kSpreadThreads threads with
  // few packs each. Few rows are latency-bound, not bandwidth-bound: each CTA loads, then folds its chunk
  // in a dependent chain, then stores, so the more CTAs and threads share a row the shorter that chain.
  // H200, 2026-11-22: clusters of 16 (1 pack per thread) against the 16 KB-chunk rule's 2-8 gave
  // 4x32768 bf16 0.64 vs 0.54 of copy, 4x65536 bf16 0.69 vs 0.61, 3x100003 fp16 0.50 vs 0.43.
  std::optional<SoftmaxChoice> widest_cluster() {
    for (const bool exclusive : {false, true}) {
      const int max_threads = exclusive ? kBlockKernelMaxThreads : Heuristics::kSharedCtaMaxThreads;
      const int64_t budget = exclusive ? exclusive_smem_budget(props_) : shared_smem_budget(props_);
      for (int cluster = kMaxClusterCtas; cluster >= 2; --cluster) {
        const int64_t chunk = ceil_div(g_.n_packs, cluster);
        const int64_t chunk_bytes = chunk * g_.pack_bytes * g_.streams;
        if (chunk_bytes < Heuristics::kClusterMinChunkBytes) continue;
        const auto shape = cache_shape(chunk, g_, max_threads, budget, Heuristics::kSpreadThreads, /*group=*/true);
        if (!shape) continue;
        const SoftmaxPlan plan = plan_cached(g_, props_, *shape, cluster);
        if (resident(plan) < g_.rows) continue;
        return ok(plan, "a cluster of " + std::to_string(cluster) + " CTAs per row (the most that fit in one " +
                            "wave), each caching " + kib(chunk_bytes) + " on chip; partial (max, sum) merged " +
                            "through distributed shared memory in fixed order: one read, one write");
      }
    }
    return std::nullopt;
  }

  // Softmax and log_softmax of many 16-bit rows of 2048-8192 columns (16-byte packs, at least one row per
  // SM; since sessions 38-39 also fewer rows of 256-8192 columns, kLeanFewMinColumns): a CTA per row of
  // ceil(packs / 2) threads with 2 register packs each, exp(x - max) taken once and kept in registers (the lean
  // instance, exp_once_rows). H200, 2026-11-22: the 64-register instance (8 packs per
  // thread, row prefetch, each exponential taken twice) gave 2048 x 4096 fp16 0.73-0.76 of copy, 2048 x 8192
  // 0.77-0.81, 4096 x 4096 0.79-0.82, against Liger's Triton kernel at 0.92-0.98, 0.97-1.00, 0.97-1.02. The
  // same lean CTA shape with the twice-taken exponentials was slower still (0.73, 0.67, 0.69: results
  // *session5-ab-lean-block-*.json). Float rows of 2048-4096 columns through the same instance (session 6 A/B,
  // two runs each): 2048 x 2048 0.94 -> 1.00, but 4096 x 4096 0.95 -> 0.92 and 32768 x 2048 0.98 -> 0.95; not
  // taken. log_softmax (session 6 A/B against the prefetching 8-pack instance, two runs each, fp16 / bf16):
  // 2048 x 4096 0.82 / 0.82 -> 0.86 / 0.88, 4096 x 4096 0.80 / 0.77 -> 0.87 / 0.86, 32768 x 2048 0.94 / 0.88 ->
  // 0.99 / 0.99.
  //
  // The backward ops take the same CTA shape (2 packs of each stream per thread, no wide form: 4 packs of
  // two streams do not fit 32 registers) in lean_backward_rows: up to 2048 threads per SM. For 16-bit streams
  // that is twice the loads in flight of the 64-register instance (2 packs per thread there too, 1024 threads);
  // float32 streams (256..1024 packs of 4: 1024-4096 columns) had 4 packs per thread there, about as many
  // packs in flight as here, so their gain comes from elsewhere (shorter per-thread chains, more CTAs; not
  // profiled). H100, 2026-11-22, two interleaved A/B runs each against the 64-register instance: 16-bit
  // (*session7-ab2-*.json) 2048 x 2048 .. 32768 x 2048 softmax_backward geomean 0.94-0.95 -> 0.97-0.98 of
  // copy, log_softmax_backward 0.94-0.95 -> 0.97-0.98; float32 (*session7-ab5-*.json) 2048 x 1024 0.85-0.91 ->
  // 0.99-1.02, 2048 x 2048 log_softmax_backward 0.88-0.91 -> 1.00, 4096 x 4096 0.95 -> 0.98-0.99.
  //
  // Fewer forward rows than SMs of 256-8192 columns (kLeanFewMinColumns), and many float32 rows of 512-1024 columns
  // that fit in one wave (kLeanOneWaveFloatMinPacks), take the two-pack form, or float32 rows of 4097-8192 columns in
  // fewer rows the float form (sessions 38-39). Fewer backward rows than SMs of 512 columns up to 1024 packs, and many
  // 16-bit backward rows of 64-255 packs in one wave, take the two-pack form too (session 40,
  // kLeanFewBackwardMinColumns).
  //
  // float32 forward rows of 256-2048 packs (1024-8192 columns) take the lean instance's float form: the
  // 64-register instance's CTA shape (8 packs per thread: 128 KB in flight per SM; 256 or 512 threads with
  // fewer packs measured 1-75% slower, *session17-c4-*), with the row max first and each exp(x - max) taken
  // once instead of the online (max, sum) merge in every shuffle step. H100, session 17 call 6, three
  // interleaved runs (us, 64-register instance -> lean): softmax 2048 x 2048 17.3 / 17.1 / 17.2 -> 15.4 / 15.9 /
  // 15.0, 2048 x 4096 -6.7%, 4096 x 4096 -3.8%, 2048 x 8192 -4.3%, 32768 x 2048 186 -> 183, 1024 x 6000 -7.9%;
  // log_softmax -2..-8% on the same shapes (*session17-c6-compare-lean-float-forward.txt*). Liger's Triton
  // softmax had been 2-7% faster than the 64-register instance on these shapes (session 17 call 3's bench).
  std::optional<SoftmaxChoice> lean_rows() {
    // Hopper only: measured there, and compiled for 4 CTAs of 512 threads per SM (other archs hold fewer).
    if (props_.cc_major < 9 || g_.vec == 1) return std::nullopt;
    const bool float_backward = p_.backward && g_.in_bytes == 4 && !g_.peel;  // any result dtype (BackwardPairs)
    const bool few_rows = g_.rows < props_.sm_count;
    // Few forward rows of kLeanFewMinColumns..kLeanFewMaxColumns (kLeanFewFloatResultMinColumns for a float32 result),
    // and many float32 rows of 128-256 whole packs that fit in one wave (float64 has no lean form: lean_form_exists).
    const int64_t columns = g_.n_packs * g_.vec;  // a peeled row's aligned body
    const bool float_result = g_.in_bytes == 4 || g_.widening;
    const bool few_forward =
        few_rows && !p_.backward && columns <= Heuristics::kLeanFewMaxColumns &&
        columns >= (float_result ? Heuristics::kLeanFewFloatResultMinColumns : Heuristics::kLeanFewMinColumns);
    // Whether every row's CTA of `reg_packs` packs per thread is resident at once (asked only of rows of at least
    // one pack).
    const auto ctas_fit_one_wave = [&](int reg_packs) {
      return g_.rows <= props_.sm_count * resident_ctas_per_sm(props_, cta_threads(g_.n_packs, reg_packs));
    };
    const bool two_packs_hold = g_.n_packs <= lean_max_row_packs(kLeanRegPacks);
    const bool one_wave_float_forward =
        !few_rows && !p_.backward && g_.in_bytes == 4 && !g_.peel &&
        g_.n_packs >= Heuristics::kLeanOneWaveFloatMinPacks && g_.n_packs <= Heuristics::kLeanFloatMinPacks &&
        ctas_fit_one_wave(kLeanRegPacks);
    // Few backward rows of kLeanFewBackwardMinColumns up to the two-pack form's packs (any stream dtype), and many
    // 16-bit backward rows of kLeanOneWaveBackwardMinPacks..kLeanMinPacks - 1 whole packs in one wave (session 40).
    const bool few_backward =
        few_rows && p_.backward && columns >= Heuristics::kLeanFewBackwardMinColumns && two_packs_hold;
    const bool one_wave_16bit_backward =
        !few_rows && p_.backward && g_.in_bytes == 2 && !g_.peel &&
        g_.n_packs >= Heuristics::kLeanOneWaveBackwardMinPacks && g_.n_packs < Heuristics::kLeanMinPacks &&
        ctas_fit_one_wave(kLeanRegPacks);
    // Many whole 16-bit forward rows (same-dtype result) of kLeanOnePackMinPacks..kLeanMinPacks - 1 packs whose
    // one-pack CTAs fit in one wave (session 46).
    const bool one_pack_one_wave =
        !few_rows && !p_.backward && g_.in_bytes == 2 && !g_.widening && !g_.peel &&
        g_.n_packs >= Heuristics::kLeanOnePackMinPacks && g_.n_packs < Heuristics::kLeanMinPacks &&
        ctas_fit_one_wave(kLeanOnePackRegPacks);
    if (few_rows && !few_forward && !few_backward) return std::nullopt;
    // Widening rows (a float32 result) of up to 4 KB per input take the warp kernel (warp_max_row_bytes). H100,
    // session 26 call 3 (two rounds in turns, us, lean -> warp, softmax fp16 / bf16,
    // *session26-c3-compare-widening.txt*): 32768 x 2048 165.8 / 164.7 -> 143.5 / 143.3, 8192 x 2048 -13 / -10%,
    // 2048 x 2048 -19 / -2%, 65536 x 1536 (8 packs per thread in the 64-register instance before) -10 / -7%;
    // log_softmax alike.
    // Not the few rows spread_small_rows would take from the warp kernel (132-264 rows: not measured), and not
    // fewer rows than SMs of 512-8192 columns (few_forward: the lean instance measured faster, sessions 38-39).
    if (g_.widening && !few_forward && warp_takes_rows() && !few_small_rows_to_spread()) return std::nullopt;
    // 16-bit forward rows of more than kLeanWideMinPacks packs: the wide form, 4 packs per thread; float32
    // forward rows: the float form, 8 packs per thread (the 64-register instance's CTA shape, without its
    // online (max, sum) merge); the backward, whatever its dtypes, and the few and one-wave rows above: 2, where
    // 512 threads hold the row (softmax_launch.h).
    const bool float_forward = !p_.backward && g_.in_bytes == 4;
    const LeanForm form = one_pack_one_wave                       ? LeanForm::kOnePack
                          : p_.backward || one_wave_float_forward ? LeanForm::kTwoPacks
                          : few_forward                         ? (two_packs_hold ? LeanForm::kTwoPacks : LeanForm::kFloat)
                          : float_forward                       ? LeanForm::kFloat
                          : g_.n_packs > Heuristics::kLeanWideMinPacks ? LeanForm::kWide
                                                                       : LeanForm::kTwoPacks;
    if (!lean_form_exists(g_.in_bytes, p_.backward, form, g_.widening)) return std::nullopt;  // float64
    const int reg_packs = lean_reg_packs(form);
    const bool range_checked =
        few_forward || one_wave_float_forward || few_backward || one_wave_16bit_backward || one_pack_one_wave;
    const int64_t min_packs = range_checked    ? 1
                              : float_forward  ? Heuristics::kLeanFloatMinPacks
                              : float_backward ? Heuristics::kLeanFloatBackwardMinPacks
                                               : Heuristics::kLeanMinPacks;
    if (g_.n_packs < min_packs || g_.n_packs > lean_max_row_packs(reg_packs)) return std::nullopt;
    const int threads = static_cast<int>(cta_threads(g_.n_packs, reg_packs));
    SoftmaxPlan plan = one_pass_plan(SoftmaxKernel::kBlockOnePass, g_, CacheShape{threads, reg_packs, 0, 0});
    plan.lean = true;
    plan.grid = std::min(g_.rows, grid_cap(props_, plan.threads));
    const bool one_wave = one_wave_float_forward || one_wave_16bit_backward || one_pack_one_wave;
    const std::string rows = few_rows ? "fewer rows than SMs, of " : one_wave ? "rows whose CTAs fit in one wave, of "
                                                                              : "many rows of ";
    const std::string shape = rows + kib(g_.row_bytes) + " (" + std::to_string(p_.n) + " columns): a CTA per row, " +
                              std::to_string(reg_packs) + (reg_packs == 1 ? " pack per thread" : " packs per thread");
    if (p_.backward) {
      // The peeled backward instance runs at 3 CTAs per SM, up to 40 registers (kLeanPeeledBackwardMinCtas).
      const std::string budget = g_.peel ? " and stream in at most 40 registers: up to 1536 threads per SM"
                                         : " and stream in at most 32 registers: up to 2048 threads per SM";
      const std::string before = few_rows                  ? "the warp kernel, clusters and the 64-register instance"
                                 : one_wave_16bit_backward ? "the warp kernel and the 64-register instance"
                                                           : "the 64-register instance";
      return ok(plan, shape + budget + " (measured faster than " + before + " on such rows)");
    }
    return ok(plan, shape + ", max first, then each exp(x - max) taken once" +
                        (p_.log ? " for the sum" : " and kept in registers for the sum and the output"));
  }

  // The rows spread_small_rows is for: few 16-bit forward rows of more than 4 packs per lane of a warp.
  bool few_small_rows_to_spread() const {
    return !p_.backward && g_.in_bytes == 2 && g_.rows <= Heuristics::kSmallRowsPerSm * props_.sm_count &&
           g_.n_packs > 4 * 32;
  }

  // Few 16-bit warp-sized rows that would need 8 packs per lane (a few warps per SM): nothing hides a lane's
  // chain of 8 packs, so a CTA per row spreads the row over up to kSmallRowSpreadThreads threads, one pack
  // each. H200, 2026-11-22, softmax xCopy warp -> spread: 37 x 2048 fp16 0.69 -> 0.87, bf16 0.67 -> 0.78;
  // 128 x 2048 fp16 0.78 -> 0.89, bf16 0.77 -> 0.90. With 4 packs per lane or fp32 rows the warp kernel
  // was as fast or faster (128 x 1024 fp16 0.85 vs 0.77, 264 x 512 fp16 0.96 vs 0.81, fp32 0.91 vs 0.83).
  // Since session 38 fewer rows than SMs take the lean instance first (lean_rows, kLeanFewMinColumns), so this
  // plan runs 132-264 rows of 129-255 packs.
  std::optional<SoftmaxChoice> spread_small_rows() {
    if (g_.vec == 1 || g_.peel || !few_small_rows_to_spread()) return std::nullopt;
    const auto shape = cache_shape(g_.n_packs, g_, Heuristics::kSharedCtaMaxThreads, shared_smem_budget(props_),
                                   Heuristics::kSmallRowSpreadThreads);
    if (!shape || shape->smem_packs != 0) return std::nullopt;
    return ok(plan_cached(g_, props_, *shape, 1),
              std::to_string(g_.rows) + " rows of " + kib(g_.row_bytes) + " (<= " +
                  std::to_string(Heuristics::kSmallRowsPerSm) + " per SM): a CTA per row spreads it over " +
                  std::to_string(shape->threads) + " threads, so each thread's chain stays short");
  }

  // Few rows over every SM: the most CTAs per row such that all rows' CTAs are resident at once (the
  // occupancy API's answer) and each chunk has at least kClusterMinChunkBytes (forced: at least 2 CTAs
  // per row, any chunk). CTAs of up to kGridCtaThreads threads with the fewest packs per thread, or up to
  // 1024 threads owning their SM when a chunk does not fit otherwise.
  std::optional<SoftmaxChoice> grid_group(bool forced) {
    if (!clusters_supported()) return std::nullopt;  // planned (and compiled) for sm_90 only
    for (const bool exclusive : {false, true}) {
      const int max_threads = exclusive ? kBlockKernelMaxThreads : Heuristics::kGridCtaThreads;
      const int64_t budget = exclusive ? exclusive_smem_budget(props_) : shared_smem_budget(props_);
      const int64_t slots = props_.sm_count * (exclusive ? 1 : 2);
      int64_t ctas_per_row = slots / g_.rows;
      if (!forced) {
        const int64_t most = g_.n_packs * g_.pack_bytes * g_.streams / Heuristics::kClusterMinChunkBytes;
        ctas_per_row = std::min(ctas_per_row, most);
      }
      ctas_per_row = std::min(ctas_per_row, g_.n_packs);
      for (; ctas_per_row >= 2; --ctas_per_row) {
        const int64_t chunk = ceil_div(g_.n_packs, ctas_per_row);
        const auto shape = cache_shape(chunk, g_, max_threads, budget, max_threads, /*group=*/true);
        if (!shape) break;  // fewer CTAs only make the chunk larger
        const SoftmaxPlan plan = plan_grid_group(g_, *shape, ctas_per_row);
        if (resident(plan) < plan.grid) continue;
        return ok(plan, std::to_string(ctas_per_row) + " CTAs per row over every SM (one cooperative launch), each " +
                            "caching " + kib(chunk * g_.pack_bytes * g_.streams) + " on chip; partial results " +
                            "merged in fixed order after one grid barrier: one read, one write");
      }
    }
    return std::nullopt;
  }

  // Few rows too long for every CTA slot of the device to cache its chunk (millions of elements): the grid
  // group of grid_group with CTAs that cache what fits (kGridCtaThreads threads, a few register packs, all
  // of their shared-memory share) and fold the rest of their chunk straight from global memory, then re-read
  // it. One launch instead of split_row's two, at least a seventh of the row never re-read (the rule
  // below), and each chunk re-read by the CTA that read it first.
  //
  // Automatic only while a CTA caches at least 1 / kGridStreamMaxChunkPerCache of its chunk. H200, 2026-11-22
  // (softmax xCopy, grid streamed vs split_row): 3 x 5000000 fp16 0.77 vs 0.58, fp32 0.73 vs 0.59 (chunk
  // 1.2-2.5x the cache); 4 x 8388608 fp16 0.63 vs 0.54, fp32 0.65 vs 0.59 (1.9x, 3.9x); 4 x 33554432 fp16
  // 0.51 vs 0.51, fp32 0.51 vs 0.54 (7.8x, 15.6x): with little cached, split_row's 8 packs in flight per
  // thread in its folding pass (the grid kernel holds 4 under its 64-register budget) win. Up to 4x then;
  // 7x since split_row's interleaved parts (session 18, H100, two runs, forced kernels,
  // *session18-c6-tune-*): at 6.9x the grid group still wins (float32 4 x 8388608 and 8 x 4194304
  // softmax_backward 224.6 / 225.1 vs 236.9 / 236.6 us, log_softmax_backward 188.6 / 189.5 vs 194.0 /
  // 193.3); at 7.8x split_row now wins (*session18-c8-tune-7x*: softmax 4 x 33554432 fp16 292.8 vs 326.5 us,
  // 8 x 8388608 fp32 287.9 vs 316.0), and at 3.9x the grid group (8 x 8388608 fp16 146.1 vs 151.6).
  std::optional<SoftmaxChoice> grid_group_streamed(bool forced) {
    if (!clusters_supported() || g_.peel) return std::nullopt;  // no peeled streaming instance
    const int64_t ctas_per_row = std::min<int64_t>(2 * props_.sm_count / g_.rows, g_.n_packs);
    if (ctas_per_row < 2) return std::nullopt;
    const int threads = Heuristics::kGridCtaThreads;
    const int reg_packs = grid_stream_reg_packs(p_.in_dtype, p_.backward, g_.vec > 1);
    const int64_t slot_bytes = static_cast<int64_t>(threads) * g_.pack_bytes * g_.streams;
    const int64_t chunk = ceil_div(g_.n_packs, ctas_per_row);
    // All of the CTA's share of shared memory, less a pack per thread at a time while two CTAs do not fit
    // (the static shared memory of the float64 instances exceeds kSmemReservePerCta).
    for (int64_t smem_packs = shared_smem_budget(props_) / slot_bytes; smem_packs >= 0; --smem_packs) {
      const int64_t cached = static_cast<int64_t>(threads) * (reg_packs + smem_packs);
      if (!forced && chunk > Heuristics::kGridStreamMaxChunkPerCache * cached) return std::nullopt;
      const CacheShape shape{threads, reg_packs, static_cast<int>(smem_packs),
                             static_cast<size_t>(smem_packs * slot_bytes)};
      SoftmaxPlan plan = plan_grid_group(g_, shape, ctas_per_row);
      plan.stream_rest = true;
      if (resident(plan) < plan.grid) continue;
      return ok(plan, std::to_string(ctas_per_row) + " CTAs per row over every SM (one cooperative launch), each " +
                          "caching " + kib(cached * g_.pack_bytes * g_.streams) + " of its " +
                          kib(chunk * g_.pack_bytes * g_.streams) + " chunk on chip and re-reading the rest; " +
                          "partial results merged in fixed order after one grid barrier");
    }
    return std::nullopt;
  }

  // The first cluster size, trying first, first + 1, ..., kMaxClusterCtas, then first - 1, ..., 2, whose
  // per-CTA chunk fits (shared or exclusive budget) and which the device can schedule.
  std::optional<SoftmaxChoice> try_clusters(int first, bool exclusive) {
    if (!clusters_supported()) return std::nullopt;
    const int max_threads = exclusive ? kBlockKernelMaxThreads : Heuristics::kSharedCtaMaxThreads;
    const int64_t budget = exclusive ? exclusive_smem_budget(props_) : shared_smem_budget(props_);
    first = std::clamp(first, 2, kMaxClusterCtas);
    for (int step = 0; step <= kMaxClusterCtas - 2; ++step) {
      const int cluster = first + step <= kMaxClusterCtas ? first + step : kMaxClusterCtas - step;
      const int64_t chunk = ceil_div(g_.n_packs, cluster);
      auto shape = cache_shape(chunk, g_, max_threads, budget, /*spread_threads=*/0, /*group=*/true);
      if (!shape) continue;
      SoftmaxPlan plan = plan_cached(g_, props_, *shape, cluster);
      if (resident(plan) == 0) continue;  // the device cannot schedule one cluster of this size
      return ok(plan, "a cluster of " + std::to_string(cluster) + " CTAs per row, each caching " +
                          kib(chunk * g_.pack_bytes * g_.streams) + " on chip; partial (max, sum) merged through " +
                          "distributed shared memory in fixed order: one read, one write");
    }
    return std::nullopt;
  }

  bool clusters_supported() const { return props_.cc_major >= 9; }

  // Clusters from the size that spreads the rows over every SM (2 at least, kMaxClusterCtas at most), then from
  // 2; CTAs that leave room for a second on their SM first (try_clusters). The forced cluster_onepass plan.
  std::optional<SoftmaxChoice> filling_clusters() {
    if (!clusters_supported()) return std::nullopt;
    const int64_t fill = std::max<int64_t>(2, ceil_div(props_.sm_count, g_.rows));
    const int first = static_cast<int>(std::min<int64_t>(fill, kMaxClusterCtas));
    for (int start : {first, 2}) {
      if (auto choice = try_clusters(start, false)) return choice;
      if (auto choice = try_clusters(start, true)) return choice;
    }
    return std::nullopt;
  }

  // Row groups of `plan` the device holds at once: clusters for a cluster plan, CTAs otherwise. The occupancy
  // API's answer (non-portable cluster sizes need a GPC with that many free SMs), cached per configuration.
  // Without a device (explain on a CPU machine), an estimate: two CTAs per SM when each leaves room for a
  // second, one otherwise.
  int64_t resident(const SoftmaxPlan& plan) const {
    if (props_.assumed) {
      const bool shares_sm = plan.threads <= Heuristics::kSharedCtaMaxThreads &&
                             static_cast<int64_t>(plan.smem_bytes) <= shared_smem_budget(props_);
      return props_.sm_count * (shares_sm ? 2 : 1) / plan.cluster;
    }
    using Key = std::tuple<int, int, int, bool, int, int, int, size_t, int, bool, bool, bool, bool>;
    static std::mutex mutex;
    static std::map<Key, int> known;
    int device = 0;
    if (cudaGetDevice(&device) != cudaSuccess) return 0;
    const Key key{device,      static_cast<int>(p_.in_dtype), static_cast<int>(p_.out_dtype), p_.backward,
                  plan.vec,    plan.reg_packs,                plan.threads,                   plan.smem_bytes,
                  plan.cluster, plan.prefetch, plan.stream_rest, plan.lean, plan.peel};
    std::lock_guard<std::mutex> lock(mutex);
    auto it = known.find(key);
    if (it == known.end()) it = known.emplace(key, softmax_max_resident(p_, plan, props_.sm_count)).first;
    return it->second;
  }

  bool warp_fits() const { return g_.n_packs <= 32 * kWarpKernelMaxPacks; }

  // Whether warp_rows takes these rows: they fit a warp, within warp_max_row_bytes.
  bool warp_takes_rows() const { return warp_fits() && p_.n * g_.in_bytes <= warp_max_row_bytes(); }

  // The longest row (bytes per input) the warp kernel takes. 16-bit forward rows of 2-4 KB need 8 packs
  // per lane (~123 registers, 16 warps per SM): one wave of rows runs best there (no barrier), but with
  // more rows the block kernel's 32 threads x 8 packs at 64 registers (32 warps per SM) wins. H200,
  // 2026-11-22: 2048x2048 fp16 warp 0.90 / block 0.81 of copy; 32768x2048 fp16 0.85 / 0.92, bf16 0.70 / 0.94.
  // Widening rows (a float32 result) keep the warp kernel, but for the few that spread_small_rows or (fewer rows
  // than SMs) the lean instance takes: see lean_rows.
  int64_t warp_max_row_bytes() const {
    const bool one_wave = g_.rows <= Heuristics::kWarpRowsPerSmOneWave * props_.sm_count;
    if (p_.backward) {
      // Many float32 rows of 2-4 KB that break packs: the peeled warp kernel, where the peeled block kernel runs
      // CTAs of 64 threads with 4 packs each. H100, session 21 call 6 (one run, us, the automatic block_onepass ->
      // forced warp; *session21-c6-fp32-backward-warp-vs-block.txt*): softmax_backward / log_softmax_backward 8192 x
      // 1023 46.0 / 45.7 -> 41.7 / 42.1 (torch.compile 40.4 in call 5), 16384 x 513 44.7 / 45.8 -> 41.2 / 41.7;
      // whole packs keep the block kernel (8192 x 1024 40.1 / 39.5 against warp 41.2 / 41.0).
      if (g_.peel && g_.in_bytes == 4 && !one_wave) return Heuristics::kWarpMaxRowBytes;
      return Heuristics::kWarpMaxRowBytesBackward;
    }
    if (g_.in_bytes == 2 && !one_wave && !g_.widening) return Heuristics::kWarpMaxRowBytes / 2;
    return Heuristics::kWarpMaxRowBytes;
  }

  SoftmaxChoice forced() {
    const std::string& name = request_.forced;
    // The kernels with a peeled form run peelable rows peeled when they can (grid_onepass: unless its chunks
    // must be streamed); the others, and those cases, with single elements.
    const bool has_peeled_form = name == "warp" || name == "block_onepass" || name == "cluster_onepass" ||
                                 name == "grid_onepass" || name == "two_pass" || name == "split_row";
    if (!g_.peel && has_peeled_form && peelable(request_)) {
      SoftmaxChoice choice = Chooser(request_, props_, RowView::kPeeled).forced();
      if (choice.error.empty()) return choice;
    }
    const std::string prefix = "the forced kernel '" + name + "' (softmax_ops.force_kernel) cannot run this " +
                               "problem (rows=" + std::to_string(g_.rows) + ", n=" + std::to_string(p_.n) +
                               ", inner=" + std::to_string(p_.inner) + ", " + dtype_name(p_.in_dtype) + "): ";
    if (name == "strided") return ok(plan_strided(p_, props_), "forced");
    if (p_.inner > 1) {
      return fail(prefix + "it needs the reduced dim to be the last (contiguous) one, but here every " +
                  std::to_string(p_.inner) + " elements separate two of a row's; force 'strided' or let the " +
                  "dispatcher choose");
    }
    if (name == "warp") {
      if (!warp_fits()) {
        return fail(prefix + "a warp holds at most 32 lanes x " + std::to_string(kWarpKernelMaxPacks) + " packs x " +
                    std::to_string(g_.vec) + " elements = " + std::to_string(32 * kWarpKernelMaxPacks * g_.vec) +
                    " columns");
      }
      return ok(plan_warp(g_, props_), "forced");
    }
    if (name == "block_onepass") {
      if (auto shape = cache_shape(g_.n_packs, g_, kBlockKernelMaxThreads, exclusive_smem_budget(props_))) {
        SoftmaxPlan plan = plan_cached(g_, props_, *shape, 1);
        add_row_prefetch(plan, g_, props_, /*forced=*/true);  // tests reach the prefetching instance here
        return ok(plan, "forced");
      }
      return fail(prefix + "the row (" + kib(g_.row_bytes) + ") exceeds one CTA's registers + shared memory");
    }
    if (name == "cluster_onepass") {
      if (!clusters_supported()) {
        return fail(prefix + "thread-block clusters need compute capability 9.0, this device has " +
                    std::to_string(props_.cc_major) + "." + std::to_string(props_.cc_minor));
      }
      if (auto choice = filling_clusters()) return *choice;
      return fail(prefix + "the row (" + kib(g_.row_bytes) + ") exceeds the registers + shared memory of a " +
                  "cluster of " + std::to_string(kMaxClusterCtas) + " CTAs");
    }
    if (name == "grid_onepass") {
      if (auto choice = grid_group(/*forced=*/true)) return *choice;
      if (auto choice = grid_group_streamed(/*forced=*/true)) return *choice;
      return fail(prefix + "it needs compute capability 9.0 and at least 2 resident CTAs per row; " +
                  std::to_string(props_.sm_count) + " SMs hold too few for " + std::to_string(g_.rows) + " rows");
    }
    if (name == "two_pass") return ok(plan_two_pass(g_, props_), "forced");
    if (name == "split_row") return ok(plan_split_row(g_, props_, true), "forced");
    return fail("unknown softmax kernel '" + name + "'");
  }

  static SoftmaxChoice ok(const SoftmaxPlan& plan, std::string reason) { return {plan, std::move(reason), ""}; }
  static SoftmaxChoice fail(std::string error) { return {SoftmaxPlan{}, "", std::move(error)}; }

  const SoftmaxRequest& request_;
  const SoftmaxProblem& p_;
  const DeviceProps& props_;
  const Geometry g_;
};

DeviceProps query_device_props(int device) {
  DeviceProps props;
  auto attribute = [&](cudaDeviceAttr attr, int fallback) {
    int value = 0;
    return cudaDeviceGetAttribute(&value, attr, device) == cudaSuccess ? value : fallback;
  };
  props.sm_count = attribute(cudaDevAttrMultiProcessorCount, props.sm_count);
  props.l2_bytes = attribute(cudaDevAttrL2CacheSize, static_cast<int>(props.l2_bytes));
  props.smem_per_block_optin = attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin, props.smem_per_block_optin);
  props.smem_per_sm = attribute(cudaDevAttrMaxSharedMemoryPerMultiprocessor, props.smem_per_sm);
  props.max_threads_per_sm = attribute(cudaDevAttrMaxThreadsPerMultiProcessor, props.max_threads_per_sm);
  props.max_ctas_per_sm = attribute(cudaDevAttrMaxBlocksPerMultiprocessor, props.max_ctas_per_sm);
  props.cc_major = attribute(cudaDevAttrComputeCapabilityMajor, props.cc_major);
  props.cc_minor = attribute(cudaDevAttrComputeCapabilityMinor, props.cc_minor);
  // Not cudaGetDeviceProperties: its struct layout follows the headers, and the runtime torch loads may be
  // another CUDA version than the toolkit compiled against (a mismatch overruns the struct).
  props.name = "CUDA device " + std::to_string(device);
  props.assumed = false;
  (void)cudaGetLastError();  // a failed attribute query falls back to the default; leave no error behind
  return props;
}

}  // namespace

const DeviceProps& device_props(int device) {
  static std::mutex mutex;
  static std::map<int, DeviceProps> cache;  // node-based: references stay valid as devices are added
  std::lock_guard<std::mutex> lock(mutex);
  auto it = cache.find(device);
  if (it == cache.end()) it = cache.emplace(device, query_device_props(device)).first;
  return it->second;
}

SoftmaxChoice choose_softmax_kernel(const SoftmaxRequest& request, const DeviceProps& props) {
  return Chooser(request, props).choose();
}

bool pointers_share_phase(const SoftmaxProblem& problem, const SoftmaxPointers& ptrs) {
  const uintptr_t vec = static_cast<uintptr_t>(16 / dtype_bytes(problem.in_dtype));
  auto phase = [&](const void* ptr, DType dtype) {
    const uintptr_t bytes = static_cast<uintptr_t>(dtype_bytes(dtype));
    const uintptr_t address = reinterpret_cast<uintptr_t>(ptr);
    return address % bytes != 0 ? ~uintptr_t{0} : address / bytes % vec;  // misaligned elements: no phase
  };
  const uintptr_t first = phase(ptrs.in0, problem.in_dtype);
  if (first == ~uintptr_t{0} || phase(ptrs.out, problem.out_dtype) != first) return false;
  return ptrs.in1 == nullptr || phase(ptrs.in1, problem.in_dtype) == first;
}

bool pointers_vector_aligned(const SoftmaxProblem& problem, const SoftmaxPointers& ptrs) {
  const int in_bytes = dtype_bytes(problem.in_dtype);
  const uintptr_t out_pack = static_cast<uintptr_t>(16 / in_bytes * dtype_bytes(problem.out_dtype));
  auto aligned = [](const void* ptr, uintptr_t bytes) { return reinterpret_cast<uintptr_t>(ptr) % bytes == 0; };
  return aligned(ptrs.in0, 16) && aligned(ptrs.in1, 16) && aligned(ptrs.out, out_pack);
}

const char* softmax_kernel_name(SoftmaxKernel kernel) { return kKernelNames[static_cast<int>(kernel)]; }

std::vector<std::string> softmax_kernel_names() {
  return std::vector<std::string>(std::begin(kKernelNames), std::end(kKernelNames));
}

// Text is built with std::string and std::to_string, not iostreams: on the GPU machine (torch 2.11, GCC 13)
// a std::ostringstream << integer inside the extension crashed (reported to the lead).
std::string describe_plan(const SoftmaxPlan& plan) {
  using std::to_string;
  std::string s = std::string(softmax_kernel_name(plan.kernel)) + ": " + to_string(plan.grid) + " CTAs x " +
                  to_string(plan.threads) + " threads, " + to_string(plan.vec) + " element(s) per access";
  switch (plan.kernel) {
    case SoftmaxKernel::kWarp:
      s += ", " + to_string(plan.lanes_per_row) + " lane(s) per row, " + to_string(plan.reg_packs) + " pack(s) per lane";
      if (plan.edges_per_lane > 1) s += ", " + to_string(plan.edges_per_lane) + " edge element slots per lane";
      break;
    case SoftmaxKernel::kBlockOnePass:
    case SoftmaxKernel::kClusterOnePass:
    case SoftmaxKernel::kGridOnePass:
      if (plan.cluster > 1) s += ", clusters of " + to_string(plan.cluster) + " CTAs per row";
      if (plan.kernel == SoftmaxKernel::kGridOnePass) s += ", " + to_string(plan.chunks) + " CTAs per row (cooperative)";
      s += ", " + to_string(plan.reg_packs) + " pack(s) per thread in registers + " + to_string(plan.smem_packs) +
           " in shared memory (" + kib(static_cast<int64_t>(plan.smem_bytes)) + " dynamic)";
      if (plan.prefetch) s += ", next row prefetched into shared memory";
      if (plan.stream_rest) s += ", the rest of each chunk streamed and re-read";
      if (plan.lean) {
        s += ", lean instance (a CTA per row, <= " + std::to_string(lean_max_registers(plan.reg_packs)) + " registers)";
      }
      break;
    case SoftmaxKernel::kSplitRow:
      s += ", " + to_string(plan.chunks) + " CTAs per row (its blocks of " + to_string(plan.threads) +
           " packs round robin), 2 launches, " + kib(static_cast<int64_t>(plan.workspace_bytes)) + " workspace";
      break;
    case SoftmaxKernel::kStrided:
      s += " (" + to_string(plan.block_x) + " across inner x " + to_string(plan.threads / plan.block_x) + " along n)";
      break;
    case SoftmaxKernel::kTwoPass:
      break;
  }
  if (plan.peel) s += ", rows peeled (aligned body in packs, edge elements singly)";
  return s;
}

cudaError_t launch_softmax_plan(const SoftmaxProblem& problem, const SoftmaxPlan& plan, const SoftmaxPointers& ptrs,
                                cudaStream_t stream) {
  switch (plan.kernel) {
    case SoftmaxKernel::kWarp:
      return launch_softmax_warp(problem, plan, ptrs, stream);
    case SoftmaxKernel::kBlockOnePass:
    case SoftmaxKernel::kClusterOnePass:
    case SoftmaxKernel::kGridOnePass:
      return launch_softmax_block(problem, plan, ptrs, stream);
    case SoftmaxKernel::kTwoPass:
    case SoftmaxKernel::kSplitRow:
    case SoftmaxKernel::kStrided:
      return launch_softmax_streaming(problem, plan, ptrs, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace softmax_ops
