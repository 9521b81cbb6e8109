"""Lazy package exports: a name is imported from its module when first used, then found without the hook."""

from __future__ import annotations

import sys
import types

import pytest

from ddslurm.config import lazy_exports


def test_a_name_is_imported_when_first_used_and_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    package = types.ModuleType("lazy_pkg")
    monkeypatch.setitem(sys.modules, "lazy_pkg", package)
    monkeypatch.delitem(sys.modules, "colorsys", raising=False)
    getattr_, dir_ = lazy_exports("lazy_pkg", {"rgb_to_hsv": "colorsys"}, ["rgb_to_hsv"])
    assert "colorsys" not in sys.modules
    value = getattr_("rgb_to_hsv")
    assert "colorsys" in sys.modules and value is sys.modules["colorsys"].rgb_to_hsv
    assert package.rgb_to_hsv is value  # kept: the hook is not asked again
    assert dir_() == ["rgb_to_hsv"]
    with pytest.raises(AttributeError, match="'lazy_pkg' has no attribute 'other'"):
        getattr_("other")
