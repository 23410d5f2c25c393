"""The runnable examples in the public docstrings stay runnable and right."""

from __future__ import annotations

import doctest

import pytest

import softmax_ops.kernels
import softmax_ops.ops


@pytest.mark.parametrize("module", [softmax_ops.ops, softmax_ops.kernels], ids=lambda m: m.__name__)
def test_docstring_examples(module):
    result = doctest.testmod(module, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0, f"{module.__name__} has no examples"
    assert result.failed == 0
