"""Perplexity over a text and KL divergence against saved next-token distributions
(``ds4 perplexity``; docs/quality.md).

Method (llama.cpp's ``perplexity`` windows): the text is tokenized once (plain, no chat template);
the tokens are cut into consecutive, non-overlapping chunks of ``window - 1`` tokens and each
chunk, preceded by BOS, is evaluated in a fresh timeline. In every window the first
``window // 2`` tokens are context only; each later token is scored with the model's
log-probability of it given all the window's tokens before it. Perplexity is
``exp(mean NLL)`` over all scored tokens; its uncertainty is the delta-method standard error
``PPL * std(NLL) / sqrt(n)``, which treats tokens as independent (neighbouring tokens are
correlated, so the true uncertainty is somewhat larger).

KL divergence compares a run's distributions with a base run saved by ``--save-logits``
(:mod:`ds4.logits_file`), position by position over the same tokens: ``KL(base || this)``, top-1
agreement (same most likely token) and ``Δp``, the change in probability of the text's actual
next token (this run minus base).

    >>> s = NllStats(); s.add([1.0, 1.0, 1.0])
    >>> round(s.ppl, 4), s.ppl_err
    (2.7183, 0.0)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Iterator, Sequence

import numpy as np

from .errors import InvalidArgumentError, LogitsFileError
from .logits_file import quantize_rows

if TYPE_CHECKING:  # pragma: no cover
    from .engine import Engine
    from .logits_file import LogitsReader

__all__ = ["make_windows", "scored_count", "score_window", "log_softmax", "NllStats", "KlStats", "WindowResult",
           "run_windows", "DP_PERCENTILES", "KL_PERCENTILES"]

_BLOCK = 16   # rows per float64 block
DP_PERCENTILES = (0.1, 1, 5, 10, 25, 50, 75, 90, 95, 99, 99.9)
KL_PERCENTILES = (50, 90, 99, 99.9)


def scored_count(window: int) -> int:
    """Tokens scored per window: the second half (the first ``window // 2`` are context)."""
    return window - window // 2


def make_windows(tokens: Sequence[int], window: int, bos: int, max_windows: int | None = None) -> list[np.ndarray]:
    """``[BOS] + chunk`` for consecutive chunks of ``window - 1`` text tokens (a short tail is dropped)."""
    if window < 4:
        raise InvalidArgumentError(f"the perplexity window must be at least 4 tokens, got {window}")
    per = window - 1
    n = len(tokens) // per
    if max_windows is not None:
        n = min(n, int(max_windows))
    if n <= 0:
        raise InvalidArgumentError(f"the text has {len(tokens)} tokens; one window of --ctx {window} needs at "
                                   f"least {per} (lower --ctx or use a longer text)")
    t = np.asarray(tokens, np.int32)
    return [np.concatenate(([bos], t[i * per:(i + 1) * per])).astype(np.int32) for i in range(n)]


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """float64 log-probabilities of one row or a batch of rows."""
    x = np.asarray(logits, np.float64)
    m = x.max(axis=-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))


def score_window(session, tokens: np.ndarray) -> Iterator[np.ndarray]:
    """The logits predicting each scored token of one window, in order (may be views: copy to keep).

    The context half is one prefill. The scored half runs in batched verification passes
    (``Session.verify`` + ``accept``: every position's logits from one batch, the same numbers
    decode gives) when the session has them, else token by token with ``eval``.
    """
    first = len(tokens) // 2
    rest = [int(t) for t in tokens[first:-1]]   # evaluated after the context; the last token only scored
    session.reset()
    session.sync([int(t) for t in tokens[:first]])
    yield session.logits
    verify = getattr(session, "verify", None)
    i = 0
    while i < len(rest):
        if verify is not None:
            n = min(int(session.max_verify), len(rest) - i)
            rows = verify(rest[i:i + n])
            session.accept(n)
            yield from rows
            i += n
        else:
            session.eval(rest[i])
            yield session.logits
            i += 1


@dataclass
class NllStats:
    """Running negative log-likelihoods (nats) of scored tokens."""

    values: list[float] = field(default_factory=list)

    def add(self, nll: Sequence[float]) -> None:
        self.values.extend(float(v) for v in nll)

    @property
    def n(self) -> int:
        return len(self.values)

    @property
    def mean(self) -> float:
        return float(np.mean(self.values)) if self.values else math.nan

    @property
    def ppl(self) -> float:
        return math.exp(self.mean)

    @property
    def ppl_err(self) -> float:
        """Delta-method standard error of the perplexity (tokens taken as independent)."""
        if self.n < 2:
            return math.nan
        return self.ppl * float(np.std(self.values, ddof=1)) / math.sqrt(self.n)


@dataclass
class KlStats:
    """Per-token comparison with a base run: KL(base || this), top-1 agreement, Δp of the actual token."""

    kl: list[float] = field(default_factory=list)
    same_top: list[bool] = field(default_factory=list)
    dp: list[float] = field(default_factory=list)
    base_nll: NllStats = field(default_factory=NllStats)

    def add(self, base_rows: np.ndarray, logprobs: np.ndarray, targets: np.ndarray) -> None:
        """``base_rows`` as stored (float16), ``logprobs`` this run's log-probabilities; both are
        taken through the stored precision and renormalised, so identical runs give exactly 0."""
        lb = log_softmax(np.asarray(base_rows, np.float64))
        lc = log_softmax(quantize_rows(logprobs).astype(np.float64))
        pb = np.exp(lb)
        idx = np.arange(len(targets))
        self.kl.extend((pb * (lb - lc)).sum(axis=1).tolist())
        self.same_top.extend((lb.argmax(axis=1) == lc.argmax(axis=1)).tolist())
        self.dp.extend((np.exp(lc[idx, targets]) - pb[idx, targets]).tolist())
        self.base_nll.add((-lb[idx, targets]).tolist())

    @property
    def n(self) -> int:
        return len(self.kl)

    def summary(self) -> dict:
        kl, dp = np.asarray(self.kl), np.asarray(self.dp)
        if kl.size == 0:
            return {}
        out = {
            "tokens": int(kl.size),
            "kl_mean": float(kl.mean()),
            "kl_mean_err": float(kl.std(ddof=1) / math.sqrt(kl.size)) if kl.size > 1 else math.nan,
            "kl_max": float(kl.max()),
            "kl_min": float(kl.min()),
            "kl_percentiles": {str(p): float(np.percentile(kl, p)) for p in KL_PERCENTILES},
            "top1_agreement": float(np.mean(self.same_top)),
            "dp_mean": float(dp.mean()),
            "dp_rms": float(np.sqrt((dp ** 2).mean())),
            "dp_min": float(dp.min()),
            "dp_max": float(dp.max()),
            "dp_percentiles": {str(p): float(np.percentile(dp, p)) for p in DP_PERCENTILES},
            "base_ppl": self.base_nll.ppl,
            "base_ppl_err": self.base_nll.ppl_err,
        }
        return out


@dataclass
class WindowResult:
    index: int
    tokens: np.ndarray
    nll: np.ndarray           # per scored token
    logprobs: np.ndarray      # [scored, n_vocab] float16, as --save-logits stores them


def run_windows(engine: "Engine", windows: Sequence[np.ndarray], *, base: "LogitsReader | None" = None,
                kl: KlStats | None = None, on_token: Callable[[], None] | None = None) -> Iterator[WindowResult]:
    """Evaluate each window; yields its NLLs and stored-precision log-probability rows. With
    ``base``, each window is also compared with the base's window of the same index into ``kl``."""
    if not windows:
        return
    window = len(windows[0])
    scored = scored_count(window)
    s = engine.session(ctx=window + 1)
    V = engine.shape.n_vocab
    if base is not None and (base.n_vocab != V or base.window != window or base.scored != scored):
        raise LogitsFileError(f"{base.path}: saved for vocabulary {base.n_vocab} / window {base.window}, this run "
                              f"has vocabulary {V} / window {window}")
    for i, toks in enumerate(windows):
        if base is not None and not np.array_equal(base.tokens(i), toks):
            raise LogitsFileError(f"{base.path}: window {i} holds other tokens than this run's text")
        rows = np.empty((scored, V), np.float32)
        for k, logits in enumerate(score_window(s, toks)):
            rows[k] = logits
            if on_token is not None:
                on_token()
        targets = toks[window // 2:].astype(np.int64)
        nll = np.empty(scored)
        stored = np.empty((scored, V), quantize_rows(np.zeros(1)).dtype)
        base_rows = base.rows(i) if base is not None else None
        for b0 in range(0, scored, _BLOCK):   # float64 work in blocks: bounded memory on a 129k vocabulary
            b1 = min(b0 + _BLOCK, scored)
            lp = log_softmax(rows[b0:b1])
            nll[b0:b1] = -lp[np.arange(b1 - b0), targets[b0:b1]]
            stored[b0:b1] = quantize_rows(lp)
            if base_rows is not None and kl is not None:
                kl.add(base_rows[b0:b1], lp, targets[b0:b1])
        yield WindowResult(i, toks, nll, stored)
