"""Speculative decoding (docs/speculative.md): the verification pass and its rollback leave exactly
plain decode's state, greedy speculation emits plain greedy's tokens, and speculative sampling
keeps the target distribution.

Exactness is checked as byte equality (payloads, logits, hidden states): the batched pass and the
one-token decode compute the same bits, so nothing weaker is needed. Positions are chosen to cross
the places where the state changes shape: ratio-4 and ratio-128 compressor emissions (positions
3 mod 4, 127), the raw window filling up and wrapping (n_swa = 128 rows), and prompts prefilled in
4-token chunks (the engine's prefill_chunk, smaller than a 5-token verification batch), whose
frontier resets a decode must continue from.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest

import ds4
import ds4.testing
from ds4.errors import ContextOverflowError, InvalidArgumentError
from ds4.sampling import Rng, SamplingParams, argmax
from ds4.speculative import Speculator, check_margin, greedy_cycle, logit_margin, resolve_drafts, sampled_cycle


@pytest.fixture(scope="module", params=["tiny", "tiny-pro"])
def engine(request, tmp_path_factory):
    path = ds4.testing.write_model(tmp_path_factory.mktemp("spec") / "m.gguf", request.param, mtp=True, seed=3)
    return ds4.Engine(path, threads=2, prefill_chunk=4)


def _prompt(seed: int, n: int) -> list[int]:
    return np.random.default_rng(seed).integers(0, 512, n).tolist()


def _same_state(a: "ds4.Session", b: "ds4.Session") -> None:
    assert a.tokens == b.tokens
    assert a.save_payload() == b.save_payload()   # KV rows, counts, frontiers, logits: byte for byte
    assert np.array_equal(a.logits, b.logits)
    assert np.array_equal(a._s.last_hidden(), b._s.last_hidden())


# Verification batches starting at these positions cross: nothing (5), ratio-4 emissions and a
# prefill-chunk boundary (12..17 with chunks of 4), the ratio-128 emission at 127 and the raw
# window filling (123..127), a full, wrapping window (130).
STARTS = [5, 13, 123, 125, 127, 130]


@pytest.mark.parametrize("start", STARTS)
def test_accept_any_prefix_equals_eval(engine, start) -> None:
    n = 5
    prompt = _prompt(start, start)
    toks = _prompt(1000 + start, n)
    plain = engine.session(ctx=256)
    plain.sync(prompt)
    snap = plain.snapshot()
    spec = engine.session(ctx=256)
    for c in range(n + 1):
        if c:
            plain.eval(toks[c - 1])
        spec.restore(snap)
        rows = spec.verify(toks)
        assert rows.shape == (n, 512)
        spec.accept(c)
        assert spec.tokens == plain.tokens
        assert spec.save_payload() == plain.save_payload()   # rows, counts, frontiers, logits
        if c:
            assert np.array_equal(rows[c - 1], plain.logits)  # the verified row is decode's logits
            assert np.array_equal(spec._s.last_hidden(), plain._s.last_hidden())


def _plain_greedy(engine, prompt, n):
    s = engine.session(ctx=256)
    s.sync(prompt)
    out = []
    for _ in range(n):
        t = argmax(s.logits)
        out.append(t)
        s.eval(t)
    return out, s


@pytest.mark.parametrize("source", ["oracle", "random", "mtp"])
def test_greedy_speculation_is_plain_greedy(engine, source) -> None:
    # 2 prompts ending before the 128 boundaries x draft lengths 1..4 (16 with the oracle), 24
    # tokens each: drafts cross ratio-4 and ratio-128 emissions and the window wrap.
    g = np.random.default_rng(7)
    for prompt_len in (9, 117):
        prompt = _prompt(prompt_len, prompt_len)
        ref, ref_session = _plain_greedy(engine, prompt, 24)
        for n in ((1, 2, 3, 4, 16) if source == "oracle" else (1, 2, 4)):
            s = engine.session(ctx=256)
            s.sync(prompt)
            out: list[int] = []
            drafted = accepted = 0
            while len(out) < 24:
                first = argmax(s.logits)
                room = 24 - len(out) - 1
                if source == "oracle":
                    draft = lambda sess, f, k: ref[len(out) + 1: len(out) + 1 + k]
                elif source == "random":
                    draft = lambda sess, f, k: g.integers(0, 512, k).tolist()
                else:
                    draft = None
                cyc = greedy_cycle(s, first, min(n, room), draft)
                out += cyc.committed
                drafted += cyc.drafted
                accepted += cyc.accepted
            assert out == ref, (prompt_len, n)
            _same_state(s, ref_session)
            if source == "oracle":
                assert accepted == drafted > 0   # every draft right: all accepted
            if source == "random":
                assert accepted <= 2             # 1/512 chance per draft


def test_mtp_chain_is_rolled_back(engine) -> None:
    # Drafting and then decoding plainly leaves the MTP window as if no chain had run.
    prompt = _prompt(3, 20)
    a, b = engine.session(ctx=128), engine.session(ctx=128)
    for s in (a, b):
        s.sync(prompt)
        s.mtp_logits()
    first = a.argmax()
    assert len(a.mtp_drafts(first, 4)) == 4
    a.eval(first)
    b.eval(first)
    assert np.array_equal(a.mtp_logits(), b.mtp_logits())
    # a pending verification is discarded by any other call
    a.verify([1, 2, 3])
    _same_state(a, b)


def test_verify_limits(engine) -> None:
    s = engine.session(ctx=16)
    s.sync(_prompt(1, 12))
    assert s.max_verify == 3
    with pytest.raises(ContextOverflowError):
        s.verify([1, 2, 3, 4])
    with pytest.raises(InvalidArgumentError):
        s.verify([1, 600])
    s.verify([1, 2])
    with pytest.raises(InvalidArgumentError):
        s.accept(3)
    assert s.speculate(5, [6, 7, 8, 9]) >= 1   # drafts past the room are dropped
    assert s.pos <= 15


# ---- speculative sampling keeps the target distribution ---------------------------------------
#
# resolve_drafts on synthetic prefix-dependent distributions (vocab 5, one zero-probability token
# per row, 2 drafts, 20,000 trials): the first two output tokens must follow the target's joint
# law P(y1) P(y2 | y1). Chi-square over the 16 reachable pairs at alpha = 1e-3: a correct rule
# fails for a given seed with probability 1e-3 (the seeds are fixed, so the test is
# deterministic; it measures chi2 = 20.9 here). Accepting with probability p(d) instead of
# min(1, p/q) gives chi2 = 291, resampling from p instead of the residual 673 (checked by hand).

V = 5
CHI2_999_DF15 = 37.697   # upper 0.1% point of chi-square with 15 degrees of freedom (tables)


@functools.lru_cache(maxsize=None)
def _dist(prefix: tuple[int, ...], salt: int) -> np.ndarray:
    g = np.random.default_rng([salt, len(prefix), *prefix])
    w = g.random(V) ** 3
    w[g.integers(0, V)] = 0.0   # a zero-probability token in every row
    return (w / w.sum()).astype(np.float32)


def test_resolve_drafts_keeps_the_target_distribution() -> None:
    rng = Rng(20261201)
    g = np.random.default_rng(5)
    trials = 20000
    counts = np.zeros((V, V))
    for _ in range(trials):
        drafts, q_rows, prefix = [], [], ()
        for _ in range(2):
            q = _dist(prefix, 1)
            q64 = q.astype(np.float64)
            d = int(g.choice(V, p=q64 / q64.sum()))
            drafts.append(d)
            q_rows.append(q)
            prefix += (d,)
        p_rows = [_dist(tuple(drafts[:j]), 0) for j in range(3)]
        acc, repl = resolve_drafts(p_rows, q_rows, drafts, rng)
        out = drafts[:acc] + ([repl] if repl is not None else [])
        if len(out) < 2:   # the next token comes from the target after the accepted prefix
            p = _dist(tuple(out), 0).astype(np.float64)
            out.append(int(g.choice(V, p=p / p.sum())))
        counts[out[0], out[1]] += 1
    p1 = _dist((), 0).astype(np.float64)
    expected = np.array([[p1[a] * _dist((a,), 0)[b] for b in range(V)] for a in range(V)]) * trials
    live = expected > 0
    assert counts[~live].sum() == 0   # zero-probability pairs never come out
    chi2 = float(((counts[live] - expected[live]) ** 2 / expected[live]).sum())
    dof = int(live.sum()) - 1
    assert dof == 15   # 16 reachable pairs with these seeded distributions
    assert chi2 < CHI2_999_DF15, chi2


def test_sampled_cycle_end_to_end(engine) -> None:
    # On the model: sampled speculation commits a valid stream, the greedy knobs reproduce
    # greedy decoding, and the state after each cycle equals eval of the committed tokens.
    prompt = _prompt(11, 15)
    ref, ref_session = _plain_greedy(engine, prompt, 12)
    s = engine.session(ctx=256)
    s.sync(prompt)
    out: list[int] = []
    nxt = None
    while len(out) < 12:
        first = argmax(s.logits) if nxt is None else nxt
        cyc = sampled_cycle(s, first, min(3, 12 - len(out) - 1), SamplingParams(temperature=0.0), Rng(1))
        out += cyc.committed
        nxt = cyc.next_token
    assert out == ref
    _same_state(s, ref_session)
    # temperature 1: the committed tokens replayed with eval give the same state
    s2, s3 = engine.session(ctx=128), engine.session(ctx=128)
    s2.sync(prompt)
    s3.sync(prompt)
    rng = Rng(9)
    first = int(np.argmax(s2.logits))
    for _ in range(4):
        cyc = sampled_cycle(s2, first, 3, SamplingParams(temperature=1.0, min_p=0.0), rng)
        for t in cyc.committed:
            s3.eval(t)
        first = cyc.next_token if cyc.next_token is not None else int(np.argmax(s2.logits))
    _same_state(s2, s3)


def test_speculator_backoff_schedule(engine) -> None:
    # The policy on an injected source that agrees with greedy only on positions 40..59: it is
    # asked for one-token guesses (free probes) while it misses, with 0, 4, 16, 16 plain steps
    # after consecutive misses; a guess that comes true resumes n-draft verification; the first
    # verified miss (position 60) restarts guessing with no wait. The output is plain greedy's.
    prompt = _prompt(21, 7)
    ref = engine.session(ctx=256)
    ref.sync(prompt)
    oracle = []
    for _ in range(120):
        oracle.append(ref.argmax())
        ref.eval(oracle[-1])
    s = engine.session(ctx=256)
    s.sync(prompt)
    out: list[int] = []
    asked: list[tuple[int, int]] = []

    def source(sess, first, k):
        asked.append((len(out), k))
        cont = oracle[len(out) + 1: len(out) + 1 + k]
        return [t if 40 <= len(out) + 1 + j < 60 else (t + 1) % engine.shape.n_vocab for j, t in enumerate(cont)]

    spec = Speculator(3, draft=source, backoff=(0, 4, 16))
    while len(out) < 100:
        out += spec.cycle(s, s.argmax()).committed
    assert out == oracle[: len(out)]
    # guesses at 0, 1 (no wait after the first miss), 6, 23, 40 (after 4, 16, 16 plain steps); the
    # one made at 40 (for position 41) comes true, so the cycle at 41 verifies 3 drafts
    assert asked[:9] == [(0, 1), (1, 1), (6, 1), (23, 1), (40, 1), (41, 3), (45, 3), (49, 3), (53, 3)]
    # the cycle at 57 keeps 58, 59 and misses 60; the one at 60 misses all three: guessing again
    # at 61 (no wait), and after its miss at 62 a wait of 4
    i = asked.index((60, 3))
    assert asked[i - 1: i + 3] == [(57, 3), (60, 3), (61, 1), (66, 1)]
    assert (spec.drafted, spec.accepted) == (18, 14)
    assert spec.gated == 0   # the gate counts MTP cycles only


def _mtp_session(engine, prompt, ctx=128):
    s = engine.session(ctx=ctx)
    s.sync(prompt)
    return s


def test_mtp_gate_agreement_and_margin(engine) -> None:
    # Upstream's gate on the real MTP block: no drafting unless step 0's guess equals the token
    # being committed, nor unless the first draft's top-1 minus top-2 logit reaches the margin.
    # Both directions are checked, so a gate that always or never drafts fails here. The first
    # cycle of a Speculator is a plain decode (it runs step 0 for the second cycle's check).
    prompt = _prompt(31, 20)
    probe = _mtp_session(engine, prompt)
    t0 = probe.argmax()
    probe.eval(t0)
    guess = probe.mtp_draft()
    assert guess == argmax(probe.mtp_logits())
    m1 = logit_margin(probe.mtp_draft_step(guess))
    assert np.isfinite(m1) and m1 > 0
    other = (guess + 1) % engine.shape.n_vocab
    above = float(np.nextafter(np.float32(m1), np.float32(np.inf)))

    def run(first, margin):
        s = _mtp_session(engine, prompt)
        spec = Speculator(3, margin=margin)
        opening = spec.cycle(s, t0)
        assert (opening.committed, opening.drafted, spec.gated) == ((t0,), 0, 0)
        cyc = spec.cycle(s, first)
        plain = _mtp_session(engine, prompt)
        for t in opening.committed + cyc.committed:
            plain.eval(t)
        _same_state(s, plain)
        return cyc, spec

    cyc, spec = run(other, 0.0)          # step 0 disagrees: plain decode, one failure
    assert (cyc.drafted, spec.gated, cyc.committed) == (0, 1, (other,))
    cyc, spec = run(guess, 0.0)          # agrees, no margin test: drafts
    assert cyc.drafted == 3 and spec.gated == 0
    cyc, spec = run(guess, m1)           # margin exactly reached: drafts
    assert cyc.drafted >= 1 and spec.gated == 0
    cyc, spec = run(guess, above)        # one ulp short: gated
    assert cyc.drafted == 0 and spec.gated == 1


def test_mtp_drafts_stop_at_the_margin(engine) -> None:
    # The C++ chain (Session.mtp_drafts with a margin) against the Python margins of the same
    # chain's steps: it keeps exactly the drafts before the first step whose margin is below the
    # floor, and they are the steps' argmax tokens.
    prompt = _prompt(32, 25)
    twin = _mtp_session(engine, prompt)
    first = twin.argmax()
    toks, margins, tok = [], [], first
    for _ in range(5):
        logits = twin.mtp_draft_step(tok)
        margins.append(logit_margin(logits))
        tok = argmax(logits)
        toks.append(tok)
    assert len(set(np.round(margins, 3))) > 1   # distinct margins: thresholds between them cut the chain
    for floor in sorted(set(margins)) + [max(margins) + 1.0]:
        s = _mtp_session(engine, prompt)
        keep = next((j for j, m in enumerate(margins) if m < np.float32(floor)), 5)
        assert s.mtp_drafts(first, 5, margin=floor) == toks[:keep], floor
    assert _mtp_session(engine, prompt).mtp_drafts(first, 5) == toks


def test_sampled_cycle_margin(engine) -> None:
    # sampled_cycle's margin reads each step's logits before drawing from them: drafting stops at
    # the first step below the floor (the draws before it are unchanged).
    prompt = _prompt(33, 18)
    seen: list[float] = []

    def step(sess, token):
        logits = sess.mtp_draft_step(token)
        seen.append(logit_margin(logits))
        return logits

    params = SamplingParams(temperature=1.0, min_p=0.0)
    s = _mtp_session(engine, prompt)
    sampled_cycle(s, s.argmax(), 4, params, Rng(3), draft_logits=step)
    full = list(seen)
    assert len(full) == 4
    floor = sorted(full)[1]   # the second-smallest margin: some step falls below it
    cut = next(j for j, m in enumerate(full) if m < np.float32(floor))
    seen.clear()
    s = _mtp_session(engine, prompt)
    cyc = sampled_cycle(s, s.argmax(), 4, params, Rng(3), draft_logits=step, margin=floor)
    assert cyc.drafted == cut and seen == full[: cut + 1]


@pytest.mark.parametrize("margin", [0.0, 3.0])
def test_speculator_mtp_is_plain_greedy(engine, margin) -> None:
    # The gated MTP policy through whole generations (back-off, gate, verification): plain
    # greedy's tokens and final state.
    prompt = _prompt(34, 30)
    ref, ref_session = _plain_greedy(engine, prompt, 40)
    s = engine.session(ctx=256)
    s.sync(prompt)
    spec = Speculator(3, margin=margin, backoff=(0, 1))
    out: list[int] = []
    while len(out) < 40:
        spec.n = min(3, 40 - len(out) - 1)
        out += spec.cycle(s, s.argmax()).committed
    assert out == ref
    _same_state(s, ref_session)
    assert spec.gated > 0   # random MTP weights: step 0 rarely agrees


def test_logit_margin() -> None:
    # top-1 minus top-2 in float32 against a sort; ties give 0, NaN never ranks, -inf counts
    g = np.random.default_rng(8)
    for _ in range(200):
        a = g.normal(size=int(g.integers(2, 50))).astype(np.float32)
        if g.random() < 0.3:
            a[g.integers(0, a.size)] = a.max()       # a tied maximum
        if g.random() < 0.3:
            a[g.integers(0, a.size, 3)] = np.nan
        if g.random() < 0.2:
            a[g.integers(0, a.size, 2)] = -np.inf
        v0 = v1 = np.float32(-np.inf)   # upstream's logits_top2 loop, the definition
        for v in a:
            if v > v0:
                v0, v1 = v, v0
            elif v > v1:
                v1 = v
        with np.errstate(invalid="ignore"):
            want = float(v0 - v1)
        got = logit_margin(a)
        assert got == want or (np.isnan(want) and np.isnan(got)), (a, got, want)
        b = np.sort(a[~np.isnan(a)])[::-1]
        if b.size >= 2 and np.isfinite(b[:2]).all():
            assert got == float(b[0] - b[1])
    assert logit_margin(np.array([1.0, 1.0, 0.0], np.float32)) == 0.0
    assert np.isnan(logit_margin(np.full(4, -np.inf, np.float32)))
    assert np.isnan(logit_margin(np.full(4, np.nan, np.float32)))


def test_margin_arguments() -> None:
    assert check_margin(3) == 3.0 and check_margin(0) == 0.0
    for bad in (-1, 1001, float("nan"), "x"):
        with pytest.raises(InvalidArgumentError):
            check_margin(bad)
    with pytest.raises(InvalidArgumentError):
        Speculator(2, backoff=())
    with pytest.raises(InvalidArgumentError):
        Speculator(2, backoff=(0, -1))


# ---- exposure: generate() and the CLI ---------------------------------------------------------


@pytest.fixture
def gate_open(monkeypatch):
    """The MTP's step-0 guess always counts as agreeing: a synthetic model's random MTP weights
    almost never agree with the target, so without this the exposure tests below would never see
    a verification pass (the gate itself: test_mtp_gate_agreement_and_margin). Pass margin 0."""
    monkeypatch.setattr(Speculator, "_mtp_agrees", staticmethod(lambda session, first: True))


def test_generate_speculative(engine, gate_open) -> None:
    # greedy: same tokens and the same final session state as plain decoding; counts reported
    a, b = engine.session(ctx=256), engine.session(ctx=256)
    kw = dict(max_tokens=20, temperature=0, think=False, stream=False)
    plain = engine.generate("hello there", session=a, **kw)
    spec = engine.generate("hello there", session=b, speculative=3, mtp_margin=0, **kw)
    assert spec.tokens == plain.tokens and spec.finish_reason == plain.finish_reason
    assert a.save_payload() == b.save_payload()
    assert spec.usage.drafted_tokens > 0 and plain.usage.drafted_tokens == 0
    assert 0 <= spec.usage.accepted_tokens <= spec.usage.drafted_tokens
    # sampled: a valid stream of the requested length with drafts counted
    fin = engine.generate("hello there", max_tokens=12, temperature=1.0, seed=4, think=False, stream=False,
                          speculative=2, mtp_margin=0)
    assert (len(fin.tokens) == 12 or fin.finish_reason == "eos") and fin.usage.drafted_tokens > 0
    with pytest.raises(InvalidArgumentError):
        engine.generate("x", max_tokens=2, speculative=-1, stream=False)
    with pytest.raises(InvalidArgumentError):
        engine.generate("x", max_tokens=2, speculative=2, mtp_margin=-1, stream=False)


def test_generate_margin_reaches_the_gate(engine) -> None:
    # generate()'s mtp_margin is the gate's floor: with step 0 forced to agree, an unreachable
    # margin drafts nothing, margin 0 drafts (the gate is real here: only step 0 is patched).
    kw = dict(max_tokens=10, temperature=0, think=False, stream=False, speculative=3)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Speculator, "_mtp_agrees", staticmethod(lambda session, first: True))
        assert engine.generate("hello there", mtp_margin=1000, **kw).usage.drafted_tokens == 0
        assert engine.generate("hello there", mtp_margin=0, **kw).usage.drafted_tokens > 0


def test_generate_speculative_needs_mtp(tmp_path) -> None:
    from ds4.errors import UnsupportedModelError

    eng = ds4.Engine(ds4.testing.default_model_path(), threads=1)
    with pytest.raises(UnsupportedModelError):
        eng.generate("x", max_tokens=2, speculative=2, stream=False)


def test_cli_mtp_flags(engine, capsys, gate_open) -> None:
    from ds4.cli import main

    argv = ["generate", "-m", str(engine.path), "-p", "hi", "-n", "6", "--temp", "0", "--nothink", "-t", "1"]
    assert main(argv) == 0
    plain = capsys.readouterr()
    assert main(argv + ["--mtp", "--mtp-draft", "2", "--mtp-margin", "0"]) == 0
    spec = capsys.readouterr()
    assert spec.out == plain.out
    assert "drafts accepted" in spec.err
    assert main(argv + ["--mtp", "--mtp-draft", "2", "--mtp-margin", "1000"]) == 0
    assert capsys.readouterr().out == plain.out   # nothing drafted: no drafts reported
    assert main(argv + ["--mtp", "--mtp-margin", "-2"]) != 0
    assert "margin" in capsys.readouterr().err
    assert main(["generate", "-p", "hi", "-n", "2", "--mtp"]) != 0   # the bundled tiny model has no MTP
    assert "embeds no MTP block" in capsys.readouterr().err


def test_server_mtp_draft(engine, gate_open) -> None:
    # ds4 serve --mtp-draft: greedy answers equal plain decoding's; the counts reach the worker.
    import json
    import urllib.request

    from ds4.server import Server, ServerConfig

    body = {"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 10, "temperature": 0,
            "thinking": False}
    answers = []
    for draft in (0, 3):
        srv = Server(engine, ServerConfig(port=0, ctx=256, default_tokens=16, mtp_draft=draft, mtp_margin=0)).start()
        try:
            req = urllib.request.Request(srv.url + "/v1/chat/completions", data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=60) as f:
                answers.append(json.loads(f.read()))
            drafted = srv.worker.drafted
        finally:
            srv.stop()
        assert (drafted > 0) == (draft > 0)
    plain, spec = answers
    assert spec["choices"][0]["message"] == plain["choices"][0]["message"]
    assert spec["usage"]["completion_tokens"] == plain["usage"]["completion_tokens"] == 10


def test_serve_mtp_flags_are_checked(capsys) -> None:
    # ds4 serve --mtp-draft / --mtp-margin: out-of-range values and a model without an MTP block
    # are refused before anything listens.
    from ds4.cli import main

    tiny = str(ds4.testing.default_model_path())
    for argv, words in ((["--mtp-draft", "17"], "--mtp-draft"), (["--mtp-draft", "2", "--mtp-margin", "-1"], "margin"),
                        (["--mtp-draft", "2"], "embeds no MTP block")):
        assert main(["serve", "-m", tiny, "--port", "0", "-t", "1", *argv]) != 0
        assert words in capsys.readouterr().err


@pytest.mark.parametrize("start", [5, 13, 127, 130])
def test_eval_with_mtp_equals_eval_then_step0(engine, start) -> None:
    # The fused decode + MTP step 0 (one two-row head product) leaves byte for byte what eval()
    # then mtp_logits() leave: the payload, logits, hidden state, step-0 logits, and the drafts
    # that chain from them (the MTP window and the HC the chain starts from).
    prompt = _prompt(40 + start, start)
    a, b = _mtp_session(engine, prompt, 256), _mtp_session(engine, prompt, 256)
    tok = a.argmax()
    a.eval_with_mtp(tok)
    b.eval(tok)
    step0 = b.mtp_logits()
    _same_state(a, b)
    assert np.array_equal(a.mtp_logits(), step0)
    nxt = a.argmax()
    assert a.mtp_drafts(nxt, 4) == b.mtp_drafts(nxt, 4)
    # and the state after more decoding agrees too (the MTP window's rows)
    for _ in range(3):
        t = a.argmax()
        a.eval_with_mtp(t)
        b.eval(t)
        assert np.array_equal(a.mtp_logits(), b.mtp_logits())
    _same_state(a, b)


def test_eval_with_mtp_bad_input(engine) -> None:
    # the same refusals as eval(), and none of them changes the session
    from ds4.errors import UnsupportedModelError

    s = _mtp_session(engine, _prompt(50, 14), ctx=16)
    before = s.save_payload()
    for bad, err in ((-1, InvalidArgumentError), (10**6, InvalidArgumentError), (2**63, InvalidArgumentError)):
        with pytest.raises(err):
            s.eval_with_mtp(bad)
    assert s.save_payload() == before
    s.eval_with_mtp(3)
    with pytest.raises(ContextOverflowError):   # 15 of 16: one slot stays free
        s.eval_with_mtp(4)
    plain = ds4.Engine(ds4.testing.default_model_path(), threads=1).session(ctx=32)
    plain.sync([1, 2, 3])
    with pytest.raises(UnsupportedModelError):
        plain.eval_with_mtp(4)
