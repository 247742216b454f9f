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
