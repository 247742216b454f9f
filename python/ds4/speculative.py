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

__all__ = ["Cycle", "DraftFn", "Speculator", "greedy_cycle", "sampled_cycle", "resolve_drafts"]

# draft source: (session, first, n) -> up to n draft tokens (greedy) ; the default is the MTP block
DraftFn = Callable[["Session", int, int], Sequence[int]]


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
                 stop: int | None = None) -> Cycle:
    """Commit ``first`` and up to ``n`` drafts greedy decoding agrees with (one batched pass).

    ``draft`` replaces the MTP block as the draft source (benchmarks inject perfect or random
    drafts). Drafts end before ``stop`` (EOS): plain decoding never evaluates it, so neither does
    a cycle, and the committed state stays plain decoding's.
    """
    k = _room(session, n)
    if k == 0:
        session.eval(first)
        return Cycle((int(first),), 0, 0)
    drafts = list(draft(session, first, k) if draft is not None else session.mtp_drafts(first, k, stop))[:k]
    if stop is not None and stop in drafts:
        drafts = drafts[: drafts.index(stop)]
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
                  stop: int | None = None) -> Cycle:
    """Speculative sampling: commit ``first``, draw up to ``n`` drafts from the draft model under
    ``params`` (ending before a drafted ``stop``), verify them in one pass and keep what
    :func:`resolve_drafts` accepts.

    ``draft_logits(session, token)`` replaces the MTP chain step (default
    :meth:`Session.mtp_draft_step`). With ``params.temperature <= 0`` this is the greedy rule.
    """
    k = _room(session, n)
    if k == 0:
        session.eval(first)
        return Cycle((int(first),), 0, 0)
    step = draft_logits if draft_logits is not None else (lambda s, t: s.mtp_draft_step(t))
    kw = dict(temperature=params.temperature, top_k=params.top_k, top_p=params.top_p, min_p=params.min_p)
    drafts: list[int] = []
    q_rows: list[np.ndarray] = []
    tok = int(first)
    for _ in range(k):
        logits = step(session, tok)
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
    """Runs cycles for a decode loop and keeps the counts (``drafted``, ``accepted``).

    Back-off (this port's policy; upstream gates on the MTP logit margin instead): a cycle that
    accepts nothing makes the next ``skip`` cycles plain one-token decodes, ``skip`` growing
    ``first_skip``, then x ``growth`` up to ``max_skip`` (4, 16, 64) while drafts keep missing.
    Until a draft is accepted (from the start, and again after every miss) a cycle is a probe
    with ``probe`` drafts (1) instead of ``n``: a failed probe costs verify(2) instead of
    verify(n+1). The first hit makes every cycle draft ``n``. A draft source that never agrees
    then costs one failed two-token verification at tokens 0, 5, 22 and then every 65 tokens
    (docs/speculative.md, "Policy", for the measured costs).
    """

    def __init__(self, n: int, draft: DraftFn | None = None, max_skip: int = 64, first_skip: int = 4,
                 growth: int = 4, probe: int = 1) -> None:
        self.n = int(n)
        self.draft = draft
        self.max_skip, self.first_skip, self.growth, self.probe = int(max_skip), int(first_skip), int(growth), int(probe)
        self.drafted = self.accepted = 0
        self._skip = self._wait = 0
        self._probing = True

    def cycle(self, session: "Session", first: int, params: SamplingParams | None = None,
              rng: Rng | None = None, stop: int | None = None) -> Cycle:
        """Commit ``first`` and whatever the drafts add (greedy unless ``params`` samples)."""
        if self.n <= 0 or self._wait > 0:
            self._wait = max(0, self._wait - 1)
            session.eval(first)
            return Cycle((int(first),), 0, 0)
        n = min(self.n, self.probe) if self._probing else self.n
        if params is not None and params.temperature > 0:
            if rng is None:
                raise InvalidArgumentError("sampled speculation needs an Rng")
            cyc = sampled_cycle(session, first, n, params, rng, stop=stop)
        else:
            cyc = greedy_cycle(session, first, n, self.draft, stop)
        self.drafted += cyc.drafted
        self.accepted += cyc.accepted
        if cyc.drafted and not cyc.accepted:
            self._skip = min(self.max_skip, max(self.first_skip, self.growth * self._skip))
            self._wait = self._skip
            self._probing = True
        elif cyc.accepted:
            self._skip = 0
            self._probing = False
        return cyc
