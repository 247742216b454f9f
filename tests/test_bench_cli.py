"""``ds4 bench``: upstream's frontier schedule and CSV columns, the per-frontier method (snapshot
size, restore), JSON/--compare and the optional PNG plot, on the bundled tiny model."""

from __future__ import annotations

import csv
import io
import json
import sys

import numpy as np
import pytest

import ds4
import ds4.testing
from ds4.cli import main
from ds4.errors import InvalidArgumentError
from ds4.frontier_bench import CSV_COLUMNS, _greedy_not_eos, frontiers, load_run, run_frontiers


@pytest.fixture(scope="module")
def prompt(tmp_path_factory):
    words = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu".split()
    p = tmp_path_factory.mktemp("bench") / "prompt.txt"
    p.write_text(" ".join(np.random.default_rng(0).choice(words, 400)), encoding="utf-8")
    return p


@pytest.fixture(scope="module")
def engine():
    return ds4.Engine(ds4.testing.default_model_path(), threads=1)


def test_frontier_schedule() -> None:
    assert frontiers(2048, 8192, step_incr=3000) == [2048, 5048, 8048, 8192]
    assert frontiers(3, 20, step_mul=1.5) == [3, 5, 8, 12, 18, 20]       # ceil(cur * mul)
    assert frontiers(10, 13, step_mul=1.01) == [10, 11, 12, 13]          # at least cur + 1
    assert frontiers(64, 64) == [64]
    for bad in (dict(ctx_start=10, ctx_max=5), dict(ctx_start=1, ctx_max=5, step_mul=0.5),
                dict(ctx_start=1, ctx_max=5, step_incr=0)):
        with pytest.raises(InvalidArgumentError):
            frontiers(**bad)


def test_rows_follow_the_method(engine, prompt) -> None:
    tokens = engine.tokenizer.encode(prompt.read_text())
    points = [40, 100, 130]
    rows = list(run_frontiers(engine, tokens, points, gen_tokens=5))
    assert [r.ctx_tokens for r in rows] == points and [r.prefill_tokens for r in rows] == [40, 60, 30]
    assert all(r.gen_tokens == 5 and r.prefill_tps > 0 and r.gen_tps > 0 for r in rows)
    for r in rows:
        # kvcache_bytes is the snapshot taken at the frontier: the payload of exactly F tokens, so
        # the decode steps of the previous frontier were rolled back before this prefill.
        s = engine.session(ctx=130 + 5 + 1)
        s.sync(tokens[:r.ctx_tokens])
        assert r.kvcache_bytes == len(s.save_payload())


def test_greedy_skips_eos() -> None:
    class Fake:
        logits = np.array([0.0, 5.0, 3.0, 1.0], np.float32)

        def argmax(self) -> int:
            return int(np.argmax(self.logits))

    assert _greedy_not_eos(Fake(), eos=1) == 2 and _greedy_not_eos(Fake(), eos=0) == 1


def _bench(capsys, prompt, *extra):
    rc = main(["bench", "--prompt-file", str(prompt), "--ctx-start", "32", "--ctx-max", "96", "--step-mul", "2",
               "-n", "4", "-t", "1", *map(str, extra)])
    return rc, capsys.readouterr()


def test_cli_csv_json_compare_and_plot(capsys, prompt, tmp_path) -> None:
    rc, (out, err) = _bench(capsys, prompt, "--json", tmp_path / "a.json")
    assert rc == 0
    table = list(csv.reader(io.StringIO(out)))
    assert tuple(table[0]) == CSV_COLUMNS == ("ctx_tokens", "prefill_tokens", "prefill_tps", "gen_tokens",
                                              "gen_tps", "kvcache_bytes")
    assert [int(r[0]) for r in table[1:]] == [32, 64, 96] and [int(r[1]) for r in table[1:]] == [32, 32, 32]
    assert all(len(r[2].split(".")[1]) == 2 for r in table[1:])      # upstream prints %.2f
    run_a = load_run(tmp_path / "a.json")
    assert run_a.settings["complete"] and run_a.settings["routed_bits"] == 2 and len(run_a.rows) == 3
    assert [f"{r.prefill_tps:.2f}" for r in run_a.rows] == [r[2] for r in table[1:]]
    rc, (_, err) = _bench(capsys, prompt, "--csv", tmp_path / "b.csv", "--json", tmp_path / "b.json",
                          "--plot", tmp_path / "b.png", "--progress")
    assert "bench [" in err and "/108 tokens" in err    # the bar counts prefilled + decoded tokens: 96 + 3 x 4
    assert rc == 0 and (tmp_path / "b.csv").read_text().splitlines()[0] == ",".join(CSV_COLUMNS)
    assert (tmp_path / "b.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert main(["bench", "--compare", str(tmp_path / "a.json"), str(tmp_path / "b.json"),
                 "--plot", str(tmp_path / "cmp.png")]) == 0
    out = capsys.readouterr().out
    assert "prefill A" in out and "geomean" in out and len([ln for ln in out.splitlines() if ln.strip().startswith(("32", "64", "96"))]) == 3
    assert (tmp_path / "cmp.png").stat().st_size > 1000


def test_plot_without_matplotlib_is_a_clear_error(monkeypatch, tmp_path) -> None:
    from ds4.bench_plot import plot_runs
    from ds4.frontier_bench import BenchRun

    monkeypatch.setitem(sys.modules, "matplotlib", None)     # import fails as if not installed
    with pytest.raises(InvalidArgumentError, match=r"pip install 'ds4\[plot\]'"):
        plot_runs([BenchRun({}, [])], tmp_path / "x.png")


@pytest.mark.parametrize("extra, message", [
    (["--ctx-max", "5000"], "needs at least that many"),
    (["--ctx-alloc", "50"], "--ctx-alloc 50 must be greater than"),
    (["--step-mul", "0.5"], "--step-mul 0.5 must be >= 1"),
])
def test_cli_errors(capsys, prompt, extra, message) -> None:
    rc, (_, err) = _bench(capsys, prompt, *extra)
    assert rc == 2 and message in err


def test_compare_rejects_other_json(capsys, tmp_path) -> None:
    (tmp_path / "x.json").write_text(json.dumps({"hello": 1}))
    assert main(["bench", "--compare", str(tmp_path / "x.json"), str(tmp_path / "x.json")]) == 2
    assert "not a `ds4 bench --json` file" in capsys.readouterr().err
    assert main(["bench"]) == 2
    assert "--prompt-file" in capsys.readouterr().err
