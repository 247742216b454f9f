"""Engine-free stand-ins for the KV cache tests: a byte tokenizer, a session, an engine.

They follow the interfaces ds4.kvcache codes against (Session: tokens/pos/ctx/sync/save_payload/
load_payload; Tokenizer: token_to_bytes/decode_bytes/encode_rendered/special; Engine: tokenizer,
info.routed_bits, info.shape) and count evaluated tokens so tests can prove only a suffix ran.
The session's payload is a structurally valid DSV4 payload (ds4.payload.synthetic_payload) whose
tensor bytes depend on the token history, so a restored session is checkably the stored one.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from types import SimpleNamespace

from ds4.errors import CacheFormatError, ContextOverflowError
from ds4.payload import check_payload_fits, default_prefill_cap, read_payload_info, synthetic_payload
from ds4.session import common_prefix_len

USER = "<｜User｜>"
ASSISTANT = "<｜Assistant｜>"
BOS = "<｜begin▁of▁sentence｜>"

RATIOS = (0, 0, 4, 128)
SHAPE = SimpleNamespace(n_layer=4, head_dim=8, indexer_head_dim=4, n_vocab=300, compress_ratios=RATIOS, n_swa=8)


class ByteTokenizer:
    """Ids 0-255 are single bytes; 256-258 are the chat specials; 259 is the two bytes "ab"."""

    def __init__(self) -> None:
        self._bytes = [bytes([i]) for i in range(256)] + [USER.encode(), ASSISTANT.encode(), BOS.encode(), b"ab"]
        self.special = SimpleNamespace(user=256, assistant=257, bos=258)
        self.calls: list[str] = []  # every text given to encode_rendered

    def token_to_bytes(self, tid: int) -> bytes:
        return self._bytes[tid] if 0 <= tid < len(self._bytes) else b""

    def decode_bytes(self, ids) -> bytes:
        return b"".join(self.token_to_bytes(int(i)) for i in ids)

    def encode_rendered(self, text: str) -> list[int]:
        self.calls.append(text)
        out: list[int] = []
        data = text.encode()
        specials = [(USER.encode(), 256), (ASSISTANT.encode(), 257), (BOS.encode(), 258)]
        i = 0
        while i < len(data):
            for s, tid in specials:
                if data.startswith(s, i):
                    out.append(tid)
                    i += len(s)
                    break
            else:
                if data.startswith(b"ab", i):
                    out.append(259)
                    i += 2
                else:
                    out.append(data[i])
                    i += 1
        return out


def _seed(tokens) -> int:
    return zlib.crc32(b"".join(int(t).to_bytes(4, "little") for t in tokens))


class FakeSession:
    def __init__(self, engine: "FakeEngine", ctx: int) -> None:
        self.engine = engine
        self.ctx = ctx
        self._tokens: list[int] = []
        self.evaluated = 0          # tokens run through the "model"
        self.syncs: list[int] = []  # lengths passed to sync
        self.loads = 0

    @property
    def tokens(self) -> list[int]:
        return list(self._tokens)

    @property
    def pos(self) -> int:
        return len(self._tokens)

    def sync(self, tokens) -> None:
        tokens = [int(t) for t in tokens]
        if not tokens or len(tokens) >= self.ctx:
            raise ContextOverflowError(f"prompt of {len(tokens)} tokens exceeds context {self.ctx}")
        self.syncs.append(len(tokens))
        if self._tokens and tokens[: len(self._tokens)] == self._tokens:
            self.evaluated += len(tokens) - len(self._tokens)
        else:
            self.evaluated += len(tokens)
        self._tokens = tokens

    def common_prefix(self, tokens):  # Session.common_prefix
        return common_prefix_len(self.tokens, tokens)

    def eval(self, token: int) -> None:
        self._tokens.append(int(token))
        self.evaluated += 1

    def save_payload(self) -> bytes:
        if not self._tokens:
            raise CacheFormatError("session has no valid checkpoint to save")
        return synthetic_payload(
            n_layer=SHAPE.n_layer, head_dim=SHAPE.head_dim, indexer_head_dim=SHAPE.indexer_head_dim,
            n_vocab=SHAPE.n_vocab, ratios=RATIOS, ctx=self.ctx, tokens=self._tokens,
            n_swa=SHAPE.n_swa, seed=_seed(self._tokens) + self.engine.salt,
        )

    def load_payload(self, data: bytes) -> None:
        self._tokens = []  # a failed load leaves the session invalid, as the engine does
        info = read_payload_info(data, RATIOS, head_dim=SHAPE.head_dim,
                                 indexer_head_dim=SHAPE.indexer_head_dim, n_vocab=SHAPE.n_vocab)
        check_payload_fits(info.header, self.ctx)
        if info.header.prefill_cap != default_prefill_cap(self.ctx):
            raise CacheFormatError("KV checkpoint graph chunk layout does not match current runtime")
        import struct
        tokens = list(struct.unpack_from(f"<{info.tokens}I", data, 52))
        self.loads += 1
        self._tokens = tokens
        self.restored = bytes(data)


@dataclass
class FakeEngine:
    routed_bits: int = 2
    salt: int = 0

    def __post_init__(self) -> None:
        self.tokenizer = ByteTokenizer()
        self.info = SimpleNamespace(routed_bits=self.routed_bits, shape=SHAPE)

    def session(self, ctx: int = 4096) -> FakeSession:
        return FakeSession(self, ctx)


def text_of(n: int, seed: int = 0, prefix: str = "") -> str:
    """Deterministic ASCII text without "ab" pairs, so its token count equals its byte count."""
    import random

    rng = random.Random(seed)
    alphabet = "cdefghijklmnopqrstuvwxyz0123456789 .,\n"
    return prefix + "".join(rng.choice(alphabet) for _ in range(n - len(prefix.encode())))
