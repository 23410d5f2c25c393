// CPU kernels of fused_topk (softmax -> top-k, optionally renormalised) and its backward.
//
// Selection is by logit: softmax is monotone in the logits, so the k largest probabilities belong to the
// k largest logits, and only those k probabilities are ever computed. Ranking (a total order, so every
// index is distinct and in [0, N) whatever the input): NaN first (like torch.topk), then larger logit
// first, equal logits to the lower index.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <algorithm>
#include <string>
#include <functional>
#include <numeric>
#include <tuple>
#include <utility>
#include <type_traits>
#include <vector>

#include "cpu_dispatch.h"
#include "cpu_row_math.h"
#include "softmax_ops/op_checks.h"

namespace softmax_ops::cpu {
namespace {

// Up to this k the top-k is kept in a sorted buffer updated by insertion; above it the row is ranked with
// nth_element (O(N)). The buffer also gives up (and the row goes to nth_element) after
// kInsertionBudgetPerK * k + N / 8 insertions: a random row needs about k * (1 + ln(N / k)), an ascending
// one needs N, each costing up to k moves.
constexpr int64_t kMaxInsertionK = 256;
constexpr int64_t kInsertionBudgetPerK = 4;

// Elements per chunk of the backward's one-pass (max, sum): small enough that the chunk's second read
// (for the sum) hits L1, so self is read from memory once for the statistics and once for the gradient.
constexpr int64_t kStatsChunk = 2048;

// Does logit a (index ia) rank before logit b (index ib)?
template <typename Acc>
SOFTMAX_OPS_CPU_INLINE bool ranks_before(Acc a, int64_t ia, Acc b, int64_t ib) {
  const bool a_nan = std::isnan(a);
  const bool b_nan = std::isnan(b);
  if (a_nan || b_nan) return a_nan && (!b_nan || ia < ib);
  return a > b || (a == b && ia < ib);
}

// Does a logit with a HIGHER index than w's rank before w? (Ties stay with the earlier index.)
template <typename Acc>
SOFTMAX_OPS_CPU_INLINE bool later_beats(Acc v, Acc w) {
  return std::isnan(v) ? !std::isnan(w) : v > w;  // v > NaN is false: nothing later beats a NaN
}

// The k best positions of row x (length n), best first, into top_index; top_logit is scratch of size k.
// Returns false (top_index unusable) when the insertion budget runs out.
// Once the buffer is full, 64 logits at a time are compared with the current k-th (vectorised) and only a
// block holding a candidate (or a NaN) is walked element by element: for typical rows almost none is.
template <typename Acc, typename In>
SOFTMAX_OPS_CPU_INLINE bool select_topk_by_insertion(const In* x, int64_t n, int64_t k, Acc* top_logit,
                                                     int64_t* top_index) {
  int64_t count = 0;
  int64_t budget = kInsertionBudgetPerK * k + n / 8;
  auto consider = [&](int64_t j) {
    const Acc v = to_acc<Acc>(x[j]);
    if (count == k) {
      if (!later_beats(v, top_logit[k - 1])) return;
      --count;  // the current k-th is pushed out
    }
    // The buffer is sorted by rank, so "v beats it" is false then true along it: binary search.
    int64_t lo = 0;
    int64_t hi = count;
    while (lo < hi) {
      const int64_t mid = (lo + hi) / 2;
      if (later_beats(v, top_logit[mid])) {
        hi = mid;
      } else {
        lo = mid + 1;
      }
    }
    for (int64_t pos = count; pos > lo; --pos) {
      top_logit[pos] = top_logit[pos - 1];
      top_index[pos] = top_index[pos - 1];
    }
    top_logit[lo] = v;
    top_index[lo] = j;
    ++count;
    --budget;
  };
  int64_t j = 0;
  for (; j < n && count < k; ++j) consider(j);
  if constexpr (std::is_same_v<Acc, float>) {
    constexpr int64_t kBlock = 4 * kVecWidth;  // one mask test per 4 vectors: the test is the costly part
    for (; j + kBlock <= n && budget > 0; j += kBlock) {
      const float kth = top_logit[k - 1];
      const FloatVec v0 = load_vec(x + j);
      const FloatVec v1 = load_vec(x + j + kVecWidth);
      const FloatVec v2 = load_vec(x + j + 2 * kVecWidth);
      const FloatVec v3 = load_vec(x + j + 3 * kVecWidth);
      const IntVec beats = (v0 > kth) | (v1 > kth) | (v2 > kth) | (v3 > kth);
      const IntVec nan = (v0 != v0) | (v1 != v1) | (v2 != v2) | (v3 != v3);
      if (!any_lane(beats | nan)) continue;
      for (int64_t b = j; b < j + kBlock; ++b) consider(b);
    }
  }
  for (; j < n && budget > 0; ++j) consider(j);
  return j == n && budget >= 0;
}

// A 64-bit key whose unsigned order is the ranking: the logit's order-preserving bits above (every NaN
// highest, -0 folded into +0 so equal logits tie), the complemented index below (lower index first).
SOFTMAX_OPS_CPU_INLINE uint64_t rank_key(float v, int64_t index) {
  uint32_t bits = bit_cast_to<uint32_t>(v + 0.0f);
  bits = (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
  bits = v != v ? 0xFFFFFFFFu : bits;
  return (static_cast<uint64_t>(bits) << 32) | (0xFFFFFFFFu - static_cast<uint32_t>(index));
}

// Same result for any k: nth_element around the k-th, then sort the first k. float rows shorter than 2^32
// rank packed keys (contiguous, branch-free compares); others rank indices with ranks_before.
template <typename Acc, typename In>
void select_topk_by_partition(const In* x, int64_t n, int64_t k, std::vector<uint64_t>& scratch,
                              int64_t* top_index) {
  scratch.resize(n);
  if (std::is_same_v<Acc, float> && n <= (int64_t{1} << 32)) {
    for (int64_t j = 0; j < n; ++j) scratch[j] = rank_key(to_acc<float>(x[j]), j);
    std::nth_element(scratch.begin(), scratch.begin() + (k - 1), scratch.end(), std::greater<uint64_t>());
    std::sort(scratch.begin(), scratch.begin() + k, std::greater<uint64_t>());
    for (int64_t j = 0; j < k; ++j) top_index[j] = 0xFFFFFFFFu - static_cast<uint32_t>(scratch[j]);
    return;
  }
  std::iota(scratch.begin(), scratch.end(), uint64_t{0});
  auto before = [x](uint64_t a, uint64_t b) {
    return ranks_before(to_acc<Acc>(x[a]), static_cast<int64_t>(a), to_acc<Acc>(x[b]), static_cast<int64_t>(b));
  };
  std::nth_element(scratch.begin(), scratch.begin() + (k - 1), scratch.end(), before);
  std::sort(scratch.begin(), scratch.begin() + k, before);
  std::copy(scratch.begin(), scratch.begin() + k, top_index);
}

// Rows [begin, end): values = softmax(x)[top-k] (sorted), optionally divided by their sum.
// The probabilities are exp(x - m) / s exactly as softmax_rows computes them. Renormalised values are the
// softmax of the k selected logits, exp(x - m) / sum over the k, with that sum in a wider type (Wide): a
// sequential float sum of k terms drifted with k (k = 1024 on random rows: 2.0e-6 relative error against
// torch's 3.6e-7 for `v / v.sum(dim, keepdim=True)`, whose sum is pairwise), and the row's own sum is not
// needed at all.
template <typename In, typename Out>
SOFTMAX_OPS_CPU_MULTIVERSION void fused_topk_rows(const In* x, Out* values, int64_t* indices, int64_t n,
                                                  int64_t k, bool renormalize, int64_t begin, int64_t end) {
  using Acc = acc_type<In>;
  using Wide = std::conditional_t<std::is_same_v<Acc, float>, double, long double>;
  std::vector<Acc> probs(k);
  std::vector<uint64_t> scratch;
  for (int64_t row = begin; row < end; ++row) {
    const In* xr = x + row * n;
    int64_t* idx = indices + row * k;
    if (k > kMaxInsertionK || !select_topk_by_insertion<Acc>(xr, n, k, probs.data(), idx)) {
      select_topk_by_partition<Acc>(xr, n, k, scratch, idx);
    }
    const Acc m = row_max(xr, n);
    Out* vr = values + row * k;
    if (renormalize) {
      // m is also the largest selected logit; a NaN or +inf in the row (m NaN or inf) or an all -inf row
      // make every exp(x - m) NaN, as torch's softmax does before its topk.
      Wide total = 0;
      for (int64_t j = 0; j < k; ++j) {
        probs[j] = fast_exp(to_acc<Acc>(xr[idx[j]]) - m);
        total += probs[j];
      }
      for (int64_t j = 0; j < k; ++j) vr[j] = from_acc<Out>(static_cast<Acc>(probs[j] / total));
      continue;
    }
    const Acc inv_sum = Acc(1) / row_sum_exp(xr, m, n);
    for (int64_t j = 0; j < k; ++j) vr[j] = from_acc<Out>(fast_exp(to_acc<Acc>(xr[idx[j]]) - m) * inv_sum);
  }
}

// (max, sum exp(x - max)) of a row in one pass over memory, chunk by chunk, merged with the online-softmax
// rule. A chunk (or prefix) whose max is -inf contributes 0, not exp(-inf - -inf) = NaN, so a row with a
// long -inf prefix is still exact; NaN and +inf still make the sum NaN as in the forward.
template <typename Acc, typename T>
SOFTMAX_OPS_CPU_INLINE std::pair<Acc, Acc> row_max_and_sum_exp(const T* x, int64_t n) {
  constexpr Acc kNegInf = -std::numeric_limits<Acc>::infinity();
  Acc m = kNegInf;
  Acc s = 0;
  for (int64_t start = 0; start < n; start += kStatsChunk) {
    const int64_t len = std::min(kStatsChunk, n - start);
    const Acc chunk_max = row_max(x + start, len);
    if (chunk_max == kNegInf) continue;
    const Acc chunk_sum = row_sum_exp(x + start, chunk_max, len);
    const Acc new_m = chunk_max > m ? chunk_max : m;
    s = (m == kNegInf ? Acc(0) : s * fast_exp(m - new_m)) + chunk_sum * fast_exp(chunk_max - new_m);
    m = new_m;
  }
  return {m, s};
}

// Rows [begin, end) of the gradient w.r.t. x. g and v (the stored values) are in the compute type Acc.
//   plain:        dx_j = p_j * (G_j - S),  S = sum_k g_k v_k,  G_j = g_k where indices_k == j, else 0;
//   renormalised: dx_{i_k} = v_k * (g_k - sum_m g_m v_m), 0 elsewhere (v = the renormalised values).
template <typename T>
SOFTMAX_OPS_CPU_MULTIVERSION void fused_topk_backward_rows(const T* x, const acc_type<T>* g, const acc_type<T>* v,
                                                           const int64_t* indices, T* dx, int64_t n, int64_t k,
                                                           bool renormalize, int64_t begin, int64_t end) {
  using Acc = acc_type<T>;
  for (int64_t row = begin; row < end; ++row) {
    const Acc* gr = g + row * k;
    const Acc* vr = v + row * k;
    const int64_t* idx = indices + row * k;
    T* out = dx + row * n;
    const Acc weighted = sum_row2(gr, vr, k, [](auto gv, auto vv) { return gv * vv; });
    if (renormalize) {
      std::fill(out, out + n, static_cast<T>(0));
      for (int64_t j = 0; j < k; ++j) out[idx[j]] = from_acc<T>(vr[j] * (gr[j] - weighted));
      continue;
    }
    const T* __restrict xr = x + row * n;
    const std::pair<Acc, Acc> max_and_sum = row_max_and_sum_exp<Acc>(xr, n);
    const Acc m = max_and_sum.first;  // a named variable, not a structured binding: C++17 lambdas capture it
    const Acc inv_sum = Acc(1) / max_and_sum.second;
    map_row(xr, out, n, [=](auto v) { return fast_exp(v - m) * inv_sum * -weighted; });
    for (int64_t j = 0; j < k; ++j) {
      const Acc p = fast_exp(to_acc<Acc>(xr[idx[j]]) - m) * inv_sum;
      out[idx[j]] = from_acc<T>(p * (gr[j] - weighted));
    }
  }
}

// Caller-supplied indices are checked before the kernels run: an exception must not leave a worker thread.
void check_indices_in_range(const at::Tensor& contiguous_indices, int64_t n) {
  const int64_t* idx = contiguous_indices.const_data_ptr<int64_t>();
  for (int64_t i = 0, count = contiguous_indices.numel(); i < count; ++i) {
    TORCH_CHECK_INDEX(idx[i] >= 0 && idx[i] < n, "softmax_ops.fused_topk_backward: index ", std::to_string(idx[i]),
                      " in indices is out of range for a dim of size ", std::to_string(n));
  }
}

std::vector<int64_t> dim_last_shape_with_k(const at::Tensor& dim_last, int64_t k) {
  std::vector<int64_t> shape = dim_last.sizes().vec();
  if (!shape.empty()) shape.back() = k;
  return shape;
}

std::tuple<at::Tensor, at::Tensor> fused_topk(const at::Tensor& self, int64_t k, int64_t dim, bool renormalize,
                                              c10::optional<at::ScalarType> dtype) {
  const at::ScalarType result_dtype = softmax_result_dtype(self, dtype, "fused_topk");
  const int64_t wrapped = wrap_dim(self, dim, "fused_topk");
  const int64_t n = check_topk_k(self, wrapped, k);
  const at::Tensor input = softmax_kernel_input(dim_last_view(self, wrapped), result_dtype);
  const std::vector<int64_t> shape = dim_last_shape_with_k(input, k);
  at::Tensor values = at::empty(shape, input.options().dtype(result_dtype));
  at::Tensor indices = at::empty(shape, input.options().dtype(at::kLong));
  const int64_t rows = row_count(input.numel(), n);
  if (rows > 0) {
    dispatch_dtype_pair<true>(input.scalar_type(), result_dtype, [&](auto in_tag, auto out_tag) {
      using In = typename decltype(in_tag)::type;
      using Out = typename decltype(out_tag)::type;
      const In* x = input.const_data_ptr<In>();
      Out* v = values.mutable_data_ptr<Out>();
      int64_t* idx = indices.mutable_data_ptr<int64_t>();
      at::parallel_for(0, rows, rows_grain(n), [&](int64_t begin, int64_t end) {
        fused_topk_rows(x, v, idx, n, k, renormalize, begin, end);
      });
    });
  }
  return {restore_dim_order(values, wrapped), restore_dim_order(indices, wrapped)};
}

// The gradient is computed in the dtype the forward kernel read (self's, or the forward's dtype= when that
// was a real cast, see softmax_kernel_input) and cast to self's dtype at the end, like torch's autograd
// through the cast.
at::Tensor fused_topk_backward(const at::Tensor& grad_values, const at::Tensor& self, const at::Tensor& values,
                               const at::Tensor& indices, int64_t dim, bool renormalize) {
  const int64_t wrapped = check_topk_backward_args(grad_values, self, values, indices, dim);
  const at::ScalarType values_dtype = values.scalar_type();
  const at::ScalarType self_dtype = self.scalar_type();
  const bool read_directly = self_dtype == values_dtype ||
                             (values_dtype == at::kFloat && (self_dtype == at::kHalf || self_dtype == at::kBFloat16));
  const at::ScalarType work_dtype = read_directly ? self_dtype : values_dtype;
  // The renormalised gradient never reads x: only its shape is needed.
  const at::Tensor x = renormalize ? dim_last_view(self, wrapped) : with_dim_last(self.to(work_dtype), wrapped);
  const at::Tensor idx = with_dim_last(indices, wrapped);
  const int64_t n = row_length(x);
  const int64_t k = row_length(idx);
  const at::ScalarType acc_dtype = work_dtype == at::kDouble ? at::kDouble : at::kFloat;
  const at::Tensor g = with_dim_last(grad_values.to(acc_dtype), wrapped);
  const at::Tensor v = with_dim_last(values.to(acc_dtype), wrapped);
  check_indices_in_range(idx, n);
  at::Tensor grad_self = at::empty(x.sizes(), x.options().dtype(work_dtype));
  const int64_t rows = row_count(grad_self.numel(), n);
  if (rows > 0) {
    dispatch_floating(work_dtype, [&](auto tag) {
      using T = typename decltype(tag)::type;
      using Acc = acc_type<T>;
      const T* x_ptr = renormalize ? nullptr : x.const_data_ptr<T>();
      const Acc* g_ptr = g.const_data_ptr<Acc>();
      const Acc* v_ptr = v.const_data_ptr<Acc>();
      const int64_t* idx_ptr = idx.const_data_ptr<int64_t>();
      T* out = grad_self.mutable_data_ptr<T>();
      at::parallel_for(0, rows, rows_grain(n), [&](int64_t begin, int64_t end) {
        fused_topk_backward_rows(x_ptr, g_ptr, v_ptr, idx_ptr, out, n, k, renormalize, begin, end);
      });
    });
  }
  at::Tensor restored = restore_dim_order(grad_self, wrapped);
  return work_dtype == self_dtype ? restored : restored.to(self_dtype);
}

}  // namespace
}  // namespace softmax_ops::cpu

TORCH_LIBRARY_IMPL(softmax_ops, CPU, m) {
  m.impl("fused_topk", &softmax_ops::cpu::fused_topk);
  m.impl("fused_topk_backward", &softmax_ops::cpu::fused_topk_backward);
}
