"""What the benchmark measures: the shape tables of shared/PERF.md, the ops, and the bytes each case moves."""

from __future__ import annotations

from dataclasses import dataclass

import torch

# PERF.md's sweep (rows x N) for softmax, log_softmax and both backwards.
SEED_SHAPES: list[tuple[int, int]] = [
    (128, 1024), (2048, 1024), (2048, 2048), (2048, 4096), (2048, 8192),
    (4, 16384), (4, 32768), (4, 65536), (4, 114688), (4, 262144),
    (4, 1048576), (4, 8388608), (4, 33554432),
    (4096, 4096), (2048, 131072),
]
MODEL_SHAPES: list[tuple[int, int]] = [
    (32768, 2048),               # attention scores
    (16384, 128), (65536, 64),   # MoE routers
    (64, 151936), (8, 262144),   # vocabularies
    (1000, 1000), (3, 100003),   # odd sizes
]
SWEEP_SHAPES: list[tuple[int, int]] = SEED_SHAPES + MODEL_SHAPES

# PERF.md's fused_topk list: (rows, N, k).
TOPK_CASES: list[tuple[int, int, int]] = [
    (256, 128, 8), (16384, 8, 2), (16384, 64, 6), (16384, 128, 8), (65536, 256, 8), (4096, 60, 4),
    (16384, 160, 6), (16384, 512, 8), (1024, 50000, 50), (1, 128256, 50), (64, 151936, 50),
    (8, 262144, 1024),
]

# `--quick`: a handful of small shapes that run in seconds on a CPU, covering the same regimes
# (tiny rows, square, few long rows, odd N, routers).
QUICK_SHAPES: list[tuple[int, int]] = [(128, 1024), (1000, 1000), (4, 16384), (2048, 64)]
QUICK_TOPK_CASES: list[tuple[int, int, int]] = [(256, 128, 8), (4096, 60, 4), (16, 50000, 50)]

SOFTMAX_LIKE_OPS = ("softmax", "log_softmax")
BACKWARD_OPS = ("softmax_backward", "log_softmax_backward")
TOPK_OP = "fused_topk"
ALL_OPS = (*SOFTMAX_LIKE_OPS, *BACKWARD_OPS, TOPK_OP)

DTYPES: dict[str, torch.dtype] = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}
DTYPE_ALIASES: dict[str, str] = {
    "float16": "fp16", "half": "fp16", "bfloat16": "bf16", "float32": "fp32", "float": "fp32",
}
DEFAULT_DTYPES = ("fp16", "bf16", "fp32")

# The fused_topk eager reference computes the softmax in fp32 (`torch.softmax(x, -1, dtype=torch.float32)`),
# so ours is asked for the same result dtype: values are fp32, indices int64.
TOPK_VALUE_BYTES = 4
TOPK_INDEX_BYTES = 8


@dataclass(frozen=True)
class Case:
    """One benchmark row: an op on a (rows, cols) tensor of ``dtype`` reduced over the last dim.

    ``out_dtype_name`` (``--out-dtype``) is the ``dtype=`` of ``softmax(x, -1, dtype=...)`` where it differs from
    x's dtype: the forward then writes it, and the backward ops run that forward's backward (grad_output and
    output in it, the gradient in x's dtype). None for fused_topk, whose values are float32 anyway.
    """

    op: str
    dtype_name: str
    rows: int
    cols: int
    k: int = 0
    out_dtype_name: str | None = None

    @property
    def dtype(self) -> torch.dtype:
        return DTYPES[self.dtype_name]

    @property
    def out_dtype(self) -> torch.dtype:
        """The forward's result dtype (x's dtype unless ``out_dtype_name`` says otherwise)."""
        return DTYPES[self.out_dtype_name or self.dtype_name]

    @property
    def stream_dtype(self) -> torch.dtype:
        """The dtype of the tensors the op reads: x for the forward ops, grad_output and output for a backward."""
        return self.out_dtype if self.op in BACKWARD_OPS else self.dtype

    @property
    def result_dtype(self) -> torch.dtype:
        """The dtype the op writes: the forward's result, or the backward's gradient (x's dtype)."""
        return self.dtype if self.op in BACKWARD_OPS else self.out_dtype

    @property
    def dtype_argument(self) -> torch.dtype | None:
        """The forward's ``dtype=`` argument: None for the plain call the sweep has always timed."""
        return self.out_dtype if self.out_dtype_name else None

    @property
    def explain_out_dtype(self) -> torch.dtype | None:
        """``softmax_ops.explain``'s ``out_dtype`` for this case (its ``dtype`` is :attr:`stream_dtype`)."""
        return self.result_dtype if self.out_dtype_name else None

    @property
    def stream_element_size(self) -> int:
        """Bytes per element of the tensors the op reads."""
        return _element_size(self.stream_dtype)

    @property
    def dtype_text(self) -> str:
        """``bf16``, or ``bf16->fp32`` for a case with a different result dtype."""
        return f"{self.dtype_name}->{self.out_dtype_name}" if self.out_dtype_name else self.dtype_name

    @property
    def shape(self) -> tuple[int, int]:
        return (self.rows, self.cols)

    @property
    def shape_text(self) -> str:
        return f"{self.rows}x{self.cols}"

    @property
    def numel(self) -> int:
        return self.rows * self.cols

    @property
    def element_size(self) -> int:
        return _element_size(self.dtype)

    @property
    def bytes_moved(self) -> int:
        """The bytes the op must move at minimum (the roofline numerator for GB/s).

        softmax: read N + write N; backward: read grad and output + write grad input (each in its own dtype);
        fused_topk: read the logits + write k values and k indices per row.
        """
        read = self.numel * self.stream_element_size
        if self.op in SOFTMAX_LIKE_OPS:
            return read + self.numel * _element_size(self.result_dtype)
        if self.op in BACKWARD_OPS:
            return 2 * read + self.numel * _element_size(self.result_dtype)
        return read + self.rows * self.k * (TOPK_VALUE_BYTES + TOPK_INDEX_BYTES)

    @property
    def reference_name(self) -> str:
        """The bandwidth yardstick this row is compared with: ``xcopy`` or, for fused_topk, ``xsum``."""
        return "xsum" if self.op == TOPK_OP else "xcopy"

    def device_bytes_needed(self) -> int:
        """A generous estimate of the device memory this case needs (inputs, outputs of every impl, the
        float64 reference), to skip shapes that do not fit rather than die with an out-of-memory error."""
        tensor_bytes = self.numel * max(self.element_size, _element_size(self.out_dtype))
        fp64_bytes = self.numel * 8
        # The float64 reference plus the two float64 temporaries of an error check are the peak.
        if self.op == TOPK_OP:
            return 3 * tensor_bytes + 3 * self.numel * 4 + 3 * fp64_bytes
        if self.op in BACKWARD_OPS:
            return 7 * tensor_bytes + 4 * fp64_bytes
        return 5 * tensor_bytes + 3 * fp64_bytes

    def label(self) -> str:
        text = f"{self.op} {self.dtype_text} {self.shape_text}"
        return f"{text} k{self.k}" if self.op == TOPK_OP else text


def _element_size(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def parse_shapes(text: str) -> list[tuple[int, int, int]]:
    """Parse ``"4096x4096,4x262144,64x151936k50"`` into ``(rows, cols, k)`` triples (k is 0 when absent).

    Example:
        >>> parse_shapes("4096x4096, 64x151936k50")
        [(4096, 4096, 0), (64, 151936, 50)]
    """
    shapes = []
    for item in filter(None, (part.strip().lower() for part in text.split(","))):
        dims, _, k_text = item.partition("k")
        rows_text, sep, cols_text = dims.partition("x")
        try:
            rows, cols, k = int(rows_text), int(cols_text), int(k_text or 0)
        except ValueError:
            raise ValueError(f"--shapes: cannot parse {item!r} (expected ROWSxN or ROWSxNkK)") from None
        if not sep or rows <= 0 or cols <= 0 or k < 0:
            raise ValueError(f"--shapes: cannot parse {item!r} (expected ROWSxN or ROWSxNkK, all positive)")
        shapes.append((rows, cols, k))
    return shapes


def parse_dtypes(text: str) -> list[str]:
    """Parse ``"fp16,bfloat16"`` into canonical dtype names (``fp16``, ``bf16``, ``fp32``)."""
    names = []
    for item in filter(None, (part.strip().lower() for part in text.split(","))):
        name = DTYPE_ALIASES.get(item, item)
        if name not in DTYPES:
            raise ValueError(f"--dtypes: unknown dtype {item!r} (choose from {', '.join(DTYPES)})")
        names.append(name)
    return names


def parse_ops(text: str) -> list[str]:
    """Parse ``"softmax,fused_topk"``; ``backward`` stands for both backward ops."""
    ops: list[str] = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        expanded = BACKWARD_OPS if item == "backward" else (item,)
        for op in expanded:
            if op not in ALL_OPS:
                raise ValueError(f"--ops: unknown op {op!r} (choose from {', '.join(ALL_OPS)}, backward)")
            if op not in ops:
                ops.append(op)
    return ops


def parse_out_dtype(text: str | None) -> str | None:
    """Parse ``--out-dtype`` (one dtype name or alias); None when absent.

    Example:
        >>> parse_out_dtype("float32")
        'fp32'
    """
    if text is None:
        return None
    name = DTYPE_ALIASES.get(text.strip().lower(), text.strip().lower())
    if name not in DTYPES:
        raise ValueError(f"--out-dtype: unknown dtype {text!r} (choose one of {', '.join(DTYPES)})")
    return name


def build_cases(
    ops: list[str], dtype_names: list[str], shapes: list[tuple[int, int, int]] | None, quick: bool,
    out_dtype_name: str | None = None,
) -> list[Case]:
    """Every (op, dtype, shape) row to run, in table order.

    ``shapes`` (from ``--shapes``) replaces the sweep for the softmax ops; for fused_topk it selects the
    table's cases with the same rows x N (any k), or runs ``ROWSxNkK`` entries as given. ``out_dtype_name``
    gives the softmax-family cases of every other dtype that result dtype (see :class:`Case`); a dtype equal
    to it runs as usual.
    """
    softmax_shapes = QUICK_SHAPES if quick else SWEEP_SHAPES
    topk_cases = QUICK_TOPK_CASES if quick else TOPK_CASES
    if shapes is not None:
        softmax_shapes = [(rows, cols) for rows, cols, _ in shapes]
        table = QUICK_TOPK_CASES + [case for case in TOPK_CASES if case not in QUICK_TOPK_CASES]
        selected: list[tuple[int, int, int]] = []
        for rows, cols, k in shapes:
            matches = [(rows, cols, k)] if k else [case for case in table if case[:2] == (rows, cols)]
            selected += [case for case in matches if case not in selected]
        topk_cases = selected
    cases = []
    for op in ops:
        for dtype_name in dtype_names:
            if op == TOPK_OP:
                cases += [Case(op, dtype_name, rows, cols, k) for rows, cols, k in topk_cases if k <= cols]
            else:
                out = out_dtype_name if out_dtype_name != dtype_name else None
                cases += [Case(op, dtype_name, rows, cols, out_dtype_name=out) for rows, cols in softmax_shapes]
    return cases
