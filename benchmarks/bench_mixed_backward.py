"""Times softmax_backward / log_softmax_backward with float32 streams and a float16 / bfloat16 result (the backward
of softmax(x_half, dtype=torch.float32), a dtype pair the bench's sweep does not have) against a copy of the same
bytes (10 per element: two float32 streams read, a 16-bit gradient written). Each case is first checked against
float64. One GPU call (needs triton)::

    python3 benchmarks/bench_mixed_backward.py OUT.json
"""

from __future__ import annotations

import json
import sys

SHAPES = [(2048, 1024), (2048, 2048), (2048, 4096), (4096, 4096), (32768, 2048)]
BYTES_PER_ELEMENT = 4 + 4 + 2  # grad_output and output read as float32, the gradient written in 16 bits
MAX_RELATIVE_ERROR = 1e-2


def reference(op: str, grad, output):
    """The exact gradient from float64 copies of the op's own inputs."""
    g, y = grad.double(), output.double()
    if op == "softmax":
        return y * (g - (g * y).sum(-1, keepdim=True))
    return g - y.exp() * g.sum(-1, keepdim=True)


def main() -> None:
    import torch
    import triton.testing

    import softmax_ops

    def median_ms(fn) -> float:
        return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")

    rows = []
    for shape in SHAPES:
        for result_dtype in (torch.float16, torch.bfloat16):
            for op in ("softmax", "log_softmax"):
                torch.manual_seed(0)
                x = torch.randn(shape, device="cuda", dtype=result_dtype) * 3
                output = getattr(torch, op)(x, -1, dtype=torch.float32)
                grad = torch.randn(shape, device="cuda", dtype=torch.float32)
                backward = getattr(torch.ops.softmax_ops, f"{op}_backward")
                gradient = backward(grad, output, -1, result_dtype)
                exact = reference(op, grad, output)
                error = ((gradient.double() - exact).abs().max() / exact.abs().max()).item()
                assert gradient.dtype == result_dtype and error < MAX_RELATIVE_ERROR, (shape, result_dtype, op, error)
                ms = median_ms(lambda: backward(grad, output, -1, result_dtype))  # noqa: B023 (timed right here)
                source = torch.empty(x.numel() * BYTES_PER_ELEMENT // 2, dtype=torch.uint8, device="cuda")
                target = torch.empty_like(source)
                copy_ms = median_ms(lambda: target.copy_(source))  # noqa: B023
                dtype_name = str(result_dtype).removeprefix("torch.")
                rows.append({"op": f"{op}_backward", "shape": list(shape), "dtype": f"f32->{dtype_name}", "ms": ms,
                             "copy_ms": copy_ms, "xcopy": copy_ms / ms, "err": error,
                             "explain": softmax_ops.explain(shape, torch.float32, op=f"{op}_backward")[:120]})
                print(f"{op}_backward {shape} f32->{dtype_name}: {ms * 1e3:.1f} us, "
                      f"xCopy(same bytes) {copy_ms / ms:.2f}, err {error:.1e}")
    with open(sys.argv[1], "w") as handle:
        json.dump({"gpu": torch.cuda.get_device_name(), "rows": rows}, handle, indent=1)


if __name__ == "__main__":
    main()
