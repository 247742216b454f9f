"""The persistent CPU thread pool: sizing, DS4_THREADS, and results independent of thread count
(work is split by output rows, never inside a reduction)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

import ds4._core as core
from ds4.errors import InvalidArgumentError
from _installed import installed_env
from test_quant_blocks import WEIGHT_TYPES, activation, block_size, random_weights


@pytest.fixture
def restore_threads():
    before = core.threads()
    yield
    core.set_threads(before)


@pytest.mark.parametrize("path", core.simd_paths())
@pytest.mark.parametrize("qtype", WEIGHT_TYPES, ids=lambda q: q.name)
def test_results_bit_identical_for_any_thread_count(qtype, path, restore_threads):
    before = core.simd_path()
    core.set_simd_path(path)
    try:
        _check_thread_counts(qtype)
    finally:
        core.set_simd_path(before)


def _check_thread_counts(qtype):
    be, _ = block_size(qtype)
    n = 512 if be == 256 else 256
    rows, n_expert = 37, 3  # odd sizes: uneven ranges
    raw = random_weights(qtype, n, rows * n_expert, 5)
    x = activation(n, 6, "normal")
    X = activation(n, 7, "normal", batch=4)
    ids = np.array([2, 0, 2, 1], np.int32)
    shape3 = (n, rows, n_expert)
    outs = []
    for t in (1, 2, 3, 7):
        core.set_threads(t)
        assert core.threads() == t
        outs.append((
            core.matvec(int(qtype), raw, (n, rows * n_expert), x),
            core.matmul(int(qtype), raw, (n, rows * n_expert), X),
            core.matvec_experts(int(qtype), raw, shape3, ids, X),
            core.matmul_experts(int(qtype), raw, shape3, ids.reshape(2, 2), X[:2]),
            *core.matvec_experts_pair(int(qtype), raw, raw[::-1].copy(), shape3, ids, x),
        ))
    for other in outs[1:]:
        for a, b in zip(outs[0], other):
            np.testing.assert_array_equal(a.view(np.uint32), b.view(np.uint32))


@pytest.mark.parametrize("qtype", [Q.Q8_0, Q.IQ2_XXS, Q.Q2_K], ids=lambda q: q.name)
def test_many_ranges_bit_identical(qtype, restore_threads):
    """Weights large enough (~72 MB; 54 MB for the three experts used) that matvec and
    matvec_experts split the rows into more than the default 4 ranges per thread at 2 and 3
    threads (matvec.cpp): every thread count gives the one-thread bits."""
    n, n_expert = 4096, 4
    rows = (18 << 20) // core.row_bytes(int(qtype), n)
    raw = random_weights(qtype, n, rows * n_expert, 11)
    x = activation(n, 12, "normal")
    X = activation(n, 13, "normal", batch=3)
    ids = np.array([3, 0, 2], np.int32)
    outs = []
    for t in (1, 2, 3, 7):
        core.set_threads(t)
        outs.append((core.matvec(int(qtype), raw, (n, rows * n_expert), x),
                     core.matvec_experts(int(qtype), raw, (n, rows, n_expert), ids, X),
                     *core.matvec_experts_pair(int(qtype), raw, raw, (n, rows, n_expert), ids, x)))
    for other in outs[1:]:
        for a, b in zip(outs[0], other):
            np.testing.assert_array_equal(a.view(np.uint32), b.view(np.uint32))


def test_default_threads_and_env_override():
    code = "import ds4._core as c; print(c.threads(), c.default_threads())"
    env = installed_env()   # the installed package, not the source tree
    env.pop("DS4_THREADS", None)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout.split()
    assert int(out[0]) == int(out[1]) >= 1
    assert int(out[0]) <= (os.cpu_count() or 1)  # physical cores never exceed logical CPUs
    env["DS4_THREADS"] = "3"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout.split()
    assert out == ["3", "3"]


def test_set_threads_zero_means_default(restore_threads):
    core.set_threads(0)
    assert core.threads() == core.default_threads()
    with pytest.raises(InvalidArgumentError, match=">= 0"):
        core.set_threads(-2)


def test_concurrent_callers_share_the_pool(restore_threads):
    """Python threads calling in parallel (GIL released) get the same answers as serial calls."""
    core.set_threads(2)
    raw = random_weights(Q.Q8_0, 1024, 64, 1)
    xs = [activation(1024, s, "normal") for s in range(8)]
    want = [core.matvec(int(Q.Q8_0), raw, (1024, 64), x) for x in xs]
    got = [None] * len(xs)

    def work(i):
        for _ in range(5):
            got[i] = core.matvec(int(Q.Q8_0), raw, (1024, 64), xs[i])

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(xs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a, b)


def test_exception_in_one_range_propagates():
    """A bad expert id fails before any work; a failing call leaves the pool usable."""
    raw = random_weights(Q.Q8_0, 32, 4, 2)
    with pytest.raises(InvalidArgumentError):
        core.matvec_experts(int(Q.Q8_0), raw, (32, 2, 2), np.array([5], np.int32), np.ones(32, np.float32))
    assert core.matvec(int(Q.Q8_0), raw, (32, 4), np.ones(32, np.float32)).shape == (4,)


def test_resizing_while_other_threads_compute(restore_threads):
    """set_threads from one Python thread while others run kernels (GIL released): the global pool
    is resized in place, so no call sees a destroyed pool and every answer stays exact."""
    raw = random_weights(Q.Q2_K, 1024, 96, 4)
    x = activation(1024, 5, "normal")
    want = core.matvec(int(Q.Q2_K), raw, (1024, 96), x)
    errors = []

    def compute():
        try:
            for _ in range(30):
                np.testing.assert_array_equal(core.matvec(int(Q.Q2_K), raw, (1024, 96), x), want)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    workers = [threading.Thread(target=compute) for _ in range(3)]
    for t in workers:
        t.start()
    for n in (1, 3, 2, 4, 1, 2) * 3:
        core.set_threads(n)
    for t in workers:
        t.join()
    assert not errors, errors[0]


def test_child_processes_import_the_same_ds4() -> None:
    # tests/_installed.py: subprocess tests check the package this process imported (the installed
    # one), not a source tree prepended to PYTHONPATH.
    import ds4
    from _installed import installed_env

    code = "import ds4, ds4._core; print(ds4.__file__); print(ds4._core.__file__)"
    out = subprocess.run([sys.executable, "-c", code], env=installed_env(), capture_output=True, text=True,
                         check=True, cwd="/").stdout.split("\n")
    assert out[0] == ds4.__file__ and out[1] == core.__file__
