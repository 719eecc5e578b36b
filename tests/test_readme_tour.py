"""README's tour and the docs pages' examples run as pasted: every ```python block, in order, in
one namespace per page, in a fresh folder (tests/doc_blocks.py; a block marked
``<!-- illustrative -->`` is skipped: the study, which takes 12 minutes, and code that needs
weights or a cluster)."""

from __future__ import annotations

import pytest
from doc_blocks import ROOT, python_blocks, run_blocks

PAGES = sorted(p.name for p in (ROOT / "docs").glob("*.md") if python_blocks(p.read_text()))


def test_the_tour_marks_only_the_study_as_illustrative():
    blocks = python_blocks((ROOT / "README.md").read_text())
    assert len(blocks) >= 5
    assert [code for runs, code in blocks if not runs] == [c for _, c in blocks if "run_study(" in c]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_readme_tour_runs_as_pasted(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    namespace = run_blocks(ROOT / "README.md")
    assert len(namespace["mine"]) == 1 and namespace["mine"][0].name == "home city"
    assert namespace["heads"].score.notna().all()
    assert (tmp_path / "figures" / "city_heads.html").exists()


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("page", PAGES)
def test_docs_examples_run_as_pasted(page, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert PAGES  # the pages with examples are found
    run_blocks(ROOT / "docs" / page)
