"""Uses of a tensor that read only its shape, dtype, device and layout, never its values.

HF Transformers' Mixtral router (and many MoE layers written after it) builds its dense routing matrix as
``torch.zeros_like(probs).scatter_(1, top_k_index, top_k_weights)``: besides the topk, the softmax output
``probs`` has a second user, but one that needs a tensor of its shape, not its values. The compile pass
fuses such a softmax -> topk all the same, and points those users at the softmax's input instead, with the
output's dtype made explicit (read_metadata_from).

Recognised: ``torch.zeros_like / ones_like / empty_like / full_like(t, ...)`` and ``t.new_zeros / new_ones /
new_empty / new_full(...)``, with ``t`` as the first argument and nowhere else. (In Dynamo's graphs,
``t.shape`` and ``t.size(d)`` are already constants or SymInt inputs, never users of ``t``.)
"""

from __future__ import annotations

import torch
from torch.fx import Node
from torch.fx.node import map_arg

LIKE_FUNCTIONS = (torch.zeros_like, torch.ones_like, torch.empty_like, torch.full_like)
NEW_METHODS = ("new_zeros", "new_ones", "new_empty", "new_full")


def reads_only_metadata(user: Node, tensor: Node) -> bool:
    """Whether ``user`` is one of the calls above with ``tensor`` as its first argument and nowhere else."""
    recognised = (user.op == "call_function" and user.target in LIKE_FUNCTIONS) or (
        user.op == "call_method" and user.target in NEW_METHODS
    )
    if not recognised or not user.args or user.args[0] is not tensor:
        return False
    mentions: list[Node] = []
    map_arg((user.args[1:], user.kwargs), lambda node: mentions.append(node))
    return tensor not in mentions


def read_metadata_from(user: Node, source: Node, dtype: torch.dtype) -> None:
    """Makes ``user`` (reads_only_metadata) take its metadata from ``source``, a tensor of the same shape and
    device, as if from a contiguous tensor of ``dtype`` (a softmax output: torch allocates it contiguous
    whatever the input's strides, and of the softmax's result dtype).

    ``*_like`` calls get ``dtype`` unless they give one, and the contiguous format where they preserve the
    input's (the default); ``new_*`` calls take their size from their arguments and the dtype from ``self``,
    so they get ``dtype`` unless they give one.
    """
    kwargs = dict(user.kwargs)
    if kwargs.get("dtype") is None:
        kwargs["dtype"] = dtype
    if user.op == "call_function" and kwargs.get("memory_format") in (None, torch.preserve_format):
        kwargs["memory_format"] = torch.contiguous_format
    user.args = (source, *user.args[1:])
    user.kwargs = kwargs
