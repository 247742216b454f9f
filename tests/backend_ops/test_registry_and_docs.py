"""The backend registry seen from Python, and docs/architecture.md's example."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import ds4
import ds4._core as core
import ds4.testing

DOC = Path(__file__).resolve().parents[2] / "docs" / "architecture.md"


def test_registry_lists_every_backend_with_a_reason_when_unavailable():
    backends = ds4.available_backends()
    names = [b.name for b in backends]
    # GPUs first, then the CPU; the emulator after the CPU so that "auto" never picks it.
    assert names == ["metal", "cuda", "cpu", "metal-emu"]
    for b in backends:
        assert b.available or b.reason.startswith(f"{b.name}: ")


def test_engine_backend_choice(tmp_path):
    path = ds4.testing.default_model_path()
    assert ds4.Engine(path, threads=1).backend == "cpu"            # auto
    assert ds4.Engine(path, backend="cpu", threads=1).backend == "cpu"
    for bad in ("metal", "cuda", "tpu"):
        with pytest.raises(ds4.UnsupportedModelError, match="available: cpu"):
            ds4.Engine(path, backend=bad)


def test_cpu_backend_supports_every_op_on_every_weight_type():
    h = core.OpHarness("cpu", "scalar", 1)
    for op in core.op_names():
        for qtype in (0, 1, 8, 10, 12, 16, 30):               # F32 F16 Q8_0 Q2_K Q4_K IQ2_XXS BF16
            assert h.supports(op, qtype)
        assert not h.supports(op, 15)                          # Q8_K is an activation format only


def test_architecture_doc_example_runs():
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S)
    assert blocks
    for block in blocks:
        exec(compile(block, str(DOC), "exec"), {"ds4": ds4})
