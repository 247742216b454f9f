"""Which non-CPU backends the comparison tests (tests/backend_ops, the metal end-to-end tests)
run against the CPU.

By default: every available GPU backend of the registry, plus ``metal-emu`` (the Metal kernels
on the CPU emulator), which is skipped with its reason where no clang is found.
``$DS4_TEST_BACKENDS`` (comma-separated names) replaces that list. On a Mac::

    DS4_TEST_BACKENDS=metal python -m pytest -q tests/backend_ops tests/metal_engine tests/engine/test_metal_emu_threads.py

runs the same comparisons on the real GPU instead of the emulator (the Metal end-to-end tests
take their backend name from metal_under_test()). A name given there that is
not available here is an error with the registry's reason, never a skip: a run that asked for
the GPU and did not use it must not pass.
"""

from __future__ import annotations

import os

import ds4

ENV = "DS4_TEST_BACKENDS"


def requested() -> list[str] | None:
    """The names in $DS4_TEST_BACKENDS, or None when it is unset or empty."""
    names = [n.strip() for n in os.environ.get(ENV, "").split(",") if n.strip()]
    return names or None


def compared_backends() -> list[tuple[str, str]]:
    """(name, skip reason) per backend compared with the CPU; the reason is "" when it runs."""
    infos = {b.name: b for b in ds4.available_backends()}
    names = requested()
    if names:
        for n in names:
            b = infos.get(n)
            if b is None or not b.available:
                why = b.reason if b else f"no backend named {n!r} (known: {', '.join(infos)})"
                raise RuntimeError(f"{ENV}={os.environ[ENV]!r} asks for {n!r}, which is not available here: {why}")
        return [(n, "") for n in names]
    out = []
    for b in infos.values():
        if b.name == "cpu":
            continue
        if b.available:
            out.append((b.name, ""))
        elif b.name == "metal-emu":
            out.append((b.name, b.reason))
    return out


def metal_under_test() -> str:
    """The Metal backend the Metal end-to-end tests run: "metal" when $DS4_TEST_BACKENDS asks for
    it (the real GPU), else "metal-emu"."""
    names = requested() or []
    if "metal" in names:
        compared_backends()   # raises with the reason when metal is not available
        return "metal"
    return "metal-emu"
