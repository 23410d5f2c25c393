"""Times every forced softmax-family kernel against the dispatcher's choice on PERF.md's sweep.

For each (shape, dtype, op) of softmax, log_softmax, softmax_backward and log_softmax_backward it times
the copy yardstick (`y.copy_(x)`; the backward's copies 1.5x the elements), the automatic choice, torch
eager, then each kernel of ``softmax_ops.list_kernels(family)`` forced with ``softmax_ops.force_kernel``.
Every result is checked against a float64 reference with the benchmark's bound (2x torch eager's own error
plus one rounding step, ``softmax_ops._bench_impls``) before it is timed. A forced kernel that cannot run
the shape (explain says "cannot run this problem", or the call raises "cannot handle") is skipped.

The forced plan is the dispatcher's forced plan, which can differ from the automatic plan of the same
kernel (a forced split_row always splits in >= 2 chunks; a forced cluster_onepass starts at the cluster
size that covers every SM). Each timing keeps its plan line from ``softmax_ops.explain``.

``strided`` is left out by default: the dispatcher picks it only when the reduced dim is not the last one
(inner > 1), which no sweep shape has; ``--kernels`` adds it back.

One GPU call (no new case starts after --time-budget seconds, counted from the start, build included)::

    python3 benchmarks/tune_softmax.py --json $OUT/tune_softmax.json
    python3 benchmarks/tune_softmax.py --ops softmax --dtypes bf16 --shapes 2048x4096,64x151936
    python3 benchmarks/tune_softmax.py --dry-run      # plans only (explain), no timing; works without a GPU
    python3 benchmarks/tune_softmax.py --dtypes fp16,bf16 --out-dtype fp32   # softmax(x_half, dtype=float32)

Table on stdout: per kernel ``us xCopy``; ``FASTER`` lists forced kernels more than 5% faster than the
automatic choice (a dispatcher threshold to revisit).
"""

from __future__ import annotations

import argparse
import datetime
import sys
import time
from dataclasses import dataclass, field

from _tune_common import check_then_time, write_json

# softmax_ops and torch are imported inside main(): importing softmax_ops JIT-builds the extension, and
# --help must not.

FASTER_MARGIN = 1.05  # a forced kernel is flagged when auto_ms / forced_ms exceeds this
AUTO = "auto"
EAGER = "eager"
# Loop order (op outermost): if the time budget runs out, log_softmax goes first; it runs the same plans as
# softmax (the dispatcher ignores `log`), so it adds the least.
OPS = ("softmax", "softmax_backward", "log_softmax_backward", "log_softmax")
FAMILY = {"softmax": "softmax", "log_softmax": "softmax",
          "softmax_backward": "softmax_backward", "log_softmax_backward": "softmax_backward"}
SHORT_OP = {"softmax": "sm", "log_softmax": "lsm", "softmax_backward": "sm_bw", "log_softmax_backward": "lsm_bw"}
# The dispatcher chooses strided only for inner > 1; the sweep reduces the last dim.
DEFAULT_LEFT_OUT = ("strided",)
# Shapes of the 2026-11-22 H200 results table (benchmarks/results/) that PERF.md's softmax sweep lacks:
# the router shapes that ran slower than eager, and a 50000-wide vocabulary.
EXTRA_SHAPES: list[tuple[int, int]] = [(65536, 256), (16384, 160), (16384, 64), (1024, 50000)]
CANNOT = ("cannot handle", "cannot run this problem")
MEMORY_HEADROOM = 0.85  # use at most this fraction of the free device memory for one case
FLUSH_BYTES = 256 * 1024 * 1024  # do_bench's L2-flush buffer stays allocated beside the case


@dataclass
class Timing:
    """One implementation on one case: time, xCopy, accuracy, and the plan it ran."""

    kernel: str
    ms: float | None = None
    xcopy: float | None = None
    error: float | None = None
    bound: float | None = None
    plan: str | None = None
    note: str | None = None  # why it was not timed: "n/a ..." (cannot run the shape), "WRONG ...", an error


@dataclass
class CaseRow:
    """Everything measured on one (shape, dtype, op)."""

    op: str
    shape: str
    dtype: str
    megabytes: float
    copy_ms: float | None
    auto_kernel: str
    timings: list[Timing] = field(default_factory=list)
    faster_than_auto: list[str] = field(default_factory=list)


def build_parser() -> argparse.ArgumentParser:
    """The command line (see the module docstring)."""
    parser = argparse.ArgumentParser(
        description="Time every forced softmax / softmax_backward kernel vs the automatic choice on PERF.md's "
        "sweep: xCopy, accuracy vs float64, and forced kernels more than 5%% faster than the automatic one.")
    parser.add_argument("--ops", default=",".join(OPS), help="comma-separated, from: " + ", ".join(OPS))
    parser.add_argument("--dtypes", default="fp16,bf16,fp32", help="comma-separated: fp16, bf16, fp32")
    parser.add_argument("--shapes", default=None,
                        help="comma-separated ROWSxN (default: PERF.md's sweep plus "
                        + ", ".join(f"{r}x{n}" for r, n in EXTRA_SHAPES) + ")")
    parser.add_argument("--out-dtype", default=None, metavar="DTYPE",
                        help="the forward's dtype= (e.g. fp32 with --dtypes fp16,bf16); the backward ops then run "
                        "that forward's backward (see softmax_ops._bench_cases.Case)")
    parser.add_argument("--kernels", default=None,
                        help="comma-separated forced kernels, or none (the automatic choice only; default: "
                        "list_kernels(family) without " + ", ".join(DEFAULT_LEFT_OUT) + ")")
    parser.add_argument("--no-eager", action="store_true", help="do not time torch eager")
    parser.add_argument("--time-budget", type=float, default=420.0, metavar="SECONDS",
                        help="start no new case after this many seconds from the start, build included "
                        "(default 420: the call stays under 8 minutes)")
    parser.add_argument("--dry-run", action="store_true",
                        help="print the automatic and forced plans (softmax_ops.explain) and time nothing; "
                        "without a GPU, explain assumes an H100")
    parser.add_argument("--json", default=None, metavar="PATH", help="write every measurement as JSON")
    return parser


def parse_op_list(text: str) -> list[str]:
    """Parse ``--ops``; only the softmax-family ops have kernels here."""
    ops = [item.strip() for item in text.split(",") if item.strip()]
    unknown = [op for op in ops if op not in OPS]
    if unknown:
        raise ValueError(f"--ops: unknown {', '.join(unknown)} (choose from {', '.join(OPS)})")
    return ops


def plan_of(explain_text: str) -> tuple[str | None, str | None]:
    """(plan, None) from explain's "  kernel <plan>" line, or (None, why) when the forced kernel cannot run."""
    for line in explain_text.splitlines():
        stripped = line.strip()
        if stripped.startswith("kernel "):
            return stripped.removeprefix("kernel "), None
    if "forced kernel" in explain_text:
        reason = "the forced kernel" + explain_text.rsplit(": the forced kernel", 1)[-1]
    else:
        reason = explain_text.strip().splitlines()[-1] if explain_text.strip() else "no plan"
    return None, "n/a: " + reason[:200]


def _measure(fn, check, timer, copy_ms: float | None, kernel: str, plan: str | None) -> Timing:
    """Checks fn's result, then times it; failures become a note rather than an exception."""
    checked = check_then_time(fn, check, timer, CANNOT, with_reason=True, limit=200)
    xcopy = copy_ms / checked.ms if copy_ms and checked.ms else None
    return Timing(kernel, checked.ms, xcopy, checked.error, checked.bound, plan, checked.note)


def run_case(case, kernels: list[str], timer, device, copy_cache: dict, with_eager: bool) -> CaseRow:
    """Yardstick (once per shape, dtype and direction), automatic choice, eager and every forced kernel."""
    import torch

    import softmax_ops
    from softmax_ops._bench_impls import EAGER as EAGER_IMPL
    from softmax_ops._bench_impls import OURS, chosen_kernel, prepare_case

    family = FAMILY[case.op]
    prepared = prepare_case(case, device, {}, with_compile=False)
    copy_key = (case.shape, case.dtype_text, family)
    if copy_key not in copy_cache:
        copy_cache[copy_key] = timer(prepared.yardstick)
    copy_ms = copy_cache[copy_key]
    ours = prepared.impls[OURS]
    row = CaseRow(op=case.op, shape=case.shape_text, dtype=case.dtype_text,
                  megabytes=round(case.numel * case.stream_element_size / 2**20, 2), copy_ms=copy_ms,
                  auto_kernel=chosen_kernel(case.op, case.shape, case.stream_dtype, 0, device, case.explain_out_dtype))
    auto_plan, _ = plan_of(_explain(case))
    auto = _measure(ours, prepared.check, timer, copy_ms, AUTO, auto_plan)
    row.timings.append(auto)
    if with_eager:
        row.timings.append(_measure(prepared.impls[EAGER_IMPL], prepared.check, timer, copy_ms, EAGER, None))
    for name in kernels:
        with softmax_ops.force_kernel(family, name):
            plan, why_not = plan_of(_explain(case))
            forced = Timing(name, note=why_not) if plan is None else _measure(
                ours, prepared.check, timer, copy_ms, name, plan)
        row.timings.append(forced)
        if auto.ms and forced.ms and auto.ms / forced.ms > FASTER_MARGIN:
            row.faster_than_auto.append(f"{name} {auto.ms / forced.ms:.2f}x")
    del prepared
    torch.cuda.empty_cache()
    return row


def _explain(case) -> str:
    import softmax_ops

    return softmax_ops.explain(case.shape, case.stream_dtype, op=case.op, out_dtype=case.explain_out_dtype)


def _fits(case, device) -> str | None:
    import torch

    free, _total = torch.cuda.mem_get_info(device)
    needed = case.device_bytes_needed()
    if needed > MEMORY_HEADROOM * (free - FLUSH_BYTES):
        return f"needs ~{needed / 2**30:.1f} GiB, {free / 2**30:.1f} GiB free"
    return None


def _cell(timing: Timing | None) -> str:
    if timing is None:
        return "-"
    if timing.ms is None:
        note = timing.note or "?"
        return "n/a" if note.startswith("n/a") else note[:14]
    return f"{timing.ms * 1e3:7.1f} {timing.xcopy or 0:4.2f}"


def format_table(rows: list[CaseRow], kernels: list[str]) -> str:
    """One line per (shape, dtype, op): copy time, auto choice, eager, each forced kernel, flags."""
    columns = [AUTO, EAGER, *kernels]
    width = 14
    head = f"{'shape':>12} {'dtype':>10} {'op':>6} {'copy us':>8} {'auto kernel':>15}"
    head += "".join(f" | {name[:width]:>{width}}" for name in columns) + " | forced faster than auto"
    lines = [head, "-" * len(head)]
    for row in rows:
        cells = {t.kernel: t for t in row.timings}
        copy_us = f"{row.copy_ms * 1e3:8.1f}" if row.copy_ms else f"{'-':>8}"
        line = f"{row.shape:>12} {row.dtype:>10} {SHORT_OP[row.op]:>6} {copy_us} {row.auto_kernel[:15]:>15}"
        line += "".join(f" | {_cell(cells.get(name)):>{width}}" for name in columns)
        line += " | " + (", ".join(row.faster_than_auto) or "-")
        lines.append(line)
    lines.append("cells: median us (do_bench, L2 flushed) and xCopy (copy time / this time; backward: copy of "
                 "1.5x the elements); n/a = the forced kernel cannot run the shape")
    return "\n".join(lines)


def summary_lines(rows: list[CaseRow]) -> list[str]:
    """Dispatcher mistakes (forced > 5% faster), shapes below the bar even with the best kernel, problems."""
    lines = ["dispatcher threshold candidates (a forced kernel > 5% faster than the automatic choice):"]
    flagged = [f"  {r.shape} {r.dtype} {r.op}: auto {r.auto_kernel} -> " + ", ".join(r.faster_than_auto)
               for r in rows if r.faster_than_auto]
    lines += flagged or ["  none"]
    lines.append("below 0.85 xCopy even with the best kernel (kernel work, not dispatch):")
    below = []
    for row in rows:
        timed = [t for t in row.timings if t.xcopy is not None and t.kernel != EAGER]
        best = max(timed, key=lambda t: t.xcopy or 0.0, default=None)
        if best is not None and (best.xcopy or 0.0) < 0.85:
            below.append(f"  {row.shape} {row.dtype} {row.op}: best {best.kernel} {best.xcopy:.2f}")
    lines += below or ["  none"]
    slower = [f"  {r.shape} {r.dtype} {r.op}" for r in rows
              if (a := next((t for t in r.timings if t.kernel == AUTO), None)) is not None
              and (e := next((t for t in r.timings if t.kernel == EAGER), None)) is not None
              and a.ms and e.ms and a.ms > e.ms]
    if slower:
        lines += ["automatic choice slower than torch eager:", *slower]
    problems = [f"  {r.shape} {r.dtype} {r.op} {t.kernel}: {t.note}" for r in rows for t in r.timings
                if t.note and not t.note.startswith("n/a")]
    if problems:
        lines += ["problems (wrong results or errors):", *problems]
    return lines


def kernel_columns(kernels: dict[str, list[str]]) -> list[str]:
    """Kernel names in first-seen order over the families (both families share the softmax menu)."""
    seen: list[str] = []
    for family in sorted(kernels):
        seen += [k for k in kernels[family] if k not in seen]
    return seen


def _write_json(path: str, header: dict, rows: list[CaseRow], not_run: list[str]) -> None:
    write_json(path, {**header, "not_run": not_run}, rows)


def _dry_run(cases, kernels: dict[str, list[str]]) -> int:
    import softmax_ops

    for case in cases:
        family = FAMILY[case.op]
        auto_plan, _ = plan_of(_explain(case))
        print(f"{case.shape_text:>12} {case.dtype_text:>10} {case.op:<21} auto  {auto_plan}")
        for name in kernels[family]:
            with softmax_ops.force_kernel(family, name):
                plan, why_not = plan_of(_explain(case))
            print(f"{'':>46} {name:<16} {plan or why_not}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Parse arguments, run every case within the time budget, print the table, write the JSON."""
    start = time.monotonic()
    parser = build_parser()
    args = parser.parse_args(argv)
    import torch

    import softmax_ops
    from softmax_ops._bench_cases import SWEEP_SHAPES, Case, parse_dtypes, parse_out_dtype, parse_shapes
    from softmax_ops._bench_timing import make_timer

    try:
        ops = parse_op_list(args.ops)
        dtypes = parse_dtypes(args.dtypes)
        out_dtype = parse_out_dtype(args.out_dtype)
        shapes = [(r, n) for r, n, _ in parse_shapes(args.shapes)] if args.shapes else SWEEP_SHAPES + EXTRA_SHAPES
    except ValueError as error:
        parser.error(str(error))
    kernels: dict[str, list[str]] = {}
    for family in sorted({FAMILY[op] for op in ops}):
        available = softmax_ops.list_kernels(family)
        if args.kernels == "none":  # the automatic choice only (A/Bs of a dispatcher change)
            wanted = []
        else:
            wanted = args.kernels.split(",") if args.kernels else [k for k in available if k not in DEFAULT_LEFT_OUT]
        missing = [k for k in wanted if k not in available]
        if missing and available:
            parser.error(f"--kernels: {family} has no {', '.join(missing)} (it has {', '.join(available)})")
        kernels[family] = wanted
    ops = [op for op in OPS if op in ops]
    cases = [Case(op, dtype_name, rows, cols, out_dtype_name=out_dtype if out_dtype != dtype_name else None)
             for op in ops for rows, cols in shapes for dtype_name in dtypes]
    if args.dry_run:
        return _dry_run(cases, kernels)
    if not torch.cuda.is_available():
        print("tune_softmax: needs a CUDA device (the forced kernels are CUDA kernels); --dry-run works without",
              file=sys.stderr)
        return 2

    device = torch.device("cuda")
    timer = make_timer(device)
    header = {"gpu": torch.cuda.get_device_name(device), "torch": torch.__version__,
              "date": datetime.date.today().isoformat(), "timer": timer.description, "kernels": kernels,
              "faster_margin": FASTER_MARGIN, "build_and_import_s": round(time.monotonic() - start, 1)}
    print(f"{header['gpu']}, torch {header['torch']}; timer: {timer.description}; {len(cases)} cases; "
          f"import/build {header['build_and_import_s']} s", flush=True)
    if not timer.description.startswith("triton"):
        print("warning: triton is missing, timing with CUDA events (not do_bench)", flush=True)
    rows: list[CaseRow] = []
    not_run: list[str] = []
    copy_cache: dict = {}
    for case in cases:
        label = f"{case.shape_text} {case.dtype_text} {case.op}"
        if time.monotonic() - start > args.time_budget:
            not_run.append(f"{label} (time budget)")
            continue
        too_big = _fits(case, device)
        if too_big:
            not_run.append(f"{label} ({too_big})")
            continue
        try:
            row = run_case(case, kernels[FAMILY[case.op]], timer, device, copy_cache, not args.no_eager)
        except Exception as error:  # noqa: BLE001  (a failed setup is reported, the sweep goes on)
            not_run.append(f"{label} (setup failed: {type(error).__name__}: {str(error)[:160]})")
            torch.cuda.empty_cache()
            continue
        rows.append(row)
        auto = row.timings[0]
        flags = f"  FASTER: {', '.join(row.faster_than_auto)}" if row.faster_than_auto else ""
        print(f"[{time.monotonic() - start:5.0f}s] {label}: auto {row.auto_kernel} {_cell(auto)}{flags}",
              file=sys.stderr, flush=True)
        if args.json:
            _write_json(args.json, header, rows, not_run)
    print()
    print(format_table(rows, kernel_columns(kernels)))
    print()
    for line in summary_lines(rows):
        print(line)
    if not_run:
        print(f"not run ({len(not_run)}): " + "; ".join(not_run))
    if args.json:
        _write_json(args.json, header, rows, not_run)
        print(f"JSON: {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
