"""`ds4 inspect`: output, JSON, exit status and one-line errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import ds4.testing as T
from ds4.cli import main
from _installed import installed_env


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return T.write_model(tmp_path_factory.mktemp("cli") / "tiny.gguf", "tiny", header_only=True)


def test_summary(tiny, capsys):
    assert main(["inspect", str(tiny), "--ctx", "4096"]) == 0
    out = capsys.readouterr().out
    assert "variant custom" in out and "4 layers, embd 256, vocab 512" in out
    assert "memory      ctx 4096" in out


def test_json(tiny, capsys):
    assert main(["inspect", str(tiny), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["arch"] == "deepseek4" and d["shape"]["n_layer"] == 4
    assert d["tensors"]["output.weight"]["type"] == "Q8_0"
    assert d["memory"]["ctx"] == 32768


def test_tensor_listing(tiny, capsys):
    assert main(["inspect", str(tiny), "--tensors"]) == 0
    assert "blk.2.indexer.proj.weight" in capsys.readouterr().out


def test_default_file_is_the_bundled_tiny_model(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("DS4_CACHE_DIR", str(tmp_path))
    assert main(["inspect"]) == 0
    assert str(tmp_path) in capsys.readouterr().out


@pytest.mark.parametrize("args, match", [
    (["--strict"], "strict mode accepts only"),
    (["--ctx", "0"], "ctx must be at least 1"),
])
def test_errors_exit_2(tiny, capsys, args, match):
    assert main(["inspect", str(tiny), *args]) == 2
    err = capsys.readouterr().err
    assert match in err and err.count("\n") == 1 and err.startswith("ds4 inspect: error: ")


def test_not_a_gguf(tmp_path, capsys):
    p = tmp_path / "x.gguf"
    p.write_bytes(b"hello world, not a model")
    assert main(["inspect", str(p)]) == 2
    assert "bad magic" in capsys.readouterr().err
    assert main(["inspect", str(tmp_path / "missing.gguf")]) == 2
    assert "missing.gguf" in capsys.readouterr().err


def test_no_traceback_from_the_real_entry_point(tmp_path):
    p = tmp_path / "trunc.gguf"
    p.write_bytes(b"GGUF\x03\x00\x00\x00")
    env = installed_env()
    r = subprocess.run([sys.executable, "-m", "ds4.cli", "inspect", str(p)], capture_output=True, text=True, env=env)
    assert r.returncode == 2
    assert "Traceback" not in r.stderr and "truncated" in r.stderr and r.stderr.count("\n") == 1


def test_no_command_prints_help(capsys):
    assert main([]) == 2
    assert "inspect" in capsys.readouterr().err
