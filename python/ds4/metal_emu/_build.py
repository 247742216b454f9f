"""Compiling metal/*.metal and the SIMT runtime into one cached shared library.

Each .metal file becomes one translation unit (its rewritten source plus generated thunks); every
object is cached under ``<ds4 cache>/metal-emu/obj`` by a hash of everything that goes into it
(compiler banner, flags, shim and runtime sources, the unit's text), so editing one kernel file
recompiles one unit. The linked library is cached by the hash of its objects.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from .._paths import cache_dir
from ..errors import Ds4Error
from ._source import MetalFile, MetalSourceError, parse_metal, translation_unit
from ._toolchain import Compiler

__all__ = ["BuildError", "metal_dir", "build_library", "CXXFLAGS"]

# -ffloat16-excess-precision=none: every half operation rounds to half, as on the GPU (clang's
# default would keep float intermediates). -ffp-contract=off: no implicit FMA, so results do not
# depend on the host CPU (tests compare with the GPU's possible fusions inside their tolerances).
CXXFLAGS = ("-std=c++17", "-O2", "-fPIC", "-fvisibility=hidden", "-ffp-contract=off",
            "-Xclang", "-ffloat16-excess-precision=none", "-Wno-unknown-attributes", "-Wno-unknown-pragmas",
            "-Wno-c99-designator", "-Wno-user-defined-literals", "-g0")


class BuildError(Ds4Error):
    """The emulator library could not be built (compiler output included)."""


def metal_dir() -> Path:
    """The folder holding the .metal sources and emu/: ``$DS4_METAL_DIR``, else the checkout's
    metal/, else the installed package's ds4/metal/ (the wheel ships them, CMakeLists.txt)."""
    env = os.environ.get("DS4_METAL_DIR")
    if env:
        return Path(env)
    checkout = Path(__file__).resolve().parents[3] / "metal"
    return checkout if checkout.is_dir() else Path(__file__).resolve().parents[1] / "metal"


def _sha(*parts: bytes | str) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(p.encode() if isinstance(p, str) else p)
        h.update(b"\0")
    return h.hexdigest()[:24]


def _run(argv: list[str], what: str) -> None:
    r = subprocess.run(argv, capture_output=True, text=True)
    if r.returncode != 0:
        raise BuildError(f"compiling {what} failed ({' '.join(argv[:4])} ...):\n{(r.stderr or r.stdout)[-6000:]}")


def _compile(cc: Compiler, src_text: str, name: str, key: str, obj_dir: Path, root: Path) -> Path:
    obj = obj_dir / f"{key}.o"
    if obj.exists():
        return obj
    with tempfile.TemporaryDirectory(dir=obj_dir) as tmp:
        src = Path(tmp) / name
        src.write_text(src_text)
        out = Path(tmp) / "out.o"
        _run(list(cc.argv) + list(CXXFLAGS) + ["-I", str(root / "emu"), "-I", str(root), "-c", str(src), "-o", str(out)], name)
        os.replace(out, obj)
    return obj


def load_sources(root: Path | None = None) -> list[MetalFile]:
    root = root or metal_dir()
    files = [parse_metal(p) for p in sorted(root.glob("*.metal"))]
    seen: dict[str, str] = {}
    for f in files:
        for k in f.kernels:
            if k.name in seen:
                raise MetalSourceError(f"kernel {k.name} is defined in {seen[k.name]} and {f.path.name}")
            seen[k.name] = f.path.name
    return files


def build_library(cc: Compiler, files: list[MetalFile], root: Path | None = None) -> Path:
    """Path of the shared library with every kernel of `files` (built if not cached)."""
    root = root or metal_dir()
    emu = root / "emu"
    headers = b"".join(p.read_bytes() for p in sorted(emu.glob("*.h")) + sorted(root.glob("*.h")))
    base = _sha(cc.version, " ".join(CXXFLAGS), headers)
    cache = cache_dir() / "metal-emu"
    obj_dir = cache / "obj"
    lib_dir = cache / "lib"
    obj_dir.mkdir(parents=True, exist_ok=True)
    lib_dir.mkdir(parents=True, exist_ok=True)

    units = [("simt.cpp", (emu / "simt.cpp").read_text())]
    units += [(f.path.stem + ".emu.cpp", translation_unit(f, emu)) for f in files]
    keys = [_sha(base, name, text) for name, text in units]
    lib = lib_dir / f"ds4metalemu-{_sha(base, *keys)}.so"
    if lib.exists():
        return lib
    workers = max(1, min(len(units), os.cpu_count() or 1))
    with ThreadPoolExecutor(workers) as pool:
        objs = list(pool.map(lambda u: _compile(cc, u[1][1], u[1][0], u[0], obj_dir, root), zip(keys, units)))
    with tempfile.TemporaryDirectory(dir=lib_dir) as tmp:
        out = Path(tmp) / "lib.so"
        _run(list(cc.argv) + ["-shared", "-fvisibility=hidden", "-o", str(out)] + [str(o) for o in objs], "the library")
        os.replace(out, lib)
    return lib
