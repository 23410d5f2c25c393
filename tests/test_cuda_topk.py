"""CUDA fused_topk / fused_topk_backward: every kernel of the menu forced across its size boundaries, every
dtype, special values, ties, layouts, autograd, opcheck, CUDA graphs, determinism and the dispatcher.

Expected values come from an independent float64 reference on the CPU: a stable descending sort of the
(cast) logits, NaN first and ties to the lower index, and torch.softmax gathered at those indices.
"""

from __future__ import annotations

import re

import pytest
import torch
from conftest import FLOAT_DTYPES, assert_within_2x_torch, requires_cuda, topk_reference, vec16

import softmax_ops

# The kernel menu exists in every build with CUDA sources (explain needs no GPU); a CPU-only build has none.
requires_topk_menu = pytest.mark.skipif(not softmax_ops.list_kernels("topk"), reason="CPU-only build")

TOPK_KERNELS = ["warp", "block", "split_row", "radix", "rows", "split_hist"]
BACKWARD_KERNELS = ["block", "split"]

# Row lengths at and around each kernel's boundaries (and real expert counts: 60, 160, 384). The warp
# kernel holds 32 values per lane (16 for float64), 1..32 lanes per row; block/split_row read tiles of 4096
# elements (split_row chunks are whole ones) and refresh their floor in ranges of >= 8 tiles; 16-bit rows of
# >= 3 x 8192 elements on few rows read tiles of 8192 (TopkPlan::long_tiles: the forced block cases of 28672 and
# 32768 below, test_split_row_chunks_of_several_long_tiles and its neighbours);
# radix splits rows into chunks.
WARP_NS = [2, 7, 31, 32, 33, 60, 64, 100, 128, 160, 384, 512, 513, 1000, 1024]
WARP_MAX_N = {torch.float64: 512}  # default 1024
BLOCK_NS = [1, 7, 100, 1000, 1025, 4095, 4096, 4097, 8193, 28672, 32768]
SPLIT_NS = [100, 4097, 8192, 12289, 20000]
RADIX_NS = [1, 7, 100, 1025, 4097, 20000]
SPLIT_HIST_NS = [1, 100, 4095, 4096, 4097, 8192, 12289, 20000]
# rows: 1-16 threads per row of up to 32 values each (a vector is 8 values for 16-bit dtypes, 4 for float32),
# k <= 8, no float64.
ROWS_NS = [1, 2, 7, 8, 9, 31, 32, 33, 60, 64, 100, 128, 160, 256, 257, 384, 511, 512]
NS_BY_KERNEL = {
    "warp": WARP_NS,
    "block": BLOCK_NS,
    "split_row": SPLIT_NS,
    "radix": RADIX_NS,
    "rows": ROWS_NS,
    "split_hist": SPLIT_HIST_NS,
}
# Rows per test: the warp kernel packs several rows per warp and several warps per CTA (odd counts leave
# partial warps); the CTA-per-row kernels need fewer.
ROWS_BY_KERNEL = {"warp": 37, "block": 3, "split_row": 3, "radix": 3, "rows": 37, "split_hist": 3}
K_KINDS = ["1", "2", "small", "large", "N"]

GRADCHECK_CASES = [((3, 7), 3, -1), ((2, 5, 3), 2, 1), ((4, 6), 6, -1), ((2, 40), 5, -1), ((1, 70), 70, -1)]
BACKWARD_CASES = [((8, 96), 5, -1), ((5, 60), 4, -1), ((3, 5000), 50, -1), ((4, 33, 3), 6, 1)]


def k_for(kind: str, n: int, kernel: str) -> int:
    """k of a given kind for a row of n (at most n): 1, 2, a router-like k, a large k, or k == N."""
    large = {"warp": 64, "rows": 8}.get(kernel, 700)
    return min(n, {"1": 1, "2": 2, "small": 6, "large": large, "N": n}[kind])


def n_supported(kernel: str, n: int, k: int, dtype: torch.dtype) -> bool:
    """The documented limits of a forced kernel (topk_launch.h): the warp kernel's registers, the
    candidate buffer's shared memory (k + 6144 candidates, or the next power of two, of 8 B; 16 B for
    float64; 227 KB per block on Hopper)."""
    if kernel == "warp":
        return n <= WARP_MAX_N.get(dtype, 1024)
    if kernel == "rows":
        return dtype != torch.float64 and n <= 512 and k <= 8
    if kernel in ("block", "split_row", "split_hist"):
        capacity = max(1 << (k - 1).bit_length(), k + 4096 + 2048)
        return capacity * (16 if dtype == torch.float64 else 8) + 2048 <= 227 * 1024
    return True


def distinct_rows(rows: int, n: int, dtype: torch.dtype, seed: int = 0, device: str = "cuda") -> torch.Tensor:
    """Each row a random permutation of an even grid over [-4, 4): distinct values in float32/float64 (half
    dtypes may round neighbours together for large n; the stable-sort reference resolves such ties exactly
    as the contract does)."""
    generator = torch.Generator().manual_seed(seed)
    grid = torch.arange(n, dtype=torch.float64) * (8.0 / max(n, 1)) - 4.0
    x = torch.stack([grid[torch.randperm(n, generator=generator)] for _ in range(rows)])
    return x.to(dtype).to(device)


def separated_rows(rows: int, n: int, k: int, dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    """Rows whose k + 1 largest logits are distinct and exact in every dtype (4.25, 4.5, ...) at random
    positions, the rest below 4: no tie can straddle the top-k boundary, so any correct implementation
    selects the same positions (gradients then compare position by position)."""
    x = distinct_rows(rows, n, torch.float64, seed=seed, device="cpu")
    generator = torch.Generator().manual_seed(seed + 1)
    top = min(k + 1, n)
    for row in x:
        row[torch.randperm(n, generator=generator)[:top]] = 4.25 + 0.25 * torch.randperm(
            top, generator=generator, dtype=torch.float64
        )
    return x.to(dtype).cuda()


def torch_topk(x: torch.Tensor, k: int, dim: int, renormalize: bool, dtype: torch.dtype | None = None):
    """What eager torch computes (same device, same dtype): the "torch's own error" side of the bound."""
    values = torch.topk(torch.softmax(x, dim, dtype=dtype), k, dim).values
    return values / values.sum(dim, keepdim=True) if renormalize else values


def misaligned(x: torch.Tensor) -> torch.Tensor:
    """A contiguous copy of x whose data pointer is one element past a 16-byte boundary."""
    flat = torch.empty(x.numel() + 1, dtype=x.dtype, device=x.device)[1:]
    return flat.view(x.shape).copy_(x)


def assert_valid_indices(indices: torch.Tensor, n: int) -> None:
    rows = indices.reshape(-1, indices.shape[-1]).cpu()
    assert bool(((rows >= 0) & (rows < n)).all()), "index out of range"
    for row in rows.tolist():
        assert len(set(row)) == len(row), f"duplicate indices in {row}"


def check_topk(x, k, dim, renormalize, dtype=None):
    assert x.is_cuda, "a CPU input would test the CPU implementation, not the kernel"
    values, indices = softmax_ops.fused_topk(x, k, dim, renormalize, dtype)
    ref_values, ref_indices = topk_reference(x, k, dim, renormalize, dtype)
    assert values.dtype == (dtype or x.dtype) and indices.dtype == torch.int64
    assert values.is_contiguous() and indices.is_contiguous()
    assert torch.equal(indices.cpu(), ref_indices)
    assert_within_2x_torch(values, torch_topk(x, k, dim, renormalize, dtype), ref_values)
    return values, indices


FORCED_CASES = [
    (kernel, n, kind) for kernel in TOPK_KERNELS for n in NS_BY_KERNEL[kernel] for kind in K_KINDS
]


@requires_cuda
@pytest.mark.parametrize("renormalize", [False, True])
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("kernel,n,k_kind", FORCED_CASES)
def test_forced_kernel_matches_reference(kernel, n, k_kind, dtype, renormalize):
    k = k_for(k_kind, n, kernel)
    if not n_supported(kernel, n, k, dtype):
        pytest.skip(
            "outside this kernel's documented limits (see test_forced_kernel_on_impossible_shape_raises)"
        )
    x = distinct_rows(ROWS_BY_KERNEL[kernel], n, dtype, seed=n + k)
    with softmax_ops.force_kernel("topk", kernel):
        check_topk(x, k, -1, renormalize)


@requires_cuda
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("kernel", TOPK_KERNELS)
def test_forced_kernel_misaligned_rows(kernel, dtype):
    """Rows whose start is not 16-byte aligned (and odd lengths) take the scalar-load path."""
    for n, k in [(64, 6), (160, 8), (1001, 50), (4100, 20)]:
        if not n_supported(kernel, n, k, dtype):
            continue
        x = misaligned(distinct_rows(5, n, dtype, seed=n))
        assert x.data_ptr() % 16 != 0
        with softmax_ops.force_kernel("topk", kernel):
            check_topk(x, k, -1, renormalize=n % 2 == 0)


@requires_cuda
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("kernel", TOPK_KERNELS)
def test_forced_kernel_ties_go_to_lower_index(kernel, dtype):
    """Few distinct values: long runs of equal logits, across lanes, tiles, chunks and radix digits."""
    generator = torch.Generator().manual_seed(3)
    for n, k in [(5, 3), (64, 8), (160, 40), (1000, 300), (9000, 50)]:
        if not n_supported(kernel, n, k, dtype):
            continue
        x = torch.randint(0, 4, (4, n), generator=generator).to(dtype).cuda()
        x[1] = 0.0  # an all-equal row
        x[2, ::3] = -0.0  # -0 ties with +0
        with softmax_ops.force_kernel("topk", kernel):
            check_topk(x, k, -1, renormalize=False)


# Peeled rows (block and split_row, 16- and 32-bit inputs; topk_chunk.cuh): rows that are not whole 16-byte
# vectors, or start off one, read each row's body from its first 16-byte boundary in vector tiles and the < 2 V
# elements around it (V = 16 bytes / element) one per thread. Lengths at and around the boundaries: 2 V - 2
# (too short: scalar loads), 2 V - 1 (the shortest peeled row), one tile (4096) + 2 V - 1, and two chunks of
# forced split_row (8192 elements on these shapes: explain says so) + 2 (V - 1), where split_row launches one
# chunk fewer than an aligned row would need (peeled_split_count) and the last chunk of a row at phase 0 runs
# V values past its 8192; then real vocabularies.
PEEL_DTYPES = [torch.float16, torch.bfloat16, torch.float32]


def peel_lengths(dtype: torch.dtype) -> list[int]:
    v = vec16(dtype)
    return [2 * v - 2, 2 * v - 1, 2 * v + 1, 4095, 4096 + 2 * v - 1, 2 * 8192 + 2 * (v - 1), 12289, 50257]


@requires_cuda
@pytest.mark.parametrize("dtype", PEEL_DTYPES)
@pytest.mark.parametrize("kernel", ["block", "split_row"])
def test_peeled_rows_forced(kernel, dtype):
    """2 V + 1 contiguous rows of each length (their starts fall at different element phases) and the same rows
    one element off a 16-byte boundary: indices exact, values within twice torch's error, k from 1 to N."""
    for n in peel_lengths(dtype):
        x = distinct_rows(2 * vec16(dtype) + 1, n, dtype, seed=n)
        assert (n * x.element_size()) % 16 != 0
        for k in sorted({1, min(50, n), n}):
            if not n_supported(kernel, n, k, dtype):
                continue
            with softmax_ops.force_kernel("topk", kernel):
                check_topk(x, k, -1, renormalize=k % 2 == 0)
                check_topk(misaligned(x), k, -1, renormalize=k % 2 == 1)


def edge_heavy_rows(rows: int, n: int, v: int) -> torch.Tensor:
    """float64 rows whose largest values sit in the first and last v columns (a row's head and tail whatever its
    phase), with ties across the edges: column 0 ties a body column (column 0 must win), column n - 1 ties a body
    column (the body's must win), and the two edges tie each other."""
    x = distinct_rows(rows, n, torch.float64, seed=n + v, device="cpu")
    for j in range(v):
        x[:, j] = 5.0 + j / 8
        x[:, n - 1 - j] = 5.0 + j / 8 + 1 / 16
    x[:, 0] = x[:, n // 3] = 7.0
    x[:, n - 1] = x[:, n // 2] = 6.5
    x[:, 1] = x[:, n - 2] = 6.0
    return x


@requires_cuda
@pytest.mark.parametrize("dtype", PEEL_DTYPES)
@pytest.mark.parametrize("kernel", ["block", "split_row"])
def test_peeled_rows_edges_hold_the_top_values(kernel, dtype):
    """The top values and their ties in the edges that peeled rows read singly (edge_heavy_rows), and special
    values there: NaN in the head, NaN and +inf in the tail, -inf filling the edges (indices distinct, in range,
    in the reference order)."""
    v = vec16(dtype)
    for n in (4096 + 2 * v - 1, 2 * 8192 + 2 * (v - 1), 50257):
        rows = 2 * v + 1
        x = edge_heavy_rows(rows, n, v).to(dtype).cuda()
        with softmax_ops.force_kernel("topk", kernel):
            for k in (1, 3, 2 * v + 4):
                check_topk(x, k, -1, renormalize=False)
        special = edge_heavy_rows(4, n, v)
        special[0, 1] = float("nan")
        special[1, n - 2] = float("nan")
        special[2, n - 1] = float("inf")
        special[3, :v] = float("-inf")
        special[3, -v:] = float("-inf")
        special = special.to(dtype).cuda()
        for layout in (special, misaligned(special)):
            for k in (1, 2 * v + 4):
                check_reference_order(layout, k, kernel, renormalize=True)


@requires_cuda
@pytest.mark.parametrize("dtype", PEEL_DTYPES)
@pytest.mark.parametrize("kernel", ["block", "split_row"])
def test_peeled_rows_tail_tie_after_a_compaction(kernel, dtype):
    """A tail value that is the k-th best when the buffer is compacted, tied by a later body value (lower index,
    so it ranks above): the body's must win. Rows of ones (the first tile floods the buffer, which is compacted
    before the second) with two 9s in front and an 8 in the second tile and in the last column (the tail): with
    k = 3 a compaction that already held the tail took 8 as its threshold, and the filter then rejected the body's
    8 as ranking below it. The tie sits in the CTA that holds the edges (split_row's first 8192-element chunk)."""
    v = vec16(dtype)
    n = 12 * 4096 + 2 * v + 1  # rows in every phase of the 16-byte vector: every head and tail length
    # In the body's second tile whatever the head's length: split_row's 8192-element chunks here read 4096-element
    # tiles; the block kernel reads 16-bit rows this long on this few rows in long tiles (8192).
    long_tiles = kernel == "block" and dtype in (torch.float16, torch.bfloat16)
    tie_column = (8192 if long_tiles else 4096) + 100
    x = torch.ones(2 * v + 1, n, dtype=torch.float64)
    x[:, 10] = x[:, 11] = 9.0
    x[:, tie_column] = x[:, -1] = 8.0
    x = x.to(dtype).cuda()
    with softmax_ops.force_kernel("topk", kernel):
        for layout in (x, misaligned(x)):
            _, indices = check_topk(layout, 3, -1, renormalize=False)
            assert indices.cpu().tolist() == [[10, 11, tie_column]] * x.shape[0]
            check_topk(layout, 4, -1, renormalize=True)


@requires_cuda
@pytest.mark.parametrize("dtype", PEEL_DTYPES)
def test_automatic_plans_on_vocabulary_rows_that_peel(dtype):
    """The dispatcher's own plans on GPT-2's 50257 and a 151935-word vocabulary, and 100003 columns, whose rows peel:
    block for many rows and, at 16 bits, from 0.06 rows per SM for rows of up to 13-16 long tiles (block_long_min_
    rows_per_100_sms), split_row for fewer or longer rows; and Llama 2's 32000 words on 16 rows."""
    for rows, n, k in ((64, 50257, 50), (3, 151935, 50), (5, 50257, 1024), (30, 100003, 64), (16, 32000, 50)):
        x = (torch.randn(rows, n, generator=torch.Generator().manual_seed(n + k), dtype=torch.float64) * 3).to(dtype)
        check_topk(x.cuda(), k, -1, renormalize=False)


SPECIAL_ROWS = ["nan", "all_nan", "pos_inf", "all_neg_inf", "some_neg_inf", "nan_and_neg_inf"]


def special_row(kind: str, n: int, generator: torch.Generator) -> torch.Tensor:
    row = torch.randn(n, generator=generator, dtype=torch.float64) * 3
    where = torch.randperm(n, generator=generator)[: max(1, n // 7)]
    if kind == "nan":
        row[where] = float("nan")
    elif kind == "all_nan":
        row[:] = float("nan")
    elif kind == "pos_inf":
        row[where] = float("inf")
    elif kind == "all_neg_inf":
        row[:] = float("-inf")
    elif kind == "some_neg_inf":
        row[where] = float("-inf")
    else:
        row[:] = float("-inf")
        row[where[:1]] = float("nan")
    return row


def check_reference_order(x, k, kernel, renormalize):
    """fused_topk with `kernel` forced, on rows with special values: indices distinct, in range and in the
    reference order, NaN exactly where the reference has NaN. Returns (values, reference values)."""
    assert x.is_cuda, "a CPU input would test the CPU implementation, not the kernel"
    with softmax_ops.force_kernel("topk", kernel):
        values, indices = softmax_ops.fused_topk(x, k, -1, renormalize)
    ref_values, ref_indices = topk_reference(x, k, -1, renormalize)
    assert_valid_indices(indices, x.shape[-1])
    assert torch.equal(indices.cpu(), ref_indices)
    assert torch.equal(torch.isnan(values.cpu()), torch.isnan(ref_values))
    return values, ref_values


def check_reference_order_and_values(x, k, kernel, renormalize, atol):
    """check_reference_order, and the values that are not NaN within atol of the reference's."""
    values, ref_values = check_reference_order(x, k, kernel, renormalize)
    finite = ~torch.isnan(ref_values)
    assert torch.allclose(values.cpu().double()[finite], ref_values[finite], atol=atol)


@requires_cuda
@pytest.mark.parametrize("renormalize", [False, True])
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("kernel", TOPK_KERNELS)
def test_forced_kernel_special_values(kernel, dtype, renormalize):
    """NaN / +inf / all -inf rows: all-NaN values like torch; indices distinct, in range, in the reference
    order (NaN first, ties to the lower index); -inf entries give 0."""
    generator = torch.Generator().manual_seed(5)
    for n in [5, 100, 5000]:
        if not n_supported(kernel, n, n, dtype) and not n_supported(kernel, n, 3, dtype):
            continue
        x = torch.stack([special_row(kind, n, generator) for kind in SPECIAL_ROWS]).to(dtype).cuda()
        for k in sorted({1, 3, min(n, 64), n}):
            if not n_supported(kernel, n, k, dtype):
                continue
            tolerance = 1e-2 if dtype in (torch.float16, torch.bfloat16) else 1e-5
            check_reference_order_and_values(x, k, kernel, renormalize, tolerance)


DTYPE_PAIRS = [
    (torch.float16, torch.float32),
    (torch.bfloat16, torch.float32),
    (torch.float32, torch.float16),
    (torch.float32, torch.float64),
    (torch.float64, torch.float32),
]


@requires_cuda
@pytest.mark.parametrize("in_dtype,out_dtype", DTYPE_PAIRS)
@pytest.mark.parametrize("kernel", TOPK_KERNELS)
def test_forced_kernel_dtype_argument(kernel, in_dtype, out_dtype):
    for n, k in [(160, 6), (5000, 50)]:
        if not n_supported(kernel, n, k, in_dtype) or not n_supported(kernel, n, k, out_dtype):
            continue
        x = distinct_rows(4, n, in_dtype, seed=11)
        with softmax_ops.force_kernel("topk", kernel):
            check_topk(x, k, -1, renormalize=True, dtype=out_dtype)


@requires_cuda
@pytest.mark.parametrize("kernel", TOPK_KERNELS)
def test_forced_kernel_layouts(kernel):
    """dim != -1 (moved last with a copy), transposed and strided inputs, 0-d and empty tensors."""
    base = distinct_rows(12, 300, torch.float32, seed=8)
    with softmax_ops.force_kernel("topk", kernel):
        for x, dim in [
            (base.t(), 0),
            (base[:, 1:], -1),
            (base[::3], 1),
            (base.view(3, 4, 300).transpose(0, 1), 2),
        ]:
            check_topk(x, 7, dim, renormalize=True)
        x3 = distinct_rows(6, 40, torch.float32, seed=9).view(2, 3, 40).transpose(1, 2).contiguous()
        check_topk(x3, 5, 1, renormalize=False)
        values, indices = softmax_ops.fused_topk(torch.tensor(0.25, device="cuda"), 1)
        assert values.dim() == 0 and values.item() == 1.0 and indices.item() == 0
        values, indices = softmax_ops.fused_topk(torch.empty(0, 9, device="cuda"), 4)
        assert values.shape == (0, 4) and indices.shape == (0, 4)


ROUTER_SHAPES = [
    ((16384, 8), 2),
    ((16384, 64), 6),
    ((16384, 128), 8),
    ((16384, 160), 6),
    ((4096, 60), 4),
    ((256, 128), 8),
    ((2048, 384), 8),
    ((1024, 512), 8),
]


@requires_cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape,k", ROUTER_SHAPES)
def test_router_shapes_automatic_choice(shape, k, dtype):
    """The sweep's router shapes with the dispatcher's choice, read as bf16 with dtype=float32 too."""
    x = (torch.randn(shape, generator=torch.Generator().manual_seed(1)) * 3).to(dtype).cuda()
    out_dtype = torch.float32 if dtype == torch.bfloat16 else None
    values, indices = softmax_ops.fused_topk(x, k, -1, True, out_dtype)
    ref_values, _ = topk_reference(x, k, -1, True, out_dtype)
    assert_valid_indices(indices[:64], shape[1])
    # Random bf16 logits can tie: compare the selected logits (and values) rather than positions.
    ref_logits = torch.topk(x.double().cpu(), k, -1).values
    assert torch.equal(x.double().cpu().gather(-1, indices.cpu()), ref_logits)
    assert_within_2x_torch(values, torch_topk(x, k, -1, True, out_dtype), ref_values)


@requires_cuda
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("kernel", TOPK_KERNELS)
def test_forced_kernel_subnormals_signed_zeros_and_negative_nan(kernel, dtype):
    """Subnormal logits rank by value (not as 0), -0 ties with +0 (lower index first), and a NaN with its
    sign bit set ranks like any NaN: the order of a stable descending sort of the logits, as the CPU op."""
    n = 100
    generator = torch.Generator().manual_seed(9)
    subnormal = (torch.rand(n, generator=generator, dtype=torch.float64) - 0.5) * torch.finfo(dtype).tiny
    subnormal[::10] = 0.0
    subnormal[5::10] = -0.0
    negative_nan = torch.randn(n, generator=generator, dtype=torch.float64) * 3
    negative_nan[::13] = float("nan")
    x = torch.stack([subnormal, negative_nan]).to(dtype)
    # The sign bit is set on the converted bits (a float64 -> float16 conversion may drop a NaN's sign) and
    # checked on them too (torch.signbit of a NaN on CUDA said False for these).
    bits = x.view({2: torch.int16, 4: torch.int32, 8: torch.int64}[dtype.itemsize])
    bits[1, ::13] |= torch.iinfo(bits.dtype).min
    assert bool((x[0] != 0).any()) and bool(x[1, ::13].isnan().all()) and bool((bits[1, ::13] < 0).all())
    x = x.cuda()
    for k in (1, 8, n):
        if not n_supported(kernel, n, k, dtype):
            continue
        check_reference_order(x, k, kernel, False)


@requires_cuda
def test_split_row_merge_compacts_many_chunk_candidates():
    """One long row split into enough chunks that their k best overflow the merging CTA's buffer
    ((chunks - 1) x k > capacity), so the merge compacts on the way (merge_chunk_candidates)."""
    n, k = 200_000, 400
    with softmax_ops.force_kernel("topk", "split_row"):
        text = softmax_ops.explain((1, n), torch.float32, op="fused_topk", k=k)
        chunks = int(re.search(r"\((\d+) CTAs per row", text).group(1))
        assert (chunks - 1) * k > k + 4096 + 2048, text  # candidate_capacity(k): k + a tile + slack
        x = distinct_rows(1, n, torch.float32, seed=21)
        check_topk(x, k, -1, True)
        first = softmax_ops.fused_topk(x, k, -1, False)
        again = softmax_ops.fused_topk(x, k, -1, False)
    assert torch.equal(first[0], again[0]) and torch.equal(first[1], again[1])


@requires_cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("n,k", [(1000, 8), (4096, 1), (9000, 50)])
def test_block_kernel_on_many_rows_with_special_rows_between(n, k, dtype):
    """The block kernel on more rows than its CTAs fit on the GPU at once (1200 against 528 on an H100), one
    of every 97 a special-value row among ordinary ones: rows shorter than a tile, of exactly one and of
    ragged tiles; aligned (16-byte loads) and misaligned (scalar loads). Indices exact everywhere, values
    within 2x torch's error on the ordinary rows."""
    rows = 1200
    x = distinct_rows(rows, n, torch.float64, seed=n + k, device="cpu")
    generator = torch.Generator().manual_seed(n)
    special = list(range(3, rows, 97))
    for i, r in enumerate(special):
        x[r] = special_row(SPECIAL_ROWS[i % len(SPECIAL_ROWS)], n, generator)
    x = x.to(dtype).cuda()
    ordinary = torch.ones(rows, dtype=torch.bool)
    ordinary[special] = False
    for layout in (x, misaligned(x)):
        values, ref_values = check_reference_order(layout, k, "block", False)
        assert_within_2x_torch(values[ordinary.cuda()], torch_topk(layout, k, -1, False)[ordinary.cuda()],
                               ref_values[ordinary])


@requires_cuda
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_split_hist_mass_ties_take_the_exact_fallback(dtype):
    """split_hist lists the values at or above the histogram bin of the k-th best; where that bin holds more
    values than the candidate buffer (k + 6144 for k = 50) the row's last CTA runs the block kernel's
    producer over the whole row instead. Rows 1-3 force that (a constant row, 10000 equal top values, 7000
    equal values at the k-th rank); row 0, in the same launch, takes the list."""
    n, k = 20000, 50
    generator = torch.Generator().manual_seed(31)
    x = distinct_rows(4, n, torch.float64, seed=31, device="cpu")
    x[1] = 1.5
    x[2, ::2] = 5.0
    x[3, torch.randperm(n, generator=generator)[:7000]] = 3.99  # ~16 distinct values above it
    x = x.to(dtype).cuda()
    with softmax_ops.force_kernel("topk", "split_hist"):
        for renormalize in (False, True):
            check_topk(x, k, -1, renormalize)


def long_special_rows(n: int) -> torch.Tensor:
    """float64 rows of n over many tiles that stress the chunk producer's floor and compactions: ascending
    (every tile beats the floors before it: the buffer floods and compacts), descending (the top k all in the
    first tile), NaNs only near the end, +inf only past the first (long) tile, -inf except 30 values at the end (the
    first tile's floor is -inf: no bound), and an all-equal row (every value ties with the floor)."""
    generator = torch.Generator().manual_seed(n)
    ramp = torch.linspace(-4.0, 4.0, n, dtype=torch.float64)
    nan_tail = torch.randn(n, generator=generator, dtype=torch.float64) * 3
    nan_tail[-40:-20] = float("nan")
    inf_later = torch.randn(n, generator=generator, dtype=torch.float64) * 3
    inf_later[9007:9017] = float("inf")
    mostly_neg_inf = torch.full((n,), float("-inf"), dtype=torch.float64)
    mostly_neg_inf[-30:] = torch.randn(30, generator=generator, dtype=torch.float64)
    equal = torch.full((n,), 0.5, dtype=torch.float64)
    return torch.stack([ramp, ramp.flip(0), nan_tail, inf_later, mostly_neg_inf, equal])


@requires_cuda
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("kernel", ["block", "split_row"])
def test_chunk_producer_long_special_rows(kernel, dtype):
    """long_special_rows over 20 tiles plus a ragged one (16-bit block rows: 10 long tiles, TopkPlan::long_tiles),
    aligned and one element off a 16-byte boundary (peeled): indices in the reference order (NaN first, ties to the
    lower index), NaN exactly where the reference has it, the other values close."""
    x = long_special_rows(20 * 4096 + 1000).to(dtype).cuda()
    tolerance = 1e-2 if dtype in (torch.float16, torch.bfloat16) else 1e-5
    for layout in (x, misaligned(x)):
        for k in (1, 50, 256):
            for renormalize in (False, True):
                check_reference_order_and_values(layout, k, kernel, renormalize, tolerance)


@requires_cuda
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_split_row_chunks_of_several_long_tiles(dtype):
    """split_row as the dispatcher plans it for many long rows (2 CTAs per SM over all rows: few chunks per row of
    5 long tiles for 16-bit rows, TopkPlan::long_tiles, the last one partial; float32 / float64 10 short ones):
    long_special_rows among random rows, aligned, one element off a 16-byte boundary and not a whole number of
    vectors (both peeled: tiles over each row's body; float64 reads single elements); k = 300 (no first-tile
    floor); and rows of 5 x 65536, whose chunks of 8 long tiles refresh their floor. Indices in the reference order,
    NaN where the reference has it, the other values close. (The assertions on explain() check the plan; the
    launcher runs the long-tile instances wherever a plan has long_tiles and the rows are read in vectors.)"""
    rows = 2 * sm_count() // 5  # 5 chunks per row
    n, refreshing = 200_000, 5 * 65536
    tile = 8192 if dtype in (torch.float16, torch.bfloat16) else 4096
    for length in (n, refreshing):
        text = softmax_ops.explain((rows, length), dtype, op="fused_topk", k=50)
        chunk = int(re.search(r"CTAs per row of (\d+) elements", text).group(1))
        assert "kernel 'split_row'" in text and f"in tiles of {tile}," in text, text
        assert chunk >= 4 * tile and chunk % tile == 0, text
        assert length % chunk % tile > 0 if length == n else chunk >= 8 * tile, text
    tolerance = 1e-2 if dtype in (torch.float16, torch.bfloat16) else 1e-5
    for length in (n, n + 3, refreshing):
        special = long_special_rows(length)
        noise = torch.randn(rows - len(special), length, generator=torch.Generator().manual_seed(length)) * 3
        x = torch.cat([special, noise.double()]).to(dtype).cuda()
        layouts = (x, misaligned(x)) if length == n else (x,)
        for layout in layouts:
            for k in (1, 50, 256, 300) if layout is x and length == n else (50,):
                check_reference_order_and_values(layout, k, "split_row", k == 50, tolerance)


@requires_cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_block_kernel_short_tiles_on_many_long_16_bit_rows(dtype):
    """The block kernel's 4096-element tiles on 16-bit rows long enough for long tiles, where more than 2 rows per SM
    keep them short (block_long_tile_max_rows_per_sm): the floor refreshes (>= 8 tiles) and long_special_rows'
    compactions in those instances, which the few-row tests above no longer reach."""
    rows = 2 * sm_count() + 1
    for n in (40_000, 40_003):  # aligned, and peeled
        text = softmax_ops.explain((rows, n), dtype, op="fused_topk", k=50)
        assert "kernel 'block' (one 256-thread CTA per row in tiles of 4096," in text, text
        special = long_special_rows(n)
        noise = torch.randn(rows - len(special), n, generator=torch.Generator().manual_seed(n)) * 3
        x = torch.cat([special, noise.double()]).to(dtype).cuda()
        for k in (1, 50):
            check_reference_order_and_values(x, k, "block", k == 50, 1e-2)


@requires_cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_split_row_merge_compacts_long_tile_chunk_candidates(dtype):
    """split_row's long tiles with k = 4000 (no first-tile floor: every value joins the buffer, compacted every
    tile or two) on rows whose chunks' k best overflow the merging CTA's larger buffer (k + 8192 + 2048), so the
    merge compacts on the way."""
    rows, n, k = 2 * sm_count() // 5, 200_000, 4000
    x = (torch.randn(rows, n, generator=torch.Generator().manual_seed(k), dtype=torch.float64) * 3).to(dtype)
    with softmax_ops.force_kernel("topk", "split_row"):  # the dispatcher's choice here is split_hist (k > 256)
        text = softmax_ops.explain((rows, n), dtype, op="fused_topk", k=k)
        chunks = int(re.search(r"\((\d+) CTAs per row", text).group(1))
        assert "kernel 'split_row'" in text and "in tiles of 8192," in text, text
        assert (chunks - 1) * k > k + 8192 + 2048, text
        check_topk(x.cuda(), k, -1, renormalize=True)


def rising_rows(tiles: int, tail: int) -> torch.Tensor:
    """float64 rows of tiles * 4096 + tail values whose maximum rises tile after tile (by 3 and by 20 per tile:
    the chunk producer's threads rescale their sums on most tiles), one dominant value in the first tile over
    noise, and a spread of +-300 (most terms underflow to 0)."""
    n = tiles * 4096 + tail
    generator = torch.Generator().manual_seed(tiles)
    noise = torch.randn(n, generator=generator, dtype=torch.float64)
    tile_index = torch.div(torch.arange(n), 4096, rounding_mode="floor").to(torch.float64)
    dominant = noise.clone()
    dominant[100] = 30.0
    wide = noise * 100
    return torch.stack([noise + 3 * tile_index, noise + 20 * tile_index, dominant, wide])


@requires_cuda
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("kernel", ["block", "split_row"])
def test_chunk_producer_rising_maxima(kernel, dtype):
    """rising_rows through the chunk producer: values within twice torch's own error of the float64
    reference (the block-wide merge of the threads' sums included), indices exact."""
    x = rising_rows(12, 77).to(dtype).cuda()
    with softmax_ops.force_kernel("topk", kernel):
        for k in (1, 50):
            for renormalize in (False, True):
                check_topk(x, k, -1, renormalize)


@requires_cuda
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("rows,n,k", [(2, 262144, 1024), (1, 128256, 50), (3, 151936, 50)])
def test_split_hist_vocabulary_rows(rows, n, k, dtype):
    """The vocabulary shapes split_hist is for, on random logits (16-bit ones tie often: ties go to the
    lower index exactly as the reference orders them)."""
    x = (torch.randn(rows, n, generator=torch.Generator().manual_seed(n + k), dtype=torch.float64) * 3).to(dtype)
    with softmax_ops.force_kernel("topk", "split_hist"):
        check_topk(x.cuda(), k, -1, renormalize=False)
        check_topk(x.cuda(), k, -1, renormalize=True)


@requires_cuda
@pytest.mark.parametrize("kernel", TOPK_KERNELS)
def test_forced_kernel_is_deterministic(kernel):
    n, k = {"warp": (1000, 20), "rows": (500, 8)}.get(kernel, (70000, 64))
    x = (torch.randn(5, n, generator=torch.Generator().manual_seed(2)) * 3).cuda()
    with softmax_ops.force_kernel("topk", kernel):
        first = softmax_ops.fused_topk(x, k, -1, True)
        for _ in range(3):
            again = softmax_ops.fused_topk(x, k, -1, True)
            assert torch.equal(first[0], again[0]) and torch.equal(first[1], again[1])


@requires_cuda
@pytest.mark.parametrize("kernel", TOPK_KERNELS)
def test_forced_kernel_cuda_graph_capture(kernel):
    """No host sync and caching-allocator-only workspaces: capture, replay on new data, compare. Replayed twice:
    the split kernels' row tickets must start from zero on every replay, not only on the first."""
    n, k = (500, 8) if kernel in ("warp", "rows") else (9000, 30)
    x = (torch.randn(4, n, generator=torch.Generator().manual_seed(4)) * 3).cuda()
    with softmax_ops.force_kernel("topk", kernel):
        softmax_ops.fused_topk(x, k, -1, True)  # warm-up outside the capture
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            values, indices = softmax_ops.fused_topk(x, k, -1, True)
        for seed in (6, 7):
            x.copy_((torch.randn(4, n, generator=torch.Generator().manual_seed(seed)) * 3).cuda())
            graph.replay()
            torch.cuda.synchronize()
            expected = softmax_ops.fused_topk(x, k, -1, True)
            assert torch.equal(indices, expected[1]) and torch.equal(values, expected[0])
            # ... and the replay is right, not only repeatable: the independent reference on the new data.
            assert torch.equal(indices.cpu(), topk_reference(x, k, -1, True)[1])


@requires_cuda
def test_forced_kernel_on_impossible_shape_raises():
    cases = [
        ("warp", torch.float32, 1025, 4),
        ("warp", torch.float64, 513, 4),
        ("block", torch.float32, 30000, 30000),
        ("split_row", torch.float64, 20000, 12000),
        ("split_hist", torch.float64, 20000, 12000),
        ("rows", torch.float32, 513, 4),
        ("rows", torch.float16, 100, 9),
        ("rows", torch.float64, 64, 4),
    ]
    for kernel, dtype, n, k in cases:
        assert not n_supported(kernel, n, k, dtype)
        x = torch.randn(2, n, device="cuda", dtype=dtype)
        with softmax_ops.force_kernel("topk", kernel), pytest.raises(ValueError, match="cannot handle"):
            softmax_ops.fused_topk(x, k)


def near_tie_rows(n: int, k: int, seed: int) -> torch.Tensor:
    """float32 rows whose values agree in their top bits: the rows kernel ranks float32 first by 32-bit words
    of a key's top 23 bits (values within ~2^-14 of each other tie there) and must fall back to exact words
    wherever such a tie touches the selection. Row kinds: a cluster of near-equal values straddling the k-th
    rank; near-equal values inside the top k; the (k+1)-th near-equal to the k-th; exact duplicates at the
    boundary; a near-equal cluster far below the top k (the fast words are exact there)."""
    generator = torch.Generator().manual_seed(seed)
    rows = []
    for kind in ("straddle", "inside", "next", "duplicates", "below"):
        row = torch.rand(n, generator=generator, dtype=torch.float64) * 2.0 - 4.0  # [-4, -2)
        columns = torch.randperm(n, generator=generator)
        cluster = 2.0 * (1.0 + torch.arange(12, dtype=torch.float64) * 2.0**-20)  # 12 distinct float32 values
        if kind == "straddle":
            row[columns[: min(12, n)]] = cluster[: min(12, n)]
        elif kind == "inside":
            row[columns[:k]] = 3.0 + torch.arange(k, dtype=torch.float64)
            row[columns[0]], row[columns[1]] = cluster[0], cluster[1]
        elif kind == "next":
            row[columns[:k]] = 3.0 + torch.arange(k, dtype=torch.float64)
            row[columns[k - 1]] = cluster[1]
            if n > k:
                row[columns[k]] = cluster[0]
        elif kind == "duplicates":
            row[columns[: min(k + 3, n)]] = 2.5
        else:
            row[columns[: min(12, n)]] = -3.0 * (1.0 + torch.arange(min(12, n), dtype=torch.float64) * 2.0**-20)
            row[columns[min(12, n) : min(12 + k, n)]] = 3.0 + torch.arange(min(k, max(n - 12, 0)), dtype=torch.float64)
        rows.append(row)
    return torch.stack(rows).float().cuda()


@requires_cuda
@pytest.mark.parametrize("renormalize", [False, True])
@pytest.mark.parametrize("n,k", [(8, 8), (64, 6), (100, 8), (256, 8), (512, 8), (160, 2), (60, 1)])
def test_rows_float32_near_ties(n, k, renormalize):
    """float32 rows kernel: near-equal and equal values at and around the k-th rank select and order exactly
    as the float64 reference (ties to the lower index), through the exact-word fallback."""
    x = near_tie_rows(n, k, seed=n + k)
    with softmax_ops.force_kernel("topk", "rows"):
        check_topk(x, k, -1, renormalize)
        check_topk(misaligned(x), k, -1, renormalize)  # the scalar-load instance


# Many rows keep the rows kernel at few threads per row (it adds threads only while the GPU has room), so each
# thread holds 16-32 values: its largest in-thread networks and merges. (n, k) pairs: 16- and 32-bit layouts, a
# scalar-load length (100), and k below, at and above the threads per row. The 16-bit 512-column rows run in
# batches on a 132-SM GPU (test_rows_kernel_in_batches has those); their 16 threads of 32 values each have the
# 37-row forced tests and the misaligned (scalar-load) pass here.
MANY_ROWS = 16384
MANY_ROWS_CASES = [
    (64, 2),
    (64, 6),
    (64, 8),
    (100, 8),
    (128, 8),
    (160, 6),
    (256, 1),
    (256, 8),
    (512, 3),
    (512, 8),
]


HARD_ROWS = 5 + len(SPECIAL_ROWS)  # the rows in front that many_rows_with_hard_cases makes hard or special


def many_rows_with_hard_cases(n: int, dtype: torch.dtype, seed: int, rows: int = MANY_ROWS) -> torch.Tensor:
    """`rows` random rows (N(0, 9)) with hard cases in front: every value equal, ascending values (the top
    k in one thread's registers), repeated maxima, a tie at the top of a thread, and -0 / +0; then every
    SPECIAL_ROWS kind."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, n, generator=generator, dtype=torch.float64) * 3
    x[0] = 1.0
    x[1] = torch.arange(n, dtype=torch.float64) / n
    x[2, ::3] = 5.0
    x[3, : min(n, 24)] = 4.0
    x[4] = 0.0
    x[4, ::2] = -0.0
    for i, kind in enumerate(SPECIAL_ROWS):
        x[5 + i] = special_row(kind, n, generator)
    return x.to(dtype)


@requires_cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("n,k", MANY_ROWS_CASES)
def test_rows_kernel_on_many_rows(n, k, dtype):
    """The rows kernel on many rows (16-32 values per thread): the same indices as the float64 reference (ties
    to the lower index, NaN first), NaN exactly where it has NaN, values within 2x torch's error on the finite
    rows; aligned and misaligned (scalar loads), renormalized or not."""
    x = many_rows_with_hard_cases(n, dtype, seed=n * 10 + k).cuda()
    for data, renormalize in ((x, False), (misaligned(x), True)):
        check_reference_order(data, k, "rows", renormalize)
        with softmax_ops.force_kernel("topk", "rows"):
            check_topk(data[HARD_ROWS:], k, -1, renormalize)


# 16-bit rows of whole 16-byte vectors with k > 2 on many rows run in batches (topk_dispatch.cpp, rows_batch_*):
# half the threads that hold a row, each walking its share in batches of 32 values. Lengths whose last batch is
# whole (256, 512), one vector of one thread (136, 264) or partial (200, 384, 504); both batched K instances (4, 8).
BATCHED_ROWS_CASES = [(136, 3), (136, 8), (200, 6), (256, 8), (264, 4), (384, 8), (504, 5), (512, 8)]


def sm_count() -> int:
    return torch.cuda.get_device_properties(0).multi_processor_count


def fewest_row_threads(n: int) -> int:
    """The fewest rows-kernel threads that hold a row of n in 32 slots each (a power of two)."""
    return 1 << (-(-n // 32) - 1).bit_length()


def check_planned_rows(x: torch.Tensor, k: int, plain_from: int, float32_renormalize: bool) -> None:
    """fused_topk on x with the dispatcher's own plan: the reference order on every row (x, renormalized, and a
    misaligned copy, which runs the plain instance), values within 2x torch's error from row plain_from on, and
    float32 probabilities from the 16-bit logits."""
    for data, renormalize in ((x, False), (x, True), (misaligned(x), True)):
        check_reference_order(data, k, "rows", renormalize)
        check_topk(data[plain_from:], k, -1, renormalize)
    check_topk(x[plain_from:], k, -1, float32_renormalize, torch.float32)


def rows_in_batches(n: int) -> int:
    """Enough rows for the dispatcher to run rows of n in batches on this GPU (24 warps per SM at half the
    threads that hold a row)."""
    half = max(1, fewest_row_threads(n) // 2)
    return -(-24 * sm_count() * 32 // half) + 64  # + 64: the rows past the hard and special ones still qualify


@requires_cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("n,k", BATCHED_ROWS_CASES)
def test_rows_kernel_in_batches(n, k, dtype):
    """The rows kernel's batched instances (the dispatcher's own plan, checked through explain): the same indices
    as the float64 reference on hard and special rows, values within 2x torch's error; a misaligned view of the
    same rows falls back to scalar loads on the threads that hold the row."""
    rows = rows_in_batches(n)
    assert "batches of 32 values" in softmax_ops.explain((rows, n), dtype, op="fused_topk", k=k)
    x = many_rows_with_hard_cases(n, dtype, seed=n * 10 + k, rows=rows).cuda()
    x[HARD_ROWS, n - 1] = float("nan")  # NaN in a last batch: the reload of every batch
    check_planned_rows(x, k, HARD_ROWS + 1, float32_renormalize=True)


# 16-bit rows of whole 16-byte vectors with k > 2 that need no batches run on the threads that hold the row
# (topk_dispatch.cpp, rows_one_wave_warps_per_sm; session 29's staged instances ran these rows until session 33).
# Lengths of 2 to 4 packs per thread, 1 to 16 threads per row, both K instances (4, 8), on enough rows that the
# few-row doubling does not apply and, for 512 columns, too few for batches.
VECTOR_ROWS_CASES = [(24, 3), (32, 8), (40, 5), (72, 4), (96, 3), (128, 8), (160, 6), (248, 8), (256, 4), (512, 7)]


def rows_on_holding_threads(n: int) -> int:
    """Rows of n that keep the fewest threads holding a row on this GPU (8 warps per SM: the dispatcher's few-row
    doubling stops there)."""
    return -(-8 * sm_count() * 32 // fewest_row_threads(n)) + 64


@requires_cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("n,k", VECTOR_ROWS_CASES)
def test_rows_kernel_vector_rows_on_the_threads_that_hold_them(n, k, dtype):
    """The dispatcher's own plan for many 16-bit rows of whole vectors (16384 rows; 4096 for 512 columns, which
    16384 would batch; more for short rows, which fewer rows would spread over more threads; checked through
    explain): the same indices as the float64 reference on hard and special rows, values within 2x torch's error;
    renormalized, float32 probabilities; a misaligned view of the same rows (scalar loads)."""
    rows = 4096 if n == 512 else max(MANY_ROWS, rows_on_holding_threads(n))
    text = softmax_ops.explain((rows, n), dtype, op="fused_topk", k=k)
    assert f"kernel 'rows' ({fewest_row_threads(n)} thread" in text and "batches" not in text, text
    x = many_rows_with_hard_cases(n, dtype, seed=n * 100 + k, rows=rows).cuda()
    check_planned_rows(x, k, HARD_ROWS, float32_renormalize=False)


# Spans whose every used slot lies in the row (RowSlots::load_packs: used * T == n) load without bound checks or -inf
# padding; others load each 16-byte pack by a predicated load over -inf (detail::load_16_cs_or); rows past the end of
# the last CTA take the checked path, in the same warps. On a 132-SM H100 the whole spans run the plain instances
# (float32 everywhere, its 32 columns the exact-word one; 16-bit 32, 64, 128 and 256) and the batched one (16-bit 512:
# two whole batches); the partial spans the plain instances (float32 everywhere, 16-bit 40, 160, 200 and 480 at
# k = 2) and the batched one with a partial last batch (16-bit 480 at k = 8).
WHOLE_SPAN_CASES = [(32, 4), (64, 6), (128, 8), (256, 8), (512, 8)]
PARTIAL_SPAN_CASES = [(40, 4), (160, 6), (200, 8), (480, 8), (480, 2)]


@requires_cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("n,k", WHOLE_SPAN_CASES + PARTIAL_SPAN_CASES)
def test_rows_kernel_spans_and_a_partial_last_cta(n, k, dtype):
    """Rows of whole and of partial spans on a row count that leaves the last CTA partial, the hard and special rows
    (NaN / +inf: the reload) in front and again in the last rows: the reference order on every row, values within
    2x torch's error on the others, renormalized or not."""
    rows = MANY_ROWS + 3
    x = many_rows_with_hard_cases(n, torch.float64, seed=n + k, rows=rows)
    x[-HARD_ROWS:] = x[:HARD_ROWS]
    x = x.to(dtype).cuda()
    for renormalize in (False, True):
        check_reference_order(x, k, "rows", renormalize)
        with softmax_ops.force_kernel("topk", "rows"):
            check_topk(x[HARD_ROWS:-HARD_ROWS], k, -1, renormalize)


@requires_cuda
def test_rows_beyond_32_bit_element_offsets():
    """> 2^31 elements in total: 64-bit row offsets in the warp and block kernels."""
    rows, n = (1 << 21) + 3, 1024
    if torch.cuda.mem_get_info()[0] < 3 * rows * n * 2:
        pytest.skip("not enough GPU memory")
    x = torch.empty(rows, n, dtype=torch.float16, device="cuda")
    x.view(-1)[:] = 0
    tail = distinct_rows(3, n, torch.float16, seed=12)
    x[-3:] = tail
    for kernel in ("warp", "block"):
        with softmax_ops.force_kernel("topk", kernel):
            values, indices = softmax_ops.fused_topk(x, 8)
        ref_values, ref_indices = topk_reference(tail, 8, -1, False)
        assert torch.equal(indices[-3:].cpu(), ref_indices)
        assert torch.equal(indices[0].cpu(), torch.arange(8))  # an all-equal row: the lowest indices
        assert torch.allclose(values[-3:].double().cpu(), ref_values, atol=1e-3)
    del x


# ---------------------------------------------------------------------------------------------- backward


@requires_cuda
@pytest.mark.parametrize("renormalize", [False, True])
@pytest.mark.parametrize("kernel", BACKWARD_KERNELS)
@pytest.mark.parametrize("shape,k,dim", GRADCHECK_CASES)
def test_forced_backward_gradcheck(shape, k, dim, kernel, renormalize):
    # Well-separated logits so that the finite-difference steps never change the selection.
    x = distinct_rows(1, torch.Size(shape).numel(), torch.float64, seed=9).view(shape).requires_grad_(True)
    with softmax_ops.force_kernel("topk_backward", kernel):
        assert torch.autograd.gradcheck(lambda t: softmax_ops.fused_topk(t, k, dim, renormalize)[0], (x,))


@requires_cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("renormalize", [False, True])
@pytest.mark.parametrize("kernel", BACKWARD_KERNELS)
@pytest.mark.parametrize("shape,k,dim", BACKWARD_CASES)
def test_forced_backward_matches_torch_autograd(shape, k, dim, kernel, renormalize, dtype):
    moved = list(shape)
    moved.append(moved.pop(dim))
    x = (
        separated_rows(torch.Size(moved[:-1]).numel(), moved[-1], k, dtype, seed=10)
        .view(moved)
        .movedim(-1, dim)
    )
    out_shape = list(shape)
    out_shape[dim] = k
    grad = (torch.randn(out_shape, generator=torch.Generator().manual_seed(11))).to(dtype).cuda()

    def values_of(t):
        values = torch.topk(torch.softmax(t, dim), k, dim).values
        return values / values.sum(dim, keepdim=True) if renormalize else values

    x_ours = x.clone().requires_grad_(True)
    with softmax_ops.force_kernel("topk_backward", kernel):
        softmax_ops.fused_topk(x_ours, k, dim, renormalize)[0].backward(grad)
    x_ref = x.double().cpu().requires_grad_(True)
    values_of(x_ref).backward(grad.double().cpu())
    x_torch = x.clone().requires_grad_(True)
    values_of(x_torch).backward(grad)
    assert x_ours.grad.dtype == dtype and x_ours.grad.shape == x.shape
    assert_within_2x_torch(x_ours.grad, x_torch.grad, x_ref.grad)


@requires_cuda
@pytest.mark.parametrize("kernel", BACKWARD_KERNELS)
def test_forced_backward_dtype_argument_and_graph_capture(kernel):
    """bf16 logits with dtype=float32 values: the gradient comes back in bf16; capture works."""
    x = separated_rows(6, 3000, 16, torch.bfloat16, seed=13)
    values, indices = softmax_ops.fused_topk(x, 16, -1, False, torch.float32)
    grad = torch.randn_like(values)
    op = torch.ops.softmax_ops.fused_topk_backward.default
    with softmax_ops.force_kernel("topk_backward", kernel):
        eager = op(grad, x, values, indices, -1, False)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            captured = op(grad, x, values, indices, -1, False)
        graph.replay()
        torch.cuda.synchronize()
    assert eager.dtype == torch.bfloat16 and torch.equal(eager, captured)
    x_ref = x.double().cpu().requires_grad_(True)
    torch.topk(torch.softmax(x_ref, -1), 16, -1).values.backward(grad.double().cpu())
    torch_grad = x.float().requires_grad_(True)
    torch.topk(torch.softmax(torch_grad, -1), 16, -1).values.backward(grad)
    assert_within_2x_torch(eager, torch_grad.grad.to(torch.bfloat16), x_ref.grad)


# ---------------------------------------------------------------------------------------------- opcheck


@requires_cuda
@pytest.mark.parametrize("kernel", TOPK_KERNELS)
def test_opcheck_with_forced_kernel(kernel):
    x = distinct_rows(4, 300, torch.float32, seed=14).requires_grad_(True)
    x3 = distinct_rows(6, 50, torch.bfloat16, seed=15).view(2, 3, 50).transpose(1, 2).contiguous()
    samples = [(x, 5, -1, False, None), (x, 7, -1, True, None), (x3, 4, 1, True, torch.float32)]
    with softmax_ops.force_kernel("topk", kernel):
        for args in samples:
            torch.library.opcheck(torch.ops.softmax_ops.fused_topk.default, args)
        values, indices = torch.ops.softmax_ops.fused_topk.default(x.detach(), 6, -1, False, None)
        for backward_kernel in BACKWARD_KERNELS:
            with softmax_ops.force_kernel("topk_backward", backward_kernel):
                torch.library.opcheck(
                    torch.ops.softmax_ops.fused_topk_backward.default,
                    (torch.ones_like(values), x.detach(), values, indices, -1, False),
                )


# ---------------------------------------------------------------------------------------------- dispatcher


@requires_topk_menu
def test_list_kernels_and_explain():
    assert softmax_ops.list_kernels("topk") == TOPK_KERNELS
    assert softmax_ops.list_kernels("topk_backward") == BACKWARD_KERNELS
    text = softmax_ops.explain((16384, 160), torch.float16, op="fused_topk", k=6)
    assert "kernel 'rows'" in text and "SMs" in text
    # float32 rows beyond rows_auto_max_n_fp32 (256) go to the warp kernel unless they are whole 16-byte vectors
    assert "kernel 'rows'" in softmax_ops.explain((16384, 128), torch.float32, op="fused_topk", k=8)
    assert "kernel 'rows'" in softmax_ops.explain((65536, 256), torch.float32, op="fused_topk", k=8)
    assert "kernel 'rows'" in softmax_ops.explain((16384, 512), torch.float32, op="fused_topk", k=8)
    assert "kernel 'rows'" in softmax_ops.explain((16384, 320), torch.float32, op="fused_topk", k=8)
    assert "kernel 'warp'" in softmax_ops.explain((16384, 321), torch.float32, op="fused_topk", k=8)
    # rows of whole 16-byte vectors keep a vector per thread; others (scalar loads) spread over more threads
    assert "(8 threads per row" in softmax_ops.explain((4096, 64), torch.float16, op="fused_topk", k=4)
    assert "(16 threads per row" in softmax_ops.explain((4096, 60), torch.float16, op="fused_topk", k=4)
    # 16-bit: 16384 rows of 128 run on the 4 threads that hold a row (float32: 32 values per thread at 4
    # threads, and 8 threads still fit one wave: 8); 65536 rows of 256 fill the GPU at half the 8 threads that
    # hold a row, in batches (on a 132-SM GPU; explain without a GPU assumes an H100)
    if "132 SMs" in softmax_ops.explain((1, 8), torch.float16, op="fused_topk", k=1):
        text = softmax_ops.explain((16384, 128), torch.float16, op="fused_topk", k=8)
        assert "(4 threads per row" in text and "batches" not in text, text
        assert "(8 threads per row" in softmax_ops.explain((16384, 128), torch.float32, op="fused_topk", k=8)
        text = softmax_ops.explain((65536, 256), torch.float16, op="fused_topk", k=8)
        assert "(4 threads per row, each walking its share in 2 batches" in text, text
    text = softmax_ops.explain((16384, 160), torch.float32, op="fused_topk", k=16)
    assert "kernel 'warp'" in text
    assert "kernel 'warp'" in softmax_ops.explain((16384, 64), torch.float64, op="fused_topk", k=4)
    assert "kernel 'split_hist'" in softmax_ops.explain((8, 262144), torch.float16, op="fused_topk", k=1024)
    assert "kernel 'split_row'" in softmax_ops.explain((64, 151936), torch.float16, op="fused_topk", k=50)
    assert "kernel 'split_hist'" in softmax_ops.explain((1, 128256), torch.float32, op="fused_topk", k=50)
    # split_hist reads the logits twice: only where they fit the L2 (50 MB assumed without a GPU)
    assert "kernel 'split_row'" in softmax_ops.explain((64, 1 << 20), torch.float16, op="fused_topk", k=1024)
    text = softmax_ops.explain((8, 262144), torch.bfloat16, op="fused_topk", k=50_000)
    assert "kernel 'radix'" in text  # beyond the candidate buffer whatever the heuristics
    with softmax_ops.force_kernel("topk", "block"):
        assert "forced" in softmax_ops.explain((4, 1000), torch.float16, op="fused_topk", k=3)
    # rows that are not whole 16-byte vectors: peeled (block and split_row, 16- and 32-bit), else single elements
    assert "aligned body" in softmax_ops.explain((1024, 50257), torch.float16, op="fused_topk", k=50)
    assert "aligned body" in softmax_ops.explain((4, 151935), torch.float32, op="fused_topk", k=50)
    with softmax_ops.force_kernel("topk", "split_row"):  # test_peeled_rows_forced's chunks
        for dtype, n in ((torch.float16, 2 * 8192 + 14), (torch.float32, 2 * 8192 + 6)):
            text = softmax_ops.explain((17, n), dtype, op="fused_topk", k=50)
            assert "(2 CTAs per row of 8192 elements" in text and "aligned body" in text
    assert "single-element" in softmax_ops.explain((1024, 50257), torch.float64, op="fused_topk", k=50)
    # ... automatically from 2 tiles at 16 bits (4096 x 4095 measured slower peeled), 3 for float32
    assert "pay from N=4097" in softmax_ops.explain((4096, 4095), torch.float16, op="fused_topk", k=32)
    assert "pay from N=8193" in softmax_ops.explain((2048, 8191), torch.float32, op="fused_topk", k=16)
    assert "aligned body" in softmax_ops.explain((2048, 8191), torch.float16, op="fused_topk", k=16)
    assert "16-byte" not in softmax_ops.explain((1024, 50256), torch.float16, op="fused_topk", k=50)
    assert "kernel '" in softmax_ops.explain((64, 151936), torch.float32, op="fused_topk_backward", k=50)
    with pytest.raises(ValueError, match="k"):
        softmax_ops.explain((4, 100), torch.float32, op="fused_topk")
