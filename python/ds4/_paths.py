"""Where ds4 keeps generated files (synthetic models): the user cache directory.

``$DS4_CACHE_DIR`` wins, then ``$XDG_CACHE_HOME/ds4``, then ``~/.cache/ds4``.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["cache_dir"]


def cache_dir(create: bool = True) -> Path:
    """The ds4 cache directory (created when ``create``)."""
    env = os.environ.get("DS4_CACHE_DIR")
    if env:
        d = Path(env)
    else:
        xdg = os.environ.get("XDG_CACHE_HOME")
        d = (Path(xdg) if xdg else Path.home() / ".cache") / "ds4"
    if create:
        d.mkdir(parents=True, exist_ok=True)
    return d
