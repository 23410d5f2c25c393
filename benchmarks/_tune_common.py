"""What tune_softmax.py and tune_topk.py share: check a forced kernel's result against float64, then time it,
turning failures into a note; and write the measurements as JSON. Standard library only (no torch import)."""

from __future__ import annotations

import json
import os
from dataclasses import asdict
from typing import NamedTuple


class Checked(NamedTuple):
    """One implementation on one case: its time (None when not timed), accuracy, and why it was not timed."""

    ms: float | None
    error: float | None
    bound: float | None
    note: str | None


def check_then_time(fn, check, timer, cannot_phrases: tuple[str, ...], with_reason: bool, limit: int) -> Checked:
    """Runs fn once and checks its result (check returns an object with ok, error, bound, describe()); times
    it only when right. An exception whose text has one of cannot_phrases is a kernel refusing the shape:
    note "n/a" (with the first line of the message when with_reason); other exceptions are "error: ...".
    One kernel failing must not end a sweep, so nothing is raised."""
    try:
        result = check(fn())
    except Exception as error:  # noqa: BLE001
        message = str(error).splitlines()[0] if str(error) else type(error).__name__
        if any(phrase in str(error) for phrase in cannot_phrases):
            return Checked(None, None, None, "n/a: " + message[:limit] if with_reason else "n/a")
        return Checked(None, None, None, f"error: {type(error).__name__}: {message[:limit]}")
    if not result.ok:
        return Checked(None, result.error, result.bound, f"WRONG: {result.describe()}")
    return Checked(timer(fn), result.error, result.bound, None)


def write_json(path: str, payload: dict, rows: list) -> None:
    """payload plus "rows" (dataclasses) as indented JSON at path, creating its folder."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as handle:
        json.dump({**payload, "rows": [asdict(row) for row in rows]}, handle, indent=1)
        handle.write("\n")
