"""``ds4 perplexity``: the window method against an independent numpy-reference computation, the
saved-logits file, and KL divergence (self-comparison exactly 0; q2 vs q4 of one seed positive)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

import ds4
import ds4.testing
from ds4.cli import main
from ds4.errors import InvalidArgumentError, LogitsFileError
from ds4.logits_file import LogitsReader, LogitsWriter
from ds4.perplexity import KlStats, NllStats, log_softmax, make_windows, score_window

WINDOW = 32


@pytest.fixture(scope="module")
def text(tmp_path_factory):
    rng = np.random.default_rng(0)
    words = "the of and to in is was that for on as with by he at from an were are which this be".split()
    p = tmp_path_factory.mktemp("ppl") / "text.txt"
    p.write_text(" ".join(rng.choice(words, 600)), encoding="utf-8")
    return p


@pytest.fixture(scope="module")
def models():
    return {q: ds4.testing.cached_model("tiny", experts=q) for q in ("q2", "q4")}


def _run(capsys, *args) -> tuple[str, str]:
    assert main(["perplexity", "-t", "1", "-c", str(WINDOW), "--chunks", "3", *map(str, args)]) == 0
    return capsys.readouterr()


def test_windows() -> None:
    w = make_windows(list(range(100, 170)), 8, bos=0)
    assert len(w) == 10 and all(len(x) == 8 and x[0] == 0 for x in w)
    assert w[1][1:].tolist() == list(range(107, 114))          # consecutive, non-overlapping chunks
    assert len(make_windows(list(range(70)), 8, 0, max_windows=3)) == 3
    with pytest.raises(InvalidArgumentError, match="needs at least 7"):
        make_windows([1, 2, 3], 8, 0)


def test_ppl_matches_an_independent_reference_computation(capsys, text, models, tmp_path) -> None:
    """The reported estimate is exp(mean NLL) of the window's second half, each token given all the
    window's tokens before it: recomputed here with ds4.reference, decoding every token."""
    from ds4.reference import ReferenceModel

    out, err = _run(capsys, "-m", models["q2"], "-f", text, "--json", tmp_path / "r.json", "--progress")
    assert "perplexity over 3 windows of 32 tokens" in err and "[3/3] ppl" in err and "perplexity [" in err
    assert out.startswith("Final estimate: PPL = ") and "+/-" in out
    rep = json.loads((tmp_path / "r.json").read_text())
    eng = ds4.Engine(models["q2"], threads=1)
    windows = make_windows(eng.tokenizer.encode(text.read_text()), WINDOW, eng.tokenizer.require("bos"), 3)
    ref = ReferenceModel(models["q2"])
    nll, shifted = [], []
    for w in windows:
        st = ref.new_state(WINDOW + 1)
        for j in range(WINDOW - 1):
            lp = log_softmax(ref.decode(st, int(w[j])))
            if j + 1 >= WINDOW // 2:
                nll.append(-lp[w[j + 1]])
            if j >= WINDOW // 2:
                shifted.append(-lp[w[j]])    # off by one: scores the token just evaluated
    assert rep["scored_tokens"] == len(nll) == 3 * (WINDOW // 2)
    # Engine and reference logits differ by float-order noise (~0.04 mean |dlogit|, tests/engine/
    # _compare.py), i.e. ~1e-2 in a token's NLL; shifting the targets by one moves the mean NLL by
    # more than 0.05 on this model (the last assertion).
    assert abs(rep["mean_nll"] - float(np.mean(nll))) < 0.02
    assert math.isclose(rep["ppl"], math.exp(rep["mean_nll"]), rel_tol=1e-12)
    assert math.isclose(rep["ppl_err"], rep["ppl"] * np.std(nll, ddof=1) / math.sqrt(len(nll)), rel_tol=0.05)
    assert abs(float(np.mean(shifted)) - float(np.mean(nll))) > 0.05


def test_score_window_rows_are_the_prefix_logits(models) -> None:
    eng = ds4.Engine(models["q2"], threads=1)
    w = np.arange(3, 3 + 12, dtype=np.int32)
    rows = [r.copy() for r in score_window(eng.session(ctx=13), w)]
    assert len(rows) == 6
    for k in (0, 3, 5):
        s = eng.session(ctx=13)
        s.sync(w[:6 + k].tolist())
        np.testing.assert_array_equal(rows[k], s.logits)


def test_score_window_batches_through_verify_when_available(models) -> None:
    """With a session that offers batched verification (verify/accept), the scored half goes through
    it in blocks of max_verify and yields the same rows as token-by-token decode."""
    eng = ds4.Engine(models["q2"], threads=1)

    class Verifying:
        """verify/accept written with eval, so only the block logic is under test here."""

        def __init__(self) -> None:
            self.s, self.max_verify, self.calls = eng.session(ctx=40), 4, []

        def __getattr__(self, name):
            return getattr(self.s, name)

        def verify(self, toks):
            self.calls.append(len(toks))
            snap, rows = self.s.snapshot(), []
            for t in toks:
                self.s.eval(t)
                rows.append(self.s.logits.copy())
            self.s.restore(snap)
            self.pending = list(toks)
            return np.array(rows)

        def accept(self, n):
            for t in self.pending[:n]:
                self.s.eval(t)

    w = np.arange(3, 3 + 22, dtype=np.int32)
    fake = Verifying()
    got = [r.copy() for r in score_window(fake, w)]
    want = [r.copy() for r in score_window(eng.session(ctx=40), w)]
    assert fake.calls == [4, 4, 2] and len(got) == len(want) == 11
    np.testing.assert_array_equal(np.array(got), np.array(want))


def test_self_comparison_is_exactly_zero(capsys, text, models, tmp_path) -> None:
    base = tmp_path / "q2.logits"
    _run(capsys, "-m", models["q2"], "-f", text, "--save-logits", base)
    r = LogitsReader(base)
    assert (r.n_windows, r.window, r.scored, r.n_vocab) == (3, WINDOW, WINDOW // 2, 512)
    assert base.stat().st_size % 2 == 0 and base.stat().st_size > 3 * (WINDOW * 4 + (WINDOW // 2) * 512 * 2)
    _run(capsys, "-m", models["q2"], "--kl-divergence", base, "--json", tmp_path / "k.json")   # tokens from BASE
    k = json.loads((tmp_path / "k.json").read_text())["kl_divergence"]
    assert k["tokens"] == 3 * (WINDOW // 2)
    assert k["kl_mean"] == 0.0 and k["kl_max"] == 0.0 and k["top1_agreement"] == 1.0
    assert k["dp_min"] == 0.0 and k["dp_max"] == 0.0


def test_q2_vs_q4_has_positive_kl(capsys, text, models, tmp_path) -> None:
    base = tmp_path / "q4.logits"
    _run(capsys, "-m", models["q4"], "-f", text, "--save-logits", base)
    out, _ = _run(capsys, "-m", models["q2"], "-f", text, "--kl-divergence", base, "--json", tmp_path / "k.json")
    k = json.loads((tmp_path / "k.json").read_text())["kl_divergence"]
    # Same seed, routed experts quantised to 2 vs 4 bits: the tiny random model is very sensitive
    # (measured mean KL ~1.3 nats, top-1 agreement ~5 %); any real difference is far above 0.
    assert k["kl_mean"] > 0.1 and k["kl_min"] >= -1e-9 and k["top1_agreement"] < 1.0
    assert "Mean KL(base||this)" in out and "Same top-1 token" in out and "Δp" in out


def test_kl_stats_formula() -> None:
    """KL(base || this), top-1 and Δp on two explicit distributions (within float16 storage error)."""
    p = np.array([[0.7, 0.2, 0.1]])
    q = np.array([[0.5, 0.3, 0.2]])
    k = KlStats()
    k.add(np.log(p).astype(np.float16), np.log(q), np.array([1]))
    want = float((p * np.log(p / q)).sum())
    assert abs(k.kl[0] - want) < 1e-3 and k.same_top == [True] and abs(k.dp[0] - 0.1) < 1e-3
    k.add(np.log(p).astype(np.float16), np.log(q[:, ::-1]), np.array([0]))
    assert k.same_top[-1] is False


def test_nll_stats() -> None:
    s = NllStats()
    s.add([1.0, 2.0, 3.0])
    assert math.isclose(s.ppl, math.e ** 2) and math.isclose(s.ppl_err, math.e ** 2 * 1.0 / math.sqrt(3))


def test_logits_file_errors(tmp_path, text, models, capsys) -> None:
    p = tmp_path / "b.logits"
    with LogitsWriter(p, n_vocab=512, window=WINDOW, scored=WINDOW // 2) as w:
        w.append(np.zeros(WINDOW, np.int32), np.zeros((WINDOW // 2, 512)))
    data = p.read_bytes()
    (tmp_path / "cut.logits").write_bytes(data[:-3])
    with pytest.raises(LogitsFileError, match="cut.logits: truncated"):
        LogitsReader(tmp_path / "cut.logits")
    (tmp_path / "junk.logits").write_bytes(b"hello world, not logits")
    with pytest.raises(LogitsFileError, match="junk.logits: not a ds4 logits file"):
        LogitsReader(tmp_path / "junk.logits")
    # Other tokens than this run's text, and another window size: named errors, exit status 2.
    assert main(["perplexity", "-m", str(models["q2"]), "-f", str(text), "-c", str(WINDOW),
                 "--kl-divergence", str(p)]) == 2
    assert "window 0 holds other tokens" in capsys.readouterr().err
    assert main(["perplexity", "-m", str(models["q2"]), "-c", "64", "--kl-divergence", str(p)]) == 2
    assert "saved with windows of 32 tokens, --ctx is 64" in capsys.readouterr().err
    with pytest.raises(LogitsFileError, match="expected"):
        with LogitsWriter(tmp_path / "x.logits", n_vocab=4, window=3, scored=2) as w:
            w.append(np.zeros(3), np.zeros((3, 4)))
    assert not (tmp_path / "x.logits").exists() and not list(tmp_path.glob("x.logits.tmp*"))


def test_interrupted_save_leaves_no_file(monkeypatch, tmp_path, text, models) -> None:
    import ds4.perplexity as ppl

    real = ppl.score_window
    calls = {"n": 0}

    def flaky(session, tokens):
        calls["n"] += 1
        if calls["n"] == 2:
            raise KeyboardInterrupt
        return real(session, tokens)

    monkeypatch.setattr(ppl, "score_window", flaky)
    out = tmp_path / "partial.logits"
    rc = main(["perplexity", "-m", str(models["q2"]), "-f", str(text), "-c", str(WINDOW), "--save-logits", str(out)])
    assert rc == 130 and not out.exists() and not list(tmp_path.glob("partial.logits.tmp*"))
