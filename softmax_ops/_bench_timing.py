"""Timers for the benchmark and the demo: median wall time of a callable, in milliseconds.

On CUDA: ``triton.testing.do_bench`` when triton imports (it flushes the L2 before every call), else CUDA
events around each call with an explicit L2 flush (a 256 MB write) in between. On CPU: ``time.perf_counter``
around each call (no cache flush: CPU numbers are for smoke-testing, not for the performance bar).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

# do_bench's defaults, also used by the CUDA-event fallback: ~25 ms of warm-up, ~100 ms of timed calls.
WARMUP_MS = 25.0
REP_MS = 100.0
# Larger than any GPU's L2 (H100: 50 MB, H200: 60 MB, B200: 126 MB), so a write evicts every input.
L2_FLUSH_BYTES = 256 * 1024 * 1024
MAX_REPEATS = 1000
CPU_REP_SECONDS = 0.25
CPU_MIN_REPEATS = 5


@dataclass
class Timer:
    """Measures ``fn``; ``description`` says how (printed with every benchmark run and stored in its JSON)."""

    description: str
    measure: Callable[[Callable[[], object]], float]

    def __call__(self, fn: Callable[[], object]) -> float:
        return self.measure(fn)


def _triton_do_bench() -> Callable[[Callable[[], object]], float] | None:
    try:
        import triton.testing
    except ImportError:
        return None

    def measure(fn: Callable[[], object]) -> float:
        return float(triton.testing.do_bench(fn, warmup=int(WARMUP_MS), rep=int(REP_MS), return_mode="median"))

    return measure


def _cuda_events(device: torch.device) -> Callable[[Callable[[], object]], float]:
    flush_buffer = torch.empty(L2_FLUSH_BYTES, dtype=torch.int8, device=device)

    def timed_call(fn: Callable[[], object]) -> float:
        flush_buffer.zero_()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end)

    def measure(fn: Callable[[], object]) -> float:
        fn()
        torch.cuda.synchronize(device)
        estimate = max(statistics.median(timed_call(fn) for _ in range(3)), 1e-3)
        for _ in range(max(1, min(MAX_REPEATS, int(WARMUP_MS / estimate)))):
            fn()
        repeats = max(5, min(MAX_REPEATS, int(REP_MS / estimate)))
        return statistics.median(timed_call(fn) for _ in range(repeats))

    return measure


def _cpu_perf_counter(fn: Callable[[], object]) -> float:
    fn()
    samples: list[float] = []
    deadline = time.perf_counter() + CPU_REP_SECONDS
    while len(samples) < CPU_MIN_REPEATS or (time.perf_counter() < deadline and len(samples) < MAX_REPEATS):
        start = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - start) * 1e3)
    return statistics.median(samples)


def make_timer(device: torch.device, allow_triton: bool = True) -> Timer:
    """The most faithful timer available for ``device`` (see the module docstring).

    Example:
        >>> import torch
        >>> timer = make_timer(torch.device("cpu"))
        >>> timer(lambda: torch.ones(4).sum()) > 0
        True
    """
    if device.type == "cuda":
        do_bench = _triton_do_bench() if allow_triton else None
        if do_bench is not None:
            return Timer(
                f"triton.testing.do_bench(warmup={WARMUP_MS:g}, rep={REP_MS:g}, return_mode='median'), "
                "L2 flushed before each call",
                do_bench,
            )
        return Timer(
            f"CUDA events, median of ~{REP_MS:g} ms of calls, 256 MB L2 flush before each call",
            _cuda_events(device),
        )
    return Timer(
        f"time.perf_counter, median of >= {CPU_MIN_REPEATS} calls (~{CPU_REP_SECONDS:g} s), CPU, no cache flush",
        _cpu_perf_counter,
    )


def fixed_count_median(fn: Callable[[], object], device: torch.device, iters: int, warmup: int = 3) -> float:
    """Median milliseconds of ``iters`` calls after ``warmup`` calls (the demo's timer: whole model steps)."""
    for _ in range(warmup):
        fn()
    samples: list[float] = []
    for _ in range(max(1, iters)):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end))
        else:
            start_s = time.perf_counter()
            fn()
            samples.append((time.perf_counter() - start_s) * 1e3)
    return statistics.median(samples)
