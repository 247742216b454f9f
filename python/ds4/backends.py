"""The compute backends ds4 knows, and which of them this build can run here.

An :class:`~ds4.Engine` runs on one backend, chosen by name (``backend="cpu"``) or ``"auto"``
(the first available one in this list's order: GPUs before the CPU)::

    >>> import ds4
    >>> names = [b.name for b in ds4.available_backends()]
    >>> names.index("metal") < names.index("cpu") < names.index("metal-emu")
    True
    >>> next(b for b in ds4.available_backends() if b.name == "cpu").available
    True

(On Apple Silicon ``metal`` is available too and ``"auto"`` picks it; elsewhere ``"auto"`` is
the CPU.)

Asking for one that is not available raises :class:`~ds4.errors.UnsupportedModelError` naming the
available ones. How a backend plugs in: ``docs/architecture.md``.

``"metal-emu"`` runs the Metal kernels on the CPU through the Metal emulator (``ds4.metal_emu``,
docs/metal.md): a test backend, never picked by ``"auto"``. It is available where a clang is
found; the first engine that asks for it compiles the kernels (cached on disk).
"""

from __future__ import annotations

from dataclasses import dataclass

from .errors import UnsupportedModelError

__all__ = ["BackendInfo", "available_backends", "resolve_backend", "load_metal_emu"]


@dataclass(frozen=True)
class BackendInfo:
    name: str
    available: bool
    reason: str = ""      # why not, when unavailable (e.g. "metal: not built on this platform")


def available_backends() -> list[BackendInfo]:
    """Every backend of the registry, in ``"auto"`` preference order, with its availability."""
    from . import _core

    return [_with_emulator(BackendInfo(str(n), bool(a), str(r))) for n, a, r in _core.available_backends()]


def _with_emulator(b: BackendInfo) -> BackendInfo:
    """metal-emu is available once its library is loaded, or where a clang can build it."""
    if b.name != "metal-emu" or b.available:
        return b
    from . import metal_emu

    if metal_emu.available():
        return BackendInfo(b.name, True, "")
    return BackendInfo(b.name, False, f"metal-emu: {metal_emu.unavailable_reason()}")


def load_metal_emu() -> None:
    """Builds (first time; cached) and loads the Metal emulator library for the metal-emu backend.
    UnsupportedModelError when no clang is found; BuildError (a Ds4Error) when compiling fails."""
    from . import _core, metal_emu

    if _core.metal_emu_library():
        return
    if not metal_emu.available():
        raise UnsupportedModelError(f"backend 'metal-emu' is not available: {metal_emu.unavailable_reason()}")
    _core.set_metal_emu_library(str(metal_emu.load().path))


def resolve_backend(name: str) -> str:
    """The backend ``name`` stands for (``"auto"``: the first available), or UnsupportedModelError."""
    from . import _core

    if name == "metal-emu":
        load_metal_emu()
    backends = [BackendInfo(str(n), bool(a), str(r)) for n, a, r in _core.available_backends()]
    usable = [b.name for b in backends if b.available]
    if name == "auto":
        if not usable:  # pragma: no cover - the CPU backend is always built
            raise UnsupportedModelError("no compute backend is available in this build")
        return usable[0]
    for b in backends:
        if b.name == name:
            if b.available:
                return name
            raise UnsupportedModelError(f"backend {name!r} is not available ({b.reason}); "
                                        f"available: {', '.join(usable)}")
    raise UnsupportedModelError(f"unknown backend {name!r}; available: {', '.join(usable)}")
