"""Typed public wrappers over the `torch.ops.softmax_ops` ops."""

from __future__ import annotations

import torch

# The dtypes the kernels read and write (inputs of other dtypes reach them cast by dtype=, as in torch).
SUPPORTED_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)

# Python's scalar types stand for these dtypes wherever torch takes a dtype (torch.softmax(x, 0, dtype=float) is
# float64); the op schemas take torch.dtype only.
_PYTHON_TYPE_DTYPES = {float: torch.float64, int: torch.int64, bool: torch.bool, complex: torch.complex128}


def as_dtype(dtype: torch.dtype | type | None) -> torch.dtype | None:
    """``dtype`` as a torch.dtype where it is one of Python's scalar types (float -> torch.float64)."""
    return _PYTHON_TYPE_DTYPES.get(dtype, dtype) if isinstance(dtype, type) else dtype


def softmax(x: torch.Tensor, dim: int = -1, dtype: torch.dtype | type | None = None) -> torch.Tensor:
    """Softmax of ``x`` along ``dim``, with exactly ``torch.softmax``'s semantics.

    With ``dtype`` the input is cast to ``dtype`` first and the result has that dtype (float16/bfloat16
    input with ``dtype=torch.float32`` is read directly, with no extra pass); Python's ``float`` means
    ``torch.float64``, as in torch. Differentiable, twice.

    Example:
        >>> import torch, softmax_ops
        >>> x = torch.tensor([[1.0, 2.0, 3.0]])
        >>> softmax_ops.softmax(x, dim=-1)
        tensor([[0.0900, 0.2447, 0.6652]])
    """
    return torch.ops.softmax_ops.softmax.default(x, dim, as_dtype(dtype))


def log_softmax(x: torch.Tensor, dim: int = -1, dtype: torch.dtype | type | None = None) -> torch.Tensor:
    """Log-softmax of ``x`` along ``dim``, with exactly ``torch.log_softmax``'s semantics. Differentiable, twice.

    Example:
        >>> import torch, softmax_ops
        >>> softmax_ops.log_softmax(torch.tensor([0.0, 0.0]), dim=0)
        tensor([-0.6931, -0.6931])
    """
    return torch.ops.softmax_ops.log_softmax.default(x, dim, as_dtype(dtype))


def fused_topk(
    x: torch.Tensor,
    k: int,
    dim: int = -1,
    renormalize: bool = False,
    dtype: torch.dtype | type | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``k`` largest softmax probabilities of ``x`` along ``dim`` and their indices, in one pass.

    ``values`` equals ``torch.topk(torch.softmax(x, dim, dtype=dtype), k, dim).values`` (sorted
    descending); with ``renormalize=True`` they are divided by their sum, i.e. the softmax over the k
    selected logits (the MoE-router form). ``indices`` are int64, distinct and in ``[0, N)`` for any input,
    NaN and inf included. Differentiable w.r.t. ``x``.

    Order: by logit, i.e. by probability before it is rounded to the result dtype; equal logits go to the lower
    index. Where distinct logits give probabilities that round (or underflow) to the same value, the larger
    logit comes first, while ``torch.topk`` of the rounded probabilities orders those ties its own way (it
    promises no order among equal values), so the indices can differ there. With float16 / bfloat16 results
    such ties are common (the torch.compile pass therefore leaves ``topk(softmax(x))`` with 16-bit
    probabilities alone).

    Example:
        >>> import torch, softmax_ops
        >>> values, indices = softmax_ops.fused_topk(torch.tensor([[1.0, 3.0, 2.0]]), k=2)
        >>> indices
        tensor([[1, 2]])
        >>> softmax_ops.fused_topk(torch.tensor([[1.0, 3.0, 2.0]]), k=2, renormalize=True)[0]
        tensor([[0.7311, 0.2689]])
    """
    return torch.ops.softmax_ops.fused_topk.default(x, k, dim, renormalize, as_dtype(dtype))
