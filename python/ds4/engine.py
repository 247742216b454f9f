"""``ds4.Engine``: a DeepSeek V4 GGUF model loaded on a compute backend (the CPU by default).

The file is validated by :func:`ds4.inspect` (header only), then memory-mapped read-only by the
C++ core: weights are used in place, never copied. An engine is immutable and can serve several
:class:`~ds4.session.Session` timelines::

    >>> import ds4, ds4.testing
    >>> eng = ds4.Engine(ds4.testing.default_model_path(), threads=1)
    >>> s = eng.session(ctx=256)
    >>> s.sync([1, 2, 3])
    >>> s.logits.shape == (eng.shape.n_vocab,)
    True
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

from ._args import MAX_CTX, MAX_THREADS, check_int
from .errors import InvalidArgumentError, ModelFormatError
from .shape import ModelShape

if TYPE_CHECKING:  # pragma: no cover
    from .inspection import ModelInfo
    from .payload import PayloadInfo
    from .session import Session
    from .steering import Steering
    from .tokenizer import Tokenizer

__all__ = ["Engine"]

_MTP_PREFIX = "mtp.0."
# The sampler splits a whole-vocabulary pass over threads only from 2^15 logits on (docs/sampling.md).
SAMPLER_POOL_MIN_VOCAB = 1 << 15
# Whether Engine(sampler_threads=None) lends the engine's workers to the sampler (for vocabularies
# of SAMPLER_POOL_MIN_VOCAB and more). Off until a quiet machine shows two threads faster in wall
# time (`bench/sampling.py --thread-ab`): on the loaded development machine they were slower
# (docs/sampling.md, "Seventh round").
SAMPLER_POOL_BY_DEFAULT = False


def _tensor_table(info: "ModelInfo", prefix: str | None = None,
                  stage: tuple[int, int, int] | None = None) -> list[tuple[str, int, list[int], int, int]]:
    """The tensors to hand the core: those under ``prefix``, or those a stage ``(l0, l1, n_layer)``
    may bind (its layers; the embedding, needed by the first stage and the MTP block; the output
    head and MTP block on the last), so a stage cannot touch another stage's weights."""
    def wanted(name: str) -> bool:
        if prefix is not None:
            return name.startswith(prefix)
        if stage is None:
            return True
        l0, l1, n_layer = stage
        if name.startswith("blk."):
            il = int(name.split(".", 2)[1])
            return l0 <= il < l1
        if name.startswith("token_embd."):
            return l0 == 0 or l1 == n_layer
        return l1 == n_layer   # output*, mtp.*
    return [(t.name, int(t.type), [int(d) for d in t.dims], int(t.offset), int(t.nbytes))
            for t in info.tensors.values() if wanted(t.name)]


def _shape_dict(shape: ModelShape) -> dict[str, Any]:
    d = asdict(shape)
    d["compress_ratios"] = list(shape.compress_ratios)
    return d


class Engine:
    """A loaded model on ``backend``: a name of :func:`ds4.available_backends` or ``"auto"`` (the first
    available one); an unavailable name raises UnsupportedModelError listing the available ones.
    ``threads`` None means physical cores (the CPU backend's worker pool).

    ``mtp_path`` names a separate GGUF with the ``mtp.0.*`` block (MTP tensors inside the main file
    are used automatically). ``prefill_chunk`` caps tokens per prefill chunk (default: 4096 when a
    prompt is longer than that); chunking never changes results. ``steering`` (a
    :class:`ds4.steering.Steering`) is the directional steering of the sessions this engine creates.

    ``layers=(l0, l1)`` opens one pipeline stage: only the tensors of layers ``l0 <= il < l1`` are
    bound (plus the embedding on the first stage, the output head and MTP block on the last), so
    only their pages of the file are ever read. A stage has no :meth:`session`; chain stages with
    :class:`ds4.stages.Pipeline` (or across machines, :class:`ds4.distributed.PipelineEngine`).

    ``sampler_threads``: whether sampling from this engine's logits (``Session.sample``, the
    generation loop, the server) may split its whole-vocabulary passes over the engine's worker
    threads, which idle while the host samples: 1 keeps it on the calling thread, more lets the
    engine's pool (all ``threads`` of it) split it. None (default): 1, or with
    ``SAMPLER_POOL_BY_DEFAULT`` the pool when the vocabulary has at least 32,768 entries (smaller
    ones are never split). Picks and probabilities never depend on it (docs/sampling.md, "Seventh
    round").
    """

    def __init__(self, path: str | os.PathLike[str], backend: str = "auto", threads: int | None = None,
                 mtp_path: str | os.PathLike[str] | None = None, prefill_chunk: int | None = None,
                 layers: tuple[int, int] | None = None, steering: "Steering | None" = None,
                 sampler_threads: int | None = None) -> None:
        from . import _core
        from .backends import resolve_backend
        from .inspection import inspect

        backend = resolve_backend(str(backend))
        if threads is not None:
            threads = check_int(threads, "threads", 1, MAX_THREADS)
        if prefill_chunk is not None:
            prefill_chunk = check_int(prefill_chunk, "prefill_chunk", 1, MAX_CTX)
        if sampler_threads is not None:
            sampler_threads = check_int(sampler_threads, "sampler_threads", 1, MAX_THREADS)
        self.path = Path(path)
        self.info: ModelInfo = inspect(self.path)
        self.info.check_supported()
        assert self.info.shape is not None
        self.shape: ModelShape = self.info.shape
        n_layer = self.shape.n_layer
        l0, l1 = (0, n_layer) if layers is None else (check_int(layers[0], "layers[0]"), check_int(layers[1], "layers[1]"))
        if not 0 <= l0 < l1 <= n_layer:
            raise InvalidArgumentError(f"layers=({l0}, {l1}) is not a non-empty range of the model's {n_layer} layers")
        self.layers: tuple[int, int] = (l0, l1)
        last = l1 == n_layer
        with _naming(self.path):
            self._model = _core.Model(str(self.path), _shape_dict(self.shape),
                                      _tensor_table(self.info, stage=(l0, l1, n_layer)),
                                      int(threads or 0), int(prefill_chunk or 0), l0, l1, backend)
        self.mtp_path: Path | None = None
        if not last:
            pass  # the MTP block runs after the output head, on the last stage
        elif mtp_path is not None:
            # Only the mtp.0.* tensors are used; the C++ binder checks their types, dims and bounds.
            tensors = [t for t in _raw_tensor_table(Path(mtp_path)) if t[0].startswith(_MTP_PREFIX)]
            if not tensors:
                raise ModelFormatError(f"{mtp_path}: no {_MTP_PREFIX}* tensors found")
            with _naming(Path(mtp_path)):
                self._model.load_mtp(str(mtp_path), tensors)
            self.mtp_path = Path(mtp_path)
        elif self.info.has_mtp:
            with _naming(self.path):
                self._model.load_mtp("", _tensor_table(self.info, _MTP_PREFIX))
        self._tokenizer: Tokenizer | None = None
        self._steering: Steering | None = None
        self.steering = steering
        if sampler_threads is None:
            big = self.shape.n_vocab >= SAMPLER_POOL_MIN_VOCAB
            sampler_threads = self.threads if SAMPLER_POOL_BY_DEFAULT and big else 1
        self.sampler_threads: int = sampler_threads

    @property
    def _sampler_pool_of(self):
        """ds4.sampling's ``pool_of`` for this engine's logits: its core model (the worker pool) or
        False (the calling thread)."""
        return self._model if self.sampler_threads > 1 and self.threads > 1 else False

    # ---- properties -------------------------------------------------------------------------
    @property
    def routed_bits(self) -> int:
        """4 when the routed experts are Q4_K, else 2 (IQ2_XXS + Q2_K)."""
        return int(self._model.routed_bits)

    @property
    def has_mtp(self) -> bool:
        return bool(self._model.has_mtp)

    @property
    def backend(self) -> str:
        """Name of the backend this engine runs on."""
        return str(self._model.backend)

    @property
    def is_stage(self) -> bool:
        """True when this engine runs only part of the layers (a pipeline stage)."""
        return self.layers != (0, self.shape.n_layer)

    @property
    def threads(self) -> int:
        return int(self._model.threads)

    @property
    def prefill_chunk(self) -> int:
        """Configured chunk cap (0: the default rule)."""
        return int(self._model.prefill_chunk)

    @property
    def tokenizer(self) -> "Tokenizer":
        """The model's tokenizer, built from the GGUF on first use."""
        if self._tokenizer is None:
            from .tokenizer import Tokenizer
            self._tokenizer = Tokenizer.from_gguf(self.path)
        return self._tokenizer

    @property
    def steering(self) -> "Steering | None":
        """Directional steering given to sessions created from now on (None: off).

        Setting it checks the directions against the model (SteeringFileError naming the file
        and the expected size); sessions that already exist keep their own setting.
        """
        return self._steering

    @steering.setter
    def steering(self, value: "Steering | None") -> None:
        if value is not None:
            value = value.for_shape(self.shape)
            value._native(self.shape)  # build (and validate) the shared native copy once
        self._steering = value

    # ---- sessions ---------------------------------------------------------------------------
    def session(self, ctx: int = 32768) -> "Session":
        """A new, empty inference timeline with room for ``ctx`` tokens (with the engine's steering)."""
        from .session import Session
        if self.is_stage:
            raise InvalidArgumentError(f"this engine runs only layers {self.layers} of {self.shape.n_layer}: "
                                       "chain it with the other stages (ds4.stages.Pipeline)")
        s = Session(self, ctx)
        if self._steering is not None:
            s.steering = self._steering
        return s

    def _core_session(self, ctx: int) -> Any:
        """The compiled timeline behind a :class:`~ds4.session.Session` (a pipeline supplies its own)."""
        from . import _core
        return _core.Session(self._model, int(ctx))

    def load_session(self, path: str | os.PathLike[str], ctx: int | None = None) -> "Session":
        """A session restored from a payload file written by :meth:`Session.save`.

        ``ctx`` defaults to the context stored in the payload header. The payload is validated
        against this model (layout, sizes, row counts) before any session memory is allocated;
        every error names the file.
        """
        from .errors import CacheFormatError, Ds4Error, Ds4IOError
        from .payload import default_prefill_cap
        from .session import Session
        p = Path(path)
        try:
            data = p.read_bytes()
        except OSError as e:
            raise Ds4IOError(f"{p}: cannot read session file: {e.strerror or e}") from e
        try:
            info = self.check_payload(data)
        except CacheFormatError as e:
            raise CacheFormatError(f"{p}: {e}") from None
        h = info.header
        # The header's ctx sizes the session allocated below: it must agree with the fields the
        # writer derived from it (an edited ctx alone once allocated a 2**31-token session).
        derived = {"prefill chunk tag": (h.prefill_cap, default_prefill_cap(h.ctx)),
                   "compressed row cap": (h.comp_cap, h.ctx // 4 + 2),
                   "raw ring cap": (h.raw_cap, max(1, min(self.shape.n_swa, h.ctx)))}
        for name, (found, want) in derived.items():
            if found != want:
                raise CacheFormatError(f"{p}: session payload header is inconsistent: ctx {h.ctx} implies "
                                       f"{name} {want}, the header has {found}")
        ctx = h.ctx if ctx is None else check_int(ctx, "ctx", 2, MAX_CTX)
        if not 2 <= ctx <= MAX_CTX:
            raise CacheFormatError(f"{p}: session payload header has ctx {ctx}, outside 2..{MAX_CTX}")
        try:
            s = Session(self, ctx)
            steering = getattr(self, "_steering", None)   # pipelines borrow this method and have none
            if steering is not None:
                s.steering = steering
            s.load_payload(data)
        except Ds4Error as e:
            raise type(e)(f"{p}: {e}") from None
        return s

    def check_payload(self, data: bytes | bytearray | memoryview) -> "PayloadInfo":
        """Validate a DSV4 session payload against this model without touching any session:
        header, layout (layers, dims, vocab), raw-ring and row-count invariants, exact size.
        Raises :class:`~ds4.errors.CacheFormatError` saying which field is wrong."""
        from .payload import read_payload_info
        s = self.shape
        # an empty session's payload (no tokens) is valid here: the core restores it as empty
        return read_payload_info(data, s.compress_ratios, head_dim=s.head_dim,
                                 indexer_head_dim=s.indexer_head_dim, n_vocab=s.n_vocab, allow_empty=True)

    def generate(self, *args: Any, **kwargs: Any) -> Any:
        """Text generation; see :func:`ds4.generation.generate` (``kv_cache=`` a
        :class:`ds4.kvcache.KVCache` restores cached prompt prefixes and stores checkpoints)."""
        from .generation import generate
        return generate(self, *args, **kwargs)

    def __repr__(self) -> str:
        stage = f", layers={self.layers}" if self.is_stage else ""
        return f"Engine({str(self.path)!r}, variant={self.info.variant!r}, threads={self.threads}{stage})"


@contextmanager
def _naming(path: Path) -> Iterator[None]:
    """Core errors about a file name it: the same ds4 error class, prefixed with the path."""
    from .errors import Ds4Error
    try:
        yield
    except Ds4Error as e:
        if str(path) in str(e):
            raise
        raise type(e)(f"{path}: {e}") from None


def _raw_tensor_table(path: Path) -> list[tuple[str, int, list[int], int, int]]:
    """Tensor table of an MTP-only GGUF (no model metadata to validate against)."""
    from .gguf_header import read_header
    h = read_header(path)
    out = []
    for name in h.tensor_order:
        t = h.tensors[name]
        out.append((t.name, int(t.type), [int(d) for d in t.dims], int(t.offset), int(t.nbytes)))
    return out
