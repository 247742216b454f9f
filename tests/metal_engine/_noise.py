"""The agreement criterion between the metal-emu engine and the CPU engine.

It is the one the CPU's SIMD paths meet against upstream's own logits
(tests/engine/test_engine_upstream.py, test_simd_path_within_upstream_build_noise): per row, the
mean |dlogit| of the centred rows (_compare.row_means); rows above FLIP (0.1) are discrete flips
(a Q8_0 rounding tie, an FP8 block scale or a swapped expert going the other way under another
float order), at most one row in ten of them; the other rows average at most CALM_MEAN (0.05).
The Metal kernels differ from the CPU only in float order (docs/metal.md "Numerics": mat-mat
float products vs integer block dots, float vs double RMS sums, online softmax), i.e. the same
kind of difference as a SIMD path's, so the same bound applies. rejects() shows it fails rows
perturbed as a real bug would (N(0, 0.4) noise, x1.3 scaling: ~0.33-0.37 per row).
"""

from __future__ import annotations

import numpy as np

from _compare import row_means

FLIP = 0.1
MAX_FLIP_FRACTION = 0.1
CALM_MEAN = 0.05


def agreement(ours: np.ndarray, cpu: np.ndarray) -> tuple[bool, np.ndarray]:
    r = row_means(np.atleast_2d(ours), np.atleast_2d(cpu))
    flips = r > FLIP
    calm = r[~flips]
    ok = flips.sum() <= max(1, int(MAX_FLIP_FRACTION * len(r))) and (calm.size == 0 or calm.mean() <= CALM_MEAN)
    return bool(ok), r


def assert_agrees(ours, cpu, what: str) -> None:
    ok, r = agreement(np.asarray(ours), np.asarray(cpu))
    assert ok, f"{what}: metal-emu vs CPU row means {np.round(r, 3).tolist()}"


def assert_rejects_perturbations(ours, cpu, seed: int = 0) -> None:
    """The criterion is not vacuous on these rows: noise and scaling of the size a bug makes fail."""
    ours = np.atleast_2d(np.asarray(ours, np.float64))
    rng = np.random.default_rng(seed)
    assert not agreement(ours + rng.normal(0, 0.4, ours.shape), cpu)[0]
    assert not agreement(ours * 1.3, cpu)[0]
