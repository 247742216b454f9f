"""Token sampling with upstream's exact filter order and RNG (docs/sampling.md), in the C++ core.

Parameters are normalised and applied in upstream's order: ``temperature <= 0`` -> argmax;
``top_p`` outside (0, 1] -> 1; ``min_p < 0`` -> 0; ``top_k <= 0`` -> full-vocabulary path, else the
top-k path (k clamped to 1024 and to the vocabulary). All arithmetic that decides the choice is
float32 and sequential where upstream's loops are, so a seed
reproduces upstream's choices. The rules were checked against upstream's sampler compiled from its
source with its own flags (gcc -O3 -ffast-math, glibc): identical picks on 4,200 seeded draws over
129,280-entry logits, except where glibc's ``expf`` is not correctly rounded (a ~0.06% of
arguments; a choice moves only if the draw also lands within that ulp of a boundary). The picking
runs in ``ds4._core`` (csrc/sampling/); this module normalises the knobs and owns the RNG state.

Ties in the sorted branches (equal logits) are ordered by vocabulary index (a stable sort);
upstream's ``qsort`` leaves that order unspecified.

Example::

    >>> import numpy as np
    >>> rng = Rng(42)
    >>> sample(np.array([0.0, 5.0, 1.0], dtype=np.float32), temperature=0.0, rng=rng)
    1
"""

from __future__ import annotations

import os
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
    "probabilities",
    "check_sampling_args",
    "set_sampler_threads",
    "argmax",
    "argmax_excluding",
    "top_logprobs",
    "token_logprob",
    "token_and_top_logprobs",
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
    *,
    engine=None,
) -> int:
    """Pick the next token id from ``logits`` (upstream's ``ds4_session_sample``).

    Exactly one ``rng`` draw is consumed when a draw happens; argmax short-cuts consume none.
    ``rng`` is required unless ``temperature`` is 0. Arguments are checked by
    :func:`check_sampling_args`. ``engine``: the :class:`ds4.Engine` whose logits these are; its
    ``sampler_threads`` then decides whether its worker threads split the whole-vocabulary passes
    (None: :func:`set_sampler_threads`' setting). The pick never depends on it.
    """
    t, k, p, mp = _checked_knobs(temperature, top_k, top_p, min_p)
    a = _as_logits(logits)
    if not t > _T_ZERO:  # float32(t) is 0: argmax, as upstream's `<= 0` test
        return argmax(a)
    if rng is None:
        raise InvalidArgumentError("sample() needs an Rng when temperature > 0")
    # The core rounds the knobs to float32 and applies upstream's normalisation (sampler.h).
    token, rng.state = _core().sample(a, t, k, p, mp, rng.state, _pool_of(engine))
    return int(token)


def probabilities(
    logits,
    temperature: float = DEFAULT_TEMPERATURE,
    top_k: int = DEFAULT_TOP_K,
    top_p: float = DEFAULT_TOP_P,
    min_p: float = DEFAULT_MIN_P,
    *,
    engine=None,
) -> np.ndarray:
    """float32 probability of every token under :func:`sample` with these knobs: each kept
    token's weight over the kept total (the distribution one draw picks from, up to the float32
    rounding of the walk); one-hot at the argmax when no draw happens (``temperature <= 0``).
    Speculative sampling compares these for the target and the draft. ``engine``: as for
    :func:`sample` (the values never depend on it)."""
    t, k, p, mp = _checked_knobs(temperature, top_k, top_p, min_p)
    a = _as_logits(logits)
    if not t > _T_ZERO:
        out = np.zeros(a.size, dtype=np.float32)
        out[argmax(a)] = 1
        return out
    return _core().sample_probabilities(a, t, k, p, mp, _pool_of(engine))


# float32(t) is 0 exactly for t <= 2^-150 (half the smallest subnormal rounds to even, 0).
_T_ZERO = 2.0**-150


def _checked_knobs(temperature, top_k, top_p, min_p) -> tuple[float, int, float, float]:
    """check_sampling_args, returning the values (top_k capped at TOP_K_MAX: the core clamps it
    there anyway, and a huge Python int would not fit its integer)."""
    t = check_float(temperature, "temperature", 0.0)
    k = check_int(top_k, "top_k", 0)
    p = check_float(top_p, "top_p", 0.0, 1.0, lo_open=True)
    mp = check_float(min_p, "min_p", 0.0, 1.0)
    return t, (k if k < TOP_K_MAX else TOP_K_MAX), p, mp


def set_sampler_threads(n: int) -> None:
    """Let the sampler split its whole-vocabulary passes (the exact total behind min_p 0 and top_p < 1,
    and ``probabilities()``) over the core's global thread pool: 1 (the default) keeps them on the
    calling thread, 2 or more allows the pool. The picks and probabilities do not depend on it
    (docs/sampling.md); it pays where the pool's workers are idle, as right after a decode step.
    Calls given an ``engine`` use that engine's own workers instead (``Engine.sampler_threads``)."""
    check_int(n, "n", 1)
    _core().set_sampling_threads(int(n))


def _pool_of(engine):
    """The core's ``pool_of`` for a call given ``engine``: its Model (split over its workers), False
    (the calling thread) or None (no engine, or one without a core model, e.g. a pipeline of stages:
    the process-wide setting)."""
    if engine is None:
        return None
    return getattr(engine, "_sampler_pool_of", None)


_core_module = None


def _core():
    """The compiled core, imported on first use (the rest of this module works without it)."""
    global _core_module
    if _core_module is None:
        from . import _core as core
        _core_module = core
    return _core_module


# ---- log-probabilities -----------------------------------------------------------------------
#
# In the core (csrc/sampling/logprobs.h, docs/sampling.md "Log-probabilities"): the log-sum-exp in
# double over the finite logits (a vectorised exp and compensated lane sums, within a stated bound
# of the exact value) and the top k from one pass over the logits, shared when both are asked.

def log_softmax(logits) -> np.ndarray:
    """float64 log-probabilities over the finite logits (non-finite entries give -inf)."""
    a = _as_logits(logits)
    lse = _core()._logsumexp(a)
    out = np.full(a.shape, -np.inf, dtype=np.float64)
    if lse is None:
        return out
    finite = np.isfinite(a)
    out[finite] = a[finite].astype(np.float64) - lse
    return out


def _scored(a: np.ndarray, k: int, token: int) -> tuple[float | None, list[TokenLogprob], float | None]:
    """The core's one pass: (lse or None when no logit is finite, the top k, token's logprob)."""
    lse, top, lp = _core().top_logprobs(a, max(0, min(int(k), a.size)), token)
    return lse, [TokenLogprob(i, v, p) for i, v, p in top], lp


def _checked_token(a: np.ndarray, token) -> int:
    if not 0 <= token < a.size:
        raise InvalidArgumentError(f"token id {token} out of range [0, {a.size})")
    return int(token)


def top_logprobs(logits, k: int) -> list[TokenLogprob]:
    """The k most likely finite tokens (earlier id first on equal logits) with their logprobs.

    Log-sum-exp runs in double over all finite logits, as upstream's ``ds4_session_top_logprobs``;
    fewer than k entries come back when fewer logits are finite (upstream pads with id -1).
    """
    a = _as_logits(logits)
    if k <= 0:
        return []
    return _scored(a, k, -1)[1]


def token_logprob(logits, token: int) -> TokenLogprob:
    """Logprob of one token (upstream's ``ds4_session_token_logprob``); -1e30 when its logit is not
    finite."""
    return token_and_top_logprobs(logits, token, 0)[0]


def token_and_top_logprobs(logits, token: int, k: int) -> tuple[TokenLogprob, list[TokenLogprob]]:
    """``token_logprob(logits, token)`` and ``top_logprobs(logits, k)`` with one log-sum-exp (the
    decode loop's call when a request asks for logprobs)."""
    a = _as_logits(logits)
    t = _checked_token(a, token)
    lse, top, lp = _scored(a, k, t)
    if lse is None:
        raise InvalidArgumentError("no finite logit to normalise over")
    return TokenLogprob(t, float(a[t]), lp), top
