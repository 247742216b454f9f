"""metal/host/source_bundle.cpp: the .metal files as Metal's runtime compiler takes them (no
include path, so quoted includes are inlined once per file). The bundle of every kernel file,
preprocessed, is token-for-token what the preprocessor makes of the file with an include path."""

from __future__ import annotations

import ctypes
import re
import subprocess

import pytest

from _host_build import ROOT, build_shared, host_cxx

METAL = ROOT / "metal"


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    if host_cxx() is None:
        pytest.skip("no C++ compiler on PATH to build the source-bundle driver (set CXX)")
    out = tmp_path_factory.mktemp("bundle") / "libbundle.so"
    build_shared([ROOT / "metal/host/source_bundle.cpp", ROOT / "tests/metal_host/source_bundle_driver.cpp"], out,
                 include=[ROOT / "metal/host"])
    so = ctypes.CDLL(str(out))
    for f in (so.bundle_file, so.bundle_dir):
        f.restype = ctypes.c_void_p
    so.bundle_file.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.POINTER(ctypes.c_int)]
    so.bundle_dir.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_int)]
    so.bundle_free.argtypes = [ctypes.c_void_p]
    return so


def _take(lib, ptr, ok):
    text = ctypes.string_at(ptr).decode()
    lib.bundle_free(ptr)
    if not ok.value:
        raise ValueError(text)
    return text


def bundle(lib, folder, name):
    ok = ctypes.c_int()
    return _take(lib, lib.bundle_file(str(folder).encode(), name.encode(), ctypes.byref(ok)), ok)


def bundle_names(lib, folder):
    ok = ctypes.c_int()
    return _take(lib, lib.bundle_dir(str(folder).encode(), ctypes.byref(ok)), ok).split()


def preprocess(path, include_dirs, tmp_path):
    """Tokens after the host compiler's preprocessor (<metal_stdlib> as an empty header)."""
    stdlib = tmp_path / "stdlib"
    stdlib.mkdir(exist_ok=True)
    (stdlib / "metal_stdlib").write_text("")
    args = [host_cxx(), "-E", "-P", "-x", "c++", "-std=c++17", "-w", "-I", str(stdlib)]
    for d in include_dirs:
        args += ["-I", str(d)]
    out = subprocess.run(args + [str(path)], check=True, capture_output=True, text=True).stdout
    return out.split()


def test_every_kernel_file_is_bundled(lib):
    assert bundle_names(lib, METAL) == sorted(p.name for p in METAL.glob("*.metal"))


@pytest.mark.parametrize("name", sorted(p.name for p in METAL.glob("*.metal")))
def test_bundle_preprocesses_like_the_file_with_an_include_path(lib, name, tmp_path):
    text = bundle(lib, METAL, name)
    assert not re.search(r'^\s*#\s*include\s*"', text, re.M), "a quoted include is left"
    for header in re.findall(r'^#line 1 "([^"]+\.h)"', text, re.M):
        assert text.count(f'#line 1 "{header}"') == 1, f"{header} inlined twice"
    flat = tmp_path / name
    flat.write_text(text)
    # the bundle is preprocessed without the metal/ include path: it must not need it
    assert preprocess(flat, [], tmp_path) == preprocess(METAL / name, [METAL], tmp_path)


def test_nested_header_once_and_line_markers(lib, tmp_path):
    (tmp_path / "a.h").write_text('#pragma once\n#include "b.h"\nint a;\n')
    (tmp_path / "b.h").write_text("#pragma once\nint b;\n")
    (tmp_path / "k.metal").write_text('#include "a.h"\n#include "b.h"\nint k;\n')
    text = bundle(lib, tmp_path, "k.metal")
    assert text.count("int b;") == 1 and text.count("int a;") == 1
    lines = text.splitlines()
    # after each include, a marker sends the compiler back to the including file's next line
    assert lines[lines.index("int k;") - 1] == '#line 3 "k.metal"'
    assert lines[lines.index("int a;") - 1] == '#line 3 "a.h"'


def test_comparison_catches_a_header_inlined_twice(lib, tmp_path):
    """The preprocessing comparison above fails for a bundle with a header's text twice."""
    text = bundle(lib, METAL, "matvec.metal")
    header = (METAL / "ds4_metal_args.h").read_text().replace("#pragma once", "")
    doubled = tmp_path / "matvec.metal"
    doubled.write_text(header + text)
    assert preprocess(doubled, [], tmp_path) != preprocess(METAL / "matvec.metal", [METAL], tmp_path)


def test_missing_include_is_a_clear_error(lib, tmp_path):
    (tmp_path / "k.metal").write_text('#include "nope.h"\n')
    with pytest.raises(ValueError, match=r'k\.metal includes "nope\.h", which is not in'):
        bundle(lib, tmp_path, "k.metal")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ValueError, match="no .metal files in"):
        bundle_names(lib, empty)
    with pytest.raises(ValueError, match="does not exist"):
        bundle_names(lib, tmp_path / "absent")
