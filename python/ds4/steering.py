"""Directional steering: a run-time edit of each layer's attention and/or FFN output.

A steering file is upstream's format: a flat little-endian float32 matrix ``[n_layer][n_embd]``,
one (normally unit) direction per layer, usually with a JSON sidecar of the same stem describing
how it was built (:mod:`ds4.steering_build`). With scale ``s`` at a hook point, every token's
output vector ``y`` of layer ``l`` becomes ``y - s * (d_l . y) * d_l`` before it enters the
residual streams (docs/steering.md). ``s = 1`` removes the direction exactly; negative scales
amplify it.

    >>> import numpy as np
    >>> st = Steering(np.eye(2, 4, dtype=np.float32), ffn=1.0)
    >>> st.ffn, st.attn, st.directions.shape
    (1.0, 0.0, (2, 4))
    >>> st.with_scales(attn=-2).attn
    -2.0
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ._atomic import write_atomic
from .errors import Ds4IOError, InvalidArgumentError, SteeringFileError

if TYPE_CHECKING:  # pragma: no cover
    from .shape import ModelShape

__all__ = ["Steering", "COMPONENTS", "MAX_SCALE", "FORMAT", "scales_from_flags"]

MAX_SCALE = 100.0                       # upstream accepts scales in [-100, 100]
COMPONENTS = ("attn_out", "ffn_out")    # the two hook points, upstream's --component names
FORMAT = "ds4-directional-steering-v1"  # the JSON sidecar's "format", as upstream writes it


def _check_scale(name: str, v: float) -> float:
    v = float(v)
    if not math.isfinite(v) or abs(v) > MAX_SCALE:
        raise InvalidArgumentError(f"steering {name} scale {v} is outside [-{MAX_SCALE:g}, {MAX_SCALE:g}]")
    return v


def scales_from_flags(ffn: float | None, attn: float | None) -> tuple[float, float]:
    """Upstream's defaults: FFN scale 1 when neither scale is given, otherwise 0 for the one left out."""
    if ffn is None and attn is None:
        return 1.0, 0.0
    return (0.0 if ffn is None else float(ffn)), (0.0 if attn is None else float(attn))


class Steering:
    """Per-layer directions plus the FFN-output and attention-output scales (immutable).

    ``directions`` is ``[n_layer, n_embd]`` float32 (or flat, reshaped when attached to a model:
    see :meth:`for_shape`). Attach with ``Engine(..., steering=st)``, ``engine.steering = st`` or
    ``session.steering = st``.
    """

    def __init__(self, directions: Any, ffn: float = 1.0, attn: float = 0.0,
                 source: str | os.PathLike[str] | None = None) -> None:
        d = np.array(directions, dtype=np.float32, copy=True)
        self.source = Path(source) if source is not None else None
        where = f"{self.source}: " if self.source is not None else ""
        if d.ndim not in (1, 2) or d.size == 0:
            raise SteeringFileError(f"{where}steering directions must be a non-empty [n_layer, n_embd] matrix, "
                                    f"got shape {d.shape}")
        bad = np.flatnonzero(~np.isfinite(d.reshape(-1)))
        if bad.size:
            i = int(bad[0])
            loc = f"layer {i // d.shape[1]}, index {i % d.shape[1]}" if d.ndim == 2 else f"float {i}"
            raise SteeringFileError(f"{where}steering directions hold {bad.size} non-finite value(s), first at {loc}")
        d.setflags(write=False)
        self.directions = d
        self.ffn = _check_scale("ffn", ffn)
        self.attn = _check_scale("attn", attn)
        self._native_obj = None

    # ---- files --------------------------------------------------------------------------------
    @classmethod
    def from_file(cls, path: str | os.PathLike[str], ffn: float | None = None, attn: float | None = None,
                  shape: "ModelShape | tuple[int, int] | None" = None) -> "Steering":
        """Read a ``.f32`` steering file. Scales follow upstream's flags: FFN 1 when neither is given.

        The matrix shape comes from ``shape`` (a model shape or ``(n_layer, n_embd)``), else from
        the JSON sidecar's ``"shape"`` when there is one, else it is fixed when attached to a model.
        """
        p = Path(path)
        try:
            raw = p.read_bytes()
        except OSError as e:
            raise Ds4IOError(f"{p}: cannot read steering file: {e.strerror or e}") from None
        if len(raw) == 0 or len(raw) % 4:
            raise SteeringFileError(f"{p}: steering file has {len(raw)} bytes, expected a whole number of float32 "
                                    "values (n_layer x n_embd x 4 bytes)")
        ffn_s, attn_s = scales_from_flags(ffn, attn)
        st = cls(np.frombuffer(raw, "<f4"), ffn=ffn_s, attn=attn_s, source=p)
        dims = _dims(shape) if shape is not None else _sidecar_shape(p)
        return st.for_shape(dims) if dims is not None else st

    def save(self, path: str | os.PathLike[str], metadata: dict | None = None) -> tuple[Path, Path]:
        """Write ``<stem>.f32`` and ``<stem>.json`` (both atomically); returns the two paths."""
        if self.directions.ndim != 2:
            raise InvalidArgumentError("save needs [n_layer, n_embd] directions (call for_shape first)")
        stem = Path(path)
        if stem.suffix in (".f32", ".json"):
            stem = stem.with_suffix("")
        f32, meta = stem.with_name(stem.name + ".f32"), stem.with_name(stem.name + ".json")
        info = {"format": FORMAT, "shape": list(self.directions.shape), **(metadata or {})}
        try:
            stem.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(f32, [self.directions.astype("<f4").tobytes()])
            write_atomic(meta, [(json.dumps(info, indent=2) + "\n").encode()])
        except OSError as e:
            raise Ds4IOError(f"{stem}: cannot write steering files: {e.strerror or e}") from None
        return f32, meta

    # ---- shape and scales -----------------------------------------------------------------------
    def for_shape(self, shape: "ModelShape | tuple[int, int]") -> "Steering":
        """This steering as ``[n_layer, n_embd]`` of ``shape``; SteeringFileError naming the source
        and the expected byte count when the sizes differ."""
        n_layer, n_embd = _dims(shape)
        if self.directions.shape == (n_layer, n_embd):
            return self
        if self.directions.size != n_layer * n_embd:
            src = f"{self.source}" if self.source is not None else "steering directions"
            raise SteeringFileError(
                f"{src}: {self.directions.size * 4} bytes ({self.directions.size} floats) do not fit this model: "
                f"expected {n_layer} layers x {n_embd} floats = {n_layer * n_embd * 4} bytes")
        return Steering(self.directions.reshape(n_layer, n_embd), ffn=self.ffn, attn=self.attn, source=self.source)

    def with_scales(self, ffn: float | None = None, attn: float | None = None) -> "Steering":
        """The same directions with some scales replaced."""
        return Steering(self.directions, ffn=self.ffn if ffn is None else ffn,
                        attn=self.attn if attn is None else attn, source=self.source)

    @property
    def active(self) -> bool:
        """False when both scales are 0 (the plain model runs)."""
        return self.ffn != 0.0 or self.attn != 0.0

    def _native(self, shape: "ModelShape") -> Any:
        """The compiled ``_core.Steering`` (built once; immutable, shared by sessions)."""
        st = self.for_shape(shape)
        if st is not self:
            return st._native(shape)
        if self._native_obj is None:
            from . import _core
            self._native_obj = _core.Steering(self.directions, self.attn, self.ffn)
        return self._native_obj

    def __repr__(self) -> str:
        src = f", source={str(self.source)!r}" if self.source is not None else ""
        return f"Steering(shape={self.directions.shape}, ffn={self.ffn:g}, attn={self.attn:g}{src})"


def _dims(shape: Any) -> tuple[int, int]:
    if hasattr(shape, "n_layer"):
        return int(shape.n_layer), int(shape.n_embd)
    n_layer, n_embd = shape
    return int(n_layer), int(n_embd)


def _sidecar_shape(f32: Path) -> tuple[int, int] | None:
    """``"shape"`` from the JSON next to a .f32 file, if it exists and says one."""
    meta = f32.with_suffix(".json")
    try:
        info = json.loads(meta.read_text(encoding="utf-8"))
        n_layer, n_embd = info["shape"]
        return int(n_layer), int(n_embd)
    except (OSError, ValueError, KeyError, TypeError):
        return None


# ---- command-line flags (generate, chat, serve) -------------------------------------------------

def add_arguments(parser: Any) -> None:
    """Upstream's steering flags: ``--dir-steering-file``, ``--dir-steering-ffn`` (default 1 when a
    file is given and no scale is set), ``--dir-steering-attn`` (default 0); scales in [-100, 100]."""
    from .commands._argtypes import bounded_float

    g = parser.add_argument_group("directional steering (docs/steering.md)")
    g.add_argument("--dir-steering-file", default=None, metavar="FILE",
                   help="per-layer float32 directions [n_layer][n_embd] (e.g. from `ds4 steering build`)")
    scale = lambda flag: bounded_float(flag, -MAX_SCALE, MAX_SCALE)  # noqa: E731
    g.add_argument("--dir-steering-ffn", type=scale("--dir-steering-ffn"), default=None, metavar="F",
                   help="after each FFN output: y -= F*d*dot(d,y) (default with a file: 1)")
    g.add_argument("--dir-steering-attn", type=scale("--dir-steering-attn"), default=None, metavar="F",
                   help="after each attention output (default 0)")


def from_args(args: Any) -> Steering | None:
    """The :class:`Steering` the flags of :func:`add_arguments` ask for, or None."""
    path = getattr(args, "dir_steering_file", None)
    ffn, attn = getattr(args, "dir_steering_ffn", None), getattr(args, "dir_steering_attn", None)
    if path is None:
        if ffn or attn:
            raise InvalidArgumentError("directional steering needs --dir-steering-file")
        return None
    if getattr(args, "kv_cache_dir", None):
        # Cache files hold KV states without a record of the steering that produced them, so a
        # later run could restore a steered state as if it were the plain model's.
        raise InvalidArgumentError("--dir-steering-file cannot be combined with --kv-cache-dir: the disk "
                                   "cache does not record steering")
    return Steering.from_file(path, ffn=ffn, attn=attn)
