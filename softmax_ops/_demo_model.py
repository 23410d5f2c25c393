"""The demo's model: one MoE transformer block with an LM head, written the way model code is written.

It holds the three softmax sites softmax_ops targets, each in its usual form:
- attention: ``torch.softmax`` over the scores;
- the router, Mixtral-style: softmax in fp32, ``torch.topk``, renormalise with an in-place ``/=``;
- the LM head: ``torch.log_softmax`` over the vocabulary.
Nothing in it mentions softmax_ops: the compile pass has to find these sites on its own.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class DemoConfig:
    """Sizes of the demo block."""

    tokens: int = 256
    hidden: int = 128
    heads: int = 4
    experts: int = 8
    top_k: int = 2
    vocab: int = 4096
    seed: int = 0

    @property
    def ffn(self) -> int:
        return 2 * self.hidden

    def validate(self) -> None:
        """Raise ValueError naming the first inconsistent size."""
        for name in ("tokens", "hidden", "heads", "experts", "top_k", "vocab"):
            if getattr(self, name) <= 0:
                raise ValueError(f"--{name.replace('_', '-')} must be positive, got {getattr(self, name)}")
        if self.hidden % self.heads:
            raise ValueError(f"--hidden ({self.hidden}) must be a multiple of the head count ({self.heads})")
        if self.top_k > self.experts:
            raise ValueError(f"--top-k ({self.top_k}) must be at most --experts ({self.experts})")


class MoEBlock(nn.Module):
    """Pre-norm block: self-attention, a top-k routed mixture of experts, and an LM head.

    ``forward(x)`` takes ``(tokens, hidden)`` and returns ``(log_probs, router_logits, expert_indices)``; the
    router outputs let the demo tell a real mismatch from a near-tie that legitimately routes differently.
    """

    def __init__(self, config: DemoConfig) -> None:
        super().__init__()
        self.config = config
        hidden, ffn, experts = config.hidden, config.ffn, config.experts
        self.attention_norm = nn.LayerNorm(hidden)
        self.qkv = nn.Linear(hidden, 3 * hidden, bias=False)
        self.attention_out = nn.Linear(hidden, hidden, bias=False)
        self.moe_norm = nn.LayerNorm(hidden)
        self.gate = nn.Linear(hidden, experts, bias=False)
        self.expert_in = nn.Parameter(torch.randn(experts, hidden, ffn) / math.sqrt(hidden))
        self.expert_out = nn.Parameter(torch.randn(experts, ffn, hidden) / math.sqrt(ffn))
        self.final_norm = nn.LayerNorm(hidden)
        self.lm_head = nn.Linear(hidden, config.vocab, bias=False)

    def attention(self, x: torch.Tensor) -> torch.Tensor:
        tokens, hidden = x.shape
        heads = self.config.heads
        head_dim = hidden // heads
        q, k, v = self.qkv(x).view(tokens, 3, heads, head_dim).permute(1, 2, 0, 3).unbind(0)
        # The scale is folded into q (as most implementations do) so the softmax reads the matmul's output.
        scores = (q * head_dim**-0.5) @ k.transpose(-2, -1)
        probs = torch.softmax(scores, dim=-1)
        return self.attention_out((probs @ v).transpose(0, 1).reshape(tokens, hidden))

    def route(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        router_logits = self.gate(h)
        routing_weights = F.softmax(router_logits, dim=-1, dtype=torch.float)
        routing_weights, selected_experts = torch.topk(routing_weights, self.config.top_k, dim=-1)
        routing_weights /= routing_weights.sum(dim=-1, keepdim=True)
        return router_logits, routing_weights.to(h.dtype), selected_experts

    def experts(self, h: torch.Tensor, weights: torch.Tensor, selected: torch.Tensor) -> torch.Tensor:
        # Dense dispatch: every expert runs on every token and a (tokens, experts) matrix that is zero outside
        # the selected experts combines them. experts/top_k times the FLOPs of a gather, but static shapes keep
        # the whole block one graph (no data-dependent token lists, no graph break).
        combine = torch.zeros(h.shape[0], self.config.experts, dtype=h.dtype, device=h.device)
        combine = combine.scatter(1, selected, weights)
        inner = F.silu(torch.einsum("th,ehf->etf", h, self.expert_in))
        outer = torch.einsum("etf,efh->eth", inner, self.expert_out)
        return torch.einsum("te,eth->th", combine, outer)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        x = x + self.attention(self.attention_norm(x))
        h = self.moe_norm(x)
        router_logits, weights, selected = self.route(h)
        x = x + self.experts(h, weights, selected)
        log_probs = torch.log_softmax(self.lm_head(self.final_norm(x)), dim=-1)
        return log_probs, router_logits, selected


def build_model(config: DemoConfig, device: torch.device, dtype: torch.dtype) -> tuple[MoEBlock, torch.Tensor]:
    """The block with seeded random weights, in eval mode on ``device``/``dtype``, and a seeded input.

    Example:
        >>> import torch
        >>> model, x = build_model(DemoConfig(tokens=8, hidden=16, heads=2, experts=4, vocab=32),
        ...                        torch.device("cpu"), torch.float32)
        >>> [tuple(t.shape) for t in model(x)]
        [(8, 32), (8, 4), (8, 2)]
    """
    config.validate()
    torch.manual_seed(config.seed)
    model = MoEBlock(config).to(device=device, dtype=dtype).eval()
    generator = torch.Generator().manual_seed(config.seed + 1)
    x = torch.randn(config.tokens, config.hidden, generator=generator).to(device=device, dtype=dtype)
    return model, x
