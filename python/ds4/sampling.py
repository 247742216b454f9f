"""Token sampling with upstream's exact filter order and RNG (RUNTIME.md §3), vectorised in numpy.

Parameters are normalised and applied in upstream's order: ``temperature <= 0`` -> argmax;
``top_p`` outside (0, 1] -> 1; ``min_p < 0`` -> 0; ``top_k <= 0`` -> full-vocabulary path, else the
top-k path (k clamped to 1024 and to the vocabulary). All arithmetic that decides the choice is
float32 and sequential where upstream's loops are (numpy ``cumsum`` accumulates in order), so a seed
reproduces upstream's choices. Checked against upstream's sampler compiled from its source with its
own flags (gcc -O3 -ffast-math, glibc): identical picks on 4,200 seeded draws over 129,280-entry
logits, except where glibc's ``expf`` is not correctly rounded (a ~0.06% of arguments; a choice
moves only if the draw also lands within that ulp of a boundary).

Ties in the sorted branches (equal logits) are ordered by vocabulary index (a stable sort);
upstream's ``qsort`` leaves that order unspecified.

Example::

    >>> import numpy as np
    >>> rng = Rng(42)
    >>> sample(np.array([0.0, 5.0, 1.0], dtype=np.float32), temperature=0.0, rng=rng)
    1
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass

import numpy as np

from .errors import InvalidArgumentError

__all__ = [
    "DEFAULT_TEMPERATURE",
    "DEFAULT_TOP_P",
    "DEFAULT_MIN_P",
    "DEFAULT_TOP_K",
    "TOP_K_MAX",
    "SamplingParams",
    "Rng",
    "TokenLogprob",
    "sample",
    "argmax",
    "argmax_excluding",
    "top_logprobs",
    "token_logprob",
    "log_softmax",
    "time_seed",
    "thinking_policy",
]

DEFAULT_TEMPERATURE = 1.0
DEFAULT_TOP_P = 1.0
DEFAULT_MIN_P = 0.05
DEFAULT_TOP_K = 0
TOP_K_MAX = 1024

_NEG_INF = np.float32(-1.0e30)  # upstream's DS4_NEG_INF: argmax's starting value
_MASK64 = (1 << 64) - 1
_F32 = np.float32


@dataclass(frozen=True)
class SamplingParams:
    """Sampling knobs with upstream's defaults (ds4.h: temperature 1, top_p 1, min_p 0.05; top_k 0 = off)."""

    temperature: float = DEFAULT_TEMPERATURE
    top_k: int = DEFAULT_TOP_K
    top_p: float = DEFAULT_TOP_P
    min_p: float = DEFAULT_MIN_P

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0


def thinking_policy(params: SamplingParams, think: str) -> SamplingParams:
    """Upstream's server rule (RUNTIME.md §3.7): in thinking mode ('high'/'max') the client's knobs
    are ignored and T=1, top_k=0, top_p=1, min_p=0.05 are used, as the official API does."""
    if think in ("high", "max"):
        return SamplingParams(DEFAULT_TEMPERATURE, DEFAULT_TOP_K, DEFAULT_TOP_P, DEFAULT_MIN_P)
    return params


class Rng:
    """xorshift64* on a 64-bit state, upstream's ``sample_rng_next``/``sample_rng_f32``.

    A zero state is replaced by 0x9E3779B97F4A7C15 on the next draw. ``uniform()`` returns the top
    24 bits of the output over 2**24, a float32 in [0, 1).
    """

    __slots__ = ("state",)

    def __init__(self, seed: int = 0) -> None:
        self.state = int(seed) & _MASK64

    def next_u64(self) -> int:
        x = self.state or 0x9E3779B97F4A7C15
        x ^= x >> 12
        x ^= (x << 25) & _MASK64
        x ^= x >> 27
        self.state = x
        return (x * 0x2545F4914F6CDD1D) & _MASK64

    def uniform(self) -> np.float32:
        return _F32(((self.next_u64() >> 40) & 0xFFFFFF) / 16777216.0)  # exact in float32


def time_seed() -> int:
    """A seed like upstream's CLI default (``time ^ pid << 32 ^ clock``), for unseeded runs."""
    return (int(time.time()) ^ (os.getpid() << 32) ^ time.process_time_ns() // 1000) & _MASK64


@dataclass(frozen=True)
class TokenLogprob:
    """One scored token: id, its raw logit and its log-probability (log-softmax over finite logits)."""

    id: int
    logit: float
    logprob: float


# ---- argmax ----------------------------------------------------------------------------------


def _as_logits(logits) -> np.ndarray:
    a = np.asarray(logits)
    if a.ndim != 1 or a.size == 0:
        raise InvalidArgumentError(f"logits must be a non-empty 1-D array, got shape {a.shape}")
    return a.astype(np.float32, copy=False)


def argmax(logits) -> int:
    """First index of the maximum; NaN never wins; 0 when nothing exceeds -1e30 (upstream)."""
    a = _as_logits(logits)
    i = int(np.argmax(a))  # numpy returns the first NaN if there is one
    if np.isnan(a[i]):
        clean = np.where(np.isnan(a), -np.inf, a)
        i = int(np.argmax(clean))
        return i if clean[i] > _NEG_INF else 0
    return i if a[i] > _NEG_INF else 0


def argmax_excluding(logits, excluded: int) -> int:
    """Argmax skipping one id (upstream's bench uses it to forbid EOS).

    As upstream: the first non-excluded index is the starting best, later ids replace it only when
    strictly greater (so a NaN start is never replaced and NaN never wins elsewhere).
    """
    a = _as_logits(logits)
    first = 1 if excluded == 0 else 0
    if first >= a.size:
        return -1
    if np.isnan(a[first]):
        return first
    clean = np.where(np.isnan(a), -np.inf, a)
    if 0 <= excluded < a.size:
        clean[excluded] = -np.inf
    i = int(np.argmax(clean))
    return i if clean[i] > a[first] else first


# ---- the two sampling paths ------------------------------------------------------------------
#
# Every float sum is a sequential float32 accumulation in upstream's order (``np.cumsum`` adds in
# order; ``np.sum`` would pair terms and change the last bits). Checked against upstream's sampler
# compiled with its own flags (-O3 -ffast-math): gcc keeps these loops sequential, and a compiled
# copy picks the same tokens as this module draw for draw.


def _expf(x: np.ndarray) -> np.ndarray:
    """float32 exp, correctly rounded: evaluated in double then rounded. glibc's ``expf`` agrees
    with this on all but ~0.06% of arguments; numpy's own float32 ``exp`` differs by an ulp on
    ~40% of them, which moves sampling boundaries."""
    return np.exp(np.asarray(x, dtype=np.float64)).astype(np.float32)


def _seq_sum(w: np.ndarray) -> np.float32:
    """float32 sum accumulated left to right, as upstream's ``sum += p`` loops."""
    if w.size == 0:
        return _F32(0)
    return np.cumsum(w, dtype=np.float32)[-1]


def _top_sorted(vals: np.ndarray, k: int, finite: np.ndarray | None = None) -> np.ndarray:
    """Indices of the k largest values (finite ones only when ``finite`` is given), ordered by
    value desc then index asc (among equal values the earlier index wins, as upstream's insertion)."""
    idx = np.arange(vals.size) if finite is None else np.flatnonzero(finite)
    v = vals[idx] if finite is not None else vals
    if k < idx.size:
        thr = np.partition(v, idx.size - k)[idx.size - k]  # k-th largest
        above = v > thr
        need = k - int(np.count_nonzero(above))
        above[np.flatnonzero(v == thr)[:need]] = True
        idx = idx[above]
    order = np.argsort(-vals[idx], kind="stable")
    return idx[order]


def _filter_sorted(probs: np.ndarray, total: np.float32, top_p: np.float32, min_p: np.float32):
    """Length of the kept prefix of sorted candidates, or None if neither filter stopped the walk.

    Stops (exclusive) at the first i > 0 with probs[i]/total < min_prob, and (inclusive) once the
    running sum / total reaches top_p.
    """
    min_prob = _F32(_F32(probs[0] / total) * min_p)
    pn = (probs / total).astype(np.float32)
    below = np.flatnonzero(pn[1:] < min_prob)
    stop_min = int(below[0]) + 1 if below.size else None
    running = np.cumsum(probs, dtype=np.float32)
    reached = np.flatnonzero((running / total).astype(np.float32) >= top_p)
    stop_top = int(reached[0]) + 1 if reached.size else None
    stops = [s for s in (stop_min, stop_top) if s is not None]
    return min(stops) if stops else None


_WALK_CHUNK = 8192


def _draw(probs: np.ndarray, total: np.float32, rng: Rng) -> int | None:
    """Index where ``r = u * total`` minus the running probs first drops to <= 0 (float32, in order).

    The walk is an exact sequential float32 running sum (``cumsum`` of ``[r, -p0, -p1, ...]``), done
    in chunks that carry the running value so a long list stops early.
    """
    r = _F32(rng.uniform() * total)
    for start in range(0, probs.size, _WALK_CHUNK):
        part = probs[start:start + _WALK_CHUNK]
        seq = np.empty(part.size + 1, dtype=np.float32)
        seq[0] = r
        np.negative(part, out=seq[1:])
        run = np.cumsum(seq, dtype=np.float32)
        hit = np.flatnonzero(run[1:] <= 0)
        if hit.size:
            return start + int(hit[0])
        r = run[-1]
    return None


def _draw_sorted(cand: np.ndarray, w: np.ndarray, kept: int, rng: Rng) -> int:
    filtered_sum = _seq_sum(w[:kept])
    hit = _draw(w[:kept], filtered_sum, rng)
    return int(cand[hit]) if hit is not None else int(cand[kept - 1])


def _sample_full_vocab(a: np.ndarray, temperature, top_p, min_p, rng: Rng) -> int:
    hi, lo = a.max(), a.min()
    finite = None if (np.isfinite(hi) and np.isfinite(lo)) else np.isfinite(a)  # None: all finite
    if finite is not None and not finite.any():
        return argmax(a)
    if finite is None:
        max_logit = hi
    else:
        max_logit = a[finite].max()
    best = lambda: int(np.argmax(a == max_logit))  # first index of the max finite logit
    args = ((a - max_logit) / temperature).astype(np.float32, copy=False)
    if finite is not None:
        args = np.where(finite, args, -np.inf).astype(np.float32)

    if top_p >= 1:
        # Only tokens with exp(arg) >= min_p are kept; pre-select with a margin, then test exactly.
        if min_p > 0:
            idx = np.flatnonzero(args >= _F32(math.log(min(float(min_p), 1.0)) - 1e-3))
            w = _expf(args[idx])
            keep = w >= min_p
            idx, w = idx[keep], w[keep]
        elif finite is None:
            idx, w = None, _expf(args)  # every token is kept
        else:
            idx = np.flatnonzero(finite)
            w = _expf(args[idx])
        total = _seq_sum(w)
        if not (total > 0 and np.isfinite(total)):
            return best()
        hit = _draw(w, total, rng)
        if hit is None:
            return best()
        return hit if idx is None else int(idx[hit])

    # Sorted branch: the total runs over every finite token.
    w_all = _expf(args)  # non-finite logits give exp(-inf) = 0
    total = _seq_sum(w_all)
    if not (total > 0 and np.isfinite(total)):
        return best()
    if min_p > 0:
        # p/total >= (1/total)*min_p  <=>  p >= min_p up to a few ulps: a 0.1% margin is a superset.
        pool = np.flatnonzero(w_all >= _F32(min(float(min_p), 1.0) * 0.999))
        cand = pool[np.argsort(-a[pool], kind="stable")]
        w = w_all[cand]
        kept = _filter_sorted(w, total, top_p, min_p)
        return _draw_sorted(cand, w, kept if kept is not None else cand.size, rng)
    n_finite = a.size if finite is None else int(np.count_nonzero(finite))
    k = min(n_finite, 256)
    masked = a if finite is None else np.where(finite, a, -np.inf)
    while True:  # sort only as many leading candidates as the top-p walk needs
        cand = _top_sorted(masked, k, finite)
        w = w_all[cand]
        kept = _filter_sorted(w, total, top_p, min_p)
        if kept is not None or k >= n_finite:
            break
        k = min(n_finite, k * 8)
    return _draw_sorted(cand, w, kept if kept is not None else cand.size, rng)


def _sample_top_k(a: np.ndarray, temperature, top_k: int, top_p, min_p, rng: Rng) -> int:
    hi, lo = a.max(), a.min()
    finite = None if (np.isfinite(hi) and np.isfinite(lo)) else np.isfinite(a)
    if finite is not None and not finite.any():
        return argmax(a)
    cand = _top_sorted(a if finite is None else np.where(finite, a, -np.inf), top_k, finite)
    vals = a[cand]
    w = _expf((vals - vals[0]) / temperature)
    total = _seq_sum(w)
    if not (total > 0 and np.isfinite(total)):
        return int(cand[0])
    kept = _filter_sorted(w, total, top_p, min_p)
    return _draw_sorted(cand, w, kept if kept is not None else cand.size, rng)


def sample(
    logits,
    temperature: float = DEFAULT_TEMPERATURE,
    top_k: int = DEFAULT_TOP_K,
    top_p: float = DEFAULT_TOP_P,
    min_p: float = DEFAULT_MIN_P,
    rng: Rng | None = None,
) -> int:
    """Pick the next token id from ``logits`` (upstream's ``ds4_session_sample``).

    Exactly one ``rng`` draw is consumed when a draw happens; argmax short-cuts consume none.
    ``rng`` is required unless ``temperature <= 0``.
    """
    a = _as_logits(logits)
    t = _F32(temperature)
    if not t > 0:  # also catches NaN, which upstream's `<= 0` test would let through to exp
        return argmax(a)
    if rng is None:
        raise InvalidArgumentError("sample() needs an Rng when temperature > 0")
    tp = _F32(top_p)
    if not (tp > 0 and tp <= 1):
        tp = _F32(1)
    mp = _F32(min_p)
    if mp < 0:
        mp = _F32(0)
    k = int(top_k)
    if k <= 0:
        return _sample_full_vocab(a, t, tp, mp, rng)
    k = min(k, TOP_K_MAX, a.size)
    return _sample_top_k(a, t, k, tp, mp, rng)


# ---- log-probabilities -----------------------------------------------------------------------


def _logsumexp_finite(a: np.ndarray) -> float | None:
    """M + log(sum(exp(l - M))) over the finite logits, in double (upstream's log-sum-exp)."""
    hi, lo = a.max(), a.min()
    if np.isfinite(hi) and np.isfinite(lo):
        v = a
    else:
        v = a[np.isfinite(a)]
        if v.size == 0:
            return None
        hi = v.max()
    m = float(hi)
    return m + math.log(float(np.sum(np.exp(v.astype(np.float64) - m))))


def log_softmax(logits) -> np.ndarray:
    """float64 log-probabilities over the finite logits (non-finite entries give -inf)."""
    a = _as_logits(logits)
    lse = _logsumexp_finite(a)
    out = np.full(a.shape, -np.inf, dtype=np.float64)
    if lse is None:
        return out
    finite = np.isfinite(a)
    out[finite] = a[finite].astype(np.float64) - lse
    return out


def top_logprobs(logits, k: int) -> list[TokenLogprob]:
    """The k most likely finite tokens (earlier id first on equal logits) with their logprobs.

    Log-sum-exp runs in double over all finite logits, as upstream's ``ds4_session_top_logprobs``;
    fewer than k entries come back when fewer logits are finite (upstream pads with id -1).
    """
    a = _as_logits(logits)
    if k <= 0:
        return []
    lse = _logsumexp_finite(a)
    if lse is None:
        return []
    finite = np.isfinite(a)
    ids = _top_sorted(np.where(finite, a, -np.inf), min(int(k), int(np.count_nonzero(finite))), finite)
    return [TokenLogprob(int(i), float(a[i]), float(np.float32(float(a[i]) - lse))) for i in ids]


def token_logprob(logits, token: int) -> TokenLogprob:
    """Logprob of one token (upstream's ``ds4_session_token_logprob``)."""
    a = _as_logits(logits)
    if not 0 <= token < a.size:
        raise InvalidArgumentError(f"token id {token} out of range [0, {a.size})")
    lse = _logsumexp_finite(a)
    if lse is None:
        raise InvalidArgumentError("no finite logit to normalise over")
    v = float(a[token])
    return TokenLogprob(int(token), v, float(np.float32(v - lse)) if math.isfinite(v) else -1.0e30)
