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
    assert s.save_payload() == ref.save_payload()      # the boundary state IS a prefill of it
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


def _core_tables(info):
    from ds4.engine import _shape_dict, _tensor_table
    return _shape_dict(info.shape), _tensor_table(info)


@pytest.mark.parametrize("breakage", ["offset", "dims", "type", "missing", "shape"])
def test_core_checks_the_tensor_table(tiny_engine, tiny_path, breakage: str) -> None:
    # The C++ binder re-checks what it relies on (bounds, dims, types) even after ds4.inspect.
    from ds4 import _core
    shape, table = _core_tables(tiny_engine.info)
    i = next(k for k, t in enumerate(table) if t[0] == "blk.1.attn_q_b.weight")
    name, typ, dims, off, nb = table[i]
    if breakage == "offset":
        table[i] = (name, typ, dims, tiny_path.stat().st_size - 10, nb)
    elif breakage == "dims":
        table[i] = (name, typ, [dims[0], dims[1] // 2], off, nb)
    elif breakage == "type":
        table[i] = (name, 0, dims, off, nb)      # F32 is not a matrix type here
    elif breakage == "missing":
        del table[i]
    else:
        shape["compress_ratios"] = [0, 0, 4]
    with pytest.raises(ModelFormatError, match="attn_q_b|compress_ratios|shape"):
        _core.Model(str(tiny_path), shape, table, 1, 0)


def test_argument_validation(tiny_path, tiny_engine) -> None:
    from ds4.errors import InvalidArgumentError
    with pytest.raises(InvalidArgumentError):
        ds4.Engine(tiny_path, threads=0)
    with pytest.raises(InvalidArgumentError):
        tiny_engine.session(ctx=1)
    with pytest.raises(InvalidArgumentError):
        tiny_engine.session(ctx=8).argmax()     # nothing evaluated yet


def test_long_context_session_commits_memory_lazily(tiny_engine) -> None:
    # Compressed-row caches are zero pages until written: a 1M-token session costs address space.
    before = _rss_bytes()
    s = tiny_engine.session(ctx=1 << 20)
    s.sync([1, 2, 3, 4, 5])
    assert s.kv_bytes > 200_000_000
    assert _rss_bytes() - before < s.kv_bytes // 4, (_rss_bytes() - before, s.kv_bytes)
