"""How close the few-microsecond router shapes are to the timer's floor.

The bench times each call with triton's do_bench, which flushes the L2 before every call and records CUDA
events around it, so even a kernel that does nothing reads as a few microseconds. This prints, per fused_topk
case and dtype, the median of an empty kernel (``torch.cuda._sleep(0)``), of ``x.sum(-1)`` (the xSum
yardstick), of ``y.copy_(x)``, of our fused_topk and of eager ``topk(softmax(x, dtype=float32))`` (both as the bench
calls them: float32 values), each timed in
``--rounds`` interleaved rounds (the fastest round shown), and what 10x eager would need. One GPU call::

    python3 benchmarks/launch_floor_probe.py --topk 16384x8k2,16384x64k6 --dtypes fp16,fp32
"""

from __future__ import annotations

import argparse

DTYPES = {"fp16": "float16", "bf16": "bfloat16", "fp32": "float32"}


def calls(torch, softmax_ops, x, y, k: int) -> dict:
    """The timed callables of one case."""
    return {
        "empty": lambda: torch.cuda._sleep(0),
        "sum": lambda: x.sum(-1),
        "copy": lambda: y.copy_(x),
        "ours": lambda: softmax_ops.fused_topk(x, k, -1, False, torch.float32),
        "eager": lambda: torch.topk(torch.softmax(x, -1, dtype=torch.float32), k),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--topk", default="16384x8k2,16384x64k6,16384x128k8,16384x160k6,4096x60k4")
    parser.add_argument("--dtypes", default="fp16,bf16,fp32")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    import torch
    from triton.testing import do_bench

    import softmax_ops

    def timed(fn) -> float:  # microseconds
        return 1000.0 * float(do_bench(fn, warmup=25, rep=100, return_mode="median"))

    print(f"{torch.cuda.get_device_name()}; do_bench(warmup=25, rep=100, median), L2 flushed; us, fastest of "
          f"{args.rounds} interleaved rounds")
    print(f"{'case':<16}{'dtype':<6}{'empty':>7}{'sum':>7}{'copy':>7}{'ours':>7}{'eager':>8}{'x eager':>8}"
          f"{'10x needs':>10}")
    for dtype_name in args.dtypes.split(","):
        dtype = getattr(torch, DTYPES[dtype_name])
        for case in filter(None, args.topk.split(",")):
            shape_text, k_text = case.split("k")
            rows, cols = (int(v) for v in shape_text.split("x"))
            k = int(k_text)
            x = torch.randn(rows, cols, device="cuda", dtype=dtype) * 3
            y = torch.empty_like(x)
            fns = calls(torch, softmax_ops, x, y, k)
            best = {name: float("inf") for name in fns}
            for _ in range(args.rounds):
                for name, fn in fns.items():
                    best[name] = min(best[name], timed(fn))
            print(f"{case:<16}{dtype_name:<6}{best['empty']:7.2f}{best['sum']:7.2f}{best['copy']:7.2f}"
                  f"{best['ours']:7.2f}{best['eager']:8.2f}{best['eager'] / best['ours']:7.2f}x"
                  f"{best['eager'] / 10:10.2f}", flush=True)


if __name__ == "__main__":
    main()
