"""`python -m softmax_ops bench`: the kernel sweep of shared/PERF.md against torch eager and torch.compile.

For every case (op, dtype, shape) it allocates the inputs once, checks each implementation's output against
a float64 reference, then times it (on CUDA with CUDA events around each call, each after an L2 flush and a GPU
spin that keeps the host's launches ahead of the GPU, or with ``--timer do_bench``: triton's do_bench, which
flushes the L2 before every call), and reports GB/s, xCopy (or xSum for fused_topk: the time
of the yardstick on the same bytes over ours), speedups and the kernel the dispatcher chose.

Example (on a GPU machine)::

    python -m softmax_ops bench --ops softmax --dtypes bf16 --shapes 4096x4096,4x262144
    python -m softmax_ops bench --json benchmarks/results/ --plot sweep.png
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import re
import sys
import time
from collections.abc import Callable

import torch

import softmax_ops
from softmax_ops import _bench_cases as cases_mod
from softmax_ops._bench_cases import Case
from softmax_ops._bench_impls import (
    COMPILE,
    EAGER,
    LIGER,
    OURS,
    QUACK,
    chosen_kernel,
    optional_baselines,
    prepare_case,
)
from softmax_ops._bench_plot import MISSING_MATPLOTLIB, matplotlib_available, plot_rows
from softmax_ops._bench_report import CaseResult, format_table, summary_lines, write_json
from softmax_ops._bench_timing import L2_FLUSH_BYTES, TIMER_KINDS, Timer, make_timer

COMPARE_CHOICES = {"eager": EAGER, "compile": COMPILE, "liger": LIGER, "quack": QUACK}
MEMORY_HEADROOM = 0.85  # use at most this fraction of the free device memory for one case
YARDSTICK = "yardstick"  # the copy (or sum) that xCopy (xSum) divides by, timed in the same rounds
# Two rounds on CUDA (see time_in_rounds); CPU numbers are only a smoke test, one round is enough there.
DEFAULT_ROUNDS = {"cuda": 2, "cpu": 1}


def build_parser() -> argparse.ArgumentParser:
    """The `bench` command line."""
    parser = argparse.ArgumentParser(
        prog="python -m softmax_ops bench",
        description="Time softmax_ops against torch eager / torch.compile (and Liger / Quack when they "
        "import) on the shared/PERF.md sweep: GB/s, xCopy (xSum for fused_topk), speedups, chosen kernel.",
    )
    parser.add_argument("--ops", default=",".join(cases_mod.ALL_OPS),
                        help="comma-separated ops (default: all): " + ", ".join(cases_mod.ALL_OPS)
                        + "; 'backward' means both backward ops")
    parser.add_argument("--dtypes", default=",".join(cases_mod.DEFAULT_DTYPES),
                        help="comma-separated dtypes: fp16, bf16, fp32 (default: all three)")
    parser.add_argument("--shapes", default=None,
                        help="comma-separated ROWSxN (e.g. 4096x4096,4x262144) replacing the sweep; fused_topk "
                        "runs the table's cases with that ROWSxN, or ROWSxNkK as given (e.g. 64x151936k50)")
    parser.add_argument("--out-dtype", default=None, metavar="DTYPE",
                        help="the result dtype of softmax(x, -1, dtype=DTYPE) for the softmax-family cases (e.g. "
                        "fp32 with --dtypes fp16,bf16: the 16-bit input read directly); the backward ops then run "
                        "that forward's backward (float32 grad_output and output, a 16-bit gradient)")
    parser.add_argument("--quick", action="store_true",
                        help="a handful of small shapes (usable on CPU, where timing uses time.perf_counter)")
    parser.add_argument("--device", default=None, help="cuda (default when present) or cpu")
    parser.add_argument("--compare", default="eager,compile,liger,quack",
                        help="baselines to race (default: eager,compile,liger,quack; liger and quack only "
                        "when they import)")
    parser.add_argument("--compile-baseline", action=argparse.BooleanOptionalAction, default=None,
                        help="include the torch.compile baseline (compiles every case: slow). "
                        "Default: on for CUDA, off on CPU")
    parser.add_argument("--json", default=None, metavar="PATH",
                        help="write results as JSON (a directory or a path ending in / gets "
                        "<gpu>-<date>.json); rewritten after every case")
    parser.add_argument("--time-budget", type=float, default=None, metavar="SECONDS",
                        help="start no new case after this many seconds (the rest is listed as not run); "
                        "for machines that limit a command's time")
    parser.add_argument("--rounds", type=int, default=None, metavar="N",
                        help="time every implementation N times, in turns, and report the fastest "
                        "(default: 2 on CUDA, 1 on CPU)")
    parser.add_argument("--plot", default=None, metavar="PATH",
                        help="write a PNG of GB/s and xCopy per shape (needs matplotlib)")
    parser.add_argument("--timer", choices=TIMER_KINDS, default="events",
                        help="CUDA timer: events (default: L2 flush and a GPU spin before every call, so that a "
                        "slow launch path such as torch.compile's wrappers is not timed) or do_bench "
                        "(triton.testing.do_bench, the timer of the sweeps up to session 35)")
    return parser


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"CPU ({platform.machine()}, {os.cpu_count()} cores)"


def _json_path(path: str, gpu: str, date: str) -> str:
    if path.endswith((os.sep, "/")) or os.path.isdir(path):
        slug = re.sub(r"[^a-z0-9]+", "-", gpu.lower()).strip("-")
        return os.path.join(path, f"{slug}-{date}.json")
    return path


def _fits(case: Case, device: torch.device) -> str | None:
    if device.type != "cuda":
        return None
    free, _total = torch.cuda.mem_get_info(device)
    needed = case.device_bytes_needed()
    if needed > MEMORY_HEADROOM * (free - L2_FLUSH_BYTES):
        return f"skipped: needs ~{needed / 2**30:.1f} GiB, {free / 2**30:.1f} GiB free"
    return None


def run_case(case: Case, device: torch.device, timer: Timer, extra: dict, wanted: list[str],
             with_compile: bool, rounds: int = 1) -> CaseResult:
    """Check, then time, every wanted implementation of ``case`` and its yardstick in ``rounds`` turns (see
    :func:`time_in_rounds`); failures are recorded, not raised."""
    skip = _fits(case, device)
    if skip:
        return CaseResult(case, None, {}, None, {OURS: skip})
    try:
        prepared = prepare_case(case, device, extra, with_compile and COMPILE in wanted)
    except torch.OutOfMemoryError:
        return CaseResult(case, None, {}, None, {OURS: "skipped: out of device memory"})
    except Exception as error:  # noqa: BLE001  (e.g. the eager reference failing on this shape)
        return CaseResult(case, None, {}, None, {OURS: f"setup failed: {type(error).__name__}: {error}"})
    notes = {impl: why for impl, why in prepared.unavailable.items() if impl in wanted}
    # Ours, the wanted baselines, and the implementation of ours each of them races where that is not OURS.
    timed = {OURS, *wanted, *(prepared.raced_by[name] for name in wanted if name in prepared.raced_by)}
    checked: dict[str, Callable[[], object]] = {}
    for impl, fn in prepared.impls.items():
        if impl not in timed:
            continue
        try:
            check = prepared.check_of(impl)(fn())
        except Exception as error:  # noqa: BLE001  (one broken implementation must not end the sweep)
            notes[impl] = f"error: {type(error).__name__}: {str(error).splitlines()[0][:200]}"
            continue
        if not check.ok:
            notes[impl] = f"WRONG: {check.describe()}"
            continue
        checked[impl] = fn
    checked[YARDSTICK] = prepared.yardstick
    round_times = time_in_rounds(checked, timer, rounds)
    yardstick_ms = min(round_times.pop(YARDSTICK))
    kernel = chosen_kernel(case.op, case.shape, case.stream_dtype, case.k, device, case.explain_out_dtype)
    raced_by = {name: ours for name, ours in prepared.raced_by.items() if name in wanted}
    del prepared, checked
    if device.type == "cuda":
        torch.cuda.empty_cache()
    times = {impl: min(samples) for impl, samples in round_times.items()}
    return CaseResult(case, yardstick_ms, times, kernel, notes, round_times, raced_by)


def time_in_rounds(fns: dict[str, Callable[[], object]], timer: Timer, rounds: int) -> dict[str, list[float]]:
    """Time every callable once per round, the callables taking turns; returns each one's times in order.

    The bench reports the smallest of a callable's round times. A GPU cannot run a call faster than it
    can, but a whole timing can come out slower: single-round sweeps on the H100 had 1-12 of 132 cases in
    which one implementation's median was 5-15x its usual (e.g. 153 us against 11 on the re-run). With two
    rounds (H100, session 22, 300 cases per implementation) 54 torch.compile rows and 2 of 39 Liger rows had
    one round 1.5-6x the other, none of ours or eager's; the cause is unknown. Rounds in turn bound that
    without favouring anyone, and the JSON keeps every round's time so such disagreements stay visible (the
    progress line flags them).

    Example:
        >>> time_in_rounds({"a": lambda: None}, lambda fn: 1.0, rounds=2)
        {'a': [1.0, 1.0]}
    """
    samples: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(max(1, rounds)):
        for name, fn in fns.items():
            samples[name].append(timer(fn))
    return samples


def _progress(index: int, total: int, result: CaseResult, baselines: list[str], elapsed: float) -> str:
    case = result.case
    prefix = f"[{index:>3}/{total}] {case.label():<38}"
    ours = result.times.get(OURS)
    if ours is None:
        return f"{prefix} {result.notes.get(OURS, 'not timed')}"
    gbps = case.bytes_moved / (ours * 1e-3) / 1e9
    ratio_name = "xSum" if case.op == cases_mod.TOPK_OP else "xCopy"
    text = f"{prefix} ours {ours:.4f} ms {gbps:7.0f} GB/s {result.ratio or 0:.2f} {ratio_name}"
    for baseline in baselines:
        speedup = result.speedup(baseline)
        short = baseline.removeprefix("torch_")
        text += f" | {short} {speedup:.2f}x" if speedup else f" | {short} -"
    text += f" | {result.kernel}  ({elapsed:.0f} s)"
    for impl, samples in result.disagreeing_rounds().items():
        text += (f"\n          rounds disagree for {impl}: "
                 + " / ".join(f"{ms * 1e3:.1f}" for ms in samples) + " us (the fastest is reported)")
    for impl, note in result.notes.items():
        if impl != OURS:
            text += f"\n          {impl}: {note}"
    return text


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; returns 1 when any of our rows failed its correctness check, 2 on bad usage."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        ops = cases_mod.parse_ops(args.ops)
        dtype_names = cases_mod.parse_dtypes(args.dtypes)
        shapes = cases_mod.parse_shapes(args.shapes) if args.shapes else None
        out_dtype_name = cases_mod.parse_out_dtype(args.out_dtype)
        compare = [COMPARE_CHOICES[name.strip()] for name in args.compare.split(",") if name.strip()]
    except (ValueError, KeyError) as error:
        parser.error(f"{error}" if isinstance(error, ValueError)
                     else f"--compare: unknown baseline {error} (choose from {', '.join(COMPARE_CHOICES)})")
    if args.plot and not matplotlib_available():
        _log(MISSING_MATPLOTLIB)
        return 2
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA GPU is visible")
    with_compile = args.compile_baseline if args.compile_baseline is not None else device.type == "cuda"
    extra = optional_baselines() if device.type == "cuda" else {}
    baselines = [name for name in compare if name != COMPILE or with_compile]
    baselines = [name for name in baselines if name in (EAGER, COMPILE) or callable(extra.get(name))]
    timer = make_timer(device, kind=args.timer)
    rounds = args.rounds if args.rounds is not None else DEFAULT_ROUNDS.get(device.type, 1)
    if rounds < 1:
        parser.error(f"--rounds must be at least 1, got {rounds}")
    cases = cases_mod.build_cases(ops, dtype_names, shapes, args.quick, out_dtype_name)

    gpu = _device_name(device)
    date = datetime.datetime.now().strftime("%Y-%m-%d")
    triton_version = _triton_version()
    header = {
        "gpu": gpu, "torch": torch.__version__, "date": date, "device": device.type,
        "softmax_ops": softmax_ops.__version__, "triton": triton_version, "timer": timer.description,
        "rounds": rounds,
    }
    _log(f"softmax_ops bench on {gpu}: torch {torch.__version__}, triton {triton_version or 'not installed'}")
    _log(f"timer: {timer.description}; {rounds} round(s) per implementation, the fastest reported")
    if device.type == "cpu":
        _log("no CUDA GPU in use: timing the CPU kernels with time.perf_counter (no triton, no L2 flush); "
             "these numbers say nothing about the GPU bar")
    for name in (LIGER, QUACK):
        if name in compare and device.type == "cuda" and not callable(extra.get(name)):
            _log(f"{name}: {extra.get(name)}")
    if COMPILE in compare and not with_compile:
        _log("torch.compile baseline off (default on CPU; use --compile-baseline to include it)")
    _log(f"{len(cases)} cases; baselines: {', '.join(baselines)}")
    json_path = _json_path(args.json, gpu, date) if args.json else None

    results: list[CaseResult] = []
    start = time.perf_counter()
    for index, case in enumerate(cases, start=1):
        if args.time_budget is not None and time.perf_counter() - start > args.time_budget:
            _log(f"time budget of {args.time_budget:g} s spent: {len(cases) - index + 1} case(s) not run, from "
                 f"{case.label()} on")
            break
        result = run_case(case, device, timer, extra, baselines, with_compile, rounds)
        results.append(result)
        _log(_progress(index, len(cases), result, baselines, time.perf_counter() - start))
        if json_path:
            write_json(json_path, header, results)

    print()
    print(f"softmax_ops bench: {gpu}, torch {torch.__version__}, {date}")
    print(format_table(results, baselines))
    print()
    for line in summary_lines(results, baselines):
        print(line)
    if json_path:
        print(f"wrote {json_path}")
    if args.plot:
        rows = [row.to_json() for result in results for row in result.rows()]
        plot_rows(rows, args.plot, f"softmax_ops on {gpu} (torch {torch.__version__}, {date})")
        print(f"wrote {args.plot}")
    wrong = [r for r in results if r.notes.get(OURS, "").startswith(("WRONG", "error"))]
    if wrong:
        print(f"FAILED: {len(wrong)} case(s) where softmax_ops was wrong or raised: "
              + ", ".join(r.case.label() for r in wrong), file=sys.stderr)
        return 1
    return 0


def _triton_version() -> str | None:
    try:
        import triton
    except ImportError:
        return None
    return getattr(triton, "__version__", "unknown")


if __name__ == "__main__":
    sys.exit(main())
