"""The arm64 NEON kernels, on an x86 machine: cross-compile the portable core + the NEON files with
the native self-tests in tests/native and run them under qemu user emulation.

* kernels_selftest.cpp: the NEON row kernels against the scalar kernels (exact on integer-valued
  cases, within the derived float bound otherwise; see that file).
* gemm_selftest.cpp: the NEON prefill GEMM (Q8_0, Q2_K, Q4_K, IQ2_XXS) and the F16/BF16 register
  tiles against the NEON row kernels, bit for bit, on seeded random ragged shapes (docs/gemm.md).
* logprobs_selftest.cpp: the NEON log-probability passes (csrc/sampling/logprobs_neon.cpp) against
  the portable build and a binary128 reference within the stated bound, against a one-lane model of
  the AVX2 build's arithmetic bit for bit, and the top-k ids exactly (docs/sampling.md,
  "Log-probabilities").

The core is compiled once (objects shared by both programs). Skipped where the cross toolchain or
qemu is not installed (Debian: g++-aarch64-linux-gnu, qemu-user-static).
"""

from __future__ import annotations

import platform
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CXX = shutil.which("aarch64-linux-gnu-g++")
QEMU = shutil.which("qemu-aarch64-static") or shutil.which("qemu-aarch64")

pytestmark = pytest.mark.skipif(
    platform.machine() not in ("x86_64", "AMD64") or CXX is None or QEMU is None,
    reason="needs an x86-64 host with aarch64-linux-gnu-g++ and qemu-aarch64",
)

FLAGS = ["-O2", "-std=c++17", "-ffp-contract=off", "-Wall", "-Wextra", "-Wno-unused-parameter", "-Werror",
         "-DDS4_ARCH_ARM64=1", f"-I{ROOT / 'csrc'}", f"-I{ROOT / 'tests' / 'native'}"]
# As CMakeLists.txt: only the *_neon.cpp files are built for dotprod + fp16; the portable code
# stays plain armv8-a, so the programs also run on a CPU without them (the scalar path).
NEON_FLAGS = ["-march=armv8.2-a+dotprod+fp16"]


def _core_sources() -> list[Path]:
    quant = [p for p in sorted((ROOT / "csrc" / "quant").glob("*.cpp")) if not p.stem.endswith(("_avx2", "_avx512", "_avx512vnni"))]
    return quant + sorted((ROOT / "csrc" / "common").glob("*.cpp"))


def _compile(src: Path, obj: Path) -> str:
    extra = NEON_FLAGS if src.stem.endswith("_neon") else []
    r = subprocess.run([CXX, *FLAGS, *extra, "-c", str(src), "-o", str(obj)], capture_output=True, text=True)
    return "" if r.returncode == 0 else f"{src.name}:\n{r.stderr[-3000:]}"


@pytest.fixture(scope="module")
def core_objects(tmp_path_factory) -> list[Path]:
    out = tmp_path_factory.mktemp("neon_core")
    srcs = _core_sources()
    objs = [out / f"{p.parent.name}_{p.stem}.o" for p in srcs]
    with ThreadPoolExecutor(max_workers=2) as ex:  # 2 cores: more only queues
        errors = [e for e in ex.map(_compile, srcs, objs) if e]
    assert not errors, "\n".join(errors)
    return objs


# The log-probability passes and what logprobs.cpp calls besides them (the sampler's scans).
LOGPROB_SOURCES = ["logprobs.cpp", "logprobs_generic.cpp", "logprobs_neon.cpp", "scan.cpp", "exp_weights.cpp"]


@pytest.fixture(scope="module")
def logprob_objects(tmp_path_factory, core_objects) -> list[Path]:
    out = tmp_path_factory.mktemp("neon_logprobs")
    srcs = [ROOT / "csrc" / "sampling" / s for s in LOGPROB_SOURCES]
    objs = [out / f"sampling_{p.stem}.o" for p in srcs]
    with ThreadPoolExecutor(max_workers=2) as ex:
        errors = [e for e in ex.map(_compile, srcs, objs) if e]
    assert not errors, "\n".join(errors)
    return core_objects + objs


def _build(tmp_path: Path, objs: list[Path], main: str) -> Path:
    main_obj = tmp_path / "main.o"
    err = _compile(ROOT / "tests" / "native" / main, main_obj)
    assert not err, err
    exe = tmp_path / main.removesuffix(".cpp")
    link = subprocess.run([CXX, "-static", *map(str, objs), str(main_obj), "-o", str(exe), "-lpthread"],
                          capture_output=True, text=True)
    assert link.returncode == 0, link.stderr[-4000:]
    return exe


def _run(exe: Path, cpu: str = "max") -> str:
    run = subprocess.run([QEMU, "-cpu", cpu, str(exe)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    return run.stdout


def _build_and_run(tmp_path: Path, objs: list[Path], main: str) -> str:
    return _run(_build(tmp_path, objs, main))


def test_neon_kernels_match_scalar_under_qemu(tmp_path, core_objects):
    out = _build_and_run(tmp_path, core_objects, "kernels_selftest.cpp")
    assert "paths available: scalar neon" in out
    assert " 0 failures" in out


def test_neon_gemm_and_half_tiles_match_row_kernels_under_qemu(tmp_path, core_objects):
    exe = _build(tmp_path, core_objects, "gemm_selftest.cpp")
    out = _run(exe)
    assert "neon: gemm yes, half tiles yes" in out  # the NEON GEMM and tiles are the ones checked
    checks = int(out.split(" checks,")[0].split()[-1])
    assert checks > 20000, out
    assert " 0 failures" in out
    # A CPU without dotprod / FP16 (Cortex-A72): the NEON path is not offered, the scalar path
    # runs matmul without a GEMM (the same program, so nothing in it may need the extensions).
    out = _run(exe, cpu="cortex-a72")
    assert "paths available: scalar\n" in out and "neon:" not in out, out
    assert " 0 failures" in out


@pytest.fixture(scope="module")
def logprobs_exe(tmp_path_factory, logprob_objects) -> Path:
    return _build(tmp_path_factory.mktemp("neon_logprobs_exe"), logprob_objects, "logprobs_selftest.cpp")


def test_neon_logprobs_match_portable_and_reference_under_qemu(logprobs_exe):
    out = _run(logprobs_exe)
    assert "neon path available" in out, out
    # the terms were checked, and the NEON ones are not the portable build's bits
    assert "terms: 5007 arguments" in out and " 0 differ" not in out, out
    checks = int(out.split(" checks,")[0].split()[-1])
    assert checks > 20000, out
    assert " 0 failures" in out, out


def test_neon_logprobs_have_the_avx2_bits(tmp_path, logprobs_exe):
    """The NEON build is the AVX2 build's arithmetic lane for lane (docs/sampling.md,
    "Log-probabilities"): the same terms, sums and lse bit for bit, and the same top-20 ids, on
    the vocabularies and exponential arguments of tests/test_sampling_logprobs.py."""
    np = pytest.importorskip("numpy")
    core = pytest.importorskip("ds4._core")
    if "avx2" not in core.simd_paths():
        pytest.skip("this CPU has no AVX2")
    from test_kernels_matvec import simd_path
    from test_sampling_logprobs import KINDS, _exp_args, _vocab

    d = _exp_args(4000, 3)
    (tmp_path / "d.bin").write_bytes(d.astype(np.float64).tobytes())
    _run_args(logprobs_exe, "--exp", str(tmp_path / "d.bin"), str(tmp_path / "e.bin"))
    neon_terms = np.frombuffer((tmp_path / "e.bin").read_bytes(), dtype=np.float64)
    with simd_path("avx2"):
        avx2_terms = core._logprob_exp(d)
    assert np.array_equal(neon_terms.view(np.uint64), avx2_terms.view(np.uint64))

    files = []
    for kind in KINDS:
        files.append(tmp_path / f"{kind}.bin")
        files[-1].write_bytes(_vocab(kind).tobytes())
    out = _run_args(logprobs_exe, "--vocab", *map(str, files))
    lines = [ln.split() for ln in out.splitlines() if ln.startswith("vocab ")]
    assert len(lines) == len(KINDS), out
    with simd_path("avx2"):
        for kind, f, ln in zip(KINDS, files, lines):
            a = _vocab(kind)
            want_sum = float(core._logprob_sum(a))
            lse, top, _ = core.top_logprobs(a, 20, -1)
            assert ln[1] == str(f) and ln[2] == "sum" and ln[4] == "lse" and ln[6] == "ids", ln
            assert int(ln[3], 16) == np.float64(want_sum).view(np.uint64), (kind, ln[3], want_sum.hex())
            assert int(ln[5], 16) == np.float64(lse).view(np.uint64), (kind, ln[5], float(lse).hex())
            assert [int(x) for x in ln[7].split(",")] == [t[0] for t in top], kind


def _run_args(exe: Path, *args: str) -> str:
    run = subprocess.run([QEMU, "-cpu", "max", str(exe), *args], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    return run.stdout
