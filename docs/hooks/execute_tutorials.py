"""Execute the tutorials and save the executed copies the documentation site shows.

    python docs/hooks/execute_tutorials.py            # every tutorial (about 10 minutes on 2 cores)
    python docs/hooks/execute_tutorials.py 08 04      # those whose names start so

Each ``tutorials/<name>.ipynb`` runs top to bottom in ``tutorials/`` (as the test suite runs it)
and is written, with its outputs, to ``docs/tutorials/<name>.ipynb``, which the site renders. So
a reader sees every figure and table without running anything, and the site is built without
executing a notebook. Plotly figures are saved twice in each output: as plotly's JSON (the
notebook stays interactive when opened in Jupyter) and as a PNG (what the site, which does not run
plotly's JavaScript for notebook outputs, shows); circuitsvis views keep their inlined HTML.

``tests/test_docs_tutorials.py`` fails when an executed copy's cells are not its tutorial's: after
editing a tutorial, run this script for it and commit both.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import nbformat
from nbconvert.preprocessors import ExecutePreprocessor

ROOT = Path(__file__).resolve().parents[2]
SOURCE = ROOT / "tutorials"
EXECUTED = ROOT / "docs" / "tutorials"


def execute(path: Path, timeout: int = 1200) -> Path:
    nb = nbformat.read(path, as_version=4)
    env = {"PLOTLY_RENDERER": "plotly_mimetype+png", "TQDM_DISABLE": "1", "PYTHONWARNINGS": "ignore"}
    before = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        ExecutePreprocessor(timeout=timeout, kernel_name="python3").preprocess(nb, {"metadata": {"path": str(SOURCE)}})
    finally:
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    for cell in nb.cells:  # execution counts and timings change with every run; outputs are what matter
        cell.get("metadata", {}).pop("execution", None)
    nb.metadata.pop("widgets", None)
    EXECUTED.mkdir(parents=True, exist_ok=True)
    out = EXECUTED / path.name
    tmp = out.with_suffix(".partial")
    nbformat.write(nb, tmp)
    tmp.replace(out)
    return out


def main(prefixes: list[str]) -> None:
    paths = sorted(p for p in SOURCE.glob("*.ipynb") if not prefixes or any(p.name.startswith(x) for x in prefixes))
    if not paths:
        sys.exit(f"no tutorial in {SOURCE} starts with {prefixes}")
    for path in paths:
        start = time.perf_counter()
        out = execute(path)
        size = out.stat().st_size / 1e6
        print(f"{path.name}: {time.perf_counter() - start:.0f} s, {size:.1f} MB -> {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main(sys.argv[1:])
