"""bench/sampling.py runs end to end (quick, one logit shape) and prints the columns its docs name."""

from __future__ import annotations

import json
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
def test_sampling_bench_runs(args, expect, tmp_path):
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "sampling.py"), "--quick", *args,
                          "--json", str(tmp_path / "s.json")],
                         capture_output=True, text=True, timeout=300, env=installed_env())
    assert out.returncode == 0, out.stderr[-2000:]
    for e in expect:
        assert e in out.stdout, out.stdout
    # every figure the table shows was measured: a positive median over at least one sample
    results = json.loads((tmp_path / "s.json").read_text())["results"]
    assert len(results) >= 7, out.stdout
    for r in results:
        assert r["samples"] and r["median"] > 0, r["name"]
    if "--cold" in args:
        assert any(r["name"].endswith("/cold") for r in results)


def test_sampling_in_loop_bench_runs():
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "sampling_in_loop.py"), "--model", "tiny", "--quick"],
                         capture_output=True, text=True, timeout=300, env=installed_env())
    assert out.returncode == 0, out.stderr[-2000:]
    for e in ("wall 1T", "wall 2T", "greedy", "probabilities(), min_p 0", "T 100, top_p .9, min_p 0"):
        assert e in out.stdout, out.stdout
