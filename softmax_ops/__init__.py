"""softmax_ops: softmax, log_softmax and fused softmax->top-k at memory-bandwidth speed.

``import softmax_ops`` builds (once) and loads the C++/CUDA extension, registers the ops' fake
implementations and autograd formulas, and enables the torch.compile pass.
"""

from __future__ import annotations

__version__ = "0.1.0"

from softmax_ops._build import load_extension as _load_extension
from softmax_ops._build import import_meta as _import_meta

_load_extension()
meta = _import_meta()  # registers the fake implementations

from softmax_ops import _autograd  # noqa: E402
from softmax_ops.compile_pass import compile_report, disable, enable, is_enabled, reset_compile_report
from softmax_ops.compile_pass import disabled_by_environment as _disabled_by_environment
from softmax_ops.kernels import (  # noqa: E402
    apply_env_overrides as _apply_env_overrides,
    explain,
    force_kernel,
    get_kernel,
    list_kernels,
    set_kernel,
)
from softmax_ops.ops import fused_topk, log_softmax, softmax  # noqa: E402

_autograd.register()
_apply_env_overrides()
if not _disabled_by_environment():
    enable()

__all__ = [
    "softmax",
    "log_softmax",
    "fused_topk",
    "explain",
    "force_kernel",
    "set_kernel",
    "get_kernel",
    "list_kernels",
    "enable",
    "disable",
    "is_enabled",
    "compile_report",
    "reset_compile_report",
]
