// Launches the block / cluster / grid one-pass kernel (forward and backward), and answers how many clusters
// or CTAs of a configuration can be resident on the current device at once.
#include "softmax_block_kernel.cuh"

namespace softmax_ops {
namespace {

using detail::BlockOptions;
using detail::RowArgs;

constexpr int kPortableClusterSize = 8;

// Calls fn(kernel pointer, args) for the instantiation the plan names.
template <typename F>
cudaError_t with_block_kernel(const SoftmaxProblem& problem, const SoftmaxPlan& plan, const SoftmaxPointers& ptrs,
                              F&& fn) {
  using namespace detail;
  return dispatch_row_op(problem, [&](auto op) {
    using Op = decltype(op);
    const RowArgs<Op> args = make_row_args(op, problem, ptrs);
    return dispatch_vec<typename Op::In>(plan.vec, [&](auto vec) {
      return dispatch_int(RegPackBuckets{}, plan.reg_packs, [&](auto reg_packs) -> cudaError_t {
        constexpr int kVec = std::decay_t<decltype(vec)>::value;
        constexpr int kRegPacks = std::decay_t<decltype(reg_packs)>::value;
        // Fewer packs than the maximum: few-rows clusters and grid groups spread over threads (cache_shape) and
        // the streaming grid instance; vector path only.
        // The prefetching variant: forward, many rows (always the maximum packs), vector path.
        constexpr bool kCanPrefetch = Op::kStreams == 1 && kRegPacks == kMaxRegPacks<Op> && kVec > 1;
        // The streaming grid instance: one register bucket per (op, vector width).
        constexpr bool kCanStream =
            kRegPacks == grid_stream_reg_packs(kDTypeOf<typename Op::In>, Op::kStreams == 2, kVec > 1);
        // The lean instance: 16-byte packs, the register packs of one of the op's lean forms (lean_instance).
        constexpr bool kBackward = Op::kStreams == 2;
        constexpr bool kWidening = !kBackward && !std::is_same_v<typename Op::In, typename Op::Out>;
        constexpr bool kCanLean =
            kVec > 1 && lean_instance(sizeof(typename Op::In), kBackward, kRegPacks, kWidening, /*peel=*/false);
        constexpr bool kCanLeanPeel =
            kVec > 1 && lean_instance(sizeof(typename Op::In), kBackward, kRegPacks, kWidening, /*peel=*/true);
        // Peeled rows (plan.peel): 16-byte packs, the most register packs (like single elements: see cache_shape),
        // the lean forms' packs, or the fewer packs of a spread few-rows plan (peel_few_rows; peeled_instance).
        constexpr bool kCanPeel =
            kVec > 1 && peeled_instance(kDTypeOf<typename Op::In>, kDTypeOf<typename Op::Out>, kBackward, kRegPacks);
        if constexpr (kRegPacks <= kMaxRegPacks<Op> && (kVec > 1 || kRegPacks == kMaxRegPacks<Op>)) {
          if (plan.peel) {
            if (plan.stream_rest || plan.prefetch) return cudaErrorInvalidValue;  // never planned
            if (plan.lean) {
              if constexpr (kCanLeanPeel) {
                return fn(softmax_block_kernel<Op, kVec, kRegPacks, false, false, true, true>, args);
              } else {
                return cudaErrorInvalidValue;  // never planned: see lean_rows
              }
            }
            if constexpr (kCanPeel) {
              return fn(softmax_block_kernel<Op, kVec, kRegPacks, false, false, false, true>, args);
            } else {
              return cudaErrorInvalidValue;  // never planned: see cache_shape and peel_few_rows
            }
          }
          if (plan.lean) {
            if constexpr (kCanLean) {
              return fn(softmax_block_kernel<Op, kVec, kRegPacks, false, false, true>, args);
            } else {
              return cudaErrorInvalidValue;  // never planned: see lean_rows
            }
          }
          if (plan.stream_rest) {
            if constexpr (kCanStream) {
              return fn(softmax_block_kernel<Op, kVec, kRegPacks, false, true>, args);
            } else {
              return cudaErrorInvalidValue;  // never planned: see grid_group_streamed
            }
          }
          if (plan.prefetch) {
            if constexpr (kCanPrefetch) {
              return fn(softmax_block_kernel<Op, kVec, kRegPacks, true>, args);
            } else {
              return cudaErrorInvalidValue;  // never planned: see add_row_prefetch
            }
          }
          return fn(softmax_block_kernel<Op, kVec, kRegPacks>, args);
        } else {
          return cudaErrorInvalidValue;  // never planned: see cache_shape
        }
      });
    });
  });
}

// A cluster launch (cluster_onepass), or a cooperative one (grid_onepass: the driver refuses it unless every
// CTA can be resident at once, which the grid barrier needs).
cudaLaunchConfig_t group_launch_config(const SoftmaxPlan& plan, cudaStream_t stream, cudaLaunchAttribute* attribute) {
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(static_cast<unsigned>(plan.grid));
  config.blockDim = dim3(plan.threads);
  config.dynamicSmemBytes = plan.smem_bytes;
  config.stream = stream;
  if (plan.kernel == SoftmaxKernel::kGridOnePass) {
    attribute->id = cudaLaunchAttributeCooperative;
    attribute->val.cooperative = 1;
  } else {
    attribute->id = cudaLaunchAttributeClusterDimension;
    attribute->val.clusterDim.x = plan.cluster;
    attribute->val.clusterDim.y = 1;
    attribute->val.clusterDim.z = 1;
  }
  config.attrs = attribute;
  config.numAttrs = 1;
  return config;
}

// Function attributes a launch of `plan` needs, each set once per (kernel, device).
template <typename Kernel>
cudaError_t prepare(Kernel kernel, const SoftmaxPlan& plan) {
  const cudaError_t err = detail::allow_dynamic_smem(kernel, plan.smem_bytes);
  if (err != cudaSuccess || plan.cluster <= kPortableClusterSize) return err;
  return detail::allow_non_portable_clusters(kernel);
}

}  // namespace

cudaError_t launch_softmax_block(const SoftmaxProblem& problem, const SoftmaxPlan& plan,
                                 const SoftmaxPointers& ptrs, cudaStream_t stream) {
  const bool grid_group = plan.kernel == SoftmaxKernel::kGridOnePass;
  // Whole warps: the lane-pair stores of widening results shuffle over all 32 lanes (store_pack_where).
  if (plan.cluster < 1 || plan.grid % plan.cluster != 0 || plan.threads % 32 != 0) return cudaErrorInvalidValue;
  if (plan.lean && (plan.threads > lean_cta_threads(plan.reg_packs) || plan.cluster != 1 || plan.smem_packs != 0)) {
    return cudaErrorInvalidValue;
  }
  if (grid_group && (plan.cluster != 1 || plan.chunks < 1 || plan.grid % plan.chunks != 0 || ptrs.workspace == nullptr)) {
    return cudaErrorInvalidValue;
  }
  BlockOptions options;
  if (grid_group) {
    options.grid_group_size = static_cast<int>(plan.chunks);
    options.partials = ptrs.workspace;
  }
  return with_block_kernel(problem, plan, ptrs, [&](auto kernel, const auto& args) {
    cudaError_t err = prepare(kernel, plan);
    if (err != cudaSuccess) return err;
    if (plan.cluster == 1 && !grid_group) {
      kernel<<<static_cast<unsigned>(plan.grid), plan.threads, plan.smem_bytes, stream>>>(args, plan.smem_packs, options);
      return cudaGetLastError();
    }
    cudaLaunchAttribute attribute{};
    const cudaLaunchConfig_t config = group_launch_config(plan, stream, &attribute);
    err = cudaLaunchKernelEx(&config, kernel, args, plan.smem_packs, options);
    return err != cudaSuccess ? err : cudaGetLastError();
  });
}

int softmax_max_resident(const SoftmaxProblem& problem, const SoftmaxPlan& plan, int sm_count) {
  int count = 0;
  const cudaError_t err = with_block_kernel(problem, plan, SoftmaxPointers{}, [&](auto kernel, const auto&) {
    const cudaError_t e = prepare(kernel, plan);
    if (e != cudaSuccess) return e;
    if (plan.cluster == 1) return cudaOccupancyMaxActiveBlocksPerMultiprocessor(&count, kernel, plan.threads, plan.smem_bytes);
    cudaLaunchAttribute attribute{};
    const cudaLaunchConfig_t config = group_launch_config(plan, nullptr, &attribute);
    return cudaOccupancyMaxActiveClusters(&count, kernel, &config);
  });
  if (err != cudaSuccess) {
    (void)cudaGetLastError();  // a refused query is an answer ("none"), not an error for later calls to see
    return 0;
  }
  return plan.cluster == 1 ? count * sm_count : count;
}

}  // namespace softmax_ops
