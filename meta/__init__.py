"""Fake (meta) implementations of every softmax_ops op: shapes, dtypes, strides and errors only.

torch.compile traces with these, and opcheck compares them with the real kernels. They state the output
contract (always a contiguous tensor of the stated shape); they never re-derive launch logic.
"""

from __future__ import annotations

import torch

from softmax_ops.ops import SUPPORTED_DTYPES as _FLOATS

# Inputs that a float dtype= casts first, as torch does (op_checks.cpp: softmax_result_dtype): c10's
# isIntegralType with bool, and isFloat8Type; complex dtypes too.
_INTEGRAL = (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.bool) + tuple(
    getattr(torch, name) for name in ("uint16", "uint32", "uint64") if hasattr(torch, name))
_FLOAT8 = tuple(getattr(torch, name) for name in ("float8_e5m2", "float8_e5m2fnuz", "float8_e4m3fn",
                                                  "float8_e4m3fnuz", "float8_e8m0fnu") if hasattr(torch, name))


def _check_float(t: torch.Tensor, op: str, arg: str) -> None:
    # NotImplementedError, as the real ops and torch's own softmax raise for an unsupported dtype.
    torch._check_not_implemented(
        t.dtype in _FLOATS,
        lambda: f"softmax_ops.{op}: {arg} must be float32, float16, bfloat16 or float64, got {t.dtype}",
    )


def _wrap_dim(x: torch.Tensor, dim: int, op: str) -> int:
    ndim = max(x.dim(), 1)
    if not -ndim <= dim < ndim:
        raise IndexError(
            f"softmax_ops.{op}: dim (got {dim}) is out of range for a tensor with {x.dim()} dimensions "
            f"(expected in [{-ndim}, {ndim - 1}])"
        )
    return dim % ndim


def _result_dtype(x: torch.Tensor, dtype: torch.dtype | None, op: str) -> torch.dtype:
    if dtype is None:
        _check_float(x, op, "self")
        return x.dtype
    torch._check_not_implemented(
        dtype in _FLOATS,
        lambda: f"softmax_ops.{op}: dtype must be float32, float16, bfloat16 or float64, got {dtype}",
    )
    # The input is cast to dtype first (as torch does), so integer, bool, complex and float8 inputs are fine.
    torch._check_not_implemented(
        x.dtype in _FLOATS or x.dtype in _INTEGRAL or x.dtype in _FLOAT8 or x.dtype.is_complex,
        lambda: f"softmax_ops.{op}: self must be float32, float16, bfloat16 or float64 (or an integer, bool, "
        f"complex or float8 tensor with a float dtype=), got {x.dtype}",
    )
    return dtype


def _check_same_device(op: str, **tensors: torch.Tensor) -> None:
    """The real ops refuse tensors on different devices; without this a meta tensor beside a CPU one returned
    an uninitialised CPU tensor, and fake tracing let a CUDA grad meet a CPU output."""
    devices = {name: t.device for name, t in tensors.items()}
    torch._check(
        len(set(devices.values())) == 1,
        lambda: f"softmax_ops.{op}: {' and '.join(devices)} must be on the same device, got "
        f"{' and '.join(str(d) for d in devices.values())}",
    )


@torch.library.register_fake("softmax_ops::softmax")
def softmax_fake(x: torch.Tensor, dim: int, dtype: torch.dtype | None = None) -> torch.Tensor:
    result_dtype = _result_dtype(x, dtype, "softmax")  # dtype first, then dim: the real ops' order
    _wrap_dim(x, dim, "softmax")
    return x.new_empty(x.shape, dtype=result_dtype)


@torch.library.register_fake("softmax_ops::log_softmax")
def log_softmax_fake(x: torch.Tensor, dim: int, dtype: torch.dtype | None = None) -> torch.Tensor:
    result_dtype = _result_dtype(x, dtype, "log_softmax")  # dtype first, then dim: the real ops' order
    _wrap_dim(x, dim, "log_softmax")
    return x.new_empty(x.shape, dtype=result_dtype)


def _backward_fake(
    grad_output: torch.Tensor, output: torch.Tensor, dim: int, input_dtype: torch.dtype, op: str
) -> torch.Tensor:
    # The real ops' order and error classes (op_checks.cpp): dtypes, device, then shape (ValueError).
    _check_float(grad_output, op, "grad_output")
    _check_float(output, op, "output")
    torch._check_not_implemented(
        input_dtype in _FLOATS,
        lambda: f"softmax_ops.{op}: input_dtype must be float32, float16, bfloat16 or float64",
    )
    _check_same_device(op, grad_output=grad_output, output=output)
    torch._check_value(
        grad_output.shape == output.shape,
        lambda: f"softmax_ops.{op}: grad_output shape {tuple(grad_output.shape)} must equal output shape "
        f"{tuple(output.shape)}",
    )
    _wrap_dim(output, dim, op)
    return output.new_empty(output.shape, dtype=input_dtype)


@torch.library.register_fake("softmax_ops::softmax_backward")
def softmax_backward_fake(
    grad_output: torch.Tensor, output: torch.Tensor, dim: int, input_dtype: torch.dtype
) -> torch.Tensor:
    return _backward_fake(grad_output, output, dim, input_dtype, "softmax_backward")


@torch.library.register_fake("softmax_ops::log_softmax_backward")
def log_softmax_backward_fake(
    grad_output: torch.Tensor, output: torch.Tensor, dim: int, input_dtype: torch.dtype
) -> torch.Tensor:
    return _backward_fake(grad_output, output, dim, input_dtype, "log_softmax_backward")


def _topk_shape(x: torch.Tensor, dim: int, k: int) -> list:
    shape = list(x.shape)
    if shape:
        shape[dim] = k
    return shape


@torch.library.register_fake("softmax_ops::fused_topk")
def fused_topk_fake(
    x: torch.Tensor, k: int, dim: int = -1, renormalize: bool = False, dtype: torch.dtype | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    result_dtype = _result_dtype(x, dtype, "fused_topk")
    wrapped = _wrap_dim(x, dim, "fused_topk")
    n = x.shape[wrapped] if x.dim() > 0 else 1
    torch._check_value(
        1 <= k <= n,
        lambda: f"softmax_ops.fused_topk: k (got {k}) must be in [1, N] where N = {n} is the size of dim "
        f"{wrapped}",
    )
    shape = _topk_shape(x, wrapped, k)
    return x.new_empty(shape, dtype=result_dtype), x.new_empty(shape, dtype=torch.int64)


@torch.library.register_fake("softmax_ops::fused_topk_backward")
def fused_topk_backward_fake(
    grad_values: torch.Tensor,
    x: torch.Tensor,
    values: torch.Tensor,
    indices: torch.Tensor,
    dim: int,
    renormalize: bool,
) -> torch.Tensor:
    # The real ops' order and error classes (op_checks.cpp): dtypes of self and grad_values, dim, the other
    # dtypes, devices, then shapes (ValueError).
    _check_float(x, "fused_topk_backward", "self")
    _check_float(grad_values, "fused_topk_backward", "grad_values")
    wrapped = _wrap_dim(x, dim, "fused_topk_backward")
    _check_float(values, "fused_topk_backward", "values")
    torch._check(
        indices.dtype == torch.int64,
        lambda: f"softmax_ops.fused_topk_backward: indices must be int64, got {indices.dtype}",
    )
    _check_same_device("fused_topk_backward", grad_values=grad_values, self=x, values=values, indices=indices)
    torch._check_value(
        grad_values.shape == indices.shape and values.shape == indices.shape,
        lambda: "softmax_ops.fused_topk_backward: grad_values, values and indices must have the same shape",
    )
    k = indices.shape[wrapped] if indices.dim() > 0 else 1
    torch._check_value(
        list(indices.shape) == _topk_shape(x, wrapped, k),
        lambda: f"softmax_ops.fused_topk_backward: indices shape {list(indices.shape)} does not match self shape "
        f"{list(x.shape)} with dim {wrapped} of size k",
    )
    return x.new_empty(x.shape)
