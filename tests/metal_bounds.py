"""Per-element error bounds of the Metal kernels against the CPU (docs/metal.md, "Numerics"),
shared by the kernel tests (tests/metal_emu) and the metal-emu backend tests (tests/backend_ops).

Mat-vec: a block value is computed with the CPU's integer sums and the same float operations in
the same order, so it is bit-identical per block; only the order in which the B block values are
summed differs (per lane, then a simd_sum tree, vs sequential). Each order's float error is at
most (B-1)*u*S with S = sum_b |block value| <= sum_i |w_i x_i| (for Q2_K/Q4_K the d and min parts
counted separately, since they may cancel), so |gpu - cpu| <= 2*B*u*S. For F32 the CPU
accumulates in double (error u*|y|) and the GPU in float (B = n).

Mat-mat: float products of the dequantised values (each rounded once, the K-quant weights
rounded relative to their d and min parts) summed over n in tile order, against the CPU's exact
integer block sums summed over B: |gpu - cpu| <= (n + B + 10)*u*S.
"""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as Q

from ds4.reference import quant as ref
from test_quant_blocks import split_scales

U = 2.0**-24


def blocks_of(qtype, n: int) -> int:
    return n if Q(qtype) in (Q.F32, Q.F16) else n // (32 if Q(qtype) == Q.Q8_0 else 256)


def mv_scale(qtype, raw, n: int, rows: int, x) -> np.ndarray:
    """S[tok, row]: sum over i of |w_i x_i| with x as the kernel sees it (quantised for quant
    types), the d and min parts of K-quant weights counted separately."""
    qtype = Q(qtype)
    at = ref.act_type_for(int(qtype))
    xa = np.stack([ref.act_roundtrip(at, r) for r in np.atleast_2d(x)]).astype(np.float64)
    if qtype in (Q.Q2_K, Q.Q4_K):
        parts = [ref.dequantize(int(qtype), p, (n, rows)).astype(np.float64) for p in split_scales(qtype, raw)]
        return np.abs(xa) @ (np.abs(parts[0]) + np.abs(parts[1])).T
    return np.abs(xa) @ np.abs(ref.dequantize(int(qtype), raw, (n, rows)).astype(np.float64)).T


def matvec_bound(qtype, raw, n: int, rows: int, x) -> np.ndarray:
    """Per-(token, row) bound 2*B*u*S of a decode mat-vec."""
    return 2 * blocks_of(qtype, n) * U * mv_scale(qtype, raw, n, rows, x) + 2.0**-126


def matmul_bound(qtype, raw, n: int, rows: int, x) -> np.ndarray:
    """Per-(token, row) bound (n + B + 10)*u*S of a prefill mat-mat."""
    return (n + blocks_of(qtype, n) + 10) * U * mv_scale(qtype, raw, n, rows, x) + 2.0**-126


def check_bound(got, want, bound) -> None:
    """Same finite pattern, and |got - want| <= bound wherever want is finite."""
    got, want = np.asarray(got), np.asarray(want)
    bound = np.broadcast_to(bound, want.shape)
    fin = np.isfinite(want)
    assert np.array_equal(np.isfinite(got), fin), "non-finite results differ"
    err = np.abs(got[fin].astype(np.float64) - want[fin])
    assert (err <= bound[fin]).all(), f"max err/bound {np.max(err / bound[fin]):.3g}"


def attention_bound(q, live, comp, mask, n_head: int, head_dim: int) -> np.ndarray:
    """Per output element of sink attention over the live raw rows then the compressed rows (those
    with mask != 0): scores differ by the dots' summation order, <= 2*D*u*max|q.k| (x scale); a
    weight exp(s - max) then moves by that much relatively, plus ~n+4 roundings of the running
    sums and rescalings: |gpu - cpu| <= (4*E + 4*(n+4)*u) * max_r |v_r| per dimension."""
    rows = np.concatenate([live, comp[mask.astype(bool)] if mask is not None else comp]) if comp.shape[0] else live
    qh = q.reshape(n_head, head_dim).astype(np.float64)
    e = 2 * head_dim * U * (np.abs(qh) @ np.abs(rows.astype(np.float64)).T).max(axis=1) / np.sqrt(head_dim)
    vmax = np.abs(rows).max(axis=0)
    return ((4 * e + 4 * (rows.shape[0] + 4) * U)[:, None] * vmax[None, :]).reshape(-1) + 1e-30


def indexer_scores_bound(q, rows, hw, dots, n_head: int, head_dim: int) -> np.ndarray:
    """Per compressed row, against prepared queries q, scaled head weights hw and the relu'd dots:
    each head's dot is summed in another order (<= 2*hd*u*sum|kv*q| apart, relu keeps it), then
    weighted and summed over heads in the same order (<= 2*n_head*u*sum|d*w| more)."""
    absdot = np.abs(rows).astype(np.float64) @ np.abs(q.reshape(n_head, head_dim)).T.astype(np.float64)
    return (2 * head_dim * U * absdot) @ np.abs(hw) + 2 * n_head * U * (np.abs(dots) @ np.abs(hw)) + 1e-35
