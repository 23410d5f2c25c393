"""The command line on CPU: the demo (tiny block), `bench --quick` with its JSON and PNG outputs, and the
argument parsing of the benchmark's shape/op/dtype filters."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import requires_cuda

import softmax_ops
from softmax_ops import _bench_cases as cases
from softmax_ops._bench_impls import EAGER, OURS, OURS_RENORMALIZED, QUACK, QUACK_TOPK, chosen_kernel
from softmax_ops._bench_report import CaseResult
from softmax_ops._bench_timing import TIMER_KINDS, make_timer
from softmax_ops.bench import main as bench_main
from softmax_ops.bench import run_case, time_in_rounds

PACKAGE_ROOT = Path(softmax_ops.__file__).resolve().parent.parent
TINY_DEMO = ["--device", "cpu", "--tokens", "32", "--hidden", "32", "--heads", "2", "--experts", "4",
             "--top-k", "2", "--vocab", "128", "--iters", "2"]
QUICK_BENCH = ["--quick", "--device", "cpu", "--dtypes", "fp32"]
ROW_KEYS = {"op", "dtype", "shape", "impl", "ms", "gbps", "kernel"}


def run_cli(*args: str, cwd: Path, code: str | None = None) -> subprocess.CompletedProcess:
    """Run `python -m softmax_ops ARGS` (or `python -c CODE`) with this checkout's package first on the path."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PACKAGE_ROOT), env.get("PYTHONPATH")]))
    command = [sys.executable, "-c", code] if code else [sys.executable, "-m", "softmax_ops", *args]
    return subprocess.run(command, check=False, cwd=cwd, env=env, capture_output=True, text=True, timeout=900)


def test_demo_runs_on_cpu_and_matches_eager(tmp_path):
    result = run_cli(*TINY_DEMO, cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert "No CUDA GPU in use: running the CPU path" in out
    assert re.search(r"torch\.compile\s+matches eager", out)
    assert "Time per forward step" in out
    if hasattr(softmax_ops, "compile_report"):
        assert re.search(r"torch\.compile \+ softmax_ops\s+matches eager", out)
        table = out.split("Substituted by the softmax_ops compile pass:")[1].split("Outputs vs eager")[0]
        # The block's three sites: attention softmax, router softmax->topk->renormalise, LM-head log_softmax.
        assert "fused_topk (k=2)" in table
        assert "32x4" in table  # the router's (tokens, experts)
        assert "log_softmax" in table
        assert "2x32x32" in table  # the attention scores (heads, tokens, tokens)
    else:
        assert "pass is unavailable" in out


def test_demo_help_and_bad_arguments(tmp_path):
    help_result = run_cli("--help", cwd=tmp_path)
    assert help_result.returncode == 0
    for option in ("--tokens", "--hidden", "--experts", "--top-k", "--vocab", "--device", "--dtype", "--iters"):
        assert option in help_result.stdout
    assert "bench" in help_result.stdout
    bad = run_cli("--device", "cpu", "--experts", "4", "--top-k", "5", cwd=tmp_path)
    assert bad.returncode == 2
    assert "--top-k (5) must be at most --experts (4)" in bad.stderr


def test_bench_quick_json_schema(tmp_path, capsys):
    path = tmp_path / "results" / "cpu.json"
    status = bench_main([*QUICK_BENCH, "--ops", "softmax,log_softmax_backward,fused_topk", "--json", str(path)])
    out = capsys.readouterr().out
    assert status == 0, out
    document = json.loads(path.read_text())
    assert {"gpu", "torch", "date", "rows"} <= set(document)
    assert document["gpu"].startswith("CPU")
    rows = document["rows"]
    for row in rows:
        assert ROW_KEYS <= set(row), row
        assert row["impl"] in ("softmax_ops", "torch_eager")
        assert row["ms"] > 0 and row["gbps"] > 0
        if row["op"] == "fused_topk":
            assert "xsum" in row and "xcopy" not in row and row["k"] > 0
        else:
            assert "xcopy" in row and "xsum" not in row and "k" not in row
        assert (row["kernel"] is not None) == (row["impl"] == "softmax_ops")

    expected_cases = {("softmax", f"{r}x{n}", 0) for r, n in cases.QUICK_SHAPES}
    expected_cases |= {("log_softmax_backward", f"{r}x{n}", 0) for r, n in cases.QUICK_SHAPES}
    expected_cases |= {("fused_topk", f"{r}x{n}", k) for r, n, k in cases.QUICK_TOPK_CASES}
    for impl in ("softmax_ops", "torch_eager"):
        assert {(r["op"], r["shape"], r.get("k", 0)) for r in rows if r["impl"] == impl} == expected_cases

    # GB/s is PERF.md's byte count over the time: softmax moves 2 tensors, its backward 3, fused_topk reads
    # the logits and writes k fp32 values + k int64 indices per row.
    for row in rows:
        rows_, n = map(int, row["shape"].split("x"))
        if row["op"] == "softmax":
            moved = 2 * rows_ * n * 4
        elif row["op"] == "log_softmax_backward":
            moved = 3 * rows_ * n * 4
        else:
            moved = rows_ * n * 4 + rows_ * row["k"] * 12
        assert row["gbps"] == pytest.approx(moved / (row["ms"] * 1e-3) / 1e9, rel=1e-3, abs=2e-3)
    assert "geomean" in out and "xCopy" in out and "xSum" in out


def test_bench_rounds_take_turns_and_report_each_implementations_fastest(tmp_path, capsys):
    # A timer whose first call of every implementation is 10x slow, like the sporadic outliers seen on the
    # H100: with two rounds the report must give the fast time, keep both, and flag the disagreement.
    order: list[str] = []

    def timer(fn):
        name = calls[fn]
        order.append(name)
        return 10.0 if order.count(name) == 1 else 1.0

    fns = {"ours": lambda: None, "eager": lambda: None, "yardstick": lambda: None}
    calls = {fn: name for name, fn in fns.items()}
    assert time_in_rounds(fns, timer, rounds=2) == {name: [10.0, 1.0] for name in fns}
    assert order == ["ours", "eager", "yardstick"] * 2  # in turns, not one implementation's rounds in a row

    case = cases.build_cases(["softmax"], ["fp32"], [(2, 8, 0)], quick=False)[0]
    result = CaseResult(case, 1.0, {"softmax_ops": 1.0, "torch_eager": 2.0}, "cpu", {},
                        {"softmax_ops": [10.0, 1.0], "torch_eager": [2.0, 2.1]})
    assert result.disagreeing_rounds() == {"softmax_ops": [10.0, 1.0]}
    rows = {row["impl"]: row for row in (r.to_json() for r in result.rows())}
    assert rows["softmax_ops"]["ms"] == 1.0 and rows["softmax_ops"]["ms_rounds"] == [10.0, 1.0]
    assert rows["torch_eager"]["ms_rounds"] == [2.0, 2.1]

    path = tmp_path / "rounds.json"
    status = bench_main([*QUICK_BENCH, "--ops", "softmax", "--shapes", "8x100", "--rounds", "3",
                         "--json", str(path)])
    assert status == 0, capsys.readouterr().out
    document = json.loads(path.read_text())
    assert document["rounds"] == 3
    for row in document["rows"]:
        assert len(row["ms_rounds"]) == 3 and row["ms"] == min(row["ms_rounds"])
    with pytest.raises(SystemExit):
        bench_main([*QUICK_BENCH, "--rounds", "0"])
    assert "--rounds must be at least 1" in capsys.readouterr().err


def quack_like_topk(x: torch.Tensor, k: int, softmax: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Quack's ``topk_fwd`` contract (quack-kernels 0.6.5), written with torch ops for the bench's plumbing: the k
    largest logits' int32 indices and, with ``softmax=True``, the softmax over those k logits in x's dtype."""
    logits, indices = torch.topk(x.float(), k, dim=-1)
    values = torch.softmax(logits, -1) if softmax else logits
    return values.to(x.dtype), indices.to(torch.int32)


def test_bench_races_quacks_router_topk_against_our_renormalized_form():
    """Quack's fused top-k is the renormalized (router) form: on fused_topk rows it is checked against that
    contract and its speedup divides by fused_topk(x, k, -1, True)'s time, timed in the same rounds; a result
    breaking the contract is reported, not timed; without Quack wanted, the renormalized form is not timed."""
    case = cases.build_cases(["fused_topk"], ["fp32"], [(64, 100, 4)], quick=False)[0]
    cpu = torch.device("cpu")
    ticks = iter(range(1, 1000))

    def timer(fn):  # every timing a different "time", so each speedup shows which two times it divides
        fn()
        return float(next(ticks))

    result = run_case(case, cpu, timer, {QUACK_TOPK: quack_like_topk}, [EAGER, QUACK], with_compile=False)
    assert set(result.times) == {OURS, OURS_RENORMALIZED, EAGER, QUACK}, result.notes
    assert result.raced_by == {QUACK: OURS_RENORMALIZED}
    assert result.times[OURS] != result.times[OURS_RENORMALIZED]
    assert result.speedup(QUACK) == result.times[QUACK] / result.times[OURS_RENORMALIZED]
    assert result.speedup(EAGER) == result.times[EAGER] / result.times[OURS]
    rows = {row.impl: row for row in result.rows()}
    assert rows[OURS_RENORMALIZED].kernel == rows[OURS].kernel == "cpu" and rows[QUACK].kernel is None

    def unnormalized(x, k, softmax=False):  # the top-k logits themselves: not the router's probabilities
        return quack_like_topk(x, k, softmax=False)

    def duplicated(x, k, softmax=False):
        values, indices = quack_like_topk(x, k, softmax)
        return values, indices[:, :1].expand(-1, k).contiguous()

    for broken, problem in [(unnormalized, "max error"), (duplicated, "duplicate indices")]:
        result = run_case(case, cpu, timer, {QUACK_TOPK: broken}, [EAGER, QUACK], with_compile=False)
        assert QUACK not in result.times and result.notes[QUACK].startswith("WRONG"), result.notes
        assert problem in result.notes[QUACK]
        assert result.speedup(QUACK) is None
    result = run_case(case, cpu, timer, {QUACK_TOPK: quack_like_topk}, [EAGER], with_compile=False)
    assert set(result.times) == {OURS, EAGER} and result.raced_by == {}


def test_bench_plot_writes_png(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    path = tmp_path / "sweep.png"
    status = bench_main([*QUICK_BENCH, "--ops", "softmax", "--shapes", "8x100", "--plot", str(path)])
    assert status == 0, capsys.readouterr().out
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bench_plot_without_matplotlib_says_how_to_install(tmp_path):
    # sys.modules[name] = None makes `import name` fail, as if matplotlib were not installed.
    code = ("import sys; sys.modules['matplotlib'] = None\n"
            "from softmax_ops.__main__ import main\n"
            "sys.exit(main(['bench', '--quick', '--device', 'cpu', '--plot', 'x.png']))")
    result = run_cli(cwd=tmp_path, code=code)
    assert result.returncode == 2
    assert "pip install matplotlib" in result.stderr
    assert not (tmp_path / "x.png").exists()


def test_bench_filters():
    assert cases.parse_shapes("4096x4096, 4x262144,64x151936k50") == [
        (4096, 4096, 0), (4, 262144, 0), (64, 151936, 50)]
    with pytest.raises(ValueError, match="--shapes"):
        cases.parse_shapes("4096by4096")
    assert cases.parse_dtypes("bfloat16,fp32") == ["bf16", "fp32"]
    with pytest.raises(ValueError, match="--dtypes"):
        cases.parse_dtypes("int8")
    assert cases.parse_ops("softmax,backward") == ["softmax", "softmax_backward", "log_softmax_backward"]

    selected = cases.build_cases(["softmax", "fused_topk"], ["fp16"], cases.parse_shapes("64x151936,8x8k2"),
                                 quick=False)
    assert [(c.op, c.rows, c.cols, c.k) for c in selected] == [
        ("softmax", 64, 151936, 0), ("softmax", 8, 8, 0), ("fused_topk", 64, 151936, 50), ("fused_topk", 8, 8, 2)]
    full = cases.build_cases(list(cases.ALL_OPS), list(cases.DEFAULT_DTYPES), None, quick=False)
    assert len(full) == 3 * (4 * 22 + 12)  # PERF.md: 22 sweep shapes x 4 ops + 12 fused_topk cases, 3 dtypes


def test_bench_out_dtype_times_the_dtype_pair_and_counts_its_bytes(tmp_path, capsys):
    # softmax(x_bf16, dtype=float32) reads 2 bytes and writes 4 per element; its backward reads float32
    # grad_output and output and writes the bfloat16 gradient (4 + 4 + 2).
    path = tmp_path / "mixed.json"
    status = bench_main(["--quick", "--device", "cpu", "--dtypes", "bf16", "--out-dtype", "float32", "--ops",
                         "softmax,log_softmax_backward", "--shapes", "8x100", "--json", str(path)])
    out = capsys.readouterr().out
    assert status == 0, out
    rows = json.loads(path.read_text())["rows"]
    assert {(row["op"], row["impl"]) for row in rows} == {
        (op, impl) for op in ("softmax", "log_softmax_backward") for impl in ("softmax_ops", "torch_eager")}
    for row in rows:
        assert row["dtype"] == "bf16" and row["out_dtype"] == "fp32" and "note" not in row, row
        moved = 8 * 100 * (2 + 4 if row["op"] == "softmax" else 4 + 4 + 2)
        assert row["gbps"] == pytest.approx(moved / (row["ms"] * 1e-3) / 1e9, rel=1e-3, abs=2e-3)
    assert "bf16->fp32" in out


def test_bench_out_dtype_cases():
    assert cases.parse_out_dtype("float32") == "fp32"
    assert cases.parse_out_dtype(None) is None
    with pytest.raises(ValueError, match="--out-dtype"):
        cases.parse_out_dtype("fp16,fp32")
    built = cases.build_cases(["softmax", "softmax_backward", "fused_topk"], ["fp16", "fp32"],
                              cases.parse_shapes("8x100,256x128k8"), quick=False, out_dtype_name="fp32")
    # fp32 -> fp32 is the plain case, and fused_topk's values are float32 whatever --out-dtype says.
    assert {(c.op, c.dtype_text) for c in built} == {
        ("softmax", "fp16->fp32"), ("softmax", "fp32"), ("softmax_backward", "fp16->fp32"),
        ("softmax_backward", "fp32"), ("fused_topk", "fp16"), ("fused_topk", "fp32")}
    forward, backward = (next(c for c in built if c.op == op and c.out_dtype_name) for op in
                         ("softmax", "softmax_backward"))
    assert (forward.stream_dtype, forward.result_dtype) == (torch.float16, torch.float32)
    assert (backward.stream_dtype, backward.result_dtype) == (torch.float32, torch.float16)


def test_bench_rejects_unknown_op(capsys):
    with pytest.raises(SystemExit) as error:
        bench_main(["--quick", "--device", "cpu", "--ops", "softmaxx"])
    assert error.value.code == 2
    assert "unknown op 'softmaxx'" in capsys.readouterr().err


def test_bench_timer_kinds(capsys):
    # The CUDA timer is chosen on the command line; an unknown one is a usage error, and make_timer names the
    # choices. On CPU every kind times with time.perf_counter.
    with pytest.raises(SystemExit) as error:
        bench_main(["--quick", "--device", "cpu", "--timer", "wallclock"])
    assert error.value.code == 2
    assert "invalid choice: 'wallclock'" in capsys.readouterr().err
    with pytest.raises(ValueError, match="unknown timer kind 'wallclock'.*events, do_bench"):
        make_timer(torch.device("cpu"), kind="wallclock")
    for kind in TIMER_KINDS:
        timer = make_timer(torch.device("cpu"), kind=kind)
        assert "time.perf_counter" in timer.description
        assert timer(lambda: torch.ones(4).sum()) > 0


def _busy_wait(seconds: float) -> None:
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        pass


@requires_cuda
def test_events_timer_times_the_gpu_work_not_a_slow_launch_path():
    # The events timer's reason to exist (session 36): a callable whose host side takes longer than the L2 flush
    # (torch.compile's wrappers: 64-134 us per call) must still read as its GPU work. Here the host busy-waits
    # 150 us (under the timer's 300 us spin) before queueing a GPU spin of ~10 us; the reading must be near the
    # spin's own time, measured back to back with plain events, and far from the host's 150 us.
    device = torch.device("cuda")
    timer = make_timer(device, kind="events")
    cycles = 20_000  # ~10 us at 1980 MHz (H100 / H200), longer at lower clocks
    torch.cuda._sleep(cycles)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(20):
        torch.cuda._sleep(cycles)
    end.record()
    end.synchronize()
    gpu_ms = start.elapsed_time(end) / 20

    def slow_host_then_gpu_spin() -> None:
        _busy_wait(150e-6)
        torch.cuda._sleep(cycles)

    fast = timer(lambda: torch.cuda._sleep(cycles))
    slow = timer(slow_host_then_gpu_spin)
    for reading in (fast, slow):
        assert 0.5 * gpu_ms < reading < 1.5 * gpu_ms + 0.005, (reading, gpu_ms)
    assert slow < 0.1, slow  # milliseconds: the host's 150 us is not in the reading


def test_make_readme_table_renders_markdown(tmp_path):
    def row(shape: str, impl: str, ms: float, xcopy: float) -> dict:
        return {"op": "softmax", "dtype": "fp16", "shape": shape, "impl": impl, "ms": ms, "gbps": 1.0,
                "xcopy": xcopy, "kernel": "warp" if impl == "softmax_ops" else None}

    document = {"gpu": "Test GPU", "torch": "2.11.0", "date": "2026-01-01", "timer": "t", "rows": [
        row("4x8", "softmax_ops", 1.0, 0.5), row("4x8", "torch_eager", 2.0, 0.25),
        row("8x8", "softmax_ops", 1.0, 2.0), row("8x8", "torch_eager", 4.0, 0.5),
    ]}
    path = tmp_path / "result.json"
    path.write_text(json.dumps(document))
    script = Path(__file__).resolve().parent.parent / "benchmarks" / "make_readme_table.py"
    result = subprocess.run([sys.executable, str(script), str(path)], check=False, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert "**Test GPU**" in result.stdout
    # geomean xCopy of 0.5 and 2.0 is 1.00, min 0.50, one shape >= 0.85; speedups 2x and 4x -> geomean 2.83x.
    assert "| softmax | fp16 | 2 | 1.00 | 0.50 | 1/2 | 2.83x | - |" in result.stdout
    assert "| 4x8 | 0.50 (2.00x / -) | warp |" in result.stdout


def test_bench_kernel_column_names_the_dispatchers_choice():
    families = {"softmax": "softmax", "softmax_backward": "softmax_backward", "fused_topk": "topk"}
    if not softmax_ops.list_kernels("softmax"):
        pytest.skip("CPU-only build: there is no CUDA kernel menu to name")
    cuda = torch.device("cuda")  # explain assumes an H100 when no GPU is visible, so this runs on CPU CI too
    for op, shape, k in [("softmax", (4096, 4096), 0), ("softmax", (4, 33554432), 0),
                         ("softmax_backward", (16384, 128), 0), ("fused_topk", (16384, 64), 6),
                         ("fused_topk", (64, 151936), 50)]:
        name = chosen_kernel(op, shape, torch.float16, k, cuda)
        assert name in softmax_ops.list_kernels(families[op]), (op, shape, name)
        assert f"kernel {name}" in softmax_ops.explain(shape, torch.float16, op=op, k=k).replace("'", "")
    assert chosen_kernel("softmax", (8, 8), torch.float32, 0, torch.device("cpu")) == "cpu"
