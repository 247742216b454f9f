"""The README's Python examples run as written (on the bundled tiny model).

Every ```python block of README.md is executed in order in one namespace, from a temporary
working directory, so an example that drifts from the API fails here.
"""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def _python_blocks(text: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", text, flags=re.S)


def test_readme_has_python_examples():
    assert len(_python_blocks(README.read_text(encoding="utf-8"))) >= 3


def test_readme_python_examples_run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    namespace: dict = {"__name__": "__readme__"}
    for i, block in enumerate(_python_blocks(README.read_text(encoding="utf-8"))):
        try:
            exec(compile(block, f"README.md python block {i + 1}", "exec"), namespace)
        except Exception as e:  # name the block so a failure points at the README
            raise AssertionError(f"README python block {i + 1} failed: {e!r}\n{block}") from e
