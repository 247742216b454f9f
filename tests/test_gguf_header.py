"""ds4.gguf_header: the strict header-only GGUF parser.

Files are built byte by byte here (independently of the parser and of gguf-py) so each corruption
is exactly the one named; a real writer's output is compared against gguf-py's reader.
"""

from __future__ import annotations

import shutil
import struct

import gguf
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ds4.errors import Ds4IOError, ModelFormatError
from ds4.gguf_header import GGMLType, GGUFValueType, read_header
from ds4.testing import MetaItem, write_gguf

V = GGUFValueType


# ---- a hand-rolled GGUF builder -------------------------------------------------------------

def s(text: str) -> bytes:
    b = text.encode()
    return struct.pack("<Q", len(b)) + b


def kv_u32(key: str, v: int) -> bytes:
    return s(key) + struct.pack("<II", V.UINT32, v)


def kv_str(key: str, v: str) -> bytes:
    return s(key) + struct.pack("<I", V.STRING) + s(v)


def ti(name: str, dims: tuple[int, ...], type_id: int, offset: int) -> bytes:
    return (s(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims)
            + struct.pack("<IQ", type_id, offset))


def build(kvs: list[bytes], tis: list[bytes], data: bytes = b"", *, magic: bytes = b"GGUF",
          version: int = 3, n_tensors: int | None = None, n_kv: int | None = None,
          alignment: int = 32) -> bytes:
    head = magic + struct.pack("<IQQ", version, len(tis) if n_tensors is None else n_tensors,
                               len(kvs) if n_kv is None else n_kv)
    body = head + b"".join(kvs) + b"".join(tis)
    pad = (-len(body)) % alignment
    return body + b"\0" * pad + data


def two_tensor_file(off_b: int = 32, type_b: int = GGMLType.F32, dims_b: tuple[int, ...] = (8,),
                    data_len: int = 64, **kw) -> bytes:
    kvs = [kv_str("general.architecture", "test"), kv_u32("general.alignment", 32)]
    tis = [ti("a", (8,), GGMLType.F32, 0), ti("b", dims_b, type_b, off_b)]
    return build(kvs, tis, b"\1" * data_len, **kw)


def write(tmp_path, data: bytes, name: str = "x.gguf"):
    p = tmp_path / name
    p.write_bytes(data)
    return p


# ---- well-formed files ----------------------------------------------------------------------

def test_hand_built_file_parses(tmp_path):
    h = read_header(write(tmp_path, two_tensor_file()))
    assert h.version == 3 and h.alignment == 32
    assert h.value("general.architecture") == "test"
    assert h.metadata["general.alignment"].type == V.UINT32
    a, b = h.tensors["a"], h.tensors["b"]
    assert (a.dims, a.nbytes, b.offset - a.offset) == ((8,), 32, 32)
    assert a.offset == h.data_offset and h.data_offset % 32 == 0


@pytest.fixture(scope="module")
def rich_file(tmp_path_factory):
    items = [
        MetaItem("general.architecture", "test", V.STRING),
        MetaItem("general.alignment", 64, V.UINT32),
        MetaItem("k.u8", 200, V.UINT8), MetaItem("k.i8", -5, V.INT8),
        MetaItem("k.u16", 60000, V.UINT16), MetaItem("k.i16", -300, V.INT16),
        MetaItem("k.u32", 4_000_000_000, V.UINT32), MetaItem("k.i32", -7, V.INT32),
        MetaItem("k.f32", 0.5, V.FLOAT32), MetaItem("k.bool", True, V.BOOL),
        MetaItem("k.u64", 2**40, V.UINT64), MetaItem("k.i64", -(2**40), V.INT64),
        MetaItem("k.f64", 1e-300, V.FLOAT64), MetaItem("k.str", "héllo ｜", V.STRING),
        MetaItem("k.arr_u32", [1, 2, 3], V.ARRAY, V.UINT32),
        MetaItem("k.arr_str", ["a", "", "ｂ"], V.ARRAY, V.STRING),
        MetaItem("k.arr_f32", [0.25, -1.0], V.ARRAY, V.FLOAT32),
    ]
    tensors = [("t.f32", (8,), GGMLType.F32), ("t.f16", (32, 3), GGMLType.F16),
               ("t.q8", (64, 2), GGMLType.Q8_0), ("t.q2k", (256, 2), GGMLType.Q2_K),
               ("t.i32", (4, 5, 2), GGMLType.I32)]

    def data(i):
        name, dims, t = tensors[i]
        from ds4.gguf_header import tensor_nbytes
        return np.full(tensor_nbytes(t, dims), i + 1, dtype=np.uint8)

    p = write_gguf(tmp_path_factory.mktemp("h") / "rich.gguf", items, tensors, alignment=64, data=data)
    return p, items, tensors


def test_matches_gguf_py(rich_file):
    p, items, tensors = rich_file
    h = read_header(p)
    r = gguf.GGUFReader(p)
    for m in items:
        kv = h.metadata[m.key]
        assert kv.type == m.vtype and kv.subtype == m.subtype
        if m.vtype == V.FLOAT32:
            assert kv.value == pytest.approx(m.value)
        elif m.subtype == V.FLOAT32:
            assert kv.value == pytest.approx(m.value)
        else:
            assert kv.value == m.value, m.key
    assert h.alignment == 64
    for t in r.tensors:
        mine = h.tensors[t.name]
        assert mine.dims == tuple(int(d) for d in t.shape)
        assert mine.type == int(t.tensor_type)
        assert mine.offset == t.data_offset and mine.offset % 64 == 0
        assert mine.nbytes == t.n_bytes
    with open(p, "rb") as f:
        for i, (name, _, _) in enumerate(tensors):
            t = h.tensors[name]
            f.seek(t.offset)
            assert set(f.read(t.nbytes)) == {i + 1}


def test_truncation_at_every_byte_raises(rich_file, tmp_path):
    p, _, _ = rich_file
    full = p.read_bytes()
    h = read_header(p)
    end = max(t.offset + t.nbytes for t in h.tensors.values())
    q = tmp_path / "cut.gguf"
    for n in range(0, end):
        q.write_bytes(full[:n])
        with pytest.raises(ModelFormatError, match="cut.gguf"):
            read_header(q)
    for n in range(end, len(full) + 1):  # only trailing padding missing: still valid
        q.write_bytes(full[:n])
        read_header(q)


@settings(max_examples=60)
@given(data=st.data())
def test_random_header_corruption_never_crashes(rich_file, tmp_path_factory, data):
    p, _, _ = rich_file
    full = bytearray(p.read_bytes())
    h = read_header(p)
    n_flips = data.draw(st.integers(1, 4))
    for _ in range(n_flips):
        pos = data.draw(st.integers(0, h.data_offset - 1))
        full[pos] = data.draw(st.integers(0, 255))
    q = tmp_path_factory.mktemp("flip") / "f.gguf"
    q.write_bytes(bytes(full))
    try:
        read_header(q)
    except ModelFormatError as e:
        assert "f.gguf" in str(e)


# ---- each corruption, its message -----------------------------------------------------------

@pytest.mark.parametrize("data, match", [
    (two_tensor_file(magic=b"GGML"), r"bad magic b'GGML'.*not a GGUF file"),
    (two_tensor_file(version=1), "unsupported GGUF version 1"),
    (two_tensor_file(version=4), "unsupported GGUF version 4"),
    (two_tensor_file(version=3 << 24), "big-endian"),
    (two_tensor_file(n_tensors=2**62), "tensor count .* cannot fit"),
    (two_tensor_file(n_kv=2**40), "metadata count .* cannot fit"),
    (build([s("k") + struct.pack("<I", 99)], []), "unknown value type id 99"),
    (build([s("k") + struct.pack("<II", V.ARRAY, 77) + struct.pack("<Q", 1)], []), "unknown array element type id 77"),
    (build([s("k") + struct.pack("<II", V.ARRAY, V.UINT32) + struct.pack("<Q", 2**50)], []), "array length .* cannot fit"),
    (build([s("k") + struct.pack("<I", V.STRING) + struct.pack("<Q", 2**50)], [], b"\0" * 64), "string length .* cannot fit"),
    (build([struct.pack("<Q", 2**60)], [], b"\0" * 64), "key length .* cannot fit"),
    (build([s("k") + struct.pack("<IB", V.BOOL, 7)], []), "bool value 7"),
    (build([kv_u32("k", 1), kv_u32("k", 2)], []), "duplicate metadata key 'k'"),
    (build([s("k") + struct.pack("<I", V.STRING) + struct.pack("<Q", 2) + b"\xff\xfe"], []), "not valid UTF-8"),
    (build([kv_u32("general.alignment", 24)], []), "alignment 24 is not a power of two"),
    (build([kv_str("general.alignment", "32")], []), "general.alignment has type STRING"),
    (two_tensor_file(type_b=200), "unknown ggml type id 200"),
    (two_tensor_file(dims_b=()), "0 dimensions"),
    (two_tensor_file(dims_b=(1, 1, 1, 1, 1)), "5 dimensions"),
    (two_tensor_file(dims_b=(8, 0)), "zero dimension"),
    (two_tensor_file(off_b=48), "offset 48 is not a multiple of the alignment 32"),
    (two_tensor_file(off_b=0), "'b' at .* overlaps 'a'"),
    (two_tensor_file(off_b=64), r"runs past the end of the file"),
    (two_tensor_file(dims_b=(2**40, 2**30)), r"runs past the end of the file"),
    (two_tensor_file(type_b=GGMLType.Q8_0, dims_b=(48,)), "not a multiple of the Q8_0 block size 32"),
    (build([], [ti("a", (8,), 0, 0), ti("a", (8,), 0, 32)], b"\0" * 64), "duplicate tensor name 'a'"),
    # string arrays (vocabularies) take their own bulk path: the same checks, element by element
    (build([s("k") + struct.pack("<II", V.ARRAY, V.STRING) + struct.pack("<Q", 2) + s("ok") + struct.pack("<Q", 2**50)],
           [], b"\0" * 64), "string length .* cannot fit"),
    (build([s("k") + struct.pack("<II", V.ARRAY, V.STRING) + struct.pack("<Q", 2) + s("ok") + struct.pack("<Q", 2)
            + b"\xff\xfe"], []), "not valid UTF-8"),
], ids=['bad-magic', 'version1', 'version4', 'big-endian', 'absurd-tensor-count', 'absurd-kv-count', 'bad-value-type', 'bad-array-type', 'absurd-array', 'absurd-string', 'absurd-key', 'bad-bool', 'dup-key', 'bad-utf8', 'alignment-not-pow2', 'alignment-type', 'bad-ggml-type', 'zero-dims', 'five-dims', 'zero-dim', 'misaligned', 'overlap', 'past-end', 'huge-dims', 'partial-block', 'dup-tensor', 'absurd-string-in-array', 'bad-utf8-in-array'])
def test_corruption_is_named(tmp_path, data, match):
    p = write(tmp_path, data, "bad.gguf")
    with pytest.raises(ModelFormatError, match=match) as e:
        read_header(p)
    assert str(e.value).startswith(str(p))


def test_error_names_the_section(tmp_path):
    p = write(tmp_path, two_tensor_file(type_b=200))
    with pytest.raises(ModelFormatError, match=r"tensor info 'b'"):
        read_header(p)
    p = write(tmp_path, build([kv_u32("general.alignment", 32), s("k") + struct.pack("<I", 99)], []))
    with pytest.raises(ModelFormatError, match=r"metadata value 'k'"):
        read_header(p)


def test_version_2_is_accepted(tmp_path):
    assert read_header(write(tmp_path, two_tensor_file(version=2))).version == 2


def test_missing_file_is_an_io_error(tmp_path):
    with pytest.raises(Ds4IOError, match="nope.gguf"):
        read_header(tmp_path / "nope.gguf")


def test_never_reads_tensor_data(rich_file, tmp_path):
    # a header followed by a sparse hole: parsing must not depend on the data bytes
    p, _, _ = rich_file
    h = read_header(p)
    q = tmp_path / "hole.gguf"
    shutil.copy(p, q)
    with open(q, "r+b") as f:
        f.seek(h.data_offset)
        f.write(b"\xff" * (h.file_size - h.data_offset))
    assert read_header(q).tensors == h.tensors
