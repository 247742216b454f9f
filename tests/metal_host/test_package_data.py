"""The .metal sources ship with the package: CMakeLists.txt installs metal/*.metal, the shared
headers and the emulator runtime as ds4/metal/ next to the extension module, in every wheel and
editable install. The Apple host compiles them from there at load time; the emulator falls back
to them when there is no checkout. Checked by running the install rules of this checkout's
configured build folder into a temporary prefix (what a wheel build runs)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def expected_files() -> list[Path]:
    src = ROOT / "metal"
    files = [*src.glob("*.metal"), *src.glob("*.h"), *(src / "emu").glob("*.h"), *(src / "emu").glob("*.cpp")]
    return sorted(p.relative_to(src) for p in files)


def test_install_rules_ship_the_kernel_sources(tmp_path):
    builds = sorted(ROOT.glob("build/*/cmake_install.cmake"), key=lambda p: p.stat().st_mtime)
    cmake = shutil.which("cmake") or shutil.which("cmake", path=str(Path(sys.executable).parent))
    if not builds or not cmake:
        pytest.skip("no configured build folder (build/*/cmake_install.cmake) or no cmake: "
                    "`pip install -e .` configures one")
    r = subprocess.run([cmake, "--install", str(builds[-1].parent), "--prefix", str(tmp_path)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    shipped_dir = tmp_path / "ds4" / "metal"
    want = expected_files()
    assert len(want) > 15
    shipped = sorted(p.relative_to(shipped_dir) for p in shipped_dir.rglob("*") if p.is_file())
    assert shipped == want
    for rel in want:
        assert (shipped_dir / rel).read_bytes() == (ROOT / "metal" / rel).read_bytes(), rel
    assert any((tmp_path / "ds4").glob("_core*")), "the extension lands next to metal/"
