"""Which nodes of a Dynamo (pre-grad) FX graph write into a tensor or into one of its views.

fused_topk saves its logits and its values for the backward, where the ops it replaces save neither (softmax
keeps its own output, topk its indices). Autograd refuses a backward whose saved tensors were written in
place after the forward, so a fused pattern in a training graph that later mutates the logits or the values
would fail where the original model runs. The pass asks `first_mutation` and leaves such patterns alone.

The analysis is conservative: a node is treated as a view of its input whenever its operation can return
one (reshape, contiguous, indexing), and a write is anything in-place by name (``add_``), by operator
(``+=``, ``x[i] = v``), or through ``out=`` / ``inplace=True``.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable

from torch.fx import Node

# Tensor methods (and torch functions of the same names) whose result may share storage with their input.
_VIEW_NAMES = frozenset({
    "view", "view_as", "reshape", "reshape_as", "as_strided", "expand", "expand_as", "broadcast_to",
    "squeeze", "unsqueeze", "flatten", "unflatten", "transpose", "swapaxes", "swapdims", "permute", "movedim",
    "moveaxis", "t", "narrow", "select", "diagonal", "unfold", "split", "split_with_sizes", "tensor_split",
    "chunk", "unbind", "detach", "contiguous", "real", "imag", "view_as_real", "view_as_complex", "alias",
    "numpy_T", "matrix_H", "adjoint", "T", "mT", "H", "mH", "data",
})
# In-place operators: `x += y` and friends, and `x[i] = y`.
_INPLACE_OPERATORS = frozenset({
    operator.iadd, operator.isub, operator.imul, operator.itruediv, operator.ifloordiv, operator.imod,
    operator.ipow, operator.imatmul, operator.iand, operator.ior, operator.ixor, operator.ilshift,
    operator.irshift, operator.setitem,
})
# Names that end in "_" without writing tensor data.
_NOT_WRITES = frozenset({"requires_grad_", "share_memory_", "record_stream"})


def _name(node: Node) -> str:
    target = node.target
    return target if isinstance(target, str) else getattr(target, "__name__", "")


def _may_view(node: Node) -> bool:
    """Whether ``node``'s result may share storage with its first argument."""
    if node.op not in ("call_method", "call_function") or not node.args or not isinstance(node.args[0], Node):
        return False
    if node.target is operator.getitem or node.target is getattr:
        return True  # tensor indexing (a view for basic indexing), an element of split()/unbind(), x.T
    return _name(node) in _VIEW_NAMES


def _views_of(base: Node) -> set[Node]:
    """``base`` and every node that may be a view of it, however many view steps away."""
    group, stack = {base}, [base]
    while stack:
        node = stack.pop()
        for user in node.users:
            if user not in group and _may_view(user) and user.args[0] is node:
                group.add(user)
                stack.append(user)
    return group


def alias_group(node: Node) -> set[Node]:
    """Every node that may share storage with ``node``: up to the tensor it is a view of, then down to every
    view of that."""
    base = node
    while _may_view(base):
        base = base.args[0]
    return _views_of(base)


def written_nodes(node: Node) -> list[Node]:
    """The nodes whose tensors ``node`` writes into in place (empty for an ordinary op)."""
    if node.op not in ("call_method", "call_function"):
        return []
    written: list[Node] = []
    first = node.args[0] if node.args and isinstance(node.args[0], Node) else None
    name = _name(node)
    in_place_by_name = name.endswith("_") and not name.startswith("_") and name not in _NOT_WRITES
    if first is not None and (node.target in _INPLACE_OPERATORS or in_place_by_name or node.kwargs.get("inplace")):
        written.append(first)
    out = node.kwargs.get("out")
    for target in out if isinstance(out, (tuple, list)) else [out]:
        if isinstance(target, Node):
            written.append(target)
    return written


def first_mutation(tensors: Iterable[Node], after: Node, ignore: Iterable[Node] = ()) -> Node | None:
    """The first node after ``after`` (in graph order) that writes into one of ``tensors`` or a tensor sharing
    storage with one of them, skipping the nodes in ``ignore``; None when there is none."""
    group: set[Node] = set()
    for tensor in tensors:
        group |= alias_group(tensor)
    skipped = set(ignore)
    node = after.next
    while node.op != "root":
        if node not in skipped and any(target in group for target in written_nodes(node)):
            return node
        node = node.next
    return None
