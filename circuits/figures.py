"""Write and redraw the figures of a circuits results folder from its saved tables.

Every analysis run from the command line saves its DataFrames as CSV (with the run's attributes
in ``<name>.json``); :func:`write_figures` rebuilds every figure from those files alone, so a
figure for a paper can be restyled without rerunning anything:

    interp circuits figures results/induction
"""

from __future__ import annotations

from pathlib import Path

from interp.plots import export
from interp.results import load_table

from .plots import circuit_graph, faithfulness_plot, head_heatmap, position_heatmap


def write_figures(folder: str | Path, formats=("html", "png", "svg", "pdf")) -> list[Path]:
    """Every figure the saved tables in ``folder`` support; returns the files written."""
    folder = Path(folder)
    figs = folder / "figures"
    written: list[Path] = []
    if (folder / "activation_patching.csv").exists():
        ap = load_table(folder, "activation_patching")
        if (ap.site == "z").any():
            z = ap[ap.site == "z"]
            one_per_cell = "ci_low" in z and not z.duplicated(["layer", "head"]).any()
            heads = z if one_per_cell else z.groupby(["layer", "head"], as_index=False)["normalized"].mean()
            written += export(
                head_heatmap(
                    heads,
                    "normalized",
                    "activation patching: head outputs",
                    significance="mark" if one_per_cell else None,
                ),
                figs / "heads_activation",
                formats,
            )
        resid = ap[ap["position"].notna() & ap["head"].isna()]
        if not resid.empty:
            written += export(
                position_heatmap(resid, "normalized", site=resid.site.iloc[0]), figs / "positions_activation", formats
            )
    if (folder / "attribution_nodes.csv").exists():
        nodes = load_table(folder, "attribution_nodes")
        written += export(
            head_heatmap(nodes[nodes.kind == "head"], "score", "attribution patching (AtP)"),
            figs / "heads_attribution",
            formats,
        )
    if (folder / "path_patching.csv").exists():
        pp = load_table(folder, "path_patching")
        written += export(
            circuit_graph(
                pp, top=12, baseline=pp.attrs.get("target_score", 0.0), title="path patching: strongest edges"
            ),
            figs / "circuit_path_patching",
            formats,
        )
    if (folder / "eap_edges.csv").exists():
        eap = load_table(folder, "eap_edges")
        written += export(
            circuit_graph(eap, top=12, title="edge attribution patching: strongest edges"),
            figs / "circuit_eap",
            formats,
        )
    for name, level in (("faithfulness", "edges"), ("node_faithfulness", "nodes")):
        if (folder / f"{name}.csv").exists():
            curve = load_table(folder, name)
            summary = load_table(folder, f"{name}_summary") if (folder / f"{name}_summary.csv").exists() else None
            if "stage" in curve:
                for stage, part in curve.groupby("stage", sort=False):
                    part = part.drop(columns="stage")
                    part.attrs.update(curve.attrs)
                    sub = None if summary is None else summary[summary.stage == stage]
                    written += export(
                        faithfulness_plot(
                            part, sub, f"{curve.attrs.get('relation', '')}: faithfulness ({stage} fine-tuning)"
                        ),
                        figs / f"{name}_{stage}",
                        formats,
                    )
            else:
                written += export(
                    faithfulness_plot(curve, summary, f"Faithfulness of circuits ({level})"), figs / name, formats
                )
    if (folder / "relation_circuit.csv").exists():
        rc = load_table(folder, "relation_circuit")
        for stage in ("before", "after"):
            part = rc[(rc.stage == stage) & rc["head"].notna()]
            if not part.empty:
                written += export(
                    head_heatmap(part, "normalized", f"{rc.attrs.get('relation', '')}: {stage} fine-tuning"),
                    figs / f"relation_{stage}",
                    formats,
                )
    if not written:
        raise FileNotFoundError(f"no circuits tables (activation_patching.csv, path_patching.csv, ...) in {folder}")
    return written
