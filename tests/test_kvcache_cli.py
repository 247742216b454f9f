"""``ds4 cache ls|show|rm`` on directories built with the engine-free fakes."""

from __future__ import annotations

import json

import kvcache_fakes as fk
from ds4.cli import main
from ds4.kvcache import KVCache


def populate(tmp_path):
    eng = fk.FakeEngine(routed_bits=4)
    cache = KVCache(tmp_path / "kv", min_tokens=8)
    entries = []
    for n, reason in ((50, "cold"), (120, "continued")):
        s = eng.session(ctx=2048)
        s.sync(eng.tokenizer.encode_rendered(fk.text_of(n, seed=n, prefix="hello ")))
        entries.append(cache.store(s, reason, eng))
    (cache.dir / ("f" * 40 + ".kv")).write_bytes(b"KVX broken")
    return cache, entries


def test_ls_table_and_json(tmp_path, capsys):
    cache, entries = populate(tmp_path)
    assert main(["cache", "ls", str(cache.dir)]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0].split()[:3] == ["sha", "tokens", "ctx"]
    row = next(line for line in lines if line.startswith(entries[1].sha[:12]))
    assert row.split()[1:5] == ["120", "2048", "4", "0"] and "continued" in row and "hello" in row
    assert "INVALID" in out and "2 entries, 1 invalid" in out
    assert main(["cache", "ls", str(cache.dir), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert {e["tokens"] for e in data["entries"]} == {50, 120}
    assert data["entries"][0]["text"].startswith("hello")
    assert len(data["invalid"]) == 1


def test_ls_missing_dir(tmp_path, capsys):
    assert main(["cache", "ls", str(tmp_path / "nope")]) == 2
    assert "no such cache directory" in capsys.readouterr().err


def test_show_checks_payload_layout(tmp_path, capsys):
    cache, entries = populate(tmp_path)
    # the fake model has 4 layers with ratios (0, 0, 4, 128) = the flash schedule for 4 layers
    assert main(["cache", "show", str(entries[0].path), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)["entries"][0]
    assert d["problems"] == [] and d["payload_layout"] == "flash schedule"
    assert d["payload_header"]["tokens"] == 50 and d["n_comp"] == [0, 0, 12, 0]
    data = bytearray(entries[0].path.read_bytes())
    data[60] ^= 0xFF
    entries[0].path.write_bytes(bytes(data))
    assert main(["cache", "show", str(cache.dir), entries[0].sha[:8]]) == 1
    assert "does not hash" in capsys.readouterr().out


def test_rm(tmp_path, capsys):
    cache, entries = populate(tmp_path)
    assert main(["cache", "rm", str(cache.dir)]) == 2
    capsys.readouterr()
    assert main(["cache", "rm", str(cache.dir), entries[0].sha[:10]]) == 0
    assert "removed 1 file" in capsys.readouterr().out
    assert not entries[0].path.exists() and entries[1].path.exists()
    assert main(["cache", "rm", str(cache.dir), "--invalid"]) == 0
    assert main(["cache", "rm", str(cache.dir), "--all"]) == 0
    assert list(cache.dir.iterdir()) == []


def test_add_arguments_and_from_args(tmp_path):
    import argparse

    from ds4.kvcache import MiB, add_arguments, from_args

    p = argparse.ArgumentParser()
    add_arguments(p)
    assert from_args(p.parse_args([])) is None
    c = from_args(p.parse_args(["--kv-cache-dir", str(tmp_path / "kv"), "--kv-cache-mb", "64",
                                "--kv-cache-min-tokens", "100", "--kv-cache-reject-different-quant"]))
    assert (c.max_bytes, c.min_tokens, c.cold_max_tokens, c.reject_different_quant) == (64 * MiB, 100, 30000, True)
    c2 = from_args(p.parse_args(["--kv-disk-dir", str(tmp_path / "kv2"), "--kv-disk-space-mb", "0"]))
    assert c2.max_bytes == 4096 * MiB    # upstream: 0 -> default budget


def test_every_kv_cache_flag_has_help_naming_its_default():
    import argparse

    from ds4.kvcache import add_arguments

    p = argparse.ArgumentParser()
    add_arguments(p)
    flags = [a for a in p._actions if any(o.startswith("--kv-") for o in a.option_strings)]
    assert len(flags) == 8
    for a in flags:
        assert a.help, a.option_strings
        if a.default not in (None, False):  # valued knobs state their default
            assert f"default {a.default}" in a.help, a.option_strings
