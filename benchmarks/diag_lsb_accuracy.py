"""Where the log_softmax_backward float32 error on 3 x 1441793 comes from (the former strict xfail).

Builds the test's inputs (tests/test_cuda_softmax.py: make_input seed n + 1, grad seed 11), takes y from
torch's forward as the test does (and from ours), and measures ours, torch's and an exact-arithmetic
backward (float64 on the op's inputs, rounded once) against two references: the exact gradient of x (the test's reference up to session 4)
and the backward computed in float64 on its own inputs (grad, y). One GPU call:
    python3 benchmarks/diag_lsb_accuracy.py
"""

from __future__ import annotations

import torch

import softmax_ops


def make_input(shape, dtype, seed, scale=3.0):
    generator = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=generator, dtype=torch.float64) * scale).to(dtype).to("cuda")


def report(y: torch.Tensor, x: torch.Tensor, g: torch.Tensor, n: int) -> None:
    ours = torch.ops.softmax_ops.log_softmax_backward(g, y, -1, torch.float32).double().cpu()
    torch_own = torch._log_softmax_backward_data(g, y, -1, torch.float32).double().cpu()
    x64, y64, g64 = x.double().cpu(), y.double().cpu(), g.double().cpu()
    s64 = g64.sum(-1, keepdim=True)
    exact_gradient = g64 - torch.softmax(x64, -1) * s64
    on_inputs = g64 - torch.exp(y64) * s64
    exact_on_y = on_inputs.float().double()
    print(f"  forward output: max |y - log_softmax(x64)| = {(y64 - torch.log_softmax(x64, -1)).abs().max().item():.3e}; "
          f"sum(grad) per row = {[round(v, 2) for v in s64.view(-1).tolist()]}")
    for ref_name, ref in [("exact gradient of x", exact_gradient), ("float64 on (grad, y)", on_inputs)]:
        print(f"  reference: {ref_name}")
        for name, value in [("softmax_ops", ours), ("torch", torch_own), ("float64 on (grad, y), rounded", exact_on_y)]:
            err = (value - ref).abs()
            at = divmod(err.view(-1).argmax().item(), n)
            print(f"    {name:32s} max error {err.max().item():.3e} at {at}")


def main() -> None:
    n = 1441793
    x = make_input((3, n), torch.float32, seed=n + 1)
    g = make_input((3, n), torch.float32, seed=11, scale=1.0)
    print("y from torch.log_softmax (what tests/test_cuda_softmax.py's check_backward feeds both backwards):")
    report(torch.log_softmax(x, -1), x, g, n)
    print("y from softmax_ops.log_softmax:")
    report(softmax_ops.log_softmax(x, -1), x, g, n)


if __name__ == "__main__":
    main()
