"""Sweeps the fused_topk rows kernel's threads per row (T = 1..16) and load layout, interleaved in one process.

Needs a tree built with benchmarks/patches/topk-rows-threads-env.patch (an environment override read at every
call); the product has no such knob. For each (case, dtype): the dispatcher's own T ("auto"), then every T
that holds the row (T x 32 >= N), and for 16-bit rows of whole vectors with k > 2 every T down to rows of 8
batches (T x 32 x 8 >= N; the rows kernel's batched instances) ("T<t>", the pointer's load layout), each checked
against a float64 reference (values) on the first round, timed in 3 interleaved rounds of do_bench (L2 flushed);
the median is printed.
``!`` marks a wrong result. (Session 10 also swept scalar loads, "S<t>", with an override the patch no longer
has; session 33's call 1 swept the staged instances, since retired, as "S<t>" with this script and the patch at
d3d2e69.) One GPU call::

    python3 benchmarks/sweep_topk_rows_threads.py 16384x8k2,4096x60k4 $OUT/sweep.json [fp16,bf16]
"""

from __future__ import annotations

import json
import os
import statistics
import sys

OVERRIDES = ("S10_ROWS_T",)
ROUNDS = 3


def set_variant(variant: str) -> None:
    """auto or T<t> (threads t, the pointer's layout)."""
    for name in OVERRIDES:
        os.environ.pop(name, None)
    if variant != "auto":
        os.environ["S10_ROWS_T"] = variant[1:]


def main() -> None:
    import torch
    from triton.testing import do_bench

    import softmax_ops

    dtypes = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}
    results = []
    for case in sys.argv[1].split(","):
        shape, k_text = case.split("k")
        rows, n = (int(v) for v in shape.split("x"))
        k = int(k_text)
        for dtype_name, dtype in dtypes.items():
            if len(sys.argv) > 3 and dtype_name not in sys.argv[3].split(","):
                continue
            torch.manual_seed(0)
            x = torch.randn(rows, n, device="cuda", dtype=dtype) * 3
            reference = torch.topk(torch.softmax(x.double(), -1), k, -1).values
            set_variant("auto")
            auto = softmax_ops.explain((rows, n), dtype, op="fused_topk", k=k)
            # 16-bit rows in whole 16-byte vectors with k > 2 also run on fewer threads, in batches.
            batches_fit = dtype != torch.float32 and k > 2 and n <= 512 and n % 8 == 0
            variants = ["auto"] + [
                f"T{t}" for t in (1, 2, 4, 8, 16) if t * 32 >= n or (batches_fit and t * 32 * 8 >= n)
            ]
            times: dict[str, list[float]] = {v: [] for v in variants}
            ok: dict[str, bool] = {}

            def fused(x=x, k=k):
                return softmax_ops.fused_topk(x, k, -1, False, torch.float32)

            for round_index in range(ROUNDS):
                for variant in variants:
                    set_variant(variant)
                    with softmax_ops.force_kernel("topk", "rows"):
                        if round_index == 0:
                            values, _ = fused()
                            ok[variant] = bool(torch.allclose(values.double(), reference, rtol=1e-3, atol=1e-6))
                        times[variant].append(do_bench(fused, warmup=25, rep=100, return_mode="median") * 1e3)
            median = {v: round(statistics.median(t), 2) for v, t in times.items()}
            cells = "  ".join(f"{v}:{median[v]}{'' if ok[v] else '!'}" for v in variants)
            print(f"{case:14s} {dtype_name}  {cells}   best {min(median, key=median.get)}  [{auto[:60]}]", flush=True)
            results.append({"case": case, "dtype": dtype_name, "us": median, "ok": ok, "auto": auto})
    set_variant("auto")
    with open(sys.argv[2], "w") as handle:
        json.dump(results, handle, indent=1)


if __name__ == "__main__":
    main()
