"""The benchmark tools that read committed bench JSON or profiler exports (no GPU, no torch): the A/B comparison,
the README table's refusal to merge files of different GPUs, and the Nsight Compute stall-sample summary; and the
vLLM gating probe's argument checks and selection comparison (CPU tensors)."""

import importlib.util
import json
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


def load_tool(name: str):
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while the class body runs
    spec.loader.exec_module(module)
    return module


def write_run(path: Path, gpu: str, rows: list[dict]) -> str:
    path.write_text(json.dumps({"gpu": gpu, "torch": "2.11.0", "rows": rows}))
    return str(path)


def row(op, dtype, shape, ratio, impl="softmax_ops", kernel="warp", k=None):
    entry = {"op": op, "dtype": dtype, "shape": shape, "impl": impl, "ms": 0.01, "gbps": 1.0, "kernel": kernel}
    entry["xsum" if op == "fused_topk" else "xcopy"] = ratio
    if k is not None:
        entry["k"] = k
    return entry


def test_compare_lists_every_run_of_both_sides_and_the_mean_change(tmp_path):
    compare_bench = load_tool("compare_bench")
    base = [write_run(tmp_path / f"base{i}.json", "H100", [
        row("softmax", "fp16", "2048x4096", ratio, kernel="block_onepass"),
        row("softmax", "fp16", "2048x4096", 9.0, impl="torch_eager"),  # a baseline row: ignored
        row("softmax", "bf16", "128x1024", 0.5),                       # measured by the base only
    ]) for i, ratio in enumerate([0.80, 0.90])]
    new = [write_run(tmp_path / f"new{i}.json", "H100", [
        row("softmax", "fp16", "2048x4096", ratio, kernel="block_onepass"),
        row("fused_topk", "fp16", "16384x64", 1.1, kernel="rows", k=6),
    ]) for i, ratio in enumerate([1.00, 0.96])]
    lines = compare_bench.compare(base, new)
    assert len(lines) == 1, lines
    fields = lines[0].split()
    assert fields[:3] == ["softmax", "fp16", "2048x4096"]
    assert fields[3:6] == ["base", "0.80", "0.90"] and fields[6:9] == ["new", "1.00", "0.96"]
    assert fields[9] == "+0.13" and fields[10] == "block_onepass"  # (1.00 + 0.96) / 2 - (0.80 + 0.90) / 2


def test_compare_keys_topk_cases_by_k_and_fails_without_common_cases(tmp_path, capsys):
    compare_bench = load_tool("compare_bench")
    base = write_run(tmp_path / "base.json", "H100", [row("fused_topk", "fp32", [64, 151936], 0.70, k=50)])
    new = write_run(tmp_path / "new.json", "H100", [row("fused_topk", "fp32", [64, 151936], 0.75, k=50),
                                                     row("fused_topk", "fp32", [64, 151936], 0.20, k=8)])
    lines = compare_bench.compare([base], [new])
    assert len(lines) == 1 and lines[0].split()[2] == "64x151936k50", lines
    other = write_run(tmp_path / "other.json", "H100", [row("softmax", "fp32", "8x8", 1.0)])
    assert compare_bench.main(["--base", base, "--new", other]) == 1
    assert "no case" in capsys.readouterr().err


def tune_run(path: Path, timings: list[dict]) -> str:
    """A tune_topk.py JSON file with one case (16384x64 k6 fp16) and the given timings."""
    case = {"shape": "16384x64", "k": 6, "dtype": "fp16", "megabytes": 2.0, "sum_ms": 0.009, "auto_kernel": "rows",
            "explain": "", "timings": timings, "faster_than_auto": []}
    path.write_text(json.dumps({"gpu": "H100", "torch": "2.11.0", "kernels": ["rows", "warp"], "rows": [case]}))
    return str(path)


def timing(kernel: str, xsum: float | None) -> dict:
    return {"kernel": kernel, "ms": None if xsum is None else 0.009 / xsum, "xsum": xsum, "error": None,
            "bound": None, "note": None if xsum is not None else "n/a"}


def test_compare_reads_tune_runs_one_line_per_timed_kernel(tmp_path):
    compare_bench = load_tool("compare_bench")
    base = tune_run(tmp_path / "base.json", [timing("auto", 0.90), timing("rows", 0.90), timing("warp", 0.50)])
    new = tune_run(tmp_path / "new.json", [timing("auto", 1.00), timing("rows", 1.00), timing("warp", None)])
    lines = compare_bench.compare([base], [new])
    assert [line.split()[0] for line in lines] == ["fused_topk:auto", "fused_topk:rows"], lines  # warp: not timed
    fields = lines[0].split()
    assert fields[1:3] == ["fp16", "16384x64k6"] and fields[4] == "0.90" and fields[6] == "1.00"
    assert fields[7] == "+0.10" and fields[8] == "rows"  # auto names the dispatcher's choice


def test_compare_by_time_lists_microseconds_and_the_relative_change(tmp_path):
    compare_bench = load_tool("compare_bench")
    base = tune_run(tmp_path / "base.json", [timing("auto", 0.90)])  # 0.009 ms / 0.90 = 10.0 us
    new = tune_run(tmp_path / "new.json", [timing("auto", 1.00)])  # 9.0 us
    fields = compare_bench.compare([base], [new], time=True)[0].split()
    assert fields[3:7] == ["base", "10.0", "new", "9.0"] and fields[7] == "-10.0%", fields
    bench = [write_run(tmp_path / f"bench{i}.json", "H100", [row("softmax", "fp16", "8x8", 1.0)]) for i in (0, 1)]
    fields = compare_bench.compare([bench[0]], [bench[1]], time=True)[0].split()
    assert fields[4] == "10.0" and fields[6] == "10.0" and fields[7] == "+0.0%", fields  # row(): 0.01 ms


def test_readme_table_refuses_files_of_different_gpus(tmp_path):
    make_readme_table = load_tool("make_readme_table")
    first = write_run(tmp_path / "a.json", "NVIDIA H100 80GB HBM3", [row("softmax", "fp16", "8x8", 1.0)])
    second = write_run(tmp_path / "b.json", "NVIDIA H200", [row("softmax", "fp16", "8x8", 1.0)])
    with pytest.raises(ValueError, match="H200"):
        make_readme_table.load([first, second])


def test_ncu_segments_cuts_after_barriers_and_lists_the_sampled_stretches(tmp_path):
    ncu_segments = load_tool("ncu_segments")
    header = ["Address", "Source", "Warp Stall Sampling (All Samples)", "Warp Stall Sampling (Not-issued Samples)",
              "Instructions Executed"]
    body = [  # offsets from 0x7f00: two stretches cut after the barrier, the second one tiny
        ("0x7f00", "LDG.E.128 R4, desc[UR4][R2.64]", 30, 8),
        ("0x7f10", "FADD R6, R4, R5", 50, 8),
        ("0x7f20", "@!P0 BAR.SYNC.DEFER_BLOCKING 0x0", 15, 8),
        ("0x7f30", "STG.E [R2.64], R6", 1, 8),
        ("0x7f40", "EXIT", 0, 8),
    ]
    path = tmp_path / "source.csv"
    lines = ['"Kernel Name","void my_kernel(float *)"', ",".join(f'"{h}"' for h in header)]
    lines += [",".join(f'"{v}"' for v in (a, s, n, n, e)) for a, s, n, e in body]
    path.write_text("\n".join(lines) + "\n")
    title, instructions = ncu_segments.read_source_csv(str(path))
    assert title == "void my_kernel(float *)" and [i.offset for i in instructions] == [0, 0x10, 0x20, 0x30, 0x40]
    assert [len(s) for s in ncu_segments.segments(instructions)] == [3, 2]
    out = ncu_segments.summary(title, instructions, min_share=0.05)
    assert out[1] == "total samples 96 warp instructions executed 40"
    assert len(out) == 3 and out[2].startswith("00000-00020 samples     95 (99.0%) exec       24 | 00010 FADD")


def test_compare_warns_when_the_sides_were_timed_differently(tmp_path, capsys):
    compare_bench = load_tool("compare_bench")
    cases = [row("softmax", "fp16", "128x1024", 0.8)]
    base = tmp_path / "base.json"
    base.write_text(json.dumps({"gpu": "H100", "timer": "do_bench", "rows": cases}))
    new = tmp_path / "new.json"
    new.write_text(json.dumps({"gpu": "H100", "timer": "events", "rows": cases}))
    assert compare_bench.timer_mismatch([str(base)], [str(base)]) is None
    assert compare_bench.main(["--base", str(base), "--new", str(new)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("WARNING: the runs were timed differently (base: do_bench; new: events)")
    assert out[1].split()[:3] == ["softmax", "fp16", "128x1024"]


def test_readme_table_names_each_files_timer_when_they_differ(tmp_path):
    table = load_tool("make_readme_table")
    first, second = tmp_path / "forward.json", tmp_path / "topk.json"
    first.write_text(json.dumps({"gpu": "H100", "timer": "events", "rows": [row("softmax", "fp16", "4x8", 0.9)]}))
    second.write_text(json.dumps({"gpu": "H100", "timer": "do_bench", "rows": [row("fused_topk", "fp16", "4x8", 0.8, k=2)]}))
    header, rows = table.load([str(first), str(second)])
    assert header["timer"] == "events (forward.json); do_bench (topk.json)" and len(rows) == 2
    header, _ = table.load([str(first)])
    assert header["timer"] == "events"


def test_vllm_probe_reads_router_cases_and_refuses_a_missing_source_before_building(tmp_path, monkeypatch, capsys):
    from softmax_ops._bench_cases import parse_shapes  # the probe parses its cases with the bench's parser

    probe = load_tool("vllm_gating_probe")
    assert parse_shapes(probe.DEFAULT_CASES)[-1] == (16384, 160, 6)
    refusals = {"16384x160": "1 <= k <= N", "16384k6": "ROWSxNkK", "ax64k6": "ROWSxNkK", "16384x64k0": "1 <= k <= N",
                "16384x64k65": "1 <= k <= N", "0x64k6": "ROWSxNkK"}
    for bad, message in refusals.items():  # refused before any build
        monkeypatch.setattr(sys, "argv", ["vllm_gating_probe.py", "--vllm-source", __file__, "--cases", bad])
        with pytest.raises(SystemExit) as exit_info:
            probe.main()
        assert exit_info.value.code == 2
        error = capsys.readouterr().err
        assert message in error and "--cases" in error, error
    missing = tmp_path / "topk_softmax_kernels.cu"
    monkeypatch.setattr(sys, "argv", ["vllm_gating_probe.py", "--vllm-source", str(missing)])
    with pytest.raises(SystemExit) as exit_info:
        probe.main()
    assert exit_info.value.code == 2
    assert "no such file" in capsys.readouterr().err


def test_vllm_probe_marks_selections_that_differ():
    import torch  # CPU tensors: the probe's comparison of two selections, no GPU

    probe = load_tool("vllm_gating_probe")
    values = torch.tensor([[0.5, 0.25], [0.6, 0.1]])
    indices = torch.tensor([[3, 1], [0, 2]])
    text, agree = probe.agreement((values, indices), (values.clone(), indices.int()))
    assert agree and "100.00% of rows" in text and "DIFFERS" not in text
    text, agree = probe.agreement((values, indices), (values.clone(), torch.tensor([[3, 1], [2, 0]], dtype=torch.int32)))
    assert not agree and "50.00% of rows" in text and text.endswith("DIFFERS")
    text, agree = probe.agreement((values, indices), (values * (1 + 1e-5), indices.int()))
    assert not agree and text.endswith("DIFFERS")
