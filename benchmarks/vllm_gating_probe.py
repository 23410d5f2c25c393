"""fused_topk against vLLM's MoE gating kernel (``topk_softmax``) on router shapes, on one GPU.

vLLM does not import on the GPU machine (its wheels are far larger than what a call can carry), so this builds
vLLM's own source file for the op, ``csrc/moe/topk_softmax_kernels.cu``, which the user fetches from the vLLM
repository (it is not part of softmax_ops) and passes with ``--vllm-source``. The probe supplies the two things
the file takes from the rest of vLLM (``WARP_SIZE`` and a width-limited xor shuffle, in a ``cuda_compat.h`` of its
own) and a pybind entry point, and builds it with torch's JIT extension builder.

That kernel takes float32 logits: for each case and dtype it times
- ``ours``: ``fused_topk(x, k, -1, False, torch.float32)`` (float32 values, int64 indices; the bench's call);
- ``vllm``: ``topk_softmax(weights, ids, token_expert_indices, x.float())`` with int32 ids, as vLLM calls it
  (for 16-bit logits the cast to float32 is part of the call, a second kernel);
- ``vllm_kernel`` (16-bit logits only): the same on a float32 copy made beforehand (the kernel alone, reading
  twice the bytes of the 16-bit logits);
- ``sum``: ``x.sum(-1)``, the bench's xSum yardstick;
with the bench's timer (CUDA events after an L2 flush and a GPU spin), ``--rounds`` interleaved rounds, the fastest
round reported. Before timing, the selections are compared (indices equal, values within 1e-6 relative; vLLM
picks the larger probability and, on ties, the lower index, as fused_topk does): a case where they differ is marked
DIFFERS and the probe exits with status 1 after the table. vLLM's fast kernel covers expert
counts that are powers of two up to 512 and 192 / 320 / 384 / 448 / 576; any other count (60, 160) runs its
fallback, a softmax kernel into a workspace and a top-k kernel.

The table's header and the JSON name the source file's sha256, so a result can be matched to a vLLM commit.
One GPU call::

    python3 benchmarks/vllm_gating_probe.py --vllm-source /path/to/topk_softmax_kernels.cu --json out.json
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import tempfile
from pathlib import Path

DEFAULT_CASES = ("256x128k8,16384x8k2,16384x64k6,16384x128k8,16384x256k8,65536x256k8,16384x384k8,16384x512k8,"
                 "4096x60k4,16384x160k6")

# What topk_softmax_kernels.cu includes from the rest of vLLM ("../cuda_compat.h"): written here, not copied.
COMPAT_HEADER = """#pragma once
#define WARP_SIZE 32
#define VLLM_SHFL_XOR_SYNC_WIDTH(var, lane_mask, width) __shfl_xor_sync(0xffffffffu, (var), (lane_mask), (width))
"""

BINDING = """#include <torch/extension.h>
void topk_softmax(torch::Tensor& topk_weights, torch::Tensor& topk_indices, torch::Tensor& token_expert_indices,
                  torch::Tensor& gating_output);
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("topk_softmax", &topk_softmax); }
"""


def build_vllm(source: Path, build_root: Path):
    """vLLM's topk_softmax built from ``source`` with the probe's compat header and binding."""
    from torch.utils.cpp_extension import load

    from softmax_ops._build import _pip_cuda_include_dirs, _toolkit_include_and_link_flags

    tree = build_root / "src"
    (tree / "moe").mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source, tree / "moe" / "topk_softmax_kernels.cu")
    (tree / "cuda_compat.h").write_text(COMPAT_HEADER)
    (tree / "binding.cpp").write_text(BINDING)
    toolkit_includes, toolkit_libs = _toolkit_include_and_link_flags()  # as softmax_ops' own build
    out = build_root / "build"
    out.mkdir(exist_ok=True)
    return load(name="vllm_topk_softmax_probe", sources=[str(tree / "binding.cpp"),
                                                        str(tree / "moe" / "topk_softmax_kernels.cu")],
                extra_cuda_cflags=["-O3"], extra_include_paths=_pip_cuda_include_dirs() + toolkit_includes,
                extra_ldflags=toolkit_libs, build_directory=str(out), verbose=False)


class CaseCalls(dict):
    """The timed callables of one case (name -> callable); ``vllm_outputs``: the (weights, ids) vLLM writes."""

    vllm_outputs: tuple


def case_calls(torch, softmax_ops, vllm, x, k: int) -> CaseCalls:
    """ours / vllm / sum (and vllm_kernel for 16-bit logits) on logits ``x`` (see the module docstring)."""
    n_rows = x.shape[0]
    x32 = x.float()
    weights = torch.empty(n_rows, k, device=x.device, dtype=torch.float32)
    ids = torch.empty(n_rows, k, device=x.device, dtype=torch.int32)
    token_expert = torch.empty(n_rows, k, device=x.device, dtype=torch.int32)
    fns = CaseCalls(
        ours=lambda: softmax_ops.fused_topk(x, k, -1, False, torch.float32),
        vllm=lambda: vllm.topk_softmax(weights, ids, token_expert, x.float()),
        sum=lambda: x.sum(-1),
    )
    if x.dtype != torch.float32:
        fns["vllm_kernel"] = lambda: vllm.topk_softmax(weights, ids, token_expert, x32)
    fns.vllm_outputs = (weights, ids)
    return fns


def agreement(ours, theirs) -> tuple[str, bool]:
    """How vLLM's selection compares with ours (rows with identical indices, largest relative value gap), and
    whether they agree: every row's indices equal, every value within 1e-6 relative."""
    (values, indices), (weights, ids) = ours, theirs
    same_rows = (indices == ids.long()).all(dim=-1).float().mean().item()
    gap = ((values - weights).abs() / values.abs().clamp_min(1e-30)).max().item()
    agree = same_rows == 1.0 and gap <= 1e-6
    return f"indices equal on {100 * same_rows:.2f}% of rows, values within {gap:.1e}" + ("" if agree else " DIFFERS"), agree


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--vllm-source", type=Path, required=True, help="vLLM's csrc/moe/topk_softmax_kernels.cu")
    parser.add_argument("--cases", default=DEFAULT_CASES, help="comma-separated ROWSxNkK")
    parser.add_argument("--dtypes", default="fp16,bf16,fp32")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--json", type=Path, help="write every measurement as JSON")
    args = parser.parse_args()
    if not args.vllm_source.is_file():
        parser.error(f"--vllm-source: no such file {args.vllm_source}")

    import torch

    import softmax_ops
    from softmax_ops._bench_cases import DTYPES, parse_dtypes, parse_shapes
    from softmax_ops._bench_timing import make_timer

    try:  # the bench's own parsers: ROWSxNkK and fp16 / bf16 / fp32 (and their aliases)
        cases = parse_shapes(args.cases)
        dtype_names = parse_dtypes(args.dtypes)
    except ValueError as error:
        parser.error(str(error).replace("--shapes", "--cases"))
    for n_rows, n, k in cases:
        if not 1 <= k <= n:
            parser.error(f"--cases: {n_rows}x{n}k{k} needs 1 <= k <= N")
    rounds = max(1, args.rounds)
    source_sha256 = hashlib.sha256(args.vllm_source.read_bytes()).hexdigest()

    if not torch.cuda.is_available():
        raise SystemExit("vllm_gating_probe.py needs a CUDA GPU")
    device = torch.device("cuda")
    with tempfile.TemporaryDirectory() as build_root:
        print(f"building {args.vllm_source} ...", flush=True)
        vllm = build_vllm(args.vllm_source, Path(build_root))
    timer = make_timer(device)
    print(f"{torch.cuda.get_device_name()}: torch {torch.__version__}; {timer.description}; us, fastest of "
          f"{rounds} interleaved round(s); vLLM source sha256 {source_sha256}")
    print(f"{'case':<14}{'dtype':<6}{'ours':>8}{'vllm':>8}{'vllm_kernel':>13}{'sum':>8}{'vllm/ours':>11}"
          f"{'xSum':>7}  selections")
    rows = []
    differing = 0
    for dtype_name in dtype_names:
        dtype = DTYPES[dtype_name]
        for n_rows, n, k in cases:
            torch.manual_seed(0)
            x = torch.randn(n_rows, n, device=device, dtype=dtype) * 3
            fns = case_calls(torch, softmax_ops, vllm, x, k)
            fns["vllm"]()
            torch.cuda.synchronize()
            check, agree = agreement(fns["ours"](), fns.vllm_outputs)
            differing += not agree
            best = {name: float("inf") for name in fns}
            for _ in range(rounds):
                for name, fn in fns.items():
                    best[name] = min(best[name], 1000.0 * timer(fn))
            kernel_us = best.get("vllm_kernel", float("nan"))
            print(f"{f'{n_rows}x{n}k{k}':<14}{dtype_name:<6}{best['ours']:8.2f}{best['vllm']:8.2f}{kernel_us:13.2f}"
                  f"{best['sum']:8.2f}{best['vllm'] / best['ours']:10.2f}x{best['sum'] / best['ours']:7.2f}  {check}",
                  flush=True)
            for name, us in best.items():
                rows.append({"op": "fused_topk", "dtype": dtype_name, "shape": f"{n_rows}x{n}", "k": k, "impl": name,
                             "ms": us / 1000.0, "selections": check})
    if args.json:
        args.json.write_text(json.dumps({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                                         "timer": timer.description, "vllm_source": str(args.vllm_source),
                                         "vllm_source_sha256": source_sha256, "rows": rows}, indent=1))
    if differing:
        raise SystemExit(f"vllm_gating_probe.py: the selections differ on {differing} case(s) (marked DIFFERS)")


if __name__ == "__main__":
    main()
