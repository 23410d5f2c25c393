#!/usr/bin/env python3
"""Compare `python -m softmax_ops bench` runs of two trees (an A/B), case by case.

Usage:
    python benchmarks/compare_bench.py --base base-run1.json,base-run2.json --new new-run1.json,new-run2.json

Prints one line per (op, dtype, shape[, k]) that both sides measured: softmax_ops' xCopy (xSum for fused_topk) in
every base run, then in every new run, the kernel the new tree chose, and the mean change. The files may also be
tune_softmax.py / tune_topk.py JSON (what benchmarks/ab_tune.sh writes): then every timed kernel of a case is a
line of its own, named op:kernel ("auto" is the dispatcher's choice). Runs are listed, not
averaged away: small shapes move by about +-0.1 between runs of the same code, and a conclusion needs the runs
of both sides to separate (benchmarks/notes-softmax-tuning.md). This is how the A/B numbers in the notes and
commit messages are read off the committed *-ab*-*.json files. Standard library only.

--time compares our times (microseconds) and their relative change instead: on few-microsecond cases a ratio
also carries the yardstick's own run-to-run noise (x.sum of a 2 MB tensor moved by ~10% between the runs of
session 11's A/Bs while our kernel's time did not).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable

OURS = "softmax_ops"

Case = tuple[str, str, str, str]  # op, dtype, shape, k ("" outside fused_topk)


def shape_text(shape) -> str:
    return shape if isinstance(shape, str) else "x".join(str(n) for n in shape)


def measured(payload: dict, time: bool = False) -> Iterable[tuple[Case, float, str]]:
    """(case, value, kernel) of every softmax_ops measurement in one JSON file: a bench run (rows of impls) or
    a tune script's run (rows of cases, each with the timings of "auto" and the forced kernels). value: the
    ratio (xCopy / xSum), or with time the time in microseconds."""
    is_tune = "kernels" in payload
    for row in payload["rows"]:
        if not is_tune:
            value = row.get("ms") if time else row.get("xcopy", row.get("xsum"))
            if row.get("impl") == OURS and value is not None:
                # bench --out-dtype rows are a dtype pair of their own ("bf16->fp32", as tune rows name them).
                dtype = f"{row['dtype']}->{row['out_dtype']}" if row.get("out_dtype") else row["dtype"]
                yield (row["op"], dtype, shape_text(row["shape"]), str(row.get("k", ""))), \
                    value * 1e3 if time else value, row.get("kernel") or ""
            continue
        op = row.get("op", "fused_topk")  # tune_topk.py rows carry no op
        for timing in row["timings"]:
            ratio = timing.get("xcopy", timing.get("xsum"))
            if timing.get("ms") is None or ratio is None:
                continue
            kernel = row["auto_kernel"] if timing["kernel"] == "auto" else timing["kernel"]
            case = (f"{op}:{timing['kernel']}", row["dtype"], shape_text(row["shape"]), str(row.get("k", "")))
            yield case, timing["ms"] * 1e3 if time else ratio, kernel


def load_runs(paths: Iterable[str], time: bool = False) -> tuple[dict[Case, list[float]], dict[Case, str]]:
    """softmax_ops' ratio (or time) per case, one entry per file that measured it, and the last kernel named."""
    values: dict[Case, list[float]] = {}
    kernels: dict[Case, str] = {}
    for path in paths:
        with open(path) as handle:
            payload = json.load(handle)
        for case, value, kernel in measured(payload, time):
            values.setdefault(case, []).append(float(value))
            kernels[case] = kernel
    return values, kernels


def compare(base_paths: list[str], new_paths: list[str], time: bool = False) -> list[str]:
    """One text line per case measured on both sides, in the order the base files list them: the ratios and
    the change of their mean, or with time the microseconds and the relative change of their mean."""
    base, _ = load_runs(base_paths, time)
    new, new_kernels = load_runs(new_paths, time)
    lines = []
    for case, base_runs in base.items():
        new_runs = new.get(case)
        if not new_runs:
            continue
        op, dtype, shape, k = case
        label = f"{shape}k{k}" if k else shape
        base_mean = sum(base_runs) / len(base_runs)
        new_mean = sum(new_runs) / len(new_runs)
        change = f"{(new_mean / base_mean - 1) * 100:+.1f}%" if time else f"{new_mean - base_mean:+.2f}"
        digits = 1 if time else 2
        lines.append(f"{op:22s} {dtype:10s} {label:16s} base {' '.join(f'{r:.{digits}f}' for r in base_runs):16s} "
                     f"new {' '.join(f'{r:.{digits}f}' for r in new_runs):16s} {change:>6s}  {new_kernels[case]}")
    return lines


def timer_mismatch(base_paths: list[str], new_paths: list[str]) -> str | None:
    """A warning when the two sides' files name different timers (the bench's default changed in session 36: an
    A/B against an older tree times its side with do_bench), else None."""
    def timers(paths: list[str]) -> set[str]:
        found = set()
        for path in paths:
            with open(path) as handle:
                found.add(str(json.load(handle).get("timer", "?")))
        return found

    base, new = timers(base_paths), timers(new_paths)
    if base == new and len(base) == 1:
        return None
    return (f"WARNING: the runs were timed differently (base: {' | '.join(sorted(base))}; new: "
            f"{' | '.join(sorted(new))}): compare our few-microsecond cases with care")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", required=True, help="comma-separated bench JSON files of the base tree")
    parser.add_argument("--new", required=True, help="comma-separated bench JSON files of the new tree")
    parser.add_argument("--time", action="store_true", help="compare times (us, relative change), not ratios")
    args = parser.parse_args(argv)
    lines = compare(args.base.split(","), args.new.split(","), args.time)
    if not lines:
        print("no case was measured by both sides", file=sys.stderr)
        return 1
    warning = timer_mismatch(args.base.split(","), args.new.split(","))
    if warning:
        lines.insert(0, warning)  # on stdout: ab_tune.sh keeps it in compare.txt
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
