"""The implementations the benchmark races, their inputs, yardsticks and correctness checks.

Every implementation of a case is a zero-argument callable over inputs allocated once, outside the timed
call. Before a callable is timed its output is checked against a float64 reference with the project's
accuracy rule (DESIGN.md §3): max error at most twice torch eager's own error plus one rounding step.
"""

from __future__ import annotations

import contextlib
import math
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch

import softmax_ops
from softmax_ops._bench_cases import BACKWARD_OPS, TOPK_OP, Case

OURS = "softmax_ops"
EAGER = "torch_eager"
COMPILE = "torch_compile"
LIGER = "liger"
QUACK = "quack"
BASELINES = (EAGER, COMPILE, LIGER, QUACK)
# Quack's fused top-k is the router form only (softmax over the k selected logits): on fused_topk rows it races
# this counterpart of ours, which has that contract too (see PreparedCase.raced_by).
OURS_RENORMALIZED = "softmax_ops_renormalized"
QUACK_TOPK = "quack_topk"  # optional_baselines' key for quack.topk.topk_fwd

INPUT_SCALE = 3.0  # PERF.md: random normal inputs scaled by 3, never zeros
# One rounding step at magnitude 1 in the output dtype: the floor of the accuracy bound (torch's own error
# can be 0 on a lucky sample).
_ROUNDING_FLOOR = {torch.float16: 1e-3, torch.bfloat16: 8e-3, torch.float32: 2e-7, torch.float64: 1e-12}


@dataclass
class Check:
    """Outcome of one correctness check: max abs error vs float64 and the bound it must stay under."""

    error: float
    bound: float
    problem: str | None = None

    @property
    def ok(self) -> bool:
        return self.problem is None and self.error <= self.bound

    def describe(self) -> str:
        if self.problem:
            return self.problem
        return f"max error {self.error:.3e} vs bound {self.bound:.3e}"


@dataclass
class PreparedCase:
    """A case ready to time: one callable per implementation, the yardstick, and a checker."""

    case: Case
    impls: dict[str, Callable[[], object]]
    yardstick: Callable[[], object]
    check: Callable[[object], Check]
    unavailable: dict[str, str] = field(default_factory=dict)
    checks: dict[str, Callable[[object], Check]] = field(default_factory=dict)  # impl -> its own checker
    # baseline -> the implementation of ours it races, where that is not OURS (a baseline of another contract)
    raced_by: dict[str, str] = field(default_factory=dict)

    def check_of(self, impl: str) -> Callable[[object], Check]:
        """The checker of ``impl``'s output: its own, else the case's."""
        return self.checks.get(impl, self.check)


def optional_baselines() -> dict[str, Callable[..., object] | str]:
    """Liger's and Quack's softmax entry points when they import, else why not (shown in the header)."""
    found: dict[str, Callable[..., object] | str] = {}
    try:
        from liger_kernel.ops.softmax import LigerSoftmaxFunction

        found[LIGER] = LigerSoftmaxFunction.apply
    except Exception as error:  # noqa: BLE001  (any import failure just means "not available")
        found[LIGER] = f"not available ({type(error).__name__}: {error})"
    try:
        from quack.softmax import softmax_bwd, softmax_fwd

        found[QUACK] = softmax_fwd
        found[QUACK + "_bwd"] = softmax_bwd
    except Exception as error:  # noqa: BLE001
        found[QUACK] = f"not available ({type(error).__name__}: {error})"
    try:
        from quack.topk import topk_fwd

        found[QUACK_TOPK] = topk_fwd
    except Exception as error:  # noqa: BLE001
        found[QUACK_TOPK] = f"not available ({type(error).__name__}: {error})"
    return found


@contextlib.contextmanager
def compile_pass_disabled() -> Iterator[None]:
    """Run the block with softmax_ops' torch.compile pass off, so torch.compile baselines are pure torch."""
    disable, enable = getattr(softmax_ops, "disable", None), getattr(softmax_ops, "enable", None)
    is_enabled = getattr(softmax_ops, "is_enabled", None)
    if disable is None or enable is None:
        yield
        return
    was_enabled = is_enabled() if is_enabled is not None else True
    disable()
    try:
        yield
    finally:
        if was_enabled:
            enable()


def _add_compiled(
    impls: dict[str, Callable[[], object]], unavailable: dict[str, str], fn: Callable[..., object],
    *args: torch.Tensor,
) -> None:
    # A fresh dynamo state per case: no recompile-limit fallback to eager across the sweep's many shapes, and
    # dynamic=False so every shape gets the specialised kernel a static model would get.
    torch._dynamo.reset()
    compiled = torch.compile(fn, dynamic=False)
    try:
        with compile_pass_disabled():
            compiled(*args)
    except Exception as error:  # noqa: BLE001  (a baseline that fails to compile is reported, not fatal)
        unavailable[COMPILE] = f"torch.compile failed: {type(error).__name__}: {error}"
        return
    impls[COMPILE] = lambda: compiled(*args)


def _random(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device, seed: int) -> torch.Tensor:
    generator = torch.Generator(device=device).manual_seed(seed)
    return torch.randn(shape, generator=generator, device=device, dtype=dtype).mul_(INPUT_SCALE)


def _max_error(value: torch.Tensor, reference: torch.Tensor) -> float:
    return (value.double() - reference).abs().max().item() if value.numel() else 0.0


def _bound(torch_error: float, dtype: torch.dtype, scale: float = 1.0) -> float:
    return 2 * torch_error + _ROUNDING_FLOOR[dtype] * max(1.0, scale)


def _prepare_forward(case: Case, device: torch.device, extra: dict, with_compile: bool) -> PreparedCase:
    x = _random(case.shape, case.dtype, device, seed=0)
    log = case.op == "log_softmax"
    torch_fn = torch.log_softmax if log else torch.softmax
    ours_fn = softmax_ops.log_softmax if log else softmax_ops.softmax
    dtype = case.dtype_argument
    impls: dict[str, Callable[[], object]] = {
        OURS: lambda: ours_fn(x, -1, dtype=dtype),
        EAGER: lambda: torch_fn(x, -1, dtype=dtype),
    }
    unavailable: dict[str, str] = {}
    if with_compile:
        _add_compiled(impls, unavailable, lambda t: torch_fn(t, -1, dtype=dtype), x)
    for name in (LIGER, QUACK) if not log else ():
        entry = extra.get(name)
        if callable(entry) and dtype is not None:
            unavailable[name] = "no dtype= (its softmax keeps the input dtype)"
        elif callable(entry):
            impls[name] = lambda entry=entry: entry(x)
    reference = torch_fn(x.double(), -1)
    torch_error = _max_error(torch_fn(x, -1, dtype=dtype), reference)
    scale = reference.abs().max().item() if log else 1.0  # log-probabilities can be large
    # The yardstick moves the same bytes: a copy of half of them, read and written (a converting copy, fp16 ->
    # fp32, runs well below bandwidth in torch, so it would flatter a widening softmax).
    source, destination = _copy_pair(case, x)

    def check(output: object) -> Check:
        assert isinstance(output, torch.Tensor)
        if output.shape != x.shape or output.dtype != case.out_dtype:
            return Check(math.inf, 0.0, f"wrong output {tuple(output.shape)} {output.dtype}")
        return Check(_max_error(output, reference), _bound(torch_error, case.out_dtype, scale))

    return PreparedCase(case, impls, lambda: destination.copy_(source), check, unavailable)


def _copy_pair(case: Case, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Source and destination of the copy yardstick: half the bytes ``case`` moves each, in the dtype it reads.
    A same-dtype softmax copies x itself; otherwise a flat buffer of that many bytes (a backward: 1.5x the
    elements, as PERF.md says)."""
    if case.op not in BACKWARD_OPS and case.out_dtype_name is None:
        return x, torch.empty_like(x)
    elements = math.ceil(case.bytes_moved / 2 / case.stream_element_size)
    source = torch.empty(elements, dtype=case.stream_dtype, device=x.device).normal_()
    return source, torch.empty_like(source)


def _prepare_backward(case: Case, device: torch.device, extra: dict, with_compile: bool) -> PreparedCase:
    # The backward of softmax(x, -1, dtype=case.out_dtype): grad_output and output in that dtype, the gradient
    # in x's dtype (dtype below).
    x = _random(case.shape, case.dtype, device, seed=0)
    grad = _random(case.shape, case.stream_dtype, device, seed=1)
    log = case.op == "log_softmax_backward"
    forward_dtype = case.dtype_argument
    output = torch.log_softmax(x, -1, dtype=forward_dtype) if log else torch.softmax(x, -1, dtype=forward_dtype)
    dtype = case.dtype
    if log:
        ours_op = torch.ops.softmax_ops.log_softmax_backward.default
        aten_op = torch.ops.aten._log_softmax_backward_data.default
    else:
        ours_op = torch.ops.softmax_ops.softmax_backward.default
        aten_op = torch.ops.aten._softmax_backward_data.default

    # What autograd runs for the backward of softmax(x, -1, dtype=...): aten's CUDA kernels write a float16 gradient
    # of float32 streams themselves (its forward read the float16 input directly); for every other pair the
    # forward cast x first, so the backward is the float32 one, then that cast's backward (.to; a no-op otherwise).
    direct = dtype == case.stream_dtype or (
        dtype == torch.float16 and case.stream_dtype == torch.float32 and device.type == "cuda")
    aten_input_dtype = dtype if direct else case.stream_dtype

    def torch_backward(g: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return aten_op(g, y, -1, aten_input_dtype).to(dtype)

    impls: dict[str, Callable[[], object]] = {
        OURS: lambda: ours_op(grad, output, -1, dtype),
        EAGER: lambda: torch_backward(grad, output),
    }
    unavailable: dict[str, str] = {}
    if with_compile:
        _add_compiled(impls, unavailable, torch_backward, grad, output)
    quack_bwd = extra.get(QUACK + "_bwd")
    if not log and callable(quack_bwd) and forward_dtype is None:
        impls[QUACK] = lambda: quack_bwd(grad, output)
    grad64, output64 = grad.double(), output.double()
    if log:
        reference = grad64 - output64.exp() * grad64.sum(-1, keepdim=True)
    else:
        reference = output64 * (grad64 - (grad64 * output64).sum(-1, keepdim=True))
    torch_error = _max_error(torch_backward(grad, output), reference)
    scale = reference.abs().max().item()
    # PERF.md: the backward moves 1.5x a copy's bytes (reads 2 tensors, writes 1), so its yardstick is a copy
    # of 1.5x the elements; in general, a copy of half the bytes the backward moves, read and written.
    source, destination = _copy_pair(case, x)

    def check(result: object) -> Check:
        assert isinstance(result, torch.Tensor)
        if result.shape != x.shape or result.dtype != dtype:
            return Check(math.inf, 0.0, f"wrong output {tuple(result.shape)} {result.dtype}")
        return Check(_max_error(result, reference), _bound(torch_error, dtype, scale))

    return PreparedCase(case, impls, lambda: destination.copy_(source), check, unavailable)


def eager_topk(x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """PERF.md's eager reference for fused_topk: softmax in fp32, then torch.topk."""
    return torch.topk(torch.softmax(x, -1, dtype=torch.float32), k, dim=-1)


def _index_problem(indices: torch.Tensor, shape: tuple[int, int], k: int) -> str | None:
    """Why a fused_topk result's ``indices`` break the contract (every index in [0, N), distinct within its row),
    or None."""
    rows, cols = shape
    if indices.shape != (rows, k):
        return f"wrong indices shape {tuple(indices.shape)}"
    if indices.min().item() < 0 or indices.max().item() >= cols:
        return "an index is out of [0, N)"
    sorted_indices = indices.sort(dim=-1).values
    if k > 1 and (sorted_indices[:, 1:] == sorted_indices[:, :-1]).any().item():
        return "duplicate indices within a row"
    return None


def _prepare_topk(case: Case, device: torch.device, extra: dict, with_compile: bool) -> PreparedCase:
    x = _random(case.shape, case.dtype, device, seed=0)
    k = case.k
    impls: dict[str, Callable[[], object]] = {
        OURS: lambda: softmax_ops.fused_topk(x, k, -1, False, torch.float32),
        EAGER: lambda: eager_topk(x, k),
    }
    unavailable: dict[str, str] = {}
    if with_compile:
        _add_compiled(impls, unavailable, lambda t: eager_topk(t, k), x)
    probabilities = torch.softmax(x.double(), -1)
    reference_values = torch.topk(probabilities, k, dim=-1).values
    eager_values = eager_topk(x, k).values
    torch_error = _max_error(eager_values, reference_values)

    def check(result: object) -> Check:
        values, indices = result  # type: ignore[misc]
        if values.shape != (case.rows, k) or indices.dtype != torch.int64:
            return Check(math.inf, 0.0, f"wrong outputs {tuple(values.shape)} {indices.dtype}")
        problem = _index_problem(indices, case.shape, k)
        if problem:
            return Check(math.inf, 0.0, problem)
        # Values must be the top-k probabilities, and each must be the probability at its own index (ties
        # may pick either index, so indices are not compared with the reference's).
        error = max(_max_error(values, reference_values), _max_error(values, probabilities.gather(-1, indices)))
        return Check(error, _bound(torch_error, torch.float32))

    prepared = PreparedCase(case, impls, lambda: x.sum(dim=-1), check, unavailable)
    quack_topk = extra.get(QUACK_TOPK)
    if callable(quack_topk):
        _add_renormalized_race(prepared, x, k, probabilities, reference_values, eager_values, quack_topk)
    return prepared


def _add_renormalized_race(prepared: PreparedCase, x: torch.Tensor, k: int, probabilities: torch.Tensor,
                           reference_values: torch.Tensor, eager_values: torch.Tensor,
                           quack_topk: Callable[..., object]) -> None:
    """Quack's top-k (``topk_fwd(x, k, softmax=True)``: the softmax of the k largest logits, values in x's dtype,
    int32 indices) against ``fused_topk(x, k, -1, True)``, which returns the same values (int64 indices).
    ``eager_values``: the eager reference's top-k probabilities, whose renormalization gives torch's own error."""
    renormalized_reference = reference_values / reference_values.sum(-1, keepdim=True)
    torch_error = _max_error((eager_values / eager_values.sum(-1, keepdim=True)).to(x.dtype), renormalized_reference)

    def check(result: object) -> Check:
        values, indices = result  # type: ignore[misc]
        if values.shape != (x.shape[0], k) or values.dtype != x.dtype:
            return Check(math.inf, 0.0, f"wrong values {tuple(values.shape)} {values.dtype}")
        if indices.dtype not in (torch.int32, torch.int64):
            return Check(math.inf, 0.0, f"indices of dtype {indices.dtype}")
        problem = _index_problem(indices, tuple(x.shape), k)
        if problem:
            return Check(math.inf, 0.0, problem)
        # The selection in any order (a router does not need it sorted; ours is, and the tests say so); each value
        # the softmax over the selected logits at its own index.
        in_order = values.double().sort(dim=-1, descending=True).values
        selected = probabilities.gather(-1, indices.long())
        error = max(_max_error(in_order, renormalized_reference),
                    _max_error(values, selected / selected.sum(-1, keepdim=True)))
        return Check(error, _bound(torch_error, x.dtype))

    prepared.impls[QUACK] = lambda: quack_topk(x, k, softmax=True)
    prepared.impls[OURS_RENORMALIZED] = lambda: softmax_ops.fused_topk(x, k, -1, True)
    prepared.checks.update({QUACK: check, OURS_RENORMALIZED: check})
    prepared.raced_by[QUACK] = OURS_RENORMALIZED


_KERNEL_FAMILY = {
    "softmax": "softmax", "log_softmax": "softmax",
    "softmax_backward": "softmax_backward", "log_softmax_backward": "softmax_backward",
    "fused_topk": "topk",
}


def chosen_kernel(op: str, shape: tuple[int, ...], dtype: torch.dtype, k: int, device: torch.device,
                  out_dtype: torch.dtype | None = None) -> str:
    """The kernel the dispatcher picks for ``op`` on ``shape``/``dtype`` (``out_dtype``: see ``explain``): the name
    from ``list_kernels`` that ``explain`` mentions first (its choice), else explain's first line; "cpu" for the
    CPU kernels."""
    if device.type != "cuda":
        return "cpu"
    try:
        why = softmax_ops.explain(shape, dtype, op=op, k=k, out_dtype=out_dtype)
    except Exception as error:  # noqa: BLE001  (the table shows why instead of dying mid-run)
        return f"explain failed: {error}"
    names = softmax_ops.list_kernels(_KERNEL_FAMILY[op])
    # explain states its choice as "kernel <name>: ..." (softmax) or "kernel '<name>' ..." (fused_topk).
    stated = re.search(r"\bkernel '?(\w+)", why)
    if stated and stated.group(1) in names:
        return stated.group(1)
    # Otherwise the earliest mention; at the same position the longer name (``block_onepass`` over ``block``).
    mentioned = [(why.find(name), -len(name), name) for name in names if name in why]
    return min(mentioned)[2] if mentioned else (why.splitlines()[0][:60] if why else "?")


def prepare_case(case: Case, device: torch.device, extra: dict, with_compile: bool) -> PreparedCase:
    """Allocate the inputs of ``case`` on ``device`` and build its implementations and checker.

    ``extra`` holds the optional baselines from :func:`optional_baselines`; ``with_compile`` adds the
    torch.compile baseline (compiled here, with softmax_ops' pass disabled).
    """
    if case.op == TOPK_OP:
        return _prepare_topk(case, device, extra, with_compile)
    if case.op in BACKWARD_OPS:
        return _prepare_backward(case, device, extra, with_compile)
    return _prepare_forward(case, device, extra, with_compile)
