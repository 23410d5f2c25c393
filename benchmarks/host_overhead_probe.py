"""Whether a baseline's times in the bench are host-bound: its launch cost against the L2 flush that hides it.

triton's do_bench queues an L2 flush (a 256 MB memset) before every timed call and does not synchronise in
between, so the host launches call i while the GPU still clears the cache for it. A callable whose host side
(Python, guards, wrappers, the launch) takes longer than that memset leaves the GPU idle between the start event
and its kernel, and the bench then times the host. In session 36's do_bench sweep of the backward, torch.compile's
two rounds were up to 38x apart and its best-of-two times up to 8.7x session 32's, where ours and eager's agreed
(README, notes).

Per case this prints, for each implementation as the bench builds it (softmax_ops._bench_impls.prepare_case,
torch.compile included): the host's microseconds per call (``--calls`` back-to-back calls, no synchronisation,
after a warm-up), the GPU's microseconds for the flush, and the medians of do_bench and of the bench's events timer
(softmax_ops._bench_timing: flush, then a GPU spin, then the call) in ``--rounds`` rounds each. One GPU call::

    python3 benchmarks/host_overhead_probe.py --ops softmax_backward --shapes 128x1024,1000x1000 --dtypes fp16
"""

from __future__ import annotations

import argparse
import time

FLUSH_BYTES = 256 * 1024 * 1024  # triton's benchmark cache


def host_us_per_call(torch, fn, calls: int) -> float:
    """Host time per call, the GPU left to run behind (each call queues work and returns)."""
    for _ in range(10):
        fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    elapsed = time.perf_counter() - start
    torch.cuda.synchronize()
    return elapsed / calls * 1e6


def flush_us(torch) -> float:
    """GPU time of the memset do_bench runs before each timed call (median of 20)."""
    cache = torch.empty(FLUSH_BYTES // 4, dtype=torch.int, device="cuda")
    times = []
    for _ in range(20):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        cache.zero_()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    return sorted(times)[len(times) // 2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ops", default="softmax_backward,softmax")
    parser.add_argument("--shapes", default="128x1024,1000x1000,4x16384")
    parser.add_argument("--dtypes", default="fp16,fp32")
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    import torch
    from triton.testing import do_bench

    from softmax_ops import _bench_cases as cases_mod
    from softmax_ops._bench_impls import prepare_case
    from softmax_ops._bench_timing import make_timer

    device = torch.device("cuda")
    events = make_timer(device, kind="events")
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}; flush (256 MB memset) "
          f"{flush_us(torch):.1f} us on the GPU")
    cases = cases_mod.build_cases(cases_mod.parse_ops(args.ops), cases_mod.parse_dtypes(args.dtypes),
                                  cases_mod.parse_shapes(args.shapes), False)
    for case in cases:
        prepared = prepare_case(case, device, {}, with_compile=True)
        for name, note in prepared.unavailable.items():
            print(f"{case.label()}: {name}: {note}")
        for name, fn in prepared.impls.items():
            host = host_us_per_call(torch, fn, args.calls)
            rounds = [do_bench(fn, warmup=25, rep=100, return_mode="median") * 1e3 for _ in range(args.rounds)]
            spun = [events(fn) * 1e3 for _ in range(args.rounds)]
            print(f"{case.label():<40} {name:<14} host {host:7.1f} us/call   do_bench "
                  + " / ".join(f"{t:.1f}" for t in rounds) + " us   events "
                  + " / ".join(f"{t:.1f}" for t in spun) + " us", flush=True)
        del prepared
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
