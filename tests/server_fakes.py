"""Doubles for server tests: an engine whose session "generates" a scripted text.

:class:`ScriptEngine` answers every request with ``engine.script`` (token ids, EOS appended by
``set``): after each ``sync`` the logits put all the mass on the next scripted token, so greedy or
sampled decoding both reproduce the script exactly, and tool calls, reasoning and stop strings come
out byte for byte as written. Tokens the server evaluates without sampling (a forced tool-call
opening) take the script's place, as they would take the model's.
"""

from __future__ import annotations

import numpy as np

from ds4.errors import ContextOverflowError
from ds4.tokenizer import Tokenizer
from test_tokenizer_fixtures import tiny_vocab
from ds4.session import common_prefix_len


def scripted_logits(engine, i: int) -> np.ndarray:
    """Logits putting all the mass on the ``i``-th scripted token (EOS past the script): 20 on it,
    -20 on every other id."""
    nxt = engine.script[i] if i < len(engine.script) else engine.tokenizer.eos
    out = np.full(engine.tokenizer.n_vocab, -20.0, dtype=np.float32)
    out[nxt] = 20.0
    return out


def script_tokenizer() -> Tokenizer:
    tokens, merges, types = tiny_vocab()
    return Tokenizer(tokens, merges, types)


class ScriptSession:
    """Session double: after each sync the logits spell out ``engine.script`` token by token."""

    def __init__(self, engine, ctx):
        self.engine, self.ctx = engine, ctx
        self.tokens: list[int] = []
        self.base = 0
        self.evaluated = 0  # tokens evaluated by sync/eval (what reuse saves)

    @property
    def pos(self):
        return len(self.tokens)

    def sync(self, tokens, progress=None):
        tokens = list(tokens)
        if not tokens or len(tokens) >= self.ctx:
            raise ContextOverflowError("prompt exceeds context")
        if self.tokens != tokens[: len(self.tokens)]:
            self.tokens = []
        self.evaluated += len(tokens) - len(self.tokens)
        self.tokens = tokens
        self.base = len(tokens)

    def eval(self, token):
        self.tokens.append(int(token))
        self.evaluated += 1

    def reset(self):
        self.tokens, self.base = [], 0

    def common_prefix(self, tokens):  # Session.common_prefix
        return common_prefix_len(self.tokens, tokens)

    @property
    def logits(self):
        return scripted_logits(self.engine, len(self.tokens) - self.base)


class ScriptEngine:
    def __init__(self, tokenizer, text=""):
        self.tokenizer = tokenizer
        self.set(text)

    def set(self, text, eos=True):
        self.script = self.tokenizer.encode_rendered(text) + ([self.tokenizer.eos] if eos else [])

    def session(self, ctx):
        return ScriptSession(self, ctx)
