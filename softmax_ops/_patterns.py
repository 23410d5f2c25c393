"""Recognises the call forms of softmax, log_softmax, topk, sum and division in a Dynamo (pre-grad) FX graph.

The pre-grad graph is neither functional nor normalised: the same operation appears as ``F.softmax``,
``torch.softmax``, ``x.softmax`` (``call_method``), ``torch.special.softmax`` or ``aten.softmax.int``, with
any mix of positional and keyword arguments. Each ``parse_*`` function binds one node's arguments to the
operation's parameter names and returns a small record, or says why the node cannot be read safely.
Nothing here mutates a graph.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch.fx import Node

from softmax_ops.ops import as_dtype

_SOFTMAX_PARAMS = ("input", "dim", "dtype")
# F.softmax / F.log_softmax keep the legacy `_stacklevel` between dim and dtype (nn.Softmax passes it).
_FUNCTIONAL_SOFTMAX_PARAMS = ("input", "dim", "_stacklevel", "dtype")

# target -> (kind, parameter names).
_SOFTMAX_FUNCTIONS: dict[Any, tuple[str, tuple[str, ...]]] = {
    F.softmax: ("softmax", _FUNCTIONAL_SOFTMAX_PARAMS),
    F.log_softmax: ("log_softmax", _FUNCTIONAL_SOFTMAX_PARAMS),
    torch.softmax: ("softmax", _SOFTMAX_PARAMS),
    torch.log_softmax: ("log_softmax", _SOFTMAX_PARAMS),
    torch.special.softmax: ("softmax", _SOFTMAX_PARAMS),
    torch.special.log_softmax: ("log_softmax", _SOFTMAX_PARAMS),
    torch.Tensor.softmax: ("softmax", _SOFTMAX_PARAMS),
    torch.Tensor.log_softmax: ("log_softmax", _SOFTMAX_PARAMS),
    torch.ops.aten.softmax.int: ("softmax", _SOFTMAX_PARAMS),
    torch.ops.aten.log_softmax.int: ("log_softmax", _SOFTMAX_PARAMS),
}
_SOFTMAX_METHODS = {"softmax": "softmax", "log_softmax": "log_softmax"}

_TOPK_PARAMS = ("input", "k", "dim", "largest", "sorted")
_TOPK_FUNCTIONS = (torch.topk, torch.Tensor.topk, torch.ops.aten.topk.default)

_SUM_PARAMS = ("input", "dim", "keepdim", "dtype")
_SUM_FUNCTIONS = (torch.sum, torch.Tensor.sum)

# Division: (parameter names, in place). `rounding_mode` must be absent/None for a true division.
_DIV_FUNCTIONS: dict[Any, tuple[tuple[str, ...], bool]] = {
    operator.truediv: (("input", "other"), False),
    operator.itruediv: (("input", "other"), True),
    torch.div: (("input", "other", "rounding_mode"), False),
    torch.true_divide: (("input", "other"), False),
    torch.Tensor.div: (("input", "other", "rounding_mode"), False),
    torch.Tensor.div_: (("input", "other", "rounding_mode"), True),
}
_DIV_METHODS: dict[str, tuple[tuple[str, ...], bool]] = {
    "div": (("input", "other", "rounding_mode"), False),
    "div_": (("input", "other", "rounding_mode"), True),
    "true_divide": (("input", "other"), False),
    "true_divide_": (("input", "other"), True),
    "__truediv__": (("input", "other"), False),
    "__itruediv__": (("input", "other"), True),
}

# How Dynamo records `with torch.no_grad()`, `torch.set_grad_enabled(...)` and `torch.inference_mode()`.
_GRAD_MODE_SWITCHES = frozenset({"_set_grad_enabled", "_enter_inference_mode", "_exit_inference_mode"})

# The tensor argument is `self` in aten schemas and `input` in the Python bindings: accept either name.
_ALIASES = {"self": "input"}


class Unreadable(Exception):
    """A node has the right target but arguments this pass does not understand; the message says which."""


@dataclass(frozen=True)
class SoftmaxCall:
    """A softmax or log_softmax node, whatever its call form."""

    node: Node
    kind: str  # "softmax" or "log_softmax"
    input: Node
    dim: int
    dtype: torch.dtype | None


@dataclass(frozen=True)
class TopkCall:
    """A topk node; ``largest`` and ``sorted`` hold whatever the call passed (defaults True)."""

    node: Node
    input: Node
    k: Any
    dim: Any
    largest: Any
    sorted: Any


@dataclass(frozen=True)
class SumCall:
    """A sum node; ``dim`` is None for a sum over every element."""

    node: Node
    input: Any
    dim: Any
    keepdim: Any
    dtype: Any


@dataclass(frozen=True)
class DivCall:
    """A true division ``numerator / denominator`` (out of place or in place)."""

    node: Node
    numerator: Any
    denominator: Any
    in_place: bool


def _bind(node: Node, params: tuple[str, ...], what: str) -> dict[str, Any]:
    if len(node.args) > len(params):
        raise Unreadable(f"{what} with {len(node.args)} positional arguments")
    bound = dict(zip(params, node.args))
    for name, value in node.kwargs.items():
        name = _ALIASES.get(name, name)
        if name not in params or name in bound:
            raise Unreadable(f"{what} with unsupported argument {name}={value!r}")
        bound[name] = value
    if not isinstance(bound.get("input"), Node):
        raise Unreadable(f"{what} whose input is not a graph value")
    return bound


def _is_call(node: Node) -> bool:
    return node.op in ("call_function", "call_method")


def _softmax_signature(node: Node) -> tuple[str, tuple[str, ...]] | None:
    if node.op == "call_method" and node.target in _SOFTMAX_METHODS:
        return _SOFTMAX_METHODS[node.target], _SOFTMAX_PARAMS
    if node.op == "call_function":
        try:
            return _SOFTMAX_FUNCTIONS.get(node.target)
        except TypeError:  # an unhashable target cannot be one of ours
            return None
    return None


def softmax_kind(node: Node) -> str | None:
    """The kind ("softmax" or "log_softmax") when ``node`` calls one of them in any form, else None."""
    signature = _softmax_signature(node)
    return signature[0] if signature else None


def parse_softmax(node: Node) -> SoftmaxCall | None:
    """The softmax/log_softmax call ``node`` makes, None if it is not one; raises Unreadable if its arguments
    are not a plain (tensor, int dim, dtype or None) call."""
    signature = _softmax_signature(node)
    if signature is None:
        return None
    kind, params = signature
    bound = _bind(node, params, kind)
    dim = bound.get("dim")
    if dim is None:
        raise Unreadable(f"{kind} with dim=None (implicit dim, deprecated in torch)")
    if type(dim) is not int:
        raise Unreadable(f"{kind} with dim={dim!r} (not a static int)")
    dtype = as_dtype(bound.get("dtype"))  # Python's float is float64 here too
    if dtype is not None and not isinstance(dtype, torch.dtype):
        raise Unreadable(f"{kind} with dtype={dtype!r} (not a static dtype)")
    return SoftmaxCall(node, kind, bound["input"], dim, dtype)


def parse_topk(node: Node) -> TopkCall | None:
    """The topk call ``node`` makes (function, method or aten form), None if it is not one."""
    if not _is_call(node):
        return None
    if not (node.op == "call_method" and node.target == "topk") and not (
        node.op == "call_function" and any(node.target is f for f in _TOPK_FUNCTIONS)
    ):
        return None
    bound = _bind(node, _TOPK_PARAMS, "topk")
    return TopkCall(
        node,
        bound["input"],
        bound.get("k"),
        bound.get("dim", -1),
        bound.get("largest", True),
        bound.get("sorted", True),
    )


def parse_sum(node: Node) -> SumCall | None:
    """The sum call ``node`` makes, None if it is not one (or its arguments are not readable)."""
    if not (node.op == "call_method" and node.target == "sum") and not (
        node.op == "call_function" and any(node.target is f for f in _SUM_FUNCTIONS)
    ):
        return None
    try:
        bound = _bind(node, _SUM_PARAMS, "sum")
    except Unreadable:
        return None
    return SumCall(node, bound["input"], bound.get("dim"), bound.get("keepdim", False), bound.get("dtype"))


def parse_div(node: Node) -> DivCall | None:
    """The true division ``node`` makes, None if it is not one (floor/trunc divisions are not)."""
    if node.op == "call_method":
        signature = _DIV_METHODS.get(node.target) if isinstance(node.target, str) else None
    elif node.op == "call_function":
        signature = next((sig for f, sig in _DIV_FUNCTIONS.items() if node.target is f), None)
    else:
        signature = None
    if signature is None:
        return None
    params, in_place = signature
    try:
        bound = _bind(node, params, "div")
    except Unreadable:
        return None
    if bound.get("rounding_mode") is not None:
        return None
    return DivCall(node, bound["input"], bound.get("other"), in_place)


def getitem_index(node: Node) -> int | None:
    """``i`` when ``node`` is ``operator.getitem(x, i)`` with a constant int ``i``, else None."""
    if node.op == "call_function" and node.target is operator.getitem and len(node.args) == 2:
        index = node.args[1]
        return index if type(index) is int else None
    return None


def node_value(node: Node) -> Any:
    """The (fake) value a node produces: ``meta['val']`` (export, later passes) or Dynamo's
    ``meta['example_value']``; None when neither is recorded."""
    return node.meta.get("val", node.meta.get("example_value"))


def tensor_meta(node: Any) -> torch.Tensor | None:
    """The (fake) tensor a node produces, None if it produces something else or nothing is recorded."""
    value = node_value(node) if isinstance(node, Node) else None
    return value if isinstance(value, torch.Tensor) else None


def wrap_dim(dim: Any, rank: int) -> int | None:
    """``dim`` wrapped into ``[0, rank)`` the way torch wraps it (a 0-d tensor takes dim 0 or -1), or None
    when it is not an int or out of range."""
    if type(dim) is not int:
        return None
    size = max(rank, 1)
    if not -size <= dim < size:
        return None
    return dim % size


def single_dim(dim: Any) -> Any:
    """``dim`` unpacked from a one-element list/tuple (``sum(dim=(-1,))``); anything else unchanged."""
    if isinstance(dim, (list, tuple)) and len(dim) == 1:
        return dim[0]
    return dim


def grad_mode_changes_between(first: Node, last: Node) -> bool:
    """Whether a ``no_grad``/``enable_grad``/``inference_mode`` boundary lies between two nodes. A fused op
    runs at one point of the program, so it must not merge operations that ran under different grad modes
    (the result would require grad where the original did not, or the other way round)."""
    node = first.next
    while node is not last and node.op != "root":
        if node.op == "call_function" and getattr(node.target, "__name__", None) in _GRAD_MODE_SWITCHES:
            return True
        node = node.next
    return False


def records_grad(value: object) -> bool:
    """Whether autograd records the op that produced ``value`` (an example tensor or a tuple starting with
    one); True when unknown."""
    tensor = value[0] if isinstance(value, (tuple, list)) and value else value
    return not isinstance(tensor, torch.Tensor) or tensor.requires_grad
