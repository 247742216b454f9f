"""Writing complete DS4-layout GGUF files (metadata, tokenizer, every tensor) from a shape.

A :class:`ModelPlan` is the file as data (metadata items with their exact GGUF types and the tensor
list from :mod:`ds4.layout`); tests edit a plan to produce precisely broken files. ``write_plan``
streams tensors one at a time (bounded memory), or writes only the header and leaves the data as a
sparse hole (``header_only``), which is how Flash-sized files are made in tests.
"""

from __future__ import annotations

import math
import os
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Union

import numpy as np

from ..errors import InvalidArgumentError
from ..gguf_header import GGMLType, GGUFValueType, tensor_nbytes
from ..layout import EXPERT_MIXES, mtp_tensor_specs, shape_problems, tensor_specs
from ..shape import ARCH, METADATA_KEYS, ModelShape
from ._blocks import random_q8_0, random_quant
from ._presets import REAL_VOCAB_PRESETS, preset
from ._vocab import Vocab, deepseek_vocab, tiny_vocab

__all__ = ["MetaItem", "TensorPlan", "ModelPlan", "model_plan", "write_plan", "write_model", "write_gguf",
           "resolve_shape", "resolve_vocab"]

VocabArg = Union[None, str, Vocab]
ShapeArg = Union[str, ModelShape]

U32, I32, F32, BOOL, STR, ARR = (GGUFValueType.UINT32, GGUFValueType.INT32, GGUFValueType.FLOAT32,
                                 GGUFValueType.BOOL, GGUFValueType.STRING, GGUFValueType.ARRAY)


@dataclass
class MetaItem:
    """One metadata key with the exact GGUF value type (and element type for arrays) to write."""

    key: str
    value: Any
    vtype: int
    subtype: int | None = None


@dataclass
class TensorPlan:
    """One tensor to write: name, ggml dims, ggml type and the initialisation role."""

    name: str
    dims: tuple[int, ...]
    type: int
    role: str


@dataclass
class ModelPlan:
    """A whole file as data; edit it to make broken files for validation tests."""

    shape: ModelShape
    metadata: dict[str, MetaItem]
    tensors: list[TensorPlan]
    alignment: int = 32
    extra: dict[str, Any] = field(default_factory=dict)

    def tensor(self, name: str) -> TensorPlan:
        for t in self.tensors:
            if t.name == name:
                return t
        raise KeyError(name)

    def drop_tensor(self, name: str) -> None:
        self.tensors = [t for t in self.tensors if t.name != name]

    def set_meta(self, key: str, value: Any, vtype: int, subtype: int | None = None) -> None:
        self.metadata[key] = MetaItem(key, value, vtype, subtype)


def resolve_shape(shape: ShapeArg) -> ModelShape:
    return preset(shape) if isinstance(shape, str) else shape


def resolve_vocab(vocab: VocabArg, shape: ModelShape, shape_name: str | None = None) -> Vocab:
    """``None`` picks the real DeepSeek vocabulary for real-vocabulary presets (or n_vocab 129280),
    the synthetic byte BPE otherwise; "tiny"/"deepseek" force one; a :class:`Vocab` is used as is."""
    if vocab is None:
        real = (shape_name in REAL_VOCAB_PRESETS) or shape.n_vocab == 129280
        vocab = "deepseek" if real else "tiny"
    if isinstance(vocab, str):
        if vocab == "tiny":
            vocab = tiny_vocab(shape.n_vocab)
        elif vocab == "deepseek":
            vocab = deepseek_vocab()
        else:
            raise InvalidArgumentError(f"unknown vocabulary {vocab!r}, expected 'tiny' or 'deepseek'")
    if len(vocab) != shape.n_vocab:
        raise InvalidArgumentError(f"vocabulary has {len(vocab)} tokens but the shape declares n_vocab={shape.n_vocab}")
    return vocab


def _shape_metadata(s: ModelShape) -> list[MetaItem]:
    p = ARCH + "."
    items: list[MetaItem] = []
    for fld, key in METADATA_KEYS.items():
        v = getattr(s, fld)
        if fld == "compress_ratios":
            items.append(MetaItem(p + key, list(v), ARR, I32))
        elif fld == "swiglu_clamp":
            items.append(MetaItem(p + key, [float(v)] * s.n_layer, ARR, F32))
        elif isinstance(v, bool):
            items.append(MetaItem(p + key, v, BOOL))
        elif isinstance(v, float):
            items.append(MetaItem(p + key, v, F32))
        else:
            items.append(MetaItem(p + key, int(v), U32))
    items += [
        MetaItem(p + "attention.value_length", s.value_dim, U32),
        MetaItem(p + "expert_group_count", 0, U32),
        MetaItem(p + "expert_group_used_count", 0, U32),
        MetaItem(p + "context_length", 1048576, U32),
    ]
    return items


def _tokenizer_metadata(v: Vocab) -> list[MetaItem]:
    t = "tokenizer.ggml."
    return [
        MetaItem(t + "model", "gpt2", STR),
        MetaItem(t + "pre", v.pre, STR),
        MetaItem(t + "tokens", list(v.tokens), ARR, STR),
        MetaItem(t + "token_type", list(v.token_types), ARR, I32),
        MetaItem(t + "merges", list(v.merges), ARR, STR),
        MetaItem(t + "bos_token_id", v.bos_id, U32),
        MetaItem(t + "eos_token_id", v.eos_id, U32),
        MetaItem(t + "padding_token_id", v.pad_id, U32),
        MetaItem(t + "add_bos_token", True, BOOL),
        MetaItem(t + "add_eos_token", False, BOOL),
    ]


def model_plan(shape: ShapeArg = "tiny", experts: str = "q2", mtp: bool = False,
               vocab: VocabArg = None, name: str | None = None) -> ModelPlan:
    """The metadata and tensor list of a DS4 file of ``shape`` (preset name or ModelShape)."""
    shape_name = shape if isinstance(shape, str) else None
    s = resolve_shape(shape)
    problems = shape_problems(s)
    if problems:
        raise InvalidArgumentError(f"shape cannot be written as a DS4 model: {'; '.join(problems)}")
    if experts not in EXPERT_MIXES:
        raise InvalidArgumentError(f"unknown expert mix {experts!r}, expected one of {sorted(EXPERT_MIXES)}")
    v = resolve_vocab(vocab, s, shape_name)
    meta = [
        MetaItem("general.architecture", ARCH, STR),
        MetaItem("general.name", name or f"ds4-synthetic-{shape_name or 'custom'}", STR),
        MetaItem("general.alignment", 32, U32),
        MetaItem("general.quantization_version", 2, U32),
    ]
    meta += _shape_metadata(s) + _tokenizer_metadata(v)
    specs = tensor_specs(s, experts)  # type: ignore[arg-type]
    if mtp:
        specs += mtp_tensor_specs(s, experts)  # type: ignore[arg-type]
    tensors = []
    for spec in specs:
        # the optional router bias is written where it is used: non-hash layers (and MTP)
        if spec.role == "probs_bias" and spec.name.startswith("blk.") and s.is_hash_layer(int(spec.name.split(".")[1])):
            continue
        tensors.append(TensorPlan(spec.name, spec.dims, spec.types[0], spec.role))
    return ModelPlan(s, {m.key: m for m in meta}, tensors)


# ---- tensor data ----

def _gauss_std(role: str, dims: tuple[int, ...]) -> float:
    fan_in = dims[0]
    return {
        "embd": 1.0,
        "output": 1.5 / math.sqrt(fan_in),   # logits of std ~1.5: peaked but not degenerate
        "router": 2.0 / math.sqrt(fan_in),   # router logits of std ~2: routing varies by token
        "hc_fn": 1.0 / math.sqrt(fan_in),
    }.get(role, 1.0 / math.sqrt(fan_in))


def _float_values(role: str, dims: tuple[int, ...], rng: np.random.Generator, n_hc: int) -> np.ndarray:
    shape = tuple(reversed(dims))
    n = math.prod(dims)
    if role == "norm":
        return 1.0 + 0.1 * rng.standard_normal(shape, dtype=np.float32)
    if role == "hc_scale":
        return rng.uniform(0.3, 0.7, shape).astype(np.float32)
    if role == "hc_base":
        v = 0.3 * rng.standard_normal(n).astype(np.float32)
        if n == 2 * n_hc + n_hc * n_hc:
            v[2 * n_hc:] += 2.0 * np.eye(n_hc, dtype=np.float32).ravel()  # comb near identity
        return v.reshape(shape)
    if role in ("out_hc_base", "ape"):
        return 0.3 * rng.standard_normal(shape, dtype=np.float32)
    if role in ("sinks", "probs_bias"):
        return 0.1 * rng.standard_normal(shape, dtype=np.float32)
    return rng.standard_normal(shape, dtype=np.float32) * np.float32(_gauss_std(role, dims))


def _tid2eid(dims: tuple[int, ...], rng: np.random.Generator, n_expert: int) -> np.ndarray:
    k, n_vocab = dims[0], math.prod(dims[1:])
    if k > n_expert:
        return rng.integers(0, n_expert, size=(n_vocab, k), dtype=np.int32)
    out = np.empty((n_vocab, k), dtype=np.int32)
    step = 1 << 14
    for r0 in range(0, n_vocab, step):
        r1 = min(n_vocab, r0 + step)
        out[r0:r1] = np.argsort(rng.random((r1 - r0, n_expert)), axis=1)[:, :k]
    return out.reshape(tuple(reversed(dims)))


def tensor_data(t: TensorPlan, shape: ModelShape, seed: int) -> np.ndarray:
    """The seeded contents of one planned tensor, in gguf's numpy layout (reversed dims; quantised
    types as bytes with ne0 replaced by the row's byte width)."""
    rng = np.random.default_rng([seed, zlib.crc32(t.name.encode())])
    typ = GGMLType(t.type)
    if t.role == "tid2eid":
        ids = _tid2eid(t.dims, rng, shape.n_expert)
        return ids if typ == GGMLType.I32 else ids.astype(_plain_dtype(typ))
    if typ in (GGMLType.Q2_K, GGMLType.Q4_K, GGMLType.IQ2_XXS):
        return random_quant(rng, typ, t.dims, _gauss_std(t.role, t.dims))
    if typ == GGMLType.Q8_0 and t.role not in ("norm", "hc_scale", "hc_base"):
        rows = math.prod(t.dims[1:])
        q = random_q8_0(rng, rows, t.dims[0], _gauss_std(t.role, t.dims))
        return q.reshape(*reversed(t.dims[1:]), q.shape[-1])
    values = _float_values(t.role, t.dims, rng, shape.n_hc)
    if typ == GGMLType.Q8_0:
        from gguf import quants
        return quants.quantize(values, GGMLType.Q8_0)
    return values.astype(_plain_dtype(typ))


def _plain_dtype(typ: GGMLType) -> Any:
    dt = {GGMLType.F32: np.float32, GGMLType.F16: np.float16, GGMLType.I32: np.int32,
          GGMLType.I8: np.int8, GGMLType.I16: np.int16, GGMLType.F64: np.float64}.get(typ)
    if dt is None:
        raise InvalidArgumentError(f"the synthetic writer cannot fill a {typ.name} tensor")
    return dt


# ---- file writing ----

def write_plan(path: str | os.PathLike[str], plan: ModelPlan, seed: int = 0,
               header_only: bool = False) -> Path:
    """Write ``plan`` to ``path`` atomically (temp file + rename) and return the path.

    ``header_only`` writes metadata and tensor infos and leaves the data region a sparse hole of
    the right size, so the file is valid (offsets in range) but its weights read as zeros.
    """
    items = list(plan.metadata.values())
    tensors = [(t.name, t.dims, t.type) for t in plan.tensors]
    data = None if header_only else (lambda i: tensor_data(plan.tensors[i], plan.shape, seed))
    return write_gguf(path, items, tensors, alignment=plan.alignment, data=data)


def write_gguf(path: str | os.PathLike[str], metadata: list[MetaItem],
               tensors: list[tuple[str, tuple[int, ...], int]], alignment: int = 32,
               data: Callable[[int], np.ndarray] | None = None) -> Path:
    """Write any GGUF file (any architecture) atomically: ``metadata`` items in order, then the
    tensor infos ``(name, ggml dims, ggml type)``; ``data(i)`` gives tensor i's contents in gguf's
    numpy layout, or with ``data=None`` the data region is left a sparse hole of the right size."""
    import gguf

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{os.urandom(4).hex()}")
    w = gguf.GGUFWriter(None, ARCH)
    w.kv_data[0].clear()  # the caller owns every key, general.architecture included
    w.data_alignment = alignment
    for m in metadata:
        sub = None if m.subtype is None else gguf.GGUFValueType(m.subtype)
        w.add_key_value(m.key, m.value, gguf.GGUFValueType(m.vtype), sub_type=sub)
    sizes = []
    for name, dims, type_id in tensors:
        nbytes = tensor_nbytes(type_id, dims)
        sizes.append(nbytes)
        w.add_tensor_info(name, tuple(reversed(dims)), np.dtype(np.float32), nbytes,
                          raw_dtype=gguf.GGMLQuantizationType(type_id))
    try:
        w.write_header_to_file(path=tmp)
        w.write_kv_data_to_file()
        w.write_ti_data_to_file()
        assert w.fout is not None
        f = w.fout[0]
        if data is None:
            start = (f.tell() + alignment - 1) // alignment * alignment
            total = sum((n + alignment - 1) // alignment * alignment for n in sizes)
            f.truncate(start + total)
        else:
            for i, (n, (name, _, _)) in enumerate(zip(sizes, tensors)):
                arr = np.ascontiguousarray(data(i))
                if arr.nbytes != n:
                    raise InvalidArgumentError(f"{name}: generated {arr.nbytes} bytes, expected {n}")
                w.write_tensor_data(arr)
        w.close()
        os.replace(tmp, path)
    except BaseException:
        w.close()
        tmp.unlink(missing_ok=True)
        raise
    return path


def write_model(path: str | os.PathLike[str], shape: ShapeArg = "tiny", experts: str = "q2",
                mtp: bool = False, seed: int = 0, vocab: VocabArg = None,
                header_only: bool = False) -> Path:
    """Write a complete, seeded DS4-layout GGUF model and return its path.

    ``shape`` is a preset name (see ``ds4.testing.PRESETS``) or a :class:`ModelShape`;
    ``experts`` is "q2" (IQ2_XXS gate/up + Q2_K down) or "q4" (Q4_K everywhere); ``mtp`` adds the
    ``mtp.0.*`` block; ``vocab`` as :func:`resolve_vocab`.
    """
    plan = model_plan(shape, experts=experts, mtp=mtp, vocab=vocab)
    return write_plan(path, plan, seed=seed, header_only=header_only)
