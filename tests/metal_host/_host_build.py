"""Builds small C++ test drivers with the host C++ compiler (the one that builds the extension:
$CXX, else c++/g++/clang++ on PATH) into a shared library for ctypes."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def host_cxx() -> str | None:
    for name in (os.environ.get("CXX"), "c++", "g++", "clang++"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


def build_shared(sources: list[Path], out: Path, include: list[Path] = ()) -> Path:
    cxx = host_cxx()
    if cxx is None:
        raise RuntimeError("no C++ compiler on PATH (set CXX)")
    cmd = [cxx, "-std=c++17", "-O1", "-shared", "-fPIC", "-Wall", "-Werror", "-I", str(ROOT / "csrc")]
    for d in include:
        cmd += ["-I", str(d)]
    cmd += [*map(str, sources), "-o", str(out)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{r.stderr}")
    return out
