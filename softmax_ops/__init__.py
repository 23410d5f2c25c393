"""softmax_ops: softmax, log_softmax and fused softmax->top-k at memory-bandwidth speed.

``import softmax_ops`` builds (once) and loads the C++/CUDA extension, registers the ops' fake
implementations and autograd formulas, and enables the torch.compile pass.
"""

from __future__ import annotations

__version__ = "0.1.0"

from softmax_ops._build import import_meta as _import_meta
from softmax_ops._build import load_extension as _load_extension

_load_extension()
meta = _import_meta()  # registers the fake implementations

from softmax_ops import _autograd
from softmax_ops.compile_pass import compile_report, disable, enable, is_enabled, reset_compile_report
from softmax_ops.compile_pass import disabled_by_environment as _disabled_by_environment
from softmax_ops.kernels import (
    apply_env_overrides as _apply_env_overrides,
)
from softmax_ops.kernels import (
    explain,
    force_kernel,
    get_kernel,
    list_kernels,
    set_kernel,
)
from softmax_ops.ops import fused_topk, log_softmax, softmax

_autograd.register()
_apply_env_overrides()
if not _disabled_by_environment():
    enable()

__all__ = [
    "compile_report",
    "disable",
    "enable",
    "explain",
    "force_kernel",
    "fused_topk",
    "get_kernel",
    "is_enabled",
    "list_kernels",
    "log_softmax",
    "reset_compile_report",
    "set_kernel",
    "softmax",
]
