"""The CUDA softmax menu, kernel by kernel: every kernel forced with softmax_ops.force_kernel on every dtype
pair, at and around each of its size boundaries, plus layouts (non-contiguous, unaligned, dim != -1), special
values, backward, determinism, CUDA graph capture, forced kernels on shapes they cannot run, and opcheck.

Expected values come from float64 torch on the CPU; the accuracy bound is conftest's (2x torch's own error).
The size boundaries below mirror the launch limits in csrc/softmax/softmax_launch.h and the dispatcher's
budgets in csrc/softmax/softmax_dispatch.cpp; change them together.
"""

from __future__ import annotations

import contextlib
import math
import os

import pytest
import torch
from conftest import (
    BLOCK_MAX_THREADS,
    HAS_CUDA,
    HOPPER_SMEM_OPTIN,
    assert_within_2x_torch,
    max_block_reg_packs,
    plan_line,
    register_packs,
    shared_packs,
    vec16,
)
from conftest import block_capacity_packs as block_capacity_packs_for

import softmax_ops

pytestmark = pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")

FORWARD_FAMILY = "softmax"
BACKWARD_FAMILY = "softmax_backward"
ROW_KERNELS = ["warp", "block_onepass", "cluster_onepass", "grid_onepass", "two_pass", "split_row"]  # reduced dim last
ALL_KERNELS = [*ROW_KERNELS, "strided"]

# (input dtype, dtype= argument): every (read, write) pair the forward kernels are compiled for.
FORWARD_DTYPES = [
    (torch.float32, None),
    (torch.float16, None),
    (torch.bfloat16, None),
    (torch.float64, None),
    (torch.float16, torch.float32),
    (torch.bfloat16, torch.float32),
]
FORWARD_DTYPE_IDS = ["f32", "f16", "bf16", "f64", "f16->f32", "bf16->f32"]


def forward_case_id(in_dtype, out_dtype, rows, n) -> str:
    """A readable test id for a (dtype pair, rows x n) case, e.g. "f16->f32-8x4096"."""
    return f"{FORWARD_DTYPE_IDS[FORWARD_DTYPES.index((in_dtype, out_dtype))]}-{rows}x{n}"

# (input dtype of the forward, dtype= of the forward): the backward then reads the output's dtype and
# writes the input's: same dtype, float32 -> float16/bfloat16 (direct), and float16 -> float32 (cast after).
BACKWARD_DTYPES = [
    (torch.float32, None),
    (torch.float16, None),
    (torch.bfloat16, None),
    (torch.float64, None),
    (torch.float16, torch.float32),
    (torch.bfloat16, torch.float32),
    (torch.float32, torch.float16),
]
BACKWARD_DTYPE_IDS = ["f32", "f16", "bf16", "f64", "f32out->f16", "f32out->bf16", "f16out->f32"]

OPS = {"softmax": torch.softmax, "log_softmax": torch.log_softmax}

# Launch limits (softmax_launch.h) and budgets (softmax_dispatch.cpp) the size boundaries derive from.
WARP_LANES = 32
WARP_MAX_PACKS = 8
GRID_CTA_THREADS = 512  # grid_onepass: CTAs of up to 512 threads, two per SM (softmax_dispatch.cpp)


def sm_count() -> int:
    """SMs of the current GPU (132 on H100/H200, also assumed without a GPU for collecting parameters)."""
    return torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count if HAS_CUDA else 132


def smem_optin() -> int:
    """Opt-in shared memory per block of the current GPU (227 KB on H100/H200; also used, untested, for
    collecting the parametrisations on a machine without a GPU)."""
    if not HAS_CUDA:
        return HOPPER_SMEM_OPTIN
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    return getattr(props, "shared_memory_per_block_optin", HOPPER_SMEM_OPTIN)


def block_capacity_packs(dtype: torch.dtype, vec: int, backward: bool) -> int:
    """Packs of one row the block kernel can cache on the current GPU (conftest.block_capacity_packs)."""
    return block_capacity_packs_for(dtype, vec, backward, smem_optin())


# Kernels with a peeled form: rows whose length breaks 16-byte packs run as each row's aligned body in packs
# plus the few elements around it singly (softmax_kernel_common.cuh: RowEdges); the others take single elements.
PEELED_KERNELS = ["warp", "block_onepass", "cluster_onepass", "grid_onepass", "two_pass", "split_row"]


def row_vec(n: int, dtype: torch.dtype, kernel: str | None = None) -> int:
    """Vector width the dispatcher uses for a fresh contiguous row of length n (forced `kernel`)."""
    return vec16(dtype) if n % vec16(dtype) == 0 or kernel in PEELED_KERNELS else 1


def kernel_handles(kernel: str, n: int, dtype: torch.dtype, backward: bool = False) -> bool:
    """Whether a forced kernel can run rows of length n (reduced dim last), per the dispatcher's rules.
    Peeled rows count the packs of their longest body (n // vec); beyond a peeled plan's reach the kernel
    falls back to single elements, which reach less far, except the grid group's streamed form."""
    vec = row_vec(n, dtype, kernel)
    packs = n // vec if vec > 1 else n
    if kernel == "warp":
        return packs <= WARP_LANES * WARP_MAX_PACKS
    if kernel == "block_onepass":
        return packs <= block_capacity_packs(dtype, vec, backward)
    if kernel == "cluster_onepass":
        return (
            -(-packs // 16) <= block_capacity_packs(dtype, vec, backward) // 2
        )  # comfortably inside 16 CTAs
    if kernel == "grid_onepass":
        # at least 2 CTAs per row; beyond what its CTAs cache, the rest of each chunk is streamed (any n)
        return packs >= 2 or (n % vec16(dtype) != 0 and n >= 2)  # too short to peel: single elements
    return True


def grid_stream_threshold_packs(dtype: torch.dtype, vec: int, backward: bool, rows: int = 3) -> int:
    """Row packs from which grid_onepass streams part of each chunk: its last fully cached plan has one
    1024-thread CTA per SM, SMs // rows CTAs per row, each holding block_capacity_packs (mirror of grid_group
    in softmax_dispatch.cpp)."""
    return (sm_count() // rows) * block_capacity_packs(dtype, vec, backward)


def boundary_sizes(kernel: str, dtype: torch.dtype, backward: bool = False) -> list[int]:
    """Row lengths at and around the kernel's limits: vector width, lane / pack / thread buckets, the
    register-to-shared-memory switch, the on-chip capacity, chunking, and odd sizes (scalar path)."""
    v = vec16(dtype)
    sizes = {1, 2, 3, 31, 32, 33, v - 1, v, v + 1, 1000}
    if kernel == "warp":
        # short rows: 4 packs per lane on 1, 2, 4, 8 lanes (plan_warp), same-dtype 16-bit rows of 4, 7 or 8 packs one
        # per lane on 4 or 8 lanes (6 packs: 4 per lane; widening rows keep their rule), then 32 lanes x 1..8 packs
        sizes |= {4 * v, 5 * v, 6 * v, 7 * v, 9 * v, 17 * v, 20 * v}
        sizes |= {8 * v, 32 * v - 1, 32 * v, 33 * v, 64 * v, 129 * v, 255, 256, 256 * v - v, 256 * v}
    elif kernel == "block_onepass":
        regs = BLOCK_MAX_THREADS * max_block_reg_packs(dtype, backward)
        cap = block_capacity_packs(dtype, v, backward)
        cap_scalar = block_capacity_packs(dtype, 1, backward)
        # thread counts in warps of max_block_reg_packs packs each, up to 512 and 1024 threads
        sizes |= {128 * v, 129 * v, 512 * v, 513 * v, 1024 * v + v, 2048 * v + v}
        sizes |= {256 * v, 257 * v, 4099, regs * v, regs * v + v, cap * v - v, cap * v, cap_scalar - 1}
        # peeled rows: up to cap whole packs in the longest body
        sizes |= {cap * v + 1, cap * v + v - 1}
    elif kernel == "cluster_onepass":
        sizes |= {16 * v - 1, 16 * v + 1, 4096 + v, 100003, 262144, 300007}
    elif kernel == "grid_onepass":
        # 2 packs (the fewest it splits); for 3 rows (2 x SMs / 3 CTAs per row) chunks of 1 / 2 / all register
        # packs per thread at 512 threads, then chunks that spill into shared memory
        per_row = 2 * sm_count() // 3 * GRID_CTA_THREADS * v
        sizes |= {2 * v, 2 * v + 1, 3 * v, per_row, per_row + v, 2 * per_row + v, 100003, 262144, 300007, 1 << 20}
        sizes |= {max_block_reg_packs(dtype, backward) * per_row + v, 3 * (1 << 20) + v}
        # the first streamed row of 3 (16-byte packs); for float32 also the largest fully cached one and the
        # first streamed odd row (single elements). Rows of 4-8M elements: every dtype would add minutes.
        streamed = grid_stream_threshold_packs(dtype, v, backward) * v
        sizes |= {streamed + v}
        if dtype == torch.float32:
            # odd rows: peeled while the body's chunks fit, then streamed with single elements
            sizes |= {streamed, grid_stream_threshold_packs(dtype, 1, backward) + 1, streamed + 1}
    elif kernel == "two_pass":
        sizes |= {2048 * v - v, 2048 * v, 2048 * v + v, 100003, 1 << 20}
    elif kernel == "split_row":
        sizes |= {65537, 100003, 1 << 20, (1 << 20) + 1}
    return sorted(s for s in sizes if s >= 1 and kernel_handles(kernel, s, dtype, backward))


def rows_for(n: int) -> int:
    """Several row groups for short rows (odd count: partial warps/CTAs), a few rows for long ones."""
    return 37 if n <= 4096 else 3


def make_input(shape, dtype, seed=0, scale=3.0, device="cuda"):
    generator = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=generator, dtype=torch.float64) * scale).to(dtype).to(device)


def unaligned_input(shape, dtype, seed) -> torch.Tensor:
    """A contiguous CUDA input of `shape` that starts at storage offset 1: off 16 bytes, so rows lose their packs."""
    flat = make_input((math.prod(shape) + 1,), dtype, seed=seed)
    x = flat[1:].view(shape)
    assert x.is_contiguous() and x.data_ptr() % 16 != 0
    return x


def reference(op: str, x: torch.Tensor, dim: int, dtype: torch.dtype | None) -> torch.Tensor:
    """float64 CPU reference of op(x, dim, dtype=dtype): torch casts to dtype first, so do we."""
    cast = x.to(dtype) if dtype is not None else x
    return OPS[op](cast.double().cpu(), dim)


def check_forward(op: str, x: torch.Tensor, dim: int = -1, dtype: torch.dtype | None = None) -> torch.Tensor:
    assert x.is_cuda, "a CPU input would test the CPU implementation, not the kernel"
    ours = getattr(softmax_ops, op)(x, dim, dtype=dtype)
    expected_dtype = dtype or x.dtype
    assert ours.dtype == expected_dtype and ours.shape == x.shape and ours.is_contiguous()
    assert_within_2x_torch(ours, OPS[op](x, dim, dtype=dtype), reference(op, x, dim, dtype))
    return ours


# ------------------------------------------------------------------------------------ forward, per kernel


def forward_cases():
    for kernel in ROW_KERNELS:
        for (in_dtype, out_dtype), dtype_id in zip(FORWARD_DTYPES, FORWARD_DTYPE_IDS):
            for n in boundary_sizes(kernel, in_dtype):
                yield pytest.param(kernel, in_dtype, out_dtype, n, id=f"{kernel}-{dtype_id}-n{n}")


@pytest.mark.parametrize("op", list(OPS))
@pytest.mark.parametrize("kernel,in_dtype,out_dtype,n", list(forward_cases()))
def test_forced_kernel_forward(kernel, in_dtype, out_dtype, n, op):
    x = make_input((rows_for(n), n), in_dtype, seed=n)
    with softmax_ops.force_kernel(FORWARD_FAMILY, kernel):
        check_forward(op, x, -1, out_dtype)


@pytest.mark.parametrize("op", list(OPS))
@pytest.mark.parametrize("kernel", ALL_KERNELS)
@pytest.mark.parametrize("in_dtype,out_dtype", FORWARD_DTYPES, ids=FORWARD_DTYPE_IDS)
def test_forced_kernel_layouts(kernel, in_dtype, out_dtype, op):
    """Non-contiguous (x[:, 1:] of a wider tensor), contiguous but unaligned (storage offset 1: the
    narrow path), and a transposed view; for 'strided' also the layouts it is made for."""
    n = 1000 if kernel != "warp" else 200
    wide = make_input((5, n + 1), in_dtype, seed=1)
    unaligned = unaligned_input((5, n), in_dtype, seed=2)
    with softmax_ops.force_kernel(FORWARD_FAMILY, kernel):
        for x in (wide[:, 1:], unaligned, make_input((n, 5), in_dtype, seed=3).t()):
            check_forward(op, x, -1, out_dtype)


# (shape, dim) for the strided kernel: inner sizes below, at and above one warp, odd ones, n of 1.
STRIDED_CASES = [
    ((4, 17, 2), 1),
    ((3, 100, 3), 1),
    ((2, 33, 31), 1),
    ((2, 64, 32), 1),
    ((3, 7, 33), 1),
    ((5, 1, 100), 1),
    ((1000, 5), 0),
    ((3, 1000, 64), 1),
    ((2, 3, 5, 7), 1),
    ((2, 3, 5, 7), 0),
    ((6, 4099), 0),
    ((7, 9), 1),  # inner == 1: the strided kernel also runs plain rows when forced
]


@pytest.mark.parametrize("op", list(OPS))
@pytest.mark.parametrize("forced", [None, "strided"])
@pytest.mark.parametrize("in_dtype,out_dtype", FORWARD_DTYPES, ids=FORWARD_DTYPE_IDS)
@pytest.mark.parametrize("shape,dim", STRIDED_CASES)
def test_strided_layout(shape, dim, in_dtype, out_dtype, forced, op):
    x = make_input(shape, in_dtype, seed=len(shape) + dim)
    if forced is None:
        check_forward(op, x, dim, out_dtype)
        return
    with softmax_ops.force_kernel(FORWARD_FAMILY, forced):
        check_forward(op, x, dim, out_dtype)


SPECIAL_N = {
    "warp": 100,
    "block_onepass": 1000,
    "cluster_onepass": 100003,
    "grid_onepass": 100003,
    "two_pass": 5000,
    "split_row": 100003,
    "strided": 50,
}


def special_rows(n: int, dtype: torch.dtype) -> torch.Tensor:
    """Rows with NaN, +inf, all -inf, some -inf, a single finite value (not a power of two: exp(x - max)
    must be exactly 1 whatever x), huge magnitudes, the dtype's largest finite value (bfloat16 and float32
    reach 3.4e38, where max * log2(e) overflows), and a row of the most negative finite value (uniform),
    with the special entries near the end of the row (the last chunk of split kernels)."""
    inf, nan = float("inf"), float("nan")
    largest = torch.finfo(dtype).max
    rows = make_input((9, n), torch.float64, seed=7)
    rows[0, -1] = nan
    rows[1, n // 2] = inf
    rows[2, :] = -inf
    rows[3, ::3] = -inf
    rows[4, :] = -inf
    rows[4, -1] = 3.7
    rows[5, -1] = 60000.0
    rows[5, 0] = -60000.0
    rows[6, :] = 0.0
    rows[7, -1] = largest
    rows[8, :] = -largest
    return rows.to(dtype)


@pytest.mark.parametrize("op", list(OPS))
@pytest.mark.parametrize("kernel", ALL_KERNELS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
def test_forced_kernel_special_values(kernel, dtype, op):
    n = SPECIAL_N[kernel]
    x = special_rows(n, dtype).cuda()
    dim = -1
    if kernel == "strided":
        x = x.t().contiguous()  # reduce over dim 0 of [n, 9]: inner 9
        dim = 0
    with softmax_ops.force_kernel(FORWARD_FAMILY, kernel):
        out = check_forward(op, x, dim)
    rows = out if dim == -1 else out.t()
    minus_inf = (x if dim == -1 else x.t()) == float("-inf")
    if op == "softmax":
        assert torch.all(rows[3][minus_inf[3]] == 0)  # -inf entries give exactly 0
        assert rows[4, -1].item() == 1.0 and torch.all(rows[4, :-1] == 0)
    else:
        assert torch.all(rows[3][minus_inf[3]] == float("-inf"))
        assert rows[4, -1].item() == 0.0
    assert torch.isnan(rows[2]).all()  # all -inf row: NaN, as torch


# ------------------------------------------------------------------------------------ backward, per kernel


def backward_reference(op: str, output: torch.Tensor, grad: torch.Tensor, dim: int) -> torch.Tensor:
    """The backward op in float64 on the op's own inputs (grad_output, output), by the textbook formulas.

    Not the exact gradient of op(x): the forward output's rounding is the forward's error, and through
    exp(output) * sum(grad) it reaches the gradient amplified by |sum(grad)| (~sqrt(n)). Measured from the
    exact softmax(x), a row of 1441793 float32 values (sum(grad) = 1838) showed every implementation that reads
    the rounded output off by up to ~2.5 ulp per half ulp of the output, and torch "2x more accurate" only
    where its own float-accumulated sum happened to cancel that (benchmarks/results/*session5-diag-lsb*)."""
    y64 = output.double().cpu()
    g64 = grad.double().cpu()
    if op == "softmax":
        return y64 * (g64 - (g64 * y64).sum(dim, keepdim=True))
    return g64 - torch.exp(y64) * g64.sum(dim, keepdim=True)


def check_backward(op: str, x: torch.Tensor, dim: int, dtype) -> None:
    """Our backward op on torch's forward output vs torch's own backward, both vs the float64 gradient."""
    assert x.is_cuda, "a CPU input would test the CPU implementation, not the kernel"
    y = OPS[op](x, dim, dtype=dtype)
    grad = make_input(y.shape, y.dtype, seed=11, scale=1.0)
    backward_op = {
        "softmax": torch.ops.softmax_ops.softmax_backward,
        "log_softmax": torch.ops.softmax_ops.log_softmax_backward,
    }[op]
    torch_backward = {
        "softmax": torch._softmax_backward_data,
        "log_softmax": torch._log_softmax_backward_data,
    }[op]
    ours = backward_op(grad, y, dim, x.dtype)
    assert ours.dtype == x.dtype and ours.shape == x.shape
    # torch's own path: its backward kernel takes (float32 output, float16 input) or equal dtypes; any
    # other pair (bfloat16 included) is a cast in the forward, whose backward casts the gradient after.
    half_to_float = y.dtype == torch.float32 and x.dtype == torch.float16
    if y.dtype == x.dtype or half_to_float:
        torch_own = torch_backward(grad, y, dim, x.dtype)
    else:
        torch_own = torch_backward(grad, y, dim, y.dtype).to(x.dtype)
    assert_within_2x_torch(ours, torch_own, backward_reference(op, y, grad, dim))


# Inputs on which our result misses the accuracy rule, with what is known; strict: a fix must remove the entry.
# (Empty since session 5: the one entry, log_softmax_backward float32 on 3 x 1441793, came from measuring the
# backward against the exact gradient of x instead of against its own inputs; see backward_reference.)
KNOWN_ACCURACY_GAPS: dict = {}


def backward_cases():
    for kernel in ROW_KERNELS:
        for (in_dtype, out_dtype), dtype_id in zip(BACKWARD_DTYPES, BACKWARD_DTYPE_IDS):
            read_dtype = out_dtype or in_dtype  # the backward reads the forward output's dtype
            for n in boundary_sizes(kernel, read_dtype, backward=True):
                yield pytest.param(kernel, in_dtype, out_dtype, n, id=f"{kernel}-{dtype_id}-n{n}")


@pytest.mark.parametrize("op", list(OPS))
@pytest.mark.parametrize("kernel,in_dtype,out_dtype,n", list(backward_cases()))
def test_forced_kernel_backward(kernel, in_dtype, out_dtype, n, op, request):
    gap = KNOWN_ACCURACY_GAPS.get((op, in_dtype, out_dtype, n))
    if gap:
        request.applymarker(pytest.mark.xfail(reason=gap, strict=True, raises=AssertionError))
    x = make_input((rows_for(n), n), in_dtype, seed=n + 1)
    with softmax_ops.force_kernel(BACKWARD_FAMILY, kernel):
        check_backward(op, x, -1, out_dtype)


# Fewer rows than SMs: the dispatcher's own choice spreads a row over a cluster of 16 CTAs of up to 512
# threads with 1-8 register packs each (widest_cluster; 3 rows: up to 1 MB, single elements up to 128 KB),
# longer rows over a grid group; n at and around those buckets (fp16: 16 CTAs x 512 threads x 1 pack = 65536,
# x 2 packs = 131072 = 256 KB, x 8 packs = 524288 = 1 MB), odd n (single-element path: a cluster at 16383
# and 50001 fp16, the grid group at 50001 fp32 and 100003), every dtype, forward and backward.
FEW_ROW_SIZES = [1024, 4096, 16384, 16392, 32776, 65536, 65544, 131072, 131080, 262144, 524288, 16383, 50001, 100003]


@pytest.mark.parametrize("op", list(OPS))
@pytest.mark.parametrize("n", FEW_ROW_SIZES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_few_rows_dispatcher_choice(n, dtype, op):
    x = make_input((3, n), dtype, seed=n + 7)
    check_forward(op, x, -1, None)
    check_backward(op, x, -1, None)


# Few 16-bit rows whose CTAs hold at most 2 packs per thread take each exponential once relative to the
# thread's own max (kExpLocal in softmax_block_kernel.cuh): threads of -inf only next to a finite row max, NaN,
# +inf, all -inf rows, in a cluster (16384, 131072 columns on an H100 / H200) and in a grid group (200000).
# float32 rows take the online path of the same kernels: the same special values, for comparison.
@pytest.mark.parametrize("op", list(OPS))
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("n", [16384, 131072, 200000])
def test_few_rows_special_values(n, dtype, op):
    x = special_rows(n, dtype).cuda()
    plan = softmax_ops.explain(tuple(x.shape), dtype, op=op)
    assert "kernel cluster_onepass:" in plan or "kernel grid_onepass:" in plan, plan
    if dtype != torch.float32:
        assert "1 pack(s) per thread in registers + 0" in plan or "2 pack(s) per thread in registers + 0" in plan, plan
    out = check_forward(op, x)
    if op == "softmax":
        assert rows_exact_zero_and_one(out, x)
    assert torch.isnan(out[2]).all()


# 16-bit forward rows cached by a cluster or grid group with shared-memory packs take 4 register packs per thread,
# the rest in shared memory (softmax_dispatch.cpp kGroupSharedRegPacks16, session 43; peeled rows since session 44):
# automatic grid groups (64 x 151936: 4 + 6 or 4 + 9 packs, as the CTAs per row; 4 x 4194304: 4 + 12), the forced
# cluster of 16 on 4 x 1048576 (4 + 12), and the same plans peeled (the aligned body in packs, the edge elements
# singly), special rows in front of random ones.
GROUP_SHARED_16_CASES = [((64, 151936), None), ((4, 4194304), None), ((4, 1048576), "cluster_onepass"),
                         ((64, 151935), None), ((4, 4194303), None), ((4, 1048575), "cluster_onepass")]


@pytest.mark.parametrize("op", list(OPS))
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("shape,forced", GROUP_SHARED_16_CASES)
def test_16_bit_group_rows_with_shared_packs_on_4_register_packs(shape, forced, dtype, op):
    x = special_rows_in_front(shape, dtype)
    with softmax_ops.force_kernel(FORWARD_FAMILY, forced) if forced else contextlib.nullcontext():
        line = plan_line(shape, dtype, op)
        assert register_packs(line) == 4 and shared_packs(line) > 0, line
        out = check_forward(op, x)
        check_forward(op, unaligned_input(shape, dtype, seed=3))  # every row off 16 bytes: the peeled plan
    assert torch.isnan(out[0]).all() and torch.isnan(out[2]).all()  # a NaN entry; all -inf
    if op == "softmax" and shape[0] >= 5:
        assert rows_exact_zero_and_one(out, x)


def rows_exact_zero_and_one(out: torch.Tensor, x: torch.Tensor) -> bool:
    """Row 4 of special_rows is -inf but for its last entry: softmax gives exactly 0 ... 0, 1."""
    return out[4, -1].item() == 1.0 and bool(torch.all(out[4, :-1] == 0)) and bool(torch.all(out[3][x[3] == float("-inf")] == 0))


@pytest.mark.parametrize("op", list(OPS))
@pytest.mark.parametrize("forced", [None, "strided"])
@pytest.mark.parametrize("shape,dim", STRIDED_CASES)
def test_strided_backward(shape, dim, forced, op):
    x = make_input(shape, torch.float32, seed=5)
    if forced is None:
        check_backward(op, x, dim, None)
        return
    with softmax_ops.force_kernel(BACKWARD_FAMILY, forced):
        check_backward(op, x, dim, None)


@pytest.mark.parametrize("op", list(OPS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_autograd_end_to_end(dtype, op):
    """The public op under autograd agrees with torch autograd (auto-chosen kernels, several regimes)."""
    for shape in [(64, 100), (16, 3000), (3, 300000), (5, 6, 7)]:
        x = make_input(shape, dtype, seed=3)
        grad = make_input(shape, dtype, seed=4, scale=1.0)
        ours_x = x.clone().requires_grad_(True)
        torch_x = x.clone().requires_grad_(True)
        getattr(softmax_ops, op)(ours_x, 1).backward(grad)
        OPS[op](torch_x, 1).backward(grad)
        ref_x = x.double().cpu().requires_grad_(True)
        OPS[op](ref_x, 1).backward(grad.double().cpu())
        assert_within_2x_torch(ours_x.grad, torch_x.grad, ref_x.grad)


# ------------------------------------------------------------------------------------ peeled rows


def peeled_sizes(dtype: torch.dtype) -> list[int]:
    """Row lengths that break 16-byte packs: shorter than one pack (edges only), one pack +- 1, a body of many
    packs with the longest tail, GPT-2's 50257 words, 4095."""
    v = vec16(dtype)
    sizes = {1, v - 1, v + 1, 2 * v - 1, 3 * v + 1, 64 * v + v - 1, 4095, 50257}
    return sorted(n for n in sizes if n >= 1 and n % v != 0)


@pytest.mark.parametrize("op", list(OPS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_peeled_warp_rows_at_every_count_of_rows(dtype, op):
    """The peeled warp kernel gives a row as many lanes as the launch's rows have edge elements at most
    (max_row_edges), which depends on how many rows there are (the first row starts at phase 0, row r at r n):
    1 .. 2 v + 1 rows of lengths whose edges number 2 .. 2 (v - 1), forward and backward."""
    v = vec16(dtype)
    for n in sorted({4 * v + v // 2, 12 * v + 2, 12 * v + v - 2, 12 * v + v - 1, 12 * v + 5}):
        if n % v == 0:
            continue
        for rows in range(1, 2 * v + 2):
            x = make_input((rows, n), dtype, seed=rows * 1000 + n)
            with softmax_ops.force_kernel(FORWARD_FAMILY, "warp"):
                check_forward(op, x, -1, None)
            with softmax_ops.force_kernel(BACKWARD_FAMILY, "warp"):
                check_backward(op, x, -1, None)


def assert_peeled(shape, dtype, op):
    text = softmax_ops.explain(shape, dtype, op=op)
    assert "rows peeled" in text and f"{vec16(dtype)} element(s) per access" in text, text


@pytest.mark.parametrize("op", list(OPS))
@pytest.mark.parametrize("kernel", PEELED_KERNELS)
@pytest.mark.parametrize("in_dtype,out_dtype", FORWARD_DTYPES, ids=FORWARD_DTYPE_IDS)
def test_peeled_rows_forward(kernel, in_dtype, out_dtype, op):
    """2 v + 1 rows of a length that breaks v-element packs start at every element phase, so every head and
    tail length (0 .. v - 1) occurs; the forced kernel runs them peeled (explain says so)."""
    v = vec16(in_dtype)
    for n in peeled_sizes(in_dtype):
        if not kernel_handles(kernel, n, in_dtype):
            continue
        x = make_input((2 * v + 1, n), in_dtype, seed=n)
        with softmax_ops.force_kernel(FORWARD_FAMILY, kernel):
            if out_dtype is None and n >= 2 * v:
                assert_peeled(tuple(x.shape), in_dtype, op)
            check_forward(op, x, -1, out_dtype)


@pytest.mark.parametrize("op", list(OPS))
@pytest.mark.parametrize("kernel", PEELED_KERNELS)
@pytest.mark.parametrize("in_dtype,out_dtype", BACKWARD_DTYPES, ids=BACKWARD_DTYPE_IDS)
def test_peeled_rows_backward(kernel, in_dtype, out_dtype, op):
    read_dtype = out_dtype or in_dtype
    v = vec16(read_dtype)
    for n in peeled_sizes(read_dtype):
        if not kernel_handles(kernel, n, read_dtype, backward=True):
            continue
        x = make_input((2 * v + 1, n), in_dtype, seed=n + 1)
        with softmax_ops.force_kernel(BACKWARD_FAMILY, kernel):
            check_backward(op, x, -1, out_dtype)


@pytest.mark.parametrize("op", list(OPS))
@pytest.mark.parametrize("kernel", PEELED_KERNELS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
def test_peeled_rows_special_values(kernel, dtype, op):
    """special_rows (NaN in the last column, +inf mid-row, all / some -inf, huge magnitudes) on 4095 columns
    (the warp kernel: 1023, or 255 for float64): the specials sit in tails and bodies of rows at different
    phases; a NaN and a +inf in the first column (a head) of two more rows."""
    n = 4095 if kernel != "warp" else (255 if dtype == torch.float64 else 1023)
    assert kernel_handles(kernel, n, dtype)
    x = special_rows(n, dtype)
    extra = make_input((2, n), torch.float64, seed=5).to(dtype)
    extra[0, 0] = float("nan")
    extra[1, 0] = float("inf")
    x = torch.cat([x, extra]).cuda()
    with softmax_ops.force_kernel(FORWARD_FAMILY, kernel):
        out = check_forward(op, x, -1)
    assert torch.isnan(out[2]).all() and torch.isnan(out[-1]).all() and torch.isnan(out[-2]).all()


# Few float32 forward rows that break 16-byte packs and that the whole-pack rules would spread thinly run the
# peeled cluster of the peeled instances' packs (softmax_dispatch.cpp, kPeeledClusterMinThreads; the rule's cases
# are in test_dispatch_rules.py). Odd lengths put consecutive rows at different element phases (all of them where
# there are enough rows); special_rows' rows (NaN, +inf, -inf rows, huge magnitudes) in front, as many as the shape
# has.
PEELED_CLUSTER_CASES = [((16, 100003), torch.float32), ((8, 50257), torch.float32), ((3, 100003), torch.float32),
                        ((2, 100003), torch.float32), ((1, 50257), torch.float32)]


def special_rows_repeated(rows: int, n: int, dtype) -> torch.Tensor:
    """`rows` rows of n: special_rows' 9 repeated down the batch (a contiguous input)."""
    special = special_rows(n, dtype)
    return special.repeat(-(-rows // special.shape[0]), 1)[:rows].contiguous()


def special_rows_in_front(shape, dtype) -> torch.Tensor:
    """A CUDA input of `shape` whose first rows (up to 9) are special_rows'."""
    x = make_input(shape, torch.float64, seed=shape[1] + shape[0]).to(dtype)
    specials = min(shape[0], 9)
    x[:specials] = special_rows(shape[1], dtype)[:specials]
    return x.cuda()


@pytest.mark.parametrize("op", list(OPS))
@pytest.mark.parametrize("shape,dtype", PEELED_CLUSTER_CASES)
def test_few_forward_rows_in_the_peeled_cluster(shape, dtype, op):
    text = softmax_ops.explain(shape, dtype, op=op)
    assert "kernel cluster_onepass:" in text and "the peeled instances'" in text and "rows peeled" in text, text
    out = check_forward(op, special_rows_in_front(shape, dtype))
    assert torch.isnan(out[0]).all()  # a NaN in the row
    if shape[0] > 2:
        assert torch.isnan(out[2]).all()  # an all -inf row


# Few rows that break 16-byte packs run their aligned body's plan peeled, at whatever register packs it spreads them
# over (peeled_instance, session 34; the rule's cases are in test_dispatch_rules.py): each 16-bit forward
# bucket below the most (1, 2, 4 packs), the 16-bit backward's (1) and the float32 backward's (1, 2), in clusters
# and grid groups. (The float32 forward has no such instances: its cases check the backward only.)
PEELED_SPREAD_SHAPES = [(4, 65537), (8, 50257), (3, 100003), (2, 1048575), (1, 262143), (64, 50257), (16, 65537),
                        (1, 4097), (8, 16383)]
# The float32 backward's: clusters at 1 and 2 packs, grid groups at 1 (3 x 100003, 2 x 1048575 and 64 x 50257 hold
# its most, 4).
FLOAT32_PEELED_SPREAD_SHAPES = [(4, 65537), (8, 16383), (1, 4097), (8, 50257), (1, 262143), (16, 65537)]
PEELED_SPREAD_CASES = [(shape, dtype) for dtype in (torch.float16, torch.bfloat16) for shape in PEELED_SPREAD_SHAPES]
PEELED_SPREAD_CASES += [(shape, torch.float32) for shape in FLOAT32_PEELED_SPREAD_SHAPES]


def runs_peeled_spread(shape, dtype, op, out_dtype=None) -> bool:
    """Whether `op` runs `shape` peeled at fewer register packs than its peeled instances' most."""
    line = plan_line(shape, dtype, op, out_dtype)
    return "rows peeled" in line and register_packs(line) < max_block_reg_packs(dtype, op.endswith("backward"))


@pytest.mark.parametrize("op", list(OPS))
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("shape", [(1, 50257), (3, 100003), (1, 262143), (6, 151935), (24, 100003), (8, 262143),
                                   (4, 1048575)])
def test_few_16_bit_rows_with_a_float32_result_peeled_at_fewer_register_packs(shape, dtype, op):
    """The widening instances of the same (1, 2, 4 packs; clusters and grid groups): random rows, then
    special_rows in front (few rows are all special: hence both)."""
    assert runs_peeled_spread(shape, dtype, op, torch.float32), plan_line(shape, dtype, op, torch.float32)
    out = check_forward(op, make_input(shape, dtype, seed=4), dtype=torch.float32)
    assert out.dtype == torch.float32 and torch.isfinite(out).all()
    out = check_forward(op, special_rows_in_front(shape, dtype), dtype=torch.float32)
    assert torch.isnan(out[0]).all()  # a NaN in the row


@pytest.mark.parametrize("op", list(OPS))
@pytest.mark.parametrize("shape,dtype", PEELED_SPREAD_CASES)
def test_few_rows_peeled_at_fewer_register_packs(shape, dtype, op):
    """Forward on random rows, then with special_rows in front (few rows are all special: hence both); the
    backward (same shape, so the same plan) on torch's output of random rows."""
    forward, backward = runs_peeled_spread(shape, dtype, op), runs_peeled_spread(shape, dtype, f"{op}_backward")
    assert forward or backward, softmax_ops.explain(shape, dtype, op=op)
    x = special_rows_in_front(shape, dtype)
    if forward:
        assert torch.isfinite(check_forward(op, make_input(shape, dtype, seed=4))).all()
        out = check_forward(op, x)
        assert torch.isnan(out[0]).all()  # a NaN in the row
    if backward:
        check_backward(op, make_input(shape, dtype, seed=3), -1, None)


@pytest.mark.parametrize(
    "shape,peeled",
    [
        ((300, 4095), True),
        ((140, 50257), True),
        ((64, 151935), True),  # few long rows: a grid group / cluster of the most register packs per thread
        ((3, 2_000_001), True),  # split_row
        ((133, 1001), True),  # short rows: the warp kernel (float32 backward: block_onepass)
        ((2200, 1001), True),
        ((140, 2049), True),  # the lean instances' float form (>= 256 packs of 4)
        ((140, 8191), True),  # the lean forward's wide form (16-bit)
        ((2112, 2047), True),  # 16-bit: 255 packs, the warp kernel (one wave of rows)
        ((8192, 1023), True),  # the warp kernel, peeled
        ((4096, 101), True),  # the warp kernel, 16 lanes per row at 16 bits (one edge element per lane)
    ],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_automatic_plan_peels_rows(shape, peeled, dtype):
    """Rows of a length that breaks packs under the dispatcher's own plan (test_dispatch_rules.py holds the
    rules; here the answers): many rows, and few long ones, run peeled."""
    x = make_input(shape, dtype, seed=shape[1])
    for op in OPS:
        if peeled:
            assert_peeled(shape, dtype, op)
            assert_peeled(shape, dtype, f"{op}_backward")
        check_forward(op, x)
        check_backward(op, x, -1, None)


@pytest.mark.parametrize("op", list(OPS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_lean_peeled_rows_special_values(dtype, op):
    """The lean instances run many rows peeled only under the automatic plan: special_rows among 150 rows of
    4095 (rows at every phase), a NaN and a +inf in the first column (a head) of two more; forward, and the
    backward on the 139 rows after them (enough rows for the lean backward, huge magnitudes in the edges)."""
    x = make_input((150, 4095), torch.float64, seed=6).to(dtype)
    x[:9] = special_rows(4095, dtype)
    x[9, 0] = float("nan")
    x[10, 0] = float("inf")
    x[11, 0] = x[12, -1] = 60000.0 if dtype == torch.float16 else 1e30
    x = x.cuda()
    assert "lean instance" in softmax_ops.explain(tuple(x.shape), dtype, op=op)
    out = check_forward(op, x)
    assert torch.isnan(out[2]).all() and torch.isnan(out[9]).all() and torch.isnan(out[10]).all()
    assert "lean instance" in softmax_ops.explain((139, 4095), dtype, op=f"{op}_backward")
    check_backward(op, x[11:], -1, None)


def test_rows_in_different_phases_are_not_peeled():
    """An input whose storage starts mid-pack (offset 1) and a fresh output are in different phases: no
    common aligned body, so single elements; the answer is right either way."""
    x = unaligned_input((300, 4095), torch.float16, seed=3)
    with softmax_ops.force_kernel(FORWARD_FAMILY, "block_onepass"):
        check_forward("softmax", x)
    check_forward("log_softmax", x)


# ------------------------------------------------------------------------------------ widening rows


# A 16-bit input with a float32 result (softmax(x, dtype=torch.float32)) has warp plans of its own
# (softmax_dispatch.cpp: widening_short_row_packs, lean_rows, widening_cluster_rows): 2 packs per lane from 256
# rows per SM, 4 below, rows of up to 2048 columns on the warp kernel however many there are, and rows of 2048
# packs (16384 columns) or more in clusters of 2 from 8 rows per SM, caching 4 packs per thread in registers
# (8 for peeled rows), their results written in lane pairs. The automatic choice, at and around those boundaries,
# whole and peeled rows.
@pytest.mark.parametrize("op", list(OPS))
@pytest.mark.parametrize("in_dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("rows_per_sm,n,plan", [
    (256, 64, "2 pack(s) per lane"), (255, 64, "4 pack(s) per lane"), (256, 128, "2 pack(s) per lane"),
    (256, 256, "2 pack(s) per lane"), (256, 100, "kernel warp"), (256, 8, "kernel warp"),
    (64, 2048, "kernel warp"), (64, 2040, "kernel warp"), (64, 2056, "kernel block_onepass"),
    (16, 2048, "kernel warp"), (2, 2048, "kernel block_onepass"),
    (8, 16384, "clusters of 2 CTAs per row, 4 pack(s)"), (8, 16376, "kernel block_onepass"),
    (8, 16392, "clusters of 2 CTAs per row, 4 pack(s)"), (8, 16383, "kernel block_onepass"),
    (7, 16384, "kernel block_onepass"), (8, 32000, "clusters of 2 CTAs per row, 4 pack(s)"),
    (8, 32001, "clusters of 2 CTAs per row, 8 pack(s)"),
])
def test_widening_rows_automatic_plans(rows_per_sm, n, plan, in_dtype, op):
    x = make_input((rows_per_sm * sm_count(), n), in_dtype, seed=n)
    chosen = softmax_ops.explain(x.shape, in_dtype, op=op, out_dtype=torch.float32)
    assert plan in chosen, chosen
    check_forward(op, x, -1, torch.float32)


# ------------------------------------------------------------------------------------ grid-stride loops

# Enough rows that the grid is capped (8 waves of resident CTAs) and CTAs loop over several rows.
GRID_STRIDE_CASES = [
    ("warp", (2_100_003, 2)),
    ("block_onepass", (200_003, 8)),
    ("block_onepass", (20_003, 1001)),  # peeled: every CTA's rows start at different phases
    ("cluster_onepass", (101_003, 8)),  # clusters of 2 CTAs, 33792 of them, up to 3 rows each: the cluster
                                        # barrier across rows and the reuse of its double buffer
    ("two_pass", (200_003, 8)),
    ("split_row", (200_003, 64)),
    ("strided", (400_003, 3, 2)),
]


@pytest.mark.parametrize("kernel,shape", GRID_STRIDE_CASES)
def test_forced_kernel_grid_stride(kernel, shape):
    x = make_input(shape, torch.float32, seed=9)
    dim = 1
    with softmax_ops.force_kernel(FORWARD_FAMILY, kernel):
        check_forward("softmax", x, dim)
    with softmax_ops.force_kernel(BACKWARD_FAMILY, kernel):
        check_backward("softmax", x, dim, None)


# ------------------------------------------------------------------------------------ dispatcher contract


def test_kernel_menu_is_registered():
    for family in (FORWARD_FAMILY, BACKWARD_FAMILY):
        assert softmax_ops.list_kernels(family) == ALL_KERNELS


@pytest.mark.parametrize("kernel", ROW_KERNELS)
def test_forced_row_kernel_refuses_strided_layout(kernel):
    x = make_input((4, 8, 3), torch.float32)
    for family, call in [
        (FORWARD_FAMILY, lambda: softmax_ops.softmax(x, 1)),
        (BACKWARD_FAMILY, lambda: torch.ops.softmax_ops.softmax_backward(x, x, 1, x.dtype)),
    ]:
        with softmax_ops.force_kernel(family, kernel), pytest.raises(RuntimeError, match="strided"):
            call()


@pytest.mark.parametrize("kernel", ["warp", "block_onepass", "cluster_onepass"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_forced_kernel_refuses_rows_beyond_its_capacity(kernel, dtype):
    v = vec16(dtype)
    too_long = {
        "warp": WARP_LANES * WARP_MAX_PACKS * v + v,
        "block_onepass": block_capacity_packs(dtype, v, False) * v + v,
        "cluster_onepass": 16 * block_capacity_packs(dtype, v, False) * v + 16 * v,
    }[kernel]
    assert not kernel_handles(kernel, too_long, dtype)
    x = make_input((1, too_long), dtype)
    with softmax_ops.force_kernel(FORWARD_FAMILY, kernel), pytest.raises(RuntimeError, match="cannot run"):
        softmax_ops.softmax(x, -1)


@pytest.mark.parametrize(
    "shape,dtype,op,kernel",
    [
        ((16384, 128), torch.float32, "softmax", "warp"),
        ((65536, 64), torch.float16, "softmax", "warp"),
        ((4096, 4096), torch.float16, "softmax", "block_onepass"),
        ((2048, 8192), torch.float32, "log_softmax", "block_onepass"),
        ((4, 262144), torch.float16, "softmax", "cluster_onepass"),
        ((8, 262144), torch.float16, "softmax", "grid_onepass"),
        ((4, 33554432), torch.float32, "softmax", "split_row"),
        ((4, 8388608), torch.float16, "softmax", "grid_onepass"),
        ((200, 1 << 22), torch.float32, "softmax", "split_row"),
        ((32, 16, 4096), torch.float32, "softmax", "strided"),
        ((2048, 4096), torch.bfloat16, "softmax_backward", "block_onepass"),
    ],
)
def test_explain_names_the_chosen_kernel(shape, dtype, op, kernel):
    dim = 1 if len(shape) == 3 else -1
    text = softmax_ops.explain(shape, dtype, op=op, dim=dim)
    assert f"kernel {kernel}:" in text, text
    assert "why:" in text


@pytest.mark.parametrize("op", list(OPS))
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_automatic_block_kernel_prefetches_next_row(dtype, op):
    """Many 16-bit rows that fit in registers: the dispatcher's own plan (two rows per CTA, the second
    prefetched into shared memory) gives the reference's answer, odd row count included."""
    x = make_input((301, 12000), dtype, seed=7)
    assert "next row prefetched" in softmax_ops.explain(tuple(x.shape), dtype, op=op)
    check_forward(op, x)


# The lean block instance (softmax of many rows, exp taken once; 16-bit rows of 256..1024 packs with 2 or 4 packs
# per thread, float32 rows of 256..2048 packs with 8, but 2 for rows of up to 256 packs that fit in one wave): its
# bounds and sizes between buckets, every 16-bit input's dtype pairs and float32, softmax and log_softmax.
LEAN_SIZES = [2048, 2056, 4096, 6000, 8184, 8192]
LEAN_DTYPES = [p for p in FORWARD_DTYPES if p[0] in (torch.float16, torch.bfloat16)] + [(torch.float32, None)]
# float32 rows take the lean instance from 256 packs (1024 columns) up: lean_rows() rows of 1024 columns fit in one
# wave (the two-pack form, test_float32_rows_of_one_wave_on_the_lean_two_pack_form), longer ones take the float form.
LEAN_CASES = [(in_dtype, out_dtype, n) for in_dtype, out_dtype in LEAN_DTYPES for n in LEAN_SIZES] + [
    (torch.float32, None, n) for n in (1024, 1028, 1536, 2044)]


def lean_rows() -> int:
    """Rows enough for the lean plan (at least one per SM)."""
    return max(150, sm_count() + 18)


@pytest.mark.parametrize("op", list(OPS))
@pytest.mark.parametrize("in_dtype,out_dtype,n", LEAN_CASES)
def test_automatic_lean_block_rows(n, in_dtype, out_dtype, op):
    x = make_input((lean_rows(), n), in_dtype, seed=n)
    assert "lean instance" in softmax_ops.explain(tuple(x.shape), in_dtype, op=op)
    check_forward(op, x, -1, out_dtype)


@pytest.mark.parametrize("op", list(OPS))
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("shape", [(20_000, 2048), (5_000, 8192)])
def test_lean_block_rows_grid_stride(shape, dtype, op):
    """More rows than the lean plan's grid (8 waves of resident CTAs): CTAs loop over rows, reusing their
    reduction scratch."""
    x = make_input(shape, dtype, seed=shape[0])
    assert "lean instance" in softmax_ops.explain(shape, dtype, op=op)
    check_forward(op, x)


@pytest.mark.parametrize("op", list(OPS))
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("n", [4104, 4096, 8192])
def test_lean_block_rows_special_values(dtype, n, op):
    """NaN / +inf / -inf / all -inf / largest-value rows through the lean instance (the special rows repeated
    down the batch): n = 513 packs (16-bit; 1026 float32), so that the -inf padding of the last pack's threads
    meets them too, and whole rows of every form (no padding, a separate compiled body)."""
    x = special_rows_repeated(lean_rows(), n, dtype)
    assert "lean instance" in softmax_ops.explain(tuple(x.shape), dtype, op=op)
    check_forward(op, x)


# Rows whose maxima lie far from 0 (up to |1000|, offsets on both sides of 256 / log2 e = 177.4, where session 12's
# fused-exponent experiment changed form): the warp kernel's short and long rows and both lean forms, 16-bit and
# float results, one launch each.
ROW_OFFSETS = [-1000.0, -177.5, -177.0, -20.0, 0.0, 20.0, 177.0, 177.5, 1000.0]


@pytest.mark.parametrize("in_dtype,out_dtype", LEAN_DTYPES)
@pytest.mark.parametrize("n", [64, 1024, 4096, 8192])
def test_softmax_rows_with_offset_maxima(n, in_dtype, out_dtype):
    offsets = torch.tensor(ROW_OFFSETS, dtype=torch.float64).repeat(-(-lean_rows() // len(ROW_OFFSETS)))
    rows = offsets.numel() * (256 if n == 64 else 1)  # 64 columns: enough rows for the short-row plan
    x64 = make_input((rows, n), torch.float64, seed=n, device="cpu") + offsets.repeat(rows // offsets.numel())[:, None]
    x = x64.to(in_dtype).cuda()
    # 1024 columns of a 16-bit result: one wave of the lean one-pack form (session 46)
    one_pack = n == 1024 and in_dtype != torch.float32 and out_dtype is None
    expected = "lean instance" if n >= 4096 or (in_dtype == torch.float32 and n >= 1024) or one_pack else "warp"
    assert expected in softmax_ops.explain(tuple(x.shape), in_dtype, op="softmax", out_dtype=out_dtype)
    check_forward("softmax", x, -1, out_dtype)


# The backward ops' lean instance (lean_backward_rows: the same CTA shape, 2 packs of each stream per thread):
# every size above, both 16-bit dtypes, softmax_backward and log_softmax_backward.
# float32 streams take it for 192..1024 packs of 4 (768-4096 columns; from 192 since session 35 where the result is
# float32 too, since session 38 also for a 16-bit result: test_automatic_lean_block_rows_backward_float32_streams_16bit_result).
LEAN_BACKWARD_CASES = [(dtype, n) for dtype in (torch.float16, torch.bfloat16) for n in LEAN_SIZES] + [
    (torch.float32, n) for n in (768, 772, 1000, 1024, 1028, 2048, 3000, 4092, 4096)]


@pytest.mark.parametrize("op", list(OPS))
@pytest.mark.parametrize("dtype,n", LEAN_BACKWARD_CASES)
def test_automatic_lean_block_rows_backward(n, dtype, op):
    x = make_input((lean_rows(), n), dtype, seed=n)
    assert "lean instance" in softmax_ops.explain(tuple(x.shape), dtype, op=f"{op}_backward")
    check_backward(op, x, -1, None)


@pytest.mark.parametrize("op", list(OPS))
@pytest.mark.parametrize("in_dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("shape", [(128, 1024), (8, 1000), (1, 768), (1, 772)])
def test_few_float32_backward_rows_take_the_lean_instance(shape, in_dtype, op):
    """Fewer float32 rows than SMs of 192-256 packs: a CTA per row in the lean instance (lean_rows, session 35; float32
    streams with a 16-bit result since session 38: the backward of softmax(x_16bit, dtype=float32); since session 40
    part of the few-row rule from 512 columns, test_backward_rows_on_a_lean_cta_per_row); 1000 and 772 columns leave
    the last pack's threads padding."""
    x = make_input(shape, in_dtype, seed=shape[0] + shape[1])
    assert "lean instance" in softmax_ops.explain(shape, torch.float32, op=f"{op}_backward", out_dtype=in_dtype)
    check_backward(op, x, -1, torch.float32)


@pytest.mark.parametrize("op", list(OPS))
@pytest.mark.parametrize("in_dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("n", [768, 772, 1000, 1024, 1028, 2048, 4096])
def test_automatic_lean_block_rows_backward_float32_streams_16bit_result(n, in_dtype, op):
    """softmax(x_16bit, dtype=torch.float32) and its backward: float32 streams, a 16-bit gradient, through the
    lean instance's BackwardOp<float, half / bfloat16> (lean_rows; from 192 packs, 768 columns, since session 38)."""
    x = make_input((lean_rows(), n), in_dtype, seed=n + 3)
    assert "lean instance" in softmax_ops.explain(tuple(x.shape), torch.float32, op=f"{op}_backward",
                                                  out_dtype=in_dtype)
    check_backward(op, x, -1, torch.float32)


# Few backward rows (fewer than SMs) of 512 columns up to the two-pack form's 1024 packs, whole, padded and peeled,
# and many 16-bit backward rows of 64-255 whole packs whose CTAs fit in one wave (lean_rows: few_backward,
# one_wave_16bit_backward; session 40). Rows None: one fewer than the device's SMs; rows 0: one wave of 32-thread CTAs
# (32 per SM).
FEW_LEAN_BACKWARD_SHAPES = [(1, 512), (5, 520), (2, 519), (128, 1024), (64, 1001), (None, 3000), (8, 4096), (3, 4095)]
FEW_LEAN_BACKWARD_CASES = (
    [(dtype, None, shape) for dtype in (torch.float16, torch.bfloat16)
     for shape in FEW_LEAN_BACKWARD_SHAPES + [(1, 8192), (3, 8191), (1000, 1000), (2048, 1024), (4096, 1000),
                                              (0, 512)]]
    + [(torch.float32, None, shape) for shape in FEW_LEAN_BACKWARD_SHAPES]
    + [(dtype, torch.float32, shape) for dtype in (torch.float16, torch.bfloat16) for shape in FEW_LEAN_BACKWARD_SHAPES])


ROW_LABELS = {None: "SMsMinus1", 0: "32xSMs"}


@pytest.mark.parametrize("op", list(OPS))
@pytest.mark.parametrize("in_dtype,out_dtype,shape", FEW_LEAN_BACKWARD_CASES,
                         ids=[forward_case_id(i, o, ROW_LABELS.get(shape[0], shape[0]), shape[1])
                              for i, o, shape in FEW_LEAN_BACKWARD_CASES])
def test_backward_rows_on_a_lean_cta_per_row(shape, in_dtype, out_dtype, op):
    rows = {None: sm_count() - 1, 0: 32 * sm_count()}.get(shape[0], shape[0])
    shape = (rows, shape[1])
    streams = out_dtype or in_dtype
    line = softmax_ops.explain(shape, streams, op=f"{op}_backward", out_dtype=in_dtype if out_dtype else None)
    assert "lean instance" in line and "2 pack(s) per thread" in line, line
    assert f"kernel block_onepass: {rows} CTAs x" in line, line  # a CTA per row
    assert ("fewer rows than SMs" if rows < sm_count() else "rows whose CTAs fit in one wave") in line, line
    check_backward(op, make_input(shape, in_dtype, seed=shape[1] + 5), -1, out_dtype)
    check_backward(op, special_rows_repeated(rows, shape[1], in_dtype), -1, out_dtype)


@pytest.mark.parametrize("op", list(OPS))
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("shape", [(20_000, 2048), (5_000, 8192)])
def test_lean_block_rows_backward_grid_stride(shape, dtype, op):
    """More rows than the backward lean plan's grid: CTAs loop over rows, reusing their reduction scratch."""
    x = make_input(shape, dtype, seed=shape[0] + 1)
    assert "lean instance" in softmax_ops.explain(shape, dtype, op=f"{op}_backward")
    check_backward(op, x, -1, None)


@pytest.mark.parametrize("op", list(OPS))
@pytest.mark.parametrize("dtype,n", [(torch.float16, 4104), (torch.bfloat16, 4104), (torch.float32, 2052),
                                     (torch.float32, 772)])
def test_lean_block_rows_backward_special_values(dtype, n, op):
    """The special rows' forward outputs (NaN rows, exact zeros, -inf for log_softmax) as the backward's
    output stream, through the lean instance; n = 513 packs (float32 772: 193) leaves the last pack's threads
    padding."""
    x = special_rows_repeated(lean_rows(), n, dtype)
    assert "lean instance" in softmax_ops.explain(tuple(x.shape), dtype, op=f"{op}_backward")
    check_backward(op, x, -1, None)


@pytest.mark.parametrize("op", list(OPS))
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("shape,lanes", [
    # 4 packs on 4 lanes, 8 rows per warp: 4099 = 8 x 512 + 3 leaves the last warp 3 of its 8 rows
    pytest.param((4099, 32), 4, id="4099x32"),
    pytest.param((1000, 56), 8, id="1000x56"),  # 7 packs: the eighth lane of each row holds padding only
    pytest.param((37, 64), 8, id="37x64"),
    # more rows than the capped grid (16896 CTAs x 16 rows on an H100) covers: a second grid-stride pass
    pytest.param((300000, 64), 8, id="300000x64"),
])
def test_automatic_16_bit_rows_of_one_pack_per_lane(shape, lanes, dtype, op):
    """16-bit forward rows of 4, 7 or 8 whole packs, one pack per lane (plan_warp, since session 41), the special
    rows repeated down the batch (NaN, +inf, all -inf rows, the largest values) and every row in float64; and the
    same row length read from an address off 16 bytes (peeled: the rule leaves such rows to their own plan)."""
    line = softmax_ops.explain(shape, dtype, op=op)
    assert "kernel warp: " in line and f"{lanes} lane(s) per row, 1 pack(s) per lane" in line, line
    check_forward(op, special_rows_repeated(shape[0], shape[1], dtype), -1, None)
    check_forward(op, make_input(shape, dtype, seed=shape[0] + shape[1]), -1, None)
    check_forward(op, unaligned_input(shape, dtype, seed=3), -1, None)


# Row lengths whose forced warp plans (plan_warp) cover 1, 2, 4, 8, 16 and 32 lanes per row at 1, 2, 4 and 8 packs
# per lane, single elements (odd rows) and peeled rows with edge elements.
WARP_LANE_ROW_LENGTHS = [8, 16, 24, 32, 60, 64, 96, 128, 160, 256, 512, 1000, 1024, 7, 33, 255]


def warp_lane_cases():
    for (in_dtype, out_dtype), dtype_id in zip(FORWARD_DTYPES, FORWARD_DTYPE_IDS):
        for n in WARP_LANE_ROW_LENGTHS:
            if kernel_handles("warp", n, in_dtype):  # float64 rows stop at 512 columns (32 lanes x 8 packs of 2)
                yield pytest.param(in_dtype, out_dtype, n, id=f"{dtype_id}-n{n}")


@pytest.mark.parametrize("op", list(OPS))
@pytest.mark.parametrize("in_dtype,out_dtype,n", list(warp_lane_cases()))
def test_forced_warp_rows_at_every_lane_count(in_dtype, out_dtype, n, op):
    """The warp kernel forced at 1-32 lanes per row (1, 2, 4 and 8 packs per lane, single elements, peeled rows):
    the special rows repeated down the batch (37 rows: partial warps) and random rows, against float64. Softmax of
    float rows runs the max-first exp_once_row where a lane holds up to 32 floats; log_softmax, and float64 softmax,
    the online (max, sum) form. Added in session 42 with an experiment that gave log_softmax the max-first rows too
    (not kept: benchmarks/patches/session42-warp-max-first-experiment.patch)."""
    with softmax_ops.force_kernel(FORWARD_FAMILY, "warp"):
        assert "kernel warp: " in softmax_ops.explain((37, n), in_dtype, op=op, out_dtype=out_dtype)
        check_forward(op, special_rows_repeated(37, n, in_dtype), -1, out_dtype)
        check_forward(op, make_input((37, n), in_dtype, seed=n), -1, out_dtype)


@pytest.mark.parametrize("op", list(OPS))
@pytest.mark.parametrize("in_dtype,out_dtype", FORWARD_DTYPES, ids=FORWARD_DTYPE_IDS)
@pytest.mark.parametrize("shape", [(128, 2048), (37, 2048), (5, 1600), (200, 2040), (264, 1040)])
def test_automatic_small_rows_spread_over_a_cta(shape, in_dtype, out_dtype, op):
    """Few rows of 1-2K columns, every dtype pair: the dispatcher's own plan, a CTA per row. 16-bit rows: fewer
    than SMs on the lean instance, 2 packs per thread (since session 38), 132-264 rows of 129-255 packs spread over
    one pack per thread (spread_small_rows); float32 rows: fewer than SMs on the lean instance's two-pack form (since
    session 39), 200 and 264 rows more packs per thread."""
    x = make_input(shape, in_dtype, seed=shape[0])
    if in_dtype != torch.float64:
        line = softmax_ops.explain(shape, in_dtype, op=op, out_dtype=out_dtype)
        assert "kernel block_onepass" in line, line
        if in_dtype != torch.float32:
            assert ("lean instance" if shape[0] < sm_count() else "1 pack(s) per thread") in line, line
        else:
            packs = "2 pack(s)" if shape[0] < sm_count() else "8 pack(s)"  # 200 / 264 rows: the float form
            assert "lean instance" in line and packs in line, line
    check_forward(op, x, -1, out_dtype)


# Few forward rows of 256-8192 columns (fewer rows than SMs; float32 results: 512-8192 columns): a CTA per row of the
# lean instance, 2 packs per thread up to 512 threads, float32 rows of more than 4096 columns the float form's 8
# (lean_rows, kLeanFewMinColumns; sessions 38-39). Whole rows at both ends of each range, rows whose last pack's
# threads hold padding, peeled rows (the aligned body's plan); random rows, then special_rows in front. Rows None:
# one fewer than the device's SMs.
FEW_LEAN_FORWARD_SHAPES = [(1, 512), (2, 520), (8, 1000), (128, 1024), (None, 2048), (64, 1001), (3, 2047), (4, 4096),
                           (None, 3000), (64, 4095), (2, 4104), (8, 6000), (1, 8192), (3, 8191)]
FEW_LEAN_FORWARD_16BIT_RESULT_SHAPES = [(1, 256), (5, 264), (2, 263), (64, 511)]  # from 256 columns
FEW_LEAN_FORWARD_CASES = [(in_dtype, out_dtype, rows, n) for in_dtype, out_dtype in LEAN_DTYPES
                          for rows, n in FEW_LEAN_FORWARD_SHAPES] + [
    (dtype, None, rows, n) for dtype in (torch.float16, torch.bfloat16) for rows, n in FEW_LEAN_FORWARD_16BIT_RESULT_SHAPES]


@pytest.mark.parametrize("op", list(OPS))
@pytest.mark.parametrize("in_dtype,out_dtype,rows,n", FEW_LEAN_FORWARD_CASES,
                         ids=[forward_case_id(*case) for case in FEW_LEAN_FORWARD_CASES])
def test_few_forward_rows_on_a_lean_cta_per_row(rows, n, in_dtype, out_dtype, op):
    per_thread = 8 if in_dtype == torch.float32 and n // 4 > 1024 else 2  # the float form beyond 1024 packs
    check_lean_rows((sm_count() - 1 if rows is None else rows, n), in_dtype, out_dtype, op, per_thread)


def check_lean_rows(shape, in_dtype, out_dtype, op, per_thread) -> None:
    """`shape` runs the lean instance at `per_thread` packs per thread (explain); random rows give finite results
    within the accuracy bound, and special_rows in front (a NaN in the first) theirs."""
    line = softmax_ops.explain(shape, in_dtype, op=op, out_dtype=out_dtype)
    assert "lean instance" in line and f"{per_thread} pack(s) per thread" in line, line
    assert torch.isfinite(check_forward(op, make_input(shape, in_dtype, seed=shape[1]), -1, out_dtype)).all()
    out = check_forward(op, special_rows_in_front(shape, in_dtype), -1, out_dtype)
    assert torch.isnan(out[0]).all()  # a NaN in the row


# Many float32 rows of 512-1024 columns whose two-pack CTAs fit in one wave (lean_rows, kLeanOneWaveFloatMinPacks;
# session 39): 128 and 256 packs, padding (1000), one whole wave of 128-thread CTAs (16 per SM); one row more than
# that wave: the float form, 8 packs in CTAs of one warp.
@pytest.mark.parametrize("op", list(OPS))
@pytest.mark.parametrize("rows,n", [(1000, 1000), (2048, 1024), (None, 1024), (600, 512), (200, 772)])
def test_float32_rows_of_one_wave_on_the_lean_two_pack_form(rows, n, op):
    check_lean_rows((16 * sm_count() if rows is None else rows, n), torch.float32, None, op, 2)


@pytest.mark.parametrize("op", list(OPS))
def test_float32_rows_of_1024_columns_over_a_wave_on_the_float_form(op):
    check_lean_rows((16 * sm_count() + 1, 1024), torch.float32, None, op, 8)


# Many 16-bit rows of 64-255 packs (512-2040 columns) with a 16-bit result whose one-pack CTAs fit in one wave: the
# lean one-pack form, a CTA per row of one pack per thread (lean_rows, kLeanOnePackMinPacks; session 46). Rows as
# (CTAs per SM, extra rows) are that many waves' worth on this device: 128 packs in CTAs of 128 threads, 16 per SM
# (a whole wave, then one row more: the warp kernel); 64 packs in CTAs of 64 threads, 32 per SM; 125 packs (1000
# columns) leave the last warp's 3 threads padding; 97 packs (776 columns), 255 packs (2040 columns).
ONE_PACK_WAVE_CASES = [(2048, 1024, True), ((16, 0), 1024, True), ((16, 1), 1024, False), ((32, 0), 512, True),
                       ((32, 1), 512, False), (1000, 1000, True), (600, 776, True), (1000, 2040, True)]


@pytest.mark.parametrize("op", list(OPS))
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("rows,n,one_pack", ONE_PACK_WAVE_CASES)
def test_16_bit_rows_of_one_wave_on_the_lean_one_pack_form(rows, n, one_pack, dtype, op):
    if isinstance(rows, tuple):
        per_sm, extra = rows
        rows = per_sm * sm_count() + extra
    if one_pack:
        check_lean_rows((rows, n), dtype, None, op, 1)
    else:
        assert "kernel warp: " in softmax_ops.explain((rows, n), dtype, op=op)
        check_forward(op, make_input((rows, n), dtype, seed=n))


# Rows whose largest probability is near 1 (one logit 6 above the rest's max, or the float32 2 x 263 input of session
# 39 call 4, largest probability 0.989): the output there is about 1 / sum, so the float32 roundings of the sum show
# undiluted. Call 4 measured 2.5e-7 on 2 x 263 through the lean two-pack form, over the bound (twice torch's 1e-8 plus
# 2e-7); float32 results of rows under 512 columns run the warp kernel since (2 x 263, 64 x 256, 4 x 300 here). Float32
# results on every lean form: few rows (512-8192 columns), one wave (300 x 1000), many float32 rows on the float form
# (2000 x 2048), many 16-bit rows with a float32 result on the two-pack and the wide forms (1000 x 4096, 1000 x 8192).
DOMINANT_CASES = [(torch.float32, None, shape) for shape in [(2, 512), (2, 1000), (4, 4096), (3, 4103), (2, 8192),
                                                             (300, 1000), (2, 263), (64, 256), (2000, 2048)]] + [
    (dtype, torch.float32, shape) for dtype in (torch.float16, torch.bfloat16)
    for shape in [(4, 300), (2, 512), (4, 4096), (2, 8192), (1000, 4096), (1000, 8192)]]


@pytest.mark.parametrize("op", list(OPS))
@pytest.mark.parametrize("in_dtype,out_dtype,shape", DOMINANT_CASES,
                         ids=[forward_case_id(i, o, *shape) for i, o, shape in DOMINANT_CASES])
def test_float32_results_of_rows_with_a_dominant_element(shape, in_dtype, out_dtype, op):
    x = make_input(shape, torch.float64, seed=shape[1], device="cpu")
    if shape != (2, 263):  # session 39's failing input as it was
        x[:, 7] = x.amax(dim=1) + 6.0
    check_forward(op, x.to(in_dtype).cuda(), -1, out_dtype)


@pytest.mark.parametrize("backward", [False, True])
def test_forced_grid_onepass_refuses_more_rows_than_resident_ctas(backward):
    """A grid group needs every CTA resident at once and at least 2 per row: 2 x SMs rows cannot be split."""
    x = make_input((2 * sm_count(), 4096), torch.float32)
    family = BACKWARD_FAMILY if backward else FORWARD_FAMILY
    with softmax_ops.force_kernel(family, "grid_onepass"), pytest.raises(RuntimeError, match="cannot run"):
        if backward:
            torch.ops.softmax_ops.softmax_backward(x, x, -1, x.dtype)
        else:
            softmax_ops.softmax(x, -1)


def test_explain_reports_forced_kernel_and_its_limits():
    with softmax_ops.force_kernel(FORWARD_FAMILY, "two_pass"):
        assert "kernel two_pass:" in softmax_ops.explain((64, 1000), torch.float32)
    with softmax_ops.force_kernel(FORWARD_FAMILY, "warp"):
        assert "cannot run" in softmax_ops.explain((4, 1 << 20), torch.float32)


# ------------------------------------------------------------------------------------ 48 KB, fresh process

# Plans with exactly 48 KB of dynamic shared memory (H100 / H200): with the kernels' static buffers they need the
# opt-in (launch_utils.h allow_dynamic_smem), which until session 44 was skipped up to 48 KB, so in a process that
# had not yet run the same instance above 48 KB the occupancy query refused such a plan (a different plan ran:
# 16-bit 64 x 151936 at 3 CTAs per row, 17% slower) or its launch failed. Each case is the first of its instance in
# a fresh process. (op, shape, dtype).
FRESH_PROCESS_48_KB_CASES = [
    ("softmax", (64, 151936), torch.float16),
    ("log_softmax", (64, 151935), torch.bfloat16),
    ("softmax", (4, 114688), torch.float64),
    ("log_softmax", (3, 100003), torch.float64),
    ("softmax_backward", (2048, 4096), torch.float64),
    ("log_softmax_backward", (133, 4097), torch.float64),
    ("softmax_backward", (4, 65536), torch.float64),
    ("log_softmax_backward", (4, 262144), torch.float64),
    ("softmax_backward", (1, 50257), torch.float64),
]

FRESH_PROCESS_SCRIPT = """
import sys
import torch
sys.path.insert(0, sys.argv[1])
from conftest import assert_within_2x_torch
import softmax_ops
failures = 0
for op, shape, dtype_name in eval(sys.argv[2]):
    dtype = getattr(torch, dtype_name)
    torch.manual_seed(0)
    x = (torch.randn(shape, dtype=torch.float64) * 3).to(dtype).cuda()
    line = next(l for l in softmax_ops.explain(shape, dtype, op=op).splitlines() if "kernel " in l)
    try:
        if op.endswith("_backward"):
            forward = getattr(torch, op[: -len("_backward")])
            out = forward(x, -1)
            grad = torch.randn(shape, dtype=torch.float64).to(dtype).cuda()
            ours = getattr(torch.ops.softmax_ops, op)(grad, out, -1, dtype)
            aten = torch._softmax_backward_data if op == "softmax_backward" else torch._log_softmax_backward_data
            own = aten(grad, out, -1, dtype)
            ref = aten(grad.double().cpu(), out.double().cpu(), -1, torch.float64)
        else:
            ours = getattr(softmax_ops, op)(x, -1)
            own = getattr(torch, op)(x, -1)
            ref = getattr(torch, op)(x.double().cpu(), -1)
        torch.cuda.synchronize()
        assert_within_2x_torch(ours, own, ref)
        print("ok", op, shape, dtype_name, line.strip())
    except Exception as error:
        failures += 1
        print("FAILED", op, shape, dtype_name, line.strip(), type(error).__name__, str(error).splitlines()[0])
sys.exit(min(failures, 100))
"""


def test_plans_at_48_kb_of_dynamic_shared_memory_in_a_fresh_process():
    import subprocess
    import sys

    cases = [(op, shape, str(dtype).removeprefix("torch.")) for op, shape, dtype in FRESH_PROCESS_48_KB_CASES]
    tests_dir = os.path.dirname(os.path.abspath(__file__))
    result = subprocess.run([sys.executable, "-c", FRESH_PROCESS_SCRIPT, tests_dir, repr(cases)], check=False,
                            capture_output=True, text=True, timeout=600)
    report = result.stdout + result.stderr[-3000:]
    assert result.returncode == 0, report
    lines = [line for line in result.stdout.splitlines() if line.startswith("ok ")]
    assert len(lines) == len(cases), report
    if torch.cuda.get_device_properties(0).multi_processor_count == 132:  # H100 / H200: the plans named above
        assert all("(48 KB dynamic)" in line for line in lines), report


# ------------------------------------------------------------------------------------ determinism, graphs

DETERMINISM_CASES = [
    ("warp", (1000, 1000)),
    ("block_onepass", (64, 30000)),
    ("block_onepass", (64, 30001)),  # peeled
    ("cluster_onepass", (3, 100003)),  # peeled
    ("grid_onepass", (3, 100003)),
    ("grid_onepass", (4, 1 << 20)),
    ("grid_onepass", (3, 5_000_000)),  # streams the rest of each chunk
    ("two_pass", (8, 200000)),
    ("two_pass", (8, 200001)),  # peeled
    ("split_row", (3, 1 << 21)),
    ("strided", (64, 512, 33)),
    (None, (8, 16383)),  # the automatic plans: the float32 backward peeled at 1 register pack (a cluster of 16)
]


def forced_everywhere(kernel):
    """Both families forced to `kernel`, or the automatic plans for None."""
    if kernel is None:
        return contextlib.nullcontext()
    stack = contextlib.ExitStack()
    stack.enter_context(softmax_ops.force_kernel(FORWARD_FAMILY, kernel))
    stack.enter_context(softmax_ops.force_kernel(BACKWARD_FAMILY, kernel))
    return stack


@pytest.mark.parametrize("kernel,shape", DETERMINISM_CASES)
def test_bitwise_deterministic(kernel, shape):
    x = make_input(shape, torch.float32, seed=13)
    grad = make_input(shape, torch.float32, seed=14, scale=1.0)
    dim = 1
    with forced_everywhere(kernel):
        first = softmax_ops.softmax(x, dim)
        first_log = softmax_ops.log_softmax(x, dim)
        first_grad = torch.ops.softmax_ops.softmax_backward(grad, first, dim, x.dtype)
        for _ in range(3):
            assert torch.equal(softmax_ops.softmax(x, dim), first)
            assert torch.equal(softmax_ops.log_softmax(x, dim), first_log)
            assert torch.equal(torch.ops.softmax_ops.softmax_backward(grad, first, dim, x.dtype), first_grad)


@pytest.mark.parametrize(
    "kernel,shape",
    [
        (None, (512, 1000)),
        (None, (300, 4095)),  # peeled
        (None, (3, 100003)),  # few peeled rows at 2 register packs (a cluster of 16)
        ("split_row", (3, 300000)),
        ("cluster_onepass", (4, 262144)),
        ("grid_onepass", (4, 262144)),
        ("grid_onepass", (2, 1 << 24)),  # streams the rest of each chunk
        ("strided", (8, 100, 33)),
    ],
)
def test_cuda_graph_capture_and_replay(kernel, shape):
    """No host sync and no allocation outside the caching allocator: capture, then replay on new data."""
    static_x = make_input(shape, torch.float16, seed=15)
    dim = 1
    with softmax_ops.force_kernel(FORWARD_FAMILY, kernel) if kernel else contextlib.nullcontext():
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            softmax_ops.softmax(static_x, dim)  # warm-up outside capture (one-time function attributes)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static_out = softmax_ops.softmax(static_x, dim)
        for seed in (16, 17):  # twice: nothing the first replay leaves behind may change the second
            static_x.copy_(make_input(shape, torch.float16, seed=seed))
            graph.replay()
            torch.cuda.synchronize()
            assert torch.equal(static_out, softmax_ops.softmax(static_x, dim))
            assert_within_2x_torch(
                static_out, torch.softmax(static_x, dim), reference("softmax", static_x, dim, None)
            )


# ------------------------------------------------------------------------------------ opcheck


def opcheck_samples():
    samples = []
    for shape, dim in [((8, 100), -1), ((4, 5000), 1), ((3, 5, 7), 1), ((2, 70000), -1)]:
        x = make_input(shape, torch.float32, seed=17)
        half = x.half()
        samples += [
            (torch.ops.softmax_ops.softmax.default, (x, dim, None)),
            (torch.ops.softmax_ops.log_softmax.default, (half, dim, torch.float32)),
            (
                torch.ops.softmax_ops.softmax_backward.default,
                (torch.randn_like(x), torch.softmax(x, dim), dim, x.dtype),
            ),
            (
                torch.ops.softmax_ops.log_softmax_backward.default,
                (torch.randn_like(x), torch.log_softmax(half, dim, dtype=torch.float32), dim, torch.float16),
            ),
        ]
    return samples


def test_opcheck_cuda_samples():
    for op, args in opcheck_samples():
        torch.library.opcheck(op, args)


# ------------------------------------------------------------------------------------ > 2^31 elements

BIG = pytest.mark.skipif(
    os.environ.get("SOFTMAX_OPS_BIG_TESTS") != "1",
    reason="set SOFTMAX_OPS_BIG_TESTS=1 (needs ~40 GB of GPU memory)",
)


@BIG
@pytest.mark.parametrize(
    "shape,kernel",
    [
        ((65537, 32768), None),
        ((2, (1 << 30) + 8), None),
        ((2, (1 << 30) + 8), "two_pass"),
        ((65537, 32768), "strided"),
    ],
)
def test_more_than_2_pow_31_elements(shape, kernel):
    """64-bit offsets: the last row starts beyond element 2^31; checked on the tail of the last row.
    float16 input, float32 output (values ~1e-9 would underflow in float16)."""
    x = torch.randn(shape, device="cuda", dtype=torch.float16) * 3
    assert x.numel() > 2**31
    with softmax_ops.force_kernel(FORWARD_FAMILY, kernel) if kernel else contextlib.nullcontext():
        if kernel == "strided":  # the same rows stored column-major: reduce over dim 0, inner = rows
            out = softmax_ops.softmax(x.t().contiguous(), 0, dtype=torch.float32).t()
        else:
            out = softmax_ops.softmax(x, 1, dtype=torch.float32)
    last = x[-1]
    tail = slice(shape[1] - (1 << 16), shape[1])
    ref = torch.softmax(last.double(), 0)[tail]
    assert_within_2x_torch(out[-1, tail], torch.softmax(last, 0, dtype=torch.float32)[tail], ref)
    assert abs(out[-1].double().sum().item() - 1.0) < 1e-3  # a lost or doubled chunk would be >= 1e-2


@BIG
@pytest.mark.parametrize("op", list(OPS))
def test_more_than_2_pow_31_elements_in_short_16_bit_rows(op):
    """The warp kernel's one-pack-per-lane plan (16-bit rows of 64 columns, same dtype; since session 41) over
    2^25 + 1 rows: the last rows start beyond element 2^31, past the grid-stride loop's first passes."""
    x = torch.randn(((1 << 25) + 1, 64), device="cuda", dtype=torch.float16) * 3
    assert x.numel() > 2**31
    assert "8 lane(s) per row, 1 pack(s) per lane" in softmax_ops.explain(tuple(x.shape), x.dtype, op=op)
    out = getattr(softmax_ops, op)(x, 1)
    tail = x[-1024:]
    assert_within_2x_torch(out[-1024:], OPS[op](tail, 1), reference(op, tail, 1, None))
