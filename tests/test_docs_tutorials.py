"""The documentation site shows every tutorial executed: ``docs/tutorials/<name>.ipynb`` is its
tutorial's cells, in order, with outputs, no error, and figures a browser can show without
running plotly (``docs/hooks/execute_tutorials.py`` writes them)."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
TUTORIALS = sorted((ROOT / "tutorials").glob("*.ipynb"))


def test_there_are_tutorials():
    assert len(TUTORIALS) >= 8


@pytest.mark.parametrize("path", TUTORIALS, ids=lambda p: p.stem)
def test_each_tutorial_has_a_current_executed_copy(path):
    copy = ROOT / "docs" / "tutorials" / path.name
    assert copy.exists(), f"no executed copy of {path.name}: run python docs/hooks/execute_tutorials.py {path.stem[:2]}"
    source, executed = nbformat.read(path, 4), nbformat.read(copy, 4)
    cells = [(c.cell_type, c.source) for c in source.cells]
    assert cells == [(c.cell_type, c.source) for c in executed.cells], (
        f"docs/tutorials/{path.name} is not {path.name} as it is now: run "
        f"python docs/hooks/execute_tutorials.py {path.stem[:2]} and commit the copy"
    )
    code = [c for c in executed.cells if c.cell_type == "code"]
    errors = [o for c in code for o in c.outputs if o.output_type == "error"]
    assert not errors, [f"{e.ename}: {e.evalue}" for e in errors]
    counts = [c.get("execution_count") for c in code]
    assert counts == list(range(1, len(code) + 1)), f"not executed top to bottom in one kernel: {counts}"
    plotly = [o for c in code for o in c.outputs if "application/vnd.plotly.v1+json" in o.get("data", {})]
    assert all("image/png" in o.data for o in plotly), "a plotly figure without a PNG: the site would show nothing"
