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
    ctx.save_for_backward(x, values, indices)


def _fused_topk_backward(ctx, grad_values, _grad_indices):
    x, values, indices = ctx.saved_tensors
    grad = torch.ops.softmax_ops.fused_topk_backward.default(
        grad_values, x, values, indices, ctx.dim, ctx.renormalize
    )
    return grad, None, None, None, None


def register() -> None:
    """Attach the backward formulas to softmax, log_softmax and fused_topk."""
    torch.library.register_autograd(
        "softmax_ops::softmax", _softmax_backward, setup_context=_softmax_setup
    )
    torch.library.register_autograd(
        "softmax_ops::log_softmax", _log_softmax_backward, setup_context=_softmax_setup
    )
    torch.library.register_autograd(
        "softmax_ops::fused_topk", _fused_topk_backward, setup_context=_fused_topk_setup
    )
