"""The study's figures, built only from the tables it saved (so ``interp study figures DIR``
redraws them from a results folder)."""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import plotly.graph_objects as go

from ..plots import PALETTE, style


def scatter(relations: pd.DataFrame, stats: pd.DataFrame, method: str, x: str = "readability_best",
            y: str = "generalization") -> go.Figure:
    row = stats[(stats.method == method) & (stats.predictor == x) & (stats.outcome == y) & (stats.analysis == "pearson")]
    title = f"Readability vs generalization ({method} fine-tuning)"
    if len(row):
        r = row.iloc[0]
        title += f"<br><sup>Pearson r = {r.r:.2f} [{r.ci_low:.2f}, {r.ci_high:.2f}], permutation p = {r.p_value:.3g}, n = {int(r.n)}</sup>"
    fig = go.Figure(go.Scatter(
        x=relations[x], y=relations[f"{y}_{method}"], mode="markers+text", text=relations.relation,
        textposition="top center", textfont=dict(size=11), marker=dict(size=10, color=PALETTE[0]),
        hovertemplate="%{text}<br>readability %{x:.3f}<br>generalization %{y:.3f}<extra></extra>",
    ))
    fig.update_layout(title=title, xaxis_title="probe accuracy of the original answer (best layer)",
                      yaxis_title="held-out accuracy of the new labels")
    return style(fig, "two-column")


def layer_curves(readability: pd.DataFrame) -> go.Figure:
    from probes.plots import accuracy_by_layer

    fig = accuracy_by_layer(readability)
    fig.update_layout(title="Readability by layer (mean over folds, 95% CI)")
    return style(fig, "two-column")


def robustness(rob: pd.DataFrame) -> go.Figure:
    fig = go.Figure()
    for i, (kind, g) in enumerate(rob.groupby("varied", sort=False)):
        fig.add_trace(go.Box(y=g.r, name=kind, boxpoints="all", jitter=0.3, marker_color=PALETTE[i % len(PALETTE)],
                             text=g.setting, hovertemplate="%{text}: r = %{y:.3f}<extra></extra>"))
    fig.update_layout(title="Robustness of the correlation (Pearson r per setting)", yaxis_title="Pearson r",
                      showlegend=False)
    return style(fig, "one-column")


def backmap(summary: dict) -> go.Figure:
    b = summary["backmap"]
    k = summary["config"]["top_k"]
    fig = go.Figure(go.Bar(x=[f"probe top-{k}", f"pretrained model top-{k}"], y=[b["probe_topk_rate"], b["model_topk_rate"]],
                           marker_color=[PALETTE[0], PALETTE[1]], text=[f"{b['probe_topk_rate']:.2f}", f"{b['model_topk_rate']:.2f}"],
                           textposition="outside"))
    fig.update_layout(title=f"Wrong labels mapped back to original answers (n = {b['n_errors']})",
                      yaxis_title="fraction of errors", yaxis_range=[0, 1.1])
    return style(fig, "one-column")


def build_all(out: str | Path) -> dict[str, go.Figure]:
    out = Path(out)
    relations = pd.read_csv(out / "relations.csv")
    stats = pd.read_csv(out / "stats.csv")
    summary = json.loads((out / "summary.json").read_text())
    figs = {f"scatter_{m}": scatter(relations, stats, m) for m in summary["config"]["methods"]}
    figs["layers"] = layer_curves(pd.read_csv(out / "readability.csv"))
    figs["robustness"] = robustness(pd.read_csv(out / "robustness.csv"))
    figs["backmap"] = backmap(summary)
    return figs
