"""KV cache across processes: round trips through a fresh interpreter, kill -9 during a write,
several processes sharing one directory. Children use the engine-free fakes (kvcache_fakes)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import kvcache_fakes as fk
from ds4.errors import CacheFormatError
from ds4.kvcache import KVCache, read_cache_file

TESTS = Path(__file__).resolve().parent
PYTHON = TESTS.parent / "python"

PRELUDE = f"""
import json, os, sys, time
sys.path[:0] = [{str(PYTHON)!r}, {str(TESTS)!r}]
import kvcache_fakes as fk
from ds4 import kvcache_format as fmt
from ds4.kvcache import KVCache
"""


def child(body: str, *args: str) -> subprocess.Popen:
    code = PRELUDE + textwrap.dedent(body)
    return subprocess.Popen([sys.executable, "-c", code, *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def run_child(body: str, *args: str, timeout: float = 60) -> dict:
    p = child(body, *args)
    out, err = p.communicate(timeout=timeout)
    assert p.returncode == 0, err
    return json.loads(out.strip().splitlines()[-1])


def test_round_trip_through_new_processes(tmp_path):
    d = tmp_path / "kv"
    base = fk.text_of(300, seed=40)
    # process 1 stores; process 2 restores and reports what it evaluated
    run_child("""
        cache = KVCache(sys.argv[1], min_tokens=8)
        eng = fk.FakeEngine()
        s = eng.session(ctx=4096)
        s.sync(eng.tokenizer.encode_rendered(sys.argv[2]))
        e = cache.store(s, "cold", eng)
        print(json.dumps({"sha": e.sha}))
    """, str(d), base)
    got = run_child("""
        cache = KVCache(sys.argv[1], min_tokens=8)
        eng = fk.FakeEngine()
        s = eng.session(ctx=4096)
        prompt = sys.argv[2] + " and more"
        p = cache.prepare(s, prompt, eng)
        cache.sync(s, p, eng)
        print(json.dumps({"source": p.source, "cached": p.cached_tokens, "evaluated": s.evaluated,
                          "same": s.tokens == eng.tokenizer.encode_rendered(prompt)}))
    """, str(d), base)
    assert got["source"] == "disk" and got["cached"] == 300
    assert got["evaluated"] == len(" and more") and got["same"]
    # the bytes the child restored are exactly what a fresh session at that prefix saves
    eng = fk.FakeEngine()
    s = eng.session(ctx=4096)
    s.sync(eng.tokenizer.encode_rendered(base))
    [entry] = KVCache(d, min_tokens=8).entries()
    assert entry.hits == 1
    assert read_cache_file(entry, shape=fk.SHAPE).payload == s.save_payload()


SLOW_WRITER = """
    real = fmt.write_file_atomic
    def slow(path, chunks, fsync=True):
        def gen():
            for c in chunks:
                for i in range(0, len(c), 256):
                    yield c[i:i + 256]
                    time.sleep(0.004)
        return real(path, gen(), fsync=fsync)
    fmt.write_file_atomic = slow
    cache = KVCache(sys.argv[1], min_tokens=8)
    eng = fk.FakeEngine()
    s = eng.session(ctx=4096)
    s.sync(eng.tokenizer.encode_rendered(sys.argv[2]))
    print("ready", flush=True)
    e = cache.store(s, "cold", eng)
    print(json.dumps({"stored": e is not None}), flush=True)
"""


def check_directory(d: Path, text: str) -> list[Path]:
    """Every *.kv present must be complete and correct; returns them."""
    eng = fk.FakeEngine()
    s = eng.session(ctx=4096)
    s.sync(eng.tokenizer.encode_rendered(text))
    want = s.save_payload()
    cache = KVCache(d, min_tokens=8)
    good = []
    for e in cache.entries():
        cf = read_cache_file(e, shape=fk.SHAPE)
        assert cf.text == text.encode() and cf.payload == want
        good.append(e.path)
    assert len(good) == len([p for p in d.iterdir() if p.name.endswith(".kv")])
    return good


def test_kill_9_mid_write_leaves_no_valid_looking_file(tmp_path):
    d = tmp_path / "kv"
    text = fk.text_of(300, seed=41)
    p = child(SLOW_WRITER, str(d), text)
    assert p.stdout.readline().strip() == "ready"
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        temps = [q for q in d.iterdir() if ".kv.tmp." in q.name]
        if temps and temps[0].stat().st_size > 1000:
            break
        time.sleep(0.01)
    else:
        pytest.fail("writer never started writing")
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    assert [q for q in d.iterdir() if q.name.endswith(".kv")] == []     # nothing named *.kv
    assert len([q for q in d.iterdir() if ".kv.tmp." in q.name]) == 1   # the partial temp file
    cache = KVCache(d, min_tokens=8)
    assert cache.lookup(text + "x", ctx=4096) is None
    assert os.listdir(d) == []                                          # dead writer's temp cleaned
    s = fk.FakeEngine().session()
    assert cache.prepare(s, text + "x", fk.FakeEngine()).source == "cold"


@pytest.mark.parametrize("delay", [0.0, 0.05, 0.15, 0.3, 0.6])
def test_kill_9_at_any_moment_never_leaves_a_wrong_file(tmp_path, delay):
    d = tmp_path / "kv"
    text = fk.text_of(300, seed=42)
    p = child(SLOW_WRITER, str(d), text)
    assert p.stdout.readline().strip() == "ready"
    time.sleep(delay)
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    check_directory(d, text)


CONCURRENT = """
    import random
    cache = KVCache(sys.argv[1], min_tokens=8, max_bytes=int(sys.argv[3]))
    eng = fk.FakeEngine()
    rng = random.Random(int(sys.argv[2]))
    texts = [fk.text_of(n, seed=s) for s in range(3) for n in (60, 120, 200)]
    counts = {"stored": 0, "hits": 0}
    for i in range(12):
        t = rng.choice(texts)
        s = eng.session(ctx=4096)
        p = cache.prepare(s, t + "!", eng)
        if p.source == "disk":
            counts["hits"] += 1
            assert s.tokens == eng.tokenizer.encode_rendered(t + "!")[: p.cached_tokens]
        s2 = eng.session(ctx=4096)
        s2.sync(eng.tokenizer.encode_rendered(t))
        if cache.store(s2, "evict", eng) is not None:
            counts["stored"] += 1
    print(json.dumps(counts))
"""


def test_concurrent_processes_share_a_directory(tmp_path):
    d = tmp_path / "kv"
    one = KVCache(d, min_tokens=8)
    eng = fk.FakeEngine()
    sizes = []
    for n in (60, 120, 200):
        s = eng.session(ctx=4096)
        s.sync(eng.tokenizer.encode_rendered(fk.text_of(n, seed=0)))
        sizes.append(one.store(s, "cold", eng).file_size)
    for e in one.entries():
        e.path.unlink()
    budget = sum(sizes) * 2  # room for ~4 of the 9 distinct files: eviction runs constantly
    procs = [child(CONCURRENT, str(d), str(seed), str(budget)) for seed in range(3)]
    results = []
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        results.append(json.loads(out.strip().splitlines()[-1]))
    assert sum(r["stored"] for r in results) > 0 and sum(r["hits"] for r in results) > 0
    texts = {fk.text_of(n, seed=s).encode(): (n, s) for s in range(3) for n in (60, 120, 200)}
    cache = KVCache(d, min_tokens=8)
    assert [q for q in d.iterdir() if not q.name.endswith(".kv")] == []
    for e in cache.entries():
        cf = read_cache_file(e, shape=fk.SHAPE)
        assert cf.text in texts
        s = eng.session(ctx=4096)
        s.sync(eng.tokenizer.encode_rendered(cf.text.decode()))
        assert cf.payload == s.save_payload()
    assert cache.total_bytes() <= budget
