"""Plots of probe sweeps, built from the sweep DataFrame alone (so they can be redrawn from a CSV)."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from interp.plots import PALETTE

#: colour-blind-safe palette (Okabe & Ito)


def _by_layer(df: pd.DataFrame, metric: str) -> pd.DataFrame:
    if df.empty:
        raise ValueError("the sweep table is empty: nothing to plot")
    if metric not in df.columns:
        raise KeyError(f"no column {metric!r} in the sweep table; columns: {', '.join(df.columns)}")
    return df


def layer_relation_heatmap(df: pd.DataFrame, metric: str = "accuracy", chance_corrected: bool = False) -> go.Figure:
    """Relations (rows) x layers (columns), mean over folds and seeds."""
    df = _by_layer(df, metric).copy()
    if chance_corrected:
        df[metric] = (df[metric] - df["chance"]) / (1 - df["chance"])
    table = df.groupby(["relation", "layer"])[metric].mean().unstack("layer")
    order = table.max(axis=1).sort_values().index
    table = table.loc[order]
    fig = go.Figure(
        go.Heatmap(
            z=table.values,
            x=[str(c) for c in table.columns],
            y=list(table.index),
            colorscale="Viridis",
            colorbar=dict(title=metric + (" (chance-corrected)" if chance_corrected else "")),
            hovertemplate="relation %{y}<br>layer %{x}<br>" + metric + " %{z:.3f}<extra></extra>",
        )
    )
    fig.update_layout(
        title=f"Probe {metric} by layer and relation (mean over folds and seeds)",
        xaxis_title="layer",
        yaxis_title="relation",
        height=max(300, 22 * len(table) + 120),
        template="simple_white",
    )
    return fig


def accuracy_by_layer(df: pd.DataFrame, metric: str = "accuracy", relations=None, ci: float = 0.95) -> go.Figure:
    """Mean over folds and seeds per layer, with a normal-approximation confidence band."""
    from scipy import stats

    df = _by_layer(df, metric)
    rels = list(relations or df["relation"].unique())
    z = stats.norm.ppf(0.5 + ci / 2)
    fig = go.Figure()
    for i, rel in enumerate(rels):
        g = df[df.relation == rel].groupby("layer")[metric]
        mean, sem = g.mean(), g.sem().fillna(0.0)
        color = PALETTE[i % len(PALETTE)]
        x = list(mean.index)
        fig.add_trace(
            go.Scatter(
                x=x + x[::-1],
                y=list(mean + z * sem) + list((mean - z * sem)[::-1]),
                fill="toself",
                fillcolor=color,
                opacity=0.2,
                line=dict(width=0),
                hoverinfo="skip",
                showlegend=False,
                legendgroup=rel,
            )
        )
        fig.add_trace(
            go.Scatter(x=x, y=mean.values, mode="lines+markers", name=rel, line=dict(color=color), legendgroup=rel)
        )
    if "chance" in df.columns and len(rels) == 1:
        fig.add_hline(y=float(df[df.relation == rels[0]]["chance"].iloc[0]), line_dash="dot", annotation_text="chance")
    fig.update_layout(
        title=f"Probe {metric} by layer ({int(ci * 100)}% CI over folds and seeds)",
        xaxis_title="layer",
        yaxis_title=metric,
        template="simple_white",
    )
    return fig
