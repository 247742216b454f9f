"""The Objective-C++ Metal host (metal/host/*.mm) compiled on Linux against the stub Metal and
Foundation headers of metal/host/stub, which declare exactly the API subset ds4 uses with the
signatures of Apple's documentation: a misspelt selector, a wrong argument type or an API used
without its availability guard fails here rather than first on a Mac.

The clang is the Metal emulator's (ds4.metal_emu: $DS4_METAL_EMU_CXX, a system clang++, or the
ziglang wheel of the test extra). With the ziglang clang the check targets arm64 macOS 13 (zig
ships macOS's C headers and libc++), so availability is checked too; zig's driver insists on an
output file, so it compiles to a throwaway object instead of -fsyntax-only. A system clang checks
with its host headers and Apple's Objective-C runtime (-fobjc-runtime=macosx).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from ds4.metal_emu._toolchain import find_compiler

ROOT = Path(__file__).resolve().parents[2]
HOST = ROOT / "metal" / "host"
MM_FILES = sorted(HOST.glob("*.mm"))
# the plain C++ of the host too, for the macOS target's headers (std::filesystem on macOS 13)
HOST_FILES = MM_FILES + sorted(HOST.glob("*.cpp"))


@pytest.fixture(scope="module")
def objcxx():
    c = find_compiler()
    if c is None:
        pytest.skip("no clang for the Objective-C++ syntax check: install the test extra (the ziglang wheel), "
                    "a system clang++, or set DS4_METAL_EMU_CXX")
    return c


def check(compiler, source: Path, out_dir: Path, defines: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    argv = list(compiler.argv) + [f"-D{d}" for d in defines]
    lang = "objective-c++" if source.suffix == ".mm" else "c++"
    flags = ["-x", lang, "-std=c++17", "-fobjc-arc", "-Wall", "-Wextra", "-Wno-unused-parameter", "-Werror",
             "-I", str(HOST / "stub"), "-I", str(HOST), "-I", str(ROOT / "csrc")]
    if compiler.origin == "ziglang":
        flags = ["-target", "aarch64-macos.13.0", *flags, "-c", "-o", str(out_dir / (source.stem + ".o"))]
    else:
        flags = [*flags, "-fobjc-runtime=macosx", "-fblocks", "-fsyntax-only"]
    return subprocess.run(argv + flags + [str(source)], capture_output=True, text=True, timeout=600)


def test_there_is_objective_cxx_to_check():
    assert [p.name for p in MM_FILES] == ["metal_device.mm"]


@pytest.mark.parametrize("src", HOST_FILES, ids=lambda p: p.name)
def test_host_compiles_against_the_stub_metal_api(objcxx, src, tmp_path):
    r = check(objcxx, src, tmp_path)
    assert r.returncode == 0, r.stderr


def test_registry_apple_branch_compiles(objcxx, tmp_path):
    """csrc/backend/registry.cpp as metal/metal.cmake builds it on Apple (DS4_HAVE_APPLE_METAL)."""
    r = check(objcxx, ROOT / "csrc" / "backend" / "registry.cpp", tmp_path, ("DS4_HAVE_APPLE_METAL=1",))
    assert r.returncode == 0, r.stderr


BROKEN = {
    # the index argument of setBuffer:offset:atIndex: left out
    "missing_argument": ("[enc setBuffer:buf offset:0];", "selector 'setBuffer:offset:'"),
    # a C string where NSString* is declared
    "wrong_type": ('const char* s = "kernel void f() {}"; [dev newLibraryWithSource:s options:nil error:nullptr];',
                   "parameter of type 'NSString"),
    # a selector Metal does not have
    "unknown_selector": ("[enc dispatchThreadgroups:MTLSizeMake(1, 1, 1)];", "selector 'dispatchThreadgroups:'"),
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_the_check_fails_on_a_wrong_call(objcxx, case, tmp_path):
    line, expect = BROKEN[case]
    src = tmp_path / f"{case}.mm"
    src.write_text("#import <Metal/Metal.h>\n"
                   "void f(id<MTLDevice> dev, id<MTLComputeCommandEncoder> enc, id<MTLBuffer> buf) {\n"
                   f"    {line}\n}}\n")
    r = check(objcxx, src, tmp_path)
    errors = [ln for ln in r.stderr.splitlines() if "error:" in ln]
    assert r.returncode != 0 and any(expect in ln for ln in errors), r.stderr


def test_the_check_fails_on_an_unguarded_newer_api(objcxx, tmp_path):
    """mathMode is macOS 15+: using it without @available fails on the macOS 13 target."""
    if objcxx.origin != "ziglang":
        pytest.skip("availability is checked only when targeting macOS (the ziglang clang); a system clang checks "
                    "for its host target")
    src = tmp_path / "unguarded.mm"
    src.write_text("#import <Metal/Metal.h>\nvoid f(MTLCompileOptions* o) { o.mathMode = MTLMathModeSafe; }\n")
    r = check(objcxx, src, tmp_path)
    errors = [ln for ln in r.stderr.splitlines() if "error:" in ln]
    assert r.returncode != 0 and any("'setMathMode:' is only available on macOS 15" in ln for ln in errors), r.stderr
