"""What the torch.compile pass did: rewrites per pattern, skipped candidates with reasons, and the rewritten
graphs in a compact readable form (which the tests assert with expecttest)."""

from __future__ import annotations

import collections
import dataclasses
import operator
import threading
from typing import Any

import torch
from torch.fx import Graph, Node
from torch.fx.node import _get_qualified_name

from softmax_ops._rewrite import PATTERNS, GraphOutcome, Rewritten, Skipped

# The last graphs the pass touched, for inspection and tests; bounded so a long-running process that keeps
# compiling does not keep every graph alive.
MAX_RECORDED_GRAPHS = 64


@dataclasses.dataclass(frozen=True)
class CompileReport:
    """A snapshot of what the pass has done since import (or the last ``reset_compile_report()``).

    ``rewrites`` counts replacements per pattern (softmax, log_softmax, softmax_topk, softmax_topk_renorm,
    topk_softmax); ``skipped`` lists every candidate left untouched with the reason; ``graphs`` holds the
    most recent rewritten graphs (compact form, see ``format_graph``); ``graphs_seen`` counts pass runs.
    """

    rewrites: dict[str, int]
    skipped: list[Skipped]
    rewritten: list[Rewritten]
    graphs: list[str]
    graphs_seen: int

    def summary(self) -> str:
        """One line: the non-zero counts and the number of skipped candidates."""
        counts = ", ".join(f"{name}={count}" for name, count in self.rewrites.items() if count) or "nothing"
        return f"softmax_ops compile pass: rewrote {counts}; skipped {len(self.skipped)} candidate(s)"


class ReportRecorder:
    """Accumulates GraphOutcomes; thread-safe because torch.compile may run in several threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        """Forget everything recorded so far."""
        with self._lock:
            self._counts: collections.Counter[str] = collections.Counter()
            self._skipped: list[Skipped] = []
            self._rewritten: list[Rewritten] = []
            self._graphs: collections.deque[str] = collections.deque(maxlen=MAX_RECORDED_GRAPHS)
            self._graphs_seen = 0

    def record(self, outcome: GraphOutcome, graph: Graph) -> None:
        """Add one pass run; the graph is rendered only when the pass found a candidate in it."""
        rendered = format_graph(graph) if outcome.rewritten or outcome.skipped else None
        with self._lock:
            self._graphs_seen += 1
            self._counts.update(outcome.counts())
            self._skipped.extend(outcome.skipped)
            self._rewritten.extend(outcome.rewritten)
            if rendered is not None:
                self._graphs.append(rendered)

    def snapshot(self) -> CompileReport:
        """An immutable copy of the current state."""
        with self._lock:
            return CompileReport(
                rewrites={name: self._counts.get(name, 0) for name in PATTERNS},
                skipped=list(self._skipped),
                rewritten=list(self._rewritten),
                graphs=list(self._graphs),
                graphs_seen=self._graphs_seen,
            )


def _format_arg(arg: Any) -> str:
    if isinstance(arg, Node):
        return arg.name
    if isinstance(arg, (list, tuple)):
        inner = ", ".join(_format_arg(a) for a in arg)
        return f"[{inner}]" if isinstance(arg, list) else f"({inner}{',' if len(arg) == 1 else ''})"
    if isinstance(arg, torch.dtype):
        return str(arg)
    return repr(arg)


def _format_call(node: Node) -> str:
    args = [_format_arg(a) for a in node.args] + [f"{k}={_format_arg(v)}" for k, v in node.kwargs.items()]
    if node.op == "call_method":
        return f"{args[0]}.{node.target}({', '.join(args[1:])})"
    if node.op == "call_module":
        return f"self.{node.target}({', '.join(args)})"
    if node.op == "get_attr":
        return f"self.{node.target}"
    target = node.target
    if target is operator.getitem:
        return f"{args[0]}[{args[1]}]"
    if isinstance(target, torch._ops.OpOverload):
        name = str(target)
    else:
        name = _get_qualified_name(target).replace("_operator.", "operator.", 1)
    return f"{name}({', '.join(args)})"


def format_graph(graph: Graph) -> str:
    """A compact, torch-version-stable rendering of an FX graph: one ``name = call`` line per node, inputs
    first and the returned values last. OpOverloads print as ``softmax_ops.softmax.default``."""
    lines = []
    inputs = [node.name for node in graph.nodes if node.op == "placeholder"]
    lines.append(f"inputs: {', '.join(inputs)}")
    for node in graph.nodes:
        if node.op == "placeholder":
            continue
        if node.op == "output":
            lines.append(f"return {_format_arg(node.args[0])}")
        else:
            lines.append(f"{node.name} = {_format_call(node)}")
    return "\n".join(lines)
