"""OpenAI shapes of the sampled tokens' log-probabilities (``logprobs`` / ``top_logprobs``).

The numbers come from the decode step (:class:`ds4.decoding.TokenPicker`, with
:func:`ds4.sampling.token_logprob` / :func:`ds4.sampling.top_logprobs`) on the raw logits the
sampler saw (the model's distribution before temperature and truncation, as OpenAI reports them),
only for requests that ask: a log-softmax over the vocabulary per token.
"""

from __future__ import annotations

from typing import Sequence

__all__ = ["TokenLogprob", "chat_logprobs", "completion_logprobs"]

TokenLogprob = tuple[int, float, list[tuple[int, float]]]  # (token, logprob, [(alternative, logprob)])


def _entry(tok, t: int, lp: float) -> dict:
    b = tok.token_to_bytes(t)
    return {"token": b.decode("utf-8", "replace"), "logprob": lp, "bytes": list(b)}


def chat_logprobs(tok, items: Sequence[TokenLogprob]) -> dict:
    """``choices[0].logprobs`` of a chat completion."""
    return {"content": [{**_entry(tok, t, lp), "top_logprobs": [_entry(tok, a, alp) for a, alp in alts]}
                        for t, lp, alts in items], "refusal": None}


def completion_logprobs(tok, items: Sequence[TokenLogprob], start: int = 0) -> dict:
    """``choices[0].logprobs`` of a legacy completion; ``start``: the text offset of the first
    item (a stream chunk's tokens continue the previous chunks')."""
    tokens, lps, tops, offsets = [], [], [], []
    off = start
    for t, lp, alts in items:
        s = tok.token_to_bytes(t).decode("utf-8", "replace")
        tokens.append(s)
        lps.append(lp)
        tops.append({tok.token_to_bytes(a).decode("utf-8", "replace"): alp for a, alp in alts})
        offsets.append(off)
        off += len(s)
    return {"tokens": tokens, "token_logprobs": lps, "top_logprobs": tops, "text_offset": offsets}
