"""Bad input to the kernel API raises ds4.errors exceptions that say what was found and expected."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

import ds4._core as core
from ds4.errors import InvalidArgumentError, UnsupportedModelError
from test_quant_blocks import random_weights


def test_matvec_wrong_weight_size():
    raw = random_weights(Q.Q8_0, 64, 4, 0)
    with pytest.raises(InvalidArgumentError, match=r"Q8_0 tensor of shape \(64, 4\) needs 272 bytes, buffer has 238"):
        core.matvec(int(Q.Q8_0), raw[:-34], (64, 4), np.zeros(64, np.float32))
    with pytest.raises(InvalidArgumentError, match="needs 272 bytes, buffer has 273"):
        core.matvec(int(Q.Q8_0), np.concatenate([raw, raw[:1]]), (64, 4), np.zeros(64, np.float32))


def test_matvec_wrong_activation_shape():
    raw = random_weights(Q.IQ2_XXS, 256, 2, 0)
    with pytest.raises(InvalidArgumentError, match=r"x has shape \(255,\), expected \(256,\)"):
        core.matvec(int(Q.IQ2_XXS), raw, (256, 2), np.zeros(255, np.float32))
    with pytest.raises(InvalidArgumentError, match=r"X has shape \(3, 128\), expected \(3, 256\)"):
        core.matmul(int(Q.IQ2_XXS), raw, (256, 2), np.zeros((3, 128), np.float32))
    with pytest.raises(InvalidArgumentError, match="has 3 dims, expected 2"):
        core.matvec(int(Q.IQ2_XXS), raw, (256, 2, 1), np.zeros(256, np.float32))


def test_row_length_not_a_block_multiple():
    with pytest.raises(InvalidArgumentError, match="Q4_K row of 100 elements"):
        core.matvec(int(Q.Q4_K), np.zeros(0, np.uint8), (100, 0), np.zeros(100, np.float32))


def test_unknown_and_non_weight_types():
    with pytest.raises(UnsupportedModelError, match="unknown GGML type id 7"):
        core.matvec(7, np.zeros(4, np.uint8), (1, 1), np.zeros(1, np.float32))
    with pytest.raises(UnsupportedModelError, match="Q8_K"):
        core.matvec(int(Q.Q8_K), np.zeros(292, np.uint8), (256, 1), np.zeros(256, np.float32))
    with pytest.raises(UnsupportedModelError, match="I32"):
        core.matvec(int(Q.I32), np.zeros(4, np.uint8), (1, 1), np.zeros(1, np.float32))


def test_expert_ids_checked():
    raw = random_weights(Q.Q2_K, 256, 2 * 3, 0)
    x = np.ones(256, np.float32)
    with pytest.raises(InvalidArgumentError, match=r"expert id 3 at slot 1 is outside \[0, 3\)"):
        core.matvec_experts(int(Q.Q2_K), raw, (256, 2, 3), np.array([0, 3], np.int32), x)
    with pytest.raises(InvalidArgumentError, match="expert id -1"):
        core.matvec_experts(int(Q.Q2_K), raw, (256, 2, 3), np.array([-1], np.int32), x)
    with pytest.raises(InvalidArgumentError, match=r"x has shape \(3, 256\), expected \(2, 256\)"):
        core.matvec_experts(int(Q.Q2_K), raw, (256, 2, 3), np.array([0, 1], np.int32), np.ones((3, 256), np.float32))
    with pytest.raises(InvalidArgumentError, match="needs 504 bytes"):
        core.matvec_experts(int(Q.Q2_K), raw[:-1], (256, 2, 3), np.array([0], np.int32), x)


def test_empty_shapes_are_fine():
    assert core.matvec(int(Q.Q8_0), np.zeros(0, np.uint8), (32, 0), np.zeros(32, np.float32)).shape == (0,)
    assert core.matmul(int(Q.Q8_0), np.zeros(34, np.uint8), (32, 1), np.zeros((0, 32), np.float32)).shape == (0, 1)
    y = core.matvec_experts(int(Q.Q8_0), np.zeros(34, np.uint8), (32, 1, 1), np.zeros(0, np.int32), np.zeros(32, np.float32))
    assert y.shape == (0, 1)


def test_simd_path_errors():
    with pytest.raises(InvalidArgumentError, match="unknown SIMD path 'sse9'"):
        core.set_simd_path("sse9")
    missing = [p for p in ("scalar", "avx2", "avx512", "avx512vnni", "neon") if p not in core.simd_paths()]
    assert missing, "no CPU has both x86 and arm paths"
    with pytest.raises(UnsupportedModelError, match="not available"):
        core.set_simd_path(missing[0])


def test_misaligned_weights_give_identical_results():
    raw = random_weights(Q.Q4_K, 512, 5, 3)
    x = np.linspace(-1, 1, 512, dtype=np.float32)
    want = core.matvec(int(Q.Q4_K), raw, (512, 5), x)
    for shift in (1, 2, 3):
        shifted = np.frombuffer(b"\0" * shift + raw.tobytes(), dtype=np.uint8, offset=shift)
        np.testing.assert_array_equal(core.matvec(int(Q.Q4_K), shifted, (512, 5), x).view(np.uint32), want.view(np.uint32))


@pytest.mark.parametrize("request_path", ["scalar", "avx2", "avx512", "avx512vnni", "neon", "bogus"])
def test_ds4_simd_env_selects_the_initial_path(request_path):
    import os
    import subprocess
    import sys

    from _installed import installed_env

    env = installed_env(DS4_SIMD=request_path)   # the installed package, not the source tree
    code = "import ds4._core as c; print(c.simd_path(), ','.join(c.simd_paths()))"
    active, avail = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                                   check=True).stdout.split()
    avail = avail.split(",")
    # An available request is honoured; anything else falls back to the best (last) path.
    assert active == (request_path if request_path in avail else avail[-1])


def test_matmul_experts_checks():
    raw = random_weights(Q.Q2_K, 256, 2 * 3, 0)
    x = np.ones((2, 256), np.float32)
    with pytest.raises(InvalidArgumentError, match=r"expert id 7 at token 1 slot 0 is outside \[0, 3\)"):
        core.matmul_experts(int(Q.Q2_K), raw, (256, 2, 3), np.array([[0, 1], [7, 2]], np.int32), x)
    with pytest.raises(InvalidArgumentError, match=r"x has shape \(3, 256\), expected \(2, 256\) or \(2, 2, 256\)"):
        core.matmul_experts(int(Q.Q2_K), raw, (256, 2, 3), np.zeros((2, 2), np.int32), np.ones((3, 256), np.float32))
    with pytest.raises(InvalidArgumentError, match="ids must be 2-D"):
        core.matmul_experts(int(Q.Q2_K), raw, (256, 2, 3), np.zeros(2, np.int32), x)
    assert core.matmul_experts(int(Q.Q2_K), raw, (256, 2, 3), np.zeros((0, 2), np.int32),
                               np.ones((0, 256), np.float32)).shape == (0, 2, 2)
