// Device building blocks of the fused_topk kernels, one header per part:
//   topk_elements.cuh      element loads and stores, -inf / NaN, the warp mask
//   topk_keys.cuh          order-preserving keys and (key, index) candidates: the ranking
//   topk_stats.cuh         exp and the online (max, sum) with torch's NaN/inf rules
//   topk_select.cuh        block-wide selection in shared memory: append, radix threshold, compaction, sorts
//   topk_type_dispatch.h   host-side template dispatch of the launch functions
// CUDA headers only (no ATen).
#pragma once

#include "topk_elements.cuh"
#include "topk_keys.cuh"
#include "topk_select.cuh"
#include "topk_stats.cuh"
#include "topk_type_dispatch.h"
