"""torch.compile's softmax / log_softmax backward against ours, one call each per case, for Nsight Compute
(the compiled function is built and run once outside the profiled range: profile with --profile-from-start
off); with --code, prints the interesting lines of Inductor's generated Triton source instead.

As run in session 18 (benchmarks/results/*session18-c1-{ncu-backward-vs-compile,inductor-backward-code}*)::

    ncu --profile-from-start off --section SpeedOfLight --section Occupancy --section LaunchStats \\
        python3 benchmarks/ncu_backward_vs_compile.py sm:2048x8192:fp32,sm:2048x8192:fp16,sm:32768x2048:fp32
    python3 benchmarks/ncu_backward_vs_compile.py sm:2048x8192:fp32,lsm:2048x8192:fp16 --code

A case is OP:ROWSxN:DTYPE with OP sm (softmax_backward) or lsm (log_softmax_backward).
"""
import sys

import torch

import softmax_ops

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}
# Lines of Inductor's source worth reading: the kernel's signature and launch, its loops, loads and stores.
CODE_MARKERS = ("def triton", "@triton", "R0_BLOCK", "RBLOCK", "num_warps", ".run(", "for r", "tl.load", "tl.store")


def aten_backward(op: str):
    if op == "sm":
        return lambda dy, y: torch.ops.aten._softmax_backward_data(dy, y, -1, y.dtype)
    return lambda dy, y: torch.ops.aten._log_softmax_backward_data(dy, y, -1, y.dtype)


def main() -> None:
    softmax_ops.disable()  # Inductor's own kernels, not ours
    for case in sys.argv[1].split(","):
        op, shape_text, dtype_name = case.split(":")
        shape = tuple(int(v) for v in shape_text.split("x"))
        dtype = DTYPES[dtype_name]
        x = torch.randn(shape, device="cuda", dtype=dtype) * 3
        y = torch.softmax(x, -1) if op == "sm" else torch.log_softmax(x, -1)
        dy = torch.randn_like(y)
        compiled = torch.compile(aten_backward(op), dynamic=False)
        if "--code" in sys.argv:
            from torch._inductor.utils import run_and_get_code

            _, sources = run_and_get_code(compiled, dy, y)
            print("=== inductor", case)
            for source in sources:
                for line in source.splitlines():
                    if any(marker in line for marker in CODE_MARKERS):
                        print(line)
            continue
        compiled(dy, y)
        ours = torch.ops.softmax_ops.softmax_backward if op == "sm" else torch.ops.softmax_ops.log_softmax_backward
        family_op = "softmax_backward" if op == "sm" else "log_softmax_backward"
        torch.cuda.synchronize()
        print("---", case, softmax_ops.explain(shape, dtype, op=family_op), flush=True)
        torch.cuda.cudart().cudaProfilerStart()
        compiled(dy, y)
        ours(dy, y, -1, dtype)
        torch.cuda.synchronize()
        torch.cuda.cudart().cudaProfilerStop()


if __name__ == "__main__":
    main()
