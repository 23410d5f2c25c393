"""How often fused_topk's indices differ from torch.topk(torch.softmax(x)) on rows with exact ties, per device.

fused_topk keeps equal logits in index order (the lower index first). torch.topk promises no order among equal
values: on CPU it keeps any of them (torch.topk(torch.zeros(8), 3) gives [6, 5, 4] on torch 2.14.1); on CUDA its
gather keeps the lowest indices at the k-th place (TensorTopK.cu), then sorts the k its own way. The compile
pass fuses softmax -> top-k with float32 probabilities (HF Mixtral's ``softmax(logits, dtype=torch.float)``), so
for bfloat16 logits, where equal logits are common, this says whether a compiled model's expert indices match
eager's on this device: the share of rows whose index set differs, and whose order differs, over router shapes.
The values must agree in every row (checked, within float32 rounding). Works on CPU too; one short GPU call::

    python3 benchmarks/tie_probe.py --device cuda
"""

from __future__ import annotations

import argparse

SHAPES = [(4096, 8, 2), (4096, 64, 8), (4096, 128, 8), (4096, 256, 8), (4096, 60, 4), (4096, 160, 6)]


def share(mask) -> str:
    """The share of rows where ``mask`` holds, as a percentage column."""
    return f"{mask.float().mean().item():9.2%}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    import torch

    import softmax_ops

    generator = torch.Generator(device="cpu").manual_seed(args.seed)
    print(f"torch {torch.__version__}, device {args.device}"
          + (f" ({torch.cuda.get_device_name()})" if args.device == "cuda" else ""))
    print("logits   probabilities  rows x experts k  tied rows  other set  same set, other order  (shares of rows)")
    for logits_dtype, probs_dtype in [(torch.bfloat16, torch.float32), (torch.float16, torch.float32),
                                      (torch.float32, torch.float32)]:
        for rows, experts, k in SHAPES:
            x = torch.randn(rows, experts, generator=generator).to(logits_dtype).to(args.device)
            # Whole-number logits in float32 too, so that it has exact ties as well.
            if logits_dtype == torch.float32:
                x = (x * 4).round()
            theirs = torch.topk(torch.softmax(x, -1, dtype=probs_dtype), k, -1)
            ours = softmax_ops.fused_topk(x, k, -1, False, probs_dtype)
            # Equal up to rounding (the kernels sum in their own order): a tie never changes a value.
            torch.testing.assert_close(ours[0], theirs.values, rtol=4e-6, atol=1e-30)
            top = torch.sort(x.float(), -1, descending=True).values
            tied = (top[:, : k + 1].diff(dim=-1) == 0).any(-1)  # a tie within the k or at the k-th place
            other_set = (theirs.indices.sort(-1).values != ours[1].sort(-1).values).any(-1)
            other_order = (theirs.indices != ours[1]).any(-1) & ~other_set  # the same set, in another order
            print(f"{str(logits_dtype)[6:]:8} {str(probs_dtype)[6:]:14} {rows:5} x {experts:3} k{k:<3} "
                  f"{share(tied)}  {share(other_set)}  {share(other_order):>21}")


if __name__ == "__main__":
    main()
