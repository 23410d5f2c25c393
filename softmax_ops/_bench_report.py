"""Benchmark results: one row per (case, implementation), the final table, the summary and the JSON file."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field

from softmax_ops._bench_cases import TOPK_OP, Case

# PERF.md's bar: every softmax shape >= 0.85 xCopy (geomean >= 0.95); fused_topk >= 0.95 xSum on every
# shape of at least 16 MB.
XCOPY_BAR = 0.85
XCOPY_GEOMEAN_BAR = 0.95
XSUM_BAR = 0.95
XSUM_MIN_BYTES = 16 * 1024 * 1024
ROUTER_TOKENS = 16384
# A case's rounds are flagged when one took this many times another (run-to-run noise stays within ~1.2x).
ROUND_SPREAD_FLAG = 1.5


@dataclass
class Row:
    """One JSON row: an implementation's time on a case (``ms`` is None when it was not timed)."""

    op: str
    dtype: str
    shape: str
    impl: str
    ms: float | None
    gbps: float | None
    ratio: float | None  # xcopy or xsum: yardstick time / this time
    ratio_name: str
    kernel: str | None
    k: int = 0
    note: str | None = None
    ms_rounds: list[float] | None = None  # every round's time; ``ms`` is the smallest
    out_dtype: str | None = None  # the forward's dtype= where it differs from ``dtype`` (see Case)

    def to_json(self) -> dict:
        data = asdict(self)
        ratio, name = data.pop("ratio"), data.pop("ratio_name")
        data[name] = _round(ratio, 4)
        data["ms"], data["gbps"] = _round(self.ms, 6), _round(self.gbps, 3)
        if self.ms_rounds is None:
            data.pop("ms_rounds")
        else:
            data["ms_rounds"] = [_round(ms, 6) for ms in self.ms_rounds]
        if self.op != TOPK_OP:
            data.pop("k")
        if self.note is None:
            data.pop("note")
        if self.out_dtype is None:
            data.pop("out_dtype")
        return data


def _round(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


@dataclass
class CaseResult:
    """Everything measured for one case: the yardstick and each implementation's time."""

    case: Case
    yardstick_ms: float | None
    times: dict[str, float]  # impl -> ms
    kernel: str | None
    notes: dict[str, str]  # impl -> why it was not timed (failed check, unavailable, error)
    round_times: dict[str, list[float]] = field(default_factory=dict)  # impl -> each round's ms
    # baseline -> the implementation of ours it races where that is not "softmax_ops" (Quack's renormalized top-k)
    raced_by: dict[str, str] = field(default_factory=dict)

    def disagreeing_rounds(self, factor: float = ROUND_SPREAD_FLAG) -> dict[str, list[float]]:
        """The implementations whose slowest round took more than ``factor`` times their fastest."""
        return {impl: samples for impl, samples in self.round_times.items()
                if len(samples) > 1 and max(samples) > factor * min(samples)}

    def rows(self) -> list[Row]:
        rows = []
        for impl in sorted({*self.times, *self.notes}, key=_impl_order):
            ms = self.times.get(impl)
            gbps = self.case.bytes_moved / (ms * 1e-3) / 1e9 if ms else None
            ratio = self.yardstick_ms / ms if ms and self.yardstick_ms else None
            rows.append(Row(
                op=self.case.op, dtype=self.case.dtype_name, shape=self.case.shape_text, impl=impl, ms=ms,
                gbps=gbps, ratio=ratio, ratio_name=self.case.reference_name,
                kernel=self.kernel if impl in _OURS_IMPLS else None, k=self.case.k,
                note=self.notes.get(impl), ms_rounds=self.round_times.get(impl),
                out_dtype=self.case.out_dtype_name,
            ))
        return rows

    def speedup(self, baseline: str) -> float | None:
        """``baseline``'s time over the time of the implementation of ours it races."""
        ours, theirs = self.times.get(self.raced_by.get(baseline, "softmax_ops")), self.times.get(baseline)
        return theirs / ours if ours and theirs else None

    @property
    def ratio(self) -> float | None:
        ours = self.times.get("softmax_ops")
        return self.yardstick_ms / ours if ours and self.yardstick_ms else None


# softmax_ops_renormalized: fused_topk(x, k, -1, True), timed where Quack's top-k races it (_bench_impls.py).
_OURS_IMPLS = ("softmax_ops", "softmax_ops_renormalized")
_IMPL_ORDER = (*_OURS_IMPLS, "torch_eager", "torch_compile", "liger", "quack")


def _impl_order(impl: str) -> int:
    return _IMPL_ORDER.index(impl) if impl in _IMPL_ORDER else len(_IMPL_ORDER)


def _fmt(value: float | None, spec: str, suffix: str = "") -> str:
    return "-" if value is None else f"{value:{spec}}{suffix}"


def format_table(results: Iterable[CaseResult], baselines: list[str]) -> str:
    """The final table: one line per case with our time, GB/s, xCopy/xSum, speedups and the kernel."""
    header = ["op", "dtype", "shape", "k", "ms", "GB/s", "xCopy/xSum"]
    header += [f"vs {name.removeprefix('torch_')}" for name in baselines] + ["kernel"]
    lines = [header]
    for result in results:
        case = result.case
        ours_ms = result.times.get("softmax_ops")
        line = [
            case.op, case.dtype_text, case.shape_text, str(case.k) if case.k else "",
            _fmt(ours_ms, ".4f") if ours_ms else (result.notes.get("softmax_ops") or "-")[:28],
            _fmt(case.bytes_moved / (ours_ms * 1e-3) / 1e9 if ours_ms else None, ".0f"),
            _fmt(result.ratio, ".2f"),
        ]
        line += [_fmt(result.speedup(name), ".2f", "x") for name in baselines]
        line.append(result.kernel or "-")
        lines.append(line)
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    text = []
    for number, line in enumerate(lines):
        text.append("  ".join(cell.ljust(width) for cell, width in zip(line, widths)).rstrip())
        if number == 0:
            text.append("  ".join("-" * width for width in widths))
    return "\n".join(text)


def _geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


def summary_lines(results: list[CaseResult], baselines: list[str]) -> list[str]:
    """Per op and dtype: geometric-mean xCopy (xSum), shapes at or above the bar, wins over each baseline."""
    lines = []
    groups: dict[tuple[str, str], list[CaseResult]] = {}
    for result in results:
        groups.setdefault((result.case.op, result.case.dtype_text), []).append(result)
    for (op, dtype_name), group in groups.items():
        timed = [r for r in group if r.ratio is not None]
        name = "xSum" if op == TOPK_OP else "xCopy"
        if not timed:
            lines.append(f"{op} {dtype_name}: no timed shapes")
            continue
        ratios = [r.ratio for r in timed if r.ratio is not None]
        text = (f"{op} {dtype_name}: geomean {_geomean(ratios):.2f} {name}, "
                f"{sum(v >= XCOPY_BAR for v in ratios)}/{len(group)} shapes >= {XCOPY_BAR} {name}")
        for baseline in baselines:
            speedups = [s for s in (r.speedup(baseline) for r in timed) if s is not None]
            if speedups:
                short = baseline.removeprefix("torch_")
                text += f"; faster than {short} on {sum(s > 1 for s in speedups)}/{len(speedups)}"
        if op == TOPK_OP:
            big = [r for r in timed if r.case.numel * r.case.element_size >= XSUM_MIN_BYTES]
            if big:
                passing = sum((r.ratio or 0) >= XSUM_BAR for r in big)
                text += f"; shapes >= 16 MB: {passing}/{len(big)} >= {XSUM_BAR} xSum"
            routers = [s for s in (r.speedup("torch_eager") for r in timed if r.case.rows == ROUTER_TOKENS)
                       if s is not None]
            if routers:
                text += f"; {ROUTER_TOKENS}-token routers: min {min(routers):.1f}x vs eager"
        elif len(ratios) == len(group):
            text += f" (bar: all >= {XCOPY_BAR}, geomean >= {XCOPY_GEOMEAN_BAR})"
        lines.append(text)
    return lines


def write_json(path: str, header: dict, results: list[CaseResult]) -> None:
    """Write ``header`` plus one row per (case, impl) to ``path`` atomically (rewritten after every case, so
    an interrupted run keeps what it measured)."""
    document = dict(header)
    document["rows"] = [row.to_json() for result in results for row in result.rows()]
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    temporary = f"{path}.tmp"
    with open(temporary, "w") as handle:
        json.dump(document, handle, indent=1)
        handle.write("\n")
    os.replace(temporary, path)
