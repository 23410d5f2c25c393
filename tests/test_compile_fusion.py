"""The compile pass next to elementwise neighbours (softmax_ops/_fusion.py): casts it absorbs into the op's
dtype, and softmaxes it leaves to inductor because an elementwise op would otherwise lose its fusion.

Uses the helpers and the autouse fixture of test_compile_pass.py (pass enabled on CPU and CUDA graphs, fresh
Dynamo state and report per test).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from conftest import assert_within_2x_torch
from expecttest import assert_expected_inline
from test_compile_pass import (  # noqa: F401  (fixtures: the autouse one, no_compile_caches)
    DEVICE,
    compile_pass_enabled_on_cpu,
    logits,
    no_compile_caches,
    pass_backend,
    rewritten_graph,
    skip_reasons,
)

import softmax_ops
from softmax_ops.compile_pass import SoftmaxOpsGraphPass

WIDENING_CASTS = {
    "float": lambda x: x.float(),
    "to": lambda x: x.to(torch.float32),
    "to_dtype_kw": lambda x: x.to(dtype=torch.float32),
    "type": lambda x: x.type(torch.float32),
}
SOFTMAX_FUNCTIONS = {"softmax": torch.softmax, "log_softmax": F.log_softmax}


def causal_mask(n: int, dtype: torch.dtype) -> torch.Tensor:
    return torch.full((n, n), float("-inf"), device=DEVICE).triu(1).to(dtype)


def left_to_inductor(role: str) -> list[tuple[str, bool]]:
    """(pattern, whether the reason names an elementwise ``role``) of each skipped candidate."""
    return [(pattern, reason.startswith(f"left to inductor, which computes the {role} "))
            for pattern, reason in skip_reasons()]


# ---- casts absorbed ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", list(SOFTMAX_FUNCTIONS))
@pytest.mark.parametrize("cast", list(WIDENING_CASTS))
def test_widening_cast_in_front_becomes_the_dtype_argument(cast, kind):
    widen, softmax = WIDENING_CASTS[cast], SOFTMAX_FUNCTIONS[kind]
    graph = rewritten_graph(lambda x: softmax(widen(x), -1), logits(4, 8, dtype=torch.bfloat16))
    assert graph.splitlines()[1:] == [
        f"{kind}_default = softmax_ops.{kind}.default(l_x_, -1, torch.float32)",
        f"return ({kind}_default,)",
    ]


def test_widening_type_as_a_float32_tensor_becomes_the_dtype_argument():
    def fn(x, reference):
        return torch.softmax(x.type_as(reference), -1) @ reference

    graph = rewritten_graph(fn, logits(4, 8, dtype=torch.float16), torch.ones(8, 8, device=DEVICE))
    assert "softmax_ops.softmax.default(l_x_, -1, torch.float32)" in graph
    assert "type_as" not in graph


def test_widening_cast_read_elsewhere_stays_for_its_other_reader():
    def fn(x):
        wide = x.float()
        return torch.log_softmax(wide, -1), wide.sum()

    assert_expected_inline(
        rewritten_graph(fn, logits(4, 8, dtype=torch.float16)),
        """\
inputs: l_x_
wide = l_x_.float()
log_softmax_default = softmax_ops.log_softmax.default(l_x_, -1, torch.float32)
sum_1 = wide.sum()
return (log_softmax_default, sum_1)""",
    )


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("kind", list(SOFTMAX_FUNCTIONS))
def test_widening_cast_numerics_forward_and_backward(kind, dtype):
    softmax = SOFTMAX_FUNCTIONS[kind]

    def fn(x):
        return softmax(x.float(), -1)

    x = logits(6, 40, dtype=dtype, seed=5).requires_grad_()
    ours = torch.compile(fn, backend=pass_backend, fullgraph=True)(x)
    assert softmax_ops.compile_report().rewrites[kind] == 1
    eager, reference = fn(x), softmax(x.detach().double(), -1)
    assert ours.dtype == eager.dtype == torch.float32
    assert_within_2x_torch(ours, eager, reference)
    upstream = torch.randn(ours.shape, generator=torch.Generator().manual_seed(6)).to(ours)
    (grad_ours,) = torch.autograd.grad((ours * upstream).sum(), x)
    (grad_eager,) = torch.autograd.grad((eager * upstream).sum(), x)
    x64 = x.detach().double().requires_grad_()
    (grad_ref,) = torch.autograd.grad((softmax(x64, -1) * upstream.double()).sum(), x64)
    assert grad_ours.dtype == grad_eager.dtype == dtype
    assert_within_2x_torch(grad_ours, grad_eager, grad_ref)


def test_widening_cast_with_logits_written_before_the_softmax_is_not_absorbed():
    """The op would read the logits at the softmax, after the write; the cast read them before it."""
    def fn(x, y):
        wide = x.float()
        x.mul_(2)
        return torch.softmax(wide, -1) @ y, torch.topk(torch.softmax(wide, -1), 2)

    x, y = logits(4, 8, dtype=torch.bfloat16), torch.ones(8, 2, device=DEVICE)
    graph = rewritten_graph(fn, x.clone(), y)
    assert "softmax_ops.softmax.default(wide, -1, None)" in graph
    assert "softmax_ops.fused_topk.default(wide, 2, -1, False, None)" in graph
    ours, eager = torch.compile(fn, backend=pass_backend, fullgraph=True)(x.clone(), y), fn(x.clone(), y)
    torch.testing.assert_close(ours[0], eager[0])
    torch.testing.assert_close(ours[1].values, eager[1].values)


CAST_RESULT_WRITES = {
    "masked_fill_": lambda w: w.masked_fill_(torch.ones(4, 8, dtype=torch.bool, device=w.device).triu(1), -1e4),
    "setitem": lambda w: w.__setitem__((slice(None), 0), 100.0),
    "through_a_view": lambda w: w[:, :4].mul_(0),
    "out": lambda w: torch.mul(w, 3, out=w),
}


@pytest.mark.parametrize("write", list(CAST_RESULT_WRITES))
def test_widening_cast_whose_result_is_written_before_the_softmax_is_not_absorbed(write):
    """The op would read x, without the write into the float32 copy (found in review: HF-style masking of a
    float copy)."""
    change = CAST_RESULT_WRITES[write]

    def fn(x, y):
        wide = x.float()
        change(wide)
        return torch.log_softmax(wide, -1) @ y, torch.topk(torch.softmax(wide, -1), 2)

    x, y = logits(4, 8, dtype=torch.float16), torch.ones(8, 2, device=DEVICE)
    outs = torch.compile(fn, backend=pass_backend, fullgraph=True)(x, y)
    graph = softmax_ops.compile_report().graphs[0]
    assert "(l_x_," not in graph
    eager = fn(x, y)
    torch.testing.assert_close(outs[0], eager[0])
    torch.testing.assert_close(outs[1].values, eager[1].values)  # the writes make ties: indices may differ


def test_fused_topk_with_gradients_keeps_reading_the_float32_copy():
    """fused_topk saves its logits for the backward: the graph's own float32 copy, not the caller's x, which
    may change after the graph ran (found in review)."""
    def fn(x):
        return torch.topk(torch.softmax(x.float(), -1), 2)

    x = logits(4, 8, dtype=torch.float16).requires_grad_()
    graph = rewritten_graph(fn, x * 1)
    assert "fused_topk.default(float_1, 2, -1, False, None)" in graph
    activations = x * 1
    values, _ = torch.compile(fn, backend=pass_backend, fullgraph=True)(activations)
    activations.mul_(2)  # the caller's tensor changes before the backward
    values.sum().backward()
    expected = torch.autograd.grad(fn(x * 1)[0].sum(), x)[0]
    torch.testing.assert_close(x.grad, expected)


def test_widening_cast_across_a_grad_mode_switch_is_not_absorbed():
    def fn(x, y):
        wide = x.float()
        with torch.no_grad():
            return torch.softmax(wide, -1) @ y

    torch.compile(fn, backend=pass_backend, fullgraph=True)(logits(4, 8, dtype=torch.bfloat16),
                                                             torch.ones(8, 2, device=DEVICE))
    assert left_to_inductor("producer") == [("softmax", True)]  # the cast stays, an elementwise producer


def test_widening_cast_absorbed_by_fused_topk():
    def fn(x):
        return torch.topk(F.softmax(x.float(), dim=-1), 2)

    assert_expected_inline(
        rewritten_graph(fn, logits(4, 8, dtype=torch.bfloat16)),
        """\
inputs: l_x_
fused_topk_default = softmax_ops.fused_topk.default(l_x_, 2, -1, False, torch.float32)
getitem = fused_topk_default[0]
getitem_1 = fused_topk_default[1]
return (getitem, getitem_1)""",
    )


CASTS_BACK = {
    "to_dtype": lambda p, x: p.to(x.dtype),
    "to_dtype_kw": lambda p, x: p.to(dtype=x.dtype),
    "type_as": lambda p, x: p.type_as(x),
    "named": lambda p, x: p.half() if x.dtype == torch.float16 else p.bfloat16(),
}


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("cast", list(CASTS_BACK))
@pytest.mark.parametrize("form", ["dtype_argument", "float_input"])
def test_cast_back_without_gradients_gives_the_16_bit_op(form, cast, dtype):
    cast_back = CASTS_BACK[cast]

    def fn(x):
        p = F.softmax(x, dim=-1, dtype=torch.float32) if form == "dtype_argument" else torch.softmax(x.float(), -1)
        return cast_back(p, x)

    x = logits(6, 40, dtype=dtype, seed=7)
    graph = rewritten_graph(fn, x)
    assert graph.splitlines()[1:] == [
        "softmax_default = softmax_ops.softmax.default(l_x_, -1, None)",
        "return (softmax_default,)",
    ]
    ours = torch.compile(fn, backend=pass_backend, fullgraph=True)(x)
    eager = fn(x)
    assert ours.dtype == eager.dtype == dtype
    assert_within_2x_torch(ours, eager, torch.softmax(x.double(), -1))


def test_log_softmax_cast_back_without_gradients():
    def fn(x):
        return F.log_softmax(x, dim=-1, dtype=torch.float32).to(x.dtype)

    x = logits(6, 40, dtype=torch.bfloat16)
    assert "softmax_ops.log_softmax.default(l_x_, -1, None)" in rewritten_graph(fn, x)
    ours = torch.compile(fn, backend=pass_backend, fullgraph=True)(x)
    assert_within_2x_torch(ours, fn(x), torch.log_softmax(x.double(), -1))


def test_cast_back_with_gradients_is_left_to_inductor():
    """The backward would start from the 16-bit output instead of the float32 one: not absorbed, and the cast
    then stays an elementwise consumer."""
    def fn(x):
        return F.softmax(x, dim=-1, dtype=torch.float32).to(x.dtype)

    torch.compile(fn, backend=pass_backend, fullgraph=True)(logits(4, 8, dtype=torch.bfloat16).requires_grad_())
    assert left_to_inductor("consumer") == [("softmax", True)]


def test_cast_to_another_16_bit_dtype_is_not_absorbed():
    def fn(x):
        return F.softmax(x, dim=-1, dtype=torch.float32).half()

    torch.compile(fn, backend=pass_backend, fullgraph=True)(logits(4, 8, dtype=torch.bfloat16))
    assert left_to_inductor("consumer") == [("softmax", True)]


# ---- elementwise neighbours left to inductor ---------------------------------------------------------------


PRODUCERS = {
    "scale": lambda x, mask: x * 0.125,
    "scale_and_mask": lambda x, mask: x / 8 + mask,
    "in_place_add": lambda x, mask: x.clone().__iadd__(mask),  # dunder form (`+=` records operator.iadd)
    "masked_fill": lambda x, mask: x.masked_fill(mask.isinf(), float("-inf")),
    "where": lambda x, mask: torch.where(mask.isinf(), float("-inf"), x),
    "through_a_view": lambda x, mask: (x * 2).view(2, 4, 8),
    "narrowing_cast": lambda x, mask: x.bfloat16(),
}


@pytest.mark.parametrize("producer", list(PRODUCERS))
def test_elementwise_producer_is_left_to_inductor(producer):
    make = PRODUCERS[producer]

    def fn(x, mask, y):
        return F.softmax(make(x, mask), dim=-1) @ y.to(x.dtype if producer != "narrowing_cast" else torch.bfloat16)

    torch.compile(fn, backend=pass_backend, fullgraph=True)(logits(8, 8), causal_mask(8, torch.float32),
                                                             torch.ones(8, 3, device=DEVICE))
    assert left_to_inductor("producer") == [("softmax", True)]
    assert softmax_ops.compile_report().rewrites["softmax"] == 0


def test_elementwise_producer_read_elsewhere_is_rewritten():
    """Inductor writes the scores for their other reader anyway: the op reads them, nothing is lost."""
    def fn(x):
        scores = x * 0.125
        return torch.softmax(scores, -1), scores.amax()

    assert "softmax_ops.softmax.default(scores, -1, None)" in rewritten_graph(fn, logits(4, 8))


CONSUMERS = {
    "scale": lambda p: p * 2,
    "dropout": lambda p: F.dropout(p, 0.1, training=True),
    "through_a_view": lambda p: p.view(2, 2, 8) + 1,
    "in_place": lambda p: p.mul_(3),
    # reductions and gathers: inductor never writes the full output (H100, session 25 call 4: nll_loss of a
    # (8192, 32000) bf16 log_softmax 373 us under torch.compile, 656 with our op in front)
    "nll_loss": lambda p: F.nll_loss(p, torch.zeros(4, dtype=torch.long, device=p.device)),
    "gather": lambda p: p.gather(-1, torch.zeros(4, 1, dtype=torch.long, device=p.device)),
    "sum": lambda p: p.sum(-1),
}


@pytest.mark.parametrize("consumer", list(CONSUMERS))
def test_consumer_inductor_computes_in_the_kernel_is_left_to_inductor(consumer):
    use = CONSUMERS[consumer]
    torch.compile(lambda x: use(torch.log_softmax(x, -1)), backend=pass_backend, fullgraph=True)(logits(4, 8))
    assert left_to_inductor("consumer") == [("log_softmax", True)]


@pytest.mark.parametrize("consumer", ["output", "topk", "sort", "multinomial", "zeros_like"])
def test_consumers_that_need_the_whole_output_keep_the_rewrite(consumer):
    def fn(x):
        p = torch.softmax(x, -1)
        if consumer == "output":
            return p
        if consumer == "topk":
            return p.topk(2, dim=0)  # over another dim than the softmax: not fused, read in full
        if consumer == "sort":
            return torch.sort(p, -1)
        if consumer == "multinomial":
            return torch.multinomial(p, 1)
        return torch.zeros_like(p).fill_(1)

    torch.compile(fn, backend=pass_backend, fullgraph=True)(logits(4, 8))
    assert softmax_ops.compile_report().rewrites["softmax"] == 1


class AttentionWithDropout(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.dropout = torch.nn.Dropout(0.1)

    def forward(self, scores, v):
        return (self.dropout(torch.softmax(scores, -1)) @ v, F.dropout(torch.softmax(scores, 0), 0.0) @ v)


def test_dropout_that_returns_its_input_is_looked_through():
    """nn.Dropout in eval mode and p=0 return their input: the matmul behind them is the real reader."""
    block = AttentionWithDropout().eval()
    scores, v = logits(8, 8), logits(8, 3, seed=1)
    torch.compile(block, backend=pass_backend, fullgraph=True)(scores, v)
    assert softmax_ops.compile_report().rewrites["softmax"] == 2
    block.train()
    torch._dynamo.reset()
    softmax_ops.reset_compile_report()
    torch.compile(block, backend=pass_backend, fullgraph=True)(scores, v)
    assert left_to_inductor("consumer") == [("softmax", True)]  # the training dropout; p=0 still looked through


def test_casts_to_the_dtype_a_tensor_has_are_looked_through():
    """HF eager attention in a float32 model: ``softmax(s, dtype=float32).to(q.dtype)`` casts nothing."""
    def fn(q, v):
        return F.softmax(q.float() @ q.T, dim=-1, dtype=torch.float32).to(q.dtype) @ v

    graph = rewritten_graph(fn, logits(8, 8), logits(8, 3, seed=1))
    assert "softmax_ops.softmax.default(matmul, -1, torch.float32)" in graph


def test_neighbours_inductor_keeps_apart_are_rewritten():
    """Graph inputs and matmuls are kernels of their own either way: rewritten. A gather of a few
    log-probabilities inductor computes inside its log_softmax kernel, which never writes the rest: left."""
    def fn(q, k, v, index):
        p = torch.softmax(q @ k.transpose(-2, -1), -1)
        return p @ v, torch.log_softmax(q, -1).gather(-1, index)

    q, k, v = (logits(4, 8, seed=s) for s in range(3))
    index = torch.zeros(4, 1, dtype=torch.long, device=DEVICE)
    assert_expected_inline(
        rewritten_graph(fn, q, k, v, index),
        """\
inputs: l_k_, l_q_, l_v_, l_index_
transpose = l_k_.transpose(-2, -1)
matmul = operator.matmul(l_q_, transpose)
softmax_default = softmax_ops.softmax.default(matmul, -1, None)
matmul_1 = operator.matmul(softmax_default, l_v_)
log_softmax = torch.log_softmax(l_q_, -1)
gather = log_softmax.gather(-1, l_index_)
return (matmul_1, gather)""",
    )
    assert left_to_inductor("consumer") == [("log_softmax", True)]


def test_hf_eager_attention_without_gradients_is_left_to_inductor():
    """HF Transformers' eager attention: the scale and the mask stay fused in front, so the whole softmax
    does, even though the cast behind it alone could be absorbed."""
    def fn(scores, mask):
        return F.softmax(scores * 0.125 + mask, dim=-1, dtype=torch.float32).to(scores.dtype)

    x = logits(8, 8, dtype=torch.float16)
    torch.compile(fn, backend=pass_backend, fullgraph=True)(x, causal_mask(8, torch.float16))
    assert left_to_inductor("producer") == [("softmax", True)]


def test_rewrite_fused_from_the_environment_rewrites_every_softmax(monkeypatch):
    monkeypatch.setenv("SOFTMAX_OPS_REWRITE_FUSED", "1")
    graph = rewritten_graph(lambda x: torch.softmax(x * 0.125, -1) * 2, logits(4, 8))
    assert "softmax_ops.softmax.default(mul, -1, None)" in graph
    assert skip_reasons() == []


def test_uuid_tracks_rewrite_fused(monkeypatch):
    kept = SoftmaxOpsGraphPass().uuid()
    monkeypatch.setenv("SOFTMAX_OPS_REWRITE_FUSED", "1")
    assert SoftmaxOpsGraphPass().uuid() != kept


# ---- through the real Inductor backend ---------------------------------------------------------------------


@pytest.mark.usefixtures("no_compile_caches")
def test_lm_head_and_attention_through_inductor():
    """A float32 LM-head log_softmax over 16-bit logits is rewritten (reading them once); the scaled attention
    softmax and the loss's log_softmax stay inductor's; all match eager."""
    def fn(scores, hidden, weight):
        attention = torch.softmax(scores * 0.125, -1) @ hidden
        logits = hidden @ weight
        loss = F.nll_loss(F.log_softmax(logits.float(), -1), torch.arange(16, device=logits.device) % 32)
        return attention, F.log_softmax(logits.float(), -1), loss

    scores = logits(16, 16, dtype=torch.bfloat16)
    hidden, weight = logits(16, 8, dtype=torch.bfloat16, seed=1), logits(8, 32, dtype=torch.bfloat16, seed=2) / 8
    outs = torch.compile(fn, fullgraph=True)(scores, hidden, weight)
    report = softmax_ops.compile_report()
    assert report.rewrites["log_softmax"] == report.graphs_seen >= 1
    assert report.rewrites["softmax"] == 0
    assert sorted(s.pattern for s in report.skipped) == ["log_softmax", "softmax"] * report.graphs_seen
    for ours, eager in zip(outs, fn(scores, hidden, weight)):
        torch.testing.assert_close(ours, eager, atol=2e-2, rtol=2e-2)
