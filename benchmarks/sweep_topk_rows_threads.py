"""Sweeps the fused_topk rows kernel's threads per row (T = 1..16) and load layout, interleaved in one process.

Needs a tree built with benchmarks/patches/topk-rows-threads-env.patch (an environment override read at every
call); the product has no such knob. For each (case, dtype): the dispatcher's own T ("auto"), then every T
that holds the row (T x 32 >= N), and for 16-bit rows of whole vectors with k > 2 every T down to rows of 8
batches (T x 32 x 8 >= N; the rows kernel's batched instances) ("T<t>", the pointer's load layout); with
``--staged``, for those rows also the staged instances at every T that holds the row ("S<t>", session 29's
S29_STAGED override; checked bitwise against T<t>). Each is checked against a float64 reference (values) on the
first round and timed in 3 interleaved rounds of do_bench (L2 flushed); the median is printed. ``!`` marks a wrong
result. (Session 10's "S<t>" meant scalar loads, with an override the patch no longer has.) One GPU call::

    python3 benchmarks/sweep_topk_rows_threads.py 16384x8k2,4096x60k4 $OUT/sweep.json [fp16,bf16] [--staged]
"""

from __future__ import annotations

import json
import os
import statistics
import sys

OVERRIDES = ("S10_ROWS_T", "S29_STAGED")
ROUNDS = 3


def set_variant(variant: str) -> None:
    """auto, T<t> (threads t, the pointer's layout) or S<t> (threads t, the staged instances)."""
    for name in OVERRIDES:
        os.environ.pop(name, None)
    if variant != "auto":
        os.environ["S10_ROWS_T"] = variant[1:]
    if variant.startswith("S"):
        os.environ["S29_STAGED"] = "1"


def main() -> None:
    import torch
    from triton.testing import do_bench

    import softmax_ops

    dtypes = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}
    results = []
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    for case in args[0].split(","):
        shape, k_text = case.split("k")
        rows, n = (int(v) for v in shape.split("x"))
        k = int(k_text)
        for dtype_name, dtype in dtypes.items():
            if len(args) > 2 and dtype_name not in args[2].split(","):
                continue
            torch.manual_seed(0)
            x = torch.randn(rows, n, device="cuda", dtype=dtype) * 3
            reference = torch.topk(torch.softmax(x.double(), -1), k, -1).values
            set_variant("auto")
            auto = softmax_ops.explain((rows, n), dtype, op="fused_topk", k=k)
            # 16-bit rows in whole 16-byte vectors with k > 2 also run on fewer threads, in batches.
            batches_fit = dtype != torch.float32 and k > 2 and n <= 512 and n % 8 == 0
            # ... and staged (the same rows on the threads that hold them, through shared memory).
            staged_fits = batches_fit and "--staged" in sys.argv
            variants = ["auto"] + [
                f"T{t}" for t in (1, 2, 4, 8, 16) if t * 32 >= n or (batches_fit and t * 32 * 8 >= n)
            ] + [f"S{t}" for t in (1, 2, 4, 8, 16) if staged_fits and t * 32 >= n]
            times: dict[str, list[float]] = {v: [] for v in variants}
            ok: dict[str, bool] = {}
            results_of: dict[str, tuple] = {}

            def fused(x=x, k=k):
                return softmax_ops.fused_topk(x, k, -1, False, torch.float32)

            for round_index in range(ROUNDS):
                for variant in variants:
                    set_variant(variant)
                    with softmax_ops.force_kernel("topk", "rows"):
                        if round_index == 0:
                            values, indices = fused()
                            ok[variant] = bool(torch.allclose(values.double(), reference, rtol=1e-3, atol=1e-6))
                            results_of[variant] = (values, indices)
                            twin = "T" + variant[1:]
                            if variant.startswith("S") and twin in results_of:  # staged == unstaged, bitwise
                                ok[variant] = ok[variant] and all(
                                    torch.equal(a, b) for a, b in zip(results_of[twin], (values, indices)))
                        times[variant].append(do_bench(fused, warmup=25, rep=100, return_mode="median") * 1e3)
            median = {v: round(statistics.median(t), 2) for v, t in times.items()}
            cells = "  ".join(f"{v}:{median[v]}{'' if ok[v] else '!'}" for v in variants)
            print(f"{case:14s} {dtype_name}  {cells}   best {min(median, key=median.get)}  [{auto[:60]}]", flush=True)
            results.append({"case": case, "dtype": dtype_name, "us": median, "ok": ok, "auto": auto})
    set_variant("auto")
    with open(args[1], "w") as handle:
        json.dump(results, handle, indent=1)


if __name__ == "__main__":
    main()
