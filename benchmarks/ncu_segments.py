#!/usr/bin/env python3
"""Where a kernel's stall samples sit, by barrier-delimited stretch of SASS, from an Nsight Compute source export.

Usage (on the GPU machine, after a profile with the SourceCounters section)::

    ncu -k regex:topk_block_kernel --section SourceCounters --section WarpStateStats -o rep \\
        python3 benchmarks/ncu_probe.py --shapes "" --dtypes fp16 --topk 1024x50000k50 --topk-values input
    ncu -i rep.ncu-rep --page source --csv --print-source sass > source.csv
    python3 benchmarks/ncu_segments.py source.csv

The SASS is cut after every instruction naming BAR (BAR.*, ERRBAR, ...), EXIT or WARPSYNC: in the block-family kernels each stretch is one
phase between CTA barriers (a tile's fold, its filter and append, the tile barrier, the final floor, ...).
Prints the total, then every stretch holding at least --min-share of the samples: its offsets, its share, the
warp instructions it executed and its three most-sampled instructions. Session 15's summaries
(benchmarks/results/*session15-c6-ncu-*-segments.txt) came from this. Standard library only.
"""

from __future__ import annotations

import argparse
import csv
import sys
from dataclasses import dataclass

CUT_AFTER = ("BAR", "EXIT", "WARPSYNC")


@dataclass
class Instruction:
    offset: int  # bytes from the kernel's first instruction
    text: str
    samples: int
    executed: int


def read_source_csv(path: str) -> tuple[str, list[Instruction]]:
    """The kernel's name and its instructions from `ncu --page source --csv --print-source sass` output (the
    first row names the kernel, the second holds the column titles)."""
    with open(path, newline="") as handle:
        rows = list(csv.reader(handle))
    if len(rows) < 3:
        raise ValueError(f"{path}: expected a kernel line, a header and instruction rows")
    title = next((cell for cell in rows[0] if cell.strip() and cell != "Kernel Name"), rows[0][0])
    header = rows[1]
    column = {name: header.index(name) for name in
              ("Address", "Source", "Warp Stall Sampling (All Samples)", "Instructions Executed")}
    base = int(rows[2][column["Address"]], 16)
    instructions = [
        Instruction(int(r[column["Address"]], 16) - base, r[column["Source"]].strip(),
                    int(r[column["Warp Stall Sampling (All Samples)"]] or 0),
                    int(r[column["Instructions Executed"]] or 0))
        for r in rows[2:] if len(r) == len(header)
    ]
    return title, instructions


def segments(instructions: list[Instruction]) -> list[list[Instruction]]:
    """The instructions cut after every barrier, exit and warp sync (the last stretch may be empty)."""
    out: list[list[Instruction]] = [[]]
    for instruction in instructions:
        out[-1].append(instruction)
        if any(cut in instruction.text for cut in CUT_AFTER):  # ERRBAR / CGAERRBAR (memory barriers) too
            out.append([])
    return [stretch for stretch in out if stretch]


def summary(title: str, instructions: list[Instruction], min_share: float = 0.01) -> list[str]:
    total = sum(i.samples for i in instructions)
    lines = [title[:160], f"total samples {total} warp instructions executed {sum(i.executed for i in instructions)}"]
    for stretch in segments(instructions):
        samples = sum(i.samples for i in stretch)
        if total == 0 or samples < min_share * total:
            continue
        top = sorted(stretch, key=lambda i: -i.samples)[:3]
        lines.append(
            f"{stretch[0].offset:05x}-{stretch[-1].offset:05x} samples {samples:6d} ({100 * samples / total:4.1f}%) "
            f"exec {sum(i.executed for i in stretch):8d} | "
            + " ; ".join(f"{i.offset:05x} {i.text[:40]} {i.samples}" for i in top))
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("source_csv", help="ncu --page source --csv --print-source sass output")
    parser.add_argument("--min-share", type=float, default=0.01, help="smallest share of the samples to list")
    args = parser.parse_args(argv)
    title, instructions = read_source_csv(args.source_csv)
    print("\n".join(summary(title, instructions, args.min_share)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
