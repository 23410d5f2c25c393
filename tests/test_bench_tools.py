"""The benchmark tools that read committed bench JSON (no GPU, no torch): the A/B comparison and the README
table's refusal to merge files of different GPUs."""

import importlib.util
import json
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


def load_tool(name: str):
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
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


def test_readme_table_refuses_files_of_different_gpus(tmp_path):
    make_readme_table = load_tool("make_readme_table")
    first = write_run(tmp_path / "a.json", "NVIDIA H100 80GB HBM3", [row("softmax", "fp16", "8x8", 1.0)])
    second = write_run(tmp_path / "b.json", "NVIDIA H200", [row("softmax", "fp16", "8x8", 1.0)])
    with pytest.raises(ValueError, match="H200"):
        make_readme_table.load([first, second])
