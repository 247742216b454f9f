"""Speculative decoding on a :class:`~ds4.session.Session` (docs/speculative.md).

One *cycle* commits the token already chosen (``first``) and proposes up to ``n`` more with a
draft source (the model's MTP block by default); the target model checks them all in one batched
pass (:meth:`Session.verify`) and the session keeps what the rule accepts (:meth:`Session.accept`),
rolling the rest back exactly.

* Greedy (``temperature <= 0``): drafts are accepted while they equal the target's argmax; the
  output is token for token plain greedy decoding.
* Sampled: draft ``d`` drawn from the draft distribution q is accepted with probability
  ``min(1, p(d) / q(d))`` (p: the target's distribution under the same knobs,
  :func:`ds4.sampling.probabilities`); the first rejection is replaced by a draw from the
  normalised residual ``max(0, p - q)``. The output distribution is exactly the target's (not
  the same tokens as plain sampling with the same seed: the RNG is drawn more often).

Example (greedy, the MTP block drafting)::

    >>> import ds4, ds4.testing
    >>> eng = ds4.Engine(ds4.testing.cached_model("tiny", mtp=True), threads=1)
    >>> s = eng.session(ctx=64); s.sync([5, 6, 7])
    >>> first = s.argmax()
    >>> step = greedy_cycle(s, first, 3)
    >>> step.committed[0] == first and len(step.committed) == 1 + step.accepted
    True
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Sequence

import numpy as np

from .errors import InvalidArgumentError
from .sampling import Rng, SamplingParams, argmax, probabilities, sample

if TYPE_CHECKING:  # pragma: no cover
    from .session import Session

__all__ = ["Cycle", "DraftFn", "Speculator", "greedy_cycle", "sampled_cycle", "resolve_drafts", "logit_margin",
           "check_margin", "DEFAULT_MARGIN", "DEFAULT_BACKOFF"]

# draft source: (session, first, n) -> up to n draft tokens (greedy) ; the default is the MTP block
DraftFn = Callable[["Session", int, int], Sequence[int]]

DEFAULT_MARGIN = 3.0                # upstream's --mtp-margin default (logit units)
DEFAULT_BACKOFF = (0, 4, 16, 64)    # plain tokens after the 1st, 2nd, 3rd, ... consecutive failure


def logit_margin(logits) -> float:
    """Top-1 minus top-2 logit: the MTP block's confidence in its draft (upstream's logits_top2;
    float32 arithmetic as there). NaN never ranks, a maximum reached twice gives 0, and with no
    logit above -inf the result is NaN, which fails every margin test."""
    a = np.asarray(logits, dtype=np.float32).ravel()
    i = int(np.argmax(a))   # the first NaN if there is one, so a number here means no NaN at all
    if np.isnan(a[i]):
        a = a[~np.isnan(a)]
        if a.size == 0:
            return float("nan")
        i = int(np.argmax(a))
    rest = max(a[:i].max(initial=-np.inf), a[i + 1:].max(initial=-np.inf))
    with np.errstate(invalid="ignore"):   # -inf - -inf
        return float(a[i] - np.float32(rest))


def check_margin(margin) -> float:
    """The margin as the float32 the gate compares with (upstream parses 0..1000; 0 turns it off)."""
    try:
        m = float(margin)
    except (TypeError, ValueError):
        raise InvalidArgumentError(f"the MTP margin must be a number, got {margin!r}") from None
    if not 0.0 <= m <= 1000.0:
        raise InvalidArgumentError(f"the MTP margin must be in [0, 1000], got {margin!r}")
    return float(np.float32(m))


@dataclass(frozen=True)
class Cycle:
    """What one cycle committed: ``committed`` (first, then the accepted drafts), how many drafts
    were proposed and accepted, and ``next_token``: the token the next cycle starts with when the
    rule already chose it (a resampled rejection), else None (take it from the session's logits)."""

    committed: tuple[int, ...]
    drafted: int
    accepted: int
    next_token: int | None = None


def _room(session: "Session", n: int) -> int:
    return max(0, min(int(n), session.max_verify - 1))


def greedy_cycle(session: "Session", first: int, n: int, draft: DraftFn | None = None,
                 stop: int | None = None, margin: float | None = None) -> Cycle:
    """Commit ``first`` and up to ``n`` drafts greedy decoding agrees with (one batched pass).

    ``draft`` replaces the MTP block as the draft source (benchmarks inject perfect or random
    drafts). Drafts end before ``stop`` (EOS): plain decoding never evaluates it, so neither does
    a cycle, and the committed state stays plain decoding's. ``margin`` (MTP only): the chain ends
    before the first draft whose :func:`logit_margin` is below it; with no draft left the cycle is
    a plain decode.
    """
    k = _room(session, n)
    if k == 0:
        session.eval(first)
        return Cycle((int(first),), 0, 0)
    if draft is not None:
        drafts = list(draft(session, first, k))[:k]
    else:
        drafts = session.mtp_drafts(first, k, stop, margin)[:k]
    if stop is not None and stop in drafts:
        drafts = drafts[: drafts.index(stop)]
    if not drafts:
        session.eval(first)
        return Cycle((int(first),), 0, 0)
    c = session.speculate(first, drafts)
    return Cycle((int(first), *map(int, drafts[: c - 1])), len(drafts), c - 1)


def resolve_drafts(p_rows: np.ndarray, q_rows: Sequence[np.ndarray], drafts: Sequence[int], rng: Rng):
    """The speculative-sampling rule over given distributions: (drafts accepted, replacement
    token or None). ``p_rows[j]`` is the target distribution at draft j's position (given the
    drafts before it), ``q_rows[j]`` the draft distribution d_j was drawn from."""
    for j, d in enumerate(drafts):
        p, q = p_rows[j], q_rows[j]
        pd, qd = float(p[d]), float(q[d])
        if qd > 0 and float(rng.uniform()) * qd < pd:   # u < p/q, i.e. accept with min(1, p/q)
            continue
        residual = np.maximum(p.astype(np.float64) - q.astype(np.float64), 0.0)
        total = residual.sum()
        if not total > 0:   # p <= q everywhere yet d rejected: only rounding; fall back to p
            residual, total = p.astype(np.float64), float(p.sum())
        cdf = np.cumsum(residual)
        r = float(rng.uniform()) * cdf[-1]
        return j, int(min(np.searchsorted(cdf, r, side="right"), len(cdf) - 1))
    return len(drafts), None


def sampled_cycle(session: "Session", first: int, n: int, params: SamplingParams, rng: Rng,
                  draft_logits: Callable[["Session", int], np.ndarray] | None = None,
                  stop: int | None = None, margin: float | None = None) -> Cycle:
    """Speculative sampling: commit ``first``, draw up to ``n`` drafts from the draft model under
    ``params`` (ending before a drafted ``stop``), verify them in one pass and keep what
    :func:`resolve_drafts` accepts.

    ``draft_logits(session, token)`` replaces the MTP chain step (default
    :meth:`Session.mtp_draft_step`). With ``params.temperature <= 0`` this is the greedy rule.
    ``margin``: drafting stops before a step whose :func:`logit_margin` is below it. The test
    reads only the step's logits, never the draw it leads to, so the kept drafts are still draws
    from q and the rule stays exact.
    """
    k = _room(session, n)
    if k == 0:
        session.eval(first)
        return Cycle((int(first),), 0, 0)
    step = draft_logits if draft_logits is not None else (lambda s, t: s.mtp_draft_step(t))
    kw = dict(temperature=params.temperature, top_k=params.top_k, top_p=params.top_p, min_p=params.min_p,
              engine=getattr(session, "engine", None))   # the engine's workers may split the passes
    drafts: list[int] = []
    q_rows: list[np.ndarray] = []
    tok = int(first)
    floor = None if margin is None else float(np.float32(margin))
    for _ in range(k):
        logits = step(session, tok)
        if floor is not None and not logit_margin(logits) >= floor:
            break
        q = probabilities(logits, **kw)
        tok = sample(logits, rng=rng, **kw) if params.temperature > 0 else argmax(logits)
        if tok == stop:   # never evaluated (as plain decoding): the target decides it next cycle
            break
        q_rows.append(q)
        drafts.append(tok)
    if not drafts:
        session.eval(first)
        return Cycle((int(first),), 0, 0)
    rows = session.verify([first, *drafts])
    p_rows = [probabilities(rows[j], **kw) for j in range(len(drafts))]
    accepted, replacement = resolve_drafts(p_rows, q_rows, drafts, rng)
    session.accept(accepted + 1)
    return Cycle((int(first), *drafts[:accepted]), len(drafts), accepted, replacement)


class Speculator:
    """Runs cycles for a decode loop, decides when drafting is worth a verification pass, and
    keeps the counts (``drafted``, ``accepted``, ``gated``: MTP cycles the gate made plain).

    The decision, per cycle (docs/speculative.md, "Policy"):

    * Back-off: ``backoff[i]`` plain one-token decodes follow the i-th consecutive *failure* (a
      cycle that spent drafting work and committed nothing extra; the last entry repeats), default
      0, 4, 16, 64. A waiting cycle does no draft work at all.
    * The MTP block (``draft=None``) is gated as upstream: its step-0 guess of the token being
      committed must equal ``first`` (one MTP step, which the chain reuses; the first cycle is a
      plain decode that runs that step for the second one), and the chain ends
      before the first draft whose top-1 minus top-2 logit is below ``margin`` (default 3; 0
      turns this part off). A gated cycle is a plain decode plus the MTP steps it took; when it
      is followed by one that checks again, the next step 0 runs inside that plain decode
      (:meth:`Session.eval_with_mtp`), costing the MTP layer but not a second pass over the head.
    * An injected ``draft`` source has no confidence to read, so it is probed for free: until one
      of its drafts has been accepted (from the start, and again after every failure) it is asked
      for a one-token guess of the next ``first`` while the current one is decoded plainly, and
      drafting resumes only when that guess comes true. A source that never agrees thus costs no
      verification pass at all.
    """

    def __init__(self, n: int, draft: DraftFn | None = None, margin: float = DEFAULT_MARGIN,
                 backoff: Sequence[int] = DEFAULT_BACKOFF) -> None:
        self.n = int(n)
        self.draft = draft
        self.margin = check_margin(margin)
        self.backoff = tuple(int(x) for x in backoff)
        if not self.backoff or min(self.backoff) < 0:
            raise InvalidArgumentError(f"backoff must be a non-empty list of counts >= 0, got {backoff!r}")
        self.drafted = self.accepted = self.gated = 0
        self._fails = self._wait = 0
        self._probing = True               # injected source: guess before verifying
        self._opened = False               # MTP: the first cycle was the plain one that feeds the gate
        self._guess: tuple[int, int] | None = None   # (session.pos, token) it guessed for that position

    def cycle(self, session: "Session", first: int, params: SamplingParams | None = None,
              rng: Rng | None = None, stop: int | None = None) -> Cycle:
        """Commit ``first`` and whatever the drafts add (greedy unless ``params`` samples)."""
        sampled = params is not None and params.temperature > 0
        if sampled and rng is None:
            raise InvalidArgumentError("sampled speculation needs an Rng")
        if self.n <= 0 or self._wait > 0:
            self._wait = max(0, self._wait - 1)
            return self._plain(session, first)
        mtp = self.draft is None or sampled   # sampled drafts come from the MTP logits
        if mtp and not self._opened:
            # The first cycle decodes plainly with step 0 inside (eval_with_mtp), so the first
            # check does not pay a pass over the output head of its own.
            self._opened = True
            return self._plain(session, first)
        if mtp:
            if not self._mtp_agrees(session, first):
                self.gated += 1
                return self._failed(session, first)
        elif self._probing:
            guess, self._guess = self._guess, None
            if guess is None or guess[0] != session.pos:
                return self._plain(session, first)   # nothing to check yet: guess for the next cycle
            if guess[1] != int(first):
                return self._failed(session, first)
        margin = self.margin if mtp and self.margin > 0 else None
        if sampled:
            cyc = sampled_cycle(session, first, self.n, params, rng, stop=stop, margin=margin)
        else:
            cyc = greedy_cycle(session, first, self.n, None if mtp else self.draft, stop, margin)
        self.drafted += cyc.drafted
        self.accepted += cyc.accepted
        if cyc.accepted:
            self._fails = 0
            self._probing = False
        else:
            if mtp and not cyc.drafted:
                self.gated += 1
            self._fail()
        return cyc

    @staticmethod
    def _mtp_agrees(session: "Session", first: int) -> bool:
        # One MTP step from the last committed token; cached per position, so a chain drafted
        # after it starts from this step instead of running it again.
        return session.mtp_draft() == int(first)

    def _fail(self) -> None:
        self._wait = self.backoff[min(self._fails, len(self.backoff) - 1)]
        self._fails += 1
        self._probing = True

    def _failed(self, session: "Session", first: int) -> Cycle:
        self._fail()
        return self._plain(session, first)

    def _plain(self, session: "Session", first: int) -> Cycle:
        # When the next cycle may speculate, its check is prepared here: an injected source
        # guesses that cycle's first token now (before the eval, where greedy_cycle asks it too);
        # the MTP's step 0 runs inside this eval, sharing the output head's pass.
        guess = None
        ahead = self._wait == 0 and self.n > 0
        if self.draft is not None and self._probing and ahead:
            guess = list(self.draft(session, first, 1))[:1]
        if self.draft is None and ahead:
            session.eval_with_mtp(first)
        else:
            session.eval(first)
        if guess:
            self._guess = (session.pos, int(guess[0]))
        return Cycle((int(first),), 0, 0)
