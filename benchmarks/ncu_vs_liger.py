"""One call each of Liger's softmax and ours (the dispatcher's choice) per shape, for Nsight Compute.

As run in session 12 (benchmarks/results/*session12-c1-ncu-lean-vs-liger*, *-c2-*, *-c4-ncu-final*), needs
liger_kernel::

    ncu --kernel-name regex:"softmax|_softmax" --section SpeedOfLight --section InstructionStats \
        python3 benchmarks/ncu_vs_liger.py 4096x4096,2048x4096 fp16,bf16
"""
import sys

import torch
from liger_kernel.ops.softmax import LigerSoftmaxFunction

import softmax_ops

for shape_text in sys.argv[1].split(","):
    for dt in sys.argv[2].split(","):
        dtype = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}[dt]
        shape = tuple(int(v) for v in shape_text.split("x"))
        x = torch.randn(shape, device="cuda", dtype=dtype) * 3
        print("---", shape_text, dt, softmax_ops.explain(shape, dtype), flush=True)
        LigerSoftmaxFunction.apply(x)
        softmax_ops.softmax(x, -1)
        torch.cuda.synchronize()
