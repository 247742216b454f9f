"""The decode-glue changes (docs/kernels.md, "Decode glue"): ThreadPool::SideJob (work for the
workers only, e.g. hc_pre warming its weights), wake_workers at a command batch's start, and the
tapered range cut of the weight-streaming products. None may change a bit: a decode with every
switch off (common/decode_switches.h) must give the same logits and payload as with them on."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import ds4._core as core
from _decode_bits import decode_digest
from _installed import installed_env

ALL_OFF = dict(tapered=False, warm_hc=False, prewake=False)
ALL_ON = dict(tapered=True, warm_hc=True, prewake=True)


@pytest.fixture
def restore_threads():
    before = core.threads()
    yield
    core.set_threads(before)


@pytest.fixture
def restore_switches():
    before = core._decode_switches()
    yield
    core._decode_switches(**before)


def test_switches_default_on():
    now = core._decode_switches()
    assert {k: now[k] for k in ALL_ON} == ALL_ON


@pytest.mark.parametrize("threads", [2, 3])
def test_side_job_runs_every_range_once_when_given_time(threads, restore_threads):
    core.set_threads(threads)
    count, seen, running, ran = core._side_job(100, 10, 100, 300_000)
    assert running == 0
    assert count == seen == 10
    assert ran == [(100 * i // 10, 100 * (i + 1) // 10) for i in range(10)]
    assert core._pool_ranges(1000, 1, 4, False)[-1][1] == 1000, "the pool still works afterwards"


@pytest.mark.parametrize("threads", [2, 3])
def test_side_job_finish_waits_for_started_ranges_and_drops_the_rest(threads, restore_threads):
    core.set_threads(threads)
    # Ranges of 20 ms, finished after 5 ms: the ones started must end before finish() returns,
    # the rest are never started (they would take 20 ms x 50).
    count, seen, running, ran = core._side_job(50, 50, 20_000, 5_000)
    assert running == 0, "finish() returned while a range was still running"
    assert count == seen
    assert count < 50
    assert len(set(ran)) == len(ran)
    assert core._pool_ranges(1000, 1, 4, True)[-1][1] == 1000


def test_side_job_on_one_thread_runs_nothing(restore_threads):
    core.set_threads(1)
    assert core._side_job(10, 10, 10, 1_000)[:3] == (0, 0, 0)


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_decode_bits_do_not_depend_on_the_switches(threads, restore_switches):
    core._decode_switches(**ALL_OFF)
    off = decode_digest("tiny", threads, seed=1)
    core._decode_switches(**ALL_ON)
    assert decode_digest("tiny", threads, seed=1) == off


@pytest.mark.parametrize("script, args, expect", [
    ("decode_glue_ab.py", ["--configs", "off,on"], ["  off ", "  on "]),
    ("stream_ab.py", ["--prefetch", "3072,16384:8192:burst"], ["pf3072 ", "pf16384:8192:burst ", "decode:"]),
])
def test_in_process_ab_benches_run(script, args, expect):
    # The A/B benches the docs give as the quiet-machine commands (bench/_common.py decode_switch_ab):
    # two rounds on `tiny`, each setting reported; they restore the switches they change.
    root = Path(__file__).resolve().parent.parent
    out = subprocess.run([sys.executable, str(root / "bench" / script), "--model", "tiny", "--rounds", "2",
                          "--block", "2", *args], capture_output=True, text=True, timeout=300, env=installed_env())
    assert out.returncode == 0, out.stderr[-2000:]
    for e in expect:
        assert e in out.stdout, out.stdout
