"""The ```python blocks of a Markdown page, for the tests that run them as pasted. A block with
``<!-- illustrative -->`` on the line above is one a reader adapts (it needs weights, a cluster or
a long run) and is not run."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def python_blocks(text: str) -> list[tuple[bool, str]]:
    """``(runs, code)`` for each python block, in order."""
    return [
        (m.group(1) is None, m.group(2))
        for m in re.finditer(r"(<!-- illustrative -->\s*)?```python\n(.*?)```", text, flags=re.S)
    ]


def run_blocks(path: Path) -> dict:
    """Run a page's runnable blocks in order, in one namespace; returns it."""
    namespace: dict = {}
    for i, (runs, code) in enumerate(python_blocks(path.read_text())):
        if runs:
            exec(compile(code, f"{path.name} python block {i + 1}", "exec"), namespace)
    return namespace
