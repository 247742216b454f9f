"""The arm64 NEON kernels, on an x86 machine: cross-compile the portable core + dot_neon.cpp with
tests/native/kernels_selftest.cpp and run it under qemu user emulation (the selftest compares
NEON with the scalar kernels: exact on integer-valued cases, within the derived float bound
otherwise; see that file). Skipped where the cross toolchain or qemu is not installed
(Debian: g++-aarch64-linux-gnu, qemu-user-static).
"""

from __future__ import annotations

import platform
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CXX = shutil.which("aarch64-linux-gnu-g++")
QEMU = shutil.which("qemu-aarch64-static") or shutil.which("qemu-aarch64")

pytestmark = pytest.mark.skipif(
    platform.machine() not in ("x86_64", "AMD64") or CXX is None or QEMU is None,
    reason="needs an x86-64 host with aarch64-linux-gnu-g++ and qemu-aarch64",
)


def _sources() -> list[str]:
    quant = [p for p in sorted((ROOT / "csrc" / "quant").glob("*.cpp")) if not p.stem.endswith(("_avx2", "_avx512", "_avx512vnni"))]
    common = sorted((ROOT / "csrc" / "common").glob("*.cpp"))
    return [str(p) for p in quant + common] + [str(ROOT / "tests" / "native" / "kernels_selftest.cpp")]


def test_neon_kernels_match_scalar_under_qemu(tmp_path):
    exe = tmp_path / "selftest"
    flags = ["-O2", "-std=c++17", "-ffp-contract=off", "-Wall", "-Wextra", "-Wno-unused-parameter", "-Werror",
             "-DDS4_ARCH_ARM64=1", "-march=armv8.2-a+dotprod+fp16", "-static", f"-I{ROOT / 'csrc'}"]
    build = subprocess.run([CXX, *flags, *_sources(), "-o", str(exe), "-lpthread"], capture_output=True, text=True)
    assert build.returncode == 0, build.stderr[-4000:]
    run = subprocess.run([QEMU, str(exe)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert "paths available: scalar neon" in run.stdout
    assert " 0 failures" in run.stdout
