"""The compute backends ds4 knows, and which of them this build can run here.

An :class:`~ds4.Engine` runs on one backend, chosen by name (``backend="cpu"``) or ``"auto"``
(the first available one in this list's order: GPUs before the CPU)::

    >>> import ds4
    >>> [b.name for b in ds4.available_backends() if b.available]
    ['cpu']
    >>> next(b for b in ds4.available_backends() if b.name == "metal").available
    False

Asking for one that is not available raises :class:`~ds4.errors.UnsupportedModelError` naming the
available ones. How a backend plugs in: ``docs/architecture.md``.
"""

from __future__ import annotations

from dataclasses import dataclass

from .errors import UnsupportedModelError

__all__ = ["BackendInfo", "available_backends", "resolve_backend"]


@dataclass(frozen=True)
class BackendInfo:
    name: str
    available: bool
    reason: str = ""      # why not, when unavailable (e.g. "metal: not built on this platform")


def available_backends() -> list[BackendInfo]:
    """Every backend of the registry, in ``"auto"`` preference order, with its availability."""
    from . import _core

    return [BackendInfo(str(n), bool(a), str(r)) for n, a, r in _core.available_backends()]


def resolve_backend(name: str) -> str:
    """The backend ``name`` stands for (``"auto"``: the first available), or UnsupportedModelError."""
    backends = available_backends()
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
