"""Memory a DS4 session needs at a given context size (docs/runtime.md §5), computed from the shape.

Per layer: the raw sliding-window KV (``min(n_swa, ctx)`` rows of head_dim float32), compressed
attention rows (``ctx/ratio + 2`` rows of head_dim), ratio-4 indexer rows (``ctx/4 + 2`` rows of
indexer_head_dim) and the compressor frontiers (kv + score, ``coff*ratio`` rows of ``coff*width``
floats each). Plus one float32 logits row and the weights.

    >>> from ds4.shape import FLASH
    >>> p = memory_plan(FLASH, 32768)
    >>> p.compressed_bytes + p.indexer_bytes          # upstream's "compressed" figure
    451077120
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .shape import ModelShape

__all__ = ["LayerMemory", "MemoryPlan", "memory_plan", "ContextEstimate", "context_estimate", "DEFAULT_CTX"]

DEFAULT_CTX = 32768
_F32 = 4
MiB = 1024 * 1024


@dataclass(frozen=True)
class LayerMemory:
    """Session buffers of one layer, in bytes."""

    layer: int
    ratio: int
    raw_bytes: int
    compressed_bytes: int
    indexer_bytes: int
    frontier_bytes: int

    @property
    def total(self) -> int:
        return self.raw_bytes + self.compressed_bytes + self.indexer_bytes + self.frontier_bytes


@dataclass(frozen=True)
class MemoryPlan:
    """Bytes of every session buffer at context ``ctx`` (CPU layout: float32 rows).

    ``compressed_bytes`` counts compressed attention rows only; upstream's estimate folds the
    indexer rows into its "compressed" figure (``compressed_bytes + indexer_bytes``) and leaves
    frontiers and logits out. ``scratch_bytes`` is upstream's CPU scratch term.
    """

    ctx: int
    raw_cap: int
    comp_cap: int
    layers: tuple[LayerMemory, ...]
    raw_bytes: int
    compressed_bytes: int
    indexer_bytes: int
    frontier_bytes: int
    logits_bytes: int
    scratch_bytes: int
    weights_bytes: int = 0
    extra: dict[str, int] = field(default_factory=dict)

    @property
    def kv_bytes(self) -> int:
        """Raw + compressed + indexer rows + frontiers: the session's KV state."""
        return self.raw_bytes + self.compressed_bytes + self.indexer_bytes + self.frontier_bytes

    @property
    def context_bytes(self) -> int:
        """Everything a session allocates (KV state, logits, scratch), weights excluded."""
        return self.kv_bytes + self.logits_bytes + self.scratch_bytes

    @property
    def upstream_estimate_bytes(self) -> int:
        """``ds4_context_memory_estimate`` for the CPU backend: raw + compressed + scratch."""
        return self.raw_bytes + self.compressed_bytes + self.indexer_bytes + self.scratch_bytes

    @property
    def total_bytes(self) -> int:
        return self.context_bytes + self.weights_bytes

    def to_dict(self) -> dict[str, object]:
        return {
            "ctx": self.ctx, "raw_cap": self.raw_cap, "comp_cap": self.comp_cap,
            "raw_bytes": self.raw_bytes, "compressed_bytes": self.compressed_bytes,
            "indexer_bytes": self.indexer_bytes, "frontier_bytes": self.frontier_bytes,
            "logits_bytes": self.logits_bytes, "scratch_bytes": self.scratch_bytes,
            "kv_bytes": self.kv_bytes, "context_bytes": self.context_bytes,
            "weights_bytes": self.weights_bytes, "total_bytes": self.total_bytes,
            "upstream_estimate_bytes": self.upstream_estimate_bytes,
            "layers": [dict(layer=l.layer, ratio=l.ratio, raw=l.raw_bytes, compressed=l.compressed_bytes,
                            indexer=l.indexer_bytes, frontier=l.frontier_bytes) for l in self.layers],
        }


def memory_plan(shape: ModelShape, ctx: int, weights_bytes: int = 0) -> MemoryPlan:
    """The memory plan of ``shape`` at ``ctx`` tokens (``ctx <= 0`` is treated as 1, as upstream)."""
    ctx = max(1, int(ctx))
    raw_cap = max(1, min(shape.n_swa, ctx))
    layers = []
    for il in range(shape.n_layer):
        r = shape.compress_ratio(il)
        raw = raw_cap * shape.head_dim * _F32
        comp = idx = front = 0
        if r:
            c = shape.coff(r)
            comp = (ctx // r + 2) * shape.head_dim * _F32
            front = 2 * (c * r) * (c * shape.head_dim) * _F32          # kv + score
        if r == 4:
            c = shape.coff(r)
            idx = (ctx // r + 2) * shape.indexer_head_dim * _F32
            front += 2 * (c * r) * (c * shape.indexer_head_dim) * _F32
        layers.append(LayerMemory(il, r, raw, comp, idx, front))
    comp_cap = ctx // 4 + 2
    scratch = (raw_cap + comp_cap) * _F32 + comp_cap * _F32 + comp_cap
    return MemoryPlan(
        ctx=ctx, raw_cap=raw_cap, comp_cap=comp_cap, layers=tuple(layers),
        raw_bytes=sum(l.raw_bytes for l in layers),
        compressed_bytes=sum(l.compressed_bytes for l in layers),
        indexer_bytes=sum(l.indexer_bytes for l in layers),
        frontier_bytes=sum(l.frontier_bytes for l in layers),
        logits_bytes=shape.n_vocab * _F32,
        scratch_bytes=scratch,
        weights_bytes=weights_bytes,
    )


@dataclass(frozen=True)
class ContextEstimate:
    """Upstream's ``ds4_context_memory_estimate(backend, ctx)`` (docs/runtime.md §5.3), for any shape.

    Frontiers and logits are not included (as upstream). ``prefill_cap`` is 0 on the CPU.
    """

    backend: str
    ctx: int
    total: int
    raw: int
    compressed: int
    scratch: int
    prefill_cap: int
    raw_cap: int
    comp_cap: int


def context_estimate(shape: ModelShape, ctx: int, backend: str = "cpu", prefill_chunk: int = 2048) -> ContextEstimate:
    """Context buffer bytes as upstream logs them, for ``backend`` "cpu" or "graph" (Metal/CUDA).

    The graph backends keep a raw ring of ``min(n_swa, ctx) + prefill_cap`` rows rounded up to 256
    (at most 8192) so a whole prefill chunk fits, plus a ``comp_cap x prefill_cap`` score scratch.
    """
    ctx = max(1, int(ctx))
    w = max(1, min(shape.n_swa, ctx))
    comp = 0
    for il in range(shape.n_layer):
        r = shape.compress_ratio(il)
        if r:
            comp += (ctx // r + 2) * shape.head_dim * _F32
        if r == 4:
            comp += (ctx // r + 2) * shape.indexer_head_dim * _F32
    comp_cap = max(2, ctx // 4 + 2)
    if backend == "cpu":
        prefill_cap, raw_cap = 0, w
        scratch = (raw_cap + comp_cap) * _F32 + comp_cap * _F32 + comp_cap
    elif backend == "graph":
        prefill_cap = ctx if ctx <= prefill_chunk else prefill_chunk
        wanted = max(1, min(w + prefill_cap, ctx))
        raw_cap = max(w, min(8192, (wanted + 255) // 256 * 256))
        scratch = 2 * comp_cap * prefill_cap * _F32
    else:
        from .errors import InvalidArgumentError
        raise InvalidArgumentError(f"unknown backend {backend!r}, expected 'cpu' or 'graph'")
    raw = shape.n_layer * raw_cap * shape.head_dim * _F32
    return ContextEstimate(backend, ctx, raw + comp + scratch, raw, comp, scratch, prefill_cap, raw_cap, comp_cap)
