"""ctypes front of the emulator library (metal/emu/ds4_metal_emu.h) and the multi-order race check."""

from __future__ import annotations

import ctypes
import struct
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from ..errors import Ds4Error
from ._source import FC_FORMATS, MetalFile

__all__ = ["Buffer", "Library", "EmulatorError", "RaceError", "run_orders", "ORDERS"]

ORDERS = {"forward": 0, "reverse": 1, "shuffle": 2}


class EmulatorError(Ds4Error):
    """A dispatch failed: a Metal limit, an unbound buffer, a divergent barrier or collective."""


class RaceError(EmulatorError):
    """A kernel gave different bits under different thread orders."""


class _Constant(ctypes.Structure):
    _fields_ = [("index", ctypes.c_uint32), ("size", ctypes.c_uint32), ("value", ctypes.c_void_p)]


class _Buffer(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("offset", ctypes.c_uint64), ("length", ctypes.c_uint64),
                ("poison", ctypes.c_int)]


class _Dispatch(ctypes.Structure):
    _fields_ = [("kernel", ctypes.c_char_p), ("constants", ctypes.POINTER(_Constant)), ("n_constants", ctypes.c_uint32),
                ("buffers", ctypes.POINTER(_Buffer)), ("n_buffers", ctypes.c_uint32),
                ("tg_mem", ctypes.POINTER(ctypes.c_uint32)), ("n_tg_mem", ctypes.c_uint32),
                ("grid", ctypes.c_uint32 * 3), ("threads", ctypes.c_uint32 * 3), ("grid_is_threads", ctypes.c_int),
                ("order", ctypes.c_int), ("seed", ctypes.c_uint64)]


class _Stats(ctypes.Structure):
    _fields_ = [(n, ctypes.c_uint64) for n in ("dispatches", "threadgroups", "threads", "fiber_switches",
                                                 "fast_path_threads")]


@dataclass
class Buffer:
    """A numpy array bound at a byte offset (Metal's setBuffer:offset:atIndex:)."""
    array: np.ndarray
    offset: int = 0


def _as_array(b: Any) -> tuple[np.ndarray, int]:
    if isinstance(b, Buffer):
        return b.array, b.offset
    if isinstance(b, (bytes, bytearray, memoryview)):  # inline bytes (setBytes): a private copy
        return np.frombuffer(bytes(b), dtype=np.uint8).copy(), 0
    if isinstance(b, np.ndarray):
        return b, 0
    raise TypeError(f"cannot bind {type(b).__name__} as a Metal buffer")


class Library:
    """The compiled kernels. ``dispatch`` runs one kernel over a grid, in place on numpy arrays.

    The runtime is one per process and runs one dispatch at a time (ctypes releases the GIL
    during the call, so dispatches from several threads are serialised by a lock here)."""

    _lock = threading.Lock()

    def __init__(self, path: Path, files: Sequence[MetalFile] = ()):
        self.path = Path(path)
        self._lib = ctypes.CDLL(str(path))
        self._lib.ds4emu_dispatch_run.argtypes = [ctypes.POINTER(_Dispatch), ctypes.c_char_p, ctypes.c_size_t]
        self._lib.ds4emu_kernel_name.restype = ctypes.c_char_p
        self._lib.ds4emu_kernel_count.restype = ctypes.c_uint32
        self._lib.ds4emu_set_max_threads_per_threadgroup.argtypes = [ctypes.c_uint32]
        self._lib.ds4emu_max_threads_per_threadgroup.restype = ctypes.c_uint32
        self._lib.ds4emu_get_stats.argtypes = [ctypes.POINTER(_Stats)]
        self.kernels = {k.name: k for f in files for k in f.kernels}

    def kernel_names(self) -> list[str]:
        return [self._lib.ds4emu_kernel_name(i).decode() for i in range(self._lib.ds4emu_kernel_count())]

    def set_max_threads_per_threadgroup(self, n: int) -> None:
        self._lib.ds4emu_set_max_threads_per_threadgroup(n)

    @property
    def max_threads_per_threadgroup(self) -> int:
        return int(self._lib.ds4emu_max_threads_per_threadgroup())

    def stats(self) -> dict[str, int]:
        s = _Stats()
        self._lib.ds4emu_get_stats(ctypes.byref(s))
        return {n: int(getattr(s, n)) for n, _ in _Stats._fields_}

    def reset_stats(self) -> None:
        self._lib.ds4emu_reset_stats()

    def dispatch(self, kernel: str, *, buffers: Sequence[Any], grid: Sequence[int], threads: Sequence[int],
                 constants: dict[int, Any] | None = None, tg_mem: Sequence[int] = (), grid_is_threads: bool = False,
                 order: str = "forward", seed: int = 0, poison: Sequence[int] = ()) -> None:
        """Run `kernel`. buffers[i] binds [[buffer(i)]]: a numpy array (modified in place), a
        ``Buffer(array, offset)``, bytes (inline, like setBytes) or None. `poison` lists buffer
        indices filled with NaN bytes first (outputs: a kernel that skips an element shows it)."""
        keep = []
        bufs = (_Buffer * max(1, len(buffers)))()
        for i, b in enumerate(buffers):
            if b is None:
                continue
            arr, off = _as_array(b)
            if not arr.flags.c_contiguous or not arr.flags.writeable:
                raise EmulatorError(f"{kernel}: buffer({i}) must be a writable C-contiguous array")
            keep.append(arr)
            bufs[i] = _Buffer(arr.ctypes.data, off, arr.nbytes, 1 if i in poison else 0)
        info = self.kernels.get(kernel)
        consts = constants or {}
        cs = (_Constant * max(1, len(consts)))()
        for j, (idx, value) in enumerate(sorted(consts.items())):
            fc = next((c for c in info.constants if c.index == idx), None) if info else None
            fmt = FC_FORMATS[fc.type] if fc else ("?" if isinstance(value, bool) else "i")
            raw = ctypes.create_string_buffer(struct.pack("<" + fmt, value), struct.calcsize(fmt))
            keep.append(raw)
            cs[j] = _Constant(idx, struct.calcsize(fmt), ctypes.cast(raw, ctypes.c_void_p))
        tgs = (ctypes.c_uint32 * max(1, len(tg_mem)))(*tg_mem)
        g = tuple(grid) + (1,) * (3 - len(grid))
        t = tuple(threads) + (1,) * (3 - len(threads))
        d = _Dispatch(kernel.encode(), cs, len(consts), bufs, len(buffers), tgs, len(tg_mem),
                      (ctypes.c_uint32 * 3)(*g), (ctypes.c_uint32 * 3)(*t), int(grid_is_threads), ORDERS[order], seed)
        err = ctypes.create_string_buffer(2048)
        with Library._lock:
            rc = self._lib.ds4emu_dispatch_run(ctypes.byref(d), err, len(err))
        if rc != 0:
            raise EmulatorError(err.value.decode(errors="replace"))


def run_orders(lib: Library, kernel: str, *, buffers: Sequence[Any], outputs: Sequence[int],
               orders: Sequence[tuple[str, int]] = (("forward", 0), ("reverse", 0), ("shuffle", 1234)),
               poison: Sequence[int] | None = None, **kw) -> list[np.ndarray]:
    """Dispatch `kernel` once per thread order on fresh copies of `buffers`, outputs NaN-poisoned
    first (`poison` overrides which: in-place kernels pass ()); raise RaceError if any output
    differs in any bit between orders, and EmulatorError if a buffer that is not an output
    changed (a stray write). Returns the outputs (arrays of buffers[i] for i in `outputs`) of
    the first order."""
    first: list[np.ndarray] | None = None
    for name, seed in orders:
        copies = []
        for b in buffers:
            if isinstance(b, Buffer):
                copies.append(Buffer(b.array.copy(), b.offset))
            elif isinstance(b, np.ndarray):
                copies.append(b.copy())
            else:
                copies.append(b)
        lib.dispatch(kernel, buffers=copies, order=name, seed=seed, poison=outputs if poison is None else poison, **kw)
        for i, (b, c) in enumerate(zip(buffers, copies)):
            if i in outputs or not isinstance(b, (Buffer, np.ndarray)):
                continue
            before, after = _as_array(b)[0], _as_array(c)[0]
            if not np.array_equal(before.view(np.uint8), after.view(np.uint8)):
                raise EmulatorError(f"kernel '{kernel}' wrote into buffer({i}), which is not one of its outputs")
        outs = [_as_array(copies[i])[0] for i in outputs]
        if first is None:
            first = outs
            continue
        for i, a, b in zip(outputs, first, outs):
            ab, bb = a.view(np.uint8).ravel(), b.view(np.uint8).ravel()
            if not np.array_equal(ab, bb):
                at = int(np.flatnonzero(ab != bb)[0])
                raise RaceError(f"kernel '{kernel}': buffer({i}) differs between thread orders "
                                f"'{orders[0][0]}' and '{name}' (first at byte {at} of {ab.size}): a race")
    return first
