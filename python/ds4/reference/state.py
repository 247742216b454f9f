"""Per-session state of the reference model, laid out like the engine's and the DSV4 payload's.

For every layer (docs/model.md §3.0, docs/runtime.md §5.1):

* ``raw``: the sliding window, ``raw_cap = min(n_swa, ctx)`` rows, oldest first; once full a push
  drops the oldest row. Rows are stored F16-rounded.
* ratio != 0: ``comp`` rows (append-only, capacity ``ctx//ratio + 2``, F16-rounded) and the
  attention compressor frontier ``attn`` (kv 0 / score NEG, ``coff·ratio`` rows × ``coff·head_dim``).
* ratio == 4: the indexer rows ``index_comp`` and the indexer frontier ``index``.

:meth:`ReferenceState.payload_arrays` yields every array in DSV4 payload order (docs/runtime.md §6.1)
and :meth:`ReferenceState.to_payload` serialises them, so a saved engine session can be compared
with the reference byte for byte.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

import numpy as np

from ..errors import ContextOverflowError
from ..shape import ModelShape
from .numerics import NEG, f16_round

__all__ = [
    "PAYLOAD_MAGIC",
    "PAYLOAD_VERSION",
    "CompressorState",
    "LayerState",
    "ReferenceState",
    "default_prefill_cap",
]

PAYLOAD_MAGIC = 0x34565344  # "DSV4"
PAYLOAD_VERSION = 1


def default_prefill_cap(ctx: int) -> int:
    """Header field 3 as upstream writes it: ``min(ctx, 2048)`` (docs/runtime.md §6.1)."""
    return ctx if ctx <= 2048 else 2048


@dataclass
class CompressorState:
    """One compressor frontier: ``coff·ratio`` window slots of ``coff·head_dim`` kv and score."""

    ratio: int
    head_dim: int
    kv: np.ndarray = field(init=False)
    score: np.ndarray = field(init=False)

    def __post_init__(self) -> None:
        coff = ModelShape.coff(self.ratio)
        self.kv = np.zeros((coff * self.ratio, coff * self.head_dim), np.float32)
        self.score = np.full((coff * self.ratio, coff * self.head_dim), NEG, np.float32)

    @property
    def width(self) -> int:
        return self.kv.shape[1]

    def reset_rows(self, start: int, end: int) -> None:
        self.kv[start:end] = 0.0
        self.score[start:end] = NEG

    def finish_prefill(self, n_tokens: int) -> None:
        """Reset the slots the next window has not written yet (docs/runtime.md §5.1).

        Numerically a no-op (those slots are written before they are pooled); it makes the
        frontier equal to the engine's after a prefill so saved states compare byte for byte.
        """
        rem = n_tokens % self.ratio
        if self.ratio == 4:
            self.reset_rows(self.ratio + rem, 2 * self.ratio)
        else:
            self.reset_rows(rem, self.ratio)

    def copy(self) -> "CompressorState":
        c = CompressorState(self.ratio, self.head_dim)
        c.kv[...] = self.kv
        c.score[...] = self.score
        return c


@dataclass
class LayerState:
    """Cache of one layer."""

    il: int
    ratio: int
    head_dim: int
    indexer_head_dim: int
    raw_cap: int
    comp_cap: int
    raw: np.ndarray = field(init=False)          # float32[raw_cap, head_dim], rows [0, n_raw) live
    n_raw: int = 0
    comp: np.ndarray = field(init=False)         # float32[comp_cap, head_dim], rows [0, n_comp)
    n_comp: int = 0
    index_comp: np.ndarray = field(init=False)   # float32[comp_cap, indexer_head_dim] (ratio 4)
    n_index_comp: int = 0
    attn: CompressorState | None = None
    index: CompressorState | None = None

    def __post_init__(self) -> None:
        self.raw = np.zeros((self.raw_cap, self.head_dim), np.float32)
        cap = self.comp_cap if self.ratio else 0
        self.comp = np.zeros((cap, self.head_dim), np.float32)
        icap = self.comp_cap if self.ratio == 4 else 0
        self.index_comp = np.zeros((icap, self.indexer_head_dim), np.float32)
        if self.ratio:
            self.attn = CompressorState(self.ratio, self.head_dim)
        if self.ratio == 4:
            self.index = CompressorState(self.ratio, self.indexer_head_dim)

    # ---- pushes (each stores the F16 round trip, docs/model.md §4.4) ----
    def push_raw(self, row: np.ndarray) -> None:
        if self.n_raw == self.raw_cap:
            self.raw[:-1] = self.raw[1:]
            self.n_raw -= 1
        self.raw[self.n_raw] = f16_round(row)
        self.n_raw += 1

    def push_comp(self, row: np.ndarray) -> None:
        if self.n_comp >= self.comp.shape[0]:
            raise ContextOverflowError(
                f"layer {self.il}: compressed KV capacity {self.comp.shape[0]} rows exceeded")
        self.comp[self.n_comp] = f16_round(row)
        self.n_comp += 1

    def push_index(self, row: np.ndarray) -> None:
        if self.n_index_comp >= self.index_comp.shape[0]:
            raise ContextOverflowError(
                f"layer {self.il}: indexer capacity {self.index_comp.shape[0]} rows exceeded")
        self.index_comp[self.n_index_comp] = f16_round(row)
        self.n_index_comp += 1

    # ---- views of the live rows ----
    @property
    def raw_rows(self) -> np.ndarray:
        return self.raw[:self.n_raw]

    @property
    def comp_rows(self) -> np.ndarray:
        return self.comp[:self.n_comp]

    @property
    def index_rows(self) -> np.ndarray:
        return self.index_comp[:self.n_index_comp]

    def payload_arrays(self) -> list[tuple[str, np.ndarray]]:
        """This layer's arrays in payload order (docs/runtime.md §6.1 step 5)."""
        p = f"layer{self.il}"  # section names as ds4.payload.payload_sections gives them
        out = [(f"{p}.raw", self.raw_rows)]
        if self.ratio:
            out += [(f"{p}.comp", self.comp_rows), (f"{p}.attn_state_kv", self.attn.kv),
                    (f"{p}.attn_state_score", self.attn.score)]
        if self.ratio == 4:
            out += [(f"{p}.index_comp", self.index_rows), (f"{p}.index_state_kv", self.index.kv),
                    (f"{p}.index_state_score", self.index.score)]
        return out


@dataclass
class ReferenceState:
    """Session state: per-layer caches, the token checkpoint, the position and the last logits."""

    shape: ModelShape
    ctx: int
    layers: list[LayerState] = field(init=False)
    tokens: list[int] = field(default_factory=list)
    logits: np.ndarray | None = None
    # Final HC streams of the last processed token (the MTP block's input); not in the payload.
    hidden: np.ndarray | None = None
    # MTP draft layer cache (ratio 0), created on first use; never part of the payload.
    mtp: LayerState | None = None

    def __post_init__(self) -> None:
        if self.ctx <= 0:
            raise ContextOverflowError(f"context size must be positive, got {self.ctx}")
        s = self.shape
        self.layers = [
            LayerState(il, s.compress_ratio(il), s.head_dim, s.indexer_head_dim, self.raw_cap,
                       self.ctx // s.compress_ratio(il) + 2 if s.compress_ratio(il) else 0)
            for il in range(s.n_layer)
        ]

    @property
    def pos(self) -> int:
        """Position of the next token (= number of tokens processed)."""
        return len(self.tokens)

    @property
    def raw_cap(self) -> int:
        return max(1, min(self.shape.n_swa, self.ctx))

    @property
    def comp_cap(self) -> int:
        """Header field 6: the ratio-4 layer capacity ``ctx//4 + 2``."""
        return self.ctx // 4 + 2

    def finish_prefill(self) -> None:
        """Apply the after-prefill frontier reset of every compressor (docs/runtime.md §5.1)."""
        for ls in self.layers:
            if ls.attn is not None:
                ls.attn.finish_prefill(self.pos)
            if ls.index is not None:
                ls.index.finish_prefill(self.pos)

    def payload_arrays(self) -> list[tuple[str, np.ndarray]]:
        """Every body array in payload order: tokens, logits, n_comp, n_index_comp, then layers."""
        s = self.shape
        logits = self.logits if self.logits is not None else np.zeros(s.n_vocab, np.float32)
        out: list[tuple[str, np.ndarray]] = [
            ("tokens", np.asarray(self.tokens, dtype=np.uint32)),
            ("logits", np.asarray(logits, dtype=np.float32)),
            ("n_comp", np.array([ls.n_comp for ls in self.layers], dtype=np.uint32)),
            ("n_index_comp", np.array([ls.n_index_comp for ls in self.layers], dtype=np.uint32)),
        ]
        for ls in self.layers:
            out += ls.payload_arrays()
        return out

    to_payload_arrays = payload_arrays  # the name the C++ comparison tests use

    def payload_header(self, prefill_cap: int | None = None) -> tuple[int, ...]:
        """The 13 u32 header fields (docs/runtime.md §6.1)."""
        s = self.shape
        cap = default_prefill_cap(self.ctx) if prefill_cap is None else prefill_cap
        live = min(self.raw_cap, self.pos)
        return (PAYLOAD_MAGIC, PAYLOAD_VERSION, self.ctx, cap, self.raw_cap, self.raw_cap,
                self.comp_cap, self.pos, s.n_layer, s.head_dim, s.indexer_head_dim, s.n_vocab, live)

    def to_payload(self, prefill_cap: int | None = None) -> bytes:
        """Serialise as a DSV4 session payload (little-endian u32 header + float32 / u32 arrays)."""
        parts = [struct.pack("<13I", *self.payload_header(prefill_cap))]
        for _, arr in self.payload_arrays():
            dt = np.dtype("<u4") if arr.dtype == np.uint32 else np.dtype("<f4")
            parts.append(np.ascontiguousarray(arr, dtype=dt).tobytes())
        return b"".join(parts)

    def copy(self) -> "ReferenceState":
        """A deep copy (snapshots in tests)."""
        import copy as _copy
        return _copy.deepcopy(self)
