"""Which nodes of a Dynamo (pre-grad) FX graph write into a tensor or into a tensor sharing its storage.

fused_topk saves its logits for the backward, where the softmax it replaces saves its own output and topk its
indices. Autograd refuses a backward whose saved tensors were written in place after the forward, so a fused
pattern in a training graph that later writes into the logits (or anything sharing their storage) would fail
where the original model runs. The pass asks `first_mutation` and leaves such patterns alone. (The values are
saved as a private copy: _autograd.py.)

Aliasing comes from the nodes' fake example values (two nodes alias when their values share a storage:
views, `.data`, `.to()` that changes nothing), with op names as the fallback for nodes without one. A write
is anything in-place by name (``add_``, ``__iadd__``, ``_foreach_mul_``), by operator (``+=``, ``x[i] = v``),
by an aten overload's schema, or through ``out=`` / ``inplace=True`` (by keyword or by position). Writes
outside the graph (after a graph break, or by the caller) are out of its sight: README, known differences.
"""

from __future__ import annotations

import inspect
import operator

import torch
from torch.fx import Node
from torch.multiprocessing.reductions import StorageWeakRef

from softmax_ops._patterns import node_value

# Tensor methods (and torch functions of the same names) whose result may share storage with their input; the
# fallback for nodes without an example value.
_VIEW_NAMES = frozenset({
    "view", "view_as", "reshape", "reshape_as", "as_strided", "expand", "expand_as", "broadcast_to",
    "squeeze", "unsqueeze", "flatten", "unflatten", "ravel", "transpose", "swapaxes", "swapdims", "permute",
    "movedim", "moveaxis", "t", "narrow", "select", "diagonal", "unfold", "split", "split_with_sizes",
    "tensor_split", "hsplit", "vsplit", "dsplit", "chunk", "unbind", "detach", "contiguous", "real", "imag",
    "view_as_real", "view_as_complex", "alias", "numpy_T", "matrix_H", "adjoint", "T", "mT", "H", "mH", "data",
    "_get_data_attr", "to", "type", "type_as", "float", "half", "bfloat16", "double", "cpu", "cuda",
    "positive", "conj", "resolve_conj", "resolve_neg", "atleast_1d", "atleast_2d", "atleast_3d",
    "broadcast_tensors", "dropout",
})
# In-place operators and dunders: `x += y` and friends, and `x[i] = y`.
_INPLACE_OPERATORS = frozenset({
    operator.iadd, operator.isub, operator.imul, operator.itruediv, operator.ifloordiv, operator.imod,
    operator.ipow, operator.imatmul, operator.iand, operator.ior, operator.ixor, operator.ilshift,
    operator.irshift, operator.setitem,
})
_INPLACE_DUNDERS = frozenset(f"__{op}__" for op in (
    "iadd", "isub", "imul", "itruediv", "ifloordiv", "imod", "ipow", "imatmul", "iand", "ior", "ixor",
    "ilshift", "irshift", "setitem"))
# Names that end in "_" without writing tensor data.
_NOT_WRITES = frozenset({"requires_grad_", "share_memory_", "record_stream"})


def _name(node: Node) -> str:
    target = node.target
    return target if isinstance(target, str) else getattr(target, "__name__", "")


def _storage(node: Node) -> StorageWeakRef | None:
    value = node_value(node)
    if not isinstance(value, torch.Tensor):
        return None
    try:
        return StorageWeakRef(value.untyped_storage())
    except (RuntimeError, NotImplementedError):  # tensors without a storage (sparse, some subclasses)
        return None


def _first_tensor_arg(node: Node) -> Node | None:
    for arg in [*node.args, *node.kwargs.values()]:
        if isinstance(arg, Node):
            return arg
    return None


def _may_view_by_name(node: Node) -> bool:
    """Whether ``node``'s result may share storage with its first tensor argument, judged by its name."""
    if node.op not in ("call_method", "call_function"):
        return False
    if node.target is operator.getitem or node.target is getattr:
        return True  # tensor indexing, a piece of split()/unbind(), x.T
    return _name(node).split(".")[0] in _VIEW_NAMES


def _is_view_step(node: Node, source: Node) -> bool:
    """Whether ``node``, computed from ``source``, may share its storage: by their example values where both
    have one, else by ``node``'s name."""
    if _first_tensor_arg(node) is not source:
        return False
    node_storage, source_storage = _storage(node), _storage(source)
    if node_storage is not None and source_storage is not None:
        return node_storage == source_storage
    return _may_view_by_name(node)


def alias_group(node: Node) -> set[Node]:
    """Every node that may share storage with ``node``: up the chain of views it comes from, down to every
    view of that, and every node whose example value shares one of their storages."""
    base = node
    while (source := _first_tensor_arg(base)) is not None and _is_view_step(base, source):
        base = source
    group, stack = {base, node}, [base]
    while stack:
        current = stack.pop()
        for user in current.users:
            if user not in group and _is_view_step(user, current):
                group.add(user)
                stack.append(user)
    storages = {ref for ref in map(_storage, group) if ref is not None}
    if storages:
        group |= {other for other in node.graph.nodes if _storage(other) in storages}
    return group


def _bound_arguments(node: Node) -> dict:
    """The call's arguments by parameter name, where the target's signature can be read (else only keywords)."""
    try:
        return dict(inspect.signature(node.target).bind_partial(*node.args, **node.kwargs).arguments)
    except (TypeError, ValueError):
        return dict(node.kwargs)


def _schema_writes(node: Node) -> list[Node]:
    """The arguments an aten (or custom) op overload's schema marks as written (``Tensor(a!)``)."""
    schema = getattr(node.target, "_schema", None)
    if schema is None:
        return []
    written = []
    for position, argument in enumerate(schema.arguments):
        if argument.alias_info is None or not argument.alias_info.is_write:
            continue
        value = node.args[position] if position < len(node.args) else node.kwargs.get(argument.name)
        written += _nodes_in(value)
    return written


def _nodes_in(value) -> list[Node]:
    if isinstance(value, Node):
        return [value]
    if isinstance(value, (tuple, list)):
        return [item for item in value if isinstance(item, Node)]
    return []


def written_nodes(node: Node) -> list[Node]:
    """The nodes whose tensors ``node`` writes into in place (empty for an ordinary op)."""
    if node.op not in ("call_method", "call_function"):
        return []
    name = _name(node)
    first = node.args[0] if node.args else None
    in_place_by_name = (name.endswith("_") and not name.startswith("__") and name not in _NOT_WRITES
                        and (not name.startswith("_") or name.startswith("_foreach_")))
    written: list[Node] = []
    if node.target in _INPLACE_OPERATORS or name in _INPLACE_DUNDERS or in_place_by_name:
        written += _nodes_in(first)  # a list for _foreach_*_
    written += _schema_writes(node)
    if node.op == "call_function" and callable(node.target) and not hasattr(node.target, "_schema"):
        arguments = _bound_arguments(node)
        if arguments.get("inplace") is True:
            written += _nodes_in(first)
    else:
        arguments = dict(node.kwargs)
    written += _nodes_in(arguments.get("out"))
    return written


def first_mutation(tensor: Node, after: Node, before: Node | None = None) -> Node | None:
    """The first node after ``after`` (and before ``before``, when given; in graph order) that writes into
    ``tensor`` or a tensor sharing its storage; None when there is none."""
    group = alias_group(tensor)
    node = after.next
    while node.op != "root" and node is not before:
        if any(target in group for target in written_nodes(node)):
            return node
        node = node.next
    return None
