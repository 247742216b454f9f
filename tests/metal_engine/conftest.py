"""The whole Metal graph through the emulator (`Engine(path, backend="metal-emu")`) against the CPU
engine on the tiny synthetic models. Skipped, saying why, where the emulator cannot be built (no
clang) or this build has no metal-emu backend.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parent.parent / "engine"))   # _compare: the engine tests' statistics
sys.path.insert(0, str(Path(__file__).parent.parent))   # _gpu_backends: metal-emu, or metal on a Mac

import ds4  # noqa: E402
import ds4.testing  # noqa: E402
from _gpu_backends import metal_under_test  # noqa: E402

METAL = metal_under_test()   # "metal-emu"; "metal" with DS4_TEST_BACKENDS=metal (the real GPU)


def metal_emu_reason() -> str:
    for b in ds4.available_backends():
        if b.name == METAL:
            return "" if b.available else b.reason
    return f"this build has no {METAL} backend"


@pytest.fixture(scope="session", autouse=True)
def _need_metal_emu():
    reason = metal_emu_reason()
    if reason:
        pytest.skip(f"{METAL} unavailable: {reason}")


@pytest.fixture(scope="session")
def model_path():
    """Paths of the tiny models (written once per machine into ds4.testing's cache)."""
    def get(preset: str, experts: str, mtp: bool = False) -> Path:
        return ds4.testing.cached_model(preset, experts=experts, mtp=mtp)
    return get
