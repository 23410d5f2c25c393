"""One call each of torch.compile's softmax and ours per shape, for Nsight Compute: the compiled function is
built and run once outside the profiled range (profile with --profile-from-start off).

As run in session 12 (benchmarks/results/*session12-c9-ncu-compile-vs-ours*)::

    ncu --profile-from-start off --section SpeedOfLight --section LaunchStats --section InstructionStats \
        python3 benchmarks/ncu_vs_compile.py 65536x64,2048x1024,16384x128 fp16,fp32
"""
import sys

import torch

import softmax_ops

softmax_ops.disable()
for shape_text in sys.argv[1].split(","):
    for dt in sys.argv[2].split(","):
        dtype = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}[dt]
        shape = tuple(int(v) for v in shape_text.split("x"))
        x = torch.randn(shape, device="cuda", dtype=dtype) * 3
        compiled = torch.compile(lambda t: torch.softmax(t, -1), dynamic=False)
        compiled(x)
        torch.cuda.synchronize()
        print("---", shape_text, dt, softmax_ops.explain(shape, dtype), flush=True)
        torch.cuda.cudart().cudaProfilerStart()
        compiled(x)
        softmax_ops.softmax(x, -1)
        torch.cuda.synchronize()
        torch.cuda.cudart().cudaProfilerStop()
