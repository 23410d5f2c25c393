"""Runs a few softmax-family calls and their copy yardstick (fused_topk: x.sum(-1)) once each, for Nsight
Compute to time kernels.

The bench's event timing of a small problem includes launch and L2-flush effects; under
``ncu --metrics gpu__time_duration.sum`` each kernel's own duration is reported, so the two can be
compared. One GPU call::

    ncu --metrics gpu__time_duration.sum,dram__bytes.sum,sm__warps_active.avg.pct_of_peak_sustained_active \
        python3 benchmarks/ncu_probe.py --shapes 4x16384,4x262144 --dtypes fp16
"""

from __future__ import annotations

import argparse
import contextlib
import itertools

DTYPES = {"fp16": "float16", "bf16": "bfloat16", "fp32": "float32"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", default="4x16384,4x262144,128x1024,64x151936")
    parser.add_argument("--dtypes", default="fp16")
    parser.add_argument("--ops", default="softmax", help="softmax, log_softmax, softmax_backward")
    parser.add_argument("--kernels", default="auto",
                        help="softmax-family kernels to force, comma-separated ('auto' = the dispatcher's choice)")
    parser.add_argument("--out-dtype", choices=sorted(DTYPES), default=None,
                        help="softmax / log_softmax's dtype= (e.g. fp32 for 16-bit inputs: the widening form)")
    parser.add_argument("--topk", default="", help="fused_topk cases ROWSxNkK, comma-separated (e.g. 16384x8k2)")
    parser.add_argument("--topk-values", choices=["float32", "input"], default="float32",
                        help="fused_topk's values dtype: float32 (dtype=torch.float32) or the input dtype (the bench's)")
    args = parser.parse_args()

    import torch

    import softmax_ops

    out_dtype = getattr(torch, DTYPES[args.out_dtype]) if args.out_dtype else None
    for dtype_name in args.dtypes.split(","):
        dtype = getattr(torch, DTYPES[dtype_name])
        for shape_text in filter(None, args.shapes.split(",")):
            shape = tuple(int(v) for v in shape_text.split("x"))
            x = torch.randn(shape, device="cuda", dtype=dtype) * 3
            y = torch.empty_like(x)
            for op, kernel in itertools.product(args.ops.split(","), args.kernels.split(",")):
                family = "softmax_backward" if op == "softmax_backward" else "softmax"
                forced = softmax_ops.force_kernel(family, kernel) if kernel != "auto" else contextlib.nullcontext()
                with forced:
                    widening = out_dtype if op != "softmax_backward" else None
                    plan = softmax_ops.explain(shape, dtype, op=op, out_dtype=widening)
                    print(f"--- {shape_text} {dtype_name} {op} (dtype={widening}): {plan}", flush=True)
                    out = softmax_ops.softmax(x, -1) if op == "softmax_backward" else None
                    torch.cuda.synchronize()
                    y.copy_(x)
                    if op == "softmax_backward":
                        torch.ops.softmax_ops.softmax_backward(x, out, -1, dtype)
                    else:
                        getattr(softmax_ops, op)(x, -1, dtype=widening)
                    torch.cuda.synchronize()
        for case in filter(None, args.topk.split(",")):
            shape_text, k = case.split("k")
            rows, cols = (int(v) for v in shape_text.split("x"))
            logits = torch.randn(rows, cols, device="cuda", dtype=dtype) * 3
            print(f"--- fused_topk {case} {dtype_name}", flush=True)
            torch.cuda.synchronize()
            logits.sum(-1)  # the xSum yardstick
            values_dtype = torch.float32 if args.topk_values == "float32" else None
            softmax_ops.fused_topk(logits, int(k), -1, False, values_dtype)
            torch.cuda.synchronize()


if __name__ == "__main__":
    main()
