"""What the compile pass costs or gains where a softmax has neighbours inductor would fuse into it.

The bench times the ops alone. In a model, inductor fuses a softmax's elementwise producers (scale, additive
mask, a cast to float) and consumers (a cast back) into its own reduction kernel; once the pass swaps the
softmax for our op, those neighbours become kernels of their own, each a full read and write of the tensor.
This times, per site form, torch.compile without the pass, with it, and eager, in turns, and prints what the pass
rewrote. Timer: the bench's (make_timer; since session 36 CUDA events after an L2 flush and a GPU spin, so
torch.compile's host overhead is not timed). Run on a GPU: python benchmarks/fusion_context_probe.py [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import types

import torch
import torch.nn.functional as F

import softmax_ops
from softmax_ops._bench_timing import make_timer


def attention_sites(scale: float):
    """Attention-score softmax forms seen in model code (x: scores, mask: additive, broadcast over heads)."""
    return {
        "plain": lambda x, mask: torch.softmax(x, dim=-1),
        "scale_mask": lambda x, mask: torch.softmax(x * scale + mask, dim=-1),
        # HF Transformers' eager_attention_forward
        "hf_eager": lambda x, mask: F.softmax(x * scale + mask, dim=-1, dtype=torch.float32).to(x.dtype),
        "fp32_then_cast": lambda x, mask: F.softmax(x, dim=-1, dtype=torch.float32).to(x.dtype),
        "float_input": lambda x, mask: torch.softmax(x.float(), dim=-1),
    }


def lm_head_sites(targets: torch.Tensor):
    """LM-head forms (x: logits, targets: one class per row): a full log_softmax, and readers of a few of its
    columns only, which inductor computes without writing the log-probabilities out."""
    return {
        "log_softmax": lambda x, mask: torch.log_softmax(x, dim=-1),
        "log_softmax_float_input": lambda x, mask: torch.log_softmax(x.float(), dim=-1),
        "nll_loss": lambda x, mask: F.nll_loss(F.log_softmax(x.float(), dim=-1), targets),
        "logprob_gather": lambda x, mask: F.log_softmax(x.float(), dim=-1).gather(-1, targets[:, None]),
    }


def router_sites():
    """MoE router forms (x: router logits): HF Mixtral's softmax of a float32 copy, then top-k."""
    return {
        "router_float_input": lambda x, mask: torch.topk(F.softmax(x.float(), dim=-1), 2, dim=-1),
        "router_dtype_argument": lambda x, mask: torch.topk(F.softmax(x, dim=-1, dtype=torch.float32), 2, dim=-1),
    }


# Sites also timed as a training step (forward and backward of the sum of the result).
TRAINING_SITES = ("nll_loss",)


def compiled(fn, with_pass: bool):
    """fn compiled with or without the pass, on a copy of its code object: Dynamo caches compiled code on the
    code object, so two compilations of one function would both run whichever was compiled last."""
    if with_pass:
        softmax_ops.enable()
    else:
        softmax_ops.disable()
    softmax_ops.reset_compile_report()
    code = fn.__code__.replace(co_name=f"{fn.__code__.co_name}_{'with' if with_pass else 'without'}_pass")
    copy = types.FunctionType(code, fn.__globals__, code.co_name, fn.__defaults__, fn.__closure__)
    return torch.compile(copy, fullgraph=True)


def first_tensor(value):
    return value[0] if isinstance(value, (tuple, list)) else value


def run_case(name, fn, x, mask, timer, rounds, train=False):
    """Times eager, torch.compile and torch.compile with the pass on one site; train: forward and backward."""
    if train:
        x = x.detach().requires_grad_()
        name += "_train"

    def step(f):
        return (lambda: first_tensor(f(x, mask)).sum().backward()) if train else (lambda: f(x, mask))

    plain = compiled(fn, with_pass=False)
    plain(x, mask)
    if softmax_ops.compile_report().rewritten:
        raise RuntimeError("the pass ran on the compilation meant to go without it")
    ours = compiled(fn, with_pass=True)
    out = first_tensor(ours(x, mask))  # top-k sites: the values
    report = softmax_ops.compile_report().summary().replace("\n", " | ")
    ref = first_tensor(fn(x.detach().double(), mask.double())).to(out.dtype)
    err = (out.detach().double() - ref.double()).abs().max().item()
    fns = {"eager": step(fn), "compile": step(plain), "compile+softmax_ops": step(ours)}
    best = {k: math.inf for k in fns}
    for _ in range(rounds):
        for k, f in fns.items():
            best[k] = min(best[k], timer(f))
    softmax_ops.enable()
    row = {"site": name, "shape": list(x.shape), "dtype": str(x.dtype).removeprefix("torch."),
           "us": {k: round(v * 1e3, 2) for k, v in best.items()}, "max_abs_err": err, "report": report}
    print(f"{name:26s} {tuple(x.shape)!s:22s} {row['dtype']:9s} " +
          " ".join(f"{k} {v * 1e3:8.1f}" for k, v in best.items()) +
          f"  ours/compile {best['compile+softmax_ops'] / best['compile']:.2f}  err {err:.1e}", flush=True)
    print(f"    pass: {report[:300]}", flush=True)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", default=None)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--rewrite-all", action="store_true",
                        help="the pass rewrites every softmax, fused neighbours or not (SOFTMAX_OPS_REWRITE_FUSED=1)")
    parser.add_argument("--device", default="cuda", help="cpu: a smoke test (set SOFTMAX_OPS_DEVICES=cuda,cpu)")
    parser.add_argument("--sites", default="attention,lm,router", help="comma-separated: attention, lm, router")
    parser.add_argument("--small", action="store_true", help="shapes 1/8 as long in the last two dims")
    args = parser.parse_args()
    torch._inductor.config.fx_graph_cache = False
    if args.rewrite_all:
        os.environ["SOFTMAX_OPS_REWRITE_FUSED"] = "1"
    device = torch.device(args.device)
    cut = (lambda shape: shape[:-2] + tuple(max(8, d // 8) for d in shape[-2:])) if args.small else (lambda s: s)
    timer = make_timer(device)
    gen = torch.Generator(device=device).manual_seed(0)
    rows = []
    # Large enough for the GPU time to dominate: the compiled functions' CPU overhead (~20-30 us per call)
    # decided session 25's first run of (32, 12, 128, 128).
    attention_shapes = [((4, 16, 1024, 1024), torch.float16), ((256, 16, 128, 128), torch.float16),
                        ((16, 32, 512, 512), torch.bfloat16), ((1, 32, 2048, 2048), torch.bfloat16)]
    for shape, dtype in attention_shapes if "attention" in args.sites else []:
        shape = cut(shape)
        s = shape[-1]
        x = torch.randn(shape, device=device, dtype=dtype, generator=gen) * 3
        causal = torch.full((s, s), float("-inf"), device=device).triu(1)
        mask = causal.to(dtype)[None, None]
        for name, fn in attention_sites(1.0 / math.sqrt(128)).items():
            rows.append(run_case(name, fn, x, mask, timer, args.rounds))
    for shape, dtype in [((8192, 32000), torch.bfloat16), ((2048, 151936), torch.float16)]:
        if "lm" not in args.sites:
            break
        shape = cut(shape)
        x = torch.randn(shape, device=device, dtype=dtype, generator=gen) * 3
        mask = torch.zeros((), device=device, dtype=dtype)
        targets = torch.randint(0, shape[-1], shape[:1], device=device, generator=gen)
        for name, fn in lm_head_sites(targets).items():
            rows.append(run_case(name, fn, x, mask, timer, args.rounds))
            if name in TRAINING_SITES:
                rows.append(run_case(name, fn, x, mask, timer, args.rounds, train=True))
    for shape, dtype in [((65536, 64), torch.bfloat16), ((16384, 256), torch.bfloat16)]:
        if "router" not in args.sites:
            break
        x = torch.randn(cut(shape), device=device, dtype=dtype, generator=gen) * 3
        for name, fn in router_sites().items():
            rows.append(run_case(name, fn, x, torch.zeros((), device=device, dtype=dtype), timer, args.rounds))
    if args.json:
        with open(args.json, "w") as f:
            gpu = torch.cuda.get_device_name() if device.type == "cuda" else "cpu"
            json.dump({"gpu": gpu, "torch": torch.__version__, "timer": timer.description, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
