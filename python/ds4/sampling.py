"""Token sampling with upstream's exact filter order and RNG (docs/runtime.md §3), vectorised in numpy.

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
import threading
import time
from dataclasses import dataclass

from ._args import check_float, check_int

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
    "check_sampling_args",
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
    """Upstream's server rule (docs/runtime.md §3.7): in thinking mode ('high'/'max') the client's knobs
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
#
# Speed (129,280 logits, one core; bench/sampling.py). Every shortcut below leaves the picks
# unchanged (tests/test_sampling.py compares against a plain whole-vocabulary implementation):
# * work over the whole vocabulary is a few elementwise passes; exp, sums and sorts run on the
#   tokens a filter can keep, found with thresholds proven to select a superset (the exact test
#   then runs on the survivors): a logit floor for min_p, group maxima for top_k / top_logprobs;
# * orderings use a uint64 key sort (numpy's stable float32 argsort is ~10x slower);
# * the top_p branch needs the sequential total of every weight only where its filters stop: with
#   min_p > 0 a proven interval around it usually decides, and the exact sum (a whole-vocabulary
#   cumsum, the costliest single step at ~0.28 ms) runs only when the interval's ends disagree;
# * whole-vocabulary arrays live in per-thread scratch buffers (a fresh 1 MB array costs more in
#   page faults than the exp itself).

_scratch = threading.local()


def _buf(name: str, n: int, dtype) -> np.ndarray:
    """A per-thread scratch array of n elements; never returned to a caller."""
    b = getattr(_scratch, name, None)
    if b is None or b.size < n:
        b = np.empty(max(n, 1), dtype=dtype)
        setattr(_scratch, name, b)
    return b[:n]


def _expf(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """float32 exp, correctly rounded: evaluated in double then rounded. glibc's ``expf`` agrees
    with this on all but ~0.06% of arguments; numpy's own float32 ``exp`` differs by an ulp on
    ~40% of them, which moves sampling boundaries."""
    x = np.asarray(x, dtype=np.float32)
    wide = _buf("expf64", x.size, np.float64)  # not "exp64": the caller may hold that one
    np.exp(x, out=wide, dtype=np.float64)  # widened exactly, exp in double
    if out is None:
        out = np.empty(x.size, dtype=np.float32)
    out[...] = wide  # round to nearest float32
    return out


def _seq_sum(w: np.ndarray) -> np.float32:
    """float32 sum accumulated left to right, as upstream's ``sum += p`` loops."""
    if w.size == 0:
        return _F32(0)
    return np.cumsum(w, dtype=np.float32, out=_buf("cum32", w.size, np.float32))[-1]


def _args(lg: np.ndarray, max_logit: np.float32, temperature: np.float32) -> np.ndarray:
    """Upstream's ``(logit - max) / temperature`` in float32 (dividing by 1 is exact: skipped)."""
    x = lg - max_logit
    if temperature != 1:
        np.divide(x, temperature, out=x)
    return x


def _flatnonzero(mask: np.ndarray) -> np.ndarray:
    """``np.flatnonzero`` for a 1-D bool mask (ascending)."""
    return np.flatnonzero(mask)


def _logit_floor(max_logit: np.float32, temperature: np.float32, min_p: np.float32) -> np.float32:
    """A logit below which no token can pass ``expf(fl(fl(l - max) / t)) >= min_p``.

    q = RN(exp(x)) >= m implies x >= log(m) - 2**-22 =: -L; x = (l - max)(1+e1)(1+e2)/t with
    |e| <= 2**-24 (a quotient that underflows is within 2**-149 of 0, far above -L), so
    l >= max - t * L * (1 + 2**-21). A wider margin is taken and the float32 is rounded down.
    """
    big_l = -math.log(min(float(min_p), 1.0)) + 2.0 ** -22
    floor = float(max_logit) - float(temperature) * (big_l * (1 + 2.0 ** -16) + 2.0 ** -60)
    if not floor > -3.0e38:
        return _F32(-np.inf)
    return np.nextafter(_F32(floor), _F32(-np.inf))


def _group_maxima(vals: np.ndarray, groups: int) -> np.ndarray:
    """Maxima of about ``groups`` (at least that many) disjoint groups covering ``vals``.

    Large arrays are first folded to ~8k column maxima (strided groups), then grouped into the
    requested count along whichever axis is long (numpy's per-row overhead dominates short rows).
    """
    while vals.size >= 2 * max(groups, 8192):
        cols = max(groups, vals.size // 16, 8192) if vals.size > 16 * 8192 else max(groups, 8192)
        rows = vals.size // cols
        head = vals[: rows * cols].reshape(rows, cols).max(axis=0)
        tail = vals[rows * cols:]
        vals = np.concatenate([head, tail]) if tail.size else head
    per = vals.size // groups
    if per < 2:
        return vals
    if groups >= per:  # many small groups: strided columns
        head = vals[: per * groups].reshape(per, groups).max(axis=0)
    else:  # few large groups: contiguous rows
        head = vals[: per * groups].reshape(groups, per).max(axis=1)
    tail = vals[per * groups:]
    return np.concatenate([head, tail]) if tail.size else head


def _rank_floor(vals: np.ndarray, k: int) -> np.float32:
    """A value with at least k entries >= it and no more than the k-th largest entry.

    The k-th largest of the maxima of >= k disjoint groups is such a value: the k largest group
    maxima are k distinct entries >= it (~4k groups keep the candidates few).
    """
    n = vals.size
    if k >= n:
        return _F32(-np.inf)
    maxima = _group_maxima(vals, 4 * k)
    return np.partition(maxima, maxima.size - k)[maxima.size - k]


def _order_desc(vals: np.ndarray) -> np.ndarray:
    """Positions of finite ``vals`` by value desc, then position asc (a stable descending argsort).

    numpy's stable argsort of float32 is slow; one uint64 key per entry (the float's bits mapped
    to an order-preserving integer, then the position) sorts the same way with the fast sort.
    """
    if vals.size < 64:
        return np.argsort(-vals, kind="stable")
    neg = np.negative(vals) + _F32(0)  # + 0 turns -0.0 into 0.0: they are equal logits
    u = neg.view(np.uint32)
    key = np.where(u >> np.uint32(31), ~u, u | np.uint32(0x80000000)).astype(np.uint64)
    key <<= np.uint64(32)
    key |= np.arange(vals.size, dtype=np.uint64)
    key.sort()
    return (key & np.uint64(0xFFFFFFFF)).astype(np.intp)


def _sorted_prefix(a: np.ndarray, floor, finite: np.ndarray | None) -> np.ndarray:
    """Finite tokens with logit >= floor, by logit desc then index asc (a prefix of the full
    sorted order: every token with a larger logit is in it)."""
    idx = _flatnonzero(a >= floor) if finite is None else _flatnonzero((a >= floor) & finite)
    return idx[_order_desc(a[idx])]


def _top_sorted(a: np.ndarray, k: int, finite: np.ndarray | None = None) -> np.ndarray:
    """Indices of the k largest finite logits, ordered by value desc then index asc (among equal
    values the earlier index wins, as upstream's insertion). ``finite`` None: all are finite."""
    masked = a if finite is None else np.where(finite, a, -np.inf).astype(np.float32)
    return _sorted_prefix(a, _rank_floor(masked, k), finite)[:k]


def _filter_sorted(probs: np.ndarray, total: np.float32, top_p: np.float32, min_p: np.float32,
                   running: np.ndarray | None = None):
    """Length of the kept prefix of sorted candidates, or None if neither filter stopped the walk.

    Stops (exclusive) at the first i > 0 with probs[i]/total < min_prob, and (inclusive) once the
    running sum / total reaches top_p. ``running``: the probs' float32 cumsum, if already known.
    """
    stop_min = None
    if min_p > 0:  # with min_p 0, min_prob is 0 and no p/total is below it
        min_prob = _F32(_F32(probs[0] / total) * min_p)
        below = np.flatnonzero(probs[1:] / total < min_prob)
        stop_min = int(below[0]) + 1 if below.size else None
    if running is None:
        running = np.cumsum(probs, dtype=np.float32)
    # running / total is non-decreasing: the first index reaching top_p is a binary search
    stop_top = int(np.searchsorted(running / total, top_p, side="left")) + 1
    if stop_top > probs.size:
        stop_top = None
    stops = [s for s in (stop_min, stop_top) if s is not None]
    return min(stops) if stops else None


_WALK_CHUNK = 8192


def _draw(probs: np.ndarray, total: np.float32, rng: Rng) -> int | None:
    """Index where ``r = u * total`` minus the running probs first drops to <= 0 (float32, in order).

    The walk is an exact sequential float32 running sum (``cumsum`` of ``[r, -p0, -p1, ...]``), done
    in chunks that carry the running value so a long list stops early.
    """
    r = _F32(rng.uniform() * total)
    seq = _buf("walk32", min(probs.size, _WALK_CHUNK) + 1, np.float32)
    for start in range(0, probs.size, _WALK_CHUNK):
        part = probs[start:start + _WALK_CHUNK]
        s = seq[: part.size + 1]
        s[0] = r
        np.negative(part, out=s[1:])
        np.cumsum(s, out=s)
        hit = np.flatnonzero(s[1:] <= 0)
        if hit.size:
            return start + int(hit[0])
        r = s[-1]
    return None


def _draw_sorted(cand: np.ndarray, w: np.ndarray, kept: int, rng: Rng) -> int:
    filtered_sum = _seq_sum(w[:kept])
    hit = _draw(w[:kept], filtered_sum, rng)
    return int(cand[hit]) if hit is not None else int(cand[kept - 1])


def _finite_max(a: np.ndarray):
    """(finite mask or None when every logit is finite, max finite logit or None when none is)."""
    hi, lo = a.max(), a.min()
    if np.isfinite(hi) and np.isfinite(lo):
        return None, hi
    finite = np.isfinite(a)
    if not finite.any():
        return finite, None
    return finite, a[finite].max()


def _mass_prefix(a: np.ndarray, w_all: np.ndarray, top_p, finite: np.ndarray | None,
                 top_w: np.ndarray):
    """A sorted prefix (logit desc, index asc) that likely holds the top-p stop, or None.

    ``top_w``: the weights of a sorted prefix already known (its mass is exact). The mass of the
    tokens below it is estimated from every 8th weight (sorted, summed from the top, times 8), and
    the prefix is cut where the estimated mass left out is 70% of (1 - top_p) of the estimated
    total. Only a prediction (on 580 random peaked, flat and heavy-tailed 129,280-token cases it
    always held, with ~1.4x the tokens needed): the caller checks that the walk stopped inside and
    otherwise sorts everything; it saves sorting the rest of the vocabulary.
    """
    sub = w_all[::8]
    sub = np.sort(sub[sub < top_w[-1]])[::-1]
    if sub.size == 0:
        return None
    est = np.cumsum(sub, dtype=np.float32) * _F32(8) + _F32(np.sum(top_w))  # an estimate: float32 will do
    j = int(np.searchsorted(est, _F32(est[-1] * (1.0 - 0.7 * (1.0 - float(top_p))))))
    if j >= sub.size:
        return None
    sel = w_all >= sub[j]
    if finite is not None:
        sel &= finite
    idx = _flatnonzero(sel)
    return idx[_order_desc(a[idx])]


def _sample_full_vocab(a: np.ndarray, temperature, top_p, min_p, rng: Rng) -> int:
    finite, max_logit = _finite_max(a)
    if max_logit is None:
        return argmax(a)
    best = lambda: int(np.argmax(a == max_logit))  # first index of the max finite logit

    if top_p >= 1 and min_p > 0:
        # Only tokens with exp(arg) >= min_p are kept: a logit floor selects a superset, the exact
        # test runs on the survivors (index order is kept).
        sel = a >= _logit_floor(max_logit, temperature, min_p)
        if finite is not None:
            sel &= finite
        idx = _flatnonzero(sel)
        w = _expf(_args(a[idx], max_logit, temperature))
        keep = w >= min_p
        idx, w = idx[keep], w[keep]
        total = _seq_sum(w)
        if not (total > 0 and np.isfinite(total)):
            return best()
        hit = _draw(w, total, rng)
        return best() if hit is None else int(idx[hit])

    # The remaining settings need every finite token's weight (non-finite logits weigh 0).
    n = a.size
    args = np.subtract(a, max_logit, out=_buf("args32", n, np.float32))
    if temperature != 1:
        np.divide(args, temperature, out=args)
    if finite is not None:
        args[~finite] = -np.inf
    wide = _buf("exp64", n, np.float64)
    np.exp(args, out=wide, dtype=np.float64)  # as _expf, keeping the doubles for _total_bounds
    w_all = _buf("w32", n, np.float32)
    w_all[...] = wide

    if top_p >= 1:  # min_p == 0: every finite token is kept, in index order
        if finite is None:
            idx, w = None, w_all
        else:
            idx = _flatnonzero(finite)
            w = w_all[idx]
        total = _seq_sum(w)
        if not (total > 0 and np.isfinite(total)):
            return best()
        hit = _draw(w, total, rng)
        if hit is None:
            return best()
        return hit if idx is None else int(idx[hit])

    # Sorted branch: the total runs over every finite token. It only decides where the filters
    # stop, so a proven interval around it is tried first; the exact sum is computed only when
    # the stop differs between the interval's ends.
    n_finite = n if finite is None else int(np.count_nonzero(finite))
    total = _Total(w_all, wide)
    if min_p == 0 or total.bounds() is None:
        # With min_p 0 the stop is where the running sum crosses top_p * total among many small
        # weights: the interval (~n * 2**-24 wide) almost never decides it.
        t = total.exact()
        if not (t > 0 and np.isfinite(t)):
            return best()
    cand, w, kept = _sorted_choice(a, w_all, total, top_p, min_p, finite, n_finite)
    return _draw_sorted(cand, w, kept, rng)


class _Total:
    """The sequential float32 sum of the weights: ``bounds()`` (a proven float32 interval, or
    None) and ``exact()``, each computed on first use."""

    __slots__ = ("w", "wide", "_bounds", "_exact")

    def __init__(self, w: np.ndarray, wide: np.ndarray) -> None:
        self.w, self.wide = w, wide
        self._bounds = self._exact = None

    def bounds(self):
        if self._bounds is None:
            self._bounds = _total_bounds(self.w, self.wide) or ()
        return self._bounds or None

    def exact(self) -> np.float32:
        if self._exact is None:
            self._exact = _seq_sum(self.w)
        return self._exact


def _total_bounds(w: np.ndarray, wide: np.ndarray):
    """float32 (lo, hi) around the sequential float32 sum of the weights w >= 0, or None.

    ``wide``: the float64 values w was rounded from (|w - wide| <= 2**-24 wide). Each step
    ``s = fl(s + q)`` errs by at most min(q, 2**-24 * (s + q)), and every s + q stays below
    S = E / (1 - n * 2**-23) (E: the exact sum of w), so the sum is within
    B = sum(min(q, 2**-24 * S)) of E. E comes from a float64 sum of ``wide`` (within
    2**-24 + n * 2**-53 relative), B from a float32 sum in any order (within (n - 1) * 2**-24
    relative, so it is inflated by 1 / (1 - n * 2**-24)); the float32 ends are rounded outwards.
    """
    n = w.size
    if n * 2.0 ** -23 >= 0.5:
        return None
    e = float(np.sum(wide))
    e_lo, e_hi = e * (1 - 2.0 ** -22), e * (1 + 2.0 ** -22)
    s_max = e_hi / (1 - n * 2.0 ** -23)
    beta = _F32(s_max * 2.0 ** -24 * (1 + 2.0 ** -20))
    b = float(np.sum(np.minimum(w, beta, out=_buf("bound32", n, np.float32))))
    b = b / (1 - n * 2.0 ** -24) * (1 + 2.0 ** -20)
    t_lo = np.nextafter(_F32(e_lo - b), _F32(-np.inf))
    t_hi = np.nextafter(_F32(e_hi + b), _F32(np.inf))
    if not (t_lo > 0 and np.isfinite(t_hi)):
        return None
    return t_lo, t_hi


def _kept(w: np.ndarray, total: _Total, top_p, min_p):
    """(``_filter_sorted`` of the candidates, exact total or None when the interval decided).

    The top-p stop moves monotonically with the total (fl(run / total) is monotone), so equal
    stops at the interval's ends hold in between. The min-p test fl(p / T) < fl(fl(1 / T) * min_p)
    does not depend on T when p is not within 2**-20 (relative) of min_p and min_p / T is a normal
    float (w[0] is 1: the max logit's weight); both are checked before the interval is trusted.
    """
    running = np.cumsum(w, dtype=np.float32)
    if total._exact is None and total.bounds() is not None:
        lo, hi = total.bounds()
        steady = min_p == 0 or (
            float(min_p) / float(hi) >= 2.0 ** -100
            and not np.any(np.abs(w[1:].astype(np.float64) - float(min_p)) <= float(min_p) * 2.0 ** -20))
        if steady:
            k_lo = _filter_sorted(w, lo, top_p, min_p, running)
            if k_lo == _filter_sorted(w, hi, top_p, min_p, running):
                return k_lo, None
    t = total.exact()
    return _filter_sorted(w, t, top_p, min_p, running), t


def _sorted_choice(a, w_all, total: _Total, top_p, min_p, finite, n_finite):
    """(sorted candidates, their weights, kept length) of the sorted branch."""
    if min_p > 0:
        # p/total >= (1/total)*min_p  <=>  p >= min_p up to a few ulps: a 0.1% margin is a superset
        # (the pool is a prefix of the sorted order; if its walk does not stop, larger prefixes
        # are tried below).
        c = _F32(min(float(min_p), 1.0) * 0.999)
        pool = _flatnonzero(w_all >= c)
        cand = pool[_order_desc(a[pool])]
        w = w_all[cand]
        kept, exact = _kept(w, total, top_p, min_p)
        if kept is None and cand.size < n_finite:
            # Every token outside the pool weighs less than c <= min_p * (1 - 2**-20). When the
            # interval decided, min-p compares p with min_p alone, so the walk stops right after
            # the pool; with the exact total: if even the largest float32 below c fails the test.
            if exact is None:
                kept = cand.size
            else:
                min_prob = _F32(_F32(w[0] / exact) * min_p)
                if _F32(np.nextafter(c, _F32(0)) / exact) < min_prob:
                    kept = cand.size
        if kept is not None or cand.size >= n_finite:
            return cand, w, kept if kept is not None else cand.size
    # the top 256 first (enough for a peaked distribution), then a predicted prefix
    cand = _top_sorted(a, min(n_finite, 256), finite) if n_finite > 256 else _sorted_prefix(a, -np.inf, finite)
    w = w_all[cand]
    kept, _ = _kept(w, total, top_p, min_p)
    if kept is not None or cand.size >= n_finite:
        return cand, w, kept if kept is not None else cand.size
    cand = _mass_prefix(a, w_all, top_p, finite, w)
    if cand is not None:
        w = w_all[cand]
        kept, _ = _kept(w, total, top_p, min_p)
        if kept is not None or cand.size >= n_finite:
            return cand, w, kept if kept is not None else cand.size
    # no prediction, or it fell short: sort every finite token
    cand = _sorted_prefix(a, -np.inf, finite)
    w = w_all[cand]
    kept, _ = _kept(w, total, top_p, min_p)
    return cand, w, kept if kept is not None else cand.size


def _sample_top_k(a: np.ndarray, temperature, top_k: int, top_p, min_p, rng: Rng) -> int:
    finite, max_logit = _finite_max(a)
    if max_logit is None:
        return argmax(a)
    cand = _top_sorted(a, top_k, finite)
    vals = a[cand]
    w = _expf((vals - vals[0]) / temperature)
    total = _seq_sum(w)
    if not (total > 0 and np.isfinite(total)):
        return int(cand[0])
    kept = _filter_sorted(w, total, top_p, min_p)
    return _draw_sorted(cand, w, kept if kept is not None else cand.size, rng)


def check_sampling_args(temperature, top_k, top_p, min_p) -> None:
    """Refuse sampling knobs outside their meaning, naming the argument (InvalidArgumentError).

    ``temperature`` finite and >= 0 (0 is greedy), ``top_k`` an integer >= 0 (0 is off), ``top_p``
    in (0, 1], ``min_p`` in [0, 1]. Upstream silently normalises some of these (a negative
    temperature is greedy, top_p 0 is 1); ds4's API says the call is wrong instead.
    """
    check_float(temperature, "temperature", 0.0)
    check_int(top_k, "top_k", 0)
    check_float(top_p, "top_p", 0.0, 1.0, lo_open=True)
    check_float(min_p, "min_p", 0.0, 1.0)


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
    ``rng`` is required unless ``temperature`` is 0. Arguments are checked by
    :func:`check_sampling_args`.
    """
    check_sampling_args(temperature, top_k, top_p, min_p)
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
    x = _buf("lse64", v.size, np.float64)
    np.subtract(v, m, out=x, dtype=np.float64)  # v widened exactly, difference in double
    np.exp(x, out=x)
    return m + math.log(float(np.sum(x)))


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
    finite, _ = _finite_max(a)
    n_finite = a.size if finite is None else int(np.count_nonzero(finite))
    ids = _top_sorted(a, min(int(k), n_finite), finite)
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
