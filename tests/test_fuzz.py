"""Mutation fuzzing of GGUF models, DSV4 session payloads and .kv cache files through every entry
point (inspect, Engine + sync, load_session, load_payload, read_payload_info, KVCache lookup and
load, ``ds4 cache ls|show|rm``). Each case runs in a child process with address-space, CPU and
wall-clock limits (tests/_fuzz.py); it passes only if the entry point accepts the file or raises
a ds4.errors.Ds4Error (a file-reading entry point's error must name the file).

Seeded and bounded: the CI run is ~100 cases (about a minute on 2 loaded cores); ``--fuzz-long``
or ``HYPOTHESIS_PROFILE=dev`` runs 10x as many seeds. A failure prints the seed and mutation, so
``pytest tests/test_fuzz.py -k 'gguf and 17'`` replays it.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import ds4
import ds4.testing as T

from _fuzz import (PASSING, copy_dir_with, gguf_entry, kv_entry, mutate_gguf, mutate_kv, mutate_payload,
                   payload_entry, run_case, write_case)

CI_CASES = {"gguf": 36, "payload": 30, "kv": 30}


def _long(config) -> bool:
    return config.getoption("--fuzz-long") or os.environ.get("HYPOTHESIS_PROFILE") == "dev"


def pytest_generate_tests(metafunc):
    for kind, n in CI_CASES.items():
        if f"{kind}_seed" in metafunc.fixturenames:
            metafunc.parametrize(f"{kind}_seed", range(n * (10 if _long(metafunc.config) else 1)))


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    return T.write_model(tmp_path_factory.mktemp("fuzz") / "tiny.gguf", "tiny", seed=0)


@pytest.fixture(scope="module")
def model_bytes(model) -> bytes:
    return model.read_bytes()


@pytest.fixture(scope="module")
def payload_bytes(model) -> bytes:
    # 150 tokens: compressed rows on the ratio-4 and ratio-128 layers, indexer rows, a wrapped ring
    s = ds4.Engine(model, threads=1).session(ctx=256)
    s.sync([(7 * i + 3) % 512 for i in range(150)])
    return s.save_payload()


def _prompt(n_words: int) -> str:
    words = ["alpha", "beta", "gamma", "delta", "kv", "cache", "token", "the", "of", "42"]
    system = " ".join(words[(i * 7) % len(words)] for i in range(n_words))
    return f"<｜begin▁of▁sentence｜>{system}<｜User｜>what now?<｜Assistant｜>"


@pytest.fixture(scope="module")
def kv_file(model, tmp_path_factory) -> tuple[Path, str]:
    """A real cold checkpoint written by KVCache, and a prompt that extends its text."""
    from ds4.kvcache import KVCache

    eng = ds4.Engine(model, threads=1)
    cache = KVCache(tmp_path_factory.mktemp("kv") / "kv", min_tokens=32, boundary_trim=4, boundary_align=32)
    text = _prompt(80)
    s = eng.session(ctx=1024)
    cache.sync(s, cache.prepare(s, text, eng), eng)
    [entry] = cache.entries()
    return entry.path, text + " and a follow-up"


def _check(outcome: tuple[str, str], what: str, path: Path | None) -> None:
    kind, detail = outcome
    assert kind in PASSING, f"{what}\n{kind}: {detail}"
    if kind == "ds4" and path is not None:
        assert str(path) in detail, f"{what}\nthe error does not name the file: {detail}"


def test_unmutated_files_pass_every_entry_point(model, payload_bytes, kv_file, tmp_path) -> None:
    # The baseline: without mutation each entry point accepts the file (so a mutated case that
    # passes as "ds4" really was refused by a check, not by a broken harness).
    assert run_case(gguf_entry, str(model))[0] == "ok"
    p = write_case(tmp_path, "s.dsv4", payload_bytes)
    for how in ("load_session", "load_payload", "read_payload_info"):
        assert run_case(payload_entry, str(model), str(p), how)[0] == "ok", how
    src, text = kv_file
    d = copy_dir_with(src, tmp_path / "kv", src.read_bytes())
    kind, detail = run_case(kv_entry, str(model), str(d), text, "load")
    assert (kind, detail.split()[0]) == ("ok", "'disk"), detail
    for how in ("cli-ls", "cli-show", "cli-show-file", "cli-rm"):
        assert run_case(kv_entry, str(model), str(d), text, how) == ("ok", "'exit 0'"), how


def test_harness_reports_every_failure_kind() -> None:
    # The harness must be able to fail: each bad outcome is classified, none passes.
    from _fuzz import PASSING
    import _fuzz_faults as F

    assert run_case(F.foreign)[0] == "foreign"
    assert run_case(F.crash)[0] == "crash"
    assert run_case(F.allocate_too_much)[0] == "memory"
    assert run_case(F.ds4_error)[0] == "ds4"
    for kind in ("foreign", "crash", "memory", "hang"):
        assert kind not in PASSING


def test_fuzz_gguf(model, model_bytes, tmp_path, gguf_seed: int) -> None:
    data, what = mutate_gguf(model_bytes, gguf_seed)
    assert data != model_bytes, what
    p = write_case(tmp_path, "m.gguf", data)
    _check(run_case(gguf_entry, str(p)), f"GGUF seed {gguf_seed}: {what}", p)


PAYLOAD_ENTRIES = ["load_session", "load_payload", "read_payload_info"]


def test_fuzz_payload(model, payload_bytes, tmp_path, payload_seed: int) -> None:
    how = PAYLOAD_ENTRIES[payload_seed % len(PAYLOAD_ENTRIES)]  # every entry point over the seeds
    data, what = mutate_payload(payload_bytes, payload_seed, n_layer=4, n_vocab=512)
    assert data != payload_bytes, what
    p = write_case(tmp_path, "s.dsv4", data)
    _check(run_case(payload_entry, str(model), str(p), how), f"DSV4 seed {payload_seed} via {how}: {what}",
           p if how == "load_session" else None)


KV_ENTRIES = ["load", "cli-ls", "cli-ls-json", "cli-show", "cli-show-file", "cli-rm"]


def test_fuzz_kv(model, kv_file, tmp_path, kv_seed: int) -> None:
    src, text = kv_file
    data, what = mutate_kv(src.read_bytes(), kv_seed)
    assert data != src.read_bytes(), what
    d = copy_dir_with(src, tmp_path / "kv", data)
    how = KV_ENTRIES[kv_seed % len(KV_ENTRIES)]
    _check(run_case(kv_entry, str(model), str(d), text, how), f".kv seed {kv_seed} via {how}: {what}", None)
