#!/usr/bin/env python3
"""Render the README's performance section (markdown) from committed `python -m softmax_ops bench` JSON.

Usage:
    python benchmarks/make_readme_table.py benchmarks/results/<gpu>-<date>.json [more.json ...] > table.md

Several files (e.g. forward, backward and fused_topk runs made separately) are merged; they must come from
the same GPU. A later file's row for the same case and implementation replaces an earlier one: list a re-run of
some cases (e.g. of a run's sporadic outliers) after the run, and say so where the tables are quoted. The tables need the standard library only; --plot imports softmax_ops' plotting helper (and so
builds or loads the extension, as any import of softmax_ops does).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Iterable

OURS = "softmax_ops"
OP_ORDER = ("softmax", "log_softmax", "softmax_backward", "log_softmax_backward", "fused_topk")
DTYPE_ORDER = ("fp16", "bf16", "fp32")
XCOPY_BAR = 0.85


def load(paths: Iterable[str]) -> tuple[dict, list[dict]]:
    """The first file's header and every file's rows; raises ValueError when the files name different GPUs."""
    header: dict = {}
    rows: list[dict] = []
    timers: dict[str, list[str]] = {}  # timer -> the files timed with it, for the provenance line
    for path in paths:
        with open(path) as handle:
            document = json.load(handle)
        if header and document.get("gpu") != header.get("gpu"):
            raise ValueError(f"{path}: measured on {document.get('gpu')!r}, not {header.get('gpu')!r}")
        header = header or {key: value for key, value in document.items() if key != "rows"}
        timers.setdefault(str(document.get("timer", "?")), []).append(path.rsplit("/", 1)[-1])
        rows += document["rows"]
    if len(timers) > 1:  # e.g. sweeps from before and after session 36's events timer
        header["timer"] = "; ".join(f"{timer} ({', '.join(files)})" for timer, files in timers.items())
    return header, rows


def _ratio(row: dict) -> float | None:
    return row.get("xsum", row.get("xcopy"))


def _geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


def _case_key(row: dict) -> tuple:
    # A row with its own result dtype (bench --out-dtype) is a dtype of its own: "bf16->fp32".
    dtype = f"{row['dtype']}->{row['out_dtype']}" if row.get("out_dtype") else row["dtype"]
    return (row["op"], dtype, row["shape"], row.get("k", 0))


def _sorted_ops(ops: Iterable[str]) -> list[str]:
    return sorted(set(ops), key=lambda op: OP_ORDER.index(op) if op in OP_ORDER else len(OP_ORDER))


def _sorted_dtypes(dtypes: Iterable[str]) -> list[str]:
    return sorted(set(dtypes), key=lambda d: DTYPE_ORDER.index(d) if d in DTYPE_ORDER else len(DTYPE_ORDER))


def cases(rows: list[dict]) -> dict[tuple, dict[str, dict]]:
    """Rows grouped by case: (op, dtype, shape, k) -> {impl: row}, keeping only timed rows (a later row of the
    same case and impl replaces an earlier one)."""
    grouped: dict[tuple, dict[str, dict]] = {}
    for row in rows:
        if row.get("ms"):
            grouped.setdefault(_case_key(row), {})[row["impl"]] = row
    return grouped


def _speedup(impls: dict[str, dict], baseline: str) -> float | None:
    ours, theirs = impls.get(OURS), impls.get(baseline)
    return theirs["ms"] / ours["ms"] if ours and theirs else None


def summary_table(grouped: dict[tuple, dict[str, dict]]) -> list[str]:
    """One line per (op, dtype): geomean and min xCopy/xSum, shapes at the bar, geomean speedups."""
    lines = [
        ("| op | dtype | shapes | geomean xCopy/xSum | min | shapes >= 0.85 | vs eager (geomean) "
        "| vs torch.compile (geomean) |"),
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    keys = {(op, dtype) for op, dtype, _, _ in grouped}
    for op in _sorted_ops(op for op, _ in keys):
        for dtype in _sorted_dtypes(d for o, d in keys if o == op):
            ours = [impls for key, impls in grouped.items() if key[:2] == (op, dtype) and OURS in impls]
            ratios = [r for r in (_ratio(impls[OURS]) for impls in ours) if r]
            if not ratios:
                continue
            cells = [op, dtype, str(len(ours)), f"{_geomean(ratios):.2f}", f"{min(ratios):.2f}",
                     f"{sum(r >= XCOPY_BAR for r in ratios)}/{len(ratios)}"]
            for baseline in ("torch_eager", "torch_compile"):
                speedups = [s for s in (_speedup(impls, baseline) for impls in ours) if s]
                cells.append(f"{_geomean(speedups):.2f}x" if speedups else "-")
            lines.append("| " + " | ".join(cells) + " |")
    return lines


def detail_table(grouped: dict[tuple, dict[str, dict]], op: str) -> list[str]:
    """Per shape of ``op``: for each dtype `xCopy (speedup vs eager / vs torch.compile)`, and the kernels."""
    keys = [key for key in grouped if key[0] == op]
    dtypes = _sorted_dtypes(key[1] for key in keys)
    shapes = list(dict.fromkeys((key[2], key[3]) for key in keys))
    name = "xSum" if op == "fused_topk" else "xCopy"
    lines = [
        f"| shape | {' | '.join(f'{d}: {name} (vs eager / vs compile)' for d in dtypes)} | kernel |",
        "|---|" + "---:|" * len(dtypes) + "---|",
    ]
    for shape, k in shapes:
        cells = [f"{shape} k{k}" if k else shape]
        kernels: list[str] = []
        for dtype in dtypes:
            impls = grouped.get((op, dtype, shape, k), {})
            ours = impls.get(OURS)
            if ours is None:
                cells.append("-")
                continue
            eager, compiled = _speedup(impls, "torch_eager"), _speedup(impls, "torch_compile")
            cells.append(f"{_ratio(ours):.2f} ({_fmt_speedup(eager)} / {_fmt_speedup(compiled)})")
            if ours.get("kernel") and ours["kernel"] not in kernels:
                kernels.append(ours["kernel"])
        cells.append(", ".join(kernels) or "-")
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _fmt_speedup(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def _rounds_text(header: dict) -> str:
    rounds = header.get("rounds", 1)
    return f"; each implementation timed in {rounds} rounds, in turns, the fastest shown" if rounds > 1 else ""


def render(header: dict, rows: list[dict]) -> str:
    """The whole markdown section: provenance line, summary table, one detail table per op."""
    grouped = cases(rows)
    text = [
        (f"Measured on **{header.get('gpu', 'unknown GPU')}** with torch {header.get('torch', '?')}"
        f" on {header.get('date', '?')} (`python -m softmax_ops bench`; timer: {header.get('timer', '?')}"
        f"{_rounds_text(header)})."),
        ("xCopy = time of a `y.copy_(x)` moving the same bytes (half read, half written: for a same-dtype backward, "
         "a copy of 1.5x the tensor) / our time; "
        "xSum = time of `x.sum(-1)` on the same logits / our time (fused_topk). 1.00 = as fast as the copy."),
        "",
        *summary_table(grouped),
    ]
    for op in _sorted_ops(key[0] for key in grouped):
        text += ["", f"**{op}**", "", *detail_table(grouped, op)]
    return "\n".join(text) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Print the markdown for the given result files."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", nargs="+", help="bench JSON files (benchmarks/results/*.json)")
    parser.add_argument("--plot", metavar="PATH", help="also write the bench's PNG plot of these rows to PATH")
    args = parser.parse_args(argv)
    try:
        header, rows = load(args.results)
    except (OSError, ValueError, KeyError) as error:
        print(f"make_readme_table: {error}", file=sys.stderr)
        return 1
    sys.stdout.write(render(header, rows))
    if args.plot:
        from softmax_ops._bench_plot import MISSING_MATPLOTLIB, matplotlib_available, plot_rows

        if not matplotlib_available():
            print(f"make_readme_table: {MISSING_MATPLOTLIB}", file=sys.stderr)
            return 1
        plot_rows(rows, args.plot, f"softmax_ops on {header['gpu']} (torch {header['torch']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
