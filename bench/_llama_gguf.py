"""Convert a ds4 GGUF into one llama.cpp's deepseek4 loader accepts (for bench/llama_peer.py).

The tensors are copied byte for byte; only three metadata details differ between what ds4 (and
upstream's files) carry and what llama.cpp's loader insists on, plus one it silently defaults:

1. ``deepseek4.rope.scaling.original_context_length`` must be a UINT32 (some files store another
   integer type; llama.cpp's typed getter rejects anything else).
2. ``deepseek4.expert_gating_func`` must exist and be 4 (sqrt-softplus, llama.cpp's
   ``LLAMA_EXPERT_GATING_FUNC_TYPE_SQRT_SOFTPLUS``): ds4 implies the gating, llama.cpp reads it.
3. Hash-routed layers (``blk.N`` with N < ``deepseek4.hash_layer_count``) route through
   ``ffn_gate_tid2eid`` and must not carry an ``exp_probs_b`` bias: llama.cpp counts every tensor
   in the file and fails on one it did not bind.
4. ``deepseek4.rope.scaling.type`` is added as "yarn" when missing (ds4's synthetic files lack it).
   ds4 hard-wires YaRN on the compressed layers and reads no scaling-type key; llama.cpp reads it
   and, without it, applies *linear* scaling there: it would load and run, but a different model
   (measured on `tiny`: the last-position logits differed by 0.1 relative RMS without the key).

The output is written to a temp file next to the target and renamed into place (never a partial
file under the final name).
"""

from __future__ import annotations

import os
from pathlib import Path

import gguf

from ds4._atomic import temp_path

__all__ = ["convert_for_llama", "llama_fixes"]

ARCH = "deepseek4"
ORIG_CTX_KEY = f"{ARCH}.rope.scaling.original_context_length"
GATING_KEY = f"{ARCH}.expert_gating_func"
HASH_LAYERS_KEY = f"{ARCH}.hash_layer_count"
GATING_SQRT_SOFTPLUS = 4  # llama.cpp's LLAMA_EXPERT_GATING_FUNC_TYPE_SQRT_SOFTPLUS
ROPE_TYPE_KEY = f"{ARCH}.rope.scaling.type"


def _hash_bias_names(reader: gguf.GGUFReader) -> set[str]:
    field = reader.get_field(HASH_LAYERS_KEY)
    n_hash = int(field.contents()) if field is not None else 0
    return {f"blk.{il}.exp_probs_b.bias" for il in range(n_hash)}


def llama_fixes(reader: gguf.GGUFReader) -> list[str]:
    """What :func:`convert_for_llama` changes in this file, in words (empty: nothing to fix)."""
    out = []
    f = reader.get_field(ORIG_CTX_KEY)
    if f is not None and f.types[0] != gguf.GGUFValueType.UINT32:
        out.append(f"{ORIG_CTX_KEY}: {f.types[0].name} -> UINT32")
    g = reader.get_field(GATING_KEY)
    if g is None or int(g.contents()) != GATING_SQRT_SOFTPLUS:
        out.append(f"{GATING_KEY} = {GATING_SQRT_SOFTPLUS} (UINT32)")
    if reader.get_field(ROPE_TYPE_KEY) is None:
        out.append(f'{ROPE_TYPE_KEY} = "yarn"')
    drop = sorted(_hash_bias_names(reader) & {t.name for t in reader.tensors})
    if drop:
        out.append(f"dropped {', '.join(drop)} (hash-routed layers)")
    return out


def convert_for_llama(src: Path, dst: Path) -> list[str]:
    """Write ``dst``: ``src`` with the llama.cpp metadata fixes. Returns the fixes applied."""
    reader = gguf.GGUFReader(src)
    arch = reader.get_field(gguf.Keys.General.ARCHITECTURE)
    if arch is None or arch.contents() != ARCH:
        raise ValueError(f"{src}: general.architecture is {arch.contents() if arch else None!r}, expected {ARCH!r}")
    fixes = llama_fixes(reader)
    drop = _hash_bias_names(reader)
    tensors = [t for t in reader.tensors if t.name not in drop]

    tmp = temp_path(Path(dst))
    try:
        writer = gguf.GGUFWriter(tmp, ARCH)
        for field in reader.fields.values():
            name = field.name
            if name.startswith("GGUF.") or name in (gguf.Keys.General.ARCHITECTURE, GATING_KEY):
                continue  # the writer writes the header and architecture itself; gating is re-added below
            if name == gguf.Keys.General.ALIGNMENT:
                writer.add_custom_alignment(int(field.contents()))  # also sets the data padding
                continue
            vtype = field.types[0]
            if name == ORIG_CTX_KEY:
                writer.add_uint32(name, int(field.contents()))
                continue
            sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
            writer.add_key_value(name, field.contents(), vtype, sub_type=sub)
        writer.add_uint32(GATING_KEY, GATING_SQRT_SOFTPLUS)
        if reader.get_field(ROPE_TYPE_KEY) is None:
            writer.add_string(ROPE_TYPE_KEY, "yarn")
        for t in tensors:
            writer.add_tensor_info(t.name, t.data.shape, t.data.dtype, t.data.nbytes, t.tensor_type)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        for t in tensors:
            writer.write_tensor_data(t.data, tensor_endianess=reader.endianess)
        writer.close()
        os.replace(tmp, dst)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return fixes
