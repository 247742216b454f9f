"""The environment for a child Python process that must use ds4 as users do: the installed package.

Tests that start ``python -m ds4.cli ...`` or ``python -c "import ds4._core"`` must not put the
source tree first on PYTHONPATH: with a regular (non-editable) install, ``python/ds4`` has no
compiled core and would shadow the installed package, and the test would check the tree instead
of what was installed. This drops every PYTHONPATH entry inside the repository.
"""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def installed_env(**extra: str) -> dict[str, str]:
    """``os.environ`` without PYTHONPATH entries inside this repository, plus ``extra``."""
    env = dict(os.environ)
    root = str(ROOT)
    keep = [p for p in env.get("PYTHONPATH", "").split(os.pathsep)
            if p and not os.path.abspath(p).startswith(root)]
    if keep:
        env["PYTHONPATH"] = os.pathsep.join(keep)
    else:
        env.pop("PYTHONPATH", None)
    env.update(extra)
    return env
