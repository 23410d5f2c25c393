"""Times every forced fused_topk kernel against the dispatcher's own choice on PERF.md's fused_topk cases.

For each (case, dtype): x.sum(-1) on the same logits (the xSum yardstick), the automatic choice, then each
kernel of ``softmax_ops.list_kernels("topk")`` forced with ``softmax_ops.force_kernel``. Every result is
checked against a float64 reference with the benchmark's bound (2x torch eager's own error + one rounding
step) before it is timed; a kernel that "cannot handle" the shape is skipped. Forced split_row / radix
always split a row in two or more chunks (the dispatcher's forced plan), which the automatic plan may not.

One GPU call (stops starting new cases after --time-budget seconds, counted from the start)::

    python3 benchmarks/tune_topk.py --json $OUT/tune_topk.json
    python3 benchmarks/tune_topk.py --cases 65536x256k8,1024x50000k50 --dtypes fp16,fp32

Table on stdout: per kernel ``us/xSum`` and the error over its bound (``e/b``, must be <= 1); ``FASTER``
marks a forced kernel more than 5% faster than the automatic choice.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass, field

from _tune_common import check_then_time, write_json

# softmax_ops is imported inside main(): importing it JIT-builds the extension, and --help must not.

FASTER_MARGIN = 1.05  # a forced kernel is flagged when auto_ms / forced_ms exceeds this
BIG_BYTES = 16 * 1024 * 1024  # PERF.md: the 0.95 xSum bar applies to logits of at least this size
AUTO = "auto"


@dataclass
class Timing:
    """One implementation on one (case, dtype): time, xSum, and its accuracy check."""

    kernel: str
    ms: float | None = None
    xsum: float | None = None
    error: float | None = None
    bound: float | None = None
    note: str | None = None  # why it was not timed ("cannot handle ...", "WRONG ...", an error)


@dataclass
class CaseRow:
    """Everything measured on one (case, dtype)."""

    shape: str
    k: int
    dtype: str
    megabytes: float
    sum_ms: float | None
    auto_kernel: str
    explain: str
    timings: list[Timing] = field(default_factory=list)
    faster_than_auto: list[str] = field(default_factory=list)


def build_parser() -> argparse.ArgumentParser:
    """The command line (see the module docstring)."""
    parser = argparse.ArgumentParser(
        description="Time every forced fused_topk kernel vs the automatic choice on PERF.md's fused_topk "
        "cases: xSum (x.sum(-1) time / ours), accuracy vs float64, and forced kernels > 5% faster.")
    parser.add_argument("--cases", default=None,
                        help="comma-separated ROWSxNkK (default: PERF.md's fused_topk list, e.g. 65536x256k8)")
    parser.add_argument("--dtypes", default="fp16,bf16,fp32", help="comma-separated: fp16, bf16, fp32")
    parser.add_argument("--kernels", default=None,
                        help="comma-separated forced kernels (default: every name in list_kernels('topk'); "
                        "none: the automatic choice only)")
    parser.add_argument("--time-budget", type=float, default=420.0, metavar="SECONDS",
                        help="start no new case after this many seconds from the start, build included "
                        "(default 420: the call stays under 8 minutes)")
    parser.add_argument("--json", default=None, metavar="PATH", help="write every measurement as JSON")
    return parser


def _measure(fn, check, timer, sum_ms: float | None, kernel: str) -> Timing:
    """Checks fn's result, then times it; failures become a note rather than an exception."""
    checked = check_then_time(fn, check, timer, ("cannot handle",), with_reason=False, limit=160)
    xsum = sum_ms / checked.ms if sum_ms and checked.ms else None
    return Timing(kernel, checked.ms, xsum, checked.error, checked.bound, checked.note)


def run_case(case, kernels: list[str], timer, device) -> CaseRow:
    """Yardstick, automatic choice and every forced kernel on one case (inputs allocated once)."""
    import softmax_ops
    from softmax_ops._bench_impls import OURS, chosen_kernel, prepare_case

    prepared = prepare_case(case, device, {}, with_compile=False)
    sum_ms = timer(prepared.yardstick)
    ours = prepared.impls[OURS]
    row = CaseRow(
        shape=case.shape_text, k=case.k, dtype=case.dtype_name,
        megabytes=round(case.numel * case.element_size / 2**20, 2), sum_ms=sum_ms,
        auto_kernel=chosen_kernel(case.op, case.shape, case.dtype, case.k, device),
        explain=softmax_ops.explain(case.shape, case.dtype, op=case.op, k=case.k),
    )
    auto = _measure(ours, prepared.check, timer, sum_ms, AUTO)
    row.timings.append(auto)
    for name in kernels:
        with softmax_ops.force_kernel("topk", name):
            forced = _measure(ours, prepared.check, timer, sum_ms, name)
        row.timings.append(forced)
        if auto.ms and forced.ms and auto.ms / forced.ms > FASTER_MARGIN:
            row.faster_than_auto.append(f"{name} {auto.ms / forced.ms:.2f}x")
    del prepared
    import torch

    torch.cuda.empty_cache()
    return row


def _cell(timing: Timing) -> str:
    if timing.ms is None:
        note = timing.note or "?"
        if note.startswith("WRONG") and timing.error is not None and timing.bound:
            return f"WRONG e/b {timing.error / timing.bound:.2f}"
        return note[:22]
    ratio = f" e/b {timing.error / timing.bound:.2f}" if timing.error is not None and timing.bound else ""
    return f"{timing.ms * 1e3:7.1f}us {timing.xsum or 0:4.2f}x{ratio}"


def format_table(rows: list[CaseRow], kernels: list[str]) -> str:
    """One line per (case, dtype): sum time, automatic choice, each forced kernel, flags."""
    width = 27
    head = f"{'case':>16} {'dtype':>5} {'MB':>6} {'sum us':>7} | {'auto (kernel)':<{width + 12}}"
    head += "".join(f" | {name:<{width}}" for name in kernels) + " | forced faster than auto"
    lines = [head, "-" * len(head)]
    for row in rows:
        cells = {t.kernel: t for t in row.timings}
        sum_us = f"{row.sum_ms * 1e3:7.1f}" if row.sum_ms else "      -"
        big = "*" if row.megabytes * 2**20 >= BIG_BYTES else " "
        auto_text = f"{_cell(cells[AUTO])} ({row.auto_kernel})"
        line = f"{row.shape + 'k' + str(row.k):>16} {row.dtype:>5} {row.megabytes:5.1f}{big} {sum_us} | "
        line += f"{auto_text:<{width + 12}}"
        line += "".join(f" | {_cell(cells[name]) if name in cells else '-':<{width}}" for name in kernels)
        line += " | " + (", ".join(row.faster_than_auto) or "-")
        lines.append(line)
    lines.append("us = median time (do_bench, L2 flushed), x = xSum (x.sum(-1) time / ours), e/b = max error vs "
                 "float64 over the 2x-torch bound (<= 1 passes); * = >= 16 MB (bar: xSum >= 0.95)")
    return "\n".join(lines)


def _summary(rows: list[CaseRow]) -> list[str]:
    lines = []
    big = [r for r in rows if r.megabytes * 2**20 >= BIG_BYTES]
    for row in big:
        best = max((t for t in row.timings if t.xsum), key=lambda t: t.xsum or 0, default=None)
        if best is not None:
            lines.append(f"{row.shape}k{row.k} {row.dtype}: best {best.kernel} {best.xsum:.2f} xSum"
                         f"{'' if (best.xsum or 0) >= 0.95 else '  (below the 0.95 bar)'}")
    wrong = [f"{r.shape}k{r.k} {r.dtype} {t.kernel}: {t.note}" for r in rows for t in r.timings
             if t.note and not t.note.startswith("n/a")]
    return lines + (["problems:"] + wrong if wrong else [])


def _write_json(path: str, header: dict, rows: list[CaseRow]) -> None:
    write_json(path, header, rows)


def main(argv: list[str] | None = None) -> int:
    """Parse arguments, run every case within the time budget, print the table, write the JSON."""
    start = time.monotonic()
    args = build_parser().parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("tune_topk: needs a CUDA device (the forced kernels are CUDA kernels)", file=sys.stderr)
        return 2
    import softmax_ops
    from softmax_ops._bench_cases import TOPK_CASES, TOPK_OP, Case, parse_dtypes, parse_shapes
    from softmax_ops._bench_timing import make_timer

    device = torch.device("cuda")
    timer = make_timer(device)
    kernels = args.kernels.split(",") if args.kernels else softmax_ops.list_kernels("topk")
    kernels = [] if kernels == ["none"] else kernels
    cases = parse_shapes(args.cases) if args.cases else TOPK_CASES
    dtypes = parse_dtypes(args.dtypes)
    header = {"gpu": torch.cuda.get_device_name(device), "torch": torch.__version__, "timer": timer.description,
              "kernels": kernels, "build_and_import_s": round(time.monotonic() - start, 1)}
    print(f"{header['gpu']}, torch {header['torch']}; timer: {timer.description}; kernels {kernels}; "
          f"import/build {header['build_and_import_s']} s", flush=True)
    rows: list[CaseRow] = []
    skipped: list[str] = []
    for rows_n, cols, k in cases:
        for dtype_name in dtypes:
            label = f"{rows_n}x{cols}k{k} {dtype_name}"
            if time.monotonic() - start > args.time_budget:
                skipped.append(label)
                continue
            case = Case(TOPK_OP, dtype_name, rows_n, cols, k)
            try:
                row = run_case(case, kernels, timer, device)
            except Exception as error:  # noqa: BLE001  (a failed setup is reported, the sweep goes on)
                skipped.append(f"{label} (setup failed: {type(error).__name__}: {str(error)[:120]})")
                continue
            rows.append(row)
            print(f"[{time.monotonic() - start:5.0f}s] {label}: auto {row.auto_kernel} {_cell(row.timings[0])}",
                  flush=True)
            if args.json:
                _write_json(args.json, {**header, "not_run": skipped}, rows)
    print()
    print(format_table(rows, kernels))
    for line in _summary(rows):
        print(line)
    if skipped:
        print("not run (time budget or setup failure): " + "; ".join(skipped))
    if args.json:
        _write_json(args.json, {**header, "not_run": skipped}, rows)
        print(f"JSON: {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
