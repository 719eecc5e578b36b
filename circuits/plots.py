"""Figures for patching results, built from their DataFrames (so they can be rebuilt from saved CSVs).

- :func:`head_heatmap`: layer x head grid of any per-head score (activation patching of ``z``,
  AtP node scores, path patching from one sender set);
- :func:`position_heatmap`: layer x position grid (residual-stream patching by position);
- :func:`circuit_graph`: the strongest edges of path patching or EAP as a layered graph, nodes at
  (layer, index), edge width and colour by score.

Tables run with ``statistics=True`` carry confidence intervals and p-values; the heatmaps then
take ``significance="mask"`` (cells that are not significant are left blank) or ``"mark"`` (they
are drawn but crossed), where significant means the interval excludes zero and the p-value is
below ``1 - confidence`` (:func:`circuits.significant`). Per cell by default; ``by="p_fdr"``
corrects for the number of cells.

All figures use the toolkit's paper style (:func:`interp.plots.style`) and export with
:func:`interp.plots.export`.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from interp.plots import PALETTE, add_caption, add_subtitle, place_labels, style

from .statistics import significant

DIVERGING = "RdBu"
SIGNIFICANCE = (None, "mask", "mark")


def _require(df: pd.DataFrame, cols, what: str):
    missing = [c for c in cols if c not in df.columns]
    if missing:
        raise ValueError(f"{what} needs columns {missing}; got {list(df.columns)}")


#: columns whose values, when several share a cell, a figure averages over (and says so)
_SPLITS = ("site", "receiver", "position", "sender", "relation", "stage")


def aggregation(rows: pd.DataFrame, index: str, columns: str) -> str:
    """How a grid of ``index`` x ``columns`` reduces rows that share a cell, in words for a title:
    "" when each cell has one row, else e.g. "mean over 7 positions"."""
    if not rows.duplicated([index, columns]).any():
        return ""
    varied = [
        f"{rows[c].nunique()} {c}s"
        for c in _SPLITS
        if c in rows and c not in (index, columns) and rows[c].nunique() > 1
    ]
    per_cell = int(rows.groupby([index, columns]).size().max())
    return f"mean over {', '.join(varied) if varied else f'{per_cell} rows a cell'}"


def _grids(rows: pd.DataFrame, index: str, columns: str, value: str, significance, what: str, by: str = "p_value"):
    """The value grid and, with ``significance``, a same-shaped boolean grid (interval excludes 0)."""
    if significance not in SIGNIFICANCE:
        raise ValueError(f"significance must be one of {SIGNIFICANCE}, got {significance!r}")
    grid = rows.groupby([index, columns])[value].mean().unstack(columns).sort_index()
    if significance is None:
        return grid, None
    if rows.duplicated([index, columns]).any():
        raise ValueError(
            f"{what}: significance needs one row per cell (intervals cannot be averaged); select one "
            "site (and receiver) before plotting"
        )
    sig = rows.assign(_sig=significant(rows, by)).groupby([index, columns])["_sig"].first().unstack(columns)
    return grid, sig.reindex(index=grid.index, columns=grid.columns).fillna(False).astype(bool)


def _heatmap(
    grid: pd.DataFrame, sig, x: list, y: list, value: str, significance, note: str = ""
) -> tuple[go.Figure, str | None]:
    """The heatmap, and the caption saying which cells are not significant (the caller adds it
    after :func:`style`, since its offset is in pixels)."""
    z = grid.to_numpy(dtype=float)
    lim = float(np.nanmax(np.abs(z))) if np.isfinite(z).any() else 1.0
    lim = lim or 1.0
    shown = np.where(sig.to_numpy(), z, np.nan) if significance == "mask" else z
    fig = go.Figure(
        go.Heatmap(z=shown, x=x, y=y, colorscale=DIVERGING, zmid=0, zmin=-lim, zmax=lim, colorbar=dict(title=value))
    )
    if significance is not None:
        rr, cc = np.nonzero(~sig.to_numpy())
        if significance == "mark":
            fig.add_trace(
                go.Scatter(
                    x=[x[c] for c in cc],
                    y=[y[r] for r in rr],
                    mode="markers",
                    name="not significant",
                    marker=dict(symbol="x-thin", size=10, line=dict(width=1.5, color="black")),
                    showlegend=False,  # the caption says what a cross means
                    hoverinfo="skip",
                )
            )
        caption = (
            f"{'blank' if significance == 'mask' else 'crossed'}: not significant, {len(rr)} of {z.size} cells ({note})"
        )
        return fig, caption
    return fig, None


def _note(df: pd.DataFrame, by: str) -> str:
    level = round(100 * df.attrs.get("confidence", 0.95))
    pairs = df.attrs.get("statistics_pairs", df.attrs.get("n_pairs", "?"))
    scope = "corrected over cells (FDR)" if by == "p_fdr" else "per cell, uncorrected"
    return f"{level}% CI covers 0 or p >= {1 - level / 100:.2f}; {pairs} pairs; {scope}"


def head_heatmap(
    df: pd.DataFrame,
    value: str = "score",
    title: str | None = None,
    size: str = "one-column",
    significance: str | None = None,
    by: str = "p_value",
    position: int | None = None,
) -> go.Figure:
    """Layer x head heatmap of ``value`` (rows with a head; other rows ignored).

    A table with several rows a head (per position, as ``ActivationPatching`` gives by default,
    or several sites) is averaged, and the title says so ("mean over 7 positions"); ``position=``
    plots one position instead.

    ``significance``: ``"mask"`` blanks, ``"mark"`` crosses the cells that are not significant
    (:func:`circuits.significant` with ``by``; tables from an analyzer run with ``statistics=True``)."""
    _require(df, ["layer", "head", value], "head_heatmap")
    heads = df[df["head"].notna()]
    if position is not None:
        if "position" not in heads or heads["position"].isna().all():
            raise ValueError("head_heatmap: position= needs per-position rows (ActivationPatching by_position=True)")
        heads = heads[heads["position"] == position]
    if heads.empty:
        raise ValueError(
            "head_heatmap: no per-head rows in the DataFrame (patch site 'z', 'q', 'k' or 'v', or use node scores)"
            + (f" at position {position}" if position is not None else "")
        )
    grid, sig = _grids(heads, "layer", "head", value, significance, "head_heatmap", by)
    fig, note = _heatmap(
        grid,
        sig,
        [f"H{int(h)}" for h in grid.columns],
        [f"L{int(l)}" for l in grid.index],
        value,
        significance,
        _note(df, by),
    )
    how = aggregation(heads, "layer", "head")
    shown = title or f"{value} by layer and head" + (f" at position {position}" if position is not None else "")
    fig.update_layout(title=f"{shown} ({how})" if how else shown, xaxis_title="head", yaxis_title="layer")
    fig.update_yaxes(autorange="reversed")
    style(fig, size)
    return add_subtitle(fig, note) if note else fig


def position_heatmap(
    df: pd.DataFrame,
    value: str = "score",
    site: str | None = None,
    tokens=None,
    title: str | None = None,
    size: str = "two-column",
    significance: str | None = None,
    by: str = "p_value",
) -> go.Figure:
    """Layer x position heatmap for a per-position activation patching result (``significance``
    as in :func:`head_heatmap`)."""
    _require(df, ["layer", "position", value], "position_heatmap")
    rows = df[df["position"].notna() & df["head"].isna()] if "head" in df else df[df["position"].notna()]
    if site is not None:
        rows = rows[rows["site"] == site]
    if rows.empty:
        raise ValueError("position_heatmap: no per-position rows (run ActivationPatching with by_position=True)")
    grid, sig = _grids(rows, "layer", "position", value, significance, "position_heatmap", by)
    x = [f"{int(p)}:{tokens[int(p)]}" if tokens is not None else str(int(p)) for p in grid.columns]
    fig, note = _heatmap(grid, sig, x, [f"L{int(l)}" for l in grid.index], value, significance, _note(df, by))
    how = aggregation(rows, "layer", "position")
    shown = title or f"{value} by layer and position"
    fig.update_layout(title=f"{shown} ({how})" if how else shown, xaxis_title="position", yaxis_title="layer")
    fig.update_yaxes(autorange="reversed")
    style(fig, size)
    return add_subtitle(fig, note) if note else fig


def _node_xy(name: str, layer: int, n_heads: int) -> tuple[float, float]:
    """x = column within the layer (heads, then MLP; receivers' q/k/v share the head's column);
    y = depth (embeddings at the bottom, logits at the top)."""
    base = name.split(".")[0]
    if base == "embed":
        return ((n_heads - 1) / 2, -1.0)
    if base == "logits":
        return ((n_heads - 1) / 2, layer + 0.0)
    if base.startswith("MLP"):
        return (n_heads + 0.5, layer + 0.5)
    head = int(base.split("H")[1])
    # a receiver's q, k and v inputs sit apart (about 8 px at any head count), so that edges from one
    # sender into two of them do not coincide
    step = 0.015 * max(n_heads, 2)
    shift = {"q": -step, "k": 0.0, "v": step}.get(name.split(".")[1], 0.0) if "." in name else 0.0
    return (float(head) + shift, float(layer))


#: the line style of an edge into a head's query, key or value input (letters written on the
#: edges, as before, landed on the nodes' names)
INPUT_DASH = {"q": "solid", "k": "dash", "v": "dot"}


def circuit_graph(
    edges: pd.DataFrame,
    top: int = 20,
    value: str = "score",
    baseline: float = 0.0,
    title: str | None = None,
    size: str = "one-column",
) -> go.Figure:
    """The ``top`` edges by ``|value - baseline|`` as a layered graph (width and colour: effect).

    For path patching, pass ``baseline=df.attrs["target_score"]`` so an edge's effect is its
    change from the unpatched run; EAP scores are effects already (baseline 0).
    """
    _require(edges, ["sender", "receiver", "receiver_layer", "sender_layer", value], "circuit_graph")
    if edges.empty:
        raise ValueError("circuit_graph: no edges")
    e = edges.assign(effect=edges[value] - baseline)
    e = e.reindex(e["effect"].abs().sort_values(ascending=False).index).head(top)
    n_heads = (
        int(max(pd.concat([edges["sender_head"], edges["receiver_head"]]).dropna().max() + 1, 1))
        if "receiver_head" in edges
        else 4
    )
    lim = float(e["effect"].abs().max()) or 1.0
    fig = go.Figure()
    pos = {}
    for row in e.itertuples():
        s = _node_xy(row.sender, int(row.sender_layer), n_heads)
        r_layer = row.receiver_layer if pd.notna(row.receiver_layer) else edges["sender_layer"].max() + 1
        r = _node_xy(row.receiver, int(r_layer), n_heads)
        pos[row.sender.split(".")[0]] = s
        pos[row.receiver.split(".")[0]] = _node_xy(row.receiver.split(".")[0], int(r_layer), n_heads)
        colour = PALETTE[5] if row.effect < 0 else PALETTE[0]
        width = 1 + 7 * abs(row.effect) / lim
        label = f"{row.sender} → {row.receiver}: {row.effect:+.3g}"
        into = row.receiver.split(".")[1] if "." in row.receiver else ""
        fig.add_trace(
            go.Scatter(
                x=[s[0], r[0]],
                y=[s[1], r[1]],
                mode="lines",
                line=dict(color=colour, width=width, dash=INPUT_DASH.get(into, "solid")),
                hoverinfo="text",
                text=[label, label],
                showlegend=False,
            )
        )
    for into in [i for i in INPUT_DASH if e.receiver.str.endswith("." + i).any()]:  # a legend of the dashes
        fig.add_trace(
            go.Scatter(
                x=[None],
                y=[None],
                mode="lines",
                line=dict(color="black", width=2, dash=INPUT_DASH[into]),
                name=f"into {into}",
            )
        )
    names = list(pos)
    fig.add_trace(
        go.Scatter(
            x=[pos[n][0] for n in names],
            y=[pos[n][1] for n in names],
            mode="markers+text",
            text=names,
            textposition="top center",
            marker=dict(size=14, color="white", line=dict(color="black", width=1.5)),
            showlegend=False,
            hoverinfo="text",
        )
    )
    fig.update_layout(
        title=title or f"strongest {len(e)} edges ({value}; blue raises, orange lowers the metric)",
        legend=dict(orientation="h", x=0, y=-0.02, yanchor="top"),
        xaxis=dict(visible=False, range=[min(p[0] for p in pos.values()) - 0.6, max(p[0] for p in pos.values()) + 0.6]),
        yaxis=dict(title="layer", zeroline=False, dtick=1),
    )
    return place_labels(style(fig, size))


def faithfulness_plot(
    curve: pd.DataFrame, summary: pd.DataFrame | None = None, title: str | None = None, size: str = "one-column"
) -> go.Figure:
    """Faithfulness against circuit size for each method, with the random circuits' mean and range
    as a band; ``summary`` (``Faithfulness.summary_``) adds each method's CPR and CMD as a caption.

    x is the fraction of items actually kept (``n_items / N``; sizes with no item are left out of
    the log axis), while CPR and CMD are areas on a linear axis from 0 to 1."""
    _require(curve, ["method", "n_items", "faithfulness"], "faithfulness_plot")
    n_total = curve.attrs.get("n_items") or int(curve.n_items.max())
    curve = curve[curve.n_items > 0].assign(fraction=lambda d: d.n_items / n_total)
    fig = go.Figure()
    rand = curve[curve.method == "random"]
    if not rand.empty:
        band = rand.groupby("fraction").faithfulness.agg(["mean", "min", "max"]).reset_index()
        n = rand["draw"].nunique()
        fig.add_trace(
            go.Scatter(
                x=band.fraction, y=band["max"], mode="lines", line=dict(width=0), showlegend=False, hoverinfo="skip"
            )
        )
        fig.add_trace(
            go.Scatter(
                x=band.fraction,
                y=band["min"],
                mode="lines",
                line=dict(width=0),
                fill="tonexty",
                fillcolor="rgba(150,150,150,0.3)",
                showlegend=False,
                hoverinfo="skip",
            )
        )
        fig.add_trace(
            go.Scatter(
                x=band.fraction,
                y=band["mean"],
                mode="lines",
                name=f"random ({n})",
                line=dict(color="grey", dash="dash"),
            )
        )
    methods = [m for m in curve.method.unique() if m != "random"]
    for i, name in enumerate(methods):
        g = curve[curve.method == name].drop_duplicates("n_items").sort_values("fraction")
        hover = [f"{name}: {k} items ({f:.1%}), f = {v:.3f}" for k, f, v in zip(g.n_items, g.fraction, g.faithfulness)]
        fig.add_trace(
            go.Scatter(
                x=g.fraction,
                y=g.faithfulness,
                mode="lines+markers",
                name=name,
                line=dict(color=PALETTE[i % len(PALETTE)]),
                text=hover,
                hoverinfo="text",
            )
        )
    fig.add_hline(y=1.0, line=dict(color="black", width=1, dash="dot"))
    caption = ""
    if summary is not None and not summary.empty:
        parts = [f"{r.method} {r.cpr:.3f} / {r.cmd:.3f}" for r in summary.itertuples()]
        if "random_cpr_mean" in summary:
            r = summary.iloc[0]
            parts.append(f"random {r.random_cpr_mean:.3f} (SD {r.random_cpr_sd:.3f}) / {r.random_cmd_mean:.3f}")
        caption = "<br>".join(["CPR / CMD: " + parts[0], *parts[1:]])
    level = curve.attrs.get("level", "edge")
    fig.update_layout(
        title=title or "Circuit faithfulness",
        xaxis_title=f"circuit size (fraction of the {n_total} {level}s kept)",
        yaxis_title="faithfulness f(C)",
    )
    fig.update_xaxes(type="log")
    fig = style(fig, size)
    if caption:  # below the axis title and the log axis's two rows of tick labels
        add_caption(fig, caption, below=100)
    return fig
