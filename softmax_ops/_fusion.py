"""The elementwise neighbours inductor compiles into a softmax's own kernel, and the casts our ops absorb.

Inductor generates one kernel for a softmax together with the elementwise operations around it: the scale
and additive mask before it, a cast or dropout after it. That kernel reads the scores once and writes the
result once. Replacing the softmax with our op splits it: each neighbour becomes a kernel of its own, a full
extra read and write of the tensor. Measured on an H100 (benchmarks/fusion_context_probe.py, session 25, us,
torch.compile without -> with the pass of session 24, which rewrote every softmax; *session25-c2-*):
HF Transformers' eager attention ``softmax(scores * scale + mask, dtype=float32).to(scores.dtype)`` on
(2, 16, 1024, 1024) fp16 51 -> 194, ``softmax(scores * scale + mask)`` 50 -> 109, ``log_softmax(logits.float())``
on (8192, 32000) bf16 611 -> 1253. So the pass

* absorbs a widening cast in front (``x.float()``, ``x.to(torch.float32)``): ``softmax(x.float(), d)`` is by
  definition ``softmax(x, d, dtype=torch.float32)``, which our ops compute reading x once (the last case:
  1253 -> 643 us; (2048, 151936) fp16 1518 -> 843, torch.compile 1269). Not when anything writes into x or
  into the cast's result in between, and for fused_topk (which saves its logits for the backward) only
  where no gradient is recorded;
* absorbs a cast back to the input's 16-bit dtype behind a float32 softmax (``.to(x.dtype)``, ``.half()``,
  ``.type_as(x)``) where no gradient is recorded: the result is the float32 math rounded once to 16 bits, as
  before. With gradients it is left alone, since the backward would then start from the rounded output
  instead of the float32 one;
* leaves a softmax to inductor when, after that, a neighbour would still be computed inside its kernel: its
  input made by an elementwise op (through views) for it alone, or its output read by anything but a graph
  output, a matmul, topk / sort / multinomial or a shape reader (through views, casts to the dtype a tensor
  already has, and a dropout that returns its input: eval mode or p=0). Elementwise consumers, and reductions and
  gathers too: inductor computes ``nll_loss(log_softmax(x))`` and ``log_softmax(x).gather(...)`` without
  ever writing the log-probabilities (call 4, *session25-c4-*, (8192, 32000) bf16: nll_loss 373 us under
  torch.compile, 656 with our op in front; as a training step 1286 vs 2377). The site then runs exactly as
  under torch.compile without the pass.

The last rule gives up speed where inductor's own softmax is slow. Session 25, call 3 (*session25-c3-*: the
default against SOFTMAX_OPS_REWRITE_FUSED=1, ``softmax(scores * scale + mask)``, us): (4, 16, 1024, 1024) fp16
95 vs 187 (inductor's fused kernel runs at copy speed there), but (256, 16, 128, 128) fp16 375 vs 204, (16, 32,
512, 512) bf16 591 vs 488, (1, 32, 2048, 2048) bf16 636 vs 493, where inductor's plain softmax ran at 0.35-0.4
of copy. Which shapes inductor handles well is not known before it compiles, so the default is the choice
that is never slower than torch.compile; SOFTMAX_OPS_REWRITE_FUSED=1 rewrites every eligible softmax.

Elementwise producers are the operators and functions listed below; any other producer (a matmul, a graph
input, an unknown call) has a kernel of its own. Consumers are the other way round: only the listed ones
count as needing the whole output, an unknown one is assumed to be computed inside inductor's kernel.
"""

from __future__ import annotations

import operator
import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch.fx import Node

from softmax_ops._metadata_uses import reads_only_metadata
from softmax_ops._mutations import first_mutation
from softmax_ops._patterns import grad_mode_changes_between, node_value, records_grad, tensor_meta

# Producers inductor computes inside the softmax's own kernel (elementwise, same device).
_ELEMENTWISE_FUNCTIONS = frozenset({
    operator.add, operator.sub, operator.mul, operator.truediv, operator.neg, operator.pow,
    operator.iadd, operator.isub, operator.imul, operator.itruediv,
    torch.add, torch.sub, torch.mul, torch.div, torch.true_divide, torch.neg, torch.pow, torch.where,
    torch.masked_fill, torch.clamp, torch.clip, torch.exp, torch.tanh, torch.sigmoid, torch.abs, torch.sqrt,
    torch.rsqrt, torch.nan_to_num, torch.dropout, F.dropout, F.gelu, F.silu, F.relu,
    torch.Tensor.add, torch.Tensor.sub, torch.Tensor.mul, torch.Tensor.div, torch.Tensor.masked_fill,
    torch.Tensor.float, torch.Tensor.half, torch.Tensor.bfloat16, torch.Tensor.to, torch.Tensor.type_as,
})
_ELEMENTWISE_METHODS = frozenset({
    "add", "sub", "mul", "div", "true_divide", "neg", "pow", "clamp", "clip", "exp", "tanh", "sigmoid", "abs",
    "sqrt", "rsqrt", "masked_fill", "nan_to_num", "where",
    "add_", "sub_", "mul_", "div_", "masked_fill_", "clamp_",
    "__add__", "__radd__", "__sub__", "__rsub__", "__mul__", "__rmul__", "__truediv__", "__rtruediv__",
    "__iadd__", "__isub__", "__imul__", "__itruediv__",
    "float", "half", "bfloat16", "double", "to", "type", "type_as",
})
# Calls that only re-index their first argument: inductor fuses through them. Narrower than _mutations.py's
# _VIEW_NAMES, which lists every call whose result MAY share storage (casts, dropout, .cpu() included): that
# list must over-approximate aliasing, this one must not claim a copy is free.
_VIEW_FUNCTIONS = frozenset({
    torch.reshape, torch.transpose, torch.permute, torch.flatten, torch.squeeze, torch.unsqueeze,
    torch.Tensor.view, torch.Tensor.reshape, torch.Tensor.transpose, torch.Tensor.permute,
    torch.Tensor.contiguous,
})
_VIEW_METHODS = frozenset({
    "view", "reshape", "transpose", "permute", "flatten", "squeeze", "unsqueeze", "contiguous", "t",
    "view_as", "reshape_as",
})
# SOFTMAX_OPS_REWRITE_FUSED=1: rewrite every eligible softmax, fused neighbours or not (read at each
# compilation; part of the pass's cache key).
REWRITE_FUSED_ENV = "SOFTMAX_OPS_REWRITE_FUSED"


def keeps_inductor_fusions() -> bool:
    """Whether softmaxes whose neighbours inductor computes in the same kernel are left to inductor (the
    default; SOFTMAX_OPS_REWRITE_FUSED=1 turns it off)."""
    return os.environ.get(REWRITE_FUSED_ENV, "0") != "1"


# Consumers that need the whole softmax output in memory: matmuls read it as an operand, and inductor runs
# topk, sort and multinomial as library kernels on a materialised input. A kernel of ours costs nothing extra
# in front of them.
_WHOLE_OUTPUT_FUNCTIONS = frozenset({
    operator.matmul, torch.matmul, torch.mm, torch.bmm, torch.einsum, torch.baddbmm, torch.addmm, F.linear,
    torch.Tensor.matmul, torch.Tensor.mm, torch.Tensor.bmm, torch.topk, torch.Tensor.topk, torch.sort,
    torch.Tensor.sort, torch.argsort, torch.multinomial, torch.Tensor.multinomial,
})
_WHOLE_OUTPUT_METHODS = frozenset({"matmul", "mm", "bmm", "__matmul__", "__rmatmul__", "topk", "sort", "argsort",
                                   "multinomial"})
_CAST_METHODS = {"float": torch.float32, "half": torch.float16, "bfloat16": torch.bfloat16}
_SIXTEEN_BIT = (torch.float16, torch.bfloat16)


def _calls(node: Any, functions: frozenset, methods: frozenset) -> bool:
    if not isinstance(node, Node):
        return False
    if node.op == "call_method":
        return node.target in methods
    if node.op == "call_function":
        try:
            return node.target in functions
        except TypeError:  # an unhashable target is none of these
            return False
    return False


def is_elementwise(node: Any) -> bool:
    """Whether ``node`` is an elementwise call inductor fuses into a neighbouring kernel (module docstring)."""
    if not _calls(node, _ELEMENTWISE_FUNCTIONS, _ELEMENTWISE_METHODS):
        return False
    # A .to() / .type() that moves the tensor to another device is a copy, not a fusable op.
    out, first = tensor_meta(node), tensor_meta(node.args[0]) if node.args else None
    return out is None or first is None or out.device == first.device


def is_view(node: Any) -> bool:
    """Whether ``node`` only re-indexes its first argument (inductor computes through it)."""
    return _calls(node, _VIEW_FUNCTIONS, _VIEW_METHODS) and bool(node.args) and isinstance(node.args[0], Node)


def dtype_cast_target(node: Node) -> torch.dtype | None:
    """The dtype when ``node`` is a plain same-device dtype cast of its first argument (``x.float()``,
    ``x.to(torch.float32)``, ``x.to(dtype=...)``, ``x.type(torch.float16)``, ``x.type_as(y)``), else None."""
    if node.op != "call_method" or not node.args or not isinstance(node.args[0], Node):
        return None
    x, out = tensor_meta(node.args[0]), tensor_meta(node)
    if x is None or out is None or x.device != out.device:
        return None
    rest, kwargs = node.args[1:], dict(node.kwargs)
    if node.target in _CAST_METHODS:
        target = _CAST_METHODS[node.target] if not rest and not kwargs.pop("memory_format", None) else None
    elif node.target in ("to", "type"):
        if len(rest) == 1 and not kwargs and isinstance(rest[0], torch.dtype):
            target = rest[0]
        elif not rest and set(kwargs) == {"dtype"} and isinstance(kwargs["dtype"], torch.dtype):
            target = kwargs["dtype"]
        else:
            target = None
    elif node.target == "type_as" and len(rest) == 1 and not kwargs and tensor_meta(rest[0]) is not None:
        target = tensor_meta(rest[0]).dtype
    else:
        target = None
    return target if target == out.dtype else None


def widened_source(cast: Node, reader: Node) -> Node | None:
    """x when ``cast`` is ``x`` cast from float16 / bfloat16 to float32 (an exact widening; type_as a float32
    tensor included) and ``reader``, a later node, may read x itself with dtype=torch.float32 instead: nothing
    between them writes into x or into the cast's result (``w = x.float(); w.masked_fill_(...)``), and no
    grad-mode switch lies between them; else None."""
    if not cast.args or not isinstance(cast.args[0], Node) or dtype_cast_target(cast) != torch.float32:
        return None
    x = cast.args[0]
    meta = tensor_meta(x)
    if meta is None or meta.dtype not in _SIXTEEN_BIT or grad_mode_changes_between(cast, reader):
        return None
    if any(first_mutation(written, cast, before=reader) is not None for written in (x, cast)):
        return None
    return x


@dataclass(frozen=True)
class Absorbed:
    """What the replacement of one softmax reads, computes and replaces, once the casts are absorbed."""

    input: Node  # the tensor the op reads
    dtype: torch.dtype | None  # the op's dtype argument
    output: Node  # the node whose uses the op's result takes over: the softmax, or the cast behind it
    erased: tuple[Node, ...]  # nodes that disappear with it, users first


def absorb_widening(softmax: Node, input: Node, dtype: torch.dtype | None) -> tuple[Node, torch.dtype | None]:
    """(what the op reads, its dtype argument) for ``softmax(input, dtype=dtype)``: ``x, float32`` where
    input is an absorbable widening cast of x (widened_source), else unchanged."""
    wide = widened_source(input, softmax) if isinstance(input, Node) else None
    if wide is not None and dtype in (None, torch.float32):
        return wide, torch.float32
    return input, dtype


def absorb_casts(softmax: Node, input: Node, dtype: torch.dtype | None) -> Absorbed:
    """The casts around ``softmax(input, dtype=dtype)`` our op can take over (module docstring)."""
    source, dtype = absorb_widening(softmax, input, dtype)
    erased = [softmax]
    output = softmax
    users = list(softmax.users)
    source_meta = tensor_meta(source)
    if dtype == torch.float32 and len(users) == 1 and source_meta is not None:
        cast = users[0]
        if (source_meta.dtype in _SIXTEEN_BIT and dtype_cast_target(cast) == source_meta.dtype
                and not records_grad(node_value(softmax)) and not records_grad(node_value(cast))
                and not grad_mode_changes_between(softmax, cast)):
            output, dtype = cast, None
            erased.insert(0, cast)
    if source is not input and len(input.users) == 1:
        erased.append(input)  # the cast in front, read by the softmax alone (fused_neighbour's path needs it)
    return Absorbed(source, dtype, output, tuple(erased))


def is_noop_cast(node: Any) -> bool:
    """Whether ``node`` casts a tensor to the dtype it already has (``p.to(q.dtype)`` in a float32 model):
    inductor drops it, so the pass looks through it like through a view."""
    if not isinstance(node, Node) or not node.args or not isinstance(node.args[0], Node):
        return False
    x = tensor_meta(node.args[0])
    return x is not None and dtype_cast_target(node) == x.dtype


def is_identity_dropout(node: Any) -> bool:
    """Whether ``node`` is a dropout that returns its input: ``training=False`` (an nn.Dropout in eval mode)
    or ``p=0``. Inductor drops it, so the pass looks through it like through a view."""
    if not isinstance(node, Node) or node.op != "call_function" or not node.args:
        return False
    if node.target is F.dropout:
        names = ("input", "p", "training", "inplace")
        defaults = {"p": 0.5, "training": True, "inplace": False}
    elif node.target is torch.dropout:
        names, defaults = ("input", "p", "train"), {}
    else:
        return False
    bound = {**defaults, **dict(zip(names, node.args)), **node.kwargs}
    training = bound.get("training", bound.get("train"))
    return bound.get("inplace") is False and (training is False or (type(bound.get("p")) in (int, float)
                                                                    and bound["p"] == 0))


def _needs_the_whole_output(user: Node, tensor: Node) -> bool:
    """Whether ``user`` of ``tensor`` is one inductor cannot compute inside the softmax's kernel, so that the
    whole output is written either way: a graph output, a matmul, a call that reads only its shape."""
    return user.op == "output" or _calls(user, _WHOLE_OUTPUT_FUNCTIONS, _WHOLE_OUTPUT_METHODS) or (
        reads_only_metadata(user, tensor))


def fused_neighbour(absorbed: Absorbed) -> tuple[Node, str] | None:
    """(node, 'producer' or 'consumer') for a neighbour inductor would compute inside the kernel of the
    softmax that ``absorbed`` describes: an elementwise producer read by it alone, or any consumer other than
    those of _needs_the_whole_output (elementwise ops, reductions, gathers, nll_loss: inductor computes them
    from the values in registers and never writes the full output); None when it has none."""
    producer, path = absorbed.input, set(absorbed.erased)
    while (is_view(producer) or is_noop_cast(producer)) and set(producer.users) <= path:
        path.add(producer)
        producer = producer.args[0]
    if is_elementwise(producer) and set(producer.users) <= path:
        return producer, "producer"
    pending, seen = [(user, absorbed.output) for user in absorbed.output.users], set()
    while pending:
        user, tensor = pending.pop()
        if user in seen:
            continue
        seen.add(user)
        if is_view(user) or is_identity_dropout(user) or is_noop_cast(user):
            pending.extend((view_user, user) for view_user in user.users)
        elif not _needs_the_whole_output(user, tensor):
            return user, "consumer"
    return None
