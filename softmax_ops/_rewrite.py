"""Rewrites softmax, log_softmax and their top-k patterns in a Dynamo (pre-grad) FX graph into our ops.

Patterns (the names are the report's keys):

  softmax, log_softmax  any call form                        -> softmax_ops.softmax / log_softmax
  softmax_topk          topk(softmax(x, d), k, d)             -> fused_topk(x, k, d)
  softmax_topk_renorm   the same, then v / v.sum(d, keepdim)  -> fused_topk(x, k, d, renormalize=True)
  topk_softmax          softmax(topk(x, k, d).values, d)      -> fused_topk(x, k, d, renormalize=True)

The last one is exact because the renormalised top-k probabilities are the softmax of the k selected logits.
A candidate is rewritten only when the result is provably the same: value on an enabled device, plain
tensor of a supported dtype, the same (wrapped) dim everywhere, topk largest=True and sorted=True with a
static int k, no other reader of an intermediate that disappears (a softmax output may keep users that read
only its shape, such as HF Mixtral's ``zeros_like(probs).scatter_(...)``: _metadata_uses.py), no grad-mode
switch inside a fused pattern, a topk_softmax ``dtype=`` that only widens the logits, and, where the graph
records gradients, no later in-place write into the logits (fused_topk saves them; _mutations.py). A graph
holding a torch.func transform or a forward-mode AD region is left alone entirely. Casts around a softmax
become the replacement's dtype, and a softmax whose neighbours inductor would compute inside its own kernel
is left to inductor (_fusion.py). Every candidate left alone is reported with the reason.

Ties: fused_topk ranks by logit, equal logits to the lower index; torch.topk ranks the rounded probabilities
and does not specify which of several equal values it returns. On CUDA it keeps the lowest indices among the
values tied at the k-th place (TensorTopK.cu gathers them in index order), ours too, but may order tied values
within the k otherwise; on CPU it keeps any of them (README, "Limits"). Where distinct logits give
probabilities that round to the same value, torch treats them as tied where fused_topk keeps the larger logit,
so the two can return different indices of the same values. With 16-bit probabilities that is common: in
random bfloat16 router rows of 64-256 experts (k = 8) 2-4% of rows got a different expert set, float16 a
different order in 3% (session 28's CPU comparison). So softmax_topk and softmax_topk_renorm are rewritten only
where the probabilities are float32 or float64, where such ties need logits within about one float32 rounding
step of each other, or probabilities that underflow to 0.

Dtypes come from the nodes' example values, which Dynamo computed under the autocast state in force. When
autocast changed a softmax's output dtype, the replacement passes that dtype explicitly: torch's ``dtype=``
casts the input first, which is exactly what every autocast policy for softmax does.
"""

from __future__ import annotations

import collections
import dataclasses
import re
from collections.abc import Iterable

import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch.fx import Graph, Node

from softmax_ops._fusion import absorb_casts, absorb_widening, fused_neighbour, keeps_inductor_fusions
from softmax_ops._metadata_uses import read_metadata_from, reads_only_metadata
from softmax_ops._mutations import first_mutation
from softmax_ops._patterns import (
    DivCall,
    SoftmaxCall,
    SumCall,
    TopkCall,
    Unreadable,
    getitem_index,
    grad_mode_changes_between,
    node_value,
    parse_div,
    parse_softmax,
    parse_sum,
    parse_topk,
    records_grad,
    single_dim,
    softmax_kind,
    tensor_meta,
    wrap_dim,
)
from softmax_ops.ops import SUPPORTED_DTYPES

SOFTMAX_TOPK = "softmax_topk"
SOFTMAX_TOPK_RENORM = "softmax_topk_renorm"
TOPK_SOFTMAX = "topk_softmax"
PATTERNS = ("softmax", "log_softmax", SOFTMAX_TOPK, SOFTMAX_TOPK_RENORM, TOPK_SOFTMAX)

# How Dynamo records torch.func transforms (grad, vjp, jacrev, vmap, jvp: functions of these modules) and
# forward-mode AD regions. Our ops have no forward-AD or batching rules: inside such a region a rewrite drops
# tangents or fails to compile, so a graph holding any of them is left as it is.
_TRANSFORM_MODULES = ("torch._functorch", "torch._C._functorch")
_FORWARD_AD_NAMES = frozenset({"_enter_dual_level", "_exit_dual_level", "_make_dual", "_unpack_dual"})
_FRAME = re.compile(r'File "([^"]+)", line (\d+)')
# Example values are FakeTensors under Dynamo; plain tensors/parameters appear in hand-built graphs.
_PLAIN_TENSOR_TYPES = (FakeTensor, torch.Tensor, torch.nn.Parameter)
# Probability dtypes whose rounding ties distinct logits often enough that fused_topk's order (by logit) and
# torch.topk's (of the rounded values) pick different indices: see "Ties" above.
_ROUNDING_TIE_DTYPES = (torch.float16, torch.bfloat16)


@dataclasses.dataclass(frozen=True)
class Skipped:
    """A candidate the pass left untouched, and why."""

    pattern: str
    node: str
    reason: str
    where: str = ""  # "file.py:line" of the user code, when Dynamo recorded a stack trace


@dataclasses.dataclass(frozen=True)
class Rewritten:
    """A candidate the pass replaced."""

    pattern: str
    node: str
    replacement: str
    where: str = ""


@dataclasses.dataclass
class GraphOutcome:
    """What one run of the pass did to one graph."""

    rewritten: list[Rewritten] = dataclasses.field(default_factory=list)
    skipped: list[Skipped] = dataclasses.field(default_factory=list)

    def counts(self) -> dict[str, int]:
        """Rewrites per pattern."""
        return dict(collections.Counter(r.pattern for r in self.rewritten))


# Every op a rewritten graph may call, forward and (when training) backward.
_REWRITE_OPS = (
    "softmax",
    "log_softmax",
    "fused_topk",
    "softmax_backward",
    "log_softmax_backward",
    "fused_topk_backward",
)


def _op(kind: str) -> torch._ops.OpOverload:
    return getattr(torch.ops.softmax_ops, kind).default


def has_kernels(device_type: str) -> bool:
    """Whether the loaded extension implements every op a rewrite may insert on ``device_type``. A CPU-only
    build (torch with CUDA but no nvcc, or ``SOFTMAX_OPS_BUILD_CUDA=0``) has no CUDA kernels: rewriting a CUDA
    graph there would turn a working model into one that fails when it runs."""
    try:
        key = torch._C._dispatch_key_for_device(device_type)
    except (RuntimeError, ValueError):
        return False
    return all(
        torch._C._dispatch_has_kernel_for_dispatch_key(f"softmax_ops::{name}", key) for name in _REWRITE_OPS
    )


def _is_true(value: object) -> bool:
    return type(value) in (bool, int) and value == 1


def _source_location(node: Node) -> str:
    """'model.py:42' for the innermost user frame of the node's stack trace, '' when none was recorded."""
    frames = _FRAME.findall(node.meta.get("stack_trace") or "")
    if not frames:
        return ""
    path, line = frames[-1]
    return f"{path.rsplit('/', 1)[-1]}:{line}"


def _transform_node(graph: Graph) -> Node | None:
    """The first node of a torch.func transform or a forward-mode AD region in ``graph``, None when none."""
    for node in graph.nodes:
        if node.op != "call_function":
            continue
        module = getattr(node.target, "__module__", None) or ""
        if module.startswith(_TRANSFORM_MODULES) or getattr(node.target, "__name__", None) in _FORWARD_AD_NAMES:
            return node
    return None


def _keeps_order(source: torch.dtype, target: torch.dtype) -> bool:
    """Whether casting ``source`` values to ``target`` keeps every order and every inequality (an exact
    widening), so that ranking after the cast ranks exactly as before it."""
    widenings = {torch.float16: (torch.float32, torch.float64), torch.bfloat16: (torch.float32, torch.float64),
                 torch.float32: (torch.float64,)}
    return source == target or target in widenings.get(source, ())


def _saved_tensor_written(mutation: Node) -> str:
    return (f"{mutation.name} writes in place into the logits in a graph that records gradients, and "
            "fused_topk saves them for its backward (torch's softmax saves its output instead)")


def _with_value(node: Node, template: Node, value: object) -> Node:
    """Give ``node`` the template's metadata (stack trace, module stack) with ``value`` as its example value,
    so later passes and the AOTAutograd cache checks (which want ``example_value``) see a normal node."""
    meta = dict(template.meta)
    meta["example_value"] = value
    if "val" in meta:
        meta["val"] = value
    node.meta = meta
    return node


class _GraphRewriter:
    """One pass over one graph. Analysis of each candidate happens before any mutation of it, so a candidate
    is either fully rewritten or untouched."""

    def __init__(self, graph: Graph, devices: frozenset[str]) -> None:
        self.graph = graph
        self.devices = devices
        self.outcome = GraphOutcome()
        self.settled: set[Node] = set()  # softmax nodes fused away or already reported
        self.erased: set[Node] = set()

    # ---- bookkeeping ---------------------------------------------------------------------------------
    def _skip(self, pattern: str, node: Node, reason: str) -> None:
        self.outcome.skipped.append(Skipped(pattern, node.name, reason, _source_location(node)))

    def _done(self, pattern: str, node: Node, replacement: Node) -> None:
        self.outcome.rewritten.append(Rewritten(pattern, node.name, replacement.name, _source_location(node)))

    # ---- checks --------------------------------------------------------------------------------------
    def _softmax_problem(self, call: SoftmaxCall) -> tuple[str | None, torch.dtype | None]:
        """(reason not to rewrite, or None; the dtype argument the replacement must pass)."""
        x, out = tensor_meta(call.input), tensor_meta(call.node)
        if x is None or out is None:
            return f"{call.kind} without tensor metadata", None
        device = x.device.type
        if device not in self.devices:
            return (
                f"{call.kind} on {device} not in SOFTMAX_OPS_DEVICES ({','.join(sorted(self.devices))})",
                None,
            )
        if not has_kernels(device):
            return f"{call.kind} on {device}: the softmax_ops extension was built without {device} kernels", None
        if type(x) not in _PLAIN_TENSOR_TYPES:
            # DTensor, NestedTensor and other subclasses dispatch softmax their own way; our ops have no
            # rules for them.
            return f"{call.kind} on a {type(x).__name__}", None
        if x.layout != torch.strided:
            return f"{call.kind} on a {x.layout} tensor", None
        if x.dtype not in SUPPORTED_DTYPES:
            return f"{call.kind} of unsupported dtype {x.dtype}", None
        if out.dtype not in SUPPORTED_DTYPES:
            return f"{call.kind} to unsupported dtype {out.dtype}", None
        if call.dtype is not None and out.dtype != call.dtype:
            return f"{call.kind} with dtype={call.dtype} produced {out.dtype}", None
        if wrap_dim(call.dim, x.dim()) is None:
            return f"{call.kind} dim {call.dim} out of range for a {x.dim()}-d tensor", None
        # Without dtype=, an output dtype other than the input's can only come from autocast: pass it.
        dtype = call.dtype if call.dtype is not None else (None if out.dtype == x.dtype else out.dtype)
        return None, dtype

    def _topk_problem(self, topk: TopkCall, rank: int, dim: int) -> str | None:
        if not _is_true(topk.largest):
            return f"topk largest={topk.largest}"
        if not _is_true(topk.sorted):
            return f"topk sorted={topk.sorted}"
        if isinstance(topk.k, Node):
            return "topk k is symbolic (fused_topk takes a static int; it would recompile per k)"
        if type(topk.k) is not int or topk.k < 1:
            return f"topk k={topk.k!r} is not an int >= 1"
        topk_dim = wrap_dim(topk.dim, rank)
        if topk_dim != dim:
            return f"topk over dim {topk.dim}, softmax over dim {dim}"
        if any(getitem_index(user) not in (0, 1) for user in topk.node.users):
            return "topk result used other than through values/indices"
        return None

    def _renormalisation(self, topk: TopkCall, dim: int, rank: int) -> tuple[DivCall, SumCall] | None:
        """The ``values / values.sum(dim, keepdim=True)`` that follows ``topk``, when it can be fused."""
        values_nodes = [user for user in topk.node.users if getitem_index(user) == 0]
        for values in values_nodes:
            for user in values.users:
                div = parse_div(user)
                if div is None or div.numerator is not values or not isinstance(div.denominator, Node):
                    continue
                total = parse_sum(div.denominator)
                if total is None or total.input is not values:
                    continue
                problem = self._renorm_problem(values_nodes, values, div, total, dim, rank)
                if problem is None:
                    return div, total
                self._skip(SOFTMAX_TOPK_RENORM, div.node, problem)
                return None
        return None

    @staticmethod
    def _renorm_problem(
        values_nodes: list[Node], values: Node, div: DivCall, total: SumCall, dim: int, rank: int
    ) -> str | None:
        if len(values_nodes) != 1 or set(values.users) != {div.node, total.node}:
            return "topk values also used elsewhere"
        if set(total.node.users) != {div.node}:
            return "the sum is also used elsewhere"
        if total.dtype is not None:
            return f"sum with dtype={total.dtype}"
        if total.dim is None:
            return "sum over every dim"
        if not _is_true(total.keepdim):
            return "sum without keepdim=True"
        if grad_mode_changes_between(values, div.node):
            return "grad mode changes between topk and the renormalisation"
        if wrap_dim(single_dim(total.dim), rank) != dim:
            return f"renormalisation over dim {total.dim}, topk over dim {dim}"
        value_meta, total_meta, out_meta = tensor_meta(values), tensor_meta(total.node), tensor_meta(div.node)
        if value_meta is None or total_meta is None or out_meta is None:
            return "renormalisation without tensor metadata"
        if total_meta.dtype != value_meta.dtype or out_meta.dtype != value_meta.dtype:
            return f"renormalisation changes dtype {value_meta.dtype} -> {out_meta.dtype}"
        return None

    # ---- rewrites ------------------------------------------------------------------------------------
    def _insert(self, before: Node, target, args: tuple, template: Node, value: object) -> Node:
        with self.graph.inserting_before(before):
            new = self.graph.call_function(target, args)
        return _with_value(new, template, value)

    def _erase(self, *nodes: Node) -> None:
        for node in nodes:
            self.graph.erase_node(node)
            self.erased.add(node)

    def _replace_softmax(self, call: SoftmaxCall) -> None:
        problem, dtype = self._softmax_problem(call)
        if problem:
            self._skip(call.kind, call.node, problem)
            return
        # Casts in front and behind become the op's dtype; elementwise neighbours stay fused (_fusion.py).
        absorbed = absorb_casts(call.node, call.input, dtype)
        neighbour = fused_neighbour(absorbed) if keeps_inductor_fusions() else None
        if neighbour is not None:
            node, role = neighbour
            self._skip(call.kind, call.node, f"left to inductor, which computes the {role} {node.name} inside "
                                             f"the {call.kind}'s kernel (beside our op it would cost another "
                                             "full read or write of the tensor)")
            return
        new = self._insert(
            call.node, _op(call.kind), (absorbed.input, call.dim, absorbed.dtype), absorbed.output,
            node_value(absorbed.output),
        )
        absorbed.output.replace_all_uses_with(new)
        self._erase(*absorbed.erased)
        self._done(call.kind, call.node, new)

    def _fuse_softmax_topk(self, call: SoftmaxCall, topk: TopkCall) -> None:
        problem, dtype = self._softmax_problem(call)
        if problem:
            self._skip(SOFTMAX_TOPK, topk.node, problem)
            self.settled.add(call.node)  # reported once, here
            return
        rank = tensor_meta(call.input).dim()
        dim = wrap_dim(call.dim, rank)
        if call.kind != "softmax":
            problem = "log_softmax feeds topk (no fused log form)"
        elif not all(user is topk.node or reads_only_metadata(user, call.node) for user in call.node.users):
            problem = "softmax output also used elsewhere"
        elif tensor_meta(call.node).dtype in _ROUNDING_TIE_DTYPES:
            problem = (f"{tensor_meta(call.node).dtype} probabilities: distinct logits often round to the same "
                       "16-bit value, which torch.topk orders its own way and fused_topk by logit")
        else:
            problem = self._topk_problem(topk, rank, dim)
        if problem is None and grad_mode_changes_between(call.node, topk.node):
            problem = "grad mode changes between softmax and topk"
        # A later in-place op on the logits blocks the fusion for two reasons (one scan finds it): shape readers
        # will read the logits' metadata where they stand, so nothing may change it in between (x.t_(),
        # x.unsqueeze_(0), x.set_(...); writes are refused too), and a graph that records gradients would have
        # fused_topk's saved logits written.
        shape_readers = [user for user in call.node.users if user is not topk.node]
        grad_recorded = records_grad(node_value(topk.node))
        # softmax(x.float()) reads x with dtype=float32 (_fusion.py): no float32 copy of the logits. Not where
        # gradients are recorded: fused_topk saves its logits, and the caller's x may change after the graph
        # (the float32 copy is the graph's own).
        logits = call.input
        if not grad_recorded:
            logits, dtype = absorb_widening(call.node, call.input, dtype)
        mutation = None
        if problem is None and (shape_readers or grad_recorded):
            mutation = first_mutation(logits, call.node)
        if mutation is not None and shape_readers:
            problem = (f"{mutation.name} changes the logits in place, and {shape_readers[0].name} reads the "
                       "softmax output's shape after the softmax")
        if problem:
            self._skip(SOFTMAX_TOPK, topk.node, problem)
            return
        renorm = self._renormalisation(topk, dim, rank)  # reports its own skip, before the one below
        if mutation is not None:
            self._skip(SOFTMAX_TOPK, topk.node, _saved_tensor_written(mutation))
            return
        # zeros_like(probs) and the like (HF Mixtral's routing matrix) take the logits' shape instead.
        for user in shape_readers:
            read_metadata_from(user, logits, tensor_meta(call.node).dtype)
        # Inserted where the softmax was, so the logits are read at the same point of the program as before.
        fused = self._insert(
            call.node,
            _op("fused_topk"),
            (logits, topk.k, call.dim, renorm is not None, dtype),
            topk.node,
            tuple(node_value(topk.node) or ()),
        )
        topk.node.replace_all_uses_with(fused)
        if renorm:
            div, total = renorm
            div.node.replace_all_uses_with(div.numerator)  # the fused values are already renormalised
            self._erase(div.node, total.node)
        self._erase(topk.node, call.node)
        if logits is not call.input and not call.input.users:
            self._erase(call.input)  # the widening cast, read by the softmax alone
        self.settled.add(call.node)
        self._done(SOFTMAX_TOPK_RENORM if renorm else SOFTMAX_TOPK, topk.node, fused)

    def _fuse_topk_softmax(self, topk: TopkCall) -> None:
        values_nodes = [user for user in topk.node.users if getitem_index(user) == 0]
        candidates = [
            (values, call)
            for values in values_nodes
            for user in values.users
            if (call := self._softmax_of(user)) is not None and call.input is values
        ]
        if not candidates:
            return
        values, call = candidates[0]
        logits = tensor_meta(topk.input)
        problem, dtype = self._softmax_problem(call)
        if problem is None and call.kind != "softmax":
            problem = "log_softmax over topk values (no fused log form)"
        if problem is None and (logits is None or logits.dtype not in SUPPORTED_DTYPES):
            problem = "topk input of unsupported dtype or without metadata"
        if problem is None:
            rank = logits.dim()
            problem = self._topk_problem(topk, rank, wrap_dim(call.dim, rank))
        if problem is None and (len(values_nodes) != 1 or set(values.users) != {call.node}):
            problem = "topk values also used elsewhere"
        if problem is None and grad_mode_changes_between(topk.node, call.node):
            problem = "grad mode changes between topk and softmax"
        if problem is None and dtype is not None and not _keeps_order(logits.dtype, dtype):
            problem = (f"softmax dtype={dtype} of {logits.dtype} topk values: topk ranked the {logits.dtype} "
                       "logits, fused_topk would rank them after the cast")
        if problem is None and records_grad(node_value(call.node)):
            mutation = first_mutation(topk.input, topk.node)
            if mutation is not None:
                problem = _saved_tensor_written(mutation)
        if problem:
            self._skip(TOPK_SOFTMAX, call.node, problem)
            return
        probabilities = node_value(call.node)
        indices = tuple(node_value(topk.node) or (None, None))[1]
        fused = self._insert(
            topk.node,
            _op("fused_topk"),
            (topk.input, topk.k, topk.dim, True, dtype),
            topk.node,
            (probabilities, indices),
        )
        topk.node.replace_all_uses_with(fused)
        # The values now come out of fused_topk already normalised (and in the softmax's dtype).
        call.node.replace_all_uses_with(values)
        _with_value(values, values, probabilities)
        self._erase(call.node, topk.node)
        self.settled.add(call.node)
        self._done(TOPK_SOFTMAX, call.node, fused)

    # ---- driver --------------------------------------------------------------------------------------
    def _softmax_of(self, node: Node) -> SoftmaxCall | None:
        """The softmax call ``node`` makes, parsed now (earlier rewrites may have changed its arguments)."""
        try:
            return parse_softmax(node)
        except Unreadable:
            return None  # reported by _report_unreadable_softmax_calls

    def _report_unreadable_softmax_calls(self) -> None:
        for node in self.graph.nodes:
            try:
                parse_softmax(node)
            except Unreadable as error:
                self._skip(softmax_kind(node) or "softmax", node, str(error))

    def _try_topk(self, node: Node) -> None:
        try:
            topk = parse_topk(node)
        except Unreadable as error:
            if node.args and isinstance(node.args[0], Node) and self._softmax_of(node.args[0]):
                self._skip(SOFTMAX_TOPK, node, str(error))
            return
        if topk is None:
            return
        source = self._softmax_of(topk.input)
        if source is not None and source.node not in self.settled:
            self._fuse_softmax_topk(source, topk)
        else:
            self._fuse_topk_softmax(topk)

    def run(self) -> GraphOutcome:
        transform = _transform_node(self.graph)
        if transform is not None:
            for node in self.graph.nodes:
                kind = softmax_kind(node)
                if kind is not None:
                    self._skip(kind, node, f"the graph holds a torch.func transform or forward-mode AD region "
                                           f"({transform.name}); softmax_ops' ops have no rules for them")
            return self.outcome
        self._report_unreadable_softmax_calls()
        for node in list(self.graph.nodes):
            if node not in self.erased:
                self._try_topk(node)
        for node in list(self.graph.nodes):
            if node not in self.erased and node not in self.settled:
                call = self._softmax_of(node)
                if call is not None:
                    self._replace_softmax(call)
        return self.outcome


def rewrite_graph(graph: Graph, devices: Iterable[str]) -> GraphOutcome:
    """Rewrite every eligible softmax/log_softmax/top-k pattern of ``graph`` in place into softmax_ops ops
    on the given device types, and say what was rewritten and what was left alone (and why)."""
    return _GraphRewriter(graph, frozenset(devices)).run()
