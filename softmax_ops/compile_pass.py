"""The torch.compile integration: a pre-grad graph pass that swaps softmax/log_softmax/top-k for our ops.

Inductor decomposes ``aten._softmax`` while AOTAutograd traces, so only the Dynamo (pre-grad) graph still
shows a softmax; the pass is installed as ``torch._inductor.config.pre_grad_custom_pass`` (DESIGN.md §6),
chained after whatever pass was there. It runs for the default ``inductor`` backend only.

Caching: where ``torch._inductor.config.pre_grad_pass_timing`` exists (torch 2.14 measured) the pass runs
after the FX-graph/AOTAutograd cache lookup and its ``uuid()`` is part of the cache key, so the uuid covers
the pass's source, the package version, the enabled state, the devices (and which of them the extension has
kernels for) and the uuid of a chained pass. On torch 2.11 the pass runs before the lookup, on every
compilation, and the key is computed from the rewritten graph itself. Either way a graph cached with the pass off is never reused with it on, or the other way round.
On newer torch a cache hit skips the pass, so ``compile_report()`` only counts graphs the pass ran on.

``disable()``/``enable()`` affect later compilations; already compiled functions keep their code until
``torch._dynamo.reset()`` (Dynamo does not guard on inductor configuration).
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch
import torch._inductor.config as inductor_config
from torch._inductor.custom_graph_pass import CustomGraphPass

from softmax_ops._compile_report import CompileReport, ReportRecorder
from softmax_ops._fusion import keeps_inductor_fusions
from softmax_ops._rewrite import GraphOutcome, has_kernels, rewrite_graph

log = logging.getLogger("softmax_ops")

DEFAULT_DEVICES = "cuda"
_DISABLE_VALUES = ("1", "true", "yes", "on")
# Every file whose contents decide what the pass does (the report module shapes only the report, but a
# stale uuid is worse than a rare spurious cache miss).
_PASS_FILES = ("compile_pass.py", "_patterns.py", "_rewrite.py", "_compile_report.py", "_fusion.py",
               "_metadata_uses.py", "_mutations.py")

_recorder = ReportRecorder()


class _State:
    enabled = False
    devices: frozenset[str] | None = None  # None: read SOFTMAX_OPS_DEVICES at each compilation


def _parse_devices(devices: str | Iterable[str]) -> frozenset[str]:
    items = devices.split(",") if isinstance(devices, str) else devices
    return frozenset(item.strip().lower() for item in items if item.strip())


def active_devices() -> frozenset[str]:
    """Device types whose graphs the pass rewrites: those given to ``enable(devices=...)``, else
    ``SOFTMAX_OPS_DEVICES`` (comma-separated, default ``cuda``; ``cuda,cpu`` also rewrites CPU graphs)."""
    if _State.devices is not None:
        return _State.devices
    return _parse_devices(os.environ.get("SOFTMAX_OPS_DEVICES", DEFAULT_DEVICES))


@functools.lru_cache(maxsize=1)
def _source_hash() -> str:
    from softmax_ops import __version__

    digest = hashlib.sha256(__version__.encode())
    here = Path(__file__).resolve().parent
    for name in _PASS_FILES:
        digest.update(name.encode())
        digest.update((here / name).read_bytes())
    return digest.hexdigest()


def _as_passes(installed: Any) -> tuple[Any, ...]:
    """The passes a ``pre_grad_custom_pass`` value stands for (None, one pass, or a list/tuple of them)."""
    if installed is None:
        return ()
    if isinstance(installed, (list, tuple)):
        return tuple(installed)
    return (installed,)


def _is_ours(candidate: Any) -> bool:
    return getattr(candidate, "_is_softmax_ops_pass", False) is True


class SoftmaxOpsGraphPass(CustomGraphPass):
    """The pre-grad pass: runs the pass it replaced in the config (if any), then rewrites the graph.

    Example:
        >>> import torch, softmax_ops
        >>> installed = torch._inductor.config.pre_grad_custom_pass
        >>> isinstance(installed, softmax_ops.compile_pass.SoftmaxOpsGraphPass)
        True
    """

    _is_softmax_ops_pass = True

    def __init__(self, chained: Any = None) -> None:
        self.chained = chained

    def __call__(self, graph: torch.fx.Graph) -> None:
        for user_pass in _as_passes(self.chained):
            user_pass(graph)
        if not _State.enabled:
            return
        outcome = rewrite_graph(graph, active_devices())
        _recorder.record(outcome, graph)
        _log_outcome(outcome, graph)

    def uuid(self) -> str | None:
        """Identifies what this pass does to a graph; None (no caching of pre-grad results) when a chained
        pass cannot say what it does."""
        chained_ids = []
        for user_pass in _as_passes(self.chained):
            user_id = user_pass.uuid() if isinstance(user_pass, CustomGraphPass) else None
            if user_id is None:
                return None
            chained_ids.append(repr(user_id))
        key = "|".join(
            [
                _source_hash(),
                "enabled" if _State.enabled else "disabled",
                "keep fusions" if keeps_inductor_fusions() else "rewrite fused",
                ",".join(sorted(active_devices())),
                # A CPU-only build leaves CUDA graphs alone: its cached graphs must not serve a CUDA build.
                ",".join(sorted(d for d in active_devices() if has_kernels(d))),
                *chained_ids,
            ]
        )
        return hashlib.sha256(key.encode()).hexdigest()


def _log_outcome(outcome: GraphOutcome, graph: torch.fx.Graph) -> None:
    for done in outcome.rewritten:
        log.debug(
            "softmax_ops: rewrote %s at node %s (%s) -> %s",
            done.pattern,
            done.node,
            done.where,
            done.replacement,
        )
    for skipped in outcome.skipped:
        log.debug(
            "softmax_ops: left %s at node %s (%s): %s",
            skipped.pattern,
            skipped.node,
            skipped.where,
            skipped.reason,
        )
    if outcome.rewritten or outcome.skipped:
        log.info(
            "softmax_ops: graph of %d nodes: rewrote %s; skipped %d candidate(s)",
            len(graph.nodes),
            outcome.counts() or "nothing",
            len(outcome.skipped),
        )


def enable(devices: str | Iterable[str] | None = None) -> None:
    """Rewrite softmax, log_softmax and softmax/top-k patterns in graphs compiled from now on.

    ``devices``: device types to rewrite on (e.g. ``"cuda,cpu"``); None reads ``SOFTMAX_OPS_DEVICES`` at each
    compilation (default ``cuda``). A pass already installed as ``pre_grad_custom_pass`` is kept and runs
    first (install yours before calling this, or call this again after); ``enable()`` never chains twice.
    ``import softmax_ops`` calls this unless ``SOFTMAX_OPS_DISABLE=1``.

    Example:
        >>> import softmax_ops
        >>> softmax_ops.enable(devices="cuda")
        >>> softmax_ops.is_enabled()
        True
    """
    _State.devices = None if devices is None else _parse_devices(devices)
    _State.enabled = True
    installed = inductor_config.pre_grad_custom_pass
    if not any(_is_ours(p) for p in _as_passes(installed)):
        inductor_config.pre_grad_custom_pass = SoftmaxOpsGraphPass(chained=installed)


def disable() -> None:
    """Stop rewriting graphs compiled from now on, and give ``pre_grad_custom_pass`` back the pass it held
    before ``enable()``. Functions compiled earlier keep their code until ``torch._dynamo.reset()``.

    Example:
        >>> import softmax_ops
        >>> softmax_ops.disable(); softmax_ops.is_enabled()
        False
        >>> softmax_ops.enable()
    """
    _State.enabled = False
    installed = inductor_config.pre_grad_custom_pass
    if _is_ours(installed):
        inductor_config.pre_grad_custom_pass = installed.chained
    # Otherwise our pass is absent or inside a list the user built: it stays there, does nothing while
    # disabled, and its uuid says "disabled".


def is_enabled() -> bool:
    """Whether graphs compiled now are rewritten: enabled, and still installed in ``pre_grad_custom_pass``
    (a pass assigned there after ``import softmax_ops`` replaces ours; call ``enable()`` to chain it)."""
    return _State.enabled and any(_is_ours(p) for p in _as_passes(inductor_config.pre_grad_custom_pass))


def disabled_by_environment() -> bool:
    """True when ``SOFTMAX_OPS_DISABLE`` asks ``import softmax_ops`` not to enable the pass."""
    return os.environ.get("SOFTMAX_OPS_DISABLE", "").strip().lower() in _DISABLE_VALUES


def compile_report() -> CompileReport:
    """What the pass has done since import or the last ``reset_compile_report()``: rewrites per pattern,
    skipped candidates with reasons, and the most recent rewritten graphs.

    Example:
        >>> import softmax_ops
        >>> sorted(softmax_ops.compile_report().rewrites)
        ['log_softmax', 'softmax', 'softmax_topk', 'softmax_topk_renorm', 'topk_softmax']
    """
    return _recorder.snapshot()


def reset_compile_report() -> None:
    """Forget what ``compile_report()`` has recorded."""
    _recorder.reset()
