"""`--plot`: achieved GB/s and xCopy (xSum for fused_topk) per shape, ours vs torch eager vs torch.compile."""

from __future__ import annotations

import importlib.util

PLOTTED_IMPLS = ("softmax_ops", "torch_eager", "torch_compile")
MISSING_MATPLOTLIB = (
    "--plot needs matplotlib, which is not installed: pip install matplotlib "
    "(or install softmax_ops with the plot extra: pip install \".[plot]\")"
)


def matplotlib_available() -> bool:
    """Whether matplotlib can be imported (checked before a long run, not after it)."""
    try:
        return importlib.util.find_spec("matplotlib") is not None
    except ValueError:  # a module entry set to None, e.g. to simulate its absence
        return False


def plot_rows(rows: list[dict], path: str, title: str) -> None:
    """Write a PNG with one line of two panels (GB/s, xCopy/xSum) per (op, dtype) found in ``rows``.

    ``rows`` are the benchmark's JSON rows (``op``, ``dtype``, ``shape``, ``k``, ``impl``, ``gbps``, and
    ``xcopy`` or ``xsum``).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups: dict[tuple[str, str], list[dict]] = {}
    for row in rows:
        if row.get("impl") in PLOTTED_IMPLS and row.get("gbps") is not None:
            dtype = f"{row['dtype']}->{row['out_dtype']}" if row.get("out_dtype") else row["dtype"]
            groups.setdefault((row["op"], dtype), []).append(row)
    if not groups:
        raise ValueError("--plot: no timed rows to plot")
    figure, axes = plt.subplots(len(groups), 2, figsize=(16, 3.2 * len(groups)), squeeze=False)
    width = 0.8 / len(PLOTTED_IMPLS)
    for line, ((op, dtype), group) in enumerate(groups.items()):
        labels = list(dict.fromkeys(_label(row) for row in group))
        ratio_key, ratio_label = ("xsum", "xSum") if op == "fused_topk" else ("xcopy", "xCopy")
        for column, (key, ylabel) in enumerate((("gbps", "GB/s"), (ratio_key, ratio_label))):
            axis = axes[line][column]
            present = [impl for impl in PLOTTED_IMPLS if any(row["impl"] == impl for row in group)]
            for offset, impl in enumerate(present):
                values = {_label(row): row.get(key) for row in group if row["impl"] == impl}
                heights = [values.get(label) or 0.0 for label in labels]
                positions = [i + (offset - (len(present) - 1) / 2) * width for i in range(len(labels))]
                axis.bar(positions, heights, width, label=impl)
            if key == ratio_key:
                axis.axhline(1.0, color="black", linewidth=0.8)
                axis.axhline(0.85, color="grey", linewidth=0.8, linestyle="--")
            axis.set_xticks(range(len(labels)))
            axis.set_xticklabels(labels, rotation=60, ha="right", fontsize=7)
            axis.set_ylabel(ylabel)
            axis.set_title(f"{op} {dtype}: {ylabel}")
            axis.legend(fontsize=7)
    figure.suptitle(title)
    figure.tight_layout(rect=(0, 0, 1, 1 - 0.5 / figure.get_figheight()))  # leave room for the title
    figure.savefig(path, dpi=110)
    plt.close(figure)


def _label(row: dict) -> str:
    return f"{row['shape']} k{row['k']}" if row.get("k") else row["shape"]
