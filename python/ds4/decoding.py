"""The decode step both token loops share (``ds4.generation.generate`` and the server's worker):
how the next token is chosen and how the growing output is watched.

* :class:`TokenPicker`: forced tokens first (text the caller writes for the model, e.g. a forced
  tool-call opening), greedy when sampling is off or the DSML recognizer says the next token is
  protocol syntax (docs/runtime.md §8.3), else the sampler; optionally OpenAI's ``logit_bias`` and
  presence / frequency penalties (never on DSML syntax), and the chosen token's logprob and the
  top alternatives;
* :class:`StopMatcher`: stop strings over ``str`` or ``bytes``, holding back only what could still
  begin one;
* :class:`ToolBlockWatch`: whether a complete tool-call block (start and end marker, any syntax)
  has appeared, scanning only new text.

The loops themselves differ where upstream's CLI and server differ (the CLI leaves the last token
unevaluated and matches stops per channel; the server evaluates every token, matches stops on the
raw bytes and streams through the API outputs), so each keeps its own loop around these pieces.
Per token everything here is O(new text), never O(output so far).
"""

from __future__ import annotations

import collections
from typing import AnyStr, Iterable, Mapping, Sequence

import numpy as np

from .dsml import DsmlTracker
from .sampling import Rng, argmax, sample, token_and_top_logprobs

__all__ = ["TokenPicker", "StopMatcher", "ToolBlockWatch", "BLOCK_MARKERS"]


class TokenPicker:
    """Chooses each next token from a session's logits (see the module docstring).

    ``tracker``: a :class:`ds4.dsml.DsmlTracker` the caller keeps updated with the output text
    (None: no tool-call rules). ``logprobs``: None, or how many alternatives to report (0 = only
    the chosen token's logprob); the last pick's values are in ``logprob`` / ``tops``. ``engine``:
    the engine whose logits are picked from (its ``sampler_threads`` may lend its workers to the
    sampler: :func:`ds4.sampling.sample`)."""

    def __init__(self, temperature: float, top_k: int, top_p: float, min_p: float, rng: Rng | None,
                 tracker: DsmlTracker | None = None, logprobs: int | None = None,
                 logit_bias: Mapping[int, float] | None = None, presence_penalty: float = 0.0,
                 frequency_penalty: float = 0.0, engine=None) -> None:
        self.temperature, self.top_k, self.top_p, self.min_p, self.rng = temperature, top_k, top_p, min_p, rng
        self.plain_greedy = not temperature > 0  # as sample(): NaN and <= 0 are greedy
        self.tracker = tracker
        self.engine = engine
        self.logprobs = logprobs
        self.forced: collections.deque[int] = collections.deque()
        self.logprob: float | None = None
        self.tops: tuple = ()
        # OpenAI's logit_bias and presence / frequency penalties, as one vector added to the logits
        # (updated as tokens are picked, so a pick costs one vocabulary-sized add; made on first use)
        self.presence, self.frequency = float(presence_penalty), float(frequency_penalty)
        self.adjusts = bool(logit_bias) or bool(self.presence) or bool(self.frequency)
        self._logit_bias = dict(logit_bias or {})
        self._bias: np.ndarray | None = None
        self._seen: set[int] = set()

    def force(self, tokens: Iterable[int]) -> None:
        """The next picks are these tokens, whatever the logits say."""
        self.forced.extend(int(t) for t in tokens)

    def _bias_vector(self, n: int) -> np.ndarray:
        if self._bias is None:
            self._bias = np.zeros(n, dtype=np.float32)
            for t, b in self._logit_bias.items():
                self._bias[t] += b
        return self._bias

    def pick(self, logits) -> int:
        syntax = self.tracker is not None and self.tracker.greedy  # DSML syntax: no bias, no penalty
        adjusted = logits
        if self.adjusts and not syntax:
            adjusted = np.asarray(logits, dtype=np.float32) + self._bias_vector(len(logits))
        if self.forced:
            token = self.forced.popleft()
        elif self.plain_greedy or syntax:
            token = argmax(adjusted)
        else:
            token = sample(adjusted, self.temperature, self.top_k, self.top_p, self.min_p, self.rng, engine=self.engine)
        if self.logprobs is not None:  # the model's own distribution, as OpenAI reports it (one pass)
            chosen, tops = token_and_top_logprobs(logits, token, self.logprobs)
            self.logprob, self.tops = chosen.logprob, tuple(tops)
        if self.adjusts:
            self._bias_vector(len(logits))[token] -= self.frequency + (0.0 if token in self._seen else self.presence)
            self._seen.add(token)
        return token


class StopMatcher:
    """Holds back text that may begin a stop string; finds the earliest complete match.

    Works on ``str`` (``generate``: per channel) or ``bytes`` (the server: over the raw output,
    reasoning included) alike. Only the held-back text is kept (shorter than the longest stop string): a stop string can only
    begin inside it, because released text was never a prefix of any stop string. So each push
    costs O(len(delta) + longest stop), whatever the length of the generation.
    """

    def __init__(self, stops: Sequence[AnyStr]) -> None:
        self.stops = [s for s in stops if s]
        self.max_len = max((len(s) for s in self.stops), default=0)
        self.held = stops[0][:0] if self.stops else ""  # pushed but not yet released (same type as the stops)
        self.length = 0  # characters pushed since the last reset

    @property
    def released(self) -> int:
        """Characters released since the last reset (the stop's position after a match)."""
        return self.length - len(self.held)

    def reset(self) -> str:
        """Release everything held (channel switch) and start a new text."""
        out = self.held
        self.held, self.length = out[:0], 0
        return out

    def push(self, delta: AnyStr) -> tuple[AnyStr, AnyStr | None]:
        """Append ``delta``; return (text safe to release now, matched stop string or None)."""
        self.length += len(delta)
        if not self.stops:
            return delta, None
        text = self.held + delta
        best, stop = -1, None
        for s in self.stops:
            i = text.find(s)
            if i >= 0 and (best < 0 or i < best):  # earliest hit wins; ties: the first listed
                best, stop = i, s
        if stop is not None:
            self.held = text[best:]
            return text[:best], stop
        hold = 0
        for k in range(min(len(text), self.max_len - 1), 0, -1):
            tail = text[-k:]
            if any(s.startswith(tail) for s in self.stops):
                hold = k
                break
        end = len(text) - hold
        self.held = text[end:]
        return text[:end], None


BLOCK_MARKERS = (("<｜DSML｜tool_calls>", "</｜DSML｜tool_calls>"), ("<DSML｜tool_calls>", "</DSML｜tool_calls>"),
                  ("<tool_calls>", "</tool_calls>"))


class ToolBlockWatch:
    """Whether a tool-call start marker (any syntax) followed by its end marker occurs in
    ``text[start:]``, for a text that only grows: each call scans only the new characters (plus a
    marker's length of overlap), never the whole text again."""

    def __init__(self, start: int) -> None:
        self.start = start
        self.scanned = start  # text length at the previous call
        self.opened_at = [-1] * len(BLOCK_MARKERS)  # where each syntax's first start marker ends

    def closed(self, text: str) -> bool:
        prev, self.scanned = self.scanned, len(text)
        for i, (open_tag, close_tag) in enumerate(BLOCK_MARKERS):
            at = self.opened_at[i]
            if at < 0:
                k = text.find(open_tag, max(self.start, prev - len(open_tag) + 1))
                if k < 0:
                    continue
                at = self.opened_at[i] = k + len(open_tag)
                if text.find(close_tag, at) >= 0:
                    return True
            elif text.find(close_tag, max(at, prev - len(close_tag) + 1)) >= 0:
                return True
        return False

    @property
    def opened(self) -> bool:
        """A start marker was seen (an output ending here has an unterminated block)."""
        return any(at >= 0 for at in self.opened_at)
