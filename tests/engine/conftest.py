"""Fixtures for the engine tests: tiny synthetic models written once per module, engines on them."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

import ds4  # noqa: E402
import ds4._core as _core  # noqa: E402
import ds4.testing  # noqa: E402


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return ds4.testing.write_model(tmp_path_factory.mktemp("tiny") / "tiny.gguf", "tiny", experts="q2", seed=0)


@pytest.fixture(scope="module")
def tiny_engine(tiny_path: Path) -> "ds4.Engine":
    return ds4.Engine(tiny_path, threads=2)


@pytest.fixture
def kernel_path(request: pytest.FixtureRequest):
    """The CPU SIMD path named by the test's indirect parameter, restored afterwards."""
    before = _core.simd_path()
    _core.set_simd_path(request.param)
    yield request.param
    _core.set_simd_path(before)
