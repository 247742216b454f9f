"""DeepSeek V4 byte-level BPE tokenizer built from GGUF ``tokenizer.ggml.*`` metadata.

The BPE work is done by the HuggingFace ``tokenizers`` library (a well-kept Rust implementation):
we construct its BPE model from the GGUF vocabulary and merges and give it the official DeepSeek V4
pre-tokenizer (the three-split sequence of the released ``tokenizer.json``). That makes the output
equal, by construction, to the official tokenizer on any text, and fast (several MB/s on one core).

Two deliberate differences from upstream ds4.c (docs/runtime.md §1):

* Pre-tokenization follows the official ``tokenizer.json`` regexes, not upstream's byte-level
  approximation (§1.4). They agree on printable ASCII plus ``\\t\\n\\v\\f\\r`` (code and English
  prose); they differ on non-ASCII punctuation/symbols/emoji, CJK runs that do not start a piece,
  non-ASCII digits and whitespace, format characters, runs of ASCII control bytes, and an embedded
  NUL (upstream stops at it; here it is an ordinary character). See §1.4's table.
* Plain ``encode`` never recognises special tokens, *including* the 1283 added tokens an HF-style
  encoder would extract (``<｜User｜>`` typed by a user stays text: prompt-injection safety).
  ``encode_rendered`` recognises exactly upstream's seven chat specials (§1.6) and nothing else.

Example::

    >>> tok = Tokenizer.from_gguf("model.gguf")            # doctest: +SKIP
    >>> tok.decode(tok.encode("hello world"))               # doctest: +SKIP
    'hello world'
"""

from __future__ import annotations

import json
import mmap
import os
import re
import struct
from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np

from .errors import Ds4IOError, ModelFormatError, TokenizerError

__all__ = [
    "Tokenizer",
    "SpecialTokens",
    "SPECIAL_STRINGS",
    "TOKEN_TYPE_NORMAL",
    "TOKEN_TYPE_CONTROL",
    "TOKEN_TYPE_USER_DEFINED",
    "byte_to_unicode",
]

# GGUF token types (llama.cpp convention): control = special, user-defined = added non-special.
TOKEN_TYPE_NORMAL = 1
TOKEN_TYPE_CONTROL = 3
TOKEN_TYPE_USER_DEFINED = 4

# The seven strings upstream resolves by content (docs/runtime.md §1.2), in its recognition order.
SPECIAL_STRINGS: dict[str, str] = {
    "bos": "<｜begin▁of▁sentence｜>",
    "eos": "<｜end▁of▁sentence｜>",
    "user": "<｜User｜>",
    "assistant": "<｜Assistant｜>",
    "think_start": "<think>",
    "think_end": "</think>",
    "dsml": "｜DSML｜",
}

_FULLWIDTH_BAR = "\uff5c"

# Official DeepSeek V4 pre-tokenizer (tokenizer.json "pre_tokenizer"): three isolated splits.
_PRE_SPLIT_DIGITS = r"\p{N}{1,3}"
_PRE_SPLIT_CJK = "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+"
_PRE_SPLIT_MAIN = (
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+"
    "|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+"
    "| ?[\\p{P}\\p{S}]+[\r\n]*"
    "|\\s*[\r\n]+"
    "|\\s+(?!\\S)"
    "|\\s+"
)


def byte_to_unicode() -> dict[int, str]:
    """GPT-2 byte-level alphabet (docs/runtime.md §1.3): byte value -> the character standing for it."""
    printable = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    mapping = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in mapping:
            mapping[b] = chr(256 + extra)
            extra += 1
    return mapping


_BYTE_TO_UNICODE = byte_to_unicode()
_UNICODE_TO_BYTE = {ord(c): b for b, c in _BYTE_TO_UNICODE.items()}
# str.translate table: alphabet character -> the latin-1 character of its byte; code points below 324
# that are not in the alphabet are deleted (higher ones make latin-1 encoding fail -> slow path).
_BYTELEVEL_TABLE = {cp: (chr(_UNICODE_TO_BYTE[cp]) if cp in _UNICODE_TO_BYTE else None) for cp in range(324)}


@dataclass(frozen=True)
class SpecialTokens:
    """Ids of the chat special tokens, resolved by exact string (None when the vocab lacks one)."""

    bos: int | None
    eos: int | None
    user: int | None
    assistant: int | None
    think_start: int | None
    think_end: int | None
    dsml: int | None


class Tokenizer:
    """Byte-level BPE tokenizer for DeepSeek V4 vocabularies (real 129,280-token or tiny synthetic).

    ``tokens[i]`` is the GGUF token string of id ``i``; ``merges`` are ``"left right"`` strings,
    rank = index; ``token_types`` (optional) mark control (3) / user-defined (4) tokens, which are
    kept out of the BPE vocabulary and decode to their literal text.
    """

    def __init__(
        self,
        tokens: Sequence[str],
        merges: Sequence[str],
        token_types: Sequence[int] | None = None,
        *,
        pre: str | None = None,
        source: str = "<memory>",
    ) -> None:
        if len(tokens) == 0:
            raise ModelFormatError(f"{source}: tokenizer.ggml.tokens is empty, expected a vocabulary")
        if token_types is not None and len(token_types) != len(tokens):
            raise ModelFormatError(
                f"{source}: tokenizer.ggml.token_type has {len(token_types)} entries, "
                f"expected {len(tokens)} (one per token)"
            )
        self._tokens: tuple[str, ...] = tuple(tokens)
        self._types = None if token_types is None else np.asarray(token_types, dtype=np.int32)
        self.pre = pre
        self.source = source
        self._ids: dict[str, int] = {}
        for i, t in enumerate(self._tokens):
            self._ids.setdefault(t, i)  # duplicate strings: the first id wins (upstream unspecified)
        self._token_bytes: list[bytes] = [self._literal_or_bytelevel(i) for i in range(len(tokens))]
        self.special = SpecialTokens(**{k: self._ids.get(v) for k, v in SPECIAL_STRINGS.items()})
        self._hf = self._build_hf(merges, source)
        present = [s for s in SPECIAL_STRINGS.values() if s in self._ids]
        self._special_re = re.compile("(" + "|".join(re.escape(s) for s in present) + ")") if present else None

    # ---- construction -------------------------------------------------------------------------

    @classmethod
    def from_gguf(cls, path: str | os.PathLike[str]) -> "Tokenizer":
        """Read ``tokenizer.ggml.*`` from a GGUF header (tensor data is never touched)."""
        meta = _read_gguf_tokenizer_kv(os.fspath(path))
        src = os.fspath(path)
        tokens = meta.get("tokenizer.ggml.tokens")
        if tokens is None:
            raise ModelFormatError(f"{src}: missing key tokenizer.ggml.tokens (array of string)")
        merges = meta.get("tokenizer.ggml.merges", [])  # a pure byte vocabulary may have none
        return cls(tokens, merges, meta.get("tokenizer.ggml.token_type"), pre=meta.get("tokenizer.ggml.pre"),
                   source=src)

    @classmethod
    def from_tokenizer_json(cls, path: str | os.PathLike[str]) -> "Tokenizer":
        """Build from an HF ``tokenizer.json`` (base vocab + added tokens, as a GGUF converter would)."""
        src = os.fspath(path)
        try:
            with open(src, encoding="utf-8") as f:
                data = json.load(f)
        except OSError as e:
            raise Ds4IOError(f"{src}: cannot read tokenizer.json: {e}") from e
        except ValueError as e:
            raise TokenizerError(f"{src}: not valid JSON: {e}") from e
        try:
            vocab: dict[str, int] = data["model"]["vocab"]
            merges = [m if isinstance(m, str) else " ".join(m) for m in data["model"]["merges"]]
            added = data.get("added_tokens", [])
        except (KeyError, TypeError) as e:
            raise TokenizerError(f"{src}: expected model.vocab and model.merges (BPE), missing {e}") from e
        n = max([*vocab.values(), *(a["id"] for a in added)]) + 1
        tokens: list[str | None] = [None] * n
        types = [TOKEN_TYPE_NORMAL] * n
        for t, i in vocab.items():
            tokens[i] = t
        for a in added:
            tokens[a["id"]] = a["content"]
            types[a["id"]] = TOKEN_TYPE_CONTROL if a.get("special") else TOKEN_TYPE_USER_DEFINED
        holes = [i for i, t in enumerate(tokens) if t is None]
        if holes:
            raise TokenizerError(f"{src}: token ids {holes[:5]}... have no string, expected a dense vocabulary")
        return cls(tokens, merges, types, pre="deepseek-v4", source=src)  # type: ignore[arg-type]

    def _is_literal(self, i: int) -> bool:
        if self._types is not None and self._types[i] in (TOKEN_TYPE_CONTROL, TOKEN_TYPE_USER_DEFINED):
            return True
        return _FULLWIDTH_BAR in self._tokens[i]  # upstream's rule (§1.7): fullwidth bar => verbatim

    def _literal_or_bytelevel(self, i: int) -> bytes:
        s = self._tokens[i]
        if self._is_literal(i):
            return s.encode("utf-8")
        try:
            return s.translate(_BYTELEVEL_TABLE).encode("latin-1")
        except UnicodeEncodeError:  # code points outside the byte alphabet are dropped, as upstream
            return bytes(_UNICODE_TO_BYTE[ord(c)] for c in s if ord(c) in _UNICODE_TO_BYTE)

    def _build_hf(self, merges: Sequence[str], source: str):
        from tokenizers import Regex
        from tokenizers import Tokenizer as HFTokenizer
        from tokenizers import models, pre_tokenizers

        vocab: dict[str, int] = {}
        specials = set(SPECIAL_STRINGS.values())
        for i, t in enumerate(self._tokens):
            literal = self._types is not None and self._types[i] in (TOKEN_TYPE_CONTROL, TOKEN_TYPE_USER_DEFINED)
            if literal or t in specials:
                continue  # never reachable from BPE; keeping them out makes plain text stay text
            vocab.setdefault(t, i)
        pairs = []
        for rank, m in enumerate(merges):
            left, sep, right = m.partition(" ")
            if not sep or not left or not right:
                raise ModelFormatError(
                    f"{source}: tokenizer.ggml.merges[{rank}] = {m!r}, expected 'left right'"
                )
            pairs.append((left, right))
        try:
            model = models.BPE(vocab=vocab, merges=pairs, fuse_unk=False)
        except Exception as e:  # tokenizers raises plain Exception subclasses
            raise ModelFormatError(f"{source}: inconsistent tokenizer vocab/merges: {e}") from e
        hf = HFTokenizer(model)
        hf.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(_PRE_SPLIT_DIGITS), "isolated"),
                pre_tokenizers.Split(Regex(_PRE_SPLIT_CJK), "isolated"),
                pre_tokenizers.Split(Regex(_PRE_SPLIT_MAIN), "isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
        return hf

    # ---- properties ---------------------------------------------------------------------------

    @property
    def n_vocab(self) -> int:
        """Number of token ids (129,280 for the real DeepSeek V4 vocabulary)."""
        return len(self._tokens)

    def __len__(self) -> int:
        return len(self._tokens)

    @property
    def tokens(self) -> tuple[str, ...]:
        """GGUF token strings by id (byte-level encoded for ordinary tokens)."""
        return self._tokens

    bos = property(lambda self: self.special.bos, doc="Id of <｜begin▁of▁sentence｜> (or None).")
    eos = property(lambda self: self.special.eos, doc="Id of <｜end▁of▁sentence｜> (or None).")
    user = property(lambda self: self.special.user, doc="Id of <｜User｜> (or None).")
    assistant = property(lambda self: self.special.assistant, doc="Id of <｜Assistant｜> (or None).")
    think_start = property(lambda self: self.special.think_start, doc="Id of <think> (or None).")
    think_end = property(lambda self: self.special.think_end, doc="Id of </think> (or None).")
    dsml = property(lambda self: self.special.dsml, doc="Id of ｜DSML｜ (or None).")

    def id_of(self, token: str) -> int | None:
        """Id of an exact vocabulary string, or None."""
        return self._ids.get(token)

    def require(self, name: str) -> int:
        """Id of special token ``name`` (a SpecialTokens field); TokenizerError if the vocab lacks it."""
        tid = getattr(self.special, name)
        if tid is None:
            raise TokenizerError(
                f"{self.source}: vocabulary has no {SPECIAL_STRINGS[name]!r} token, needed for chat rendering"
            )
        return tid

    # ---- encoding -----------------------------------------------------------------------------

    def encode(self, text: str) -> list[int]:
        """Tokenize plain text. Special-token strings are ordinary text here; no BOS is added."""
        if not text:
            return []
        try:
            chunks = _safe_chunks(text, _CHUNK_CHARS)
            if len(chunks) == 1:
                return self._hf.encode(text, add_special_tokens=False).ids
            batch = getattr(self._hf, "encode_batch_fast", self._hf.encode_batch)
            return [i for enc in batch(chunks, add_special_tokens=False) for i in enc.ids]
        except Exception as e:
            bad = next((i for i, c in enumerate(text) if 0xD800 <= ord(c) <= 0xDFFF), None)
            if bad is not None:
                raise TokenizerError(
                    f"text is not valid Unicode: lone surrogate U+{ord(text[bad]):04X} at index {bad}"
                ) from e
            raise TokenizerError(f"tokenization failed: {e}") from e

    def encode_rendered(self, text: str) -> list[int]:
        """Tokenize rendered chat text: the seven chat specials (BOS, EOS, User, Assistant,
        ``<think>``, ``</think>``, ``｜DSML｜``) become their ids wherever they occur; the spans
        between them are plain-tokenized independently (the splitter restarts at each special)."""
        if self._special_re is None:
            return self.encode(text)
        out: list[int] = []
        for k, part in enumerate(self._special_re.split(text)):
            if k % 2:
                out.append(self._ids[part])
            elif part:
                out.extend(self.encode(part))
        return out

    encode_chat = encode_rendered

    # ---- decoding -----------------------------------------------------------------------------

    def token_to_bytes(self, token_id: int) -> bytes:
        """Raw bytes of one token (upstream §1.7); out-of-range ids give b"" as upstream does."""
        if 0 <= token_id < len(self._token_bytes):
            return self._token_bytes[token_id]
        return b""

    def decode_bytes(self, ids: Iterable[int]) -> bytes:
        """Concatenated raw bytes of ``ids`` (may end inside a UTF-8 sequence)."""
        tb = self._token_bytes
        n = len(tb)
        return b"".join(tb[i] if 0 <= i < n else b"" for i in (int(x) for x in ids))

    def decode(self, ids: Iterable[int], errors: str = "replace") -> str:
        """Text of ``ids``; invalid UTF-8 (e.g. a cut multi-byte character) uses ``errors``."""
        return self.decode_bytes(ids).decode("utf-8", errors=errors)

    def __repr__(self) -> str:
        return f"Tokenizer(n_vocab={self.n_vocab}, source={self.source!r})"


# ---- long texts --------------------------------------------------------------------------------

# The HF pre-tokenizer slows down on very long strings (its regex splits keep per-piece offsets), so
# long texts are cut at points no pre-tokenizer piece can cross and encoded as a batch. A newline
# followed by printable non-space ASCII is such a point: every alternative of the official regex
# that can contain a newline ends at the last newline of its run (\s*[\r\n]+, [\p{P}\p{S}]+[\r\n]*,
# \s+(?!\S) before a non-space), and no alternative can start with a newline and continue into a
# non-space character; the digit and CJK splits never contain a newline.
_CHUNK_CHARS = 4096
_SAFE_CUT = re.compile(r"\n(?=[!-~])")


def _safe_chunks(text: str, target: int) -> list[str]:
    """``text`` cut at safe points into pieces of about ``target`` characters (or fewer cuts)."""
    if len(text) <= target:
        return [text]
    out, start = [], 0
    while len(text) - start > target:
        m = _SAFE_CUT.search(text, start + target)
        if m is None:
            break
        out.append(text[start:m.end()])
        start = m.end()
    out.append(text[start:])
    return out


# ---- GGUF header reading (key/value section only) ------------------------------------------------

_GGUF_SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_GGUF_NP = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "<u1", 10: "<u8", 11: "<i8",
            12: "<f8"}
_GGUF_STRING, _GGUF_ARRAY = 8, 9
_WANTED_PREFIX = "tokenizer.ggml."


class _Cursor:
    """Bounds-checked little-endian reader over a buffer; errors name the file and offset."""

    def __init__(self, buf, path: str) -> None:
        self.buf, self.path, self.off = buf, path, 0

    def _need(self, n: int, what: str) -> None:
        if n < 0 or self.off + n > len(self.buf):
            raise ModelFormatError(
                f"{self.path}: truncated GGUF header reading {what} at offset {self.off} "
                f"(need {n} bytes, file has {len(self.buf) - self.off} left)"
            )

    def scalar(self, fmt: str, what: str):
        size = struct.calcsize(fmt)
        self._need(size, what)
        (v,) = struct.unpack_from(fmt, self.buf, self.off)
        self.off += size
        return v

    def string(self, what: str) -> str:
        n = self.scalar("<Q", what)
        self._need(n, what)
        raw = self.buf[self.off:self.off + n]
        self.off += n
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise ModelFormatError(f"{self.path}: {what} is not valid UTF-8: {e}") from e

    def strings(self, count: int, what: str) -> list[str]:
        """``count`` length-prefixed strings (the hot path for 129k-token vocabularies)."""
        buf, off, size = self.buf, self.off, len(self.buf)
        unpack = struct.Struct("<Q").unpack_from
        raw = []
        append = raw.append
        for _ in range(count):
            if off + 8 > size:
                self.off = off
                self._need(8, what)
            (n,) = unpack(buf, off)
            off += 8
            if off + n > size:
                self.off = off
                self._need(n, what)
            append(buf[off:off + n])
            off += n
        self.off = off
        try:
            return [b.decode("utf-8") for b in raw]
        except UnicodeDecodeError as e:
            raise ModelFormatError(f"{self.path}: {what} holds a string that is not valid UTF-8: {e}") from e

    def skip_strings(self, count: int, what: str) -> None:
        for _ in range(count):
            n = self.scalar("<Q", what)
            self._need(n, what)
            self.off += n

    def value(self, vtype: int, key: str, keep: bool):
        if vtype in _GGUF_SCALAR:
            return self.scalar(_GGUF_SCALAR[vtype], key)
        if vtype == _GGUF_STRING:
            return self.string(key)
        if vtype != _GGUF_ARRAY:
            raise ModelFormatError(f"{self.path}: key {key} has unknown GGUF value type {vtype}")
        etype = self.scalar("<I", key)
        count = self.scalar("<Q", key)
        if etype in _GGUF_NP:
            size = np.dtype(_GGUF_NP[etype]).itemsize
            self._need(count * size, key)
            raw = self.buf[self.off:self.off + count * size] if keep else None
            self.off += count * size
            return None if raw is None else np.frombuffer(raw, dtype=_GGUF_NP[etype]).copy()
        if etype == _GGUF_STRING:
            if not keep:
                self.skip_strings(count, key)
                return None
            return self.strings(count, key)
        if etype == _GGUF_ARRAY:
            out = [self.value(_GGUF_ARRAY, key, keep) for _ in range(count)]
            return out if keep else None
        raise ModelFormatError(f"{self.path}: key {key} is an array of unknown GGUF type {etype}")


def _read_gguf_tokenizer_kv(path: str) -> dict[str, object]:
    """All ``tokenizer.ggml.*`` key/values of a GGUF file (v2/v3, little-endian)."""
    try:
        f = open(path, "rb")
    except OSError as e:
        raise Ds4IOError(f"{path}: cannot open GGUF file: {e}") from e
    with f:
        try:
            buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except (ValueError, OSError) as e:
            raise ModelFormatError(f"{path}: not a GGUF file (cannot map: {e})") from e
        with buf:
            cur = _Cursor(buf, path)
            cur._need(24, "GGUF preamble")
            if buf[:4] != b"GGUF":
                raise ModelFormatError(f"{path}: bad magic {bytes(buf[:4])!r}, expected b'GGUF'")
            cur.off = 4
            version = cur.scalar("<I", "version")
            if version not in (2, 3):
                raise ModelFormatError(f"{path}: GGUF version {version}, expected 2 or 3 (little-endian)")
            cur.scalar("<Q", "tensor count")
            n_kv = cur.scalar("<Q", "key/value count")
            out: dict[str, object] = {}
            for _ in range(n_kv):
                key = cur.string("key name")
                vtype = cur.scalar("<I", f"type of {key}")
                keep = key.startswith(_WANTED_PREFIX)
                val = cur.value(vtype, key, keep)
                if keep:
                    out[key] = val
    tokens = out.get("tokenizer.ggml.tokens")
    if tokens is not None and not (isinstance(tokens, list) and all(isinstance(t, str) for t in tokens)):
        raise ModelFormatError(f"{path}: tokenizer.ggml.tokens is not an array of string")
    merges = out.get("tokenizer.ggml.merges")
    if merges is not None and not (isinstance(merges, list) and all(isinstance(t, str) for t in merges)):
        raise ModelFormatError(f"{path}: tokenizer.ggml.merges is not an array of string")
    types = out.get("tokenizer.ggml.token_type")
    if types is not None and not isinstance(types, np.ndarray):
        raise ModelFormatError(f"{path}: tokenizer.ggml.token_type is not an array of integers")
    return out
