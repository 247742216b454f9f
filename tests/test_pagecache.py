"""ds4.pagecache and the engine's map: 2 MiB alignment, the huge-page advice, the residency probe,
re-reading a file into the page cache, and their errors (docs/pagecache.md)."""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

import pytest

import ds4
import ds4.testing as T
from ds4 import pagecache
from ds4.cli import main
from ds4.errors import Ds4Error, Ds4IOError

HUGE = 2 << 20
LINUX = sys.platform.startswith("linux")
THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def thp_allows_madvise() -> bool:
    try:
        mode = THP.read_text()
    except OSError:
        return False
    return "[always]" in mode or "[madvise]" in mode


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    return T.cached_model("tiny")


def file_vmas(path: Path) -> list[dict]:
    """This process's maps of ``path`` from /proc/self/smaps: start, end, VmFlags."""
    out, cur = [], None
    target = os.path.realpath(path)
    for line in open("/proc/self/smaps"):
        head = line.split()
        if "-" in head[0] and len(head) >= 5 and ":" not in head[0]:
            cur = None
            if len(head) >= 6 and os.path.realpath(head[5]) == target:
                lo, hi = (int(x, 16) for x in head[0].split("-"))
                cur = {"start": lo, "end": hi, "flags": ""}
                out.append(cur)
        elif cur is not None and line.startswith("VmFlags:"):
            cur["flags"] = line.split(":", 1)[1].split()
    return out


@pytest.mark.skipif(not LINUX, reason="/proc/self/smaps is Linux's")
def test_engine_maps_the_model_on_a_2mib_boundary_and_asks_for_huge_pages(model):
    eng = ds4.Engine(model, threads=1)
    try:
        vmas = file_vmas(model)
        assert vmas, "the engine's map of the model is not in /proc/self/smaps"
        first = min(v["start"] for v in vmas)
        assert first % HUGE == 0, f"map starts at {first:#x}, not on a 2 MiB boundary"
        assert sum(v["end"] - v["start"] for v in vmas) >= model.stat().st_size
        if thp_allows_madvise():
            assert all("hg" in v["flags"] for v in vmas), vmas  # VM_HUGEPAGE: MADV_HUGEPAGE took
    finally:
        del eng


def test_probe_reports_the_whole_file(model):
    st = pagecache.probe(model)
    size = model.stat().st_size
    assert st.size == size and st.path == str(model)
    if LINUX:
        # every page was faulted in, so the map's resident bytes cover the file (page-rounded)
        assert size <= st.resident < size + os.sysconf("SC_PAGE_SIZE")
        assert 0 <= st.huge <= st.resident and st.huge % HUGE == 0
    assert 0.0 <= st.huge_fraction <= 1.0
    d = st.to_dict()
    assert d["size"] == size and d["huge"] == st.huge
    assert "in 2 MiB pages" in str(st)


def test_recache_leaves_the_file_unchanged_and_reads_it_back(tmp_path, model):
    copy = tmp_path / "m.gguf"
    copy.write_bytes(model.read_bytes())
    before = hashlib.sha256(copy.read_bytes()).hexdigest()
    mtime = copy.stat().st_mtime_ns
    st = pagecache.recache(copy)
    assert st.size == copy.stat().st_size
    if LINUX:
        assert st.resident >= st.size and st.huge <= st.resident
    assert hashlib.sha256(copy.read_bytes()).hexdigest() == before
    assert copy.stat().st_mtime_ns == mtime
    # the engine still loads and runs it
    eng = ds4.Engine(copy, threads=1)
    s = eng.session(ctx=64)
    s.sync([1, 2, 3])
    assert s.argmax() >= 0


@pytest.mark.parametrize("fn", [pagecache.probe, pagecache.recache])
def test_errors_name_the_file(tmp_path, fn):
    missing = tmp_path / "nope.gguf"
    with pytest.raises(Ds4IOError, match="nope.gguf"):
        fn(missing)
    empty = tmp_path / "empty.gguf"
    empty.write_bytes(b"")
    with pytest.raises(Ds4Error, match="empty.gguf"):
        fn(empty)


def test_cli_prints_one_state_per_file(model, capsys):
    assert main(["pagecache", str(model), str(model), "--json"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 2
    for line in lines:
        d = json.loads(line)
        assert d["size"] == model.stat().st_size and 0 <= d["huge_fraction"] <= 1
    assert main(["pagecache", str(model)]) == 0
    assert "2 MiB pages" in capsys.readouterr().out


def test_cli_error_is_one_line(tmp_path, capsys):
    assert main(["pagecache", str(tmp_path / "missing.gguf")]) == 2
    err = capsys.readouterr().err
    assert "missing.gguf" in err and err.count("\n") == 1
