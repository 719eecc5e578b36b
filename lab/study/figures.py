"""The study's figures, built only from the tables it saved (so ``interp study figures DIR``
redraws them from a results folder)."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import plotly.graph_objects as go

from interp.plots import PALETTE, place_labels, style
from probes.plots import accuracy_by_layer


def scatter(
    relations: pd.DataFrame,
    stats: pd.DataFrame,
    method: str,
    x: str = "readability_best_kappa",
    y: str = "generalization_kappa",
) -> go.Figure:
    row = stats[
        (stats.method == method) & (stats.predictor == x) & (stats.outcome == y) & (stats.analysis == "pearson")
    ]
    measure = "kappa" if x.endswith("kappa") else "accuracy"
    title = f"Readability vs generalization ({method} fine-tuning, {measure})"
    if len(row):
        r = row.iloc[0]
        mc = getattr(r, "p_monte_carlo", float("nan"))
        p = (
            f"Monte-Carlo p = {mc:.2g} (permutation p = {r.p_value:.2g})"
            if pd.notna(mc)
            else f"permutation p = {r.p_value:.3g}"
        )
        title += f"<br><sup>Pearson r = {r.r:.2f} [{r.ci_low:.2f}, {r.ci_high:.2f}], {p}, n = {int(r.n)}</sup>"
    fig = go.Figure(
        go.Scatter(
            x=relations[x],
            y=relations[f"{y}_{method}"],
            mode="markers+text",
            text=relations.relation,
            textposition="top center",
            textfont=dict(size=11),
            marker=dict(size=10, color=PALETTE[0]),
            hovertemplate="%{text}<br>readability %{x:.3f}<br>generalization %{y:.3f}<extra></extra>",
        )
    )
    if measure == "kappa":
        fig.add_hline(y=0, line_dash="dot", line_color="#888")
        fig.update_layout(
            xaxis_title="probe kappa of the original answer (best layer; 0 = chance)",
            yaxis_title="held-out kappa of the new labels (0 = chance)",
        )
    else:
        fig.update_layout(
            xaxis_title="probe accuracy of the original answer (best layer)",
            yaxis_title="held-out accuracy of the new labels",
        )
    fig.update_layout(title=title)
    return place_labels(style(fig, "two-column"))


def null_calibration(null: pd.DataFrame) -> go.Figure:
    """False-positive rate of every statistic on simulated studies with no generalization."""
    fig = go.Figure()
    null = null[null.method == null.method.iloc[0]] if "method" in null and len(null) else null
    i = 0
    for outcome, g in null.groupby("outcome", sort=False):
        name = "kappa" if outcome.endswith("kappa") else "raw accuracy"
        for col, test in (("false_positive_rate", "conventional"), ("false_positive_rate_monte_carlo", "Monte-Carlo")):
            if col in g:
                se = (g[col] * (1 - g[col]) / g.n_sim) ** 0.5  # binomial Monte-Carlo error of this rate
                fig.add_trace(
                    go.Bar(
                        x=g.analysis,
                        y=g[col],
                        name=f"{name}, {test} test",
                        marker_color=PALETTE[i % len(PALETTE)],
                        error_y=dict(type="data", array=1.96 * se),
                    )
                )
                i += 1
    alpha = float(null.alpha.iloc[0]) if len(null) else 0.05
    fig.add_hline(
        y=alpha,
        line_dash="dash",
        line_color=PALETTE[5],
        annotation_text=f"nominal {alpha:g}",
        annotation_position="top left",
        layer="above",
    )
    n = int(null.n_sim.iloc[0]) if len(null) else 0
    fig.update_layout(
        title=f"Null calibration: false-positive rates with no generalization ({n} simulated studies)",
        yaxis_title="false-positive rate",
        barmode="group",
    )
    return style(fig, "two-column")


def layer_curves(readability: pd.DataFrame) -> go.Figure:
    fig = accuracy_by_layer(readability)
    fig.update_layout(title="Readability by layer (mean over folds, 95% CI)")
    return style(fig, "two-column")


def robustness(rob: pd.DataFrame) -> go.Figure:
    fig = go.Figure()
    for i, (kind, g) in enumerate(rob.groupby("varied", sort=False)):
        fig.add_trace(
            go.Box(
                y=g.r,
                name=kind,
                boxpoints="all",
                jitter=0.3,
                marker_color=PALETTE[i % len(PALETTE)],
                text=g.setting,
                hovertemplate="%{text}: r = %{y:.3f}<extra></extra>",
            )
        )
    fig.update_layout(
        title="Robustness of the correlation (Pearson r of kappas, per setting)",
        yaxis_title="Pearson r",
        showlegend=False,
    )
    return style(fig, "one-column")


def backmap(table: pd.DataFrame, summary: dict) -> go.Figure:
    """Observed / expected rate at which a wrong label maps back into each top-k (wrong answers only)."""
    k = summary["config"]["top_k"]
    t = table[table.informative.astype(bool)]
    fig = go.Figure()
    for i, who in enumerate(("probe", "model")):
        name = "linear probe" if who == "probe" else "pretrained model"
        for j, (method, g) in enumerate(t.groupby("method", sort=False)):
            fig.add_trace(
                go.Bar(
                    x=g.relation,
                    y=g[f"{who}_ratio"],
                    name=f"{name} ({method})",
                    marker_color=PALETTE[(2 * i + j) % len(PALETTE)],
                    customdata=g.n_errors,
                    hovertemplate="%{x}: %{y:.2f}x expected (%{customdata} errors)<extra></extra>",
                )
            )
    fig.add_hline(
        y=1,
        line_dash="dash",
        line_color=PALETTE[5],
        annotation_text="uniformly random wrong answer",
        annotation_position="top left",
        layer="above",
    )
    b = summary["backmap"].get(summary["methods"][0], {})
    sub = (
        f"<br><sup>pooled: probe {b.get('probe_ratio', float('nan')):.2f}x, "
        f"model {b.get('model_ratio', float('nan')):.2f}x uniform "
        f"({b.get('probe_ratio_shuffled', float('nan')):.2f}x, "
        f"{b.get('model_ratio_shuffled', float('nan')):.2f}x shuffled); "
        f"paired Wilcoxon p = {b.get('wilcoxon_p', float('nan')):.3g} over {b.get('n_relations', 0)} relations</sup>"
    )
    fig.update_layout(
        title=f"Wrong labels mapped back into the top-{k} wrong answers, observed / expected" + sub,
        yaxis_title="observed / expected",
        barmode="group",
    )
    return style(fig, "two-column")


def build_all(out: str | Path) -> dict[str, go.Figure]:
    out = Path(out)
    relations = pd.read_csv(out / "relations.csv")
    stats = pd.read_csv(out / "stats.csv")
    summary = json.loads((out / "summary.json").read_text())
    figs = {f"scatter_{m}": scatter(relations, stats, m) for m in summary["config"]["methods"]}
    figs["layers"] = layer_curves(pd.read_csv(out / "readability.csv"))
    figs["robustness"] = robustness(pd.read_csv(out / "robustness.csv"))
    figs["backmap"] = backmap(pd.read_csv(out / "backmap.csv"), summary)
    figs["null_calibration"] = null_calibration(pd.read_csv(out / "null_calibration.csv"))
    figs.update(
        {
            f"scatter_raw_{m}": scatter(relations, stats, m, "readability_best", "generalization")
            for m in summary["config"]["methods"]
        }
    )
    return figs
