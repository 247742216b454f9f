"""Pure-numpy reference of ``ds4.sampling.top_logprobs`` / ``token_logprob`` (the implementation
before they moved into the core, csrc/sampling/logprobs.*): the oracle the core's ids and values
are compared with (tests/test_sampling_logprobs.py): pairwise numpy sum, numpy's exp, a rank floor
from group maxima and a stable uint64-key sort."""

from __future__ import annotations

import math
import threading

import numpy as np

_F32 = np.float32

# Orderings use a uint64 key sort (numpy's stable float32 argsort is ~10x slower) and group maxima
# find a rank floor without sorting everything.

_scratch = threading.local()


def _buf(name: str, n: int, dtype) -> np.ndarray:
    """A per-thread scratch array of n elements; never returned to a caller."""
    b = getattr(_scratch, name, None)
    if b is None or b.size < n:
        b = np.empty(max(n, 1), dtype=dtype)
        setattr(_scratch, name, b)
    return b[:n]


def _flatnonzero(mask: np.ndarray) -> np.ndarray:
    """``np.flatnonzero`` for a 1-D bool mask (ascending)."""
    return np.flatnonzero(mask)


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
    values the earlier index wins, as upstream's insertion). ``finite`` None: all are finite.

    Logits above the rank floor are sorted; those equal to it come after them in index order and
    only as many as k needs (a vocabulary of equal logits would otherwise sort every entry)."""
    masked = a if finite is None else np.where(finite, a, -np.inf).astype(np.float32)
    floor = _rank_floor(masked, k)
    above = _sorted_prefix(a, np.nextafter(floor, _F32(np.inf)), finite)
    if above.size >= k:
        return above[:k]
    tied = np.flatnonzero(a == floor)[: k - above.size]   # floor is finite here: ids ascending
    return np.concatenate([above, tied])


def _finite_max(a: np.ndarray):
    """(finite mask or None when every logit is finite, max finite logit or None when none is)."""
    hi, lo = a.max(), a.min()
    if np.isfinite(hi) and np.isfinite(lo):
        return None, hi
    finite = np.isfinite(a)
    if not finite.any():
        return finite, None
    return finite, a[finite].max()


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


def top_ids(logits: np.ndarray, k: int) -> list[int]:
    """The ids numpy's top_logprobs listed: the k best finite logits, equal ones by lower id."""
    a = np.asarray(logits, dtype=np.float32)
    if k <= 0 or _logsumexp_finite(a) is None:
        return []
    finite, _ = _finite_max(a)
    n_finite = a.size if finite is None else int(np.count_nonzero(finite))
    return [int(i) for i in _top_sorted(a, min(int(k), n_finite), finite)]
