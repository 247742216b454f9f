"""Engine open: mmap without copying, validation errors, cancellation between prefill chunks."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import ds4
import ds4.testing
from ds4.errors import CancelledError, ModelFormatError, UnsupportedModelError


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def test_open_does_not_copy_weights(tmp_path) -> None:
    path = ds4.testing.write_model(tmp_path / "q4.gguf", "tiny", experts="q4", seed=3)
    size = path.stat().st_size
    before = _rss_bytes()
    eng = ds4.Engine(path, threads=1)
    grown = _rss_bytes() - before
    # Loose: inspect and the bindings allocate a little; copying the weights would add ~size.
    assert grown < size // 2, (grown, size)
    assert eng.routed_bits == 4


def test_engine_properties(tiny_engine, tiny_path) -> None:
    assert tiny_engine.shape.n_layer == 4 and tiny_engine.routed_bits == 2
    assert tiny_engine.threads == 2 and not tiny_engine.has_mtp
    assert tiny_engine.info.path == tiny_path


def test_unsupported_backend(tiny_path) -> None:
    with pytest.raises(UnsupportedModelError):
        ds4.Engine(tiny_path, backend="metal")


def test_truncated_file_is_a_format_error(tiny_path, tmp_path) -> None:
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(tiny_path.read_bytes()[:-4096])
    with pytest.raises(ModelFormatError):
        ds4.Engine(cut)


def test_other_architecture_is_unsupported(tmp_path) -> None:
    import gguf
    w = gguf.GGUFWriter(str(tmp_path / "llama.gguf"), "llama")
    w.add_block_count(1)
    w.add_tensor("x", np.zeros(32, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(UnsupportedModelError):
        ds4.Engine(tmp_path / "llama.gguf")


def test_cancel_between_chunks_leaves_a_consistent_session(tiny_path) -> None:
    eng = ds4.Engine(tiny_path, threads=1, prefill_chunk=8)
    toks = np.random.default_rng(0).integers(0, 512, 64).tolist()
    s = eng.session(ctx=128)

    def progress(done: int, total: int) -> None:
        if done == 24:
            s.cancel()

    with pytest.raises(CancelledError):
        s.sync(toks, progress=progress)
    assert s.pos == 24 and s.tokens == toks[:24]
    ref = eng.session(ctx=128)
    ref.sync(toks[:24])
    assert np.array_equal(s.logits, ref.logits)
    s.sync(toks)  # resumes from the boundary
    ref.sync(toks)
    assert np.array_equal(s.logits, ref.logits)


def test_sessions_run_in_parallel_threads(tiny_engine) -> None:
    toks = [np.random.default_rng(i).integers(0, 512, 30).tolist() for i in range(2)]
    out: dict[int, np.ndarray] = {}

    def run(i: int) -> None:
        s = tiny_engine.session(ctx=64)
        s.sync(toks[i])
        out[i] = s.logits.copy()

    ts = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    for i in range(2):
        s = tiny_engine.session(ctx=64)
        s.sync(toks[i])
        assert np.array_equal(out[i], s.logits)


@pytest.mark.parametrize("exc", [RuntimeError, KeyboardInterrupt])
def test_progress_exceptions_propagate_at_a_boundary(tiny_path, exc) -> None:
    import os
    import signal

    eng = ds4.Engine(tiny_path, threads=1, prefill_chunk=8)
    toks = np.random.default_rng(1).integers(0, 512, 40).tolist()
    s = eng.session(ctx=64)

    def progress(done: int, total: int) -> None:
        if done == 16:
            if exc is KeyboardInterrupt:
                os.kill(os.getpid(), signal.SIGINT)   # delivered as KeyboardInterrupt by Python
                return
            raise exc("stop")

    with pytest.raises(exc):
        s.sync(toks, progress=progress)
    assert s.pos in (16, 24) and s.tokens == toks[:s.pos]
    ref = eng.session(ctx=64)
    ref.sync(toks[:s.pos])
    assert np.array_equal(s.logits, ref.logits)
