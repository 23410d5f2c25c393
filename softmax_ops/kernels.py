"""The CUDA kernel menu from Python: force a kernel (for tests and benchmarks) and explain the choice.

Families: ``softmax`` (softmax/log_softmax forward), ``softmax_backward``, ``topk`` (fused_topk forward),
``topk_backward``. ``SOFTMAX_OPS_FORCE_KERNEL="softmax=two_pass,topk=warp"`` sets overrides at import.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Sequence

import torch

FAMILIES = ("softmax", "softmax_backward", "topk", "topk_backward")


def list_kernels(family: str) -> list[str]:
    """Names of the kernels in ``family`` (empty in a CPU-only build).

    Example:
        >>> import softmax_ops
        >>> isinstance(softmax_ops.list_kernels("softmax"), list)
        True
    """
    return list(torch.ops.softmax_ops._list_kernels(family))


def set_kernel(family: str, kernel: str | None) -> None:
    """Force ``kernel`` for every op of ``family`` from now on (``None`` restores automatic choice).

    A forced kernel that cannot handle a shape raises rather than running something else.
    """
    torch.ops.softmax_ops._set_kernel_override(family, kernel or "")


def get_kernel(family: str) -> str | None:
    """The kernel forced for ``family``, or None when the dispatcher chooses."""
    return torch.ops.softmax_ops._get_kernel_override(family) or None


@contextlib.contextmanager
def force_kernel(family: str, kernel: str) -> Iterator[None]:
    """Context manager: run ``family``'s ops with ``kernel`` inside the block, then restore.

    Example:
        >>> import softmax_ops
        >>> kernels = softmax_ops.list_kernels("softmax")
        >>> if kernels:
        ...     with softmax_ops.force_kernel("softmax", kernels[0]):
        ...         pass
    """
    previous = get_kernel(family)
    set_kernel(family, kernel)
    try:
        yield
    finally:
        set_kernel(family, previous)


def explain(shape: Sequence[int], dtype: torch.dtype = torch.float32, op: str = "softmax", dim: int = -1,
            k: int = 0, out_dtype: torch.dtype | None = None) -> str:
    """Which kernel runs ``op`` on a CUDA tensor of ``shape`` and ``dtype`` on the current device, and why.

    ``out_dtype`` is the result's dtype where it differs: ``dtype=`` of softmax / log_softmax / fused_topk (the
    kernels read a float16 / bfloat16 input directly for a float32 result and cast any other input to it first,
    as torch does), ``input_dtype`` of the softmax backward ops (``dtype`` is then grad_output's and output's),
    the forward's ``dtype=`` for fused_topk_backward (``dtype`` is self's).

    Example:
        >>> import torch, softmax_ops
        >>> isinstance(softmax_ops.explain((4096, 4096), torch.float16), str)
        True
        >>> isinstance(softmax_ops.explain((8192, 32000), torch.bfloat16, op="log_softmax",
        ...                                out_dtype=torch.float32), str)
        True
    """
    return torch.ops.softmax_ops._explain(op, list(shape), dim, dtype, k, out_dtype)


def apply_env_overrides() -> None:
    """Apply ``SOFTMAX_OPS_FORCE_KERNEL`` (comma-separated ``family=kernel`` pairs)."""
    spec = os.environ.get("SOFTMAX_OPS_FORCE_KERNEL", "").strip()
    for item in filter(None, (part.strip() for part in spec.split(","))):
        family, sep, kernel = item.partition("=")
        if not sep:
            raise ValueError(f"SOFTMAX_OPS_FORCE_KERNEL: expected family=kernel, got {item!r}")
        set_kernel(family.strip(), kernel.strip())
