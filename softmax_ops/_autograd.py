"""Autograd formulas for the forward ops, each expressed as another registered op (so torch.compile and
AOTAutograd see a single backward op rather than a decomposition)."""

from __future__ import annotations

import torch


def _softmax_setup(ctx, inputs, output) -> None:
    x, dim, _dtype = inputs
    ctx.dim = dim
    ctx.input_dtype = x.dtype
    ctx.save_for_backward(output)


def _softmax_backward(ctx, grad_output):
    (output,) = ctx.saved_tensors
    grad = torch.ops.softmax_ops.softmax_backward.default(grad_output, output, ctx.dim, ctx.input_dtype)
    return grad, None, None


def _log_softmax_backward(ctx, grad_output):
    (output,) = ctx.saved_tensors
    grad = torch.ops.softmax_ops.log_softmax_backward.default(grad_output, output, ctx.dim, ctx.input_dtype)
    return grad, None, None


def _fused_topk_setup(ctx, inputs, output) -> None:
    x, _k, dim, renormalize, _dtype = inputs
    values, indices = output
    ctx.dim = dim
    ctx.renormalize = renormalize
    # A private copy of the values (k per row): callers write into returned router weights in place (a scale,
    # a renormalisation with an epsilon), which torch's topk allows, since it saves only its indices.
    ctx.save_for_backward(x, values.detach().clone(), indices)


def _fused_topk_backward(ctx, grad_values, _grad_indices):
    x, values, indices = ctx.saved_tensors
    grad = torch.ops.softmax_ops.fused_topk_backward.default(
        grad_values, x, values, indices, ctx.dim, ctx.renormalize
    )
    return grad, None, None, None, None


def _no_double_backward(op: str):
    """An autograd formula for a backward op that refuses to be differentiated. Without one, torch's fallback
    for ops with no autograd kernel only warns and returns a wrong (incomplete) second derivative."""

    def backward(ctx, *grads):
        raise RuntimeError(
            f"softmax_ops.{op}: double backward is not supported (the gradient of a softmax_ops gradient); "
            "use torch.softmax / torch.log_softmax / torch.topk for higher-order derivatives"
        )

    return backward


def _nothing_to_save(ctx, inputs, output) -> None:
    pass


def register() -> None:
    """Attach the backward formulas to softmax, log_softmax and fused_topk, and make differentiating their
    backward ops (double backward) raise instead of silently giving a wrong result."""
    torch.library.register_autograd(
        "softmax_ops::softmax", _softmax_backward, setup_context=_softmax_setup
    )
    torch.library.register_autograd(
        "softmax_ops::log_softmax", _log_softmax_backward, setup_context=_softmax_setup
    )
    torch.library.register_autograd(
        "softmax_ops::fused_topk", _fused_topk_backward, setup_context=_fused_topk_setup
    )
    for op in ("softmax_backward", "log_softmax_backward", "fused_topk_backward"):
        torch.library.register_autograd(
            f"softmax_ops::{op}", _no_double_backward(op), setup_context=_nothing_to_save
        )
