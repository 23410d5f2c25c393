"""Timers for the benchmark and the demo: median wall time of a callable, in milliseconds.

On CUDA (the default, ``kind="events"``): CUDA events around each call, after an L2 flush (a 256 MB write) and a
GPU-side spin that lets the host queue the call before the GPU reaches the start event (see `_cuda_events_ahead`).
``kind="do_bench"``: ``triton.testing.do_bench`` (it flushes the L2 before every call too, without the spin), the
bench's timer up to session 35. On CPU: ``time.perf_counter`` around each call (no cache flush: CPU numbers are for
smoke-testing, not for the performance bar).
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
# The events timer: timed calls per measurement, and the GPU-side spin queued before each one.
EVENT_REPEATS = 200
SPIN_US = 300.0
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


def _spin_cycles_per_us(device: torch.device) -> float:
    """The GPU's clock as torch.cuda._sleep counts it, measured (the boost clock moves with load)."""
    cycles = 2_000_000
    torch.cuda._sleep(cycles)  # first launch outside the measurement
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(cycles)
    end.record()
    end.synchronize()
    return cycles / (start.elapsed_time(end) * 1e3)


def _cuda_events_ahead(device: torch.device) -> Callable[[Callable[[], object]], float]:
    """CUDA events around each call, each call after an L2 flush and a GPU-side spin of `SPIN_US`.

    Why the spin: do_bench queues its flush (91 us of memset on an H100) and the call without synchronising, so the
    host must launch call i while the GPU still clears the cache for it. torch.compile's wrappers took 64-134 us of
    host time per call on session 36's H100 host (softmax_backward, host_overhead_probe.py), our op and eager 20-42;
    do_bench then timed the GPU waiting for the host: 25-137 us for calls this timer reads at 5-15 us, rounds up to
    38x apart in a sweep, where ours and eager's agreed. Spinning first keeps the GPU's queue ahead of the host for
    any launch path up to the spin plus the flush, so each interval holds only the call's own GPU work, as
    do_bench's does whenever the host keeps up. The spin's cycles come from the clock measured when the timer is
    made; a faster clock later shortens it in proportion (at twice the clock still 150 us, above the slowest launch
    path measured). Events and spin go to the current device. Every measurement takes EVENT_REPEATS calls, however
    long a call is (a 13 ms call: 2.6 s).
    """
    flush_buffer = torch.empty(L2_FLUSH_BYTES, dtype=torch.int8, device=device)
    spin_cycles = int(SPIN_US * _spin_cycles_per_us(device))

    def measure(fn: Callable[[], object]) -> float:
        for _ in range(10):  # warm-up: caches, clocks, lazy initialisation
            flush_buffer.zero_()
            fn()
        torch.cuda.synchronize(device)
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                  for _ in range(EVENT_REPEATS)]
        for start, end in events:
            flush_buffer.zero_()
            torch.cuda._sleep(spin_cycles)
            start.record()
            fn()
            end.record()
        torch.cuda.synchronize(device)
        return statistics.median(start.elapsed_time(end) for start, end in events)

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


TIMER_KINDS = ("events", "do_bench")


def make_timer(device: torch.device, allow_triton: bool = True, kind: str = "events") -> Timer:
    """The timer of ``kind`` for ``device`` (see the module docstring); on CPU always time.perf_counter.

    ``kind="do_bench"`` falls back to plain CUDA events (flush, no spin) where triton does not import or
    ``allow_triton`` is false.

    Example:
        >>> import torch
        >>> timer = make_timer(torch.device("cpu"))
        >>> timer(lambda: torch.ones(4).sum()) > 0
        True
    """
    if kind not in TIMER_KINDS:
        raise ValueError(f"unknown timer kind {kind!r} (choose from {', '.join(TIMER_KINDS)})")
    if device.type == "cuda" and kind == "events":
        return Timer(
            f"CUDA events, median of {EVENT_REPEATS} calls, each after a 256 MB L2 flush and a {SPIN_US:g} us GPU spin "
            "(the host queues the call before the GPU reaches the start event)",
            _cuda_events_ahead(device),
        )
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


def interleaved_medians(fns: dict[str, Callable[[], object]], device: torch.device, rounds: int,
                        batch: int = 5, warmup: int = 10) -> dict[str, float]:
    """Median milliseconds per call of each function (the demo's timer: whole model steps).

    The variants take turns, ``rounds`` times: each turn times ``batch`` back-to-back calls and counts
    their mean. Timing one variant's calls all at once, each after a synchronize, let the GPU idle between
    calls and left each variant to whatever clock state it met: the same torch.compile step measured
    1.32 ms in one run and 1.51 ms in another on the same H200, and the order of variants decided which
    looked faster."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    samples: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(max(1, rounds)):
        for name, fn in fns.items():
            if device.type == "cuda":
                torch.cuda.synchronize(device)
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                for _ in range(batch):
                    fn()
                end.record()
                end.synchronize()
                samples[name].append(start.elapsed_time(end) / batch)
            else:
                start_s = time.perf_counter()
                for _ in range(batch):
                    fn()
                samples[name].append((time.perf_counter() - start_s) * 1e3 / batch)
    return {name: statistics.median(values) for name, values in samples.items()}
