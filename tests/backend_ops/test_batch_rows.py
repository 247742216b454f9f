"""A batch's rows are the same op on each row alone, bit for bit, on every CPU SIMD path.

The CPU backend splits a prefill batch over the thread pool in several ops whose code is the same
on every SIMD path (the router, the f16 rounding of the KV rows, grouped_output_a's row scatter,
routed experts' activation gather, GEMM corrections and slot sums, and its 512-token batches:
docs/gemm.md, "Prefill profile"). test_ops_vs_cpu.py compares them with the scalar harness, which
runs the same split, so a wrong split would agree with itself there. Here each row of a batch is
checked against a one-row call instead: a row written from another token's inputs, a range
skipped, a slot summed twice or a batch boundary crossed wrongly changes whole rows by far more
than the exact comparison allows.
"""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

import ds4._core as core
from _ops import THREADS, assert_exact, floats, router_args, weight

PATHS = [pytest.param(core.OpHarness("cpu", p, THREADS), id=p) for p in core.simd_paths()]
paths = pytest.mark.parametrize("cpu", PATHS)   # not "h": conftest.py reads h as a backend under test

# Rows checked against one-row calls: both ends, and both sides of the routed experts' 512-token
# batch (moe.h kMoeTokenBatch) and of the old 256-token one.
def _probe_rows(nb: int) -> list[int]:
    return sorted({b for b in (0, 1, 255, 256, 257, 511, 512, nb - 1) if b < nb})


@paths
@pytest.mark.parametrize("mode", ["topk", "bias", "hash"])
def test_router_rows(cpu, mode):
    logits, tokens, bias, table, n_used, scale = router_args(np.random.default_rng(3), 300, 64, 6, mode)
    sel, wts = cpu.router(logits, tokens, bias, table, n_used, scale)
    for b in range(len(tokens)):
        s1, w1 = cpu.router(logits[b:b + 1], tokens[b:b + 1], bias, table, n_used, scale)
        assert_exact(sel[b], s1[0], f"router selection of row {b}")
        assert_exact(wts[b], w1[0], f"router weights of row {b}")


@paths
def test_store_row_f16_rows(cpu):
    x = floats(np.random.default_rng(4), 333, 130, scale=300.0)
    got = cpu.store_row_f16(x)
    for b in (0, 1, 100, 332):
        assert_exact(got[b], cpu.store_row_f16(x[b:b + 1])[0], f"f16 row {b}")


@paths
def test_grouped_output_a_rows(cpu):
    groups, rank, gd, nb = 4, 48, 64, 70
    w = weight(Q.Q8_0, gd, groups * rank, 5)
    heads = floats(np.random.default_rng(5), nb, groups * gd)
    got = cpu.grouped_output_a(w, int(Q.Q8_0), gd, groups, rank, heads)
    for b in (0, 1, 35, nb - 1):
        assert_exact(got[b], cpu.grouped_output_a(w, int(Q.Q8_0), gd, groups, rank, heads[b:b + 1])[0], f"row {b}")


@paths
@pytest.mark.parametrize("gate_type,down_type", [(Q.IQ2_XXS, Q.Q2_K), (Q.Q8_0, Q.Q8_0)], ids=lambda q: q.name)
def test_routed_experts_rows_across_the_batch_boundary(cpu, gate_type, down_type):
    rng = np.random.default_rng(6)
    n_embd, n_ff, n_expert, n_used, nb = 256, 256, 8, 3, 600   # ~225 (token, slot) pairs per expert: GEMM
    gate = weight(gate_type, n_embd, n_ff * n_expert, 7)
    up = weight(gate_type, n_embd, n_ff * n_expert, 8)
    down = weight(down_type, n_ff, n_embd * n_expert, 9)
    x = floats(rng, nb, n_embd)
    sel = np.stack([rng.permutation(n_expert)[:n_used] for _ in range(nb)]).astype(np.int32)
    wts = np.abs(floats(rng, nb, n_used))
    common = (gate, int(gate_type), up, down, int(down_type), n_embd, n_ff, n_expert)
    got = cpu.routed_experts(*common, x, sel, wts, 10.0)
    for b in _probe_rows(nb):
        one = cpu.routed_experts(*common, x[b:b + 1], sel[b:b + 1], wts[b:b + 1], 10.0)
        assert_exact(got[b], one[0], f"routed experts row {b}")


@paths
@pytest.mark.parametrize("qtype", (Q.F16, Q.F32, Q.BF16), ids=lambda q: q.name)
def test_hc_pre_rows(cpu, qtype):
    """A batch normalises straight into the product's activation buffer; one row goes through
    linear() (backend/cpu/cpu_backend.cpp hc_pre): both give the same bits."""
    n_embd, n_hc, nb = 256, 4, 70
    rng = np.random.default_rng(10)
    mixn = 2 * n_hc + n_hc * n_hc
    fn = weight(qtype, n_embd * n_hc, mixn, 10)
    scale, base, H = floats(rng, 3, scale=0.1), floats(rng, mixn), floats(rng, nb, n_hc * n_embd)
    x, split = cpu.hc_pre(fn, int(qtype), scale, base, H, n_hc, 20, 1e-6, 1e-6)
    for b in (0, 1, 35, nb - 1):
        x1, split1 = cpu.hc_pre(fn, int(qtype), scale, base, H[b:b + 1], n_hc, 20, 1e-6, 1e-6)
        assert_exact(x[b], x1[0], f"hc_pre x row {b}")
        assert_exact(split[b], split1[0], f"hc_pre split row {b}")
