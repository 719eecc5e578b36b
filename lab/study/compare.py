"""The study across models: one table in the shape of the paper's, and whether models agree.

Mehri & Schutze report, per language model, the correlation between how linearly readable a
relation's answer is and how far a fine-tune that relabels it generalizes (r = 0.87-0.92 within
each of 11 LMs). :func:`compare_studies` reads finished study folders (each ``interp study``'s
``summary.json`` and ``relations.csv``; nothing is recomputed but the agreement statistics) and
writes:

- ``compare.csv``: one row per model: family, parameters, relations, the headline r (Pearson of
  best-layer readability kappa with generalization kappa, main method) with its bootstrap CI,
  permutation p and Monte-Carlo p against the study's own simulated null, the partial r with
  every covariate, mean generalization and readability kappa, and failed fine-tunes;
- ``compare_relations.csv``: the long table (model, relation, readability kappa, generalization
  kappa) the figures draw from;
- ``compare_agreement.csv`` and ``compare_agreement.json``: do models rank relations alike? For
  each pair of models, Spearman's rho of readability over the relations both studied; over the
  relations every model shares, Kendall's coefficient of concordance W (0: no agreement, 1:
  every model ranks the relations identically) from Friedman's tie-corrected statistic,
  ``W = chi2_F / (m (n - 1))`` for m models and n relations, with Friedman's asymptotic p and a
  permutation p (each model's ranks shuffled independently). The same for generalization.

Models whose studies share no relations (the world zoo and MiniLM's LRE relations) enter the
table and the figures side by side; only the agreement statistics need shared relations.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from itertools import combinations
from pathlib import Path

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots
from scipy import stats as sps

from interp.plots import PALETTE, export, fit_title, style
from interp.resampling import monte_carlo_p
from interp.results import write_json, write_table

#: the paper's band of within-model r (Mehri & Schutze 2026, 11 LMs)
PAPER_BAND = (0.87, 0.92)


class CompareError(ValueError):
    """A folder is not a finished study, or the studies cannot be compared."""


def load_study(folder: str | Path) -> tuple[dict, pd.DataFrame]:
    """A finished study's ``summary.json`` and ``relations.csv`` (a clear error otherwise)."""
    folder = Path(folder)
    missing = [n for n in ("summary.json", "relations.csv") if not (folder / n).exists()]
    if missing:
        raise CompareError(
            f"{folder} is not a finished study (no {' or '.join(missing)}); run `interp study --out {folder}` first"
        )
    return json.loads((folder / "summary.json").read_text()), pd.read_csv(folder / "relations.csv")


def _model_row(name: str, summary: dict, relations: pd.DataFrame) -> dict:
    head = summary["headline"]
    method = head["method"]
    pearson, partial = head.get("pearson", {}), head.get("partial:all", {})
    arch = summary.get("architecture") or {}
    failed = summary.get("failed_jobs") or {}
    ci = pearson.get("ci", [np.nan, np.nan])
    return {
        "model": name,
        "family": arch.get("family"),
        "parameters": arch.get("parameters"),
        "n_layers": arch.get("n_layers"),
        "d_model": arch.get("d_model"),
        "relations": summary["n_relations"],
        "method": method,
        "n": int(relations[f"generalization_kappa_{method}"].notna().sum()),
        "r": pearson.get("r", np.nan),
        "ci_low": ci[0],
        "ci_high": ci[1],
        "p_permutation": pearson.get("p_value", np.nan),
        "p_monte_carlo": pearson.get("p_monte_carlo", np.nan),
        "partial_r_all": partial.get("r", np.nan),
        "partial_p_all": partial.get("p_value", np.nan),
        "mean_generalization_kappa": summary["generalization_kappa"][method],
        "mean_readability_kappa": summary["mean_readability_best_kappa"],
        "failed_finetunes": failed.get("n_failed", np.nan),
        "finetunes": failed.get("n_finetunes", np.nan),
        "in_paper_band": PAPER_BAND[0] <= pearson.get("r", np.nan) <= PAPER_BAND[1],
        # readability minus its probe baselines (lab.study.baselines), where the study measured them
        "r_above_surface": summary.get("above_surface", {}).get("pearson", {}).get("r", np.nan),
        "r_above_baseline": summary.get("above_baseline", {}).get("pearson", {}).get("r", np.nan),
    }


def _w(ranks: np.ndarray) -> np.ndarray:
    """Kendall's W (no tie correction) of rank arrays ``[..., n relations, m models]``."""
    n, m = ranks.shape[-2:]
    sums = ranks.sum(axis=-1)
    return 12 * ((sums - sums.mean(axis=-1, keepdims=True)) ** 2).sum(axis=-1) / (m**2 * (n**3 - n))


def kendalls_w(table: pd.DataFrame, n_perm: int = 10_000, seed: int = 0) -> dict:
    """Kendall's W of ``table`` (rows: relations, columns: models; each column a model's scores),
    from Friedman's tie-corrected chi-square, with its asymptotic p and a permutation p (each
    model's ranks shuffled independently; the statistic without tie correction on both sides)."""
    n, m = table.shape
    undefined = {"w": np.nan, "n_relations": n, "n_models": m, "p_friedman": np.nan, "p_permutation": np.nan}
    if n < 3 or m < 2:
        return undefined
    values = table.to_numpy(dtype=float)
    chi2, p = sps.friedmanchisquare(*values)  # one group per relation, one observation per model
    if not np.isfinite(chi2):  # every model gives every relation the same value
        return undefined
    ranks = sps.rankdata(values, axis=0)  # [n, m]: each model ranks the relations
    observed = float(_w(ranks))
    rng = np.random.default_rng(seed)
    null = _w(np.stack([rng.permuted(ranks, axis=0) for _ in range(n_perm)]))
    return {
        "w": float(chi2 / (m * (n - 1))),
        "w_untied": observed,
        "n_relations": n,
        "n_models": m,
        "chi2_friedman": float(chi2),
        "p_friedman": float(p),
        "p_permutation": monte_carlo_p(null, observed, alternative="greater"),
    }


def agreement(long: pd.DataFrame, n_perm: int = 10_000) -> tuple[pd.DataFrame, dict]:
    """Pairwise Spearman rho between models (over the relations both studied) and Kendall's W
    over the relations all share, of readability and of generalization kappa."""
    rows, w = [], {}
    for measure in ("readability_kappa", "generalization_kappa"):
        wide = long.pivot_table(index="relation", columns="model", values=measure)
        for a, b in combinations(wide.columns, 2):
            both = wide[[a, b]].dropna()
            rho, p = sps.spearmanr(both[a], both[b]) if len(both) >= 3 else (np.nan, np.nan)
            rows.append({"measure": measure, "model_a": a, "model_b": b, "n": len(both), "rho": rho, "p_value": p})
        # W among the largest group of models that studied the same relations (the world zoo's;
        # MiniLM's LRE relations are none of them), over the relations all of them have a value for
        studied = long.groupby("model", sort=False).relation.apply(frozenset)
        groups: dict[frozenset, list[str]] = {}
        for model, names in studied.items():
            groups.setdefault(names, []).append(model)
        names, models = max(groups.items(), key=lambda kv: (len(kv[1]), len(kv[0])))
        table = wide.loc[sorted(names), models]
        kept = table.dropna()
        w[measure] = {
            "models": list(models),
            "relations_without_a_value": sorted(set(table.index) - set(kept.index)),
            **kendalls_w(kept, n_perm),
        }
    return pd.DataFrame(rows), w


def compare_studies(
    folders: Sequence[str | Path], out: str | Path | None = None, names: Sequence[str] | None = None
) -> pd.DataFrame:
    """The cross-model table of finished study ``folders`` (``names``: the models' labels; default
    each summary's model name). With ``out``, writes the tables and figures there."""
    if len(folders) < 2:
        raise CompareError(f"compare needs at least 2 study folders, got {len(folders)}")
    if names is not None and len(names) != len(folders):
        raise CompareError(f"{len(names)} names for {len(folders)} folders")
    loaded = [load_study(f) for f in folders]  # every folder checked before any work
    labels = list(names) if names else [s["model"] for s, _ in loaded]
    if len(set(labels)) != len(labels):
        raise CompareError(f"two studies have the same model name ({labels}); pass names=... (--name)")
    methods = {s["headline"]["method"] for s, _ in loaded}
    if len(methods) > 1:
        raise CompareError(
            f"the studies' headline methods differ ({', '.join(sorted(methods))}): a row of full fine-tuning "
            "beside one of LoRA compares methods, not models; run every study with the same first method"
        )
    table = pd.DataFrame([_model_row(n, s, r) for n, (s, r) in zip(labels, loaded)])
    long = pd.concat(
        [
            pd.DataFrame(
                {
                    "model": n,
                    "relation": r.relation,
                    "readability_kappa": r.readability_best_kappa,
                    "generalization_kappa": r[f"generalization_kappa_{s['headline']['method']}"],
                }
            )
            for n, (s, r) in zip(labels, loaded)
        ],
        ignore_index=True,
    )
    pairs, w = agreement(long)
    if out is not None:
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        write_table(table, out / "compare.csv")
        write_table(long, out / "compare_relations.csv")
        write_table(pairs, out / "compare_agreement.csv")
        write_json(
            {"kendalls_w": w, "paper_band": list(PAPER_BAND), "folders": [str(f) for f in folders]},
            out / "compare_agreement.json",
        )
        write_figures(out)
    return table


def write_figures(out: str | Path, formats: Sequence[str] = ("html", "png")) -> list[Path]:
    """The comparison's figures, from its saved tables (:func:`compare_figures`)."""
    out = Path(out)
    figs = compare_figures(pd.read_csv(out / "compare.csv"), pd.read_csv(out / "compare_relations.csv"))
    return [p for name, fig in figs.items() for p in export(fig, out / "figures" / name, formats)]


def compare_figures(table: pd.DataFrame, long: pd.DataFrame) -> dict[str, go.Figure]:
    """Small multiples (one readability-generalization scatter per model, shared axes) and a
    forest plot of r with its CI, the paper's band drawn."""
    models = list(table.model)
    cols = min(3, len(models))
    rows = -(-len(models) // cols)
    titles = [
        f"{m}<br><sup>r = {r:.2f} [{lo:.2f}, {hi:.2f}]</sup>"
        for m, r, lo, hi in zip(table.model, table.r, table.ci_low, table.ci_high)
    ]
    grid = make_subplots(
        rows=rows,
        cols=cols,
        shared_xaxes="all",
        shared_yaxes="all",
        subplot_titles=titles,
        horizontal_spacing=0.06,
        vertical_spacing=min(0.14, 0.9 / max(1, rows - 1)),
    )
    for i, m in enumerate(models):
        part = long[long.model == m]
        grid.add_trace(
            go.Scatter(
                x=part.readability_kappa,
                y=part.generalization_kappa,
                mode="markers",
                text=part.relation,
                marker=dict(size=8, color=PALETTE[i % len(PALETTE)]),
                hovertemplate="%{text}<br>readability %{x:.3f}<br>generalization %{y:.3f}<extra>" + m + "</extra>",
                showlegend=False,
            ),
            row=i // cols + 1,
            col=i % cols + 1,
        )
    for i in range(len(models)):
        if i + cols >= len(models):  # the lowest panel of its column
            grid.update_xaxes(title_text="readability kappa", row=i // cols + 1, col=i % cols + 1)
    grid.update_yaxes(title_text="generalization kappa", col=1)
    style(grid, "two-column")
    # the panels' two-line titles need the room between the figure's title and the first row
    grid.update_layout(
        height=330 * rows + 170,
        title="Readability vs generalization, per model",
        font=dict(size=14),
        margin=dict(t=130),
    )
    fit_title(grid)  # after the height is final: the title's place is a fraction of it
    grid.update_annotations(font_size=14)

    forest = go.Figure()
    forest.add_vrect(x0=PAPER_BAND[0], x1=PAPER_BAND[1], fillcolor="#bbbbbb", opacity=0.5, line_width=0)
    forest.add_annotation(
        x=PAPER_BAND[0],
        y=1.0,
        xref="x",
        yref="paper",
        yanchor="bottom",
        xanchor="right",
        showarrow=False,
        text="paper's 11 LMs: 0.87-0.92",
        font=dict(size=13, color="#555"),
    )
    forest.add_vline(x=0, line_dash="dot", line_color="#888")
    forest.add_trace(
        go.Scatter(
            x=table.r,
            y=table.model,
            mode="markers",
            marker=dict(size=11, color=PALETTE[0]),
            error_x=dict(
                type="data", symmetric=False, array=table.ci_high - table.r, arrayminus=table.r - table.ci_low
            ),
            customdata=np.stack([table.n, table.p_monte_carlo], axis=1),
            hovertemplate="%{y}: r = %{x:.3f}<br>n = %{customdata[0]}, "
            "Monte-Carlo p = %{customdata[1]:.3g}<extra></extra>",
        )
    )
    style(forest, "one-column")
    forest.update_layout(
        title="Readability-generalization r per model (95% CI)",
        xaxis_title="Pearson r (kappa)",
        xaxis_range=[min(-0.2, float(np.nanmin(table.ci_low)) - 0.05), 1.02],
        yaxis=dict(autorange="reversed"),
        height=max(280, 140 + 60 * len(table)),
    )
    fit_title(forest)
    return {"compare_scatter": grid, "compare_forest": forest}
