"""The runnable examples in the docstrings of the inspection/layout/testing/stages/backends modules."""

from __future__ import annotations

import doctest
import importlib

import pytest

MODULES = ["ds4.layout", "ds4.memory_plan", "ds4.inspection", "ds4.testing", "ds4.stages", "ds4.backends"]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name, tmp_path, monkeypatch):
    monkeypatch.setenv("DS4_CACHE_DIR", str(tmp_path))
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0
