"""Shared test helpers: devices, dtypes, the float64 reference tolerance rule."""

from __future__ import annotations

import pytest
import torch

import softmax_ops  # noqa: F401  (builds/loads the extension once for the whole session)

HAS_CUDA = torch.cuda.is_available()
DEVICES = ["cpu", "cuda"] if HAS_CUDA else ["cpu"]
FLOAT_DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64]

requires_cuda = pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")

# Floor per dtype (relative to the largest reference magnitude, at least 1), added to the "2x torch's own
# error" bound: when torch's own error happens to be 0 on a tiny sample, one rounding step must still pass.
_ABS_FLOOR = {
    torch.float64: 1e-12,
    torch.float32: 2e-7,
    torch.float16: 1e-3,
    torch.bfloat16: 8e-3,
}


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
