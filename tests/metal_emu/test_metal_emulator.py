"""The emulator itself: it must catch races, divergent synchronisation, Metal's limits and
uninitialised reads, and run barrier-free kernels without fibers."""

from pathlib import Path

import numpy as np
import pytest

from ds4 import metal_emu
from ds4.metal_emu import EmulatorError, MetalSourceError, RaceError, run_orders

NORM_ARGS = np.dtype([("n", "<u4"), ("in_stride", "<u4"), ("out_stride", "<u4"), ("eps", "<f4")])


def norm_args(n, eps=1e-6):
    return np.array([(n, n, n, eps)], dtype=NORM_ARGS).tobytes()


def test_removed_barrier_is_caught_as_a_race(emu):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((4, 200)).astype(np.float32)
    y = np.zeros_like(x)
    # The intact kernel agrees bit for bit under forward, reverse and shuffled orders ...
    w = np.ones(200, np.float32)
    run_orders(emu, "rms_norm_f32", buffers=[norm_args(200), x, w, y.copy()], outputs=[3], grid=(4, 1, 1),
               threads=(96, 1, 1), tg_mem=[128], constants={0: False})
    # ... the copy without its barrier does not.
    with pytest.raises(RaceError, match="fault_norm_missing_barrier.*differs between thread orders"):
        run_orders(emu, "fault_norm_missing_barrier", buffers=[norm_args(200), x, y], outputs=[2], grid=(4, 1, 1),
                   threads=(96, 1, 1), tg_mem=[128])


def test_race_between_threadgroups_is_caught(emu):
    with pytest.raises(RaceError, match="groups_race"):
        run_orders(emu, "groups_race", buffers=[np.zeros(1, np.float32)], outputs=[0], grid=(3, 1, 1),
                   threads=(32, 1, 1))


@pytest.mark.parametrize("kernel, threads, message", [
    ("fault_divergent_barrier", 64, r"threadgroup_barrier at .*faults.metal:\d+ reached by 16 of 64 threads|"
                                    r"divergent simdgroup|deadlock"),
    ("fault_barrier_sites", 64, r"divergent threadgroup_barrier: .*faults.metal:\d+.*faults.metal:\d+"),
    ("fault_divergent_simd", 32, r"divergent simd collective .*simd_sum at .*faults.metal:\d+"),
    ("fault_simd_in_divergent_loop", 32, r"divergent simd collective in simdgroup 0: lane \d+ waits at simd_sum at .*faults.metal:\d+"),
    ("fault_return_before_barrier", 64, r"reached by 20 of 64 threads"),
])
def test_divergent_synchronisation_names_kernel_and_line(emu, kernel, threads, message):
    y = np.zeros(threads, np.float32)
    with pytest.raises(EmulatorError, match=rf"kernel '{kernel}': .*({message})"):
        emu.dispatch(kernel, buffers=[y], grid=(1, 1, 1), threads=(threads, 1, 1))


def test_divergence_message_points_at_the_source_line(emu):
    src = (Path(__file__).parent / "fixtures" / "faults.metal").read_text().splitlines()
    with pytest.raises(EmulatorError) as e:
        emu.dispatch("fault_barrier_sites", buffers=[np.zeros(64, np.float32)], grid=(1, 1, 1), threads=(64, 1, 1))
    import re
    lines = [int(n) for n in re.findall(r"faults.metal:(\d+)", str(e.value))]
    assert lines and all("threadgroup_barrier" in src[n - 1] for n in lines)


def test_collective_over_the_lanes_that_remain(emu):
    y = np.zeros(32, np.float32)
    outs = run_orders(emu, "simd_sum_active_lanes", buffers=[y], outputs=[0], grid=(1, 1, 1), threads=(32, 1, 1))
    assert (outs[0][:20] == sum(range(20))).all()
    assert np.isnan(outs[0][20:]).all()      # never written: the poison stays


def test_shuffle_from_an_inactive_lane_is_nan(emu):
    outs = run_orders(emu, "shuffle_from_inactive", buffers=[np.zeros(32, np.float32)], outputs=[0],
                      grid=(1, 1, 1), threads=(32, 1, 1))
    assert (outs[0][:20] == np.arange(4, 24)).all()
    assert np.isnan(outs[0][20:24]).all()    # lanes 24..27 returned: their values are NaN


def test_outputs_and_threadgroup_memory_are_poisoned(emu):
    outs = run_orders(emu, "skips_odd", buffers=[np.zeros(64, np.float32)], outputs=[0], grid=(64, 1, 1),
                      threads=(16, 1, 1), grid_is_threads=True)
    assert (outs[0][0::2] == np.arange(0, 64, 2)).all() and np.isnan(outs[0][1::2]).all()
    y = np.zeros(32, np.float32)
    emu.dispatch("reads_uninitialised", buffers=[y], grid=(1, 1, 1), threads=(32, 1, 1), tg_mem=[128])
    assert np.isnan(y).all()


def test_metal_limits(emu):
    y = np.zeros(2048, np.float32)
    with pytest.raises(EmulatorError, match="1025 threads per threadgroup exceed"):
        emu.dispatch("skips_odd", buffers=[y], grid=(1, 1, 1), threads=(1025, 1, 1))
    with pytest.raises(EmulatorError, match="multiple of 16"):
        emu.dispatch("reads_uninitialised", buffers=[y], grid=(1, 1, 1), threads=(32, 1, 1), tg_mem=[100])
    with pytest.raises(EmulatorError, match="exceed Metal's 32768"):
        emu.dispatch("reads_uninitialised", buffers=[y], grid=(1, 1, 1), threads=(32, 1, 1), tg_mem=[32784])
    with pytest.raises(EmulatorError, match="threadgroup\\(0\\) is declared but no threadgroup memory"):
        emu.dispatch("reads_uninitialised", buffers=[y], grid=(1, 1, 1), threads=(32, 1, 1))
    with pytest.raises(EmulatorError, match="buffer\\(1\\) is declared by the kernel but not bound"):
        emu.dispatch("scale_by_constant", buffers=[y], grid=(1, 1, 1), threads=(32, 1, 1), constants={3: 2})
    with pytest.raises(EmulatorError, match="function constant 3 \\(int FC_SCALE\\) is not set"):
        emu.dispatch("scale_by_constant", buffers=[y, y.copy()], grid=(1, 1, 1), threads=(32, 1, 1))
    with pytest.raises(EmulatorError, match="no kernel named"):
        emu.dispatch("nope", buffers=[y], grid=(1, 1, 1), threads=(32, 1, 1))
    # A pipeline may report fewer threads than 1024 (register-heavy kernels on real GPUs).
    emu.set_max_threads_per_threadgroup(256)
    try:
        assert emu.max_threads_per_threadgroup == 256
        with pytest.raises(EmulatorError, match="512 threads per threadgroup exceed .*\\(256\\)"):
            emu.dispatch("skips_odd", buffers=[y], grid=(1, 1, 1), threads=(512, 1, 1))
    finally:
        emu.set_max_threads_per_threadgroup(1024)


def test_barrier_free_kernels_skip_fibers(emu):
    x = np.arange(100, dtype=np.float32)
    y = np.zeros(100, np.float32)
    emu.reset_stats()
    outs = run_orders(emu, "scale_by_constant", buffers=[x, y], outputs=[1], grid=(100, 1, 1), threads=(32, 1, 1),
                      grid_is_threads=True, constants={3: 3})
    assert (outs[0] == 3 * x).all()
    s = emu.stats()
    assert s["fast_path_threads"] == s["threads"] == 300 and s["fiber_switches"] == 0


def test_loader_rejects_threadgroup_locals(tmp_path):
    p = tmp_path / "bad.metal"
    p.write_text("kernel void k(device float* y [[buffer(0)]], uint t [[thread_index_in_threadgroup]]) {\n"
                 "    threadgroup float tmp[32];\n    tmp[t] = 1.0f;\n    y[t] = tmp[t];\n}\n")
    with pytest.raises(MetalSourceError, match="bad.metal:2: threadgroup variable"):
        metal_emu._source.parse_metal(p)


def test_kernel_classification():
    files = {f.path.name: f for f in metal_emu.load_sources()}
    k = {k.name: k for k in files["norm.metal"].kernels}["rms_norm_f32"]
    assert k.needs_fibers and [c.name for c in k.constants] == ["FC_NORM_WEIGHTED"]
    assert k.buffer_indices == [0, 1, 2, 3] and k.threadgroup_indices == [0]


def test_simdgroup_matrix_store_race_is_caught(emu):
    with pytest.raises(RaceError, match="fault_matrix_store_race"):
        run_orders(emu, "fault_matrix_store_race", buffers=[np.zeros(64, np.float32)], outputs=[0], grid=(1, 1, 1),
                   threads=(64, 1, 1))


def test_dispatches_from_several_threads_are_serialised(emu):
    from concurrent.futures import ThreadPoolExecutor

    from ds4.metal_emu import ops

    rng = np.random.default_rng(9)
    xs = [rng.standard_normal((3, 300)).astype(np.float32) for _ in range(8)]
    want = [ops.rms_norm(ops.direct(emu), x, None, 1e-6) for x in xs]
    with ThreadPoolExecutor(4) as pool:
        got = list(pool.map(lambda x: ops.rms_norm(ops.direct(emu), x, None, 1e-6), xs))
    assert all(g.tobytes() == w.tobytes() for g, w in zip(got, want))


def test_shim_types_and_half_rounding(emu):
    out = np.zeros(12, np.float32)
    emu.dispatch("probe_types", buffers=[out], grid=(1, 1, 1), threads=(1, 1, 1))
    assert out[:6].tolist() == [16, 16, 8, 48, 16, 32]    # Metal's float3/half4 sizes and struct layout
    assert out[6] == 0.0                                   # each half op rounds (no float excess precision)
    assert out[7] == 1.5
    assert out[8] == 10.0 and out[9] == 4.0 and out[10] == 5.0 and out[11] == 2.0


def test_shim_collectives(emu):
    out = np.zeros(9 * 32, np.float32)
    emu.dispatch("probe_collectives", buffers=[out], grid=(1, 1, 1), threads=(32, 1, 1))
    lane = np.arange(32, dtype=np.float32)
    o = out.reshape(9, 32)
    assert (o[0] == np.where(lane + 3 < 32, lane + 3, lane)).all()
    assert (o[1] == np.where(lane >= 2, lane - 2, lane)).all()
    assert (o[2] == (np.arange(32) ^ 5)).all()
    assert (o[3] == np.concatenate([[0], np.cumsum(lane)[:-1]])).all()
    assert (o[4] == 7).all() and (o[5] == 1).all() and (o[6] == 0).all()
    assert (o[7] == 496).all() and (o[8] == 31).all()


def test_stray_write_into_an_input_is_reported(emu):
    with pytest.raises(EmulatorError, match="writes_its_input' wrote into buffer\\(0\\)"):
        run_orders(emu, "writes_its_input", buffers=[np.zeros(32, np.float32), np.zeros(32, np.float32)],
                   outputs=[1], grid=(1, 1, 1), threads=(32, 1, 1))
