"""The interventions' results across relations, their figures and their page.

- :func:`relations_summary`: means over relations; the excess drop, its shuffled-control twin and the
  steering excess each with a bootstrap CI over relations and a sign-flip p
  (:func:`across_relations`, :mod:`interp.resampling`); whether they grow with readability
  (Pearson r, :mod:`lab.study.stats`);
- :func:`figures`, :func:`write_report`, :func:`section`: built from the saved tables alone.
"""

from __future__ import annotations

import html
import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from interp.plots import PALETTE, export, place_labels, style
from interp.resampling import bootstrap_indices, percentile_interval, resampled_means, sign_flip_p
from interp.results import write_text

from ..stats import pearson


def across_relations(values: Sequence[float], n_boot: int, seed: int) -> dict:
    """Mean over relations with a bootstrap CI over relations and a two-sided sign-flip p-value
    (relations are the independent units: each value carries its fine-tune's own noise)."""
    v = np.asarray([x for x in values if np.isfinite(x)], float)
    if len(v) < 2:
        return {"mean": float(v.mean()) if len(v) else float("nan"), "n": len(v)}
    rng = np.random.default_rng(seed)
    boot = resampled_means(v, bootstrap_indices(rng, len(v), n_boot))
    signs = rng.choice([-1.0, 1.0], (n_boot, len(v)))
    return {
        "mean": float(v.mean()),
        "ci": list(percentile_interval(boot)),
        "p_sign_flip": sign_flip_p(v, signs),
        "n": len(v),
    }


def relations_summary(table: pd.DataFrame, config, model: str, template: str) -> dict:
    """Across relations: means with CIs over relations, and whether the excess drop and the
    steering excess grow with readability."""

    def corr(y: str) -> dict:
        t = table[["readability_kappa", y]].dropna()
        if len(t) < 3:
            return {"r": float("nan"), "n": len(t)}
        out = pearson(t.readability_kappa, t[y], config.n_boot, config.n_boot, config.seed)
        return {"r": out["r"], "ci": [out["ci_low"], out["ci_high"]], "p_value": out["p_value"], "n": out["n"]}

    means = (
        "probe_before_kappa",
        "probe_after_kappa",
        "probe_after_tuned_kappa",
        "transfer_before_kappa",
        "transfer_after_kappa",
        "moved_leace",
        "moved_shuffled",
        "moved_random",
        "generalization_none",
        "generalization_leace",
        "generalization_shuffled",
        "generalization_random",
        "excess_drop",
        "excess_drop_shuffled",
        "bottleneck_rank",
        "bottleneck_leftover_covariance",
        "bottleneck_probe_before_kappa",
        "bottleneck_probe_after_kappa",
        "bottleneck_probe_after_tuned_kappa",
        "bottleneck_transfer_before_kappa",
        "bottleneck_transfer_after_kappa",
        "moved_bottleneck_leace",
        "generalization_bottleneck_leace",
        "generalization_bottleneck_shuffled",
        "generalization_bottleneck_random",
        "bottleneck_excess_drop",
        "bottleneck_excess_drop_shuffled",
        "alltoken_sites",
        "alltoken_rank",
        "alltoken_leftover_covariance",
        "alltoken_transfer_after_kappa",
        "alltoken_probe_after_tuned_kappa",
        "generalization_alltoken_leace",
        "generalization_alltoken_shuffled",
        "generalization_alltoken_random",
        "alltoken_excess_drop",
        "alltoken_excess_drop_shuffled",
        "recall_none",
        "recall_leace",
        "recall_shuffled",
        "recall_random",
        "recall_bottleneck_leace",
        "recall_bottleneck_shuffled",
        "recall_bottleneck_random",
        "recall_alltoken_leace",
        "recall_alltoken_shuffled",
        "recall_alltoken_random",
        "switch_rate",
        "switch_rate_random",
        "switch_rate_shuffled",
        "switch_rate_other",
        "changed_rate",
        "changed_rate_random",
        "switch_excess",
        "switch_excess_shuffled",
        "switch_excess_other",
    )
    return {
        "model": model,
        "template": template,
        "n_relations": int(len(table)),
        "config": config.to_dict(),
        "mean": {c: float(table[c].mean()) if c in table else float("nan") for c in means},
        "switch_excess": across_relations(table.switch_excess, config.n_boot, config.seed),
        **{
            k: across_relations(table[k], config.n_boot, config.seed)
            for k in (
                "excess_drop",
                "excess_drop_shuffled",
                "bottleneck_excess_drop",
                "bottleneck_excess_drop_shuffled",
                "alltoken_excess_drop",
                "alltoken_excess_drop_shuffled",
            )
            if k in table
        },
        **{
            f"switch_excess_{k}": across_relations(table[f"switch_excess_{k}"].dropna(), config.n_boot, config.seed)
            for k in ("shuffled", "other")
            if f"switch_excess_{k}" in table and table[f"switch_excess_{k}"].notna().any()
        },
        "relations_with_other_relation_control": int(table.other_relation.notna().sum())
        if "other_relation" in table
        else 0,
        **{
            f"relations_{p}excess_drop_ci_above_0": int((table[f"{p}excess_drop_ci_low"] > 0).sum())
            if f"{p}excess_drop_ci_low" in table
            else 0
            for p in ("", "bottleneck_", "alltoken_")
        },
        "relations_switch_excess_ci_above_0": int((table.switch_excess_ci_low > 0).sum()),
        **{
            f"{p}excess_drop_vs_readability": corr(f"{p}excess_drop")
            if f"{p}excess_drop" in table
            else {"r": float("nan"), "n": 0}
            for p in ("", "bottleneck_", "alltoken_")
        },
        "switch_excess_vs_readability": corr("switch_excess"),
    }


# figures and report ----------------------------------------------------------------------------
def figures(out: Path) -> dict[str, go.Figure]:
    t = pd.read_csv(out / "interventions.csv").sort_values("readability_kappa")
    s = json.loads((out / "interventions.json").read_text())
    bars = go.Figure()
    for (col, name), color in zip(
        [
            ("generalization_none", "no erasure"),
            ("generalization_random", "random subspace"),
            ("generalization_shuffled", "shuffled answers (LEACE)"),
            ("generalization_leace", "answer erased (LEACE)"),
            ("generalization_bottleneck_leace", "answer erased at the input (LEACE)"),
            ("generalization_alltoken_leace", "answer erased at every subject token and layer (LEACE)"),
        ],
        PALETTE,
    ):
        if col in t:
            bars.add_bar(x=t.relation, y=t[col], name=name, marker_color=color)
    bars.update_layout(
        title="Held-out generalization under erasure (kappa)",
        barmode="group",
        yaxis_title="kappa (0 = chance)",
        xaxis_tickangle=-45,
    )
    figs = {"erasure": style(bars, "two-column")}
    for y, name in (
        ("excess_drop", "excess drop (random - LEACE)"),
        ("switch_excess", "switch rate excess over random"),
    ):
        if y not in t:
            continue
        c = s[f"{y}_vs_readability"]
        sub = (
            f"<br><sup>Pearson r = {c['r']:.2f} "
            f"[{c.get('ci', [np.nan] * 2)[0]:.2f}, {c.get('ci', [np.nan] * 2)[1]:.2f}], "
            f"permutation p = {c.get('p_value', np.nan):.2g}, n = {c['n']}</sup>"
        )
        err = dict(type="data", symmetric=False, array=t[f"{y}_ci_high"] - t[y], arrayminus=t[y] - t[f"{y}_ci_low"])
        fig = go.Figure(
            go.Scatter(
                x=t.readability_kappa,
                y=t[y],
                mode="markers+text",
                text=t.relation,
                error_y=err,
                textposition="top center",
                textfont=dict(size=11),
                marker=dict(size=10, color=PALETTE[0]),
            )
        )
        fig.add_hline(y=0, line_dash="dot", line_color="#888")
        fig.update_layout(
            title=f"{name} vs readability{sub}",
            xaxis_title="probe kappa of the original answer (best layer)",
            yaxis_title=name,
        )
        figs[y] = place_labels(style(fig, "two-column"))
    return figs


def write_report(out: str | Path) -> Path:
    """Figures (HTML, and PNG/SVG/PDF where kaleido can) and ``interventions.html`` from the saved tables."""
    out = Path(out)
    figs = figures(out)
    for name, fig in figs.items():
        export(fig, out / "figures" / f"interventions_{name}")
    s = json.loads((out / "interventions.json").read_text())
    t = pd.read_csv(out / "interventions.csv")
    parts = "".join(
        f"<section>{fig.to_html(full_html=False, include_plotlyjs=i == 0)}</section>"
        for i, fig in enumerate(figs.values())
    )
    page = (
        f"""<!doctype html><html><head><meta charset="utf-8"><title>Interventions: {html.escape(s["model"])}</title>
<style>body{{font-family:Arial,Helvetica,sans-serif;max-width:1500px;margin:2em auto;padding:0 1em}}"""
        f"""table{{border-collapse:collapse;font-size:13px}}
td,th{{border:1px solid #ccc;padding:3px 6px;text-align:right}}</style></head><body>
<h1>Is the readable direction what the fine-tune uses?</h1>
<p>{html.escape(section(out))}</p>
{parts}<section><h2>Relations</h2>{t.to_html(index=False, float_format=lambda v: f"{v:.3f}")}</section></body></html>"""
    )
    path = out / "interventions.html"
    write_text(page, path)
    return path


def section(out: str | Path) -> str:
    """The findings in one paragraph, from the saved tables."""
    s = json.loads((Path(out) / "interventions.json").read_text())
    m, w = s["mean"], s["switch_excess_vs_readability"]
    nan2 = [np.nan] * 2
    ci = lambda c: f"[{c.get('ci', nan2)[0]:.3f}, {c.get('ci', nan2)[1]:.3f}]"  # noqa: E731
    sw = s["switch_excess"]
    return (
        f"{s['model']}, {s['n_relations']} relations ({s['config']['method']} fine-tuning, "
        f"{s['config']['n_random']} random draws per control). "
        + _layer_sentences(s, ci)
        + _bottleneck_sentences(s, ci)
        + _alltoken_sentences(s, ci)
        + "Steering held-out subjects from answer "
        f"a toward b along the pretrained class-mean direction switches the fine-tuned model's label to label(b) in "
        f"{m['switch_rate']:.3f} of cases against {m['switch_rate_random']:.3f} for random directions of the same norm "
        f"(any change: {m['changed_rate']:.3f} vs {m['changed_rate_random']:.3f}); "
        f"excess {sw['mean']:.3f} (CI {ci(sw)}, "
        f"sign-flip p = {sw.get('p_sign_flip', np.nan):.2g}); vs readability r = {w['r']:.2f} {ci(w)}."
        + "".join(
            f" Against {label} of the same norm ({m[f'switch_rate_{k}']:.3f}): excess {x['mean']:.3f} "
            f"(CI {ci(x)}, sign-flip p = {x.get('p_sign_flip', np.nan):.2g}, {x['n']} relations)."
            for k, label, x in (
                (k, label, s.get(f"switch_excess_{k}"))
                for k, label in (
                    ("shuffled", "class-mean directions of shuffled answers"),
                    ("other", "class-mean directions of another relation on the same states"),
                )
            )
            if x is not None
        )
    )


def _layer_sentences(s: dict, ci) -> str:
    """The arms at the most readable layer, where the run has them."""
    m, ed = s["mean"], s.get("excess_drop")
    if ed is None:
        return f"Held-out generalization kappa without erasure: {m['generalization_none']:.3f}. "
    e, es = s["excess_drop_vs_readability"], s["excess_drop_shuffled"]
    return (
        "Erasing the original answer (LEACE at the most readable layer before the last, at the "
        "subject's last token, fitted on the fine-tuning subjects) takes the probe from kappa "
        f"{m['probe_before_kappa']:.3f} "
        f"to {m['probe_after_kappa']:.3f} on those subjects ({m['transfer_after_kappa']:.3f} transferred to held-out "
        f"subjects, from {m['transfer_before_kappa']:.3f}; {m['probe_after_tuned_kappa']:.3f} "
        "in the fine-tuned model, whose "
        f"earlier blocks moved); it moves the states by {m['moved_leace']:.4f} of their variance, LEACE of shuffled "
        f"answers by {m['moved_shuffled']:.4f}, a random subspace of the same rank by {m['moved_random']:.4f}. "
        "Held-out "
        f"generalization kappa: {m['generalization_none']:.3f} without erasure, "
        f"{m['generalization_random']:.3f} with a random "
        f"subspace erased, {m['generalization_shuffled']:.3f} with shuffled answers erased, "
        f"{m['generalization_leace']:.3f} "
        f"with the answer erased. Excess drop over the random control, mean over relations {ed['mean']:.3f} "
        f"(95% CI {ci(ed)}, sign-flip p = {ed.get('p_sign_flip', np.nan):.2g}; its per-relation CI excludes 0 in "
        f"{s['relations_excess_drop_ci_above_0']} relations); over the shuffled control {es['mean']:.3f} "
        f"(CI {ci(es)}, p = {es.get('p_sign_flip', np.nan):.2g}). Across relations, excess drop vs readability: "
        f"r = {e['r']:.2f} {ci(e)}, permutation p = {e.get('p_value', np.nan):.2g}. "
    )


def _bottleneck_sentences(s: dict, ci) -> str:
    """The bottleneck arms and recall after erasure, where the run has them."""
    m, b = s["mean"], s.get("bottleneck_excess_drop")
    out = ""
    if np.isfinite(m.get("recall_none", np.nan)):
        out += (
            f"Recall of the original relation on held-out subjects (pretrained model, argmax among its answers): "
            f"{m['recall_none']:.3f} without erasure, {m['recall_leace']:.3f} with the answer erased at the layer "
            "(the layer arm's eraser, whether or not its fine-tunes ran), "
            f"{m['recall_shuffled']:.3f} shuffled, {m['recall_random']:.3f} random. "
        )
    if b is None:
        return out
    bs, be = s["bottleneck_excess_drop_shuffled"], s["bottleneck_excess_drop_vs_readability"]
    return out + (
        "At the bottleneck (the same erasers fitted on the fine-tuning subjects' input embeddings at the "
        f"subject's last token and applied there; rank {m['bottleneck_rank']:.1f} on average, leftover "
        f"cross-covariance {m['bottleneck_leftover_covariance']:.1e}): the probe on the embedding rows goes from "
        f"kappa {m['bottleneck_probe_before_kappa']:.3f} to {m['bottleneck_probe_after_kappa']:.3f}, and a probe at"
        f" the layer of the fine-tuned model reads {m['bottleneck_probe_after_tuned_kappa']:.3f} (what it could"
        f" re-encode from the subject's other tokens); recall {m['recall_bottleneck_leace']:.3f} (shuffled "
        f"{m['recall_bottleneck_shuffled']:.3f}, random {m['recall_bottleneck_random']:.3f}); generalization "
        f"{m['generalization_bottleneck_leace']:.3f} against {m['generalization_bottleneck_random']:.3f} (random "
        f"subspace) and {m['generalization_bottleneck_shuffled']:.3f} (shuffled); excess drop {b['mean']:.3f} "
        f"(CI {ci(b)}, sign-flip p = {b.get('p_sign_flip', np.nan):.2g}; per-relation CI above 0 in "
        f"{s['relations_bottleneck_excess_drop_ci_above_0']} relations), over the shuffled control "
        f"{bs['mean']:.3f} (CI {ci(bs)}, p = {bs.get('p_sign_flip', np.nan):.2g}); vs readability r = "
        f"{be['r']:.2f} {ci(be)}. "
    )


def _alltoken_sentences(s: dict, ci) -> str:
    """The all-token arms, where the run has them."""
    m, a = s["mean"], s.get("alltoken_excess_drop")
    if a is None:
        return ""
    sh, ar = s["alltoken_excess_drop_shuffled"], s["alltoken_excess_drop_vs_readability"]
    return (
        f"At every subject token and every site a later token reads ({m['alltoken_sites']:.0f} sites: the input "
        "embeddings and the residual stream after every block but the last; erasers fitted site after site on the "
        f"fine-tuning subjects, rank {m['alltoken_rank']:.1f} on average, largest leftover cross-covariance "
        f"{m['alltoken_leftover_covariance']:.1e}): a probe at the layer transferred to held-out subjects reads "
        f"{m['alltoken_transfer_after_kappa']:.3f} (before erasure {m['transfer_before_kappa']:.3f}), "
        f"{m['alltoken_probe_after_tuned_kappa']:.3f} in the fine-tuned model; recall "
        f"{m['recall_alltoken_leace']:.3f} (shuffled {m['recall_alltoken_shuffled']:.3f}, random "
        f"{m['recall_alltoken_random']:.3f}); generalization {m['generalization_alltoken_leace']:.3f} against "
        f"{m['generalization_alltoken_random']:.3f} (random subspaces) and "
        f"{m['generalization_alltoken_shuffled']:.3f} (shuffled); excess drop {a['mean']:.3f} (CI {ci(a)}, "
        f"sign-flip p = {a.get('p_sign_flip', np.nan):.2g}; per-relation CI above 0 in "
        f"{s['relations_alltoken_excess_drop_ci_above_0']} relations), over the shuffled control {sh['mean']:.3f} "
        f"(CI {ci(sh)}, p = {sh.get('p_sign_flip', np.nan):.2g}); vs readability r = {ar['r']:.2f} {ci(ar)}. "
    )
