"""Where the build finds its sources and the fake implementations: a source checkout vs an installed package."""

from __future__ import annotations

from pathlib import Path

from softmax_ops._build import checkout_root


def _touch(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("")


def test_installed_package_ignores_unrelated_top_level_meta_and_csrc(tmp_path):
    # site-packages with softmax_ops installed beside someone else's `meta` package (there is one on PyPI)
    # and a stray `csrc` folder: neither may be taken for our sources or our fake implementations.
    site = tmp_path / "site-packages"
    _touch(site / "softmax_ops" / "__init__.py")
    _touch(site / "meta" / "__init__.py")
    assert checkout_root(site / "softmax_ops") is None
    _touch(site / "csrc" / "other.cpp")
    assert checkout_root(site / "softmax_ops") is None


def test_source_checkout_is_recognised(tmp_path):
    _touch(tmp_path / "softmax_ops" / "__init__.py")
    _touch(tmp_path / "meta" / "__init__.py")
    _touch(tmp_path / "csrc" / "registration.cpp")
    assert checkout_root(tmp_path / "softmax_ops") == tmp_path
    # These tests run from the repository itself.
    assert checkout_root() == Path(__file__).resolve().parent.parent
