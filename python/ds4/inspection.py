"""``ds4.inspect``: read a GGUF header, validate it against the DS4 layout, describe the model.

Nothing here reads tensor data: the header parser (:mod:`ds4.gguf_header`) gives metadata and
tensor infos, :mod:`ds4.layout` says what a DS4 file must contain for the shape its metadata
declares, and every mismatch becomes a :class:`~ds4.errors.ModelFormatError` naming the key or
tensor, what was found and what was expected.

    >>> import ds4, ds4.testing
    >>> info = ds4.inspect(ds4.testing.default_model_path())
    >>> info.variant, info.shape.n_layer, info.routed_bits
    ('custom', 4, 2)
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from .errors import ModelFormatError, UnsupportedModelError
from .gguf_header import KV, GGMLType, GGUFHeader, GGUFValueType, TensorHeader, read_header, type_name
from .layout import ROUTED_TYPES, mtp_tensor_specs, range_problems, shape_problems, tensor_specs
from .memory_plan import DEFAULT_CTX, MiB, MemoryPlan, context_estimate, memory_plan
from .shape import ARCH, FLASH, METADATA_KEYS, PRO, ModelShape

__all__ = ["inspect", "ModelInfo", "TensorInfo", "TokenizerSummary", "MLAInfo", "read_shape"]

_BIG_ARRAY = 1024           # metadata arrays longer than this are summarised, not copied
_SPECIAL_TOKENS = {
    "bos": "<｜begin▁of▁sentence｜>", "eos": "<｜end▁of▁sentence｜>", "user": "<｜User｜>",
    "assistant": "<｜Assistant｜>", "think": "<think>", "think_end": "</think>", "dsml": "｜DSML｜",
}
_OFFICIAL = {"flash": FLASH, "pro": PRO}
# Pro's float hyper-parameters other than the expert weight scale are not pinned by our source
# (docs/model.md §1.2 "?"), so only these are checked exactly for Pro.
_PRO_CHECKED_FLOATS = ("expert_weights_scale",)


@dataclass(frozen=True)
class TensorInfo:
    """One tensor of the file: ggml type id and name, ggml dims, absolute data offset, size."""

    name: str
    type: int
    type_name: str
    dims: tuple[int, ...]
    offset: int
    nbytes: int

    @property
    def n_elements(self) -> int:
        return math.prod(self.dims)


@dataclass(frozen=True)
class TokenizerSummary:
    """What the tokenizer metadata holds (no token strings are kept)."""

    model: str | None
    pre: str | None
    n_tokens: int
    n_merges: int
    bos_id: int | None
    eos_id: int | None
    add_bos_token: bool | None
    special_ids: dict[str, int]          # role -> id of the seven strings the engine looks up
    missing_specials: tuple[str, ...]


@dataclass(frozen=True)
class MLAInfo:
    """DeepSeek V2/V3 (``deepseek2`` arch) attention layout and its KV cache cost in f16."""

    n_layer: int
    n_head: int
    kv_lora_rank: int
    rope_dim: int
    nope_dim: int
    v_head_dim: int
    split_kv_b: bool           # blk.N.attn_k_b + attn_v_b: the latent cache is possible
    legacy_kv_b: bool          # blk.N.attn_kv_b only: full per-head K and V
    ctx: int
    latent_kv_bytes: int       # per token per layer kv_lora_rank + rope values, no separate V
    legacy_k_bytes: int
    legacy_v_bytes: int

    @property
    def legacy_kv_bytes(self) -> int:
        return self.legacy_k_bytes + self.legacy_v_bytes


@dataclass
class ModelInfo:
    """Everything ``ds4.inspect`` learnt about a model file.

    For ``deepseek4`` files ``shape`` is the validated :class:`ModelShape` and ``variant`` is
    "flash", "pro" or "custom"; for other architectures ``shape`` is ``None`` and the engine
    refuses the file (:meth:`check_supported`).
    """

    path: Path
    arch: str
    variant: str
    shape: ModelShape | None
    tensors: dict[str, TensorInfo]
    routed_bits: int
    expert_types: dict[str, str]
    has_mtp: bool
    hash_layers: tuple[int, ...]
    compress_ratios: tuple[int, ...]
    n_params: int
    n_params_active: int
    weights_bytes: int
    metadata: dict[str, Any]
    tokenizer: TokenizerSummary
    memory: MemoryPlan | None
    file_size: int = 0
    gguf_version: int = 0
    alignment: int = 32
    data_offset: int = 0
    extra_tensors: tuple[str, ...] = ()
    mla: MLAInfo | None = None

    def check_supported(self) -> None:
        """Raise :class:`UnsupportedModelError` unless this is a DS4 model the engine can run."""
        if self.arch != ARCH or self.shape is None:
            detail = ""
            if self.mla is not None:
                detail = " (DeepSeek V2/V3 MLA models are recognised by inspect but not run)"
            raise UnsupportedModelError(
                f"{self.path}: architecture {self.arch!r} is not supported, expected {ARCH!r}{detail}")

    def summary(self) -> str:
        """A human-readable multi-line description."""
        lines = [f"file        {self.path} ({self.file_size / 2**30:.2f} GiB, GGUF v{self.gguf_version})",
                 f"arch        {self.arch}  variant {self.variant}"]
        s = self.shape
        if s is not None:
            r4 = sum(1 for r in s.compress_ratios if r == 4)
            r128 = sum(1 for r in s.compress_ratios if r == 128)
            r0 = sum(1 for r in s.compress_ratios if r == 0)
            lines += [
                f"shape       {s.n_layer} layers, embd {s.n_embd}, vocab {s.n_vocab}, {s.n_head} heads x {s.head_dim} "
                f"(rope {s.n_rot}), {s.n_out_group} output groups",
                f"lora        q {s.q_lora_rank}, out {s.o_lora_rank}",
                f"experts     {s.n_expert} routed ({s.n_expert_used} used) + {s.n_expert_shared} shared, ff {s.n_ff_exp}, "
                f"{self.routed_bits}-bit ({self.expert_types.get('gate')}/{self.expert_types.get('up')}/"
                f"{self.expert_types.get('down')}), scale {s.expert_weights_scale:g}",
                f"routing     hash layers {list(self.hash_layers)}, biased top-k elsewhere",
                f"attention   window {s.n_swa}; ratios: {r0} dense, {r4} x4 (indexed, {s.indexer_heads}x"
                f"{s.indexer_head_dim} top {s.indexer_top_k}), {r128} x128",
                f"mtp         {'yes' if self.has_mtp else 'no'}",
            ]
        else:
            lines.append("shape       (not a DS4 model: not runnable by ds4)")
        lines.append(f"params      {self.n_params / 1e9:.3f} B total, {self.n_params_active / 1e9:.3f} B active; "
                     f"weights {self.weights_bytes / 2**30:.2f} GiB")
        t = self.tokenizer
        lines.append(f"tokenizer   {t.model} / {t.pre}, {t.n_tokens} tokens, {t.n_merges} merges, bos {t.bos_id}, "
                     f"eos {t.eos_id}, add_bos {t.add_bos_token}"
                     + (f", missing {list(t.missing_specials)}" if t.missing_specials and s is not None else ""))
        if self.mla is not None:
            m = self.mla
            lines.append(f"mla         {m.n_layer} layers, {m.n_head} heads, kv_lora {m.kv_lora_rank}, rope {m.rope_dim}, "
                         f"nope {m.nope_dim}, v {m.v_head_dim}; split attn_k_b/attn_v_b: "
                         f"{'yes' if m.split_kv_b else 'no'}, legacy attn_kv_b: {'yes' if m.legacy_kv_b else 'no'}")
            lines.append(f"kv (f16)    ctx {m.ctx}: latent {m.latent_kv_bytes / MiB:.0f} MiB vs full "
                         f"{m.legacy_kv_bytes / MiB:.0f} MiB (K {m.legacy_k_bytes / MiB:.0f} + V {m.legacy_v_bytes / MiB:.0f})")
        if self.memory is not None:
            mp = self.memory
            lines.append(f"memory      ctx {mp.ctx}: raw KV {mp.raw_bytes / MiB:.2f} MiB, compressed {mp.compressed_bytes / MiB:.2f} MiB, "
                         f"indexer {mp.indexer_bytes / MiB:.2f} MiB, frontiers {mp.frontier_bytes / MiB:.2f} MiB, "
                         f"logits {mp.logits_bytes / MiB:.2f} MiB; context {mp.context_bytes / MiB:.2f} MiB + weights "
                         f"{mp.weights_bytes / MiB:.2f} MiB = {mp.total_bytes / MiB:.2f} MiB")
            if s is not None:
                cpu, gpu = context_estimate(s, mp.ctx, "cpu"), context_estimate(s, mp.ctx, "graph")
                lines.append(f"estimate    upstream context buffers: cpu {cpu.total / MiB:.2f} MiB, "
                             f"metal/cuda {gpu.total / MiB:.2f} MiB (raw_kv_rows={gpu.raw_cap}, "
                             f"compressed_kv_rows={gpu.comp_cap})")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready description (tensors as [type, dims, offset, nbytes])."""
        d: dict[str, Any] = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if f.name == "tensors":
                v = {n: {"type": t.type_name, "dims": list(t.dims), "offset": t.offset, "nbytes": t.nbytes}
                     for n, t in v.items()}
            elif f.name == "shape":
                v = None if v is None else v.to_dict()
            elif f.name == "memory":
                v = None if v is None else v.to_dict()
            elif f.name in ("tokenizer", "mla"):
                v = None if v is None else {k.name: _jsonable(getattr(v, k.name)) for k in fields(v)}
            v = _jsonable(v)
            d[f.name] = v
        if self.mla is not None:
            d["mla"]["legacy_kv_bytes"] = self.mla.legacy_kv_bytes
        return d


def _jsonable(v: Any) -> Any:
    if isinstance(v, Path):
        return str(v)
    if isinstance(v, tuple):
        return [_jsonable(x) for x in v]
    if isinstance(v, list):
        return [_jsonable(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, bytes):
        return v.hex()
    return v


# ---------------------------------------------------------------- metadata -> shape

class _Problems:
    """Collects validation failures; raises them together, one clause each."""

    def __init__(self, path: Path):
        self.path = path
        self.items: list[str] = []

    def add(self, msg: str) -> None:
        self.items.append(msg)

    def raise_if_any(self) -> None:
        if self.items:
            n = len(self.items)
            shown = "; ".join(self.items[:8]) + (f"; ... and {n - 8} more" if n > 8 else "")
            raise ModelFormatError(f"{self.path}: not a valid DS4 model: {shown}")


_INT_TYPES = (GGUFValueType.UINT8, GGUFValueType.INT8, GGUFValueType.UINT16, GGUFValueType.INT16,
              GGUFValueType.UINT32, GGUFValueType.INT32, GGUFValueType.UINT64, GGUFValueType.INT64)
_F32_ACCEPTED = (GGUFValueType.FLOAT32, GGUFValueType.FLOAT64, GGUFValueType.UINT32, GGUFValueType.INT32)


def _desc(kv: KV) -> str:
    if kv.is_array:
        return f"ARRAY of {kv.subtype.name if kv.subtype is not None else '?'}"
    return kv.type.name


def _get_u32(h: GGUFHeader, key: str, pb: _Problems, also: tuple[GGUFValueType, ...] = ()) -> int | None:
    kv = h.metadata.get(key)
    if kv is None:
        pb.add(f"metadata key {key} is missing (expected UINT32)")
        return None
    if kv.type != GGUFValueType.UINT32 and kv.type not in also:
        want = "/".join(["UINT32"] + [a.name for a in also])
        pb.add(f"metadata key {key} has type {_desc(kv)}, expected {want}")
        return None
    return int(kv.value)


def _get_f32(h: GGUFHeader, key: str, pb: _Problems) -> float | None:
    kv = h.metadata.get(key)
    if kv is None:
        pb.add(f"metadata key {key} is missing (expected FLOAT32)")
        return None
    if kv.type not in _F32_ACCEPTED:
        pb.add(f"metadata key {key} has type {_desc(kv)}, expected FLOAT32 (or FLOAT64/UINT32/INT32)")
        return None
    if kv.type == GGUFValueType.FLOAT32:
        return _f32_shortest(kv.value)
    return float(kv.value)


def _f32_shortest(x: float) -> float:
    """The shortest decimal that rounds to the same float32 (so 1e-6 stored as f32 reads back as
    1e-6, and shapes compare equal to the tables they were written from)."""
    import numpy as np
    return float(str(np.float32(x)))


def _get_array(h: GGUFHeader, key: str, pb: _Problems, subtypes: tuple[GGUFValueType, ...],
               n_min: int) -> list[Any] | None:
    kv = h.metadata.get(key)
    want = " or ".join(f"ARRAY of {s.name}" for s in subtypes)
    if kv is None:
        pb.add(f"metadata key {key} is missing (expected {want})")
        return None
    if not kv.is_array or kv.subtype not in subtypes:
        pb.add(f"metadata key {key} has type {_desc(kv)}, expected {want}")
        return None
    if len(kv.value) < n_min:
        pb.add(f"metadata key {key} has {len(kv.value)} entries, expected at least {n_min} (one per layer)")
        return None
    return list(kv.value)


def _f32_close(found: float, expected: float) -> bool:
    # upstream's required_f32() tolerance
    return abs(found - expected) <= 1e-6 * max(1.0, abs(expected))


def read_shape(h: GGUFHeader) -> ModelShape:
    """The :class:`ModelShape` a ``deepseek4`` header declares, with every key's GGUF type checked
    (docs/model.md §1.1: UINT32 exactly for integers, F32/F64/U32/I32 for floats, BOOL, arrays per
    entry). Raises ModelFormatError listing every problem."""
    pb = _Problems(h.path)
    shape = _read_shape(h, pb)
    for msg in range_problems(shape):
        pb.add(f"metadata value out of range: {msg}")
    pb.raise_if_any()
    return shape


def _read_shape(h: GGUFHeader, pb: _Problems) -> ModelShape:
    p = ARCH + "."
    vals: dict[str, Any] = {}
    for fld, key in METADATA_KEYS.items():
        if fld in ("compress_ratios", "swiglu_clamp"):
            continue
        default = ModelShape.__dataclass_fields__[fld].default
        if fld == "rope_orig_ctx":
            vals[fld] = _get_u32(h, p + key, pb, also=(GGUFValueType.UINT64,))
        elif fld == "expert_weights_norm":
            kv = h.metadata.get(p + key)
            if kv is None:
                pb.add(f"metadata key {p + key} is missing (expected BOOL)")
            elif kv.type != GGUFValueType.BOOL:
                pb.add(f"metadata key {p + key} has type {_desc(kv)}, expected BOOL")
            elif kv.value is not True:
                pb.add(f"metadata key {p + key} is false, expected true (ds4 always normalises expert weights)")
            vals[fld] = True
        elif isinstance(default, float):
            vals[fld] = _get_f32(h, p + key, pb)
        else:
            vals[fld] = _get_u32(h, p + key, pb)
    n_layer = vals.get("n_layer")
    n_check = n_layer if isinstance(n_layer, int) and n_layer > 0 else 0
    ratios = _get_array(h, p + METADATA_KEYS["compress_ratios"], pb, (GGUFValueType.INT32, GGUFValueType.UINT32), n_check)
    if ratios is not None:
        ratios = ratios[:n_check]
        neg = [(i, r) for i, r in enumerate(ratios) if r < 0]
        if neg:
            pb.add(f"metadata key {p}attention.compress_ratios has negative entry {neg[0][1]} at layer {neg[0][0]}")
        vals["compress_ratios"] = tuple(ratios)
    clamp = _get_array(h, p + METADATA_KEYS["swiglu_clamp"], pb, (GGUFValueType.FLOAT32, GGUFValueType.FLOAT64), n_check)
    if clamp is not None and clamp[:n_check]:
        kv = h.metadata[p + METADATA_KEYS["swiglu_clamp"]]
        first = _f32_shortest(clamp[0]) if kv.subtype == GGUFValueType.FLOAT32 else float(clamp[0])
        for il, c in enumerate(clamp[:n_check]):
            if not _f32_close(float(c), first):
                pb.add(f"metadata key {p}swiglu_clamp_exp[{il}] = {c}, expected {first} (the same clamp on every layer)")
                break
        vals["swiglu_clamp"] = first
    vlen = _get_u32(h, p + "attention.value_length", pb)
    if vlen is not None and vals.get("head_dim") is not None and vlen != vals["head_dim"]:
        pb.add(f"metadata key {p}attention.value_length = {vlen}, expected {vals['head_dim']} "
               f"(= attention.key_length: K and V share one vector)")
    for k in ("expert_group_count", "expert_group_used_count"):
        kv = h.metadata.get(p + k)
        # optional; upstream reads a wrong-typed value as 0
        if kv is not None and kv.type == GGUFValueType.UINT32 and kv.value != 0:
            pb.add(f"metadata key {p}{k} = {kv.value}, expected 0 (grouped routing is not used)")
    if any(v is None for v in vals.values()) or "compress_ratios" not in vals or "swiglu_clamp" not in vals:
        pb.raise_if_any()
        raise ModelFormatError(f"{h.path}: incomplete DS4 metadata")
    return ModelShape(**vals)


def _variant(shape: ModelShape, pb: _Problems) -> str:
    """Official variants are recognised by (n_layer, n_embd, n_vocab) and then checked exactly."""
    for name, ref in _OFFICIAL.items():
        if (shape.n_layer, shape.n_embd, shape.n_vocab) != (ref.n_layer, ref.n_embd, ref.n_vocab):
            continue
        p = ARCH + "."
        for fld, key in METADATA_KEYS.items():
            got, want = getattr(shape, fld), getattr(ref, fld)
            if isinstance(want, float):
                if (name == "flash" or fld in _PRO_CHECKED_FLOATS) and not _f32_close(got, want):
                    pb.add(f"metadata key {p}{key} = {got:g}, expected {want:g} for DeepSeek V4 {name.title()}")
            elif got != want:
                if fld == "compress_ratios":
                    bad = next(i for i, (a, b) in enumerate(zip(got, want)) if a != b)
                    pb.add(f"metadata key {p}{key}[{bad}] = {got[bad]}, expected {want[bad]} "
                           f"(the {name.title()} compression pattern)")
                else:
                    pb.add(f"metadata key {p}{key} = {got}, expected {want} for DeepSeek V4 {name.title()}")
        return name
    for msg in shape_problems(shape):
        pb.add(f"custom shape is inconsistent: {msg}")
    return "custom"


# ---------------------------------------------------------------- tensors

def _check_tensors(h: GGUFHeader, shape: ModelShape, pb: _Problems) -> tuple[bool, tuple[str, ...]]:
    specs = tensor_specs(shape)
    has_mtp = any(n.startswith("mtp.0.") for n in h.tensors)
    if has_mtp:
        specs += mtp_tensor_specs(shape)
    known = set()
    for sp in specs:
        known.add(sp.name)
        t = h.tensors.get(sp.name)
        want_types = "/".join(type_name(x) for x in sp.types) if sp.types != ROUTED_TYPES else "IQ2_XXS/Q2_K/Q4_K"
        if t is None:
            if sp.required:
                pb.add(f"tensor {sp.name} is missing (expected {want_types} {list(sp.dims)})")
            continue
        if t.dims != sp.dims:
            pb.add(f"tensor {sp.name} has dims {list(t.dims)}, expected {list(sp.dims)}")
        if t.type not in sp.types:
            pb.add(f"tensor {sp.name} has type {type_name(t.type)}, expected {want_types}")
    prefixes = [f"blk.{il}" for il in range(shape.n_layer)] + (["mtp.0"] if has_mtp else [])
    for p in prefixes:
        g, u = h.tensors.get(f"{p}.ffn_gate_exps.weight"), h.tensors.get(f"{p}.ffn_up_exps.weight")
        if g is not None and u is not None and g.type != u.type:
            pb.add(f"tensor {p}.ffn_up_exps.weight has type {type_name(u.type)}, expected {type_name(g.type)} "
                   f"(the type of ffn_gate_exps)")
    extra = tuple(n for n in h.tensor_order if n not in known)
    return has_mtp, extra


# ---------------------------------------------------------------- summaries

def _tokenizer_summary(h: GGUFHeader) -> TokenizerSummary:
    def val(key: str, types: tuple[GGUFValueType, ...]) -> Any:
        kv = h.metadata.get(key)
        return kv.value if kv is not None and kv.type in types else None

    toks_kv = h.metadata.get("tokenizer.ggml.tokens")
    tokens = toks_kv.value if toks_kv is not None and toks_kv.is_array and toks_kv.subtype == GGUFValueType.STRING else []
    merges_kv = h.metadata.get("tokenizer.ggml.merges")
    n_merges = len(merges_kv.value) if merges_kv is not None and merges_kv.is_array else 0
    index: dict[str, int] = {}
    wanted = set(_SPECIAL_TOKENS.values())
    for i, t in enumerate(tokens):
        if t in wanted and t not in index:
            index[t] = i
    special = {role: index[s] for role, s in _SPECIAL_TOKENS.items() if s in index}
    missing = tuple(s for s in _SPECIAL_TOKENS.values() if s not in index)
    return TokenizerSummary(
        model=val("tokenizer.ggml.model", (GGUFValueType.STRING,)),
        pre=val("tokenizer.ggml.pre", (GGUFValueType.STRING,)),
        n_tokens=len(tokens), n_merges=n_merges,
        bos_id=val("tokenizer.ggml.bos_token_id", _INT_TYPES),
        eos_id=val("tokenizer.ggml.eos_token_id", _INT_TYPES),
        add_bos_token=val("tokenizer.ggml.add_bos_token", (GGUFValueType.BOOL,)),
        special_ids=special, missing_specials=missing)


def _metadata_values(h: GGUFHeader) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, kv in h.metadata.items():
        if kv.is_array and (len(kv.value) > _BIG_ARRAY or k.startswith("tokenizer.ggml.")):
            continue  # vocabularies are summarised in ModelInfo.tokenizer
        out[k] = list(kv.value) if kv.is_array else kv.value
    return out


def _tensor_infos(h: GGUFHeader) -> dict[str, TensorInfo]:
    return {n: TensorInfo(t.name, t.type, t.type_name, t.dims, t.offset, t.nbytes)
            for n, t in ((n, h.tensors[n]) for n in h.tensor_order)}


def _mla_info(h: GGUFHeader, ctx: int) -> MLAInfo | None:
    a = h.value("general.architecture")
    def u(key: str) -> int | None:
        kv = h.metadata.get(f"{a}.{key}")
        return int(kv.value) if kv is not None and kv.type in _INT_TYPES else None
    n_layer, n_head, rank, rope = u("block_count"), u("attention.head_count"), u("attention.kv_lora_rank"), u("rope.dimension_count")
    if None in (n_layer, n_head, rank, rope):
        return None
    # newer converters store the MLA head sizes under *_mla and key_length = rank + rope
    k_len = u("attention.key_length_mla") or u("attention.key_length")
    v_len = u("attention.value_length_mla") or u("attention.value_length")
    if k_len is None or v_len is None:
        return None
    assert n_layer is not None and n_head is not None and rank is not None and rope is not None
    nope = k_len - rope
    split = all(f"blk.{il}.attn_k_b.weight" in h.tensors and f"blk.{il}.attn_v_b.weight" in h.tensors
                for il in range(n_layer))
    legacy = all(f"blk.{il}.attn_kv_b.weight" in h.tensors for il in range(n_layer))
    f16 = 2
    return MLAInfo(
        n_layer=n_layer, n_head=n_head, kv_lora_rank=rank, rope_dim=rope, nope_dim=nope, v_head_dim=v_len,
        split_kv_b=split, legacy_kv_b=legacy, ctx=ctx,
        latent_kv_bytes=n_layer * ctx * (rank + rope) * f16,
        legacy_k_bytes=n_layer * ctx * n_head * (nope + rope) * f16,
        legacy_v_bytes=n_layer * ctx * n_head * v_len * f16)


def _deepseek2_variant(h: GGUFHeader) -> str:
    a = h.value("general.architecture")
    key = (h.value(f"{a}.block_count"), h.value(f"{a}.embedding_length"))
    return {(27, 2048): "deepseek-v2-lite", (60, 5120): "deepseek-v2", (61, 7168): "deepseek-v3"}.get(key, "deepseek2")


def _param_counts(tensors: dict[str, TensorInfo], shape: ModelShape | None) -> tuple[int, int]:
    total = sum(t.n_elements for t in tensors.values())
    if shape is None:
        return total, total
    main = routed = 0
    for n, t in tensors.items():
        if n.startswith("mtp."):
            continue
        main += t.n_elements
        if n.endswith("_exps.weight"):
            routed += t.n_elements
    # a token runs n_expert_used of n_expert routed experts; the MTP block is not part of decode
    active = main - routed + routed * shape.n_expert_used // shape.n_expert
    return total, active


# ---------------------------------------------------------------- entry point

def inspect(path: str | os.PathLike[str], ctx: int | None = None, strict: bool = False) -> ModelInfo:
    """Read and validate the GGUF file at ``path`` (header only; no tensor data is read).

    ``ctx`` sizes the memory plan (default 32768). ``strict`` refuses anything but an official
    DeepSeek V4 Flash or Pro. A ``deepseek4`` file that breaks any layout rule raises
    :class:`ModelFormatError`; other architectures are described (``shape`` None) and refused
    later by the engine via :meth:`ModelInfo.check_supported`.
    """
    path = Path(path)
    h = read_header(path)
    ctx_n = DEFAULT_CTX if ctx is None else int(ctx)
    if ctx_n < 1:
        from .errors import InvalidArgumentError
        raise InvalidArgumentError(f"ctx must be at least 1, got {ctx_n}")
    arch_kv = h.metadata.get("general.architecture")
    if arch_kv is None or arch_kv.type != GGUFValueType.STRING:
        raise ModelFormatError(f"{path}: metadata key general.architecture is missing or not a string")
    arch = arch_kv.value
    tensors = _tensor_infos(h)
    weights = sum(t.nbytes for t in tensors.values())
    tok = _tokenizer_summary(h)
    common = dict(path=path, arch=arch, tensors=tensors, weights_bytes=weights, metadata=_metadata_values(h),
                  tokenizer=tok, file_size=h.file_size, gguf_version=h.version, alignment=h.alignment,
                  data_offset=h.data_offset)
    if arch != ARCH:
        if strict:
            raise ModelFormatError(f"{path}: general.architecture is {arch!r}, expected {ARCH!r} (strict)")
        n, _ = _param_counts(tensors, None)
        mla = _mla_info(h, ctx_n) if arch == "deepseek2" else None
        return ModelInfo(variant=_deepseek2_variant(h) if arch == "deepseek2" else arch, shape=None,
                         routed_bits=0, expert_types={}, has_mtp=False, hash_layers=(), compress_ratios=(),
                         n_params=n, n_params_active=n, memory=None, mla=mla, **common)  # type: ignore[arg-type]

    pb = _Problems(path)
    shape = _read_shape(h, pb)
    # Ranges first: every later step (the variant check, the tensor inventory) loops over these.
    for msg in range_problems(shape):
        pb.add(f"metadata value out of range: {msg}")
    pb.raise_if_any()
    variant = _variant(shape, pb)
    if strict and variant == "custom":
        pb.add(f"strict mode accepts only DeepSeek V4 Flash or Pro; this is a custom shape "
               f"({shape.n_layer} layers, embd {shape.n_embd}, vocab {shape.n_vocab})")
    pb.raise_if_any()
    has_mtp, extra = _check_tensors(h, shape, pb)
    for role, s in _SPECIAL_TOKENS.items():
        if s in tok.missing_specials:
            pb.add(f"tokenizer.ggml.tokens lacks the {role} token {s!r}")
    if tok.n_tokens and tok.n_tokens != shape.n_vocab:
        pb.add(f"tokenizer.ggml.tokens has {tok.n_tokens} entries, expected {shape.n_vocab} (vocab_size)")
    if not tok.n_tokens:
        pb.add("metadata key tokenizer.ggml.tokens is missing or not an array of strings")
    if not tok.n_merges:
        pb.add("metadata key tokenizer.ggml.merges is missing or empty")
    pb.raise_if_any()
    gate = tensors["blk.0.ffn_gate_exps.weight"]
    expert_types = {k: tensors[f"blk.0.ffn_{k}_exps.weight"].type_name for k in ("gate", "up", "down")}
    n_params, n_active = _param_counts(tensors, shape)
    return ModelInfo(
        variant=variant, shape=shape,
        routed_bits=4 if gate.type == GGMLType.Q4_K else 2, expert_types=expert_types, has_mtp=has_mtp,
        hash_layers=tuple(il for il in range(shape.n_layer) if f"blk.{il}.ffn_gate_tid2eid.weight" in tensors),
        compress_ratios=shape.compress_ratios, n_params=n_params, n_params_active=n_active,
        memory=memory_plan(shape, ctx_n, weights), extra_tensors=extra, **common)  # type: ignore[arg-type]
