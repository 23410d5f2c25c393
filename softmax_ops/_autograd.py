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


def _backward_setup(ctx, inputs, output) -> None:
    grad_output, softmax_output, dim, _input_dtype = inputs
    ctx.dim = dim
    ctx.save_for_backward(grad_output, softmax_output)


def _as_work_dtype(*tensors: torch.Tensor) -> list[torch.Tensor]:
    """The tensors in float32 (float64 stays float64): the second derivatives' math, torch ops only, so that
    they are differentiable again."""
    work = torch.promote_types(tensors[1].dtype, torch.float32)
    return [t.to(work) for t in tensors]


def _softmax_backward_backward(ctx, grad_grad_input):
    """Double backward. softmax_backward computes dx = y * (g - sum(g * y)); with h the gradient of dx:
    d/dg = y * (h - sum(h * y)) (softmax_backward of h itself) and d/dy = h * (g - sum(g * y)) - g * sum(h * y),
    which flows on into the forward's output y and from there to x."""
    grad_output, output = ctx.saved_tensors
    g, y, h = _as_work_dtype(grad_output, output, grad_grad_input)
    hy = (h * y).sum(ctx.dim, keepdim=True)
    gy = (g * y).sum(ctx.dim, keepdim=True)
    grad_g = y * (h - hy)
    grad_y = h * (g - gy) - g * hy
    return grad_g.to(grad_output.dtype), grad_y.to(output.dtype), None, None


def _log_softmax_backward_backward(ctx, grad_grad_input):
    """Double backward. log_softmax_backward computes dx = g - exp(y) * sum(g); with h the gradient of dx:
    d/dg = h - sum(h * exp(y)) and d/dy = -h * exp(y) * sum(g)."""
    grad_output, output = ctx.saved_tensors
    g, y, h = _as_work_dtype(grad_output, output, grad_grad_input)
    p = y.exp()
    grad_g = h - (h * p).sum(ctx.dim, keepdim=True)
    grad_y = -h * p * g.sum(ctx.dim, keepdim=True)
    return grad_g.to(grad_output.dtype), grad_y.to(output.dtype), None, None


def _no_double_backward(op: str):
    """An autograd formula for a backward op that refuses to be differentiated. Without one, torch's fallback
    for ops with no autograd kernel only warns and returns a wrong (incomplete) second derivative."""

    def backward(ctx, *grads):
        raise RuntimeError(
            f"softmax_ops.{op}: double backward is not supported (the gradient of a softmax_ops gradient); "
            "use torch.topk(torch.softmax(...)) for higher-order derivatives"
        )

    return backward


def _nothing_to_save(ctx, inputs, output) -> None:
    pass


def register() -> None:
    """Attach the backward formulas to softmax, log_softmax and fused_topk, and the double-backward formulas
    to softmax_backward and log_softmax_backward (in torch ops: higher-order derivatives, as torch supports for
    its softmax); differentiating fused_topk_backward raises instead of silently giving a wrong result."""
    torch.library.register_autograd(
        "softmax_ops::softmax", _softmax_backward, setup_context=_softmax_setup
    )
    torch.library.register_autograd(
        "softmax_ops::log_softmax", _log_softmax_backward, setup_context=_softmax_setup
    )
    torch.library.register_autograd(
        "softmax_ops::fused_topk", _fused_topk_backward, setup_context=_fused_topk_setup
    )
    torch.library.register_autograd(
        "softmax_ops::softmax_backward", _softmax_backward_backward, setup_context=_backward_setup
    )
    torch.library.register_autograd(
        "softmax_ops::log_softmax_backward", _log_softmax_backward_backward, setup_context=_backward_setup
    )
    torch.library.register_autograd(
        "softmax_ops::fused_topk_backward", _no_double_backward("fused_topk_backward"),
        setup_context=_nothing_to_save
    )
