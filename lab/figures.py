"""Regenerate every figure of a results folder from its saved data.

Every analysis in the toolkit saves tables first and draws figures from them, so figures can be
restyled or re-exported without rerunning anything. :func:`regenerate` walks a results folder
(and its subfolders) and redraws what each kind of result supports:

- a generalization study (``study.json``): every study figure and ``report.html``;
- a circuits analysis (``activation_patching.csv``, ``path_patching.csv``, ...): heatmaps and
  circuit graphs (:mod:`circuits.figures`);
- a grokking experiment (``grokking.csv`` + ``runs/*.csv``): training-dynamics curves;
- a probe sweep table saved as ``readability.csv`` without a study: the layer x relation heatmap.

    interp figures results/            # everything under results/
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import pandas as pd

from circuits.figures import write_figures
from interp.plots import export
from jacobians.dynamics import from_log, trajectory_plot
from lab.experiments.grokking import load_logs
from lab.study.report import write_report
from probes.plots import layer_relation_heatmap

FORMATS = ("html", "png", "svg", "pdf")


def _study(folder: Path, formats) -> list[Path]:
    report = write_report(folder, static=any(f != "html" for f in formats))
    return [report] + sorted((folder / "figures").glob("*.*"))


def _circuits(folder: Path, formats) -> list[Path]:
    return write_figures(folder, formats)


def _grokking(folder: Path, formats) -> list[Path]:
    logs = load_logs(folder)
    written = []
    for (condition, seed), part in logs.groupby(["condition", "seed"]):
        fig = trajectory_plot(
            from_log(part.drop(columns=["condition", "seed"])), title=f"modular addition, {condition}, seed {seed}"
        )
        written += export(fig, folder / "figures" / f"dynamics_{condition}_seed{seed}", formats)
    return written


def _readability(folder: Path, formats) -> list[Path]:
    table = pd.read_csv(folder / "readability.csv")
    if not {"relation", "layer", "accuracy"} <= set(table.columns):
        return []
    return export(layer_relation_heatmap(table), folder / "figures" / "readability_heatmap", formats)


CIRCUIT_TABLES = (
    "activation_patching.csv",
    "path_patching.csv",
    "attribution_nodes.csv",
    "eap_edges.csv",
    "relation_circuit.csv",
    "faithfulness.csv",
)


def kinds(folder: Path) -> list[str]:
    """What results a folder holds (by the files each analysis writes)."""
    found = []
    if (folder / "study.json").exists() and (folder / "summary.json").exists():
        found.append("study")
    elif (folder / "readability.csv").exists():
        found.append("readability")
    if any((folder / name).exists() for name in CIRCUIT_TABLES):
        found.append("circuits")
    if (folder / "grokking.csv").exists() and any((folder / "runs").glob("*.csv")):
        found.append("grokking")
    return found


DRAW = {"study": _study, "circuits": _circuits, "grokking": _grokking, "readability": _readability}


def regenerate(root: str | Path, formats: Iterable[str] = FORMATS) -> dict[str, list[Path]]:
    """Redraw every figure under ``root``; returns ``folder -> files written``."""
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"no results folder at {root}")
    formats = tuple(formats)
    folders = [root] + sorted(p for p in root.rglob("*") if p.is_dir() and p.name not in ("figures", "runs"))
    out: dict[str, list[Path]] = {}
    for folder in folders:
        for kind in kinds(folder):
            out.setdefault(str(folder), []).extend(DRAW[kind](folder, formats))
    if not out:
        raise FileNotFoundError(
            f"no saved results under {root} (a study, circuits tables, a grokking experiment or a readability table)"
        )
    return out
