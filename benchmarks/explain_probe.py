"""Calls explain() and one op per family on a few shapes, printing before each call, so a crash names its
call. Run on a GPU machine: python3 benchmarks/explain_probe.py"""

import sys

import torch

import softmax_ops

CASES = [("softmax", (4096, 4096), 0), ("softmax", (4, 33554432), 0), ("log_softmax", (16384, 128), 0),
         ("softmax_backward", (16384, 128), 0), ("fused_topk", (16384, 64), 6), ("fused_topk", (64, 151936), 50),
         ("fused_topk_backward", (64, 151936), 50)]

for op, shape, k in CASES:
    for dtype in (torch.float16, torch.float32):
        print(f"explain {op} {shape} {dtype} k={k}", flush=True)
        print("   ", softmax_ops.explain(shape, dtype, op=op, k=k).replace("\n", "\n    "), flush=True)
x = torch.randn(64, 4096, device="cuda", dtype=torch.float16)
for name, fn in [("softmax", lambda: softmax_ops.softmax(x, -1)), ("fused_topk", lambda: softmax_ops.fused_topk(x, 8))]:
    print("run", name, flush=True)
    fn()
    torch.cuda.synchronize()
print("probe ok", file=sys.stderr)
