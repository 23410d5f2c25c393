"""The demo's substitution table: what the compile pass rewrote, and which kernel each rewrite runs."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch

from softmax_ops._bench_impls import chosen_kernel
from softmax_ops._demo_model import DemoConfig


@dataclass(frozen=True)
class Substitution:
    """One rewrite made by the pass, as shown in the demo's table."""

    pattern: str
    node: str
    op: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    k: int
    kernel: str


def op_of_pattern(pattern: str) -> str:
    """The softmax_ops op that replaces a pattern of the compile pass (softmax_topk*, topk_softmax ->
    fused_topk)."""
    if "topk" in pattern:
        return "fused_topk"
    return "log_softmax" if pattern == "log_softmax" else "softmax"


def site_input(op: str, config: DemoConfig, dtype: torch.dtype) -> tuple[tuple[int, ...], torch.dtype]:
    """Shape and dtype of the value the op reads in the demo block (one site per op there): the attention
    scores, the router logits (read in the model dtype, softmax in fp32), the LM-head logits."""
    shapes = {
        "softmax": (config.heads, config.tokens, config.tokens),
        "fused_topk": (config.tokens, config.experts),
        "log_softmax": (config.tokens, config.vocab),
    }
    return shapes[op], dtype


def substitutions(rewritten: Iterable[object], config: DemoConfig, dtype: torch.dtype,
                  device: torch.device) -> list[Substitution]:
    """Table rows for the pass's ``compile_report().rewritten`` records (pattern, node, where)."""
    rows = []
    for record in rewritten:
        pattern = str(record.pattern)
        op = op_of_pattern(pattern)
        shape, site_dtype = site_input(op, config, dtype)
        k = config.top_k if op == "fused_topk" else 0
        where = getattr(record, "where", "")
        node = f"{record.node} ({where})" if where else str(record.node)
        kernel = chosen_kernel(op, shape, site_dtype, k, device)
        rows.append(Substitution(pattern, node, op, shape, site_dtype, k, kernel))
    return rows


def format_substitutions(rows: list[Substitution]) -> str:
    """A fixed-width table: pattern, node (source line), our op, input shape, dtype, kernel."""
    header = ("pattern", "node (source)", "softmax_ops op", "input shape", "dtype", "kernel")
    lines = [header]
    for row in rows:
        op = f"{row.op} (k={row.k})" if row.op == "fused_topk" else row.op
        lines.append((row.pattern, row.node, op, "x".join(map(str, row.shape)),
                      str(row.dtype).removeprefix("torch."), row.kernel))
    if not rows:
        lines.append(("(none)", "", "", "", "", ""))
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    text = ["  " + "  ".join(cell.ljust(width) for cell, width in zip(line, widths)).rstrip() for line in lines]
    text.insert(1, "  " + "  ".join("-" * width for width in widths))
    return "\n".join(text)
