"""A strict, header-only GGUF v2/v3 reader.

It parses the magic, version, counts, metadata key/value pairs (with their GGUF types), tensor
infos and the alignment, and computes every tensor's absolute data offset. It never reads tensor
data and never allocates from a count it has not first bounded by the file size, so a corrupt or
hostile header costs at most a few reads before a :class:`~ds4.errors.ModelFormatError` that names
the file, the section and what was wrong.

    >>> from ds4.gguf_header import read_header       # doctest: +SKIP
    >>> h = read_header("model.gguf"); h.tensors["output.weight"].dims   # doctest: +SKIP
    (4096, 129280)
"""

from __future__ import annotations

import enum
import math
import mmap
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from .errors import ModelFormatError

__all__ = [
    "GGMLType",
    "GGUFValueType",
    "TYPE_TRAITS",
    "TypeTraits",
    "KV",
    "TensorHeader",
    "GGUFHeader",
    "read_header",
    "tensor_nbytes",
    "GGUF_MAGIC",
]

GGUF_MAGIC = b"GGUF"
_MAX_DIMS = 4
_MAX_STRING = 1 << 30        # no key, name or string value of a sane file comes close
_DEFAULT_ALIGNMENT = 32


class GGMLType(enum.IntEnum):
    """ggml tensor type ids (the ones a GGUF file can name; ds4 binds only a few)."""

    F32 = 0
    F16 = 1
    Q4_0 = 2
    Q4_1 = 3
    Q5_0 = 6
    Q5_1 = 7
    Q8_0 = 8
    Q8_1 = 9
    Q2_K = 10
    Q3_K = 11
    Q4_K = 12
    Q5_K = 13
    Q6_K = 14
    Q8_K = 15
    IQ2_XXS = 16
    IQ2_XS = 17
    IQ3_XXS = 18
    IQ1_S = 19
    IQ4_NL = 20
    IQ3_S = 21
    IQ2_S = 22
    IQ4_XS = 23
    I8 = 24
    I16 = 25
    I32 = 26
    I64 = 27
    F64 = 28
    IQ1_M = 29
    BF16 = 30
    TQ1_0 = 34
    TQ2_0 = 35
    MXFP4 = 39


@dataclass(frozen=True)
class TypeTraits:
    """Elements per block and bytes per block of a ggml type."""

    block: int
    size: int


TYPE_TRAITS: dict[int, TypeTraits] = {
    GGMLType.F32: TypeTraits(1, 4),
    GGMLType.F16: TypeTraits(1, 2),
    GGMLType.Q4_0: TypeTraits(32, 18),
    GGMLType.Q4_1: TypeTraits(32, 20),
    GGMLType.Q5_0: TypeTraits(32, 22),
    GGMLType.Q5_1: TypeTraits(32, 24),
    GGMLType.Q8_0: TypeTraits(32, 34),
    GGMLType.Q8_1: TypeTraits(32, 36),
    GGMLType.Q2_K: TypeTraits(256, 84),
    GGMLType.Q3_K: TypeTraits(256, 110),
    GGMLType.Q4_K: TypeTraits(256, 144),
    GGMLType.Q5_K: TypeTraits(256, 176),
    GGMLType.Q6_K: TypeTraits(256, 210),
    GGMLType.Q8_K: TypeTraits(256, 292),
    GGMLType.IQ2_XXS: TypeTraits(256, 66),
    GGMLType.IQ2_XS: TypeTraits(256, 74),
    GGMLType.IQ3_XXS: TypeTraits(256, 98),
    GGMLType.IQ1_S: TypeTraits(256, 50),
    GGMLType.IQ4_NL: TypeTraits(32, 18),
    GGMLType.IQ3_S: TypeTraits(256, 110),
    GGMLType.IQ2_S: TypeTraits(256, 82),
    GGMLType.IQ4_XS: TypeTraits(256, 136),
    GGMLType.I8: TypeTraits(1, 1),
    GGMLType.I16: TypeTraits(1, 2),
    GGMLType.I32: TypeTraits(1, 4),
    GGMLType.I64: TypeTraits(1, 8),
    GGMLType.F64: TypeTraits(1, 8),
    GGMLType.IQ1_M: TypeTraits(256, 56),
    GGMLType.BF16: TypeTraits(1, 2),
    GGMLType.TQ1_0: TypeTraits(256, 54),
    GGMLType.TQ2_0: TypeTraits(256, 66),
    GGMLType.MXFP4: TypeTraits(32, 17),
}


def type_name(type_id: int) -> str:
    try:
        return GGMLType(type_id).name
    except ValueError:
        return f"type#{type_id}"


class GGUFValueType(enum.IntEnum):
    """GGUF metadata value type ids."""

    UINT8 = 0
    INT8 = 1
    UINT16 = 2
    INT16 = 3
    UINT32 = 4
    INT32 = 5
    FLOAT32 = 6
    BOOL = 7
    STRING = 8
    ARRAY = 9
    UINT64 = 10
    INT64 = 11
    FLOAT64 = 12


# struct format of each fixed-size scalar value type
_SCALAR_FMT: dict[int, str] = {
    GGUFValueType.UINT8: "<B",
    GGUFValueType.INT8: "<b",
    GGUFValueType.UINT16: "<H",
    GGUFValueType.INT16: "<h",
    GGUFValueType.UINT32: "<I",
    GGUFValueType.INT32: "<i",
    GGUFValueType.FLOAT32: "<f",
    GGUFValueType.BOOL: "<B",
    GGUFValueType.UINT64: "<Q",
    GGUFValueType.INT64: "<q",
    GGUFValueType.FLOAT64: "<d",
}


@dataclass(frozen=True)
class KV:
    """One metadata value: its GGUF type, the element type for arrays, and the decoded value."""

    type: GGUFValueType
    value: Any
    subtype: GGUFValueType | None = None

    @property
    def is_array(self) -> bool:
        return self.type == GGUFValueType.ARRAY


@dataclass(frozen=True)
class TensorHeader:
    """A tensor info record, with the absolute file offset of its data."""

    name: str
    dims: tuple[int, ...]          # ggml order (ne0 first)
    type: int
    rel_offset: int                # as stored: relative to the data section
    offset: int                    # absolute byte offset in the file
    nbytes: int

    @property
    def n_elements(self) -> int:
        return math.prod(self.dims)

    @property
    def type_name(self) -> str:
        return type_name(self.type)


@dataclass
class GGUFHeader:
    """Everything before the tensor data of a GGUF file."""

    path: Path
    version: int
    file_size: int
    metadata: dict[str, KV]
    tensors: dict[str, TensorHeader]
    alignment: int
    data_offset: int               # absolute start of the tensor-data section
    tensor_order: list[str] = field(default_factory=list)

    def value(self, key: str, default: Any = None) -> Any:
        kv = self.metadata.get(key)
        return default if kv is None else kv.value


def tensor_nbytes(type_id: int, dims: tuple[int, ...]) -> int:
    """Bytes of a tensor; raises ValueError if the type is unknown or ne0 is not whole blocks."""
    tr = TYPE_TRAITS.get(type_id)
    if tr is None:
        raise ValueError(f"unknown ggml type id {type_id}")
    if not dims:
        return tr.size
    if dims[0] % tr.block:
        raise ValueError(f"ne0={dims[0]} is not a multiple of the {type_name(type_id)} block size {tr.block}")
    n = dims[0] // tr.block * tr.size
    for d in dims[1:]:
        n *= d
    return n


class _Reader:
    """Bounds-checked little-endian reads; every failure names the file and section."""

    def __init__(self, f: BinaryIO, path: Path, size: int):
        self.f = f
        self.path = path
        self.size = size
        self.pos = 0
        self.section = "header"

    def fail(self, what: str) -> ModelFormatError:
        return ModelFormatError(f"{self.path}: GGUF {self.section} at byte {self.pos}: {what}")

    def read(self, n: int) -> bytes:
        if n < 0 or self.pos + n > self.size:
            raise self.fail(f"truncated: need {n} bytes, file has {self.size - self.pos} left")
        b = self.f.read(n)
        if len(b) != n:
            raise self.fail(f"truncated: short read of {len(b)}/{n} bytes")
        self.pos += n
        return b

    def skip(self, n: int) -> None:
        if n < 0 or self.pos + n > self.size:
            raise self.fail(f"truncated: need {n} bytes, file has {self.size - self.pos} left")
        self.pos += n
        self.f.seek(self.pos)

    def scalar(self, vtype: int) -> Any:
        fmt = _SCALAR_FMT[vtype]
        (v,) = struct.unpack(fmt, self.read(struct.calcsize(fmt)))
        if vtype == GGUFValueType.BOOL:
            if v > 1:
                raise self.fail(f"bool value {v} is neither 0 nor 1")
            return bool(v)
        return v

    def u32(self) -> int:
        return self.scalar(GGUFValueType.UINT32)

    def u64(self) -> int:
        return self.scalar(GGUFValueType.UINT64)

    def length(self, what: str, width: int, min_item: int) -> int:
        """A stored length, refused when min_item bytes per element cannot fit in the file."""
        n = self.u64() if width == 8 else self.u32()
        if min_item and n > (self.size - self.pos) // min_item:
            raise self.fail(f"{what} {n} cannot fit in the {self.size - self.pos} bytes left")
        return n

    def string(self, width: int, what: str = "string length") -> str:
        n = self.length(what, width, 1)
        if n > _MAX_STRING:
            raise self.fail(f"{what} {n} is absurd")
        raw = self.read(n)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise self.fail(f"string is not valid UTF-8 ({e.reason} at {e.start})") from None


    def string_array(self, n: int, width: int) -> list[str]:
        """n strings in a row, with string()'s checks and errors. A vocabulary holds ~10^5 of
        them: parsed from a read-only map of the file instead of two reads per string (seconds of
        model-load time otherwise)."""
        unpack = struct.Struct("<Q" if width == 8 else "<I").unpack_from
        out: list[str] = []
        size = self.size
        with mmap.mmap(self.f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            pos = self.pos
            for _ in range(n):
                self.pos = pos
                if width > size - pos:
                    raise self.fail(f"truncated: need {width} bytes, file has {size - pos} left")
                (ln,) = unpack(mm, pos)
                pos += width
                self.pos = pos
                if ln > size - pos:
                    raise self.fail(f"string length {ln} cannot fit in the {size - pos} bytes left")
                if ln > _MAX_STRING:
                    raise self.fail(f"string length {ln} is absurd")
                raw = mm[pos:pos + ln]
                pos += ln
                try:
                    out.append(raw.decode("utf-8"))
                except UnicodeDecodeError as e:
                    self.pos = pos
                    raise self.fail(f"string is not valid UTF-8 ({e.reason} at {e.start})") from None
        self.pos = pos
        self.f.seek(pos)
        return out


def _read_value(r: _Reader, vtype: int, width: int, depth: int = 0) -> KV:
    try:
        vt = GGUFValueType(vtype)
    except ValueError:
        raise r.fail(f"unknown value type id {vtype}") from None
    if vt == GGUFValueType.STRING:
        return KV(vt, r.string(width))
    if vt != GGUFValueType.ARRAY:
        return KV(vt, r.scalar(vt))
    if depth > 0:
        raise r.fail("nested arrays are not supported")
    sub_id = r.u32()
    try:
        sub = GGUFValueType(sub_id)
    except ValueError:
        raise r.fail(f"unknown array element type id {sub_id}") from None
    if sub == GGUFValueType.ARRAY:
        raise r.fail("nested arrays are not supported")
    if sub == GGUFValueType.STRING:
        n = r.length("array length", width, width)
        return KV(vt, r.string_array(n, width), sub)
    item = struct.calcsize(_SCALAR_FMT[sub])
    n = r.length("array length", width, item)
    raw = r.read(n * item)
    fmt = "<" + _SCALAR_FMT[sub][1] * n
    values = list(struct.unpack(fmt, raw))
    if sub == GGUFValueType.BOOL:
        if any(v > 1 for v in values):
            raise r.fail("bool array holds a value other than 0 or 1")
        values = [bool(v) for v in values]
    return KV(vt, values, sub)


def read_header(path: str | os.PathLike[str]) -> GGUFHeader:
    """Parse the header of the GGUF file at ``path`` (no tensor data is read).

    Raises :class:`ModelFormatError` on bad magic, unsupported version, truncation, unknown type
    ids, duplicate names, misaligned or overlapping tensors and data past the end of the file;
    :class:`~ds4.errors.Ds4IOError` when the file cannot be opened.
    """
    from .errors import Ds4IOError

    p = Path(path)
    try:
        f = open(p, "rb")
    except OSError as e:
        raise Ds4IOError(f"{p}: cannot open model file: {e.strerror or e}") from e
    with f:
        size = os.fstat(f.fileno()).st_size
        r = _Reader(f, p, size)
        return _parse(r)


def _parse(r: _Reader) -> GGUFHeader:
    magic = r.read(4)
    if magic != GGUF_MAGIC:
        r.pos = 0
        raise r.fail(f"bad magic {magic!r}, expected {GGUF_MAGIC!r} (not a GGUF file)")
    version = r.u32()
    if version not in (2, 3):
        hint = " (a big-endian file?)" if version in (2 << 24, 3 << 24) else ""
        raise r.fail(f"unsupported GGUF version {version}, expected 2 or 3{hint}")
    width = 8  # v2 and v3 store counts and lengths as u64 (v1, 32-bit, is not supported)
    # each tensor info needs >= 8+4+8+4+8 bytes and each KV >= 8+4+1 bytes
    n_tensors = r.length("tensor count", width, 8 + 4 + 8 + 4 + 8)
    n_kv = r.length("metadata count", width, 8 + 4 + 1)

    r.section = "metadata"
    metadata: dict[str, KV] = {}
    for _ in range(n_kv):
        key = r.string(width, "key length")
        if not key:
            raise r.fail("empty metadata key")
        if key in metadata:
            raise r.fail(f"duplicate metadata key {key!r}")
        vtype = r.u32()
        r.section = f"metadata value {key!r}"
        metadata[key] = _read_value(r, vtype, width)
        r.section = "metadata"

    alignment = _DEFAULT_ALIGNMENT
    if "general.alignment" in metadata:
        kv = metadata["general.alignment"]
        if kv.type != GGUFValueType.UINT32:
            raise r.fail(f"general.alignment has type {kv.type.name}, expected UINT32")
        alignment = kv.value
        if alignment == 0 or alignment & (alignment - 1):
            raise r.fail(f"general.alignment {alignment} is not a power of two")

    r.section = "tensor infos"
    infos: list[tuple[str, tuple[int, ...], int, int]] = []
    seen: set[str] = set()
    for _ in range(n_tensors):
        name = r.string(width, "tensor name length")
        r.section = f"tensor info {name!r}"
        if name in seen:
            raise r.fail(f"duplicate tensor name {name!r}")
        seen.add(name)
        n_dims = r.u32()
        if n_dims < 1 or n_dims > _MAX_DIMS:
            raise r.fail(f"tensor {name!r} has {n_dims} dimensions, expected 1..{_MAX_DIMS}")
        dims = tuple(r.u64() for _ in range(n_dims))
        if any(d == 0 for d in dims):
            raise r.fail(f"tensor {name!r} has a zero dimension {dims}")
        type_id = r.u32()
        if type_id not in TYPE_TRAITS:
            raise r.fail(f"tensor {name!r} has unknown ggml type id {type_id}")
        rel = r.u64()
        infos.append((name, dims, type_id, rel))
        r.section = "tensor infos"

    r.section = "tensor data"
    data_offset = (r.pos + alignment - 1) // alignment * alignment
    if n_tensors and data_offset > r.size:
        raise r.fail(f"data section starts at {data_offset}, past the end of the file ({r.size} bytes)")

    tensors: dict[str, TensorHeader] = {}
    spans: list[tuple[int, int, str]] = []
    for name, dims, type_id, rel in infos:
        try:
            nbytes = tensor_nbytes(type_id, dims)
        except ValueError as e:
            raise ModelFormatError(f"{r.path}: GGUF tensor info {name!r}: {e}") from None
        if rel % alignment:
            raise ModelFormatError(
                f"{r.path}: GGUF tensor info {name!r}: data offset {rel} is not a multiple of "
                f"the alignment {alignment}")
        start = data_offset + rel
        if start + nbytes > r.size:
            raise ModelFormatError(
                f"{r.path}: GGUF tensor info {name!r}: data [{start}, {start + nbytes}) runs past "
                f"the end of the file ({r.size} bytes); the file is truncated")
        tensors[name] = TensorHeader(name, dims, type_id, rel, start, nbytes)
        spans.append((start, start + nbytes, name))
    spans.sort()
    for (a0, a1, an), (b0, b1, bn) in zip(spans, spans[1:]):
        if b0 < a1:
            raise ModelFormatError(
                f"{r.path}: GGUF tensor data: {bn!r} at [{b0}, {b1}) overlaps {an!r} at [{a0}, {a1})")
    return GGUFHeader(
        path=r.path, version=version,
        file_size=r.size, metadata=metadata, tensors=tensors, alignment=alignment,
        data_offset=data_offset, tensor_order=[i[0] for i in infos])
