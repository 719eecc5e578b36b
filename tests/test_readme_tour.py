"""README's tour runs as pasted: every ```python block of README.md, in order, in one namespace,
in a fresh folder (a block marked ``<!-- illustrative -->`` just above it is skipped: the study,
which takes 12 minutes, is run by its own tests)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"


def tour_blocks(text: str) -> list[tuple[bool, str]]:
    """(runs, code) for each python block, in order."""
    out = []
    for m in re.finditer(r"(<!-- illustrative -->\s*)?```python\n(.*?)```", text, flags=re.S):
        out.append((m.group(1) is None, m.group(2)))
    return out


def test_the_tour_marks_only_the_study_as_illustrative():
    blocks = tour_blocks(README.read_text())
    assert len(blocks) >= 5
    assert [code for runs, code in blocks if not runs] == [c for _, c in blocks if "run_study(" in c]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_readme_tour_runs_as_pasted(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    for i, (runs, code) in enumerate(tour_blocks(README.read_text())):
        if runs:
            exec(compile(code, f"README.md python block {i + 1}", "exec"), namespace)
    assert len(namespace["mine"]) == 1 and namespace["mine"][0].name == "home city"
    assert namespace["heads"].score.notna().all()
    assert (tmp_path / "figures" / "city_heads.html").exists()
