"""Shared pieces of the backend-ops suite (our test-backend-ops): the backends under test, the
CPU scalar reference they are all compared with, input generators and the comparison checks.

Backends under test: every backend of the registry that is available here, and — until a GPU
backend exists — every SIMD path of the CPU backend (AVX2, AVX-512, AVX-512 VNNI, NEON) run as a
backend through the same interface. The reference is the CPU backend on the scalar path, which
reproduces upstream's strict CPU build bit for bit (tests/engine/test_engine_upstream.py).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parent.parent))   # tests/: the quant block generators

import ds4  # noqa: E402
import ds4._core as core  # noqa: E402

import pytest  # noqa: E402

# The ops each test of test_ops_vs_cpu.py runs (test_<op> runs <op>).
_OPS_OF_TEST = {"test_add_fill_copy_argmax": ("add", "fill", "copy", "argmax")}
# Ops a backend may leave out (the forward pass has a fallback): their tests check the refusal.
_OPTIONAL_OPS = {"attention_block"}


@pytest.fixture(autouse=True)
def _backend_runs_the_op(request):
    """A backend under test that does not run a test's op: xfail while the op is not ported yet
    (supports() is False even for F32), skip for a weight type it has no kernel for (its refusal is
    checked by test_metal_emu.py). Everything it supports is compared in full."""
    callspec = getattr(request.node, "callspec", None)
    if callspec is None or callspec.params.get("h") is None:
        return
    h, name = callspec.params["h"], callspec.params["name"]
    test = request.node.originalname
    ops = _OPS_OF_TEST.get(test, (test[len("test_"):],))
    types = [int(callspec.params[k]) for k in ("qtype", "gate_type", "down_type") if k in callspec.params]
    for op in ops:
        if op not in core.op_names():
            return
        if not h.supports(op, 0):
            if op in _OPTIONAL_OPS:
                return
            pytest.xfail(f"{name}: {op} is not ported yet")
        for t in types:
            if not h.supports(op, t):
                pytest.skip(f"{name} has no {op} kernel for GGML type {t} (supports() is False)")
