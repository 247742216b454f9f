"""Find or build llama.cpp for bench/llama_peer.py, from the llama-cpp-python sdist.

llama.cpp is never a dependency of ds4: the peer bench takes the llama.cpp copy vendored inside
one pinned llama-cpp-python source release, builds only that CMake project (CPU backend, Release,
shared libllama, no tools/tests/server), and compiles the small timing driver
``bench/llama_peer_driver.cpp`` against it. Everything lives in ``<ds4 cache>/llama-peer/`` and is
reused by later runs (the driver binary's name carries a hash of its source, so an edited driver is
rebuilt). The sdist is taken from ``--sdist``, from that folder, or fetched with
``pip download --no-deps --no-build-isolation llama-cpp-python==VERSION`` (a plain download of the
one source archive; ``--no-binary :all:`` would also build cmake from source).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path

from ds4._paths import cache_dir

__all__ = ["LLAMA_CPP_PYTHON_VERSION", "LlamaBuild", "build_llama", "default_root"]

LLAMA_CPP_PYTHON_VERSION = "0.3.36"
DRIVER_SOURCE = Path(__file__).with_name("llama_peer_driver.cpp")
_VENDOR = "vendor/llama.cpp/"
_HEAD_IN_SDIST = ".git/modules/vendor/llama.cpp/HEAD"  # llama.cpp's commit, recorded by the sdist
_COMMIT_FILE = "DS4_SDIST_COMMIT"
_STAMP = "DS4_SOURCE_TREE"  # which source tree the build folder was configured for


@dataclass
class LlamaBuild:
    source: Path   # the llama.cpp source tree
    libdir: Path   # folder with libllama and the ggml libraries
    driver: Path   # the compiled bench driver
    commit: str    # llama.cpp's commit as recorded in the sdist (or "unknown")


def default_root() -> Path:
    return cache_dir() / "llama-peer"


def _log(msg: str) -> None:
    print(f"[llama.cpp] {msg}", file=sys.stderr, flush=True)


def _run(cmd: list[str], nice: bool = True) -> None:
    if nice and shutil.which("nice"):
        cmd = ["nice", "-n", "19", *cmd]
    _log(" ".join(str(c) for c in cmd))
    subprocess.run(cmd, check=True)


def _find_sdist(root: Path, version: str, sdist: Path | None) -> Path:
    if sdist is not None:
        if not sdist.is_file():
            raise FileNotFoundError(f"--sdist {sdist}: no such file")
        return sdist
    name = f"llama_cpp_python-{version}.tar.gz"
    for cand in (root / name, root / "download" / name):
        if cand.is_file():
            return cand
    dest = root / "download"
    dest.mkdir(parents=True, exist_ok=True)
    _run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-build-isolation",
          f"llama-cpp-python=={version}", "-d", str(dest)], nice=False)
    if not (dest / name).is_file():
        raise FileNotFoundError(f"pip download left no {name} in {dest} (a wheel has no llama.cpp sources)")
    return dest / name


def _extract_vendor(sdist: Path, root: Path, version: str) -> Path:
    """Extract only ``<top>/vendor/llama.cpp/**`` of the sdist (keeping that path under ``root``)
    and note llama.cpp's commit, which the sdist records in its git metadata; returns the tree."""
    top = f"llama_cpp_python-{version}"
    tree = root / top / _VENDOR
    part = root / f"{top}.partial"
    shutil.rmtree(part, ignore_errors=True)
    _log(f"extracting {_VENDOR} from {sdist}")
    commit = "unknown"
    with tarfile.open(sdist) as tar:
        for m in tar.getmembers():
            _, _, rest = m.name.partition("/")
            if rest == _HEAD_IN_SDIST and m.isfile():
                commit = tar.extractfile(m).read().decode(errors="replace").strip()  # type: ignore[union-attr]
                continue
            if not rest.startswith(_VENDOR) or not (m.isfile() or m.isdir()) or ".." in Path(rest).parts:
                continue
            out = part / rest
            if m.isdir():
                out.mkdir(parents=True, exist_ok=True)
                continue
            out.parent.mkdir(parents=True, exist_ok=True)
            with tar.extractfile(m) as src, open(out, "wb") as dst:  # type: ignore[union-attr]
                shutil.copyfileobj(src, dst)
            os.chmod(out, 0o755 if m.mode & 0o111 else 0o644)
    (part / _VENDOR / _COMMIT_FILE).write_text(commit + "\n")
    shutil.rmtree(root / top, ignore_errors=True)
    part.rename(root / top)  # only a complete tree gets the final name
    return tree


def _commit(tree: Path) -> str:
    try:
        return (tree / _COMMIT_FILE).read_text().strip() or "unknown"
    except OSError:
        return "unknown"


def _build_lib(tree: Path, build: Path, jobs: int) -> Path:
    gen = ["-G", "Ninja"] if shutil.which("ninja") else []
    stamp = build / _STAMP
    if (build / "CMakeCache.txt").is_file() and (not stamp.is_file() or stamp.read_text() != str(tree)):
        shutil.rmtree(build)  # configured for another source tree (another sdist version)
    if not (build / "CMakeCache.txt").is_file():
        _run(["cmake", "-S", str(tree), "-B", str(build), *gen, "-DCMAKE_BUILD_TYPE=Release",
              "-DBUILD_SHARED_LIBS=ON", "-DGGML_NATIVE=ON", "-DGGML_CUDA=OFF", "-DGGML_METAL=OFF",
              "-DGGML_VULKAN=OFF", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_TOOLS=OFF",
              "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_SERVER=OFF", "-DLLAMA_BUILD_APP=OFF",
              "-DLLAMA_BUILD_COMMON=OFF", "-DLLAMA_OPENSSL=OFF"])
        stamp.write_text(str(tree))
    _run(["cmake", "--build", str(build), "--target", "llama", "-j", str(jobs)])
    libdir = build / "bin"
    if not any(libdir.glob("libllama.*")):  # .so on Linux, .dylib on macOS
        raise FileNotFoundError(f"llama.cpp build finished without libllama in {libdir}")
    return libdir


def _build_driver(tree: Path, libdir: Path, build: Path) -> Path:
    tag = hashlib.sha256(DRIVER_SOURCE.read_bytes()).hexdigest()[:10]
    exe = build / f"llama_peer_driver-{tag}"
    if exe.is_file():
        return exe
    tmp = exe.with_name(exe.name + ".tmp")
    cxx = os.environ.get("CXX", "c++")
    _run([cxx, "-O2", "-std=c++17", str(DRIVER_SOURCE), "-o", str(tmp), f"-I{tree / 'include'}",
          f"-I{tree / 'ggml' / 'include'}", f"-L{libdir}", "-lllama", "-lggml", "-lggml-base",
          f"-Wl,-rpath,{libdir}"])
    tmp.replace(exe)
    return exe


def build_llama(root: Path | None = None, sdist: Path | None = None, version: str = LLAMA_CPP_PYTHON_VERSION,
                jobs: int = 2) -> LlamaBuild:
    """The llama.cpp build (libraries + bench driver) under ``root``, building what is missing.

    Compilers run under ``nice -n 19`` so a build does not slow whatever else the machine runs."""
    root = Path(root) if root else default_root()
    root.mkdir(parents=True, exist_ok=True)
    tree = root / f"llama_cpp_python-{version}" / _VENDOR
    if not (tree / _COMMIT_FILE).is_file():
        tree = _extract_vendor(_find_sdist(root, version, sdist), root, version)
    build = root / "build"
    libdir = _build_lib(tree, build, jobs)
    return LlamaBuild(tree, libdir, _build_driver(tree, libdir, build), _commit(tree))
