"""A CPU emulator of Metal compute, for checking metal/*.metal on Linux (test-only).

The .metal sources are compiled as C++17 by clang against a shim header (metal/emu/msl_emu.h)
and run by a SIMT runtime (metal/emu/simt.cpp): threadgroups in sequence, one fiber per thread,
barriers and simd collectives released when every live participant reaches the same source
line. It verifies kernel logic, races (results must be bit-identical under several thread
orders), Metal's limits and divergent synchronisation. It cannot tell whether Apple's compiler
accepts the code, nor anything about real-GPU speed or the GPU's float reduction order.

    >>> from ds4 import metal_emu
    >>> lib = metal_emu.load()                       # doctest: +SKIP
    >>> lib.dispatch("rms_norm_f32", buffers=[...], grid=(rows, 1, 1), threads=(256, 1, 1))  # doctest: +SKIP
"""

from __future__ import annotations

import functools
from pathlib import Path

from ._build import BuildError, build_library, load_sources, metal_dir
from ._source import MetalSourceError, parse_metal
from ._toolchain import Compiler, find_compiler, missing_message
from .runtime import Buffer, EmulatorError, Library, RaceError, run_orders

__all__ = ["load", "available", "unavailable_reason", "Library", "Buffer", "EmulatorError", "RaceError",
           "BuildError", "MetalSourceError", "run_orders", "find_compiler", "Compiler", "metal_dir"]


def available() -> bool:
    """Whether the emulator can be built here: a clang and the metal/ sources."""
    return find_compiler() is not None and (metal_dir() / "emu" / "simt.cpp").is_file()


def unavailable_reason() -> str:
    if find_compiler() is None:
        return missing_message()
    return (f"the Metal sources are not at {metal_dir()} (an installed wheel does not ship them): "
            "set DS4_METAL_DIR to a checkout's metal/ folder")


@functools.lru_cache(maxsize=None)
def load(extra: tuple[str, ...] = ()) -> Library:
    """The emulator library with every kernel of metal/*.metal, plus the .metal files in `extra`
    (test fixtures), compiled on first use and cached on disk."""
    cc = find_compiler()
    if cc is None:
        raise BuildError(missing_message())
    files = load_sources() + [parse_metal(Path(p)) for p in extra]
    return Library(build_library(cc, files), files)
