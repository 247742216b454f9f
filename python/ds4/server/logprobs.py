"""Log-probabilities of sampled tokens (``logprobs`` / ``top_logprobs``) and their OpenAI shapes.

Computed from the raw logits the sampler saw (the model's distribution before temperature and
truncation, as OpenAI reports them), only for requests that ask: a log-softmax over the vocabulary
costs about a millisecond per token.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

__all__ = ["TokenLogprob", "token_logprobs", "chat_logprobs", "completion_logprobs"]

TokenLogprob = tuple[int, float, list[tuple[int, float]]]  # (token, logprob, [(alternative, logprob)])


def token_logprobs(logits, token: int, top: int) -> TokenLogprob:
    a = np.asarray(logits, dtype=np.float64)
    m = float(a.max())
    lse = m + math.log(float(np.exp(a - m).sum()))
    alts: list[tuple[int, float]] = []
    if top > 0:
        idx = np.argpartition(-a, top - 1)[:top]
        idx = idx[np.lexsort((idx, -a[idx]))]  # most likely first, ties by id
        alts = [(int(i), float(a[i]) - lse) for i in idx]
    return int(token), float(a[token]) - lse, alts


def _entry(tok, t: int, lp: float) -> dict:
    b = tok.token_to_bytes(t)
    return {"token": b.decode("utf-8", "replace"), "logprob": lp, "bytes": list(b)}


def chat_logprobs(tok, items: Sequence[TokenLogprob]) -> dict:
    """``choices[0].logprobs`` of a chat completion."""
    return {"content": [{**_entry(tok, t, lp), "top_logprobs": [_entry(tok, a, alp) for a, alp in alts]}
                        for t, lp, alts in items], "refusal": None}


def completion_logprobs(tok, items: Sequence[TokenLogprob]) -> dict:
    """``choices[0].logprobs`` of a legacy completion."""
    tokens, lps, tops, offsets = [], [], [], []
    off = 0
    for t, lp, alts in items:
        s = tok.token_to_bytes(t).decode("utf-8", "replace")
        tokens.append(s)
        lps.append(lp)
        tops.append({tok.token_to_bytes(a).decode("utf-8", "replace"): alp for a, alp in alts})
        offsets.append(off)
        off += len(s)
    return {"tokens": tokens, "token_logprobs": lps, "top_logprobs": tops, "text_offset": offsets}
