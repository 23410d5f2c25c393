"""The torch.compile pass: the rewritten Dynamo graph of every pattern and call form (expecttest inline
expectations: run with EXPECTTEST_ACCEPT=1 to regenerate, then read the diff), numerics vs eager forward and
backward, candidates that must stay untouched, MoE/attention/LM-head blocks through Inductor, enable/disable,
the uuid and the caches, chaining with a user pass, and the report.

Most tests compile with `pass_backend`: Inductor's own pre-grad entry point (which runs whatever
`torch._inductor.config.pre_grad_custom_pass` holds, i.e. the installed pass) followed by AOTAutograd with
no-op compilers, so the rewritten graph runs op by op (our kernels, our autograd) without Inductor's C++ code
generation. The `inductor` tests run the real backend end to end.
"""

from __future__ import annotations

import math
import operator
import os

import pytest
import torch
import torch.nn.functional as F
from conftest import HAS_CUDA, assert_within_2x_torch, requires_cuda
from expecttest import assert_expected_inline
from functorch.compile import make_boxed_func
from torch import nn
from torch._dynamo.backends.common import aot_autograd
from torch._inductor.custom_graph_pass import CustomGraphPass
from torch._inductor.fx_passes.pre_grad import pre_grad_passes

import softmax_ops
from softmax_ops.compile_pass import SoftmaxOpsGraphPass

DEVICE = "cuda" if HAS_CUDA else "cpu"
NUMERIC_DTYPES = [torch.float32, torch.bfloat16]


def _boxed_nop(gm: torch.fx.GraphModule, example_inputs):
    return make_boxed_func(gm.forward)


_aot_eager = aot_autograd(fw_compiler=_boxed_nop, bw_compiler=_boxed_nop)


def pass_backend(gm: torch.fx.GraphModule, example_inputs):
    """Inductor's pre-grad passes (ours included, via the config), then AOTAutograd running it eagerly."""
    return _aot_eager(pre_grad_passes(gm, example_inputs), example_inputs)


@pytest.fixture(autouse=True)
def compile_pass_enabled_on_cpu(monkeypatch, torch_config):
    """Every test starts with the pass enabled on CPU and CUDA graphs, fresh Dynamo state and an empty
    report; the pass's state and the inductor config are put back afterwards."""
    was_enabled = softmax_ops.is_enabled()
    config = torch._inductor.config
    torch_config(config, "pre_grad_custom_pass", config.pre_grad_custom_pass)  # restored at teardown
    monkeypatch.setenv("SOFTMAX_OPS_DEVICES", "cuda,cpu")
    softmax_ops.enable()
    torch._dynamo.reset()
    softmax_ops.reset_compile_report()
    yield
    if was_enabled:
        softmax_ops.enable()
    else:
        softmax_ops.disable()
    torch._dynamo.reset()


def rewritten_graph(fn, *args, dynamic: bool = False) -> str:
    """Compile ``fn`` with the pass, run it once, and return the one graph the pass recorded."""
    torch.compile(fn, backend=pass_backend, fullgraph=True, dynamic=dynamic)(*args)
    graphs = softmax_ops.compile_report().graphs
    assert len(graphs) == 1, graphs
    return graphs[0]


def skip_reasons() -> list[tuple[str, str]]:
    return [(s.pattern, s.reason) for s in softmax_ops.compile_report().skipped]


def logits(*shape, dtype=torch.float32, seed=0, device=DEVICE):
    """Random logits whose entries are distinct in every row even in bfloat16 (a permutation times 0.5), so
    top-k indices have no ties and compare exactly."""
    generator = torch.Generator().manual_seed(seed)
    n = shape[-1]
    rows = math.prod(shape[:-1])
    perm = torch.stack([torch.randperm(n, generator=generator) for _ in range(rows)]).reshape(shape)
    return ((perm.double() - n / 2) * 0.5).to(dtype).to(device)


# ---- rewritten graphs: every pattern, every call form ------------------------------------------------------


class Block(nn.Module):
    """nn.Softmax / nn.LogSoftmax, which Dynamo inlines into F.softmax(..., _stacklevel=5)."""

    def __init__(self) -> None:
        super().__init__()
        self.softmax = nn.Softmax(dim=-1)
        self.log_softmax = nn.LogSoftmax(1)

    def forward(self, x):
        return self.softmax(x), self.log_softmax(x)


def test_graph_softmax_call_forms():
    def fn(x):
        return (
            F.softmax(x, dim=1, dtype=torch.float64),
            torch.softmax(x, -1),
            torch.softmax(x, 0, torch.float16),
            x.softmax(-1),
            x.softmax(dim=0, dtype=torch.bfloat16),
            torch.special.softmax(x, 1),
            torch.ops.aten.softmax.int(x, 1),
            torch.softmax(x, 0, dtype=float),  # Python's float: float64, as torch reads it
        )

    assert_expected_inline(
        rewritten_graph(fn, logits(4, 8)),
        """\
inputs: l_x_
softmax_default = softmax_ops.softmax.default(l_x_, 1, torch.float64)
softmax_default_1 = softmax_ops.softmax.default(l_x_, -1, None)
softmax_default_2 = softmax_ops.softmax.default(l_x_, 0, torch.float16)
softmax_default_3 = softmax_ops.softmax.default(l_x_, -1, None)
softmax_default_4 = softmax_ops.softmax.default(l_x_, 0, torch.bfloat16)
softmax_default_5 = softmax_ops.softmax.default(l_x_, 1, None)
softmax_default_6 = softmax_ops.softmax.default(l_x_, 1, None)
softmax_default_7 = softmax_ops.softmax.default(l_x_, 0, torch.float64)
return (softmax_default, softmax_default_1, softmax_default_2, softmax_default_3, softmax_default_4, softmax_default_5, softmax_default_6, softmax_default_7)""",
    )


def test_graph_log_softmax_call_forms():
    def fn(x):
        return (
            F.log_softmax(x, 1, _stacklevel=5),
            torch.nn.functional.log_softmax(x, dim=-1, dtype=torch.float64),
            torch.log_softmax(x, 0),
            x.log_softmax(dim=1),
            torch.special.log_softmax(x, -1),
        )

    assert_expected_inline(
        rewritten_graph(fn, logits(4, 8)),
        """\
inputs: l_x_
log_softmax_default = softmax_ops.log_softmax.default(l_x_, 1, None)
log_softmax_default_1 = softmax_ops.log_softmax.default(l_x_, -1, torch.float64)
log_softmax_default_2 = softmax_ops.log_softmax.default(l_x_, 0, None)
log_softmax_default_3 = softmax_ops.log_softmax.default(l_x_, 1, None)
log_softmax_default_4 = softmax_ops.log_softmax.default(l_x_, -1, None)
return (log_softmax_default, log_softmax_default_1, log_softmax_default_2, log_softmax_default_3, log_softmax_default_4)""",
    )


def test_graph_nn_modules_inlined():
    assert_expected_inline(
        rewritten_graph(Block(), logits(4, 8)),
        """\
inputs: l_x_
softmax_default = softmax_ops.softmax.default(l_x_, -1, None)
log_softmax_default = softmax_ops.log_softmax.default(l_x_, 1, None)
return (softmax_default, log_softmax_default)""",
    )


def test_graph_softmax_topk_function_form():
    def fn(x):
        return torch.topk(F.softmax(x, dim=-1), 3, dim=-1)

    assert_expected_inline(
        rewritten_graph(fn, logits(4, 8)),
        """\
inputs: l_x_
fused_topk_default = softmax_ops.fused_topk.default(l_x_, 3, -1, False, None)
getitem = fused_topk_default[0]
getitem_1 = fused_topk_default[1]
return (getitem, getitem_1)""",
    )


def test_graph_softmax_topk_method_form_and_named_fields():
    def fn(x):
        top = x.softmax(1).topk(2)
        return top.values, top.indices

    assert_expected_inline(
        rewritten_graph(fn, logits(4, 8)),
        """\
inputs: l_x_
fused_topk_default = softmax_ops.fused_topk.default(l_x_, 2, 1, False, None)
getitem = fused_topk_default[0]
getitem_1 = fused_topk_default[1]
return (getitem, getitem_1)""",
    )


def test_graph_softmax_topk_keywords_and_dtype():
    def fn(x):
        p = torch.softmax(x, dim=1, dtype=torch.float32)
        return torch.topk(p, k=2, dim=-1, largest=True, sorted=True)

    assert_expected_inline(
        rewritten_graph(fn, logits(4, 8, dtype=torch.bfloat16)),
        """\
inputs: l_x_
fused_topk_default = softmax_ops.fused_topk.default(l_x_, 2, 1, False, torch.float32)
getitem = fused_topk_default[0]
getitem_1 = fused_topk_default[1]
return (getitem, getitem_1)""",
    )


def test_graph_softmax_topk_indices_only():
    def fn(x):
        _, selected = torch.topk(F.softmax(x, dim=-1), 2)
        return selected

    assert_expected_inline(
        rewritten_graph(fn, logits(4, 8)),
        """\
inputs: l_x_
fused_topk_default = softmax_ops.fused_topk.default(l_x_, 2, -1, False, None)
selected = fused_topk_default[1]
return (selected,)""",
    )


def test_graph_softmax_topk_renorm_in_place():
    def fn(x):
        weights = F.softmax(x, dim=1, dtype=torch.float)
        weights, selected = torch.topk(weights, 2, dim=-1)
        weights /= weights.sum(dim=-1, keepdim=True)
        return weights, selected

    assert_expected_inline(
        rewritten_graph(fn, logits(4, 8)),
        """\
inputs: l_x_
fused_topk_default = softmax_ops.fused_topk.default(l_x_, 2, 1, True, torch.float32)
weights_1 = fused_topk_default[0]
selected = fused_topk_default[1]
return (weights_1, selected)""",
    )


def test_graph_softmax_topk_renorm_out_of_place():
    def fn(x):
        values, selected = x.softmax(-1).topk(3)
        return values / values.sum(-1, keepdim=True), selected

    assert_expected_inline(
        rewritten_graph(fn, logits(4, 8)),
        """\
inputs: l_x_
fused_topk_default = softmax_ops.fused_topk.default(l_x_, 3, -1, True, None)
values = fused_topk_default[0]
selected = fused_topk_default[1]
return (values, selected)""",
    )


def test_graph_softmax_topk_renorm_torch_div():
    def fn(x):
        values, selected = torch.topk(torch.softmax(x, 1), 2, 1)
        return torch.div(values, torch.sum(values, dim=(1,), keepdim=True)), selected

    assert_expected_inline(
        rewritten_graph(fn, logits(4, 8)),
        """\
inputs: l_x_
fused_topk_default = softmax_ops.fused_topk.default(l_x_, 2, 1, True, None)
values = fused_topk_default[0]
selected = fused_topk_default[1]
return (values, selected)""",
    )


def test_graph_topk_then_softmax_method_form():
    def fn(x):
        values, selected = x.topk(2)
        return values.softmax(-1), selected

    assert_expected_inline(
        rewritten_graph(fn, logits(4, 8)),
        """\
inputs: l_x_
fused_topk_default = softmax_ops.fused_topk.default(l_x_, 2, -1, True, None)
values = fused_topk_default[0]
selected = fused_topk_default[1]
return (values, selected)""",
    )


def test_graph_topk_then_softmax_mistral_form():
    def fn(x):
        weights, selected = torch.topk(x, 2)
        return F.softmax(weights, dim=1, dtype=torch.float).to(x.dtype), selected

    assert_expected_inline(
        rewritten_graph(fn, logits(4, 8, dtype=torch.bfloat16)),
        """\
inputs: l_x_
fused_topk_default = softmax_ops.fused_topk.default(l_x_, 2, -1, True, torch.float32)
weights = fused_topk_default[0]
selected = fused_topk_default[1]
to = weights.to(torch.bfloat16)
return (to, selected)""",
    )


def test_graph_dynamic_shapes():
    def fn(x):
        weights, selected = torch.topk(F.softmax(x, dim=-1, dtype=torch.float), 2, dim=-1)
        return weights / weights.sum(dim=-1, keepdim=True), selected

    x = logits(4, 8)
    torch._dynamo.mark_dynamic(x, 0)
    assert_expected_inline(
        rewritten_graph(fn, x),
        """\
inputs: s77, l_x_
fused_topk_default = softmax_ops.fused_topk.default(l_x_, 2, -1, True, torch.float32)
weights = fused_topk_default[0]
selected = fused_topk_default[1]
return (weights, selected)""",
    )


# ---- candidates that must stay untouched -------------------------------------------------------------------


def test_untouched_softmax_over_other_dim_than_topk():
    def fn(x):
        return torch.topk(F.softmax(x, dim=0), 2, dim=1)

    assert_expected_inline(
        rewritten_graph(fn, logits(4, 8)),
        """\
inputs: l_x_
softmax_default = softmax_ops.softmax.default(l_x_, 0, None)
topk = torch.topk(softmax_default, 2, dim=1)
getitem = topk[0]
getitem_1 = topk[1]
return (getitem, getitem_1)""",
    )
    assert skip_reasons() == [("softmax_topk", "topk over dim 1, softmax over dim 0")]


def test_untouched_topk_largest_false():
    def fn(x):
        return torch.topk(x.softmax(-1), 2, largest=False)

    assert_expected_inline(
        rewritten_graph(fn, logits(4, 8)),
        """\
inputs: l_x_
softmax_default = softmax_ops.softmax.default(l_x_, -1, None)
topk = torch.topk(softmax_default, 2, largest=False)
getitem = topk[0]
getitem_1 = topk[1]
return (getitem, getitem_1)""",
    )
    assert skip_reasons() == [("softmax_topk", "topk largest=False")]


def test_untouched_topk_sorted_false():
    def fn(x):
        return x.softmax(-1).topk(2, sorted=False)

    rewritten_graph(fn, logits(4, 8))
    assert skip_reasons() == [("softmax_topk", "topk sorted=False")]


def test_untouched_probabilities_used_elsewhere():
    def fn(x):
        p = x.softmax(-1)
        return torch.topk(p, 2), p  # a graph output: the softmax alone is still rewritten (_fusion.py)

    assert_expected_inline(
        rewritten_graph(fn, logits(4, 8)),
        """\
inputs: l_x_
softmax_default = softmax_ops.softmax.default(l_x_, -1, None)
topk = torch.topk(softmax_default, 2)
getitem = topk[0]
getitem_1 = topk[1]
return (getitem, getitem_1, softmax_default)""",
    )
    assert skip_reasons() == [("softmax_topk", "softmax output also used elsewhere")]


def test_graph_softmax_topk_whose_probabilities_also_give_a_shape():
    """HF Mixtral's zeros_like(probs).scatter_(...) reads only the probabilities' shape: the pattern is fused
    and zeros_like takes the logits, with the probabilities' dtype and (contiguous) layout made explicit."""
    assert_expected_inline(
        rewritten_graph(mixtral_dense_router, logits(4, 8, dtype=torch.bfloat16)),
        """\
inputs: l_x_
fused_topk_default = softmax_ops.fused_topk.default(l_x_, 2, -1, True, torch.float32)
top_weights = fused_topk_default[0]
selected = fused_topk_default[1]
zeros_like = torch.zeros_like(l_x_, dtype=torch.float32, memory_format=torch.contiguous_format)
scatter_ = zeros_like.scatter_(1, selected, top_weights)
return (scatter_, selected)""",
    )
    assert skip_reasons() == []


def shape_only_uses(x):
    """Every call that reads only the probabilities' metadata, with and without their own dtype / layout."""
    p = torch.softmax(x, -1, dtype=torch.float32)
    values, selected = torch.topk(p, 2)
    return (values, selected, torch.zeros_like(p), torch.ones_like(p, dtype=torch.float64), torch.empty_like(p),
            torch.full_like(p, 2.5, memory_format=torch.preserve_format), p.new_zeros(3), p.new_ones((2, 2)),
            p.new_empty(4), p.new_full((5,), 7, dtype=torch.int32))


@pytest.mark.parametrize("layout", ["contiguous", "transposed", "offset"])
def test_shape_only_users_of_fused_probabilities_match_eager(layout):
    x = logits(6, 8, dtype=torch.bfloat16, seed=5)
    if layout == "transposed":  # column-major storage, the same rows
        x = x.t().contiguous().t()
    elif layout == "offset":  # starts one element into its buffer
        x = torch.empty(49, dtype=x.dtype, device=x.device)[1:].view(6, 8).copy_(x)
    outs = torch.compile(shape_only_uses, backend=pass_backend, fullgraph=True)(x)
    assert softmax_ops.compile_report().rewrites["softmax_topk"] == 1 and skip_reasons() == []
    for index, (ours, theirs) in enumerate(zip(outs, shape_only_uses(x))):
        assert (ours.shape, ours.dtype, ours.device, ours.requires_grad) == (
            theirs.shape, theirs.dtype, theirs.device, theirs.requires_grad), index
        assert ours.stride() == theirs.stride(), index
        if index == 0:  # the top-k probabilities: fused_topk's own rounding
            torch.testing.assert_close(ours, theirs)
        elif index not in (4, 8):  # empty_like / new_empty: values unspecified
            torch.testing.assert_close(ours, theirs, rtol=0, atol=0)


@pytest.mark.parametrize("other_use", [
    lambda p: torch.zeros_like(p) + p,             # zeros_like itself is fine, the add reads the values
    lambda p: torch.full_like(p, 0).add_(p),
    lambda p: p.new_zeros(p.shape[0]).index_add_(0, torch.arange(2, device=p.device), p[:2, 0]),
])
def test_untouched_when_probabilities_are_also_read(other_use):
    def fn(x):
        p = x.softmax(-1)
        return torch.topk(p, 2), other_use(p)

    torch.compile(fn, backend=pass_backend, fullgraph=True)(logits(4, 8))
    # The softmax alone is then left to inductor where the other reader is elementwise (an add: _fusion.py).
    assert skip_reasons()[0] == ("softmax_topk", "softmax output also used elsewhere")
    assert [pattern for pattern, reason in skip_reasons()[1:] if "left to inductor" in reason] in ([], ["softmax"])


@pytest.mark.parametrize("change", [
    lambda x: x.t_(), lambda x: x.unsqueeze_(0), lambda x: x.transpose_(0, 1), lambda x: x.mul_(2),
])
def test_untouched_shape_readers_after_an_in_place_op_on_the_logits(change):
    """zeros_like(p) would read the logits' shape after x.t_() changed it: (8, 4) or an out-of-range
    scatter instead of eager's (4, 8). Refused with or without gradients (found by review, session 24)."""
    def fn(x):
        x = x * 1  # an intermediate: an in-place view op on a graph input breaks the graph
        p = torch.softmax(x, -1)
        values, selected = torch.topk(p, 2, -1)
        change(x)
        return torch.zeros_like(p), values, selected

    x = logits(4, 8)
    with torch.no_grad():
        outs = torch.compile(fn, backend=pass_backend, fullgraph=True)(x)
    for ours, theirs in zip(outs, fn(x)):
        assert ours.shape == theirs.shape and ours.stride() == theirs.stride()
        torch.testing.assert_close(ours, theirs)
    ((pattern, reason),) = skip_reasons()
    assert pattern == "softmax_topk" and "changes the logits in place" in reason, reason


def test_untouched_renorm_over_other_dim():
    def fn(x):
        values, selected = torch.topk(x.softmax(-1), 2)
        return values / values.sum(dim=0, keepdim=True), selected

    assert_expected_inline(
        rewritten_graph(fn, logits(4, 8)),
        """\
inputs: l_x_
fused_topk_default = softmax_ops.fused_topk.default(l_x_, 2, -1, False, None)
values = fused_topk_default[0]
selected = fused_topk_default[1]
sum_1 = values.sum(dim=0, keepdim=True)
truediv = operator.truediv(values, sum_1)
return (truediv, selected)""",
    )
    assert skip_reasons() == [("softmax_topk_renorm", "renormalisation over dim 0, topk over dim 1")]


def test_untouched_renorm_without_keepdim():
    def fn(x):
        values, selected = torch.topk(x.softmax(-1), 2)
        return values / values.sum(-1), selected

    rewritten_graph(fn, logits(2, 8))
    assert skip_reasons() == [("softmax_topk_renorm", "sum without keepdim=True")]


def test_untouched_renorm_when_values_used_elsewhere():
    def fn(x):
        values, selected = torch.topk(x.softmax(-1), 2)
        return values / values.sum(-1, keepdim=True), values.max(), selected

    rewritten_graph(fn, logits(4, 8))
    assert skip_reasons() == [("softmax_topk_renorm", "topk values also used elsewhere")]
    assert softmax_ops.compile_report().rewrites["softmax_topk"] == 1


def test_untouched_unsupported_dtype():
    def fn(x):
        return torch.softmax(x, -1, dtype=torch.float32)

    assert_expected_inline(
        rewritten_graph(fn, torch.arange(8, device=DEVICE).reshape(2, 4)),
        """\
inputs: l_x_
softmax = torch.softmax(l_x_, -1, dtype=torch.float32)
return (softmax,)""",
    )
    assert skip_reasons() == [("softmax", "softmax of unsupported dtype torch.int64")]


def test_untouched_cpu_graph_when_cpu_not_enabled(monkeypatch):
    monkeypatch.setenv("SOFTMAX_OPS_DEVICES", "cuda")

    def fn(x):
        return torch.topk(x.softmax(-1), 2), x.log_softmax(0)

    assert_expected_inline(
        rewritten_graph(fn, logits(4, 8, device="cpu")),
        """\
inputs: l_x_
softmax = l_x_.softmax(-1)
topk = torch.topk(softmax, 2)
getitem = topk[0]
getitem_1 = topk[1]
log_softmax = l_x_.log_softmax(0)
return (getitem, getitem_1, log_softmax)""",
    )
    assert skip_reasons() == [
        ("softmax_topk", "softmax on cpu not in SOFTMAX_OPS_DEVICES (cuda)"),
        ("log_softmax", "log_softmax on cpu not in SOFTMAX_OPS_DEVICES (cuda)"),
    ]


def test_untouched_device_the_extension_has_no_kernels_for(monkeypatch):
    """A CPU-only build (torch with CUDA, no nvcc) must leave CUDA graphs alone, or the compiled model fails
    at run time. Simulated on CPU: has_kernels answers as such a build would for a device without kernels.
    (Fake tensors of a real kernel-less device such as XPU initialise that backend on some torch builds.)"""
    from softmax_ops import _rewrite

    assert _rewrite.has_kernels("cpu")  # every build has CPU kernels: the real lookup, for contrast
    monkeypatch.setattr(_rewrite, "has_kernels", lambda device: False)
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    x.meta["example_value"] = torch.empty(4, 8)
    p = graph.call_method("softmax", (x, -1))
    p.meta["example_value"] = torch.empty(4, 8)
    graph.output((p,))
    outcome = _rewrite.rewrite_graph(graph, ["cpu"])
    assert outcome.counts() == {}
    assert [s.reason for s in outcome.skipped] == [
        "softmax on cpu: the softmax_ops extension was built without cpu kernels"
    ]


def test_uuid_tracks_which_devices_have_kernels(monkeypatch):
    from softmax_ops import compile_pass

    ours = torch._inductor.config.pre_grad_custom_pass
    with_kernels = ours.uuid()
    monkeypatch.setattr(compile_pass, "has_kernels", lambda device: device == "cpu")  # a CPU-only build
    assert ours.uuid() != with_kernels


def test_untouched_symbolic_k():
    def fn(x):
        return torch.topk(x.softmax(-1), x.shape[-1] // 2)

    rewritten_graph(fn, logits(4, 8), dynamic=True)
    assert skip_reasons() == [
        ("softmax_topk", "topk k is symbolic (fused_topk takes a static int; it would recompile per k)")
    ]
    assert softmax_ops.compile_report().rewrites["softmax"] == 1


def test_untouched_log_softmax_into_topk_and_topk_into_log_softmax():
    def fn(x):
        values, _ = x.topk(2)
        return torch.topk(x.log_softmax(-1), 2), values.log_softmax(-1)

    rewritten_graph(fn, logits(4, 8))
    assert skip_reasons() == [
        ("topk_softmax", "log_softmax over topk values (no fused log form)"),
        ("softmax_topk", "log_softmax feeds topk (no fused log form)"),
    ]
    assert softmax_ops.compile_report().rewrites["log_softmax"] == 2


def test_untouched_topk_then_softmax_over_other_dim():
    def fn(x):
        values, selected = x.topk(2, dim=1)
        return values.softmax(0), selected

    rewritten_graph(fn, logits(4, 8))
    assert skip_reasons() == [("topk_softmax", "topk over dim 1, softmax over dim 0")]


def test_untouched_across_grad_mode_change():
    def fn(x):
        p = x.softmax(-1)
        with torch.no_grad():
            values, selected = p.topk(2)
        logit_values, _ = x.topk(2)
        with torch.no_grad():
            weights = logit_values.softmax(-1)
        return values, selected, weights

    x = logits(4, 8).requires_grad_()
    outs = torch.compile(fn, backend=pass_backend, fullgraph=True)(x)
    assert skip_reasons() == [
        ("softmax_topk", "grad mode changes between softmax and topk"),
        ("topk_softmax", "grad mode changes between topk and softmax"),
    ]
    for ours, theirs in zip(outs, fn(x)):
        assert ours.requires_grad == theirs.requires_grad
        torch.testing.assert_close(ours, theirs)


def test_untouched_topk_softmax_whose_dtype_narrows_the_logits():
    """torch.topk ranks the float32 logits, which differ; fused_topk with dtype=float16 would rank them after
    the cast, where they tie (and pick index 0 instead of 1)."""

    def fn(x):
        values, selected = torch.topk(x, 1)
        return torch.softmax(values, -1, dtype=torch.float16), selected

    x = torch.tensor([[1.0001, 1.0002, 0.0, -1.0]], device=DEVICE)
    outs = torch.compile(fn, backend=pass_backend, fullgraph=True)(x)
    assert skip_reasons() == [
        ("topk_softmax", ("softmax dtype=torch.float16 of torch.float32 topk values: topk ranked the torch.float32 "
                         "logits, fused_topk would rank them after the cast"))
    ]
    for ours, theirs in zip(outs, fn(x)):
        torch.testing.assert_close(ours, theirs, rtol=0, atol=0)


def test_topk_softmax_whose_dtype_widens_the_logits_is_fused():
    def fn(x):
        values, selected = torch.topk(x, 2)
        return torch.softmax(values, -1, dtype=torch.float32), selected

    x = logits(4, 8, dtype=torch.bfloat16)
    outs = torch.compile(fn, backend=pass_backend, fullgraph=True)(x)
    assert softmax_ops.compile_report().rewrites["topk_softmax"] == 1
    for ours, theirs in zip(outs, fn(x)):
        torch.testing.assert_close(ours, theirs)


def router_mutating_values(x):
    weights, selected = x.softmax(-1).topk(2)
    weights /= weights.sum(-1, keepdim=True) + 1e-20  # the epsilon keeps it from fusing as a renormalisation
    weights.mul_(2.5)
    return weights, selected


def logits_written_by(write):
    """A router whose logits ``write`` modifies in place after both top-k patterns read them."""

    def router(x):
        h = x * 2
        weights, selected = torch.topk(torch.softmax(h, -1), 2)
        top_logits, chosen = h.topk(3)
        probabilities = top_logits.softmax(-1)
        write(h)
        return weights, probabilities, selected, chosen, h

    return router


LOGIT_WRITES = {
    "method": lambda h: h.add_(1),
    "through_a_view": lambda h: h.view(-1).__setitem__(0, 5.0),
    "dunder": lambda h: h.__imul__(3),
    "data": lambda h: h.data.mul_(2),  # bumps no version counter: gradients would be silently wrong
    "inplace_by_position": lambda h: F.leaky_relu(h, 0.1, True),
    "aten_overload": lambda h: torch.ops.aten.add_.Tensor(h, torch.ones_like(h)),
    "foreach": lambda h: torch._foreach_mul_([h], 2.0),
    "to_same_dtype": lambda h: h.to(torch.float32).sub_(1),
}


@pytest.mark.parametrize("write", list(LOGIT_WRITES))
def test_untouched_topk_patterns_whose_logits_a_training_graph_writes_in_place(write):
    """fused_topk saves the logits for its backward, where torch's softmax saves its output: an in-place write
    into the logits after the pattern is legal in eager and must stay legal compiled (autograd would refuse
    the fused op's backward, or, through .data, silently use the new logits)."""
    fn = logits_written_by(LOGIT_WRITES[write])
    x = logits(4, 8).requires_grad_()
    outs = torch.compile(fn, backend=pass_backend, fullgraph=True)(x)
    (grad,) = torch.autograd.grad(outs[0].sum() + outs[1].square().sum(), x)
    reasons = [reason for _, reason in skip_reasons()]
    assert len(reasons) == 2 and all("writes in place into the logits" in r for r in reasons), reasons
    x_eager = x.detach().clone().requires_grad_()
    eager_outs = fn(x_eager)
    (eager_grad,) = torch.autograd.grad(eager_outs[0].sum() + eager_outs[1].square().sum(), x_eager)
    for ours, theirs in zip(outs, eager_outs):
        torch.testing.assert_close(ours, theirs)
    torch.testing.assert_close(grad, eager_grad)


def test_in_place_writes_into_the_values_keep_the_fusion_in_training():
    """fused_topk saves a copy of its values, so writing into them (in the graph or by the caller) is fine."""
    x = logits(4, 8).requires_grad_()
    compiled = torch.compile(router_mutating_values, backend=pass_backend, fullgraph=True)
    weights, _ = compiled(x)
    assert softmax_ops.compile_report().rewrites["softmax_topk"] == 1
    weights.mul_(0.5)  # the caller scales the returned weights in place
    (grad,) = torch.autograd.grad(weights.square().sum(), x)
    x_eager = x.detach().clone().requires_grad_()
    eager_weights, _ = router_mutating_values(x_eager)
    eager_weights.mul_(0.5)
    (eager_grad,) = torch.autograd.grad(eager_weights.square().sum(), x_eager)
    torch.testing.assert_close(weights, eager_weights)
    torch.testing.assert_close(grad, eager_grad)


def test_in_place_writes_before_the_pattern_or_into_other_tensors_do_not_block_fusion():
    def fn(x):
        h = x * 2
        h.add_(1)  # before the pattern: the fused op reads h after it, as softmax did
        weights, selected = torch.topk(torch.softmax(h, -1), 2)
        shifted = h.clone()
        shifted[:, 0] = 0.0  # a copy of the logits, not a view
        expert = selected * 1
        expert += 3  # a tensor computed from the indices
        return weights, expert, shifted

    x = logits(4, 8).requires_grad_()
    outs = torch.compile(fn, backend=pass_backend, fullgraph=True)(x)
    assert softmax_ops.compile_report().rewrites["softmax_topk"] == 1
    (grad,) = torch.autograd.grad(outs[0].sum() + (outs[0] * outs[0]).sum(), x)
    x_eager = x.detach().clone().requires_grad_()
    eager_outs = fn(x_eager)
    (eager_grad,) = torch.autograd.grad(eager_outs[0].sum() + (eager_outs[0] * eager_outs[0]).sum(), x_eager)
    assert torch.equal(outs[1], eager_outs[1])
    torch.testing.assert_close(grad, eager_grad)


def test_in_place_writes_do_not_block_fusion_without_gradients():
    rewritten_graph(router_mutating_values, logits(4, 8))
    assert softmax_ops.compile_report().rewrites["softmax_topk"] == 1


def test_renormalisation_in_place_is_fused_in_training():
    """The in-place `/=` of a fused renormalisation disappears with it: it is not a later write."""
    x = logits(4, 8).requires_grad_()
    outs = torch.compile(mixtral_router, backend=pass_backend, fullgraph=True)(x)
    assert softmax_ops.compile_report().rewrites["softmax_topk_renorm"] == 1
    (grad,) = torch.autograd.grad(outs[0].sum() + (outs[0] * outs[0]).sum(), x)
    x_eager = x.detach().clone().requires_grad_()
    eager_outs = mixtral_router(x_eager)
    (eager_grad,) = torch.autograd.grad(eager_outs[0].sum() + (eager_outs[0] * eager_outs[0]).sum(), x_eager)
    torch.testing.assert_close(grad, eager_grad)


def test_untouched_graphs_with_func_transforms_or_forward_ad():
    """Our ops have no forward-AD or batching rules: a rewrite inside torch.func.grad failed to compile, and one
    inside a dual-level region silently dropped the tangent."""
    import torch.autograd.forward_ad as fwAD

    def gradient(x):
        return torch.func.grad(lambda r: r.softmax(-1)[..., 0].sum())(x)

    def tangent(x, t):
        with fwAD.dual_level():
            return fwAD.unpack_dual(fwAD.make_dual(x, t).softmax(-1)).tangent

    x, t = logits(4, 8), logits(4, 8, seed=1)
    torch.testing.assert_close(torch.compile(gradient, backend=pass_backend)(x), gradient(x))
    torch._dynamo.reset()
    torch.testing.assert_close(torch.compile(tangent, backend=pass_backend)(x, t), tangent(x, t))
    report = softmax_ops.compile_report()
    assert sum(report.rewrites.values()) == 0
    reasons = [reason for _, reason in skip_reasons()]
    assert len(reasons) == 2 and all("torch.func transform or forward-mode AD" in r for r in reasons), reasons


def test_untouched_implicit_dim():
    def fn(x):
        return F.softmax(x, None)

    with pytest.warns(UserWarning, match="Implicit dimension"):
        rewritten_graph(fn, logits(4, 8))
    assert skip_reasons() == [("softmax", "softmax with dim=None (implicit dim, deprecated in torch)")]


# ---- numerics vs eager, forward and backward ---------------------------------------------------------------


def mixtral_router(x):
    weights = F.softmax(x, dim=1, dtype=torch.float)
    weights, selected = torch.topk(weights, 2, dim=-1)
    weights /= weights.sum(dim=-1, keepdim=True)
    return weights, selected


def qwen_router(x):
    weights = F.softmax(x, dim=1, dtype=torch.float)
    return torch.topk(weights, 3, dim=-1)


def mistral_router(x):
    weights, selected = torch.topk(x, 2)
    return F.softmax(weights, dim=1, dtype=torch.float).to(x.dtype), selected


def mixtral_dense_router(x):
    """HF Transformers' Mixtral router today: the renormalised top-k weights scattered into a dense routing matrix
    allocated with zeros_like of the probabilities."""
    weights = F.softmax(x.float(), dim=-1)
    top_weights, selected = torch.topk(weights, 2, dim=-1)
    top_weights /= top_weights.sum(dim=-1, keepdim=True)
    return torch.zeros_like(weights).scatter_(1, selected, top_weights), selected


def plain_softmax(x):
    return (x.softmax(-1),)


def plain_log_softmax(x):
    return (F.log_softmax(x, dim=0),)


# case -> (the pattern it rewrites, the function)
PATTERN_FUNCTIONS = {
    "softmax": ("softmax", plain_softmax),
    "log_softmax": ("log_softmax", plain_log_softmax),
    "softmax_topk": ("softmax_topk", qwen_router),
    "softmax_topk_renorm": ("softmax_topk_renorm", mixtral_router),
    "softmax_topk_renorm_dense": ("softmax_topk_renorm", mixtral_dense_router),
    "topk_softmax": ("topk_softmax", mistral_router),
}


@pytest.mark.parametrize("dtype", NUMERIC_DTYPES)
@pytest.mark.parametrize("case", list(PATTERN_FUNCTIONS))
def test_numerics_match_eager_forward_and_backward(case, dtype):
    pattern, fn = PATTERN_FUNCTIONS[case]
    x = logits(6, 16, dtype=dtype, seed=3).requires_grad_()
    compiled = torch.compile(fn, backend=pass_backend, fullgraph=True)

    outs, eager = compiled(x), fn(x)
    assert softmax_ops.compile_report().rewrites[pattern] == 1
    reference = fn(x.detach().double().requires_grad_())
    for ours, theirs, ref in zip(outs, eager, reference):
        assert ours.dtype == theirs.dtype and ours.shape == theirs.shape
        if ours.is_floating_point():
            assert_within_2x_torch(ours, theirs, ref)
        else:
            assert torch.equal(ours, theirs)

    generator = torch.Generator().manual_seed(4)
    upstream = torch.randn(outs[0].shape, generator=generator, dtype=torch.float64)
    (grad_ours,) = torch.autograd.grad((outs[0] * upstream.to(outs[0])).sum(), x)
    (grad_eager,) = torch.autograd.grad((eager[0] * upstream.to(eager[0])).sum(), x)
    x64 = x.detach().double().requires_grad_()
    (grad_ref,) = torch.autograd.grad((fn(x64)[0] * upstream.to(x64.device)).sum(), x64)
    assert_within_2x_torch(grad_ours, grad_eager, grad_ref)


def test_graph_breaks_rewrite_each_graph():
    def fn(x):
        p = x.softmax(-1)
        torch._dynamo.graph_break()
        values, selected = torch.topk(x, 2)
        return p, values.softmax(-1), selected

    x = logits(4, 8)
    outs = torch.compile(fn, backend=pass_backend)(x)
    report = softmax_ops.compile_report()
    assert len(report.graphs) == 2
    assert report.rewrites["softmax"] == 1 and report.rewrites["topk_softmax"] == 1
    for ours, theirs in zip(outs, fn(x)):
        torch.testing.assert_close(ours, theirs)


# ---- autocast: the replacement keeps the dtype autocast gave the softmax -----------------------------------


def _fake_graph(input_dtype, softmax_dtype, sum_dtype=None):
    """A hand-built pre-grad graph whose example values say what CUDA autocast does: softmax(x) of a half
    tensor comes out float32, and (optionally) a renormalising sum comes out in ``sum_dtype``."""
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    x.meta["example_value"] = torch.empty(4, 8, dtype=input_dtype)
    p = graph.call_method("softmax", (x, -1))
    p.meta["example_value"] = torch.empty(4, 8, dtype=softmax_dtype)
    if sum_dtype is None:
        graph.output((p,))
        return graph
    top = graph.call_function(torch.topk, (p, 2))
    top.meta["example_value"] = (torch.empty(4, 2, dtype=softmax_dtype), torch.empty(4, 2, dtype=torch.int64))
    values = graph.call_function(operator.getitem, (top, 0))
    values.meta["example_value"] = top.meta["example_value"][0]
    total = graph.call_method("sum", (values, -1), {"keepdim": True})
    total.meta["example_value"] = torch.empty(4, 1, dtype=sum_dtype)
    out = graph.call_function(operator.truediv, (values, total))
    out.meta["example_value"] = torch.empty(4, 2, dtype=torch.promote_types(softmax_dtype, sum_dtype))
    graph.output((out,))
    return graph


def test_autocast_dtype_becomes_explicit():
    from softmax_ops._compile_report import format_graph
    from softmax_ops._rewrite import rewrite_graph

    graph = _fake_graph(torch.float16, torch.float32)
    outcome = rewrite_graph(graph, ["cpu"])
    assert outcome.counts() == {"softmax": 1}
    assert_expected_inline(
        format_graph(graph),
        """\
inputs: x
softmax_default = softmax_ops.softmax.default(x, -1, torch.float32)
return (softmax_default,)""",
    )


def test_renorm_that_changes_dtype_is_not_fused():
    from softmax_ops._rewrite import rewrite_graph

    outcome = rewrite_graph(_fake_graph(torch.float16, torch.float32, torch.float64), ["cpu"])
    assert outcome.counts() == {"softmax_topk": 1}
    assert [s.reason for s in outcome.skipped] == [
        "renormalisation changes dtype torch.float32 -> torch.float64"
    ]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_topk_of_16_bit_probabilities_is_not_fused(dtype):
    # Distinct logits whose probabilities round to the same 16-bit value: torch.topk orders them its own way
    # (it promises no order among equal values), fused_topk by logit, so the selected indices would differ
    # (_rewrite.py, "Ties"). The topk, and the renormalisation, stay with torch.
    from softmax_ops._rewrite import rewrite_graph

    outcome = rewrite_graph(_fake_graph(dtype, dtype, dtype), ["cpu"])
    assert outcome.counts() == {"softmax": 1}  # the softmax alone still is ours; torch.topk ranks its values
    reason = (f"{dtype} probabilities: distinct logits often round to the same 16-bit value, which torch.topk "
              "orders its own way and fused_topk by logit")
    assert [(s.pattern, s.reason) for s in outcome.skipped] == [("softmax_topk", reason)]


def test_16_bit_probability_ties_that_the_pass_avoids():
    # The case behind the rule above, on the ops themselves: 0 and 0.001 (bfloat16) have probabilities that
    # round to the same bfloat16 value; torch.topk of them takes index 0 on CPU, fused_topk the larger logit.
    x = torch.tensor([[0.0, 0.001, -5.0]], dtype=torch.bfloat16)
    probabilities = torch.softmax(x, -1)
    assert probabilities[0, 0] == probabilities[0, 1]
    values, indices = softmax_ops.fused_topk(x, 1)
    assert values[0, 0] == probabilities[0, 0] and indices[0, 0] == 1


@requires_cuda
def test_cuda_autocast_matches_eager():
    """Under CUDA autocast softmax of a half tensor comes out float32; the rewrite must keep that."""

    def fn(x, w):
        scores = x @ w
        weights, selected = torch.topk(F.softmax(scores, dim=-1), 2)
        routed, chosen = torch.topk(scores, 2)
        return (
            scores.softmax(-1),
            weights / weights.sum(-1, keepdim=True),
            selected,
            routed.softmax(-1),
            chosen,
        )

    x, w = torch.randn(8, 16, device="cuda"), torch.randn(16, 8, device="cuda")
    with torch.autocast("cuda", dtype=torch.float16):
        outs = torch.compile(fn, backend=pass_backend, fullgraph=True)(x, w)
        eager = fn(x, w)
    report = softmax_ops.compile_report()
    assert (
        report.rewrites["softmax"],
        report.rewrites["softmax_topk_renorm"],
        report.rewrites["topk_softmax"],
    ) == (
        1,
        1,
        1,
    )
    for ours, theirs in zip(outs, eager):
        assert ours.dtype == theirs.dtype
        torch.testing.assert_close(ours, theirs, atol=2e-3, rtol=2e-3)


def test_untouched_tensor_subclass():
    from torch.testing._internal.two_tensor import TwoTensor

    def fn(x):
        return x.softmax(-1)

    x = logits(4, 8)
    rewritten_graph(fn, TwoTensor(x, x.clone()))
    assert skip_reasons() == [("softmax", "softmax on a TwoTensor")]


def test_disable_from_environment_at_import():
    import subprocess
    import sys
    from pathlib import Path

    code = (
        "import torch, softmax_ops; "
        "print(softmax_ops.is_enabled(), torch._inductor.config.pre_grad_custom_pass is None)"
    )
    package_root = str(Path(softmax_ops.__file__).resolve().parent.parent)
    env = {**os.environ, "SOFTMAX_OPS_DISABLE": "1", "PYTHONPATH": package_root}
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert result.stdout.split() == ["False", "True"]


# ---- model blocks through the real Inductor backend --------------------------------------------------------


class Attention(nn.Module):
    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.qkv = nn.Linear(hidden, 3 * hidden, bias=False)

    def forward(self, h):
        q, k, v = self.qkv(h).chunk(3, dim=-1)
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
        return F.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype) @ v


class MoE(nn.Module):
    """Dense-evaluated experts combined by a router written the way a given model family writes it."""

    def __init__(self, hidden: int, experts: int, router: str) -> None:
        super().__init__()
        self.gate = nn.Linear(hidden, experts, bias=False)
        self.experts = nn.Linear(hidden, experts * hidden, bias=False)
        self.router = router
        self.top_k = 2

    def route(self, router_logits):
        if self.router == "mixtral":  # HF Mixtral: softmax in float32, topk, renormalise in place
            weights = F.softmax(router_logits, dim=1, dtype=torch.float)
            weights, selected = torch.topk(weights, self.top_k, dim=-1)
            weights /= weights.sum(dim=-1, keepdim=True)
        elif self.router == "mixtral_dense":  # HF Mixtral today: the weights scattered into a routing matrix
            scores, selected = mixtral_dense_router(router_logits)
            weights = scores.gather(1, selected)
        elif self.router == "qwen":  # Qwen2-MoE with norm_topk_prob=False: no renormalisation
            weights = F.softmax(router_logits, dim=1, dtype=torch.float)
            weights, selected = torch.topk(weights, self.top_k, dim=-1)
        else:  # mistral-inference / Grok: top-k of the logits, softmax over the k selected
            weights, selected = torch.topk(router_logits, self.top_k)
            weights = F.softmax(weights, dim=1, dtype=torch.float)
        return weights.to(router_logits.dtype), selected

    def forward(self, h):
        tokens, hidden = h.shape
        weights, selected = self.route(self.gate(h))
        expert_out = self.experts(h).view(tokens, -1, hidden)
        chosen = expert_out.gather(1, selected.unsqueeze(-1).expand(-1, -1, hidden))
        return h + (chosen * weights.unsqueeze(-1)).sum(dim=1)


class TinyMoELM(nn.Module):
    def __init__(self, vocab: int = 32, hidden: int = 16, experts: int = 6) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, hidden)
        self.attention = Attention(hidden)
        routers = ("mixtral", "mixtral_dense", "qwen", "mistral")
        self.moe = nn.ModuleList(MoE(hidden, experts, router) for router in routers)
        self.lm_head = nn.Linear(hidden, vocab, bias=False)

    def forward(self, tokens, targets):
        h = self.embed(tokens)
        h = h + self.attention(h)
        for layer in self.moe:
            h = layer(h)
        log_probs = F.log_softmax(self.lm_head(h), dim=-1)
        return F.nll_loss(log_probs, targets)


def _grads(model, *inputs):
    model.zero_grad()
    loss = model(*inputs)
    loss.backward()
    return loss.detach(), [p.grad.clone() for p in model.parameters()]


@pytest.fixture
def no_compile_caches(torch_config):
    """Inductor's FX-graph and AOTAutograd caches off: a cache hit would skip the pass (and the report)."""
    torch_config(torch._inductor.config, "fx_graph_cache", False)
    torch_config(torch._functorch.config, "enable_autograd_cache", False)


def size_one_dim_router(x):
    weights, selected = torch.topk(torch.softmax(x, 1, dtype=torch.float32), 1, 1)
    return weights, selected, torch.log_softmax(x, 1) * 2


def test_size_one_non_last_dim_inductor_matches_eager(no_compile_caches):
    # Inductor checks an extern kernel's real strides against the fake ones (assert_size_stride): results of a
    # non-last dim of size 1 must have torch's strides there too (restore_dim_order).
    x = logits(4, 1, 6).requires_grad_(True)
    outs = torch.compile(size_one_dim_router, fullgraph=True)(x)
    assert softmax_ops.compile_report().rewrites["softmax_topk"] == 1
    for ours, theirs in zip(outs, size_one_dim_router(x)):
        assert ours.stride() == theirs.stride()
        torch.testing.assert_close(ours, theirs)


def test_moe_language_model_inductor_fullgraph_dynamic_training(no_compile_caches):
    torch.manual_seed(0)
    model = TinyMoELM().to(DEVICE)
    tokens = torch.randint(0, 32, (10,), device=DEVICE)
    targets = torch.randint(0, 32, (10,), device=DEVICE)
    compiled = torch.compile(model, fullgraph=True, dynamic=True)

    loss, grads = _grads(compiled, tokens, targets)
    eager_loss, eager_grads = _grads(model, tokens, targets)
    torch.testing.assert_close(loss, eager_loss, atol=1e-5, rtol=1e-5)
    for ours, theirs in zip(grads, eager_grads):
        torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-4)
    # Every top-k pattern once per pass run (torch may trace a dynamic-shape graph more than once), the
    # renormalised one twice (the two Mixtral routers); the attention softmax (between a scale and a cast that
    # record gradients) and the loss's log_softmax (read by nll_loss) are left to inductor's kernels (_fusion.py).
    report = softmax_ops.compile_report()
    assert report.graphs_seen >= 1
    per_graph = {**dict.fromkeys(report.rewrites, 1), "softmax": 0, "log_softmax": 0, "softmax_topk_renorm": 2}
    assert report.rewrites == {pattern: count * report.graphs_seen for pattern, count in per_graph.items()}
    assert sorted((s.pattern, s.reason.startswith("left to inductor")) for s in report.skipped) == sorted(
        [("softmax", True), ("log_softmax", True)] * report.graphs_seen)

    # A different number of tokens reuses the dynamic graph.
    tokens, targets = tokens[:7], targets[:7]
    torch.testing.assert_close(compiled(tokens, targets), model(tokens, targets), atol=1e-5, rtol=1e-5)


def test_reduce_overhead_inference(no_compile_caches):
    torch.manual_seed(0)
    layer = MoE(16, 6, "mixtral").to(DEVICE)
    h = torch.randn(8, 16, device=DEVICE)
    compiled = torch.compile(layer, mode="reduce-overhead", fullgraph=True)
    with torch.no_grad():
        for _ in range(3):  # warm-up, record, replay when CUDA graphs are in use
            out = compiled(h).clone()
        torch.testing.assert_close(out, layer(h), atol=1e-5, rtol=1e-5)
    assert softmax_ops.compile_report().rewrites["softmax_topk_renorm"] == 1


# ---- enable / disable, uuid, caches, chaining --------------------------------------------------------------


class RecordingPass(CustomGraphPass):
    """A user's own pre-grad pass: counts its calls, and has a uuid."""

    def __init__(self, name: str = "user-pass-v1") -> None:
        self.name = name
        self.calls = 0

    def __call__(self, graph: torch.fx.Graph) -> None:
        self.calls += 1

    def uuid(self) -> str:
        return self.name


def test_disable_leaves_graphs_alone_and_enable_restores():
    def fn(x):
        return x.softmax(-1)

    softmax_ops.disable()
    assert not softmax_ops.is_enabled()
    assert torch._inductor.config.pre_grad_custom_pass is None
    torch.compile(fn, backend=pass_backend)(logits(4, 8))
    assert softmax_ops.compile_report().graphs_seen == 0

    softmax_ops.enable()
    softmax_ops.enable()  # idempotent: never wraps itself
    installed = torch._inductor.config.pre_grad_custom_pass
    assert isinstance(installed, SoftmaxOpsGraphPass) and installed.chained is None
    torch._dynamo.reset()
    torch.compile(fn, backend=pass_backend)(logits(4, 8))
    assert softmax_ops.compile_report().rewrites["softmax"] == 1


def test_uuid_tracks_enabled_state_devices_and_chained_pass(monkeypatch, torch_config):
    softmax_ops.disable()
    user_pass = RecordingPass()
    torch_config(torch._inductor.config, "pre_grad_custom_pass", user_pass)
    softmax_ops.enable()
    ours = torch._inductor.config.pre_grad_custom_pass
    assert isinstance(ours, SoftmaxOpsGraphPass) and ours.chained is user_pass
    enabled_id = ours.uuid()
    assert isinstance(enabled_id, str) and enabled_id == ours.uuid()

    monkeypatch.setenv("SOFTMAX_OPS_DEVICES", "cuda")
    assert ours.uuid() != enabled_id
    monkeypatch.setenv("SOFTMAX_OPS_DEVICES", "cuda,cpu")
    assert ours.uuid() == enabled_id

    user_pass.name = "user-pass-v2"
    assert ours.uuid() != enabled_id
    user_pass.name = "user-pass-v1"

    # Our pass inside a list the user built cannot be unhooked: it stays, inert, and says so in its uuid.
    torch_config(torch._inductor.config, "pre_grad_custom_pass", [ours])
    softmax_ops.disable()
    assert torch._inductor.config.pre_grad_custom_pass == [ours]
    assert ours.uuid() not in (None, enabled_id)
    softmax_ops.enable()
    assert torch._inductor.config.pre_grad_custom_pass == [ours]  # not chained twice
    assert ours.uuid() == enabled_id

    ours.chained = lambda graph: None  # a plain function has no uuid: nothing safe to put in a cache key
    assert ours.uuid() is None


def test_chained_user_pass_runs_and_is_restored_by_disable(torch_config):
    user_pass = RecordingPass()
    torch_config(torch._inductor.config, "pre_grad_custom_pass", user_pass)  # replaces ours
    assert not softmax_ops.is_enabled()
    softmax_ops.enable()
    assert softmax_ops.is_enabled()

    torch.compile(plain_softmax, backend=pass_backend)(logits(4, 8))
    assert user_pass.calls == 1
    assert softmax_ops.compile_report().rewrites["softmax"] == 1

    softmax_ops.disable()
    assert torch._inductor.config.pre_grad_custom_pass is user_pass


def test_inductor_caches_never_mix_pass_on_and_off(tmp_path, monkeypatch, torch_config):
    from torch._dynamo.utils import counters
    from torch._inductor.utils import run_and_get_code

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    torch_config(torch._inductor.config, "fx_graph_cache", True)
    torch_config(torch._functorch.config, "enable_autograd_cache", True)
    x = logits(4, 8)

    def compiled_code() -> str:
        torch._dynamo.reset()
        _, code = run_and_get_code(torch.compile(qwen_router), x)
        return "\n".join(code)

    assert "softmax_ops.fused_topk" in compiled_code()
    softmax_ops.disable()
    assert "softmax_ops" not in compiled_code()  # not served the cached rewritten graph
    softmax_ops.enable()
    counters.clear()
    assert "softmax_ops.fused_topk" in compiled_code()  # nor the unrewritten one...
    # ...and served from the cache: the pass's uuid is stable, so enabling it does not defeat caching.
    assert counters["aot_autograd"]["autograd_cache_hit"] + counters["inductor"]["fxgraph_cache_hit"] >= 1


# ---- the report --------------------------------------------------------------------------------------------


def test_report_counts_skips_and_reset():
    def fn(x):
        weights, selected = mixtral_router(x)
        return weights, selected, x.log_softmax(-1), torch.topk(x.softmax(0), 2, dim=1)

    torch.compile(fn, backend=pass_backend, fullgraph=True)(logits(4, 8))
    report = softmax_ops.compile_report()
    assert report.rewrites == {
        "softmax": 1,
        "log_softmax": 1,
        "softmax_topk": 0,
        "softmax_topk_renorm": 1,
        "topk_softmax": 0,
    }
    assert [(s.pattern, s.reason) for s in report.skipped] == [
        ("softmax_topk", "topk over dim 1, softmax over dim 0")
    ]
    assert report.skipped[0].where.startswith("test_compile_pass.py:")
    assert report.graphs_seen == 1 and len(report.graphs) == 1
    assert report.summary() == (
        "softmax_ops compile pass: rewrote softmax=1, log_softmax=1, softmax_topk_renorm=1; "
        "skipped 1 candidate(s)"
    )

    softmax_ops.reset_compile_report()
    empty = softmax_ops.compile_report()
    assert sum(empty.rewrites.values()) == 0 and empty.skipped == [] and empty.graphs_seen == 0


def test_report_logs_each_rewrite(caplog):
    with caplog.at_level("DEBUG", logger="softmax_ops"):
        torch.compile(mixtral_router, backend=pass_backend)(logits(4, 8))
    messages = [record.getMessage() for record in caplog.records if record.name == "softmax_ops"]
    assert any("rewrote softmax_topk_renorm at node topk" in m for m in messages), messages
    assert any("rewrote {'softmax_topk_renorm': 1}" in m for m in messages), messages
