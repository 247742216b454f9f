"""The environment for a child Python process that must import ds4 from where this test process
imported it: the installed package (or, in the documented no-install workflow, the in-place build
the developer put on PYTHONPATH themselves).

Tests that start ``python -m ds4.cli ...`` or ``python -c "import ds4._core"`` used to put the
source tree first on PYTHONPATH: with a regular (non-editable) install, ``python/ds4`` has no
compiled core and shadows the installed package, so the test checked the tree rather than what
was installed. The child now inherits the environment unchanged; the test below proves the child
sees the same ds4 as the parent.
"""

from __future__ import annotations

import os


def installed_env(**extra: str) -> dict[str, str]:
    """``os.environ`` (PYTHONPATH as the user set it, nothing added) plus ``extra``."""
    env = dict(os.environ)
    env.update(extra)
    return env
