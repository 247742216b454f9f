"""Pure-Python reader and validator of the DSV4 session payload (docs/runtime.md §6.1-6.2).

The payload is what ``Session.save_payload()`` returns and what a ``.kv`` cache file carries after
its text section: 13 little-endian u32 header fields, the checkpoint tokens, the next-token logits,
per-layer compressed / indexer row counts, then per-layer tensors. Its size follows from the header,
the row counts and the model's per-layer compress ratios (which are *not* stored in the payload)::

    >>> from ds4.payload import synthetic_payload, read_payload_info
    >>> ratios = (0, 0, 4, 128)
    >>> blob = synthetic_payload(n_layer=4, head_dim=8, indexer_head_dim=4, n_vocab=16,
    ...                          ratios=ratios, ctx=64, tokens=list(range(10)))
    >>> info = read_payload_info(blob, ratios)
    >>> info.header.tokens, info.n_comp, info.nbytes == len(blob)
    (10, (0, 0, 2, 0), True)

Everything here reads bytes only; it never needs the compiled core, so the cache layer can validate
a file before handing it to the engine, and ``ds4 cache show`` can describe it.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, fields
from typing import Sequence

from .errors import CacheFormatError

__all__ = [
    "PAYLOAD_MAGIC",
    "PAYLOAD_VERSION",
    "PAYLOAD_HEADER_FIELDS",
    "PAYLOAD_HEADER_BYTES",
    "PayloadHeader",
    "PayloadInfo",
    "attn_state_bytes",
    "index_state_bytes",
    "payload_bytes",
    "read_payload_header",
    "read_payload_info",
    "payload_sections",
    "check_payload_fits",
    "default_prefill_cap",
    "synthetic_payload",
    "split_payload",
    "merge_payloads",
]

PAYLOAD_MAGIC = 0x34565344  # bytes "DSV4" read as a little-endian u32
PAYLOAD_VERSION = 1
PAYLOAD_HEADER_FIELDS = 13
PAYLOAD_HEADER_BYTES = 4 * PAYLOAD_HEADER_FIELDS
_F32 = 4
_U32 = 4


@dataclass(frozen=True)
class PayloadHeader:
    """The 13 u32 header fields of a DSV4 session payload, in file order."""

    magic: int
    version: int
    ctx: int             # ctx size of the writing session
    prefill_cap: int     # the writer's prefill chunk, min(ctx, 2048) by default
    raw_cap: int         # physical raw ring rows
    raw_window: int      # logical sliding-window rows
    comp_cap: int        # compressed row capacity of the writer
    tokens: int          # checkpoint token count T
    n_layer: int
    head_dim: int
    indexer_head_dim: int
    n_vocab: int
    raw_rows: int        # live raw rows serialized per layer, R = min(raw_window, T)

    def pack(self) -> bytes:
        return struct.pack("<13I", *(getattr(self, f.name) for f in fields(self)))

    @classmethod
    def unpack(cls, data: bytes | memoryview) -> "PayloadHeader":
        if len(data) < PAYLOAD_HEADER_BYTES:
            raise CacheFormatError(
                f"truncated session payload: {len(data)} bytes, the header alone needs {PAYLOAD_HEADER_BYTES}"
            )
        return cls(*struct.unpack_from("<13I", data, 0))


@dataclass(frozen=True)
class PayloadInfo:
    """A validated payload's header, row counts and exact byte size (tokens are not copied)."""

    header: PayloadHeader
    n_comp: tuple[int, ...]
    n_index_comp: tuple[int, ...]
    ratios: tuple[int, ...]
    nbytes: int

    @property
    def tokens(self) -> int:
        return self.header.tokens


def _coff(ratio: int) -> int:
    # Ratio-4 compressors keep two overlapping windows (docs/model.md; docs/runtime.md §5.1).
    return 2 if ratio == 4 else 1


def attn_state_bytes(ratio: int, head_dim: int) -> int:
    """Bytes of one attention compressor frontier tensor (kv or score) of a ratio>0 layer."""
    c = _coff(ratio)
    return c * ratio * c * head_dim * _F32


def index_state_bytes(ratio: int, indexer_head_dim: int) -> int:
    """Bytes of one indexer frontier tensor (kv or score) of a ratio-4 layer."""
    c = _coff(ratio)
    return c * ratio * c * indexer_head_dim * _F32


def payload_bytes(
    header: PayloadHeader,
    n_comp: Sequence[int],
    n_index_comp: Sequence[int],
    ratios: Sequence[int],
) -> int:
    """Exact payload size (upstream ``ds4_session_payload_bytes``), from header fields and row counts.

    ``52 + 4T + 4V + 8L + sum_l [R*4D + (r!=0: n_comp*4D + 2*attn_state) + (r==4: n_index*4I + 2*index_state)]``
    """
    h = header
    total = PAYLOAD_HEADER_BYTES + _U32 * h.tokens + _F32 * h.n_vocab + 2 * _U32 * h.n_layer
    for il, ratio in enumerate(ratios):
        total += h.raw_rows * h.head_dim * _F32
        if ratio == 0:
            continue
        total += n_comp[il] * h.head_dim * _F32 + 2 * attn_state_bytes(ratio, h.head_dim)
        if ratio == 4:
            total += n_index_comp[il] * h.indexer_head_dim * _F32
            total += 2 * index_state_bytes(ratio, h.indexer_head_dim)
    return total


def read_payload_header(data: bytes | memoryview) -> PayloadHeader:
    """Parse and check magic and version (§6.2 steps 1-2), and that the buffer holds at least the
    fixed sections the header claims (tokens, logits, row counts): so no later step loops over or
    allocates from a count the bytes cannot back."""
    h = PayloadHeader.unpack(data)
    if h.magic != PAYLOAD_MAGIC or h.version != PAYLOAD_VERSION:
        raise CacheFormatError(
            f"unsupported session payload version: magic 0x{h.magic:08x} version {h.version}, "
            f"expected magic 0x{PAYLOAD_MAGIC:08x} version {PAYLOAD_VERSION}"
        )
    fixed = PAYLOAD_HEADER_BYTES + _U32 * h.tokens + _F32 * h.n_vocab + 2 * _U32 * h.n_layer
    if fixed > len(data):
        raise CacheFormatError(
            f"truncated session payload: the header claims {h.tokens} tokens, vocab {h.n_vocab} and "
            f"{h.n_layer} layers ({fixed} bytes before the layer data), the buffer has {len(data)}"
        )
    return h


def read_payload_info(
    data: bytes | memoryview,
    ratios: Sequence[int],
    *,
    head_dim: int | None = None,
    indexer_head_dim: int | None = None,
    n_vocab: int | None = None,
    exact: bool = True,
    allow_empty: bool = False,
) -> PayloadInfo:
    """Validate a payload's structure against the model's compress ratios and return its layout.

    Checks magic/version, that the layout fields match the model (layer count = ``len(ratios)``,
    and the given dims), the raw-ring invariants, row counts against the saved compressed cap, and
    that ``len(data)`` equals the size the header implies (``exact=False`` accepts a longer buffer,
    for reading a prefix of a file; ``allow_empty`` accepts a payload of no tokens, which an empty
    session writes but the cache never stores). Raises :class:`~ds4.errors.CacheFormatError` naming
    the field.
    """
    h = read_payload_header(data)
    expected_dims = {
        "layer count": (h.n_layer, len(ratios)),
        "head dim": (h.head_dim, head_dim),
        "indexer head dim": (h.indexer_head_dim, indexer_head_dim),
        "vocab size": (h.n_vocab, n_vocab),
    }
    for name, (found, want) in expected_dims.items():
        if want is not None and found != want:
            raise CacheFormatError(
                f"KV checkpoint was written for a different DS4 layout: {name} {found}, model has {want}"
            )
    if h.tokens == 0 and not allow_empty:
        raise CacheFormatError("session payload holds no tokens (header field 7 is 0)")
    if h.tokens >= h.ctx:
        raise CacheFormatError(f"session payload has {h.tokens} tokens for ctx {h.ctx}; at most ctx-1 fit")
    if h.raw_cap == 0 or h.raw_rows != min(h.tokens, h.raw_window) or h.raw_rows > h.raw_cap:
        raise CacheFormatError(
            f"KV checkpoint raw ring layout is inconsistent: raw rows {h.raw_rows}, raw cap {h.raw_cap}, "
            f"raw window {h.raw_window}, tokens {h.tokens} (expected rows = min(tokens, window) <= cap)"
        )
    counts_off = PAYLOAD_HEADER_BYTES + _U32 * h.tokens + _F32 * h.n_vocab
    counts_end = counts_off + 2 * _U32 * h.n_layer
    if len(data) < counts_end:
        raise CacheFormatError(
            f"truncated session payload: {len(data)} bytes, row counts end at byte {counts_end}"
        )
    counts = struct.unpack_from(f"<{2 * h.n_layer}I", data, counts_off)
    n_comp, n_index = counts[: h.n_layer], counts[h.n_layer :]
    for il in range(h.n_layer):
        if n_comp[il] > h.comp_cap:
            raise CacheFormatError(
                f"KV checkpoint has invalid compressed row count: layer {il} has {n_comp[il]} rows, "
                f"saved compressed cap is {h.comp_cap}"
            )
        if n_index[il] > h.comp_cap:
            raise CacheFormatError(
                f"KV checkpoint has invalid indexer row count: layer {il} has {n_index[il]} rows, "
                f"saved compressed cap is {h.comp_cap}"
            )
    nbytes = payload_bytes(h, n_comp, n_index, ratios)
    # The layer sections' sizes follow from the model's compress ratios, which the payload does not
    # store: a size mismatch is a truncated file or a payload written by another model shape.
    why = "truncated, or written for a model with other compress ratios"
    if len(data) < nbytes:
        raise CacheFormatError(
            f"session payload is {len(data)} bytes, this model's layout (compress ratios "
            f"{_short(ratios)}) implies {nbytes}: {why}")
    if exact and len(data) != nbytes:
        raise CacheFormatError(
            f"KV checkpoint has trailing payload bytes: {len(data)} bytes, this model's layout "
            f"(compress ratios {_short(ratios)}) implies {nbytes}: {why}")
    return PayloadInfo(h, tuple(n_comp), tuple(n_index), tuple(ratios), nbytes)


def _short(ratios: Sequence[int]) -> str:
    r = list(ratios)
    return str(r) if len(r) <= 8 else f"[{', '.join(map(str, r[:8]))}, ... ({len(r)} layers)]"


def payload_sections(info: PayloadInfo) -> list[tuple[str, int, int]]:
    """``(name, offset, nbytes)`` of every section in file order, for inspection and fuzzing."""
    h = info.header
    out: list[tuple[str, int, int]] = []
    off = 0

    def add(name: str, n: int) -> None:
        nonlocal off
        out.append((name, off, n))
        off += n

    add("header", PAYLOAD_HEADER_BYTES)
    add("tokens", _U32 * h.tokens)
    add("logits", _F32 * h.n_vocab)
    add("n_comp", _U32 * h.n_layer)
    add("n_index_comp", _U32 * h.n_layer)
    for il, ratio in enumerate(info.ratios):
        add(f"layer{il}.raw", h.raw_rows * h.head_dim * _F32)
        if ratio == 0:
            continue
        add(f"layer{il}.comp", info.n_comp[il] * h.head_dim * _F32)
        add(f"layer{il}.attn_state_kv", attn_state_bytes(ratio, h.head_dim))
        add(f"layer{il}.attn_state_score", attn_state_bytes(ratio, h.head_dim))
        if ratio == 4:
            add(f"layer{il}.index_comp", info.n_index_comp[il] * h.indexer_head_dim * _F32)
            add(f"layer{il}.index_state_kv", index_state_bytes(ratio, h.indexer_head_dim))
            add(f"layer{il}.index_state_score", index_state_bytes(ratio, h.indexer_head_dim))
    return out


def default_prefill_cap(ctx: int) -> int:
    """Upstream's default prefill chunk for a session of ``ctx`` tokens (docs/runtime.md §5.2)."""
    return ctx if ctx <= 2048 else 2048


def check_payload_fits(header: PayloadHeader, ctx: int) -> None:
    """§6.2 step 3: a payload loads only into a session with ctx >= the writer's and T < ctx."""
    if header.ctx > ctx or header.tokens >= ctx:
        raise CacheFormatError(
            f"KV checkpoint does not fit current context: written with ctx {header.ctx} holding "
            f"{header.tokens} tokens, session ctx is {ctx}"
        )


def synthetic_payload(
    *,
    n_layer: int,
    head_dim: int,
    indexer_head_dim: int,
    n_vocab: int,
    ratios: Sequence[int],
    ctx: int,
    tokens: Sequence[int],
    n_swa: int = 128,
    seed: int = 0,
) -> bytes:
    """A structurally valid payload with deterministic pseudo-random tensor bytes.

    Row counts follow a cold prefill of ``tokens`` (``n_comp = T // ratio``; docs/runtime.md §6.1). For
    tests and benchmarks of the cache layer that must not depend on the engine.
    """
    import numpy as np

    if len(ratios) != n_layer:
        raise ValueError(f"{len(ratios)} ratios for {n_layer} layers")
    t = len(tokens)
    raw_cap = max(1, min(n_swa, ctx))
    rows = min(raw_cap, t)
    comp_cap = ctx // 4 + 2
    header = PayloadHeader(
        PAYLOAD_MAGIC, PAYLOAD_VERSION, ctx, default_prefill_cap(ctx), raw_cap, raw_cap, comp_cap,
        t, n_layer, head_dim, indexer_head_dim, n_vocab, rows,
    )
    n_comp = [t // r if r else 0 for r in ratios]
    n_index = [t // r if r == 4 else 0 for r in ratios]
    rng = np.random.default_rng(seed)

    def floats(n: int) -> bytes:
        return rng.standard_normal(n, dtype=np.float32).astype("<f4").tobytes()

    parts = [header.pack(), struct.pack(f"<{t}I", *tokens), floats(n_vocab)]
    parts.append(struct.pack(f"<{n_layer}I", *n_comp))
    parts.append(struct.pack(f"<{n_layer}I", *n_index))
    for il, ratio in enumerate(ratios):
        parts.append(floats(rows * head_dim))
        if ratio == 0:
            continue
        parts.append(floats(n_comp[il] * head_dim))
        parts.append(floats(attn_state_bytes(ratio, head_dim) // _F32))
        parts.append(floats(attn_state_bytes(ratio, head_dim) // _F32))
        if ratio == 4:
            parts.append(floats(n_index[il] * indexer_head_dim))
            parts.append(floats(index_state_bytes(ratio, indexer_head_dim) // _F32))
            parts.append(floats(index_state_bytes(ratio, indexer_head_dim) // _F32))
    return b"".join(parts)


def _layer_spans(info: PayloadInfo) -> list[tuple[int, int]]:
    """``(start, end)`` byte offsets of each layer's tensors (all of its sections, in file order)."""
    spans: list[list[int]] = [[0, 0] for _ in info.ratios]
    for name, off, n in payload_sections(info):
        if name.startswith("layer"):
            il = int(name[5:name.index(".")])
            if name.endswith(".raw"):
                spans[il][0] = off
            spans[il][1] = off + n
    return [(a, b) for a, b in spans]


def split_payload(data: bytes | memoryview, ratios: Sequence[int], ranges: Sequence[tuple[int, int]]) -> list[bytes]:
    """Cut a whole-model payload into one payload per pipeline stage.

    Stage ``k`` of layers ``ranges[k] = (l0, l1)`` gets a payload of the same format whose header
    says ``l1 - l0`` layers: the same tokens and logits, the row counts and tensors of its layers.
    :func:`merge_payloads` is the inverse (byte for byte). Validates ``data`` first
    (:class:`~ds4.errors.CacheFormatError`), so nothing is cut from a bad file.
    """
    info = read_payload_info(data, ratios, allow_empty=True)
    h = info.header
    view = memoryview(data)
    head_end = PAYLOAD_HEADER_BYTES + _U32 * h.tokens + _F32 * h.n_vocab
    tokens_logits = bytes(view[PAYLOAD_HEADER_BYTES:head_end])
    spans = _layer_spans(info)
    parts = []
    for l0, l1 in ranges:
        sub = PayloadHeader(**{**{f.name: getattr(h, f.name) for f in fields(h)}, "n_layer": l1 - l0})
        counts = struct.pack(f"<{2 * (l1 - l0)}I", *info.n_comp[l0:l1], *info.n_index_comp[l0:l1])
        parts.append(b"".join([sub.pack(), tokens_logits, counts, bytes(view[spans[l0][0]:spans[l1 - 1][1]])]))
    return parts


def merge_payloads(parts: Sequence[bytes | memoryview], ratios: Sequence[int],
                   ranges: Sequence[tuple[int, int]]) -> bytes:
    """Join the payloads of chained stages (each over its ``ranges[k]`` layers of a model with
    compress ``ratios``) into the payload one engine over all layers writes. The tokens and the
    header must agree between stages; the logits are the last stage's."""
    infos = [read_payload_info(p, ratios[l0:l1], allow_empty=True) for p, (l0, l1) in zip(parts, ranges)]
    if len(infos) != len(ranges) or not infos:
        raise CacheFormatError(f"{len(parts)} stage payloads for {len(ranges)} stages")
    first, last = infos[0].header, infos[-1].header
    head_end = PAYLOAD_HEADER_BYTES + _U32 * first.tokens
    for k, (info, p) in enumerate(zip(infos, parts)):
        h = info.header
        same = [getattr(h, f.name) == getattr(first, f.name) for f in fields(h) if f.name != "n_layer"]
        if not all(same) or bytes(memoryview(p)[PAYLOAD_HEADER_BYTES:head_end]) != bytes(memoryview(parts[0])[PAYLOAD_HEADER_BYTES:head_end]):
            raise CacheFormatError(f"stage {k} payload disagrees with stage 0 on its header or tokens: "
                                   "the stages are out of step")
    whole = PayloadHeader(**{**{f.name: getattr(last, f.name) for f in fields(last)}, "n_layer": len(ratios)})
    out = [whole.pack(), bytes(memoryview(parts[-1])[PAYLOAD_HEADER_BYTES:head_end + _F32 * last.n_vocab])]
    out += [struct.pack(f"<{len(i.n_comp)}I", *i.n_comp) for i in infos]
    out += [struct.pack(f"<{len(i.n_index_comp)}I", *i.n_index_comp) for i in infos]
    for info, p in zip(infos, parts):
        spans = _layer_spans(info)
        out.append(bytes(memoryview(p)[spans[0][0]:spans[-1][1]]))
    return b"".join(out)
