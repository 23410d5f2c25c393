"""Whether the L2's state before a timed call moves ours against torch.compile on few-microsecond shapes.

Under Nsight Compute (clean L2, each kernel alone) our kernels were as fast as Inductor's or faster on float32
2048 x 1024 (7.23 against 7.46 us) and float16 65536 x 64 (7.46 against 8.26; session 42 call 2), where the
bench's sweeps have torch.compile ahead by 1.5-5% (README). The bench's flush is a 256 MB memset, which leaves
the L2 full of dirty lines, so every line a call allocates first writes one back. This times each
implementation as the bench builds it (softmax_ops._bench_impls.prepare_case) and the copy yardstick in three
states, each followed by the bench's GPU spin (softmax_ops._bench_timing):
  dirty: the bench's flush, a memset of the buffer (the L2 holds dirty lines);
  clean: a read of the same buffer instead (``sum()``: clean lines of another tensor);
  warm:  no flush (the case's own tensors stay in the L2 where they fit).
``--rounds`` rounds, the implementations in turns within each. One GPU call::

    python3 benchmarks/flush_state_probe.py --shapes 2048x1024,65536x64 --dtypes fp16,fp32
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable

import torch

from softmax_ops import _bench_cases as cases_mod
from softmax_ops._bench_impls import prepare_case
from softmax_ops._bench_timing import EVENT_REPEATS, L2_FLUSH_BYTES, SPIN_US, _spin_cycles_per_us

STATES = ("dirty", "clean", "warm")


def make_timer(state: str, buffer: torch.Tensor, spin_cycles: int) -> Callable[[Callable[[], object]], float]:
    """Median microseconds of EVENT_REPEATS calls, each after `state`'s flush and the spin."""

    def prepare() -> None:
        if state == "dirty":
            buffer.zero_()
        elif state == "clean":
            buffer.sum()

    def measure(fn: Callable[[], object]) -> float:
        for _ in range(10):  # warm-up
            prepare()
            fn()
        torch.cuda.synchronize()
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                  for _ in range(EVENT_REPEATS)]
        for first, last in events:
            prepare()
            torch.cuda._sleep(spin_cycles)
            first.record()
            fn()
            last.record()
        torch.cuda.synchronize()
        return statistics.median(a.elapsed_time(b) for a, b in events) * 1e3

    return measure


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ops", default="softmax")
    parser.add_argument("--shapes", default="2048x1024,65536x64,128x1024,16384x128,4096x4096")
    parser.add_argument("--dtypes", default="fp16,fp32")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()

    device = torch.device("cuda")
    buffer = torch.ones(L2_FLUSH_BYTES // 4, dtype=torch.float32, device=device)
    spin_cycles = int(SPIN_US * _spin_cycles_per_us(device))
    timers = {state: make_timer(state, buffer, spin_cycles) for state in STATES}
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}; "
          f"us, median of {EVENT_REPEATS} calls per round")
    cases = cases_mod.build_cases(cases_mod.parse_ops(args.ops), cases_mod.parse_dtypes(args.dtypes),
                                  cases_mod.parse_shapes(args.shapes), quick=False)
    for case in cases:
        prepared = prepare_case(case, device, {}, with_compile=True)
        impls = {**prepared.impls, "copy": prepared.yardstick}
        times: dict[tuple[str, str], list[float]] = {}
        for _ in range(args.rounds):
            for state, timer in timers.items():
                for name, fn in impls.items():
                    times.setdefault((state, name), []).append(timer(fn))
        for state in STATES:
            cells = [f"{name} " + " / ".join(f"{t:.2f}" for t in times[(state, name)]) for name in impls]
            print(f"{case.label():<36} {state:<6} " + "   ".join(cells), flush=True)
        del prepared
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
