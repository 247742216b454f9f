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
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .errors import InvalidArgumentError, ModelFormatError
from .shape import ModelShape

if TYPE_CHECKING:  # pragma: no cover
    from .inspection import ModelInfo
    from .session import Session
    from .tokenizer import Tokenizer

__all__ = ["Engine"]

_MTP_PREFIX = "mtp.0."


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
    prompt is longer than that); chunking never changes results.

    ``layers=(l0, l1)`` opens one pipeline stage: only the tensors of layers ``l0 <= il < l1`` are
    bound (plus the embedding on the first stage, the output head and MTP block on the last), so
    only their pages of the file are ever read. A stage has no :meth:`session`; chain stages with
    :class:`ds4.stages.Pipeline` (or across machines, :class:`ds4.distributed.PipelineEngine`).
    """

    def __init__(self, path: str | os.PathLike[str], backend: str = "auto", threads: int | None = None,
                 mtp_path: str | os.PathLike[str] | None = None, prefill_chunk: int | None = None,
                 layers: tuple[int, int] | None = None) -> None:
        from . import _core
        from .backends import resolve_backend
        from .inspection import inspect

        backend = resolve_backend(str(backend))
        if threads is not None and int(threads) < 1:
            raise InvalidArgumentError(f"threads must be at least 1, got {threads}")
        if prefill_chunk is not None and int(prefill_chunk) < 1:
            raise InvalidArgumentError(f"prefill_chunk must be at least 1, got {prefill_chunk}")
        self.path = Path(path)
        self.info: ModelInfo = inspect(self.path)
        self.info.check_supported()
        assert self.info.shape is not None
        self.shape: ModelShape = self.info.shape
        n_layer = self.shape.n_layer
        l0, l1 = (0, n_layer) if layers is None else (int(layers[0]), int(layers[1]))
        if not 0 <= l0 < l1 <= n_layer:
            raise InvalidArgumentError(f"layers=({l0}, {l1}) is not a non-empty range of the model's {n_layer} layers")
        self.layers: tuple[int, int] = (l0, l1)
        last = l1 == n_layer
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
            self._model.load_mtp(str(mtp_path), tensors)
            self.mtp_path = Path(mtp_path)
        elif self.info.has_mtp:
            self._model.load_mtp("", _tensor_table(self.info, _MTP_PREFIX))
        self._tokenizer: Tokenizer | None = None

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

    # ---- sessions ---------------------------------------------------------------------------
    def session(self, ctx: int = 32768) -> "Session":
        """A new, empty inference timeline with room for ``ctx`` tokens."""
        from .session import Session
        if self.is_stage:
            raise InvalidArgumentError(f"this engine runs only layers {self.layers} of {self.shape.n_layer}: "
                                       "chain it with the other stages (ds4.stages.Pipeline)")
        return Session(self, ctx)

    def _core_session(self, ctx: int) -> Any:
        """The compiled timeline behind a :class:`~ds4.session.Session` (a pipeline supplies its own)."""
        from . import _core
        return _core.Session(self._model, int(ctx))

    def load_session(self, path: str | os.PathLike[str], ctx: int | None = None) -> "Session":
        """A session restored from a payload file written by :meth:`Session.save`.

        ``ctx`` defaults to the context stored in the payload header.
        """
        from .session import Session
        data = Path(path).read_bytes()
        if ctx is None:
            if len(data) < 12:
                from .errors import CacheFormatError
                raise CacheFormatError(f"{path}: truncated session payload")
            ctx = int.from_bytes(data[8:12], "little")
        s = Session(self, int(ctx))
        s.load_payload(data)
        return s

    def generate(self, *args: Any, **kwargs: Any) -> Any:
        """Text generation; see :func:`ds4.generation.generate` (``kv_cache=`` a
        :class:`ds4.kvcache.KVCache` restores cached prompt prefixes and stores checkpoints)."""
        from .generation import generate
        return generate(self, *args, **kwargs)

    def __repr__(self) -> str:
        stage = f", layers={self.layers}" if self.is_stage else ""
        return f"Engine({str(self.path)!r}, variant={self.info.variant!r}, threads={self.threads}{stage})"


def _raw_tensor_table(path: Path) -> list[tuple[str, int, list[int], int, int]]:
    """Tensor table of an MTP-only GGUF (no model metadata to validate against)."""
    from .gguf_header import read_header
    h = read_header(path)
    out = []
    for name in h.tensor_order:
        t = h.tensors[name]
        out.append((t.name, int(t.type), [int(d) for d in t.dims], int(t.offset), int(t.nbytes)))
    return out
