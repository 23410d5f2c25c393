"""`python -m softmax_ops`: a small MoE transformer block compiled with and without softmax_ops.

It builds the block of ``_demo_model`` with seeded random weights, compiles it with torch.compile twice (the
softmax_ops pass disabled, then enabled), prints what the pass substituted and which kernel each
substitution runs, checks both compiled outputs against eager, and times eager / torch.compile /
torch.compile + softmax_ops on the best device present. Exit status: 0 when everything matches, 1 when an
output does not match eager (or the pass substituted nothing), 2 on bad usage.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

import torch
import torch._functorch.config
import torch._inductor.config

import softmax_ops
from softmax_ops._bench_timing import interleaved_medians
from softmax_ops._demo_model import DemoConfig, MoEBlock, build_model
from softmax_ops._demo_report import Substitution, format_substitutions, substitutions

# Defaults per device: the CPU block is small so the whole run (two inductor compiles dominate) stays around a
# minute on 2 cores; the GPU block is big enough that the softmaxes are a visible share of the step.
CPU_DEFAULTS = DemoConfig(tokens=256, hidden=128, heads=4, experts=8, top_k=2, vocab=4096)
CUDA_DEFAULTS = DemoConfig(tokens=4096, hidden=512, heads=8, experts=8, top_k=2, vocab=32768)
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
DTYPE_ALIASES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
# (atol, rtol) for log-probabilities vs eager; a few output-dtype rounding steps at |log p| ~ 10.
TOLERANCES = {torch.float32: (1e-4, 1e-4), torch.float16: (1e-2, 1e-2), torch.bfloat16: (3e-2, 3e-2)}
# Back-to-back calls per timed turn on CUDA (see interleaved_medians): the GPU stays busy within a turn.
CUDA_TIMING_BATCH = 5

def build_parser() -> argparse.ArgumentParser:
    """The demo's command line (``bench`` is a separate subcommand, see ``python -m softmax_ops bench -h``)."""
    parser = argparse.ArgumentParser(
        prog="python -m softmax_ops",
        description="Compile a small MoE transformer block (attention softmax, Mixtral-style router "
        "softmax->topk->renormalise, LM-head log_softmax) with torch.compile, with and without softmax_ops: "
        "show what was substituted, check the outputs against eager, and time eager / torch.compile / "
        "torch.compile + softmax_ops. Subcommand: `python -m softmax_ops bench` runs the kernel benchmark "
        "(see its --help).",
    )
    sizes = parser.add_argument_group("block sizes (defaults depend on the device: CPU / CUDA)")
    sizes.add_argument("--tokens", type=int, help=f"sequence length ({CPU_DEFAULTS.tokens} / {CUDA_DEFAULTS.tokens})")
    sizes.add_argument("--hidden", type=int, help=f"model width ({CPU_DEFAULTS.hidden} / {CUDA_DEFAULTS.hidden})")
    sizes.add_argument("--heads", type=int, help=f"attention heads ({CPU_DEFAULTS.heads} / {CUDA_DEFAULTS.heads})")
    sizes.add_argument("--experts", type=int, help=f"experts ({CPU_DEFAULTS.experts})")
    sizes.add_argument("--top-k", type=int, help=f"experts per token ({CPU_DEFAULTS.top_k})")
    sizes.add_argument("--vocab", type=int, help=f"vocabulary ({CPU_DEFAULTS.vocab} / {CUDA_DEFAULTS.vocab})")
    parser.add_argument("--device", default=None, help="cuda (default when a GPU is present) or cpu")
    parser.add_argument("--dtype", default=None,
                        help="float32, bfloat16 or float16 (default: bfloat16 on CUDA, float32 on CPU)")
    parser.add_argument("--iters", type=int, default=None,
                        help="timing rounds per variant, the variants taking turns (default 50 CUDA, 10 CPU)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the weights and the input (default 0)")
    return parser


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


@dataclass
class Comparison:
    """How a compiled variant's outputs differ from eager's."""

    max_error: float
    bad_tokens: int  # tokens (not near a routing tie) whose log-probs or experts differ beyond tolerance
    tied_tokens: int  # tokens whose eager routing is a near-tie: either choice is correct, excluded

    @property
    def ok(self) -> bool:
        return self.bad_tokens == 0


def compare_with_eager(
    eager: tuple[torch.Tensor, ...], compiled: tuple[torch.Tensor, ...], top_k: int, dtype: torch.dtype
) -> Comparison:
    """Compare log-probs and expert choices token by token.

    A token whose k-th and (k+1)-th router logits are within rounding noise may legitimately pick another
    expert once compiled (a different but equally valid summation order); such tokens are counted, not
    failed. Attention mixes tokens before the router, experts and LM head act per token, so a routing
    near-tie changes only that token's outputs.
    """
    atol, rtol = TOLERANCES.get(dtype, (1e-9, 1e-9))
    log_probs, router_logits, experts = eager
    got_log_probs, _, got_experts = compiled
    logits = router_logits.float().sort(dim=-1, descending=True).values
    if top_k < logits.shape[-1]:
        gap = logits[:, top_k - 1] - logits[:, top_k]
        tied = gap <= rtol * (1 + logits[:, top_k - 1].abs())
    else:
        tied = torch.zeros(logits.shape[0], dtype=torch.bool, device=logits.device)
    same_experts = (experts.sort(dim=-1).values == got_experts.sort(dim=-1).values).all(dim=-1)
    error = (got_log_probs.double() - log_probs.double()).abs()
    close = (error <= atol + rtol * log_probs.double().abs()).all(dim=-1)
    bad = ~tied & ~(same_experts & close)
    untied_error = error[~tied].max().item() if (~tied).any() else 0.0
    return Comparison(untied_error, int(bad.sum()), int(tied.sum()))


def _resolve(args: argparse.Namespace) -> tuple[torch.device, torch.dtype, DemoConfig, int]:
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: no CUDA GPU is visible")
    if device.type not in ("cuda", "cpu"):
        raise ValueError(f"--device: expected cuda or cpu, got {args.device}")
    defaults = CUDA_DEFAULTS if device.type == "cuda" else CPU_DEFAULTS
    dtype_name = args.dtype or ("bfloat16" if device.type == "cuda" else "float32")
    dtype_name = DTYPE_ALIASES.get(dtype_name, dtype_name)
    if dtype_name not in DTYPES:
        raise ValueError(f"--dtype: expected one of {', '.join(DTYPES)}, got {args.dtype}")
    overrides = {name: getattr(args, name) for name in ("tokens", "hidden", "heads", "experts", "top_k", "vocab")}
    config = replace(defaults, seed=args.seed, **{k: v for k, v in overrides.items() if v is not None})
    config.validate()
    iters = args.iters if args.iters is not None else (50 if device.type == "cuda" else 10)
    if iters <= 0:
        raise ValueError(f"--iters must be positive, got {iters}")
    return device, DTYPES[dtype_name], config, iters


def _pass_available() -> bool:
    return all(hasattr(softmax_ops, name) for name in ("enable", "disable", "compile_report",
                                                        "reset_compile_report"))


def _cpu_pass_devices() -> str:
    # The pass rewrites CUDA graphs only by default (DESIGN.md §6); adding cpu to SOFTMAX_OPS_DEVICES is how a
    # machine without GPU shows it. `python -m softmax_ops` imported the package before this runs, so the
    # devices are handed to enable() rather than read from the environment at import.
    devices = [d.strip() for d in os.environ.get("SOFTMAX_OPS_DEVICES", "cuda").split(",") if d.strip()]
    return ",".join(devices if "cpu" in devices else [*devices, "cpu"])


def _without_compile_caches() -> contextlib.ExitStack:
    # A cache hit (FX graph cache, AOTAutograd cache) skips the pre-grad pass on newer torch, so the report
    # would show nothing on a second run; the demo wants every compile to be a real one (and comparable).
    stack = contextlib.ExitStack()
    stack.enter_context(torch._inductor.config.patch(fx_graph_cache=False))
    functorch_config = torch._functorch.config
    if hasattr(functorch_config, "enable_autograd_cache"):
        stack.enter_context(functorch_config.patch(enable_autograd_cache=False))
    return stack


def _compile(model: MoEBlock, x: torch.Tensor, label: str) -> tuple[Callable[[], object], tuple, float]:
    torch._dynamo.reset()  # each variant compiles from scratch under the pass setting in force
    compiled = torch.compile(model, fullgraph=True)
    _log(f"  compiling: {label} ...")
    start = time.perf_counter()
    with _without_compile_caches(), torch.no_grad():
        outputs = compiled(x)
    seconds = time.perf_counter() - start
    _log(f"  compiled {label} in {seconds:.1f} s")

    def step() -> object:
        with torch.no_grad():
            return compiled(x)

    return step, outputs, seconds


def _report_comparison(label: str, comparison: Comparison, tokens: int) -> str:
    verdict = "matches eager" if comparison.ok else f"DOES NOT MATCH eager on {comparison.bad_tokens} token(s)"
    text = f"  {label:<30} {verdict} (max |log-prob error| {comparison.max_error:.2e}"
    if comparison.tied_tokens:
        text += f"; {comparison.tied_tokens}/{tokens} tokens at a routing near-tie not compared"
    return text + ")"


def run(config: DemoConfig, device: torch.device, dtype: torch.dtype, iters: int) -> int:
    """Build, compile twice, report, check and time; returns the process exit status."""
    print(f"softmax_ops demo: MoE transformer block, tokens={config.tokens} hidden={config.hidden} "
          f"heads={config.heads} experts={config.experts} top-k={config.top_k} vocab={config.vocab}, "
          f"{str(dtype).removeprefix('torch.')} on {device}")
    has_pass = _pass_available()
    pass_devices = None
    if device.type == "cuda":
        print(f"device: {torch.cuda.get_device_name(device)}, torch {torch.__version__}")
    else:
        pass_devices = _cpu_pass_devices()
        forced = f"; the softmax_ops pass is forced on CPU graphs (devices {pass_devices})" if has_pass else ""
        print(f"No CUDA GPU in use: running the CPU path (torch {torch.__version__}){forced}. CPU timings only "
              "show the plumbing, not the GPU speed-up.")
    if not has_pass:
        print("The softmax_ops torch.compile pass is unavailable in this build (softmax_ops.enable/disable/"
              "compile_report missing): only eager and plain torch.compile are shown.")
    was_enabled = has_pass and softmax_ops.is_enabled()

    _log("[1/4] building the block and running it eagerly ...")
    model, x = build_model(config, device, dtype)
    with torch.no_grad():
        eager_outputs = model(x)

    def eager_step() -> object:
        with torch.no_grad():
            return model(x)

    _log("[2/4] torch.compile without softmax_ops ...")
    if has_pass:
        softmax_ops.disable()
    plain_step, plain_outputs, _ = _compile(model, x, "torch.compile (softmax_ops pass disabled)")

    ours_step = ours_outputs = None
    rows: list[Substitution] = []
    skipped: list[object] = []
    if has_pass:
        _log("[3/4] torch.compile with softmax_ops ...")
        softmax_ops.enable(devices=pass_devices)
        softmax_ops.reset_compile_report()
        ours_step, ours_outputs, _ = _compile(model, x, "torch.compile + softmax_ops")
        report = softmax_ops.compile_report()
        rows, skipped = substitutions(report.rewritten, config, dtype, device), list(report.skipped)
        if not was_enabled:
            softmax_ops.disable()
    batch = CUDA_TIMING_BATCH if device.type == "cuda" else 1
    _log(f"[4/4] timing the variants in turns ({iters} rounds of {batch} call(s) each) ...")
    variants = {"eager": eager_step, "plain": plain_step}
    if ours_step is not None:
        variants["ours"] = ours_step
    medians = interleaved_medians(variants, device, iters, batch)
    eager_ms, plain_ms, ours_ms = medians["eager"], medians["plain"], medians.get("ours")

    status = 0
    print()
    if has_pass:
        print("Substituted by the softmax_ops compile pass:")
        print(format_substitutions(rows))
        for record in skipped:
            print(f"  left untouched: {record.pattern} at {record.node}: {record.reason}")
        if not rows:
            print("ERROR: the pass is enabled but substituted nothing in this model.")
            status = 1
        print()
    print("Outputs vs eager (log-probabilities and expert choices, token by token):")
    plain_check = compare_with_eager(eager_outputs, plain_outputs, config.top_k, dtype)
    print(_report_comparison("torch.compile", plain_check, config.tokens))
    if ours_outputs is not None:
        ours_check = compare_with_eager(eager_outputs, ours_outputs, config.top_k, dtype)
        print(_report_comparison("torch.compile + softmax_ops", ours_check, config.tokens))
        if not ours_check.ok:
            print("ERROR: torch.compile + softmax_ops does not match eager: softmax_ops changed the model's "
                  "results.")
            status = 1
    if not plain_check.ok:
        print("WARNING: plain torch.compile itself differs from eager beyond the tolerance for this dtype.")
    print()
    print(f"Time per forward step (median of {iters} rounds, variants in turns, {device.type}):")
    print(f"  {'eager':<30} {eager_ms:9.3f} ms")
    print(f"  {'torch.compile':<30} {plain_ms:9.3f} ms   {eager_ms / plain_ms:5.2f}x vs eager")
    if ours_step is not None:
        print(f"  {'torch.compile + softmax_ops':<30} {ours_ms:9.3f} ms   {eager_ms / ours_ms:5.2f}x vs eager, "
              f"{plain_ms / ours_ms:5.2f}x vs torch.compile")
    return status


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m softmax_ops``; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        device, dtype, config, iters = _resolve(args)
    except ValueError as error:
        parser.error(str(error))
    return run(config, device, dtype, iters)
