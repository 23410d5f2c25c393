"""The op contract on every device present: numerics vs a float64 reference and vs torch, special values,
shapes (any dim, 0-d, empty, non-contiguous), dtype=, autograd, opcheck and bad inputs.

CUDA-kernel-specific coverage (every kernel forced across its size boundaries) lives in test_cuda_*.py.
"""

from __future__ import annotations

import math

import pytest
import torch
from conftest import DEVICES, FLOAT_DTYPES, HAS_CUDA, assert_within_2x_torch, requires_cuda, topk_reference

import softmax_ops

SOFTMAX_OPS = [
    (softmax_ops.softmax, torch.softmax),
    (softmax_ops.log_softmax, torch.log_softmax),
]
SOFTMAX_IDS = ["softmax", "log_softmax"]

# (shape, dim): rows of length 1, odd lengths, every dim of a 3-d tensor, negative dims.
SHAPES_AND_DIMS = [
    ((7,), 0),
    ((1, 1), -1),
    ((3, 1), 1),
    ((5, 33), -1),
    ((4, 1000), 1),
    ((2, 3, 17), 0),
    ((2, 3, 17), 1),
    ((2, 3, 17), 2),
    ((2, 3, 17), -2),
    ((3, 2, 5, 4), 2),
]

# dtype= pairs: (input dtype, requested dtype); None means "no dtype argument".
DTYPE_PAIRS = [
    (torch.float16, torch.float32),
    (torch.bfloat16, torch.float32),
    (torch.float32, torch.float16),
    (torch.float32, torch.float64),
    (torch.float64, torch.float32),
    (torch.float32, None),
]


def make_input(shape, dtype, device, seed=0, scale=3.0):
    generator = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=generator, dtype=torch.float64) * scale).to(dtype).to(device)


def reference(torch_fn, x, dim, dtype=None):
    """float64 reference of torch_fn(x, dim, dtype=dtype): cast to dtype first, exactly as torch does."""
    cast = x.to(dtype) if dtype is not None else x
    return torch_fn(cast.double().cpu(), dim)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("shape,dim", SHAPES_AND_DIMS)
@pytest.mark.parametrize("ours,torch_fn", SOFTMAX_OPS, ids=SOFTMAX_IDS)
def test_softmax_matches_reference(ours, torch_fn, shape, dim, dtype, device):
    x = make_input(shape, dtype, device)
    out = ours(x, dim)
    assert out.dtype == dtype and out.shape == x.shape and out.is_contiguous()
    assert_within_2x_torch(out, torch_fn(x, dim), reference(torch_fn, x, dim))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("in_dtype,out_dtype", DTYPE_PAIRS)
@pytest.mark.parametrize("ours,torch_fn", SOFTMAX_OPS, ids=SOFTMAX_IDS)
def test_softmax_dtype_argument(ours, torch_fn, in_dtype, out_dtype, device):
    x = make_input((6, 129), in_dtype, device, seed=1)
    out = ours(x, -1, dtype=out_dtype)
    expected = torch_fn(x, -1, dtype=out_dtype)
    assert out.dtype == expected.dtype
    assert_within_2x_torch(out, expected, reference(torch_fn, x, -1, out_dtype))


@pytest.mark.parametrize("device", DEVICES)
def test_python_float_as_dtype_means_float64_as_in_torch(device):
    x = make_input((3, 5), torch.float32, device, seed=2)
    for ours, torch_fn in SOFTMAX_OPS:
        out, expected = ours(x, 0, dtype=float), torch_fn(x, 0, dtype=float)
        assert out.dtype == expected.dtype == torch.float64
        torch.testing.assert_close(out, expected)
    values, indices = softmax_ops.fused_topk(x, 2, 0, dtype=float)
    expected_values, expected_indices = torch.topk(torch.softmax(x, 0, dtype=float), 2, 0)
    assert values.dtype == torch.float64 and torch.equal(indices, expected_indices)
    torch.testing.assert_close(values, expected_values)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("ours,torch_fn", SOFTMAX_OPS, ids=SOFTMAX_IDS)
def test_softmax_non_contiguous_and_unaligned(ours, torch_fn, dtype, device):
    base = make_input((9, 66), dtype, device, seed=2)
    for x, dim in [(base.t(), 0), (base.t(), 1), (base[:, 1:], -1), (base[::2, 3:], -1), (base[1:, 1:].t(), 0)]:
        out = ours(x, dim)
        assert_within_2x_torch(out, torch_fn(x, dim), reference(torch_fn, x, dim))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("ours,torch_fn", SOFTMAX_OPS, ids=SOFTMAX_IDS)
def test_softmax_special_values(ours, torch_fn, dtype, device):
    inf, nan = float("inf"), float("nan")
    rows = torch.tensor(
        [
            [1.0, 2.0, nan, 3.0],  # NaN anywhere -> NaN row
            [1.0, inf, 2.0, 3.0],  # +inf -> NaN where torch gives NaN
            [-inf, -inf, -inf, -inf],  # all -inf -> NaN
            [-inf, 0.0, 1.0, -inf],  # -inf entries -> exactly 0 (softmax) / -inf (log_softmax)
            [inf, inf, 0.0, 0.0],
            [-inf, -inf, 5.0, -inf],
            [60000.0, -60000.0, 0.0, 1.0],  # large magnitudes, finite in every dtype
        ],
        dtype=torch.float64,
    ).to(dtype).to(device)
    out = ours(rows, -1)
    expected = torch_fn(rows, -1)
    assert torch.equal(torch.isnan(out), torch.isnan(expected))
    assert_within_2x_torch(out, expected, reference(torch_fn, rows, -1))
    if ours is softmax_ops.softmax:
        assert out[3, 0].item() == 0.0 and out[3, 3].item() == 0.0


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("ours,torch_fn", SOFTMAX_OPS, ids=SOFTMAX_IDS)
def test_softmax_zero_dim_and_empty(ours, torch_fn, device):
    scalar = torch.tensor(2.5, device=device)
    for dim in (0, -1):
        assert torch.equal(ours(scalar, dim).cpu(), torch_fn(scalar, dim).cpu())
    for shape, dim in [((0, 5), 1), ((5, 0), 1), ((5, 0), 0), ((0,), 0)]:
        x = torch.empty(shape, device=device)
        out = ours(x, dim)
        assert out.shape == x.shape and out.numel() == 0


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("ours,torch_fn", SOFTMAX_OPS, ids=SOFTMAX_IDS)
def test_softmax_backward_matches_torch(ours, torch_fn, dtype, device):
    for shape, dim, out_dtype in [((4, 37), -1, None), ((3, 5, 7), 1, None), ((6, 40), -1, torch.float32)]:
        x = make_input(shape, dtype, device, seed=3)
        grad = make_input(shape, out_dtype or dtype, device, seed=4, scale=1.0)
        x_ours = x.clone().requires_grad_(True)
        x_torch = x.clone().requires_grad_(True)
        ours(x_ours, dim, dtype=out_dtype).backward(grad)
        torch_fn(x_torch, dim, dtype=out_dtype).backward(grad)
        x_ref = x.double().cpu().requires_grad_(True)
        torch_fn(x_ref, dim).backward(grad.double().cpu())
        assert x_ours.grad.dtype == dtype
        assert_within_2x_torch(x_ours.grad, x_torch.grad, x_ref.grad)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("ours", [softmax_ops.softmax, softmax_ops.log_softmax], ids=SOFTMAX_IDS)
def test_softmax_gradcheck(ours, device):
    x = make_input((3, 6), torch.float64, device, seed=5).requires_grad_(True)
    assert torch.autograd.gradcheck(lambda t: ours(t, -1), (x,))
    y = make_input((4, 3, 2), torch.float64, device, seed=6).requires_grad_(True)
    assert torch.autograd.gradcheck(lambda t: ours(t, 1), (y,))


# ---------------------------------------------------------------------------------------------- fused_topk

TOPK_CASES = [  # (shape, k, dim)
    ((5, 8), 2, -1),
    ((3, 60), 4, -1),
    ((4, 160), 6, 1),
    ((2, 1000), 50, -1),
    ((2, 17), 17, -1),  # k == N
    ((1, 1), 1, -1),
    ((6, 9, 3), 3, 1),  # non-last dim
    ((9,), 4, 0),
]


def distinct_logits(shape, dim, dtype, device, seed=0):
    """Logits along dim that are a random permutation of an even grid over [-4, 4): distinct and well
    separated in float32/float64 (and in half dtypes for N up to ~256; beyond that ties may appear, which
    the stable-sort reference resolves exactly as the contract says)."""
    generator = torch.Generator().manual_seed(seed)
    n = shape[dim]
    moved = list(shape)
    moved.append(moved.pop(dim))
    grid = torch.arange(n, dtype=torch.float64) * (8.0 / n) - 4.0
    rows = torch.stack([grid[torch.randperm(n, generator=generator)] for _ in range(math.prod(moved[:-1]))])
    x = rows.reshape(moved).movedim(-1, dim)
    return x.to(dtype).to(device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("renormalize", [False, True])
@pytest.mark.parametrize("shape,k,dim", TOPK_CASES)
def test_fused_topk_matches_reference(shape, k, dim, renormalize, dtype, device):
    x = distinct_logits(shape, dim, dtype, device)
    values, indices = softmax_ops.fused_topk(x, k, dim, renormalize)
    ref_values, ref_indices = topk_reference(x, k, dim, renormalize)
    assert values.dtype == dtype and indices.dtype == torch.int64
    assert values.is_contiguous() and indices.is_contiguous()
    assert torch.equal(indices.cpu(), ref_indices)
    torch_values = torch.topk(torch.softmax(x, dim), k, dim).values
    if renormalize:
        torch_values = torch_values / torch_values.sum(dim, keepdim=True)
    assert_within_2x_torch(values, torch_values, ref_values)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("in_dtype,out_dtype", DTYPE_PAIRS)
def test_fused_topk_dtype_argument(in_dtype, out_dtype, device):
    x = distinct_logits((4, 64), -1, in_dtype, device, seed=7)
    values, indices = softmax_ops.fused_topk(x, 6, -1, False, out_dtype)
    expected = torch.topk(torch.softmax(x, -1, dtype=out_dtype), 6, -1)
    ref_values, ref_indices = topk_reference(x, 6, -1, False, out_dtype)
    assert values.dtype == expected.values.dtype
    assert torch.equal(indices.cpu(), ref_indices)
    assert_within_2x_torch(values, expected.values, ref_values)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_fused_topk_ties_go_to_lower_index(dtype, device):
    x = torch.tensor([[1.0, 3.0, 2.0, 3.0, 3.0, 0.0], [0.5] * 6], dtype=dtype, device=device)
    _, indices = softmax_ops.fused_topk(x, 4)
    assert indices.tolist() == [[1, 3, 4, 2], [0, 1, 2, 3]]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("renormalize", [False, True])
def test_fused_topk_special_values_give_distinct_in_range_indices(renormalize, dtype, device):
    inf, nan = float("inf"), float("nan")
    rows = torch.tensor(
        [
            [nan, 1.0, nan, 2.0, 0.0],
            [nan, nan, nan, nan, nan],
            [1.0, inf, 2.0, inf, 0.0],
            [-inf, -inf, -inf, -inf, -inf],
            [-inf, 1.0, -inf, 0.0, -inf],
        ],
        dtype=dtype,
        device=device,
    )
    for k in (1, 3, 5):
        values, indices = softmax_ops.fused_topk(rows, k, -1, renormalize)
        for row in indices.tolist():
            assert len(set(row)) == k and all(0 <= i < 5 for i in row)
        ref_values, ref_indices = topk_reference(rows, k, -1, renormalize)
        assert torch.equal(torch.isnan(values.cpu()), torch.isnan(ref_values))
        assert torch.equal(indices.cpu(), ref_indices)
        finite = ~torch.isnan(ref_values)
        assert torch.allclose(values.cpu().double()[finite], ref_values[finite], atol=1e-2)


@pytest.mark.parametrize("device", DEVICES)
def test_fused_topk_zero_dim_and_empty(device):
    values, indices = softmax_ops.fused_topk(torch.tensor(0.3, device=device), 1)
    assert values.dim() == 0 and values.item() == 1.0 and indices.item() == 0
    values, indices = softmax_ops.fused_topk(torch.empty(0, 7, device=device), 3)
    assert values.shape == (0, 3) and indices.shape == (0, 3)


@pytest.mark.parametrize("device", DEVICES)
def test_fused_topk_non_contiguous(device):
    base = distinct_logits((12, 50), -1, torch.float32, device, seed=8)
    for x, dim in [(base.t(), 0), (base[:, 1:], -1), (base[::3], -1)]:
        values, indices = softmax_ops.fused_topk(x, 5, dim, True)
        ref_values, ref_indices = topk_reference(x, 5, dim, True)
        assert torch.equal(indices.cpu(), ref_indices)
        assert torch.allclose(values.cpu().double(), ref_values, atol=1e-6)


# Results carry the strides torch gives its own (contiguous, size-1 dims included), the strides the fake kernels
# promise: a non-last dim's result computed dim-last had kept dim-last strides on its size-1 dims (shape (4, 1, 6)
# over dim 1: (6, 1, 1) where torch has (6, 6, 1)), which still counts as contiguous but is not torch's layout.
# Results start at version 0, as torch's (re-striding them must not count as an in-place write).
SIZE_ONE_DIM_CASES = [((4, 1, 6), 1), ((2, 3, 1, 5), 2), ((3, 1), 0), ((2, 1, 1, 3), 1), ((5, 1, 2), 0),
                      ((0, 1, 3), 1), ((3, 1, 0), 0)]


def strides_of_result_and_gradient(fn, x: torch.Tensor, *args) -> tuple:
    """Strides of fn(x, *args) (its first result where it returns several) and of its gradient."""
    leaf = x.detach().clone().requires_grad_()
    result = fn(leaf, *args)
    result = result[0] if isinstance(result, tuple) else result
    (gradient,) = torch.autograd.grad(result, leaf, torch.ones_like(result))
    return result.stride(), gradient.stride()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("transposed", [False, True], ids=["contiguous", "transposed"])
@pytest.mark.parametrize("shape,dim", SIZE_ONE_DIM_CASES)
def test_results_have_torchs_strides_on_size_one_dims(shape, dim, transposed, device):
    x = make_input(shape, torch.float32, device)
    if transposed:
        x = x.transpose(0, -1)
    fake = torch.empty_strided(x.shape, x.stride(), device="meta")
    for ours, torch_fn in SOFTMAX_OPS:
        expected = strides_of_result_and_gradient(torch_fn, x, dim)
        assert strides_of_result_and_gradient(ours, x, dim) == expected
        assert ours(fake, dim).stride() == expected[0]
        assert ours(x, dim)._version == torch_fn(x, dim)._version == 0
    for k in sorted({k for k in (1, x.shape[dim]) if 1 <= k <= x.shape[dim]}):
        expected = strides_of_result_and_gradient(torch.topk, torch.softmax(x, dim), k, dim)
        assert strides_of_result_and_gradient(softmax_ops.fused_topk, x, k, dim) == expected
        values, indices = softmax_ops.fused_topk(x, k, dim)
        fake_values, fake_indices = softmax_ops.fused_topk(fake, k, dim)
        assert indices.stride() == fake_indices.stride() == fake_values.stride() == values.stride() == expected[0]
        assert values._version == indices._version == 0


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("k", [256, 1024, 4099])
def test_fused_topk_renormalized_values_stay_accurate_for_large_k(k, device):
    # The CPU kernel summed the k probabilities sequentially in float: 2.0e-6 relative error at k = 1024
    # against torch's 3.6e-7, and all-equal rows of 1000 gave 0.0010000094 for 0.001.
    x = torch.cat([make_input((16, 4099), torch.float32, device, seed=22), torch.zeros(2, 4099, device=device)])
    values, _ = softmax_ops.fused_topk(x, k, -1, True)
    probabilities = torch.topk(torch.softmax(x, -1), k, -1).values
    torch_own = probabilities / probabilities.sum(-1, keepdim=True)
    reference, _ = topk_reference(x, k, -1, True)
    # Relative to each value: the values span orders of magnitude, an absolute bound would hide the drift.
    assert_within_2x_torch(values / reference.to(device), torch_own / reference.to(device), torch.ones_like(reference))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("renormalize", [False, True])
def test_fused_topk_gradcheck(renormalize, device):
    # Well-separated logits so that the finite-difference steps never change the selection.
    for shape, k, dim in [((3, 7), 3, -1), ((2, 5, 3), 2, 1), ((4, 6), 6, -1)]:
        x = distinct_logits(shape, dim, torch.float64, device, seed=9).requires_grad_(True)
        assert torch.autograd.gradcheck(lambda t, k=k, dim=dim: softmax_ops.fused_topk(t, k, dim, renormalize)[0], (x,))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("renormalize", [False, True])
def test_fused_topk_backward_matches_torch_autograd(renormalize, dtype, device):
    x = distinct_logits((8, 96), -1, dtype, device, seed=10)
    grad = make_input((8, 5), dtype, device, seed=11, scale=1.0)
    x_ours = x.clone().requires_grad_(True)
    softmax_ops.fused_topk(x_ours, 5, -1, renormalize)[0].backward(grad)
    x_ref = x.double().cpu().requires_grad_(True)
    values = torch.topk(torch.softmax(x_ref, -1), 5, -1).values
    if renormalize:
        values = values / values.sum(-1, keepdim=True)
    values.backward(grad.double().cpu())
    x_torch = x.clone().requires_grad_(True)
    values = torch.topk(torch.softmax(x_torch, -1), 5, -1).values
    if renormalize:
        values = values / values.sum(-1, keepdim=True)
    values.backward(grad)
    assert x_ours.grad.dtype == dtype
    assert_within_2x_torch(x_ours.grad, x_torch.grad, x_ref.grad)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    "forward",
    [lambda t: softmax_ops.fused_topk(t, 2, -1, False)[0], lambda t: softmax_ops.fused_topk(t, 2, -1, True)[0]],
    ids=["fused_topk", "fused_topk_renormalized"],
)
def test_fused_topk_double_backward_raises_instead_of_a_wrong_result(forward, device):
    # torch's fallback for an op without an autograd kernel only warns and drops terms of the second
    # derivative; a first backward with create_graph=True must still work.
    x = make_input((3, 5), torch.float64, device, seed=18).requires_grad_(True)
    (grad,) = torch.autograd.grad(forward(x).square().sum(), x, create_graph=True)
    with pytest.raises(RuntimeError, match="softmax_ops.fused_topk_backward: double backward is not supported"):
        torch.autograd.grad(grad.square().sum(), x)


# Second derivatives (softmax_backward's and log_softmax_backward's own autograd formulas, _autograd.py): checked
# numerically in float64 (gradgradcheck), and against torch's on every dtype pair the forward takes.
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dim", [-1, 0])
@pytest.mark.parametrize("ours", [softmax_ops.softmax, softmax_ops.log_softmax], ids=SOFTMAX_IDS)
def test_softmax_gradgradcheck(ours, dim, device):
    x = make_input((4, 6), torch.float64, device, seed=19).requires_grad_(True)
    assert torch.autograd.gradgradcheck(lambda t: ours(t, dim), (x,))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("in_dtype,out_dtype", [(torch.float32, None), (torch.float16, torch.float32),
                                                (torch.bfloat16, torch.float32), (torch.float64, None)])
@pytest.mark.parametrize("ours,torch_fn", SOFTMAX_OPS, ids=SOFTMAX_IDS)
def test_second_derivatives_match_torch(ours, torch_fn, in_dtype, out_dtype, device):
    x = make_input((5, 33), in_dtype, device, seed=20)
    upstream = make_input((5, 33), out_dtype or in_dtype, device, seed=21)
    direction = make_input((5, 33), in_dtype, device, seed=22)

    def hessian_vector_product(fn):
        leaf = x.detach().clone().requires_grad_(True)
        (grad,) = torch.autograd.grad((fn(leaf, -1, dtype=out_dtype) * upstream).sum(), leaf, create_graph=True)
        (second,) = torch.autograd.grad((grad * direction).sum(), leaf)
        return second

    ours_hvp, expected = hessian_vector_product(ours), hessian_vector_product(torch_fn)
    assert ours_hvp.dtype == expected.dtype and ours_hvp.stride() == expected.stride()
    tolerance = {"rtol": 1e-5, "atol": 1e-5} if in_dtype in (torch.float32, torch.float64) else {"rtol": 2e-2, "atol": 2e-2}
    torch.testing.assert_close(ours_hvp.double(), expected.double(), **tolerance)


PUBLIC_FORWARDS = {
    "softmax": lambda t: softmax_ops.softmax(t, -1),
    "log_softmax": lambda t: softmax_ops.log_softmax(t, -1),
    "fused_topk": lambda t: softmax_ops.fused_topk(t, 2)[0],
}


# The same forwards as torch.ops calls, which the public functions wrap.
DIRECT_FORWARDS = {
    "softmax": lambda t: torch.ops.softmax_ops.softmax(t, -1, None),
    "log_softmax": lambda t: torch.ops.softmax_ops.log_softmax(t, -1, None),
    "fused_topk": lambda t: torch.ops.softmax_ops.fused_topk(t, 2, -1, True, None)[0],
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("form", ["public", "direct"])
@pytest.mark.parametrize("op", list(PUBLIC_FORWARDS))
def test_forward_mode_derivatives_raise_instead_of_a_wrong_tangent(op, form, device):
    # The ops have backward formulas only: forward-mode AD dropped the tangent (None) and torch.func.jvp / jacfwd
    # returned zeros, both without an error; torch.func.grad raised an unrelated one. Through torch.ops calls the
    # zeros stayed after the public functions refused: torch skips an op's autograd formula where no input
    # requires grad, and the kernels below see torch.func's tensors unwrapped, without their tangents.
    from torch.autograd import forward_ad

    forward = (PUBLIC_FORWARDS if form == "public" else DIRECT_FORWARDS)[op]
    x = make_input((3, 5), torch.float64, device, seed=19)
    tangent = make_input((3, 5), torch.float64, device, seed=20)
    message = f"softmax_ops.{op}: forward-mode AD and torch.func.grad"
    with forward_ad.dual_level(), pytest.raises(RuntimeError, match=message):
        forward(forward_ad.make_dual(x, tangent))
    with pytest.raises(RuntimeError, match=message):
        torch.func.jvp(forward, (x,), (tangent,))
    with pytest.raises(RuntimeError, match=message):
        torch.func.jacfwd(forward)(x[0])
    with pytest.raises(RuntimeError, match=message):
        torch.func.jvp(torch.func.vmap(forward), (x[None],), (tangent[None],))
    with pytest.raises(RuntimeError, match=message):
        torch.func.grad(lambda t: forward(t).sum())(x)
    # Reverse mode inside forward mode: the tangent check alone let these reach torch's unrelated error.
    with pytest.raises(RuntimeError, match=message):
        torch.func.hessian(lambda t: forward(t).sum())(x[0])
    with pytest.raises(RuntimeError, match=message):
        torch.func.jvp(torch.func.grad(lambda t: forward(t).sum()), (x,), (tangent,))
    with forward_ad.dual_level(), pytest.raises(RuntimeError, match=message):
        torch.func.grad(lambda t: forward(t).sum())(x)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("requires_grad", [False, True])
@pytest.mark.parametrize("op", ["softmax", "log_softmax", "fused_topk", "softmax_backward",
                                "log_softmax_backward", "fused_topk_backward"])
def test_direct_op_calls_refuse_dual_tensors(op, requires_grad, device):
    # Below the public wrappers: torch.ops.softmax_ops.* on a dual tensor returned a result whose tangent was
    # silently missing (None).
    from torch.autograd import forward_ad

    x = make_input((3, 5), torch.float64, device, seed=22)
    values, indices = softmax_ops.fused_topk(x, 2)
    y = torch.softmax(x, -1)
    with forward_ad.dual_level():
        dual = forward_ad.make_dual(x.clone().requires_grad_(requires_grad), torch.ones_like(x))
        dual_values = forward_ad.make_dual(values, torch.ones_like(values))
        calls = {
            "softmax": lambda: torch.ops.softmax_ops.softmax(dual, -1, None),
            "log_softmax": lambda: torch.ops.softmax_ops.log_softmax(dual, -1, torch.float32),
            "fused_topk": lambda: torch.ops.softmax_ops.fused_topk(dual, 2, -1, True, None),
            "softmax_backward": lambda: torch.ops.softmax_ops.softmax_backward(dual, y, -1, torch.float64),
            "log_softmax_backward": lambda: torch.ops.softmax_ops.log_softmax_backward(y, dual, -1, torch.float64),
            "fused_topk_backward": lambda: torch.ops.softmax_ops.fused_topk_backward(
                dual_values, x, values, indices, -1, False),
        }
        # The op's autograd kernel refuses (_autograd.refuse_untracked_derivatives) ...
        with pytest.raises(RuntimeError, match=f"softmax_ops.{op}: forward-mode AD and torch.func.grad"):
            calls[op]()
        # ... and below it, the CPU / CUDA kernels still refuse a dual tensor themselves (op_checks.cpp).
        with torch._C._AutoDispatchBelowAutograd(), pytest.raises(
                RuntimeError, match=f"softmax_ops.{op}: forward-mode AD is not supported"):
            calls[op]()
    # Outside the dual level the same tensors are plain again.
    assert torch.equal(torch.ops.softmax_ops.softmax(x, -1, None), softmax_ops.softmax(x, -1))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op", list(PUBLIC_FORWARDS))
def test_inputs_without_a_tangent_run_under_forward_mode_ad(op, device):
    # Only an input that carries a tangent is refused: a constant inside torch.func.jvp has none (its tangent
    # contribution is zero, exactly), and vmap inside a dual level once raised "Batching rule not implemented
    # for aten::_unpack_dual" from the public wrappers' own check.
    from torch.autograd import forward_ad

    forward = PUBLIC_FORWARDS[op]
    reference = {"softmax": lambda t: torch.softmax(t, -1), "log_softmax": lambda t: torch.log_softmax(t, -1),
                 "fused_topk": lambda t: torch.topk(torch.softmax(t, -1), 2).values}[op]
    x = make_input((3, 5), torch.float64, device, seed=25)
    tangent = make_input((3, 5), torch.float64, device, seed=26)
    constant = make_input((3, 5), torch.float64, device, seed=27)
    ours = torch.func.jvp(lambda t: t[..., :2] * forward(constant)[..., :2], (x,), (tangent,))
    expected = torch.func.jvp(lambda t: t[..., :2] * reference(constant)[..., :2], (x,), (tangent,))
    torch.testing.assert_close(ours, expected)
    with forward_ad.dual_level():
        torch.testing.assert_close(torch.func.vmap(forward)(x), reference(x))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op", list(PUBLIC_FORWARDS))
def test_vmap_runs_per_sample(op, device):
    forward = PUBLIC_FORWARDS[op]
    x = make_input((4, 3, 5), torch.float32, device, seed=21)
    batched = torch.func.vmap(forward)(x)  # torch's per-sample fallback: no batching rule (it warns once)
    torch.testing.assert_close(batched, torch.stack([forward(sample) for sample in x]))


# ---------------------------------------------------------------------------------------------- opcheck

def opcheck_samples(device):
    """(op, args) pairs over every op: dims, non-contiguous inputs, dtypes, requires_grad on and off."""
    samples = []
    for dtype in FLOAT_DTYPES:
        for requires_grad in (False, True):
            x = make_input((4, 19), dtype, device, seed=12).requires_grad_(requires_grad)
            x3 = make_input((3, 5, 6), dtype, device, seed=13).requires_grad_(requires_grad)
            xt = make_input((11, 7), dtype, device, seed=14).t().requires_grad_(requires_grad)
            for op in (torch.ops.softmax_ops.softmax, torch.ops.softmax_ops.log_softmax):
                samples += [(op, (x, -1, None)), (op, (x3, 1, None)), (op, (xt, 0, None))]
                if dtype in (torch.float16, torch.bfloat16):
                    samples.append((op, (x, -1, torch.float32)))
            samples += [
                (torch.ops.softmax_ops.fused_topk, (x, 3, -1, False, None)),
                (torch.ops.softmax_ops.fused_topk, (x3, 2, 1, True, None)),
                (torch.ops.softmax_ops.fused_topk, (xt, 7, 1, True, torch.float32)),
            ]
        y = torch.softmax(make_input((4, 19), dtype, device, seed=15), -1)
        g = make_input((4, 19), dtype, device, seed=16)
        samples += [
            (torch.ops.softmax_ops.softmax_backward, (g, y, -1, dtype)),
            (torch.ops.softmax_ops.log_softmax_backward, (g, y.log(), -1, dtype)),
        ]
        x = make_input((4, 19), dtype, device, seed=17)
        values, indices = torch.ops.softmax_ops.fused_topk(x, 3, -1, False, None)
        samples.append(
            (torch.ops.softmax_ops.fused_topk_backward, (torch.ones_like(values), x, values, indices, -1, False))
        )
    return samples


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck_every_op(device):
    samples = opcheck_samples(device)
    checked_ops = {op for op, _ in samples}
    assert len(checked_ops) == 6
    for op, args in samples:
        torch.library.opcheck(op, args)


# ---------------------------------------------------------------------------------------------- bad input

@pytest.mark.parametrize("device", DEVICES)
def test_bad_inputs_raise_clear_errors(device):
    x = torch.randn(4, 8, device=device)
    # Unsupported dtypes: NotImplementedError (a RuntimeError), the class torch's own softmax raises.
    with pytest.raises(NotImplementedError, match="self must be float"):
        softmax_ops.softmax(torch.arange(8, device=device), -1)
    with pytest.raises(NotImplementedError, match="dtype must be float"):
        softmax_ops.softmax(x, -1, dtype=torch.int32)
    with pytest.raises(IndexError, match="dim"):
        softmax_ops.log_softmax(x, 2)
    with pytest.raises(IndexError, match="dim"):
        softmax_ops.fused_topk(x, 2, -3)
    with pytest.raises(ValueError, match="k"):
        softmax_ops.fused_topk(x, 0)
    with pytest.raises(ValueError, match="k"):
        softmax_ops.fused_topk(x, 9)
    with pytest.raises(NotImplementedError, match="self must be float"):
        softmax_ops.fused_topk(torch.ones(4, 8, dtype=torch.int64, device=device), 2)
    y = torch.softmax(x, -1)
    with pytest.raises(ValueError, match="grad_output shape"):
        torch.ops.softmax_ops.softmax_backward(torch.ones(4, 7, device=device), y, -1, torch.float32)
    with pytest.raises(ValueError, match="grad_output shape"):
        torch.ops.softmax_ops.log_softmax_backward(torch.ones(3, 8, device=device), y, -1, torch.float32)
    values, indices = softmax_ops.fused_topk(x, 3)
    with pytest.raises(ValueError, match="grad_values"):
        torch.ops.softmax_ops.fused_topk_backward(torch.ones(4, 2, device=device), x, values, indices, -1, False)
    x.requires_grad_(True)
    with pytest.raises(RuntimeError, match="grad"):
        softmax_ops.softmax(x, -1).backward(torch.ones(4, 7, device=device))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("in_dtype", [torch.int64, torch.int32, torch.uint8, torch.bool])
def test_integer_and_bool_inputs_with_a_float_dtype_match_torch(in_dtype, device):
    # torch casts the input to dtype= first, so torch.softmax(ints, dim, dtype=torch.float32) works.
    x = (torch.arange(24, device=device).reshape(4, 6) % 5).to(in_dtype)
    for ours, theirs in [(softmax_ops.softmax, torch.softmax), (softmax_ops.log_softmax, torch.log_softmax)]:
        for dtype in (torch.float32, torch.float64):
            torch.testing.assert_close(ours(x, -1, dtype=dtype), theirs(x, -1, dtype=dtype))
    values, indices = softmax_ops.fused_topk(x, 2, dtype=torch.float32)
    expected = torch.topk(torch.softmax(x, -1, dtype=torch.float32), 2)
    torch.testing.assert_close(values, expected.values)
    # Rows of x tie (x % 5 repeats); the contract's order among equal logits is the lower index first.
    reference = torch.sort(x.to(torch.float64), dim=-1, descending=True, stable=True).indices[:, :2]
    assert torch.equal(indices, reference)
    with pytest.raises(NotImplementedError, match="self must be float"):
        softmax_ops.softmax(x, -1)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("in_dtype", [torch.complex64, torch.float8_e4m3fn, torch.float8_e5m2])
@pytest.mark.filterwarnings("ignore:Casting complex values to real discards the imaginary part")
def test_complex_and_float8_inputs_with_a_float_dtype_match_torch(in_dtype, device):
    # torch casts any of these to dtype= first (a complex input to its real part, with a warning); the ops
    # refused them with NotImplementedError where torch returned a result.
    x = torch.randn(4, 6, generator=torch.Generator().manual_seed(28)).to(in_dtype).to(device)
    for ours, theirs in [(softmax_ops.softmax, torch.softmax), (softmax_ops.log_softmax, torch.log_softmax)]:
        for dtype in (torch.float32, torch.bfloat16):
            torch.testing.assert_close(ours(x, -1, dtype=dtype), theirs(x, -1, dtype=dtype))
            fake = ours(x.to("meta"), -1, dtype=dtype)
            assert fake.dtype == dtype and fake.shape == x.shape
    values, indices = softmax_ops.fused_topk(x, 2, dtype=torch.float32)
    expected = torch.topk(torch.softmax(x, -1, dtype=torch.float32), 2).values
    torch.testing.assert_close(values, expected)
    torch.testing.assert_close(torch.softmax(x.to(torch.float32), -1).gather(-1, indices), values)
    # Gradients: computed in the result dtype, then cast back to the input's dtype, as torch's autograd does
    # (within one rounding step of that dtype: the float32 gradients may differ in their last bits).
    weights = torch.randn(4, 6, generator=torch.Generator().manual_seed(29)).to(device)
    rtol = {torch.complex64: 1.3e-6, torch.float8_e4m3fn: 0.125, torch.float8_e5m2: 0.25}[in_dtype]
    pairs = [(lambda t: softmax_ops.softmax(t, -1, dtype=torch.float32),
              lambda t: torch.softmax(t, -1, dtype=torch.float32)),
             (lambda t: softmax_ops.log_softmax(t, -1, dtype=torch.float32),
              lambda t: torch.log_softmax(t, -1, dtype=torch.float32)),
             (lambda t: softmax_ops.fused_topk(t, 2, dtype=torch.float32)[0],
              lambda t: torch.topk(torch.softmax(t, -1, dtype=torch.float32), 2).values)]
    for ours, theirs in pairs:
        grads = []
        for forward in (ours, theirs):
            leaf = x.detach().requires_grad_()
            out = forward(leaf)
            (out * weights[:, : out.shape[-1]]).sum().backward()
            grads.append(leaf.grad)
        assert grads[0].dtype == grads[1].dtype == in_dtype
        torch.testing.assert_close(grads[0].to(torch.complex128), grads[1].to(torch.complex128), rtol=rtol,
                                   atol=1e-6)


@pytest.mark.parametrize("device", DEVICES + ["meta"])
@pytest.mark.parametrize("case", ["integer self", "integer dtype", "complex self", "integer backward",
                                  "integer values"])
def test_unsupported_dtypes_raise_the_error_class_torch_raises(case, device):
    """torch raises NotImplementedError ("not implemented for 'Long'") for a softmax of an unsupported dtype;
    the real ops and the fake implementations (device "meta", what torch.compile traces with) raise the same
    class, so code catching torch's error (or RuntimeError, its base) catches ours."""
    floats = torch.randn(4, 8, device=device)
    calls = {
        "integer self": (lambda: torch.softmax(torch.arange(8, device=device), -1),
                         lambda: softmax_ops.softmax(torch.arange(8, device=device), -1)),
        "integer dtype": (lambda: torch.log_softmax(floats, -1, dtype=torch.int32),
                          lambda: softmax_ops.log_softmax(floats, -1, dtype=torch.int32)),
        "complex self": (lambda: torch.softmax(floats.to(torch.complex64), -1),
                         lambda: softmax_ops.fused_topk(floats.to(torch.complex64), 2)),
        "integer backward": (None,
                             lambda: torch.ops.softmax_ops.softmax_backward(floats, floats, -1, torch.int64)),
        # The values' dtype was not checked: a message without the argument's name, and nothing on meta.
        "integer values": (None, lambda: torch.ops.softmax_ops.fused_topk_backward(
            floats[:, :2], floats, floats[:, :2].long(), torch.zeros(4, 2, dtype=torch.long, device=device), -1,
            False)),
    }
    theirs, ours = calls[case]
    if theirs is not None and device != "meta":
        with pytest.raises(NotImplementedError):
            theirs()
    with pytest.raises(NotImplementedError, match="softmax_ops.*(self|dtype|values) must be"):
        ours()


BAD_CALLS = {
    # name: (expected class, call on tensors of the given device)
    "backward shape": (ValueError, lambda d: torch.ops.softmax_ops.softmax_backward(
        torch.ones(4, 7, device=d), torch.ones(4, 8, device=d), -1, torch.float32)),
    "dtype before dim": (NotImplementedError, lambda d: torch.ops.softmax_ops.log_softmax(
        torch.ones(4, 8, dtype=torch.long, device=d), 5, None)),
    "topk backward dim before indices dtype": (IndexError, lambda d: torch.ops.softmax_ops.fused_topk_backward(
        torch.ones(4, 2, device=d), torch.ones(4, 8, device=d), torch.ones(4, 2, device=d),
        torch.zeros(4, 2, dtype=torch.int32, device=d), 3, False)),
    "topk backward shapes": (ValueError, lambda d: torch.ops.softmax_ops.fused_topk_backward(
        torch.ones(4, 3, device=d), torch.ones(4, 8, device=d), torch.ones(4, 2, device=d),
        torch.zeros(4, 2, dtype=torch.long, device=d), -1, False)),
}


@pytest.mark.parametrize("device", DEVICES + ["meta"])
@pytest.mark.parametrize("case", list(BAD_CALLS))
def test_fake_impls_raise_what_the_real_ops_raise(case, device):
    # torch.compile traces with the fake impls (device "meta" runs them): the same bad call must raise the same
    # class there as on a real device, checks in the same order (they differed: found by review, session 24).
    expected, call = BAD_CALLS[case]
    with pytest.raises(expected, match="softmax_ops"):
        call(device)


def test_backward_ops_refuse_a_meta_tensor_beside_a_real_one():
    # The fake impl ran for the meta tensor and returned an uninitialised CPU tensor; torch raises.
    y = torch.softmax(torch.randn(4, 8), -1)
    grad = torch.ones(4, 8, device="meta")
    for op in (torch.ops.softmax_ops.softmax_backward, torch.ops.softmax_ops.log_softmax_backward):
        with pytest.raises(RuntimeError, match="grad_output and output must be on the same device"):
            op(grad, y, -1, torch.float32)
    x = torch.randn(4, 8)
    values, indices = softmax_ops.fused_topk(x, 3)
    with pytest.raises(RuntimeError, match="must be on the same device"):
        torch.ops.softmax_ops.fused_topk_backward(torch.ones(4, 3, device="meta"), x, values, indices, -1, False)


def test_fake_topk_backward_checks_indices_against_self():
    # The fake impl states the same shape rule as the real op, so torch.compile fails at trace time, not later.
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        x = torch.empty(4, 8)
        good = torch.empty(4, 3)
        indices = torch.empty(4, 3, dtype=torch.int64)
        assert torch.ops.softmax_ops.fused_topk_backward(good, x, good, indices, -1, False).shape == x.shape
        wrong = torch.empty(5, 3)
        with pytest.raises(ValueError, match="indices shape"):  # the real op's TORCH_CHECK_VALUE
            torch.ops.softmax_ops.fused_topk_backward(
                wrong, x, wrong, torch.empty(5, 3, dtype=torch.int64), -1, False
            )


@requires_cuda
def test_mixed_devices_raise():
    y = torch.softmax(torch.randn(4, 8, device="cuda"), -1)
    with pytest.raises(RuntimeError, match="same device"):
        torch.ops.softmax_ops.softmax_backward(torch.ones(4, 8), y, -1, torch.float32)
    x = torch.randn(4, 8, device="cuda")
    values, indices = softmax_ops.fused_topk(x, 3)
    with pytest.raises(RuntimeError, match="device"):
        torch.ops.softmax_ops.fused_topk_backward(torch.ones(4, 3), x, values, indices, -1, False)


def test_cuda_presence_is_consistent_with_build():
    # In a CPU-only build the kernel menu is empty; with CUDA compiled, every family lists kernels.
    families = {family: softmax_ops.list_kernels(family) for family in softmax_ops.kernels.FAMILIES}
    if HAS_CUDA:
        assert all(families.values()), families
    assert isinstance(softmax_ops.explain((4, 4096), torch.float16), str)
