"""tests/_gpu_backends.py: $DS4_TEST_BACKENDS picks the backends compared with the CPU, and a
requested backend that is not available is an error naming the reason (never a silent skip)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import ds4  # noqa: E402
from _gpu_backends import ENV, compared_backends, metal_under_test  # noqa: E402


def test_default_is_available_gpus_plus_the_emulator(monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    got = compared_backends()
    infos = {b.name: b for b in ds4.available_backends()}
    want = [n for n, b in infos.items() if n != "cpu" and (b.available or n == "metal-emu")]
    assert [n for n, _ in got] == want
    assert all((skip == "") == infos[n].available for n, skip in got)
    assert metal_under_test() == "metal-emu"


def test_requested_names_replace_the_list(monkeypatch):
    monkeypatch.setenv(ENV, " cpu , ")
    assert compared_backends() == [("cpu", "")]


def test_unavailable_request_is_an_error_with_the_reason(monkeypatch):
    metal = next(b for b in ds4.available_backends() if b.name == "metal")
    if metal.available:
        pytest.skip("metal is available on this machine: the error path is exercised with 'cuda' below")
    monkeypatch.setenv(ENV, "metal")
    with pytest.raises(RuntimeError, match="asks for 'metal', which is not available here: metal: "):
        compared_backends()
    with pytest.raises(RuntimeError, match="not available"):
        metal_under_test()


def test_unknown_request_is_an_error(monkeypatch):
    monkeypatch.setenv(ENV, "cuda,nope")
    with pytest.raises(RuntimeError, match="'cuda'|'nope'"):
        compared_backends()
