"""bench/sampling.py runs end to end (quick, one logit shape) and prints the columns its docs name."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from _installed import installed_env

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("args, expect", [
    (["--kinds", "equal", "--cold"], ["python cold", "min_p 0", "token_and_top_logprobs k=20", "double exp (floor)"]),
    (["--kinds", "equal", "--thread-ab", "--rounds", "1", "--reps", "5"], ["wall p10 1T", "2T/1T p10", "top_k 40 (control)"]),
])
def test_sampling_bench_runs(args, expect):
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "sampling.py"), "--quick", *args],
                         capture_output=True, text=True, timeout=300, env=installed_env())
    assert out.returncode == 0, out.stderr[-2000:]
    for e in expect:
        assert e in out.stdout, out.stdout
    # every timed row of the shape is printed with a number (a row whose column came back empty would
    # leave a blank where the median goes)
    rows = [ln for ln in out.stdout.splitlines() if ln.strip().startswith("equal")]
    assert len(rows) >= 7, out.stdout


def test_sampling_in_loop_bench_runs():
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "sampling_in_loop.py"), "--model", "tiny", "--quick"],
                         capture_output=True, text=True, timeout=300, env=installed_env())
    assert out.returncode == 0, out.stderr[-2000:]
    for e in ("wall 1T", "wall 2T", "greedy", "probabilities(), min_p 0", "T 100, top_p .9, min_p 0"):
        assert e in out.stdout, out.stdout
