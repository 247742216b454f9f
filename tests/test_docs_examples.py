"""The Python examples of docs/steering.md, quality.md, bench.md and pagecache.md run as written (each
file's ```python blocks in order, in one namespace, from a temporary directory), on the bundled
tiny model."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[1] / "docs"


@pytest.mark.parametrize("name", ["steering.md", "quality.md", "bench.md", "pagecache.md"])
def test_doc_python_examples_run(name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    blocks = re.findall(r"```python\n(.*?)```", (DOCS / name).read_text(encoding="utf-8"), flags=re.S)
    assert blocks, f"{name} has no python example"
    namespace: dict = {"__name__": "__doc__"}
    for i, block in enumerate(blocks):
        try:
            exec(compile(block, f"docs/{name} python block {i + 1}", "exec"), namespace)
        except Exception as e:
            raise AssertionError(f"docs/{name} python block {i + 1} failed: {e!r}\n{block}") from e
