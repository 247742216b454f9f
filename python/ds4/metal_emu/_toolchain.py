"""Finding a clang that compiles MSL-as-C++17 (it needs _Float16 on x86-64, so clang >= 15).

Order: ``$DS4_METAL_EMU_CXX`` (a command line), a system ``clang++`` of a recent enough version,
then the ``ziglang`` wheel (clang 22 inside; the test extra installs it). The first compile with
ziglang builds zig's C++ runtime into zig's own cache (~/.cache/zig), about a minute on 2 cores;
later compiles reuse it.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass

__all__ = ["Compiler", "find_compiler", "MIN_CLANG"]

MIN_CLANG = 15


@dataclass(frozen=True)
class Compiler:
    argv: tuple[str, ...]
    version: str       # the --version banner's first line (part of the build cache key)
    origin: str        # "env", "system" or "ziglang"


def _version(argv: list[str]) -> str | None:
    try:
        r = subprocess.run(argv + ["--version"], capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.SubprocessError):
        return None
    if r.returncode != 0:
        return None
    text = r.stdout.strip() or r.stderr.strip()
    return text.splitlines()[0] if text else None


def _clang_major(banner: str) -> int:
    m = re.search(r"clang version (\d+)", banner)
    return int(m.group(1)) if m else 0


@functools.lru_cache(maxsize=None)
def find_compiler() -> Compiler | None:
    """The compiler the emulator uses, or None (then its tests skip and say why)."""
    env = os.environ.get("DS4_METAL_EMU_CXX")
    if env:
        argv = shlex.split(env)
        v = _version(argv)
        return Compiler(tuple(argv), v, "env") if v else None
    for name in ["clang++"] + [f"clang++-{v}" for v in range(22, MIN_CLANG - 1, -1)]:
        path = shutil.which(name)
        if path:
            v = _version([path])
            if v and _clang_major(v) >= MIN_CLANG:
                return Compiler((path,), v, "system")
    if importlib.util.find_spec("ziglang") is None:
        return None
    argv = [sys.executable, "-m", "ziglang", "c++"]
    v = _version(argv)
    return Compiler(tuple(argv), v, "ziglang") if v else None


def missing_message() -> str:
    env = os.environ.get("DS4_METAL_EMU_CXX")
    if env:
        return f"no clang for the Metal emulator: DS4_METAL_EMU_CXX={env!r} does not run '--version'"
    return ("no clang for the Metal emulator: install the test extra (pip install -e '.[test]' brings the "
            f"ziglang wheel), a system clang++ >= {MIN_CLANG}, or set DS4_METAL_EMU_CXX")
