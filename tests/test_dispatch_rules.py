"""The softmax dispatcher's size rules, read through ``softmax_ops.explain``.

explain needs no GPU: without one it plans for an assumed H100 (132 SMs, 228 KB shared memory per SM), so
these run in CPU-only CI wherever the CUDA kernels were compiled. On a GPU they run when it has 132 SMs
(H100 / H200), the device the rules were measured on. Each case restates a rule documented in
csrc/softmax/softmax_dispatch.cpp with the measurement behind it.
"""

from __future__ import annotations

import pytest
import torch
from conftest import (
    block_capacity_packs,
    max_block_reg_packs,
    plan_line,
    register_packs,
    shared_packs,
    vec16,
    whole_warps,
)

import softmax_ops

CUDA_BUILT = bool(softmax_ops.list_kernels("softmax"))
SM_COUNT = torch.cuda.get_device_properties(0).multi_processor_count if torch.cuda.is_available() else 132

pytestmark = [
    pytest.mark.skipif(not CUDA_BUILT, reason="the CUDA kernels (and their dispatcher) were not compiled"),
    pytest.mark.skipif(SM_COUNT != 132, reason=f"rules asserted for 132-SM Hopper GPUs, this one has {SM_COUNT}"),
]


@pytest.mark.parametrize("op", ["softmax", "log_softmax", "softmax_backward"])
@pytest.mark.parametrize("shape,dtype", [((8, 262144), torch.float16), ((4, 1048576), torch.float32),
                                         ((8, 262144), torch.bfloat16)])
def test_few_long_rows_spread_over_every_sm_in_one_cooperative_launch(shape, dtype, op):
    line = plan_line(shape, dtype, op)
    assert "kernel grid_onepass" in line and "(cooperative)" in line, line
    ctas = int(line.split(": ")[1].split(" CTAs")[0])
    assert ctas > 16 * shape[0], line  # more CTAs per row than the largest cluster (16)


@pytest.mark.parametrize("shape,dtype,op,kernel,input_dtype", [
    ((4, 16384), torch.float16, "softmax", "cluster_onepass", None),   # rows of <= 256 KB: a cluster of 16 first
    ((4, 65536), torch.float32, "softmax", "cluster_onepass", None),
    ((4, 114688), torch.bfloat16, "softmax", "cluster_onepass", None),
    ((8, 131080), torch.float16, "softmax", "grid_onepass", None),     # 256 KB + one pack: the grid group
    ((3, 100003), torch.float16, "softmax", "cluster_onepass", None),  # peeled: its aligned body's cluster (session 34)
    # Up to 4 rows (clusters of 16 on at most half of 132 SMs): rows of <= 1 MB, all streams
    ((4, 262144), torch.float32, "softmax", "cluster_onepass", None),
    ((4, 262144), torch.float16, "softmax_backward", "cluster_onepass", None),
    ((4, 262148), torch.float32, "softmax", "grid_onepass", None),     # 1 MB + one pack
    ((8, 262144), torch.float16, "softmax", "grid_onepass", None),     # 8 rows: the 256 KB rule
    # Single elements (odd lengths: the float32 forward, and a float32 backward of a 16-bit input; few same-dtype
    # 16-bit rows and float32 backward rows run peeled at any packs), up to 4 rows: rows of <= 128 KB, all streams
    ((4, 16383), torch.float32, "softmax", "cluster_onepass", None),
    ((4, 16383), torch.float32, "softmax_backward", "cluster_onepass", torch.float16),
    ((4, 25001), torch.float32, "softmax_backward", "grid_onepass", torch.float16),  # 195 KB of two streams
    ((8, 16383), torch.float32, "softmax", "grid_onepass", None),                   # 8 rows
])
def test_few_rows_take_a_cluster_of_16_first_up_to_a_chunk_size(shape, dtype, op, kernel, input_dtype):
    line = plan_line(shape, dtype, op, input_dtype)  # a backward's input_dtype, where it differs: explain's out_dtype
    assert f"kernel {kernel}:" in line, line
    if kernel == "cluster_onepass":
        assert "clusters of 16 CTAs per row" in line, line


@pytest.mark.parametrize("shape,dtype,prefetched", [
    ((2048, 16384), torch.float16, True),
    ((1024, 12000), torch.bfloat16, True),
    ((2048, 4096), torch.float32, False),     # fp32: neutral to worse when measured
])
def test_many_16bit_rows_prefetch_the_next_row(shape, dtype, prefetched):
    line = plan_line(shape, dtype)
    assert "kernel block_onepass" in line, line
    assert ("next row prefetched" in line) == prefetched, line


@pytest.mark.parametrize("shape,dtype,lean", [
    ((2048, 4096), torch.float16, True),
    ((4096, 4096), torch.bfloat16, True),
    ((32768, 2048), torch.float16, True),
    ((2048, 8192), torch.float16, True),
    ((2048, 6144), torch.bfloat16, True),     # 768 packs: still 512 x 2
    ((2048, 6152), torch.bfloat16, True),     # 769 packs: the wide form
    ((2048, 8200), torch.float16, False),     # 1025 packs: more than 512 threads x 2
    ((2048, 2040), torch.float16, False),     # under 256 packs: the warp kernel
    ((100, 8200), torch.float16, False),      # fewer rows than SMs, of more than 8192 columns
    ((2048, 2048), torch.float32, True),      # float32: 512 .. 2048 packs of 4, 8 per thread
    ((4096, 4096), torch.float32, True),
    ((2048, 8192), torch.float32, True),
    ((2048, 1536), torch.float32, True),
    ((4096, 1024), torch.float32, True),      # 256 packs: before the warp kernel (more than a wave of two-pack CTAs)
    ((4096, 1020), torch.float32, False),     # 255 packs: the warp kernel
    ((2048, 8196), torch.float32, False),     # 2049 packs: more than 256 threads x 8
    ((2048, 4096), torch.float64, False),
])
def test_many_rows_of_2k_to_8k_take_the_lean_block_instance(shape, dtype, lean):
    assert plan_line(shape, dtype, "log_softmax") == plan_line(shape, dtype)  # the same CTA shape
    line = plan_line(shape, dtype)
    assert ("lean instance" in line) == lean, line
    if lean:
        # 16-bit: the wide form above 768 packs (256 threads x 4); float32: always 8 packs per thread
        packs = 8 if dtype == torch.float32 else 4 if shape[1] > 6144 else 2
        assert "kernel block_onepass" in line and f"{packs} pack(s) per thread" in line, line


@pytest.mark.parametrize("op", ["softmax_backward", "log_softmax_backward"])
@pytest.mark.parametrize("shape,dtype,lean", [
    ((2048, 4096), torch.float16, True),
    ((4096, 4096), torch.bfloat16, True),
    ((32768, 2048), torch.float16, True),
    ((2048, 8192), torch.bfloat16, True),     # 1024 packs: 512 threads x 2, no wide form for two streams
    ((2048, 8200), torch.float16, False),     # more than 512 threads x 2
    ((2048, 2040), torch.float16, True),      # under 256 packs, but in one wave (session 40: the next test)
    ((2113, 2040), torch.float16, False),     # ... over one wave of 128-thread CTAs: the 64-register block instance
    ((100, 4096), torch.float16, True),       # fewer rows than SMs (session 40: the next test)
    ((2048, 4096), torch.float32, True),      # 1024 packs of 4
    ((2048, 1024), torch.float32, True),      # 256 packs of 4
    ((2048, 8192), torch.float32, False),     # 2048 packs
    ((2048, 4096), torch.float64, False),
])
def test_many_backward_rows_of_1k_to_8k_take_the_lean_block_instance(shape, dtype, lean, op):
    line = plan_line(shape, dtype, op)
    assert ("lean instance" in line) == lean, line
    if lean:
        assert "kernel block_onepass" in line and "2 pack(s) per thread" in line, line


# Few backward rows (fewer than SMs: 131) of 512 columns up to 1024 packs, any stream dtype, whole or peeled (the aligned
# body's columns), and many 16-bit backward rows of 64-255 whole packs whose two-pack CTAs fit in one wave (132 SMs x 32
# resident CTAs of up to 64 threads, x 16 of 128 threads): a CTA per row of the lean two-pack form (lean_rows, session
# 40).
@pytest.mark.parametrize("op", ["softmax_backward", "log_softmax_backward"])
@pytest.mark.parametrize("shape,dtype,input_dtype,lean", [
    ((131, 512), torch.float16, None, True),        # 64 packs, the shortest
    ((131, 504), torch.float16, None, False),       # 63 packs: 256 / 384 columns measured even (session 40 calls 2-3)
    ((131, 519), torch.bfloat16, None, True),       # peeled: a body of 512 columns
    ((131, 511), torch.float16, None, False),       # peeled: a body of 504
    ((131, 1001), torch.float16, None, True),       # peeled
    ((132, 1001), torch.float16, None, False),      # as many rows as SMs, peeled: not the one-wave rule
    ((131, 8192), torch.bfloat16, None, True),      # 1024 packs: 512 threads x 2
    ((131, 8200), torch.float16, None, False),      # 1025 packs
    ((131, 508), torch.float32, None, False),       # float32 streams: 127 packs, 508 columns
    ((131, 512), torch.float32, None, True),
    ((131, 519), torch.float32, None, True),        # peeled: a body of 516 columns
    ((131, 511), torch.float32, None, False),       # peeled: a body of 508
    ((132, 512), torch.float32, None, False),       # as many rows as SMs: many float32 rows lean from 192 packs
    ((131, 4096), torch.float32, None, True),       # 1024 packs of 4
    ((131, 4100), torch.float32, None, False),
    ((131, 512), torch.float32, torch.float16, True),   # float32 streams, a 16-bit gradient
    ((131, 508), torch.float32, torch.bfloat16, False),
    ((4224, 512), torch.float16, None, True),       # one wave of 32-thread CTAs (32 per SM)
    ((4225, 512), torch.float16, None, False),
    ((4224, 504), torch.float16, None, False),      # 63 packs
    ((2112, 2040), torch.bfloat16, None, True),     # 255 packs: one wave of 128-thread CTAs (16 per SM)
    ((2113, 2040), torch.bfloat16, None, False),
    ((2048, 1024), torch.float16, None, True),
    ((2048, 1001), torch.float16, None, False),     # many peeled rows keep their plan
    ((2048, 512), torch.float32, None, False),      # many float32 rows: from 192 packs (next test)
])
def test_few_or_one_wave_backward_rows_take_the_lean_two_pack_form(shape, dtype, input_dtype, lean, op):
    line = plan_line(shape, dtype, op, input_dtype)
    assert ("lean instance" in line) == lean, line
    if lean:
        body_packs = shape[1] // vec16(dtype)  # a peeled row's aligned body
        threads = whole_warps(-(-body_packs // 2))  # 2 packs each
        assert f"kernel block_onepass: {shape[0]} CTAs x {threads} threads" in line, line  # a CTA per row
        assert "2 pack(s) per thread" in line, line


@pytest.mark.parametrize("op", ["softmax_backward", "log_softmax_backward"])
@pytest.mark.parametrize("shape,input_dtype,lean", [
    ((1000, 1000), None, True),            # 250 packs: under the other lean rows' 256
    ((256, 768), None, True),              # 192 packs, the shortest measured: even / -13% (session 35)
    ((256, 764), None, False),             # 191 packs
    ((4096, 512), None, False),            # 128 packs: not faster (session 35 call 1)
    ((128, 1024), None, True),             # fewer rows than SMs, a row (8 KB, two streams) too small to split
    ((8, 764), None, True),                # few rows, 191 packs: the few-row rule from 512 columns (previous test)
    ((1, 1024), None, True),               # 256 packs, one row
    ((1, 1028), None, True),               # 257 packs: the few-row rule up to 1024 packs (session 40)
    ((4, 2048), None, True),               # 16 KB of two streams: a cluster before session 40
    ((1000, 1001), None, False),           # many peeled rows keep their plan
    # float32 streams with a 16-bit result (the backward of softmax(x_16bit, dtype=float32)), since session 38
    ((1000, 1000), torch.float16, True),
    ((256, 768), torch.bfloat16, True),
    ((256, 764), torch.float16, False),
    ((128, 1024), torch.bfloat16, True),
    ((1, 1028), torch.float16, True),
    ((1000, 1001), torch.bfloat16, False),
])
def test_float32_backward_rows_from_768_columns_take_the_lean_block_instance(shape, input_dtype, lean, op):
    line = plan_line(shape, torch.float32, op, input_dtype)
    assert ("lean instance" in line) == lean, line
    if lean:
        threads = whole_warps(-(-shape[1] // 4 // 2))  # 2 packs of 4 per thread
        assert f"kernel block_onepass: {shape[0]} CTAs x {threads} threads" in line, line  # a CTA per row
        assert "2 pack(s) per thread" in line, line


@pytest.mark.parametrize("shape,dtype,kernel,packs", [
    ((200, 2040), torch.float16, "block_onepass", 1),  # one wave of one-pack CTAs: the lean one-pack form
    ((200, 1024), torch.float16, "block_onepass", 1),  # (session 46; the warp kernel before, 4 packs per lane)
    ((200, 504), torch.float32, "warp", None),         # float32 rows of fewer than 128 packs: the warp kernel
    ((128, 2048), torch.float16, "block_onepass", 2),  # fewer rows than SMs: the lean instance (session 38)
    ((128, 1024), torch.float16, "block_onepass", 2),
    ((128, 1024), torch.float32, "block_onepass", 2),  # fewer float32 rows than SMs: the lean instance (session 39)
    ((2048, 2048), torch.float16, "block_onepass", 2),  # many rows of 256 packs: the lean instance
])
def test_small_rows_take_the_kernel_measured_faster(shape, dtype, kernel, packs):
    line = plan_line(shape, dtype)
    assert f"kernel {kernel}:" in line, line
    if packs is not None:
        assert f"{packs} pack(s) per thread" in line, line


FP16, BF16, FP32 = torch.float16, torch.bfloat16, torch.float32


def lean_cta_shape(plan: str, packs: int) -> tuple[int, int]:
    """(threads, packs per thread) of a lean CTA per row of `packs` 16-byte packs, by the expected plan's label: the
    float form holds 8 packs per thread, the one-pack form 1, the two-pack form 2 (softmax_launch.h, LeanForm)."""
    per_thread = {"lean float": 8, "lean one": 1}.get(plan, 2)
    return whole_warps(-(-packs // per_thread)), per_thread


@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
@pytest.mark.parametrize("shape,dtype,out_dtype,plan", [
    ((128, 1024), FP16, None, "lean"),              # 128 packs: a CTA of 64 threads x 2 packs per row
    ((1, 256), BF16, None, "lean"),                 # 32 packs, the fewest (256 columns)
    ((128, 248), FP16, None, "kernel warp:"),       # 31 packs: the warp kernel
    ((131, 4096), BF16, None, "lean"),              # 512 packs, one row fewer than SMs
    ((8, 8192), FP16, None, "lean"),                # 1024 packs: 512 threads, the most
    ((8, 8200), FP16, None, "kernel cluster_onepass:"),  # 1025 packs: a cluster per row
    ((132, 1024), FP16, None, "lean one"),          # a row per SM: one wave of the one-pack form (session 46)
    ((131, 2040), FP16, None, "lean"),
    ((132, 2040), BF16, None, "lean one"),          # one wave of 256-thread CTAs (spread_small_rows before)
    ((64, 1001), BF16, None, "lean"),               # peeled rows, the body's plan
    ((64, 263), FP16, None, "lean"),                # peeled, a body of 32 packs
    ((64, 255), FP16, None, "kernel warp:"),        # peeled, a body of 31 packs
    ((64, 8191), FP16, None, "lean"),               # peeled, a body of 1023 packs
    ((8, 8201), FP16, None, "kernel cluster_onepass:"),  # peeled, a body of 1025 packs
    ((100, 1000), FP16, FP32, "lean"),              # float32 results of 16-bit rows: from 512 columns
    ((1, 512), BF16, FP32, "lean"),
    ((128, 504), FP16, FP32, "kernel warp:"),       # 63 packs
    ((64, 2055), FP16, FP32, "lean"),               # peeled, a body of 256 packs
    ((8, 8192), BF16, FP32, "lean"),                # 1024 packs
    ((64, 8199), FP16, FP32, "lean"),               # peeled, a body of 1024 packs
    ((8, 8200), FP16, FP32, "kernel cluster_onepass:"),  # 1025 packs
    ((128, 1024), FP32, None, "lean"),              # float32: 256 packs of 4, a CTA of 128 threads x 2 packs
    ((1, 512), FP32, None, "lean"),                 # 128 packs, the fewest (512 columns)
    ((64, 508), FP32, None, "kernel warp:"),        # 127 packs
    ((2, 263), FP32, None, "kernel warp:"),         # peeled, a body of 65 packs
    ((64, 511), FP32, None, "kernel warp:"),        # peeled, a body of 127 packs
    ((64, 515), FP32, None, "lean"),                # peeled, a body of 128 packs
    ((100, 1000), FP32, None, "lean"),              # 250 packs: the last pack's threads hold padding
    ((131, 4096), FP32, None, "lean"),              # 1024 packs: 512 threads
    ((8, 4100), FP32, None, "lean float"),          # 1025 packs: the float form, 8 packs per thread
    ((8, 4099), FP32, None, "lean"),                # peeled, a body of 1024 packs: 512 threads x 2
    ((8, 4103), FP32, None, "lean float"),          # peeled, a body of 1025 packs
    ((3, 8192), FP32, None, "lean float"),          # 2048 packs: 256 threads x 8
    ((3, 8196), FP32, None, "kernel cluster_onepass:"),  # 2049 packs: a cluster per row
    ((132, 1024), FP32, None, "lean"),              # a row per SM: one wave of two-pack CTAs (below)
    ((64, 1001), FP32, None, "lean"),               # peeled, a body of 250 packs
    ((8, 2047), FP32, None, "lean"),
    ((32, 8191), FP32, None, "lean float"),         # peeled, a body of 2047 packs
])
def test_few_forward_rows_of_256_to_8192_columns_take_a_lean_cta_per_row(shape, dtype, out_dtype, plan, op):
    """softmax_dispatch.cpp, kLeanFewMinColumns: fewer rows than SMs of 256-8192 columns (512-8192 for a float32
    result), whole or peeled, take a CTA per row of the lean instance: 2 packs per thread up to 512 threads, float32
    rows of more than 1024 packs the float form's 8 (sessions 38-39)."""
    line = plan_line(shape, dtype, op, out_dtype)
    assert ("lean instance" in line) == plan.startswith("lean"), line
    if plan.startswith("lean"):
        packs = shape[1] // vec16(dtype)  # peeled rows: the aligned body's packs
        threads, per_thread = lean_cta_shape(plan, packs)
        assert f"kernel block_onepass: {shape[0]} CTAs x {threads} threads" in line, line  # a CTA per row
        assert f"{per_thread} pack(s) per thread" in line, line
    else:
        assert plan in line, line


@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
@pytest.mark.parametrize("shape,plan", [
    ((1000, 1000), "lean"),                    # 250 packs: CTAs of 128 threads, 16 per SM: 2112 rows a wave
    ((2048, 1024), "lean"),                    # 256 packs
    ((2112, 1024), "lean"),                    # one whole wave
    ((2113, 1024), "8 pack(s) per thread"),    # more: the float form, CTAs of one warp
    ((2113, 1000), "kernel warp:"),            # more, of fewer than 256 packs: the warp kernel
    ((4224, 512), "lean"),                     # 128 packs: CTAs of 64 threads, 32 per SM
    ((4225, 512), "kernel warp:"),
    ((4096, 508), "kernel warp:"),             # 127 packs
    ((2048, 1028), "8 pack(s) per thread"),    # 257 packs: the float form
    ((2772, 768), "lean"),                     # 192 packs: CTAs of 96 threads, 21 per SM: 2772 rows a wave
    ((2773, 768), "kernel warp:"),
    ((132, 2048), "8 pack(s) per thread"),     # 512 packs: the float form
    ((1000, 1001), "kernel warp:"),            # rows that break packs: not measured, the warp kernel peeled
])
def test_many_float32_rows_of_one_wave_take_the_lean_two_pack_form(shape, plan, op):
    """softmax_dispatch.cpp, kLeanOneWaveFloatMinPacks: many float32 rows of 128-256 whole packs (512-1024 columns)
    take the two-pack form where its CTAs fit on the device at once (session 39; 4096 x 1000 measured slower)."""
    line = plan_line(shape, FP32, op)
    if plan == "lean":
        threads = whole_warps(-(-(shape[1] // 4) // 2))
        assert f"kernel block_onepass: {shape[0]} CTAs x {threads} threads" in line, line
        assert "2 pack(s) per thread" in line and "lean instance" in line, line
    else:
        assert plan in line, line
        assert ("lean instance" in line) == (plan == "8 pack(s) per thread"), line


@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
@pytest.mark.parametrize("shape,dtype,out_dtype,plan", [
    ((2048, 1024), FP16, None, "lean one"),         # 128 packs: CTAs of 128 threads, 16 per SM: 2112 rows a wave
    ((2112, 1024), BF16, None, "lean one"),         # one whole wave
    ((2113, 1024), FP16, None, "kernel warp:"),     # more: the warp kernel
    ((4224, 512), FP16, None, "lean one"),          # 64 packs, the fewest: CTAs of 64 threads, 32 per SM
    ((4225, 512), FP16, None, "kernel warp:"),
    ((4096, 504), FP16, None, "kernel warp:"),      # 63 packs
    ((1000, 1000), BF16, None, "lean one"),         # 125 packs: the last warp's 3 threads hold padding
    ((1056, 2040), FP16, None, "lean one"),         # 255 packs: CTAs of 256 threads, 8 per SM
    ((1057, 2040), FP16, None, "kernel warp:"),
    ((2048, 2048), FP16, None, "lean"),             # 256 packs: the two-pack form (kLeanMinPacks)
    ((2048, 1024), FP16, FP32, "kernel warp:"),     # a float32 result: the warp kernel
    ((2048, 1023), FP16, None, "kernel warp:"),     # rows that break packs: the warp kernel, peeled
    ((128, 1024), FP16, None, "lean"),              # fewer rows than SMs: the two-pack form (one pack measured even)
])
def test_many_16_bit_rows_of_one_wave_take_the_lean_one_pack_form(shape, dtype, out_dtype, plan, op):
    """softmax_dispatch.cpp, kLeanOnePackMinPacks: many whole 16-bit rows of 64-255 packs (512-2040 columns) with a
    16-bit result take the lean one-pack form where its CTAs fit on the device at once (session 46)."""
    line = plan_line(shape, dtype, op, out_dtype)
    if plan.startswith("lean"):
        threads, per_thread = lean_cta_shape(plan, shape[1] // vec16(dtype))
        assert f"kernel block_onepass: {shape[0]} CTAs x {threads} threads" in line, line
        assert f"{per_thread} pack(s) per thread" in line and "lean instance" in line, line
    else:
        assert plan in line and "lean instance" not in line, line


@pytest.mark.parametrize("rows,n,lanes,threads", [
    (132, 1024, 32, 32),    # one row per warp: 132 CTAs of one warp, not 33 of four (a row per SM: not the lean's few)
    (300, 1024, 32, 64),    # 150 CTAs of two warps
    (1000, 1024, 32, 128),  # enough rows for CTAs of four warps on every SM
    (2000, 96, 4, 32),      # 8 rows per warp (4 lanes each): 250 warps -> CTAs of one warp
    (65536, 64, 8, 128),
])
def test_few_warp_rows_spread_over_more_smaller_ctas(rows, n, lanes, threads):
    # 1024 columns of a float32 result: same-dtype rows of one wave run the lean one-pack form (session 46)
    line = plan_line((rows, n), torch.float16, "softmax", torch.float32 if n == 1024 else None)
    assert "kernel warp:" in line and f"{lanes} lane(s) per row" in line, line
    assert f" x {threads} threads" in line, line


@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
@pytest.mark.parametrize("shape,dtype,lanes,packs", [
    ((16384, 128), torch.float16, 8, 2),    # 16 packs: 8 lanes of 2 (4 of 4 ran 8-14% slower, H100 session 24)
    ((256, 128), torch.bfloat16, 8, 2),
    ((32768, 104), torch.float16, 8, 2),    # 13 packs
    ((16384, 96), torch.float16, 4, 4),     # 12 packs keep 4 per lane (9-12 lost with 2)
    ((65536, 80), torch.bfloat16, 4, 4),
    ((65536, 72), torch.float16, 4, 4),     # 9 packs
    ((16384, 160), torch.float16, 8, 4),    # 20 packs
    ((16384, 128), torch.float32, 16, 2),   # float32 rows have their own rule (2 packs per lane)
])
def test_16_bit_rows_of_13_to_16_packs_take_2_packs_per_lane(shape, dtype, lanes, packs, op):
    line = plan_line(shape, dtype, op)
    assert "kernel warp:" in line and f"{lanes} lane(s) per row, {packs} pack(s) per lane" in line, line


@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
@pytest.mark.parametrize("shape,dtype,lanes,packs", [
    ((65536, 64), torch.float16, 8, 1),     # 8 packs: one per lane, every lane busy
    ((262144, 64), torch.bfloat16, 8, 1),
    ((1, 64), torch.bfloat16, 8, 1),        # any number of rows (37 and 1024-262144 measured)
    ((65536, 56), torch.float16, 8, 1),     # 7 packs: one lane of 8 idle
    ((65536, 32), torch.bfloat16, 4, 1),    # 4 packs
    ((65536, 48), torch.float16, 2, 4),     # 6 packs: two idle lanes of 8 lost (log_softmax +3..+6%)
    ((65536, 40), torch.bfloat16, 2, 4),    # 5 packs: three idle lanes lost up to 18%
    ((65536, 24), torch.float16, 1, 4),     # 3 packs: not measured, the 4-pack rule
    ((65536, 128), torch.float16, 8, 2),    # 16 packs: the 13-16 pack rule (one per lane: log_softmax +5..+8%)
    ((65536, 16), torch.float64, 2, 4),     # float64 rows of 8 packs (2 elements each) keep 4 packs per lane
    ((65536, 63), torch.float16, 4, 2),     # peeled rows keep their own rule
])
def test_16_bit_rows_of_4_7_or_8_packs_take_one_pack_per_lane(shape, dtype, lanes, packs, op):
    line = plan_line(shape, dtype, op)
    assert "kernel warp:" in line and f"{lanes} lane(s) per row, {packs} pack(s) per lane" in line, line


@pytest.mark.parametrize("in_dtype", [torch.float16, torch.bfloat16])
def test_one_pack_per_lane_rule_leaves_widening_rows_alone(in_dtype):
    # softmax(x_half, dtype=float32) of 64 columns keeps the widening rule: 4 packs per lane below 256 rows per SM
    # (2 from there, test_widening_rows_have_warp_plans_of_their_own).
    line = plan_line((255 * SM_COUNT, 64), in_dtype, "softmax", out_dtype=torch.float32)
    assert "kernel warp:" in line and "2 lane(s) per row, 4 pack(s) per lane" in line, line


@pytest.mark.parametrize("op", ["softmax_backward", "log_softmax_backward"])
@pytest.mark.parametrize("shape,dtype,lanes", [
    ((65536, 64), torch.float16, 8),     # 8 packs: one per lane (the 16-bit forward too, since session 41)
    ((16384, 128), torch.bfloat16, 16),
    ((65536, 256), torch.float16, 32),
    ((16384, 32), torch.float32, 8),
])
def test_short_backward_rows_take_one_pack_per_lane(shape, dtype, lanes, op):
    line = plan_line(shape, dtype, op)
    assert "kernel warp:" in line and f"{lanes} lane(s) per row, 1 pack(s) per lane" in line, line


def test_forced_grid_onepass_names_its_limit():
    with softmax_ops.force_kernel("softmax", "grid_onepass"):
        text = softmax_ops.explain((300, 4000), torch.float32)
    assert "cannot run" in text and "resident CTAs per row" in text, text


@pytest.mark.parametrize("shape,dtype,op,streamed", [
    ((4, 8388608), torch.float16, "softmax", True),            # chunk 1.9x what a CTA caches
    ((4, 8388608), torch.float32, "log_softmax", True),        # 3.9x
    ((4, 8388608), torch.bfloat16, "softmax_backward", True),  # 3.4x
    ((3, 5000000), torch.float32, "softmax_backward", True),
    ((4, 8388608), torch.float32, "softmax_backward", True),   # 6.9x
    ((16, 2097152), torch.float32, "softmax_backward", False), # 7.1x: split_row
    ((4, 33554432), torch.float16, "softmax", False),          # 7.8x
    ((2, (1 << 30) + 8), torch.float16, "softmax", False),
])
def test_few_huge_rows_stream_in_one_cooperative_launch_while_a_seventh_stays_on_chip(shape, dtype, op, streamed):
    """Rows larger than every CTA slot's cache together: grid_onepass caches what fits and re-reads the
    rest of each chunk (one launch) while a CTA caches at least a seventh of its chunk; split_row's two
    launches beyond (kGridStreamMaxChunkPerCache)."""
    line = plan_line(shape, dtype, op)
    if streamed:
        assert "kernel grid_onepass" in line and "(cooperative)" in line, line
        assert "the rest of each chunk streamed and re-read" in line, line
    else:
        assert "kernel split_row" in line, line


@pytest.mark.parametrize("backward", [False, True])
@pytest.mark.parametrize("dtype,vec", [(torch.float32, 4), (torch.float16, 8), (torch.float32, 1)])
def test_forced_grid_onepass_streams_exactly_beyond_its_cache(dtype, vec, backward):
    """3 rows: the last fully cached plan is one 1024-thread CTA per SM, 44 per row, each with its register
    packs plus all of its shared memory; one pack more per row and the plan streams (the boundary the
    kernel tests in test_cuda_softmax.py exercise). Odd rows (vec 1) are peeled, whole 16-byte packs of
    their body cached, up to the same length as whole rows; one element more and they stream single
    elements (no peeled streaming instance)."""
    packs_vec = vec if vec > 1 else vec16(dtype)
    last_cached = (SM_COUNT // 3) * block_capacity_packs(dtype, packs_vec, backward) * packs_vec
    op = "softmax_backward" if backward else "softmax"
    with softmax_ops.force_kernel(op, "grid_onepass"):
        # 16-byte packs: the last cached length and one pack more; odd rows: the longest peeled cached row
        # (last_cached + packs_vec - 1: its longest body has last_cached / packs_vec packs) and one more
        cached = softmax_ops.explain((3, last_cached + (vec == 1) * (packs_vec - 1)), dtype, op=op)
        streamed = softmax_ops.explain((3, last_cached + (packs_vec if vec > 1 else packs_vec + 1)), dtype, op=op)
    assert "kernel grid_onepass" in cached and "streamed" not in cached, cached
    assert ("rows peeled" in cached) == (vec == 1), cached
    assert "kernel grid_onepass" in streamed and "the rest of each chunk streamed" in streamed, streamed
    assert f"{vec} element(s) per access" in streamed, streamed


@pytest.mark.parametrize("shape,k,kernel", [
    ((64, 151936), 50, "split_row"),  # 0.48 rows per SM: split_row 34.4 us vs block 38.4 (fp16)
    ((79, 200000), 50, "split_row"),  # just under 60 rows per 100 SMs (rows too long for block_long_max_tiles)
    ((80, 200000), 50, "block"),
    ((96, 100000), 50, "block"),      # block 30.3 us vs split_row 35.4 (fp16)
    ((256, 32768), 64, "block"),      # block 20.4 us vs split_row 39.8 (fp16)
])
def test_fused_topk_takes_one_cta_per_row_from_0_6_rows_per_sm(shape, k, kernel):
    """csrc/topk/topk_dispatch.cpp, block_min_rows_per_100_sms: one CTA per row from 0.6 rows per SM (H100,
    session 14: block beat split_row on 96-256 rows, lost on 64)."""
    text = softmax_ops.explain(shape, torch.float16, op="fused_topk", k=k)
    assert f"kernel '{kernel}'" in text, text


@pytest.mark.parametrize("shape,k,ctas_per_row", [
    ((64, 151936), 50, 4),    # 30.6 / 31.4 us (fp16 / fp32) against 30.9 / 34.8 with 8 chunks
    ((16, 262144), 50, 16),   # 23.6-24.1 / 23.1-23.9 against 29.2-29.5 / 31.6-31.8 with 32
    ((32, 262144), 64, 8),
    ((4, 1048576), 50, 64),
    ((4, 131072), 16, 32),    # n / 4096: the chunk floor, not the CTA budget, sets it
])
def test_fused_topk_split_row_uses_at_most_two_ctas_per_sm(shape, k, ctas_per_row):
    """csrc/topk/topk_dispatch.cpp, split_row_max_ctas_per_sm: at most 2 CTAs per SM over all rows, in chunks
    of whole tiles (H100, session 15: fewer, longer chunks beat 4 CTAs per SM on every split shape measured)."""
    text = softmax_ops.explain(shape, torch.float16, op="fused_topk", k=k)
    assert "kernel 'split_row'" in text and f"({ctas_per_row} CTAs per row of " in text, text
    assert shape[0] * ctas_per_row <= 2 * SM_COUNT


@pytest.mark.parametrize("shape,k,dtype,tile", [
    ((64, 151936), 50, torch.float16, 8192),   # chunks of 40960: 30.4 -> 27.7 us
    ((64, 151935), 50, torch.bfloat16, 8192),  # peeled rows too
    ((64, 98304), 50, torch.float16, 8192),    # chunks of 24576, 3 long tiles: 25.1 -> 24.3
    ((48, 100000), 50, torch.float16, 4096),   # chunks of 20480, 2.5 long tiles: 24.8 -> 25.6 with them
    ((16, 262144), 50, torch.bfloat16, 4096),  # chunks of 16384
    ((64, 151936), 50, torch.float32, 4096),   # float32: -0.5% here, +3..+8% elsewhere
])
def test_fused_topk_split_row_long_tiles_for_16_bit_chunks_of_3_tiles(shape, k, dtype, tile):
    """csrc/topk/topk_dispatch.cpp, long_tile_min_elems: 16-bit chunks of at least 3 x 8192 elements
    read tiles of 8192 (H100, session 30: -3..-9% from 3 tiles a chunk, +1..+3% at 2-2.5)."""
    with softmax_ops.force_kernel("topk", "split_row"):
        text = softmax_ops.explain(shape, dtype, op="fused_topk", k=k)
    assert "kernel 'split_row'" in text and f"elements in tiles of {tile}," in text, text


@pytest.mark.parametrize("shape,k,dtype,tile", [
    ((80, 100000), 50, torch.float16, 8192),        # 28.4 -> 23.5 us
    ((2 * SM_COUNT, 50000), 50, torch.bfloat16, 8192),  # 2 rows per SM: -4..-5%
    ((2 * SM_COUNT + 1, 50000), 50, torch.float16, 4096),
    ((1024, 50000), 50, torch.float16, 4096),       # 58.0 -> 66.5 with long tiles
    ((128, 24576), 64, torch.float16, 8192),        # 3 long tiles a row
    ((128, 24575), 64, torch.float16, 4096),
    ((80, 100000), 50, torch.float32, 4096),
])
def test_fused_topk_block_long_tiles_for_up_to_2_rows_per_sm(shape, k, dtype, tile):
    """csrc/topk/topk_dispatch.cpp, block_long_tile_max_rows_per_sm: the block kernel reads 16-bit rows of at least
    3 x 8192 elements in tiles of 8192 where it has at most 2 rows per SM (H100, session 30: -4..-17% on 80-264
    rows, +11..+14% on 512-1024)."""
    text = softmax_ops.explain(shape, dtype, op="fused_topk", k=k)
    assert f"kernel 'block' (one 256-thread CTA per row in tiles of {tile}," in text, text


# block_long_min_rows_per_100_sms: 18 (24 rows on 132 SMs); block_long_few_rows_per_100_sms: 6 (8 rows).
BLOCK_LONG_MIN_ROWS = -(-18 * SM_COUNT // 100)
BLOCK_LONG_FEW_ROWS = -(-6 * SM_COUNT // 100)


@pytest.mark.parametrize("shape,k,dtype,kernel", [
    ((BLOCK_LONG_MIN_ROWS, 65536), 50, torch.float16, "block"),       # 17.3 us against split_row's 22.3
    ((64, 131072), 50, torch.bfloat16, "block"),                       # 16 long tiles: 25.8 against 26.6
    ((64, 131073), 50, torch.float16, "split_row"),
    ((64, 151936), 50, torch.float16, "split_row"),                    # 27.7 against block's 30.0
    ((BLOCK_LONG_MIN_ROWS - 1, 13 * 8192), 50, torch.float16, "block"),  # fewer rows: up to 13 long tiles
    ((BLOCK_LONG_MIN_ROWS - 1, 13 * 8192 + 1), 50, torch.float16, "split_row"),
    ((16, 32768), 50, torch.bfloat16, "block"),                       # 12.1 against 17.4
    ((20, 131072), 50, torch.float16, "split_row"),                   # 22.8 against block's 25.2
    ((BLOCK_LONG_FEW_ROWS, 65536), 50, torch.float16, "block"),       # 8 rows: 17.1-17.6 against 19.4-19.9
    ((BLOCK_LONG_FEW_ROWS - 1, 65536), 50, torch.float16, "split_row"),
    ((BLOCK_LONG_MIN_ROWS, 65536), 50, torch.float32, "split_row"),    # float32 reads no long tiles
    ((BLOCK_LONG_MIN_ROWS, 24575), 50, torch.float16, "split_row"),    # rows shorter than 3 long tiles
    ((BLOCK_LONG_MIN_ROWS, 65536), 300, torch.float16, "split_hist"),  # k > 256 keeps its kernel
    ((BLOCK_LONG_MIN_ROWS, 65536), 16, torch.float16, "block"),        # k16: 16.5 against 18.8
])
def test_fused_topk_block_on_fewer_rows_of_up_to_16_long_tiles(shape, k, dtype, kernel):
    """csrc/topk/topk_dispatch.cpp, block_long_min_rows_per_100_sms / block_long_few_rows_per_100_sms: below 0.6 rows
    per SM, 16-bit rows of 3-16 long tiles run one CTA per row from 0.18 rows per SM, of 3-13 from 0.06, for k <= 256
    (H100, session 30, k = 50: 5-36% faster than split_row on 8-78 rows of 32768-131072; split_row faster on 64 x
    151936 and on 16-20 rows of 131072; k = 8-32 mostly the same way)."""
    text = softmax_ops.explain(shape, dtype, op="fused_topk", k=k)
    assert f"kernel '{kernel}'" in text, text
    if kernel == "block":
        assert "one CTA per row in long tiles beats splitting" in text, text


@pytest.mark.parametrize("shape,k,dtype,threads", [
    ((65536, 256), 8, torch.float16, 4),     # 35.1 -> 33.4 us in two batches
    ((25344, 256), 8, torch.float16, 4),     # exactly 24 warps per SM at 4 threads
    ((25343, 256), 8, torch.float16, 8),     # one row fewer
    ((65536, 136), 8, torch.float16, 4),     # the shortest rows that 8 threads hold: a second batch of one vector
    ((16384, 512), 8, torch.bfloat16, 8),    # 22.3 -> 20.1
    ((16384, 384), 8, torch.float16, 8),     # 18.5 -> 17.1
    ((65536, 512), 4, torch.float16, 8),     # the K = 4 instances: 48.2 -> 46.6
    ((16384, 256), 8, torch.float16, 8),     # 15.5 warps per SM at 4 threads: 13.8 -> 15.1 in batches
    ((65536, 128), 8, torch.float16, 4),     # 4 threads hold the row: 21.9 -> 24.0 at 2
    ((65536, 256), 2, torch.float16, 8),     # k <= 2: no batched instances
    ((65536, 256), 8, torch.float32, 8),     # float32: none either
    ((65536, 260), 8, torch.float16, 16),    # rows of 520 bytes: scalar loads, no batches
])
def test_many_16_bit_router_rows_run_on_half_the_threads_in_batches(shape, k, dtype, threads):
    """csrc/topk/topk_dispatch.cpp, rows_batch_min_threads / rows_batch_min_warps_per_sm: 16-bit rows of whole
    16-byte vectors with k > 2, where 8 or more threads hold a row and half of them still give 24 warps per SM,
    run on half the threads, each in batches of 32 values (H100, session 29 call 1)."""
    text = softmax_ops.explain(shape, dtype, op="fused_topk", k=k)
    assert f"kernel 'rows' ({threads} threads per row" in text, text
    batched = shape[1] > threads * 32
    assert ("batches of 32 values" in text) == batched and ("one merge step fewer" in text) == batched, text


@pytest.mark.parametrize("shape,k,dtype,threads", [
    ((16384, 72), 6, torch.float16, 4),      # 8.70 us against 10.18 at 8 threads (one wave)
    ((16384, 120), 8, torch.bfloat16, 4),    # 9.92 against 10.21
    ((16384, 128), 8, torch.float16, 4),     # 10.59 against 9.95: even
    ((65536, 128), 8, torch.float16, 4),     # more than one wave: no doubling either way
    ((16384, 160), 6, torch.float16, 8),
    ((16384, 64), 6, torch.float16, 4),      # 16 values per thread: not over half full
    ((8192, 128), 8, torch.float16, 8),      # the few-row doubling (8 warps per SM) still applies
    ((16384, 128), 8, torch.float32, 8),     # float32 doubles: 13.22 against 14.50 at 4 threads
    ((16384, 128), 2, torch.float16, 8),     # k <= 2: no batched instances, the doubling stays (not re-measured)
    ((16384, 100), 8, torch.float16, 8),     # rows of 200 bytes: scalar loads, the doubling stays
])
def test_many_16_bit_vector_router_rows_keep_the_threads_that_hold_them(shape, k, dtype, threads):
    """csrc/topk/topk_dispatch.cpp, rows_one_wave_warps_per_sm: 16-bit rows of whole 16-byte vectors with k > 2
    (the rows that can take batches) do not double their threads to fill one wave; float32 rows and rows read in
    scalars do (H100, session 33 call 1)."""
    text = softmax_ops.explain(shape, dtype, op="fused_topk", k=k)
    assert f"kernel 'rows' ({threads} threads per row" in text and "batches" not in text, text


@pytest.mark.parametrize("shape,k,kernel", [
    ((16384, 256), 8, "rows"),     # rows_auto_max_n_fp32
    ((16384, 512), 8, "rows"),     # 16 threads x 32 values: 25.4 / 26.0 us against the warp kernel's 32.0 / 31.9
    ((16384, 512), 2, "rows"),     # 19.6 against 24.5 / 24.4
    ((4096, 512), 8, "rows"),      # -10%
    ((16384, 384), 8, "rows"),     # 16 threads x 24 values: 22.5 against 28.1
    ((16384, 320), 8, "rows"),     # 16 threads x 20 of 24 slots: 22.5 / 22.9 against 26.4 / 26.0 (session 32)
    ((16384, 320), 4, "rows"),     # 17.3 / 17.1 against 21.4 / 20.7
    ((16384, 288), 8, "rows"),     # 22.2 / 22.7 against 25.6 / 25.4
    ((16384, 480), 8, "rows"),     # 27.1 / 26.9 against 31.9 / 32.5
    ((16384, 260), 8, "rows"),     # a whole vector past 256
    ((16384, 257), 8, "warp"),     # single elements: not measured against the warp kernel
    ((16384, 510), 8, "warp"),
    ((16384, 514), 8, "warp"),     # beyond the rows kernel
])
def test_float32_router_rows_beyond_256_run_rows_in_whole_vectors(shape, k, kernel):
    """csrc/topk/topk_dispatch.cpp, rows_whole_vectors: float32 rows longer than rows_auto_max_n_fp32 (256) run the
    rows kernel where they are whole 16-byte vectors (n a multiple of 4), the warp kernel otherwise (H100, session 31
    call 9 and session 32 call 2, both kernels forced)."""
    text = softmax_ops.explain(shape, torch.float32, op="fused_topk", k=k)
    assert f"kernel '{kernel}'" in text, text
    if kernel == "rows" and shape[1] > 256:
        assert "in whole 16-byte vectors" in text, text


@pytest.mark.parametrize("shape,k,dtype,peeled", [
    ((1024, 50257), 50, torch.float16, True),   # 74.0 -> 58.7 us
    ((1024, 50257), 50, torch.float32, True),   # 93.8 -> 91.1
    ((64, 151935), 50, torch.bfloat16, True),   # split_row 38.7 -> 30.5
    ((2048, 8191), 16, torch.float16, True),    # two tiles: 34.6 -> 33.5
    ((2048, 8191), 16, torch.float32, False),   # 39.7 -> 40.3 peeled
    ((4096, 4095), 32, torch.float16, False),   # one tile: 43.6 -> 44.9 peeled
    ((4096, 4095), 32, torch.float32, False),   # 46.5 -> 48.8 peeled
    ((1024, 50257), 50, torch.float64, False),  # not a speed target
])
def test_fused_topk_peels_rows_of_more_than_one_or_two_tiles(shape, k, dtype, peeled):
    """csrc/topk/topk_dispatch.cpp, peel_min_tiles_16bit / _fp32: rows that are not whole 16-byte vectors read
    each row's aligned body in vectors from 2 tiles (16-bit) or 3 (float32) (H100, session 20 call 2)."""
    text = softmax_ops.explain(shape, dtype, op="fused_topk", k=k)
    assert ("aligned body" in text) == peeled and "not whole 16-byte vectors" in text, text


@pytest.mark.parametrize("shape,dtype,op,kernel", [
    ((2048, 50257), torch.float16, "softmax", "block_onepass"),      # GPT-2's vocabulary
    ((2048, 50257), torch.float32, "softmax", "cluster_onepass"),
    ((2048, 50257), torch.float16, "softmax_backward", "cluster_onepass"),
    ((4096, 4095), torch.float16, "log_softmax", "block_onepass"),
    ((4096, 4095), torch.float32, "softmax_backward", "block_onepass"),
    ((1000, 1001), torch.float16, "softmax_backward", "warp"),
    ((8192, 1023), torch.float16, "softmax", "warp"),  # the peeled warp kernel: 22.6 -> 17.7 us
    ((1000, 1001), torch.float16, "softmax", "warp"),
    ((1000, 1001), torch.float32, "log_softmax", "warp"),
    ((65536, 63), torch.float32, "softmax", "warp"),
    ((8192, 1023), torch.float32, "softmax_backward", "warp"),  # 4 KB rows: the peeled warp kernel, 9% faster
    ((8192, 1023), torch.float32, "log_softmax_backward", "warp"),
    ((1000, 1001), torch.float32, "softmax_backward", "block_onepass"),  # one wave of rows: the block kernel
    ((4096, 2047), torch.float16, "softmax", "block_onepass"),  # one-warp CTAs, 31 rows per SM
    ((300, 2047), torch.float16, "softmax", "warp"),  # one wave of rows, 8 packs per lane (as 300 x 2048)
    ((400, 4_000_001), torch.float32, "softmax", "two_pass"),
    ((200, 4_000_001), torch.float32, "softmax", "split_row"),
    # few rows, long enough that the whole-pack rules give each thread the most register packs
    ((64, 151935), torch.float16, "softmax", "grid_onepass"),
    ((4, 33554431), torch.float16, "softmax", "split_row"),
    ((4, 8388607), torch.float32, "softmax", "split_row"),        # the grid group would stream: split_row
    ((3, 100003), torch.float32, "softmax_backward", "cluster_onepass"),  # 4 packs per thread, the most
])
def test_many_rows_that_break_16_byte_packs_are_peeled(shape, dtype, op, kernel):
    """Single-element access ran 2048 x 50257 fp16 softmax at 0.43 of copy (2048 x 50256: 0.92; H100,
    session 19): many rows of such lengths read their aligned body in 16-byte packs, the edges singly."""
    line = plan_line(shape, dtype, op)
    assert f"kernel {kernel}:" in line and "rows peeled" in line, line
    assert f"{vec16(dtype)} element(s) per access" in line, line


@pytest.mark.parametrize("shape,dtype,edges,lanes,per_lane", [
    ((65536, 100), torch.float16, 4, 4, 1),   # rows start at phases 0 and 4: a tail or a head of 4
    ((65536, 60), torch.bfloat16, 4, 4, 1),   # 60 experts (Qwen1.5-MoE's router): 7 packs on 4 lanes of 2
    ((65536, 102), torch.float16, 6, 8, 1),   # phases 0, 2, 4, 6: always 6 edges
    ((65536, 127), torch.float16, 7, 8, 1),   # every phase, but head + tail is 7 at each
    ((65536, 101), torch.float16, 13, 8, 2),  # every phase: up to 13 (head 6 + tail 7)
    ((2, 101), torch.float16, 5, 8, 1),       # rows at phases 0 and 5 only
    ((65536, 30), torch.bfloat16, 6, 2, 4),   # 3 packs, 6 edges: 2 lanes of 2 packs, not 8 of one
    ((65536, 9), torch.float16, 9, 4, 4),     # a pack and up to 9 edges (head 7, tail 2)
    ((16384, 36), torch.float16, 4, 2, 2),    # 4 packs and 4 edges
    ((65536, 30), torch.float32, 2, 8, 1),    # float32 keeps 8 lanes: 2 lanes of 4 packs ran 11% slower
    ((65536, 99), torch.float32, 3, 16, 1),   # 3 edges, but 24 packs take 16 lanes of 2 packs anyway
])
def test_peeled_warp_rows_get_lanes_for_their_packs_and_edge_slots(shape, dtype, edges, lanes, per_lane):
    """A peeled 16-bit warp row whose edges outnumber its lanes spreads its packs to 2 per lane, then holds up to
    4 edge elements per lane (softmax_dispatch.cpp: plan_warp). Session 21 gave such a row a lane per edge
    element, which left 65536 x 30 on 8 lanes of one pack (log_softmax 12.6 us against torch.compile's 8.9,
    H100); 4 packs per lane lost to 2 (65536 x 60 +15%, session 22). float32 rows keep 8 lanes at least (65536 x
    30: 11.1 us at 8 lanes, 12.3 at 2) and one edge element per lane."""
    line = plan_line(shape, dtype)
    text = softmax_ops.explain(shape, dtype)
    assert "kernel warp:" in line and "rows peeled" in line and f"{lanes} lane(s) per row" in line, line
    assert (f"{per_lane} edge element slots per lane" in line) == (per_lane > 1), line
    assert f"the up to {edges} elements around it singly" in text, text


@pytest.mark.parametrize("shape,dtype,op,kernel", [
    ((4, 16383), torch.float32, "softmax", "cluster_onepass"),  # few float32 rows: latency-bound, measured as is
    ((8, 16383), torch.float32, "softmax_backward", "grid_onepass"),  # float32 gradients of a float16 input: no
                                                                      # peeled instance below the most packs
])
def test_other_rows_that_break_16_byte_packs_keep_single_elements(shape, dtype, op, kernel):
    out_dtype = torch.float16 if op.endswith("backward") else None
    line = plan_line(shape, dtype, op, out_dtype)
    assert f"kernel {kernel}:" in line and "1 element(s) per access" in line and "peeled" not in line, line


def brute_force_max_edges(n: int, rows: int, vec: int) -> int:
    """Head + tail of each row (RowEdges) when row r starts at element r n of an aligned buffer, at most."""
    most = 0
    for r in range(min(rows, vec)):
        head = min((vec - r * n % vec) % vec, n)
        most = max(most, head + (n - head) % vec)
    return most


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("rows", [1, 2, 3, 5, 17, 4096])
def test_peeled_warp_plans_hold_every_edge_element(dtype, rows):
    """A peeled warp plan needs a slot (lanes x edge elements per lane) per edge element of its rows (else the
    launcher refuses it): against a brute-force count of every row's head and tail, for every row length up to
    300 that breaks packs."""
    vec = vec16(dtype)
    checked = 0
    for n in range(vec + 1, 300):
        if n % vec == 0:
            continue
        for op in ("softmax", "softmax_backward"):
            with softmax_ops.force_kernel(op, "warp"):  # the op names its kernel family here
                text = softmax_ops.explain((rows, n), dtype, op=op)
            if "rows peeled" not in text:
                continue
            edges = brute_force_max_edges(n, rows, vec)
            lanes = int(text.split(" lane(s) per row")[0].rsplit(" ", 1)[1])
            slots = " edge element slots per lane"
            per_lane = int(text.split(slots)[0].rsplit(" ", 1)[1]) if slots in text else 1
            assert lanes * per_lane >= edges, (n, rows, text)
            assert per_lane in ((1, 2, 4) if dtype == torch.float16 else (1,)), text
            checked += 1
    assert checked > 0


@pytest.mark.parametrize("shape,dtype", [((4096, 101), torch.float16), ((4096, 100), torch.bfloat16),
                                         ((3, 127), torch.float16), ((4096, 99), torch.float32)])
def test_peel_note_counts_the_rows_edge_elements(shape, dtype):
    """explain's reason for a peeled plan names the most edge elements a row has (brute force above)."""
    vec = vec16(dtype)
    text = softmax_ops.explain(shape, dtype)
    assert "rows peeled" in text, text
    assert f"the up to {brute_force_max_edges(shape[1], shape[0], vec)} elements around it singly" in text, text


@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
def test_explain_of_a_result_dtype_names_the_pair_and_any_cast(op):
    # float16 / bfloat16 -> float32 is read directly (no cast line); other pairs cast the input first, as
    # torch does.
    direct = softmax_ops.explain((8192, 32000), torch.bfloat16, op=op, out_dtype=torch.float32)
    assert "bfloat16 -> float32" in direct and "cast:" not in direct, direct
    cast = softmax_ops.explain((8192, 32000), torch.float16, op=op, out_dtype=torch.bfloat16)
    assert "float16 -> bfloat16" in cast and "the input is cast to bfloat16 first" in cast, cast
    assert softmax_ops.explain((8192, 32000), torch.float32, op=op, out_dtype=torch.float32) == \
        softmax_ops.explain((8192, 32000), torch.float32, op=op)


def test_explain_of_a_backward_result_dtype_follows_the_launcher():
    # The backward of softmax(x_half, dtype=float32) writes the 16-bit gradient itself; float16 streams with a
    # bfloat16 input_dtype compute in float16 and cast the result.
    direct = softmax_ops.explain((2048, 4096), torch.float32, op="softmax_backward", out_dtype=torch.float16)
    assert "float32 -> float16" in direct and "cast:" not in direct, direct
    cast = softmax_ops.explain((2048, 4096), torch.float16, op="softmax_backward", out_dtype=torch.bfloat16)
    assert "the kernel writes float16, cast to bfloat16 afterwards" in cast, cast


@pytest.mark.parametrize("in_dtype", [torch.float16, torch.bfloat16])
def test_widening_rows_have_warp_plans_of_their_own(in_dtype):
    # softmax(x_half, dtype=float32) writes twice what it reads: short rows take 2 packs per lane from 256 rows
    # per SM (4 below), and rows of 2048 columns stay on the warp kernel where a same-dtype result takes the lean
    # block instance (softmax_dispatch.cpp: widening_short_row_packs, lean_rows, widening_cluster_rows; H100,
    # session 26).
    def line(rows, n, out_dtype=torch.float32):
        text = softmax_ops.explain((rows, n), in_dtype, out_dtype=out_dtype)
        return next(row for row in text.splitlines() if row.strip().startswith("kernel "))

    assert "4 lane(s) per row, 2 pack(s) per lane" in line(256 * SM_COUNT, 64)
    assert "2 lane(s) per row, 4 pack(s) per lane" in line(255 * SM_COUNT, 64)
    assert "8 lane(s) per row, 2 pack(s) per lane" in line(256 * SM_COUNT, 128)
    assert "4 lane(s) per row, 4 pack(s) per lane" in line(255 * SM_COUNT, 128)
    assert "kernel warp" in line(32768, 2048) and "8 pack(s) per lane" in line(32768, 2048)
    assert "kernel block_onepass" in line(32768, 2048, out_dtype=None)
    assert "kernel block_onepass" in line(32768, 2056)  # beyond the warp kernel's 2048 columns
    # From 2048 packs and 8 rows per SM: clusters of 2 (the 512-thread CTA for a same-dtype result).
    assert "clusters of 2" in line(8 * SM_COUNT, 16384) and "clusters of 2" in line(8192, 32000)
    assert "kernel block_onepass" in line(8192, 32000, out_dtype=None)
    assert "kernel block_onepass" in line(8 * SM_COUNT, 16376)  # 2047 packs
    assert "kernel block_onepass" in line(8 * SM_COUNT - 1, 16384)
    assert "kernel block_onepass" in line(2048, 8192)
    # Cluster and grid groups cache widening rows in 4 register packs per thread (kWideningGroupRegPacks: their
    # results are written in lane pairs, which spilled in the 8-pack instance); peeled widening rows that no few-rows
    # plan spreads keep the 8 packs of the largest bucket. A same-dtype result with shared-memory packs takes 4 as
    # well (kGroupSharedRegPacks16, session 43; it had the 8 of the largest bucket).
    # (How many CTAs a grid group gives each row depends on the device's occupancy answer.)
    assert "clusters of 2 CTAs per row, 4 pack(s) per thread in registers + 0" in line(8192, 32000)
    grid, same_dtype_grid = line(64, 151936), line(64, 151936, out_dtype=None)
    assert "kernel grid_onepass" in grid and "(cooperative), 4 pack(s) per thread in registers" in grid, grid
    # (The shared-memory packs follow the CTAs per row, which follow the occupancy answer: 4 + 6 packs at the assumed
    # H100's 4 CTAs per row, 4 + 9 at 3 on an H100 in session 43's call 7.)
    assert "(cooperative)" in same_dtype_grid, same_dtype_grid
    assert register_packs(same_dtype_grid) == 4 and shared_packs(same_dtype_grid) > 0, same_dtype_grid
    assert "clusters of 2 CTAs per row, 8 pack(s) per thread" in line(2048, 50257) and "peeled" in line(2048, 50257)
    # Few widening rows that break packs plan their longest body as a row, then run it peeled: here (not spread) the
    # largest bucket too (with 4 packs that plan was refused, and the rows fell back to single elements).
    few_peeled = line(64, 151935)
    assert "8 element(s) per access" in few_peeled and "8 pack(s) per thread" in few_peeled, few_peeled
    assert "peeled" in few_peeled, few_peeled


def test_explain_of_a_result_dtype_follows_the_launchers_casts():
    # Integer inputs with a float dtype= are cast first (torch.softmax(torch.arange(3), 0, dtype=torch.float32)).
    text = softmax_ops.explain((2, 3), torch.int64, out_dtype=torch.float32)
    assert "-> float32" in text and "the input is cast to float32 first" in text, text
    with pytest.raises(NotImplementedError, match="out_dtype"):
        softmax_ops.explain((4, 8), torch.float16, out_dtype=torch.int32)
    # fused_topk (and its backward) run the plan of the dtype they read: a float16 input with dtype=float64 is
    # cast to float64 first, float16 -> float32 is read as float16.
    for op in ("fused_topk", "fused_topk_backward"):
        as_read = softmax_ops.explain((16384, 256), torch.float64, op=op, k=4)
        assert softmax_ops.explain((16384, 256), torch.float16, op=op, k=4, out_dtype=torch.float64) == as_read
        direct = softmax_ops.explain((16384, 256), torch.float16, op=op, k=4)
        assert softmax_ops.explain((16384, 256), torch.float16, op=op, k=4, out_dtype=torch.float32) == direct
    with pytest.raises(NotImplementedError, match="out_dtype"):
        softmax_ops.explain((16, 256), torch.float16, op="fused_topk", k=4, out_dtype=torch.int32)


@pytest.mark.parametrize("shape,dtype,op,out_dtype,peeled_cluster", [
    ((16, 100003), torch.float32, "softmax", None, True),         # 14.1 -> 12.0 us
    ((32, 50257), torch.float32, "log_softmax", None, True),
    ((8, 50257), torch.float32, "softmax", None, True),           # 9.2-10.0 -> 8.3-9.1 (128 threads)
    ((1, 50257), torch.float32, "softmax", None, True),           # float32, one row: 8.1-8.8 -> 7.4-7.5
    ((3, 100003), torch.float32, "log_softmax", None, True),
    ((8, 32001), torch.float32, "softmax", None, False),          # 64 threads: even
    ((4, 300007), torch.float32, "softmax", None, False),         # 512 threads and 2 shared-memory packs (2 x 300007:
                                                                  # 10.6 -> 11.2 us)
    ((8, 50257), torch.float32, "softmax_backward", None, False),  # the backward: peel_few_rows (session 34)
    ((64, 50256), torch.float32, "softmax", None, False),         # whole packs: the rules of whole packs
    ((64, 50257), torch.float16, "softmax", torch.float32, False),  # widening: peel_few_rows (session 34)
    ((64, 50257), torch.float16, "softmax", None, False),         # 16-bit: peel_few_rows (session 34)
    ((3, 100003), torch.bfloat16, "softmax", None, False),
])
def test_few_forward_rows_that_break_packs_take_the_peeled_cluster(shape, dtype, op, out_dtype, peeled_cluster):
    """softmax_dispatch.cpp, kPeeledClusterMinThreads: few float32 same-dtype forward rows that break 16-byte packs,
    which peel_few_rows leaves to single elements, run the forced cluster_onepass plan (peeled, the peeled
    instances' register packs) where its CTAs have at least 128 threads and no shared-memory packs (H100, session
    33 calls 3-5 and 9). 16-bit rows ran it too until session 34 (test_few_16_bit_rows_that_break_packs_...)."""
    text = softmax_ops.explain(shape, dtype, op=op, out_dtype=out_dtype)
    line = plan_line(shape, dtype, op, out_dtype)
    assert ("register packs each: the peeled instances'" in text) == peeled_cluster, text
    if peeled_cluster:
        assert "kernel cluster_onepass:" in line and "rows peeled" in line and "+ 0 in shared memory" in line, line
        threads = int(line.split(" CTAs x ")[1].split(" threads")[0])
        assert threads >= 128, line
        with softmax_ops.force_kernel("softmax", "cluster_onepass"):
            forced = softmax_ops.explain(shape, dtype, op=op, out_dtype=out_dtype)
        assert line in forced, (line, forced)  # the forced plan, as measured


@pytest.mark.parametrize("shape,dtype,op,out_dtype", [
    ((3, 100003), torch.float16, "softmax", None),                # a cluster of 16, 2 packs per thread
    ((4, 65537), torch.bfloat16, "log_softmax", None),            # 1 pack
    ((1, 262143), torch.bfloat16, "softmax", None),               # 4 packs
    ((64, 50257), torch.float16, "softmax", None),                # clusters of 4 at 4 packs
    ((2, 1048575), torch.float16, "softmax", None),               # a grid group of 2 packs
    ((8, 50257), torch.float16, "softmax_backward", None),        # the backward at 1 pack (its most is 2)
    ((1, 300007), torch.bfloat16, "log_softmax_backward", None),  # a grid group at 1 pack
    ((8, 16383), torch.float32, "softmax_backward", None),        # float32 backward: 1 pack (its most is 4)
    ((4, 65537), torch.float32, "log_softmax_backward", None),    # 2 packs
    ((8, 50257), torch.float32, "softmax_backward", None),        # a grid group
    ((1, 50257), torch.float16, "softmax", torch.float32),        # a float32 result: a cluster of 16 at 1 pack
    ((24, 100003), torch.bfloat16, "log_softmax", torch.float32),  # clusters at 4 packs
    ((6, 151935), torch.float16, "softmax", torch.float32),       # a grid group at 1 pack
])
def test_few_rows_that_break_packs_run_their_aligned_bodys_plan_peeled(shape, dtype, op, out_dtype):
    """softmax_dispatch.cpp, peel_few_rows with peeled_instance: few 16-bit rows (with a 16-bit or float32
    result) and few float32 backward rows that break 16-byte packs run the plan of their aligned body (here the
    aligned row of the same packs), peeled, at whatever register packs that plan spreads them over; before session
    34 only the most packs had a peeled instance, and these rows read single elements or ran an 8-pack peeled
    cluster (H100, session 34 calls 1, 2 and 6: 3 x 100003 fp16 softmax 9.2 -> 8.3-8.8 us, 1 x 262143 bf16 11.2 ->
    8.6-9.1, 16 x 65537 softmax_backward -22%, float32 8 x 16383 softmax_backward 8.5-8.7 -> 6.8-7.0, 64 x 50257
    fp16 softmax to float32 18.8-19.4 -> 13.8-14.7)."""
    rows, n = shape
    aligned = plan_line((rows, n // vec16(dtype) * vec16(dtype)), dtype, op, out_dtype)
    line = plan_line(shape, dtype, op, out_dtype)
    assert line == aligned + ", rows peeled (aligned body in packs, edge elements singly)", (line, aligned)
    # fewer than the most: the new instances
    assert register_packs(line) < max_block_reg_packs(dtype, op.endswith("backward")), line


@pytest.mark.parametrize("shape", [(8, 65537), (16, 100003), (4, 24577)])
def test_few_float32_forward_rows_that_break_packs_are_not_spread_peeled(shape):
    """The float32 forward has no peeled instance below 8 packs: spread, it lost to the peeled cluster by 6-23% on
    8 of 16 shapes (session 34 call 2), so its few odd rows keep that cluster or single elements."""
    line = plan_line(shape, torch.float32, "softmax")
    assert "8 pack(s) per thread in registers" in line, line


@pytest.mark.parametrize("shape,dtype,op,out_dtype,reg_packs,smem_packs", [
    ((64, 151936), torch.float16, "softmax", None, 4, None),          # grid group: was 8 + 2
    ((64, 151936), torch.bfloat16, "log_softmax", None, 4, None),
    ((2048, 131072), torch.bfloat16, "log_softmax", None, 4, 12),     # clusters of 2: was 8 + 8
    ((64, 151936), torch.float32, "softmax", None, 8, 11),            # float32 keeps 8
    ((2048, 131072), torch.float32, "softmax", None, 8, 14),
    ((64, 151936), torch.float16, "softmax", torch.float32, 4, None), # widening groups: 4 already
    ((64, 151936), torch.float16, "softmax_backward", None, 2, 6),    # backward: unchanged
    ((4, 262144), torch.float16, "softmax", None, 4, 0),              # no shared-memory packs: unchanged
    ((64, 151935), torch.float16, "softmax", None, 4, None),          # peeled rows too (session 44): was 8 + 2
    ((2048, 131071), torch.bfloat16, "log_softmax", None, 4, 12),     # peeled clusters of 2: was 8 + 8
])
def test_16_bit_group_rows_with_shared_packs_cache_4_register_packs(shape, dtype, op, out_dtype, reg_packs,
                                                                     smem_packs):
    """softmax_dispatch.cpp cache_shape, Heuristics::kGroupSharedRegPacks16 (session 43): a 16-bit forward row
    cached by a cluster or grid group that needs shared-memory packs takes 4 register packs per thread, not 8, and
    more shared-memory packs, peeled rows too (session 44); float32, widening, backward, and groups without
    shared-memory packs are unchanged.
    smem_packs None: some (a grid group's count follows its CTAs per row, which follow the device's occupancy
    answer: 6 packs at the assumed H100's 4 CTAs per row, 9 at 3 on an H100 in session 43's call 7)."""
    line = plan_line(shape, dtype, op, out_dtype)
    assert "_onepass:" in line and (" cluster" in line or "cooperative" in line), line
    assert register_packs(line) == reg_packs, line
    if smem_packs is None:
        assert shared_packs(line) > 0, line
    else:
        assert shared_packs(line) == smem_packs, line
