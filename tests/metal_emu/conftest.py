"""Metal emulator tests: the `emu` fixture is the compiled kernel library plus the fault fixtures.

Without a clang (system clang++ >= 15 or the ziglang wheel of the test extra) every test here is
skipped with a message saying so. The first build compiles zig's C++ runtime into ~/.cache/zig
(about a minute on 2 cores) and the kernels into ~/.cache/ds4/metal-emu; later runs reuse both.
"""

from pathlib import Path

import pytest

from ds4 import metal_emu

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture(scope="session")
def emu():
    if not metal_emu.available():
        pytest.skip(metal_emu.unavailable_reason())
    return metal_emu.load(tuple(str(p) for p in sorted(FIXTURES.glob("*.metal"))))
