"""Shared test helpers: devices, dtypes, the float64 reference tolerance rule."""

from __future__ import annotations

import contextlib

import pytest
import torch

import softmax_ops  # builds/loads the extension once for the whole session

HAS_CUDA = torch.cuda.is_available()
DEVICES = ["cpu", "cuda"] if HAS_CUDA else ["cpu"]
FLOAT_DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64]

requires_cuda = pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")


@pytest.fixture
def torch_config():
    """``set(config_module, name, value)`` for torch's config modules (``torch._inductor.config``,
    ``torch._functorch.config``): each call is torch's own ``module.patch``, undone after the test.

    Not pytest's ``monkeypatch.setattr``: since pytest 9 it takes the old value from the object's ``__dict__``,
    where a config module keeps none, and so undoes the patch by deleting the attribute -- which hides that
    config entry ("does not exist") for the rest of the process.
    """
    with contextlib.ExitStack() as patches:
        # Keyword form: patch(name, None) would read a None value as "no value given".
        yield lambda module, name, value: patches.enter_context(module.patch(**{name: value}))


# Floor per dtype (relative to the largest reference magnitude, at least 1), added to the "2x torch's own
# error" bound: when torch's own error happens to be 0 on a tiny sample, one rounding step must still pass.
_ABS_FLOOR = {
    torch.float64: 1e-12,
    torch.float32: 2e-7,
    torch.float16: 1e-3,
    torch.bfloat16: 8e-3,
}


def vec16(dtype: torch.dtype) -> int:
    """Elements per 16-byte vector access (the kernels' packs and vectors)."""
    return 16 // torch.empty((), dtype=dtype).element_size()


def whole_warps(threads: int) -> int:
    """`threads` rounded up to whole warps of 32: a block plan's CTA size."""
    return -(-threads // 32) * 32


# Block kernel limits (csrc/softmax/softmax_launch.h, softmax_dispatch.cpp) the softmax size rules derive from.
BLOCK_MAX_THREADS = 1024
SMEM_RESERVE = 2048  # per CTA: static shared memory + the driver's reserve
HOPPER_SMEM_OPTIN = 227 * 1024  # opt-in shared memory per block on H100 / H200 (explain's assumed GPU)


def max_block_reg_packs(dtype: torch.dtype, backward: bool) -> int:
    """Mirror of max_block_reg_packs in softmax_launch.h."""
    if dtype == torch.float64:
        return 1
    narrow = dtype in (torch.float16, torch.bfloat16)
    if backward:
        return 2 if narrow else 4
    return 8


def plan_line(shape, dtype: torch.dtype, op: str = "softmax", out_dtype: torch.dtype | None = None) -> str:
    """The "kernel ..." line of softmax_ops.explain: the plan the dispatcher makes."""
    text = softmax_ops.explain(shape, dtype, op=op, out_dtype=out_dtype)
    return next(line for line in text.splitlines() if line.strip().startswith("kernel "))


def register_packs(line: str) -> int:
    """Register packs per thread of a block / cluster / grid plan line (plan_line)."""
    return int(line.split(" pack(s) per thread in registers")[0].rsplit(" ", 1)[1])


def shared_packs(line: str) -> int:
    """Shared-memory packs per thread of a block / cluster / grid plan line (plan_line): "... + N in shared memory"."""
    return int(line.split(" in shared memory")[0].rsplit(" ", 1)[1])


def block_capacity_packs(dtype: torch.dtype, vec: int, backward: bool, smem_optin: int = HOPPER_SMEM_OPTIN) -> int:
    """Packs of one row that the block kernel can cache (1024 threads, registers + all shared memory)."""
    streams = 2 if backward else 1
    pack_bytes = vec * torch.empty((), dtype=dtype).element_size()
    smem_packs = (smem_optin - SMEM_RESERVE) // (BLOCK_MAX_THREADS * pack_bytes * streams)
    return BLOCK_MAX_THREADS * (max_block_reg_packs(dtype, backward) + smem_packs)


def abs_floor(dtype: torch.dtype) -> float:
    """One rounding step at magnitude ~1 for the output dtype."""
    return _ABS_FLOOR[dtype]


def assert_within_2x_torch(ours: torch.Tensor, torch_own: torch.Tensor, reference: torch.Tensor) -> None:
    """DESIGN.md §3 accuracy rule: our max error vs the float64 reference is at most twice torch's own
    (same input, same output dtype) plus one output-dtype rounding step. NaN must match NaN exactly."""
    assert ours.shape == reference.shape, (ours.shape, reference.shape)
    ours64, torch64, ref64 = ours.double().cpu(), torch_own.double().cpu(), reference.double().cpu()
    nan_ref = torch.isnan(ref64)
    assert torch.equal(torch.isnan(ours64), nan_ref), "NaN positions differ from the reference"
    finite = ~nan_ref
    if not finite.any():
        return
    inf_ref = torch.isinf(ref64) & finite
    assert torch.equal(ours64[inf_ref], ref64[inf_ref]), "infinite entries differ from the reference"
    ok = finite & ~inf_ref
    our_err = (ours64[ok] - ref64[ok]).abs().max().item() if ok.any() else 0.0
    torch_err = (torch64[ok] - ref64[ok]).abs().max().item() if ok.any() else 0.0
    scale = max(1.0, ref64[ok].abs().max().item()) if ok.any() else 1.0  # log_softmax values can be large
    bound = 2 * torch_err + abs_floor(ours.dtype) * scale
    assert our_err <= bound, f"max error {our_err:.3e} > bound {bound:.3e} (torch's own error {torch_err:.3e})"


def topk_reference(x: torch.Tensor, k: int, dim: int, renormalize: bool, dtype: torch.dtype | None = None):
    """Independent reference: a stable descending sort of the float64 logits (NaN first, ties to the lower
    index) and the float64 softmax gathered at those indices."""
    cast = x.to(dtype) if dtype is not None else x
    logits = cast.double().cpu()
    indices = torch.sort(logits, dim=dim, descending=True, stable=True).indices.narrow(dim, 0, k)
    values = torch.softmax(logits, dim).gather(dim, indices)
    if renormalize:
        values = values / values.sum(dim, keepdim=True)
    return values, indices
