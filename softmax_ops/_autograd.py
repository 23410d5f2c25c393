"""Autograd formulas for the forward ops, each expressed as another registered op (so torch.compile and
AOTAutograd see a single backward op rather than a decomposition)."""

from __future__ import annotations

import torch
from torch._library.autograd import Info, make_autograd_impl  # private: see _register_autograd
from torch.autograd import forward_ad

from softmax_ops.ops import SUPPORTED_DTYPES

# What to use instead where a derivative the ops lack is asked for (refuse_untracked_derivatives); a backward
# op's entry is its forward's.
_TORCH_FORM = {"softmax": "torch.softmax", "log_softmax": "torch.log_softmax",
               "fused_topk": "torch.topk(torch.softmax(x, dim), k, dim)"}


def refuse_untracked_derivatives(op: str, args: tuple) -> None:
    """Raise where a derivative of ``op`` would be silently wrong. The ops have backward formulas only. Under
    forward-mode AD (``forward_ad.make_dual``, ``torch.func.jvp`` / ``jacfwd``) torch runs an op whose inputs do
    not require grad without its autograd formula, so the tangent came out missing or zero; inside
    ``torch.func.grad`` / ``vjp`` / ``jacrev`` torch raised an unrelated error. Checked in the op's autograd
    kernel, where torch.func's wrapped tensors still carry their tangents (the CPU / CUDA kernels see them
    unwrapped): every call form is covered, public wrappers and ``torch.ops.softmax_ops.*`` alike. An input
    without a tangent (a constant inside ``jvp``, ``vmap`` inside a dual level) runs as usual."""
    # This runs on every call: without a dual level or a torch.func transform nothing can be refused.
    dual_level_open = forward_ad._current_level >= 0  # only then can an input carry a tangent
    if not dual_level_open and not torch._C._are_functorch_transforms_active():
        return
    refused = any(
        isinstance(a, torch.Tensor)
        and ((dual_level_open and forward_ad.unpack_dual(a).tangent is not None)
             or (a.requires_grad and torch._C._functorch.is_gradtrackingtensor(a)))  # torch.func.grad and kin
        for a in args
    )
    if refused:
        raise RuntimeError(
            f"softmax_ops.{op}: forward-mode AD and torch.func.grad / jvp / jacrev / jacfwd are not supported "
            f"(the op has a backward formula only); use {_TORCH_FORM[op.removesuffix('_backward')]} there"
        )


# A differentiable input the kernels do not read (complex, float8: not in SUPPORTED_DTYPES) reaches them cast to
# the dtype= result first, as in torch: its gradient is computed in that dtype, then cast back through the cast,
# as torch's autograd does (a complex input gets a real gradient as complex).


def _softmax_setup(ctx, inputs, output) -> None:
    x, dim, _dtype = inputs
    ctx.dim = dim
    ctx.input_dtype = x.dtype
    ctx.save_for_backward(output)


def _softmax_family_backward(backward_op, ctx, grad_output):
    (output,) = ctx.saved_tensors
    read_dtype = ctx.input_dtype if ctx.input_dtype in SUPPORTED_DTYPES else output.dtype
    grad = backward_op(grad_output, output, ctx.dim, read_dtype)
    return grad.to(ctx.input_dtype), None, None


def _softmax_backward(ctx, grad_output):
    return _softmax_family_backward(torch.ops.softmax_ops.softmax_backward.default, ctx, grad_output)


def _log_softmax_backward(ctx, grad_output):
    return _softmax_family_backward(torch.ops.softmax_ops.log_softmax_backward.default, ctx, grad_output)


def _fused_topk_setup(ctx, inputs, output) -> None:
    x, _k, dim, renormalize, _dtype = inputs
    values, indices = output
    ctx.dim = dim
    ctx.renormalize = renormalize
    ctx.input_dtype = x.dtype
    logits = x if x.dtype in SUPPORTED_DTYPES else x.to(values.dtype)  # what the forward read (SUPPORTED_DTYPES)
    # A private copy of the values (k per row): callers write into returned router weights in place (a scale,
    # a renormalisation with an epsilon), which torch's topk allows, since it saves only its indices.
    ctx.save_for_backward(logits, values.detach().clone(), indices)


def _fused_topk_backward(ctx, grad_values, _grad_indices):
    x, values, indices = ctx.saved_tensors
    grad = torch.ops.softmax_ops.fused_topk_backward.default(
        grad_values, x, values, indices, ctx.dim, ctx.renormalize
    )
    return grad.to(ctx.input_dtype), None, None, None, None


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


_LIBRARY = torch.library.Library("softmax_ops", "FRAGMENT")


def _register_autograd(op: str, backward, setup_context) -> None:
    """torch.library.register_autograd's kernel for ``softmax_ops::op``, behind refuse_untracked_derivatives.
    register_autograd offers no hook before its kernel, so this builds that kernel with the private helper
    register_autograd itself uses (torch._library.autograd.make_autograd_impl, the same signature from torch 2.4
    to 2.14; pyproject.toml asks for torch >= 2.8) and registers it the way register_autograd does."""
    autograd_kernel = make_autograd_impl(getattr(torch.ops.softmax_ops, op).default, Info(backward, setup_context))

    def checked_autograd_kernel(keyset, *args):
        refuse_untracked_derivatives(op, args)
        return autograd_kernel(keyset, *args)

    _LIBRARY.impl(op, checked_autograd_kernel, "Autograd", with_keyset=True)


def register() -> None:
    """Attach the backward formulas to softmax, log_softmax and fused_topk, and the double-backward formulas
    to softmax_backward and log_softmax_backward (in torch ops: higher-order derivatives, as torch supports for
    its softmax); differentiating fused_topk_backward raises instead of silently giving a wrong result, and so
    does asking any of them for a derivative they have no formula for (refuse_untracked_derivatives)."""
    _register_autograd("softmax", _softmax_backward, _softmax_setup)
    _register_autograd("log_softmax", _log_softmax_backward, _softmax_setup)
    _register_autograd("fused_topk", _fused_topk_backward, _fused_topk_setup)
    _register_autograd("softmax_backward", _softmax_backward_backward, _backward_setup)
    _register_autograd("log_softmax_backward", _log_softmax_backward_backward, _backward_setup)
    _register_autograd("fused_topk_backward", _no_double_backward("fused_topk_backward"), _nothing_to_save)
