"""Would few long rows run faster one batch of rows at a time, each batch spread over the whole GPU?

Few rows of millions of elements run as one launch today: every row at once, each on its share of the SMs (a grid
group of C CTAs per row), and where a row's share of the chip cannot hold it, part of the row is read twice. Launched
a batch of rows at a time, a row gets every SM: it fits on chip, at the price of one launch (and one grid barrier)
per batch. This probe times both on the GPU, the batches captured in one CUDA graph (so that host overhead between
the launches does not count), next to a plain copy of the same bytes, and prints the plan each form gets.

Usage on a GPU machine: python3 benchmarks/probe_row_batches.py [--shapes 4x8388608,...] [--json PATH]
"""

from __future__ import annotations

import argparse
import json

import torch
import triton.testing

import softmax_ops

SHAPES = ["4x262144", "8x262144", "4x1048576", "4x8388608", "4x33554432", "64x151936", "3x100003"]
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}


def timed(fn) -> float:
    """Median milliseconds of fn (do_bench: L2 flushed before each call), the faster of two rounds."""
    return min(triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median") for _ in range(2))


def batched_graph(op, x: torch.Tensor, batch: int) -> torch.cuda.CUDAGraph:
    """One CUDA graph that runs `op` on rows [i, i + batch) of x for each i (each result its own tensor: no copy
    into a common output, whose traffic the single launch would not have)."""

    def run():
        for start in range(0, x.shape[0], batch):
            op(x[start:start + batch], -1)

    run()  # warm up (workspaces, plans) outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run()
    return graph


def probe(op_name: str, shape_text: str, dtype_name: str) -> dict:
    """Times the op on the whole tensor and batch by batch (1 and 2 rows), next to a copy; checks the batches."""
    rows, n = (int(v) for v in shape_text.split("x"))
    dtype = DTYPES[dtype_name]
    op = getattr(softmax_ops, op_name)
    x = torch.randn(rows, n, device="cuda", dtype=dtype) * 3
    y = torch.empty_like(x)
    copy_ms = timed(lambda: y.copy_(x))
    whole_ms = timed(lambda: op(x, -1))
    row = {"op": op_name, "shape": shape_text, "dtype": dtype_name, "copy_ms": copy_ms, "whole_ms": whole_ms,
           "plan_whole": softmax_ops.explain((rows, n), dtype, op=op_name)}
    line = f"{op_name:12s} {dtype_name} {shape_text:12s} copy {copy_ms * 1e3:8.1f} us  whole {whole_ms * 1e3:8.1f}"
    expected = getattr(torch, op_name)(x.double(), -1)
    tolerance = {"rtol": 1e-5, "atol": 1e-7} if dtype == torch.float32 else {"rtol": 2e-2, "atol": 1e-3}
    for batch in (1, 2):
        if batch >= rows:
            continue
        check = torch.cat([op(x[s:s + batch], -1) for s in range(0, rows, batch)])
        torch.testing.assert_close(check.double(), expected, **tolerance)
        ms = timed(batched_graph(op, x, batch).replay)
        row[f"batch{batch}_ms"] = ms
        row[f"plan_batch{batch}"] = softmax_ops.explain((batch, n), dtype, op=op_name)
        line += f"  batch {batch}: {ms * 1e3:8.1f} ({copy_ms / ms:4.2f} xCopy)"
    print(line + f"  [whole {copy_ms / whole_ms:4.2f} xCopy]", flush=True)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", default=",".join(SHAPES))
    parser.add_argument("--dtypes", default="fp16,fp32")
    parser.add_argument("--ops", default="softmax")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    results = []
    for shape_text in args.shapes.split(","):
        for dtype_name in args.dtypes.split(","):
            for op_name in args.ops.split(","):
                results.append(probe(op_name, shape_text, dtype_name))
                torch.cuda.empty_cache()
    for row in results:
        for key in [k for k in row if k.startswith("plan")]:
            print(f"{row['op']} {row['dtype']} {row['shape']} {key}: {row[key].splitlines()[1].strip()}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
