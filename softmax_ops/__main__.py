"""`python -m softmax_ops [options]` runs the demo; `python -m softmax_ops bench [options]` the benchmark."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    """Dispatch to the demo (default, or ``demo``) or the benchmark (``bench``); returns the exit status.

    Example:
        >>> main(["bench", "--quick", "--ops", "softmax", "--dtypes", "fp32"])  # doctest: +SKIP
        0
    """
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] == "bench":
        from softmax_ops import bench

        return bench.main(args[1:])
    if args and args[0] == "demo":
        args = args[1:]
    from softmax_ops import demo

    return demo.main(args)


if __name__ == "__main__":
    sys.exit(main())
