"""A small Python host for the Metal kernels: argument structs, grid sizes and buffer bindings
for each op, the way the Objective-C++ host binds them (issue 12 ports this to C++). Tests call
these with a runner that checks three thread orders; tools can use the plain one.

A runner is ``run(kernel, buffers=[...], outputs=[i...], **dispatch_kw) -> [arrays]``.
"""

from __future__ import annotations

from functools import partial
from typing import Callable

import numpy as np

from .runtime import Buffer, Library, run_orders

__all__ = ["checked", "direct", "QTYPES", "act_bytes", "quantize_act", "matvec", "matmul", "dequantize", "rms_norm"]

Runner = Callable[..., list]

# GGML type id -> (kernel suffix, block elements, block bytes, activation format)
QTYPES = {
    0: ("f32", 1, 4, "f32"),
    1: ("f16", 1, 2, "f32"),
    8: ("q8_0", 32, 34, "q8_0"),
    10: ("q2_k", 256, 84, "q8_k"),
    12: ("q4_k", 256, 144, "q8_k"),
    16: ("iq2_xxs", 256, 66, "q8_k"),
    30: ("bf16", 1, 2, "f32"),
}
_ACT_BLOCK = {"q8_0": (32, 36), "q8_k": (256, 292), "f32": (1, 4)}

MV_ROWS = 4            # rows per simdgroup in matvec.metal
MV_SIMDGROUPS = 2      # simdgroups per threadgroup the host picks


def checked(lib: Library) -> Runner:
    """Every dispatch under forward, reverse and shuffled orders; any bit difference is a RaceError."""
    return partial(run_orders, lib)


def direct(lib: Library) -> Runner:
    def run(kernel, *, buffers, outputs, poison=None, **kw):
        lib.dispatch(kernel, buffers=buffers, poison=outputs if poison is None else poison, **kw)
        return [buffers[i] for i in outputs]
    return run


def _struct(**fields) -> bytes:
    dt = np.dtype([(k, "<f4" if isinstance(v, float) else "<u4") for k, v in fields.items()])
    return np.array([tuple(fields.values())], dtype=dt).tobytes()


def act_bytes(qtype: int, n: int) -> int:
    elems, size = _ACT_BLOCK[QTYPES[qtype][3]]
    return n // elems * size


def quantize_act(run: Runner, qtype: int, x: np.ndarray) -> np.ndarray:
    """The activation rows a `qtype` weight consumes, as bytes [rows, act_bytes] (F16/BF16/F32: floats)."""
    x = np.ascontiguousarray(x, dtype=np.float32).reshape(-1, x.shape[-1])
    rows, n = x.shape
    fmt = QTYPES[qtype][3]
    if fmt == "f32":
        return x.view(np.uint8).reshape(rows, n * 4).copy()
    elems, _ = _ACT_BLOCK[fmt]
    ab = act_bytes(qtype, n)
    out = np.zeros((rows, ab), np.uint8)
    kernel = "quantize_q8_0_act" if fmt == "q8_0" else "quantize_q8_k"
    return run(kernel, buffers=[_struct(n=n, act_bytes=ab), x, out], outputs=[2], grid=(n // elems, rows, 1),
               threads=(32, 1, 1))[0]


def _linear_operands(qtype: int, raw: np.ndarray, shape: tuple[int, int], xq: np.ndarray):
    """(kernel suffix, rows, tokens, [args, weights, activations, output]) shared by matvec and matmul."""
    n, rows = shape
    suffix, elems, bsize, _ = QTYPES[qtype]
    xq = np.ascontiguousarray(xq).reshape(-1, xq.shape[-1])
    n_tok = xq.shape[0]
    w = np.ascontiguousarray(raw).view(np.uint8).reshape(-1)
    y = np.zeros((n_tok, rows), np.float32)
    args = _struct(n=n, rows=rows, row_bytes=n // elems * bsize, n_tok=n_tok, act_bytes=xq.shape[1], y_stride=rows)
    return suffix, rows, n_tok, [args, w, xq, y]


def matvec(run: Runner, qtype: int, raw: np.ndarray, shape: tuple[int, int], xq: np.ndarray) -> np.ndarray:
    """y[tok, row] = dot(W row, activation tok) with `xq` from quantize_act (rows = shape[1])."""
    suffix, rows, n_tok, buffers = _linear_operands(qtype, raw, shape, xq)
    per_group = MV_ROWS * MV_SIMDGROUPS
    return run(f"matvec_{suffix}", buffers=buffers, outputs=[3],
               grid=(-(-rows // per_group), n_tok, 1), threads=(32 * MV_SIMDGROUPS, 1, 1))[0]


def rms_norm(run: Runner, x: np.ndarray, w: np.ndarray | None, eps: float, threads: int = 256) -> np.ndarray:
    """Per-row RMS norm (weighted when `w` is given): one threadgroup per row."""
    x = np.ascontiguousarray(x, dtype=np.float32).reshape(-1, x.shape[-1])
    rows, n = x.shape
    y = np.zeros_like(x)
    wbuf = np.ascontiguousarray(w, dtype=np.float32) if w is not None else np.zeros(1, np.float32)
    return run("rms_norm_f32", buffers=[_struct(n=n, in_stride=n, out_stride=n, eps=float(eps)), x, wbuf, y],
               outputs=[3], grid=(rows, 1, 1), threads=(threads, 1, 1), tg_mem=[128],
               constants={0: w is not None})[0]


def matmul(run: Runner, qtype: int, raw: np.ndarray, shape: tuple[int, int], xq: np.ndarray) -> np.ndarray:
    """Prefill Y[tok, row] with simdgroup-matrix tiles (same operands as matvec)."""
    suffix, rows, n_tok, buffers = _linear_operands(qtype, raw, shape, xq)
    return run(f"matmul_{suffix}", buffers=buffers, outputs=[3], grid=(-(-rows // 32), -(-n_tok // 32), 1),
               threads=(128, 1, 1), tg_mem=[2 * 32 * 32 * 4])[0]


def dequantize(run: Runner, qtype: int, raw: np.ndarray, shape: tuple[int, int]) -> np.ndarray:
    """[rows, n] floats: the values the mat-mat tile loaders produce."""
    n, rows = shape
    _, elems, bsize, _ = QTYPES[qtype]
    w = np.ascontiguousarray(raw).view(np.uint8).reshape(-1)
    out = np.zeros((rows, n), np.float32)
    args = _struct(n=n, rows=rows, row_bytes=n // elems * bsize, n_tok=0, act_bytes=0, y_stride=0)
    return run("dequantize_rows", buffers=[args, w, out], outputs=[2], grid=(-(-n // 8), rows, 1), threads=(8, 4, 1),
               grid_is_threads=True, constants={0: qtype})[0]


def fp8_kv_roundtrip(run: Runner, x: np.ndarray, n_rot: int) -> np.ndarray:
    """FP8 E4M3 round trip of dims [0, head_dim - n_rot) of each row, in blocks of 64."""
    x = np.ascontiguousarray(x, dtype=np.float32).reshape(-1, x.shape[-1]).copy()
    rows, head_dim = x.shape
    return run("fp8_kv_roundtrip", buffers=[_struct(n=head_dim - n_rot, row_stride=head_dim), x], outputs=[1], poison=(),
               grid=((head_dim - n_rot) // 64, rows, 1), threads=(32, 1, 1))[0]


def fp4_roundtrip(run: Runner, x: np.ndarray) -> np.ndarray:
    x = np.ascontiguousarray(x, dtype=np.float32).reshape(-1, x.shape[-1]).copy()
    rows, n = x.shape
    return run("fp4_roundtrip", buffers=[_struct(n=n, row_stride=n), x], outputs=[1], poison=(),
               grid=(n // 32, rows, 1), threads=(32, 1, 1))[0]


def indexer_qat(run: Runner, x: np.ndarray) -> np.ndarray:
    """Hadamard-128 then FP4 on rows of 128."""
    x = np.ascontiguousarray(x, dtype=np.float32).reshape(-1, 128).copy()
    return run("indexer_qat", buffers=[_struct(n=128, row_stride=128), x], outputs=[1], poison=(),
               grid=(1, x.shape[0], 1), threads=(32, 1, 1))[0]


def rope_tail(run: Runner, x: np.ndarray, n_head: int, head_dim: int, n_rot: int, pos0: int, *,
              freq_scale: float, ext_factor: float, attn_factor: float, corr_low: float, corr_high: float,
              theta_scale: float, mscale_ext: float, inverse: bool = False) -> np.ndarray:
    """RoPE (or its inverse) on rows of n_head * head_dim; row r at position pos0 + r. The float
    parameters are the CPU's RopeParams fields (csrc/model/rope_params.h)."""
    x = np.ascontiguousarray(x, dtype=np.float32).reshape(-1, n_head * head_dim).copy()
    dt = np.dtype([(k, "<u4") for k in ("n_head", "head_dim", "n_rot", "pos0")] +
                  [(k, "<f4") for k in ("freq_scale", "ext_factor", "attn_factor", "corr_low", "corr_high",
                                        "theta_scale", "mscale_ext", "sin_sign")])
    args = np.array([(n_head, head_dim, n_rot, pos0, freq_scale, ext_factor, attn_factor, corr_low, corr_high,
                      theta_scale, mscale_ext, -1.0 if inverse else 1.0)], dtype=dt).tobytes()
    return run("rope_tail", buffers=[args, x], outputs=[1], poison=(), grid=(n_rot // 2, n_head, x.shape[0]),
               threads=(min(32, n_rot // 2), 1, 1), grid_is_threads=True)[0]


def swiglu(run: Runner, g: np.ndarray, u: np.ndarray, clamp: float, scale: float = 1.0) -> np.ndarray:
    g = np.ascontiguousarray(g, dtype=np.float32).reshape(-1)
    u = np.ascontiguousarray(u, dtype=np.float32).reshape(-1)
    out = np.zeros_like(g)
    return run("swiglu", buffers=[_struct(n=g.size, clamp=float(clamp), scale=float(scale)), g, u, out],
               outputs=[3], grid=(g.size, 1, 1), threads=(64, 1, 1), grid_is_threads=True)[0]


def attention(run: Runner, q: np.ndarray, raw: np.ndarray, n_raw: int, raw_first: int, comp: np.ndarray,
              mask: np.ndarray | None, sinks: np.ndarray, n_head: int, head_dim: int,
              simdgroups: int = 4) -> np.ndarray:
    """Sink attention of every head over the raw ring (raw_cap rows, n_raw live from raw_first)
    then the compressed rows (all, or those with mask != 0)."""
    if head_dim % 32 or head_dim > 512:
        raise ValueError(f"attention_decode needs head_dim a multiple of 32 up to 512, got {head_dim}")
    q = np.ascontiguousarray(q, dtype=np.float32).reshape(-1)
    raw = np.ascontiguousarray(raw, dtype=np.float32).reshape(-1, head_dim)
    comp = np.ascontiguousarray(comp, dtype=np.float32).reshape(-1, head_dim)
    n_comp = comp.shape[0]
    comp_buf = comp if n_comp else np.zeros((1, head_dim), np.float32)
    mask_buf = (np.ascontiguousarray(mask, dtype=np.uint8) if mask is not None and n_comp
                else np.zeros(max(1, n_comp), np.uint8))
    out = np.zeros(n_head * head_dim, np.float32)
    args = _struct(n_head=n_head, head_dim=head_dim, raw_cap=raw.shape[0], n_raw=n_raw, raw_first=raw_first,
                   n_comp=n_comp, scale=float(np.float32(1.0) / np.sqrt(np.float32(head_dim))))
    tg = -(-simdgroups * (head_dim + 2) * 4 // 16) * 16
    return run("attention_decode", buffers=[args, q, raw, comp_buf, mask_buf, np.ascontiguousarray(sinks, np.float32),
                                            out], outputs=[6], grid=(n_head, 1, 1), threads=(32 * simdgroups, 1, 1),
               tg_mem=[tg], constants={0: mask is not None})[0]


def hc_split(run: Runner, mix: np.ndarray, scale: np.ndarray, base: np.ndarray, n_hc: int, iters: int,
             eps: float) -> np.ndarray:
    """Split rows [tokens, 2n + n^2] (pre, post, comb[src*n + dst]) from mix rows [tokens, >= 2n + n^2]."""
    if n_hc * n_hc > 32:
        raise ValueError(f"hc_split_sinkhorn runs n_hc^2 <= 32 entries in one simdgroup, got n_hc={n_hc}")
    mix = np.ascontiguousarray(mix, dtype=np.float32).reshape(-1, mix.shape[-1])
    out = np.zeros((mix.shape[0], 2 * n_hc + n_hc * n_hc), np.float32)
    args = _struct(n_hc=n_hc, n_embd=0, iters=iters, eps=float(eps), mix_stride=mix.shape[1])
    return run("hc_split_sinkhorn", buffers=[args, mix, np.ascontiguousarray(scale, np.float32),
                                             np.ascontiguousarray(base, np.float32), out], outputs=[4],
               grid=(mix.shape[0], 1, 1), threads=(32, 1, 1))[0]


def hc_weighted_sum(run: Runner, H: np.ndarray, split: np.ndarray, n_hc: int, n_embd: int) -> np.ndarray:
    H = np.ascontiguousarray(H, dtype=np.float32).reshape(-1, n_hc * n_embd)
    x = np.zeros((H.shape[0], n_embd), np.float32)
    args = _struct(n_hc=n_hc, n_embd=n_embd, iters=0, eps=0.0, mix_stride=0)
    return run("hc_weighted_sum", buffers=[args, H, np.ascontiguousarray(split, np.float32), x], outputs=[3],
               grid=(n_embd, H.shape[0], 1), threads=(64, 1, 1), grid_is_threads=True)[0]


def hc_post(run: Runner, block: np.ndarray, residual: np.ndarray, split: np.ndarray, n_hc: int) -> np.ndarray:
    block = np.ascontiguousarray(block, dtype=np.float32).reshape(-1, block.shape[-1])
    tokens, n_embd = block.shape
    residual = np.ascontiguousarray(residual, dtype=np.float32).reshape(tokens, n_hc * n_embd)
    out = np.zeros_like(residual)
    args = _struct(n_hc=n_hc, n_embd=n_embd, iters=0, eps=0.0, mix_stride=0)
    return run("hc_post", buffers=[args, block, residual, np.ascontiguousarray(split, np.float32), out], outputs=[4],
               grid=(n_embd, n_hc, tokens), threads=(64, 1, 1), grid_is_threads=True)[0]


def indexer_scores(run: Runner, q: np.ndarray, w: np.ndarray, rows: np.ndarray, n_head: int, head_dim: int,
                   simdgroups: int = 2) -> np.ndarray:
    """Scores of `rows` [n_rows, head_dim] against prepared queries q [n_head, head_dim] and head
    weights w [n_head] (scaled by 1/sqrt(head_dim * n_head) inside)."""
    if head_dim % 32 or head_dim > 256:
        raise ValueError(f"indexer_scores needs head_dim a multiple of 32 up to 256, got {head_dim}")
    rows = np.ascontiguousarray(rows, dtype=np.float32).reshape(-1, head_dim)
    n_rows = rows.shape[0]
    scores = np.zeros(n_rows, np.float32)
    w_scale = float(np.float32(1.0) / np.sqrt(np.float32(head_dim * n_head)))
    return run("indexer_scores", buffers=[_struct(n_rows=n_rows, n_head=n_head, head_dim=head_dim, w_scale=w_scale),
                                          np.ascontiguousarray(q, np.float32).reshape(-1),
                                          np.ascontiguousarray(w, np.float32), rows, scores], outputs=[4],
               grid=(-(-n_rows // simdgroups), 1, 1), threads=(32 * simdgroups, 1, 1))[0]


def indexer_weights_scale(run: Runner, w: np.ndarray, scale: float) -> np.ndarray:
    """The head weights times `scale` (float32), as the indexer op leaves them."""
    w = np.ascontiguousarray(w, dtype=np.float32).reshape(-1).copy()
    return run("indexer_weights_scale", buffers=[_struct(n=w.size, value=float(scale)), w], outputs=[1], poison=(),
               grid=(w.size, 1, 1), threads=(min(64, w.size), 1, 1), grid_is_threads=True)[0]


def top_k_mask(run: Runner, scores: np.ndarray, k: int) -> np.ndarray:
    scores = np.ascontiguousarray(scores, dtype=np.float32)
    mask = np.zeros(scores.size, np.uint8)
    threads = 128   # one threadgroup does the whole selection (any whole number of simdgroups)
    return run("top_k_mask", buffers=[_struct(n=scores.size, k=k), scores, mask], outputs=[2],
               grid=(1, 1, 1), threads=(threads, 1, 1), tg_mem=[4 * threads // 32])[0]


def compressor_pool_state(run: Runner, kv: np.ndarray, score: np.ndarray, head_dim: int, ratio: int) -> np.ndarray:
    """Pooled row [head_dim] of a compressor frontier (kv/score: [rows, coff*head_dim])."""
    kv = np.ascontiguousarray(kv, dtype=np.float32)
    score = np.ascontiguousarray(score, dtype=np.float32)
    out = np.zeros(head_dim, np.float32)
    return run("compressor_pool_state", buffers=[_struct(head_dim=head_dim, ratio=ratio, width=kv.shape[1]), kv,
                                                 score, out], outputs=[3], grid=(head_dim, 1, 1),
               threads=(min(64, head_dim), 1, 1), grid_is_threads=True, constants={0: ratio == 4})[0]


def matvec_experts(run: Runner, qtype: int, raw: np.ndarray, shape: tuple[int, int, int], ids: np.ndarray,
                   xq: np.ndarray) -> np.ndarray:
    """y[s] = expert ids[s] (of shape (n, rows, n_expert)) times activation row s of xq, or of
    its only row when xq has one row (shared activation)."""
    n, rows, n_expert = shape
    suffix, elems, bsize, _ = QTYPES[qtype]
    xq = np.ascontiguousarray(xq).reshape(-1, xq.shape[-1])
    ids = np.ascontiguousarray(ids, dtype=np.int32)
    k = ids.size
    row_bytes = n // elems * bsize
    y = np.zeros((k, rows), np.float32)
    args = _struct(n=n, rows=rows, row_bytes=row_bytes, n_slots=k, expert_bytes=row_bytes * rows,
                   x_slot_bytes=0 if xq.shape[0] == 1 else xq.shape[1], n_expert=n_expert,
                   slots_per_x=1)
    per_group = MV_ROWS * MV_SIMDGROUPS
    return run(f"matvec_experts_{suffix}", buffers=[args, np.ascontiguousarray(raw).view(np.uint8).reshape(-1), xq,
                                                    ids, y], outputs=[4],
               grid=(-(-rows // per_group), k, 1), threads=(32 * MV_SIMDGROUPS, 1, 1))[0]


def router(run: Runner, logits: np.ndarray, bias: np.ndarray | None, hash_table: np.ndarray | None,
           tokens: np.ndarray | None, n_used: int, weight_scale: float) -> tuple[np.ndarray, np.ndarray]:
    """(sel [tokens, n_used] int32, weights [tokens, n_used]) from logits [tokens, n_expert];
    hash_table [n_vocab, n_used] with the tokens' ids selects hash routing."""
    logits = np.ascontiguousarray(logits, dtype=np.float32).reshape(-1, logits.shape[-1])
    n_tok, n_expert = logits.shape
    if n_expert > 1024:
        raise ValueError(f"router runs one thread per expert: n_expert must be at most 1024, got {n_expert}")
    b = np.ascontiguousarray(bias, np.float32) if bias is not None else np.zeros(n_expert, np.float32)
    h = np.ascontiguousarray(hash_table, np.int32) if hash_table is not None else np.zeros((1,), np.int32)
    toks = np.ascontiguousarray(tokens, np.int32) if tokens is not None else np.zeros(n_tok, np.int32)
    sel = np.zeros((n_tok, n_used), np.int32)
    w = np.zeros((n_tok, n_used), np.float32)
    tg = -(-(2 * n_expert + n_used) * 4 // 16) * 16
    out = run("router", buffers=[_struct(n_expert=n_expert, n_used=n_used, weight_scale=float(weight_scale)), logits,
                                 b, h, sel, w, toks], outputs=[4, 5], grid=(n_tok, 1, 1), threads=(n_expert, 1, 1),
              tg_mem=[tg], constants={0: hash_table is not None})
    return out[0], out[1]


def add(run: Runner, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a = np.ascontiguousarray(a, np.float32).reshape(-1)
    out = np.zeros_like(a)
    return run("add_f32", buffers=[_struct(n=a.size, value=0.0), a, np.ascontiguousarray(b, np.float32).reshape(-1),
                                   out], outputs=[3], grid=(a.size, 1, 1), threads=(64, 1, 1), grid_is_threads=True)[0]


def fill(run: Runner, n: int, value: float) -> np.ndarray:
    out = np.zeros(n, np.float32)
    return run("fill_f32", buffers=[_struct(n=n, value=float(value)), out], outputs=[1], grid=(n, 1, 1),
               threads=(64, 1, 1), grid_is_threads=True)[0]


def store_row_f16(run: Runner, src: np.ndarray) -> np.ndarray:
    src = np.ascontiguousarray(src, np.float32).reshape(-1)
    out = np.zeros_like(src)
    return run("store_row_f16", buffers=[_struct(n=src.size, value=0.0), src, out], outputs=[2],
               grid=(src.size, 1, 1), threads=(64, 1, 1), grid_is_threads=True)[0]


def argmax(run: Runner, x: np.ndarray, threads: int = 256) -> int:
    x = np.ascontiguousarray(x, np.float32).reshape(-1)
    res = np.zeros(1, np.int32)
    return int(run("argmax_f32", buffers=[_struct(n=x.size, value=0.0), x, res], outputs=[2], grid=(1, 1, 1),
                   threads=(threads, 1, 1), tg_mem=[256])[0][0])


def compressor_store(run: Runner, ape_row: np.ndarray, kv_cur: np.ndarray, score_cur: np.ndarray,
                     state_kv: np.ndarray, state_score: np.ndarray, row: int):
    """(score_cur + ape, state_kv, state_score) after writing frontier row `row`."""
    width = kv_cur.size
    args = np.array([(width, row, 0)], dtype=[("w", "<u4"), ("r", "<u4"), ("s", "<u4")]).tobytes()
    bufs = [args, np.ascontiguousarray(ape_row, np.float32), np.ascontiguousarray(kv_cur, np.float32),
            np.ascontiguousarray(score_cur, np.float32).copy(), np.ascontiguousarray(state_kv, np.float32).copy(),
            np.ascontiguousarray(state_score, np.float32).copy()]
    return run("compressor_store", buffers=bufs, outputs=[3, 4, 5], poison=(), grid=(width, 1, 1),
               threads=(64, 1, 1), grid_is_threads=True)


def compressor_shift(run: Runner, state_kv: np.ndarray, state_score: np.ndarray):
    width = state_kv.shape[1]
    args = np.array([(width, 0, 4)], dtype=[("w", "<u4"), ("r", "<u4"), ("s", "<u4")]).tobytes()
    return run("compressor_shift", buffers=[args, np.ascontiguousarray(state_kv, np.float32).copy(),
                                            np.ascontiguousarray(state_score, np.float32).copy()],
               outputs=[1, 2], poison=(), grid=(width, 4, 1), threads=(64, 1, 1), grid_is_threads=True)


def embed_rows_hc(run: Runner, qtype: int, table: np.ndarray, shape: tuple[int, int], tokens, n_hc: int) -> np.ndarray:
    n_embd, n_vocab = shape
    _, elems, bsize, _ = QTYPES[qtype]
    tokens = np.ascontiguousarray(tokens, np.int32)
    out = np.zeros((tokens.size, n_hc, n_embd), np.float32)
    args = _struct(n_embd=n_embd, row_bytes=n_embd // elems * bsize, n_vocab=n_vocab, n_hc=n_hc)
    return run("embed_rows_hc", buffers=[args, np.ascontiguousarray(table).view(np.uint8).reshape(-1), tokens, out],
               outputs=[3], grid=(-(-n_embd // 8), tokens.size, 1), threads=(8, 4, 1), grid_is_threads=True,
               constants={0: qtype})[0]


def hc_collapse_weights(run: Runner, pre: np.ndarray, scale: np.ndarray, base: np.ndarray, n_hc: int,
                        eps: float) -> np.ndarray:
    """Split rows whose pre slots hold the output head's stream weights (other slots NaN)."""
    pre = np.ascontiguousarray(pre, dtype=np.float32).reshape(-1, pre.shape[-1])
    out = np.zeros((pre.shape[0], 2 * n_hc + n_hc * n_hc), np.float32)
    args = _struct(n_hc=n_hc, n_embd=0, iters=0, eps=float(eps), mix_stride=pre.shape[1])
    return run("hc_collapse_weights", buffers=[args, pre, np.ascontiguousarray(scale, np.float32),
                                               np.ascontiguousarray(base, np.float32), out], outputs=[4],
               grid=(n_hc, pre.shape[0], 1), threads=(n_hc, 1, 1), grid_is_threads=True)[0]


def grouped_output_a(run: Runner, qtype: int, raw: np.ndarray, shape: tuple[int, int], heads: np.ndarray,
                     n_group: int, rank: int) -> np.ndarray:
    """low[g*rank + r] = dot(Wa row g*rank + r, heads group g): one mat-vec per group over the same
    weight buffer bound at the group's byte offset (no copy), its activation quantised per group."""
    group_dim, out = shape
    suffix, elems, bsize, _ = QTYPES[qtype]
    row_bytes = group_dim // elems * bsize
    w = np.ascontiguousarray(raw).view(np.uint8).reshape(-1)
    heads = np.ascontiguousarray(heads, dtype=np.float32).reshape(n_group, group_dim)
    xq = quantize_act(run, qtype, heads)                       # [n_group, act_bytes]
    low = np.zeros(n_group * rank, np.float32)
    per_group = MV_ROWS * MV_SIMDGROUPS
    for g in range(n_group):
        args = _struct(n=group_dim, rows=rank, row_bytes=row_bytes, n_tok=1, act_bytes=xq.shape[1], y_stride=rank)
        part = np.zeros(rank, np.float32)
        part = run(f"matvec_{suffix}", buffers=[args, Buffer(w, g * rank * row_bytes), Buffer(xq, g * xq.shape[1]), part],
                   outputs=[3], grid=(-(-rank // per_group), 1, 1), threads=(32 * MV_SIMDGROUPS, 1, 1))[0]
        low[g * rank:(g + 1) * rank] = part
    return low


def routed_experts(run: Runner, gtype: int, dtype_: int, gate: np.ndarray, up: np.ndarray, down: np.ndarray,
                   n_embd: int, n_ff: int, n_expert: int, x: np.ndarray, sel: np.ndarray, weights: np.ndarray,
                   clamp: float, trace: dict | None = None) -> np.ndarray:
    """One token's routed FFN, every step on the device: quantise x, gate/up experts, SwiGLU
    scaled by each slot's route weight, per-slot quantisation of mid, down experts, slot sum."""
    sel = np.ascontiguousarray(sel, np.int32).reshape(-1)
    n_used = sel.size
    xq = quantize_act(run, gtype, np.asarray(x, np.float32).reshape(1, n_embd))
    g = matvec_experts(run, gtype, gate, (n_embd, n_ff, n_expert), sel, xq)
    u = matvec_experts(run, gtype, up, (n_embd, n_ff, n_expert), sel, xq)
    mid = np.zeros((n_used, n_ff), np.float32)
    mid = run("swiglu_rows", buffers=[_struct(n=n_ff, clamp=float(clamp), scale=1.0), g, u,
                                      np.ascontiguousarray(weights, np.float32), mid], outputs=[4],
              grid=(n_ff, n_used, 1), threads=(min(64, n_ff), 1, 1), grid_is_threads=True)[0]
    mq = quantize_act(run, dtype_, mid)
    dn = matvec_experts(run, dtype_, down, (n_ff, n_embd, n_expert), sel, mq)
    out = np.zeros(n_embd, np.float32)
    out = run("sum_rows", buffers=[_struct(n=n_embd, rows=n_used), dn, out], outputs=[2], grid=(n_embd, 1, 1),
              threads=(min(64, n_embd), 1, 1), grid_is_threads=True)[0]
    if trace is not None:
        trace.update(gate=g, up=u, mid=mid, down=dn)
    return out
