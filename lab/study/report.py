"""The study's report: one self-contained HTML page (plotly.js inlined once, no network), plus
every figure as HTML (sharing one ``figures/plotly.min.js``) and, when a Chromium is available to
kaleido, PNG/SVG/PDF."""

from __future__ import annotations

import html
import json
from pathlib import Path

import pandas as pd

from interp.plots import STATIC_HELP, ExportError, export, warn_static_skipped
from interp.results import write_text

from .figures import build_all


def write_figures(out: str | Path, static: bool = True) -> dict:
    out = Path(out)
    figs = build_all(out)
    status = {"static": static, "error": None}
    for name, fig in figs.items():
        formats = ("html", "png", "svg", "pdf") if status["static"] else ("html",)
        try:
            export(fig, out / "figures" / name, formats, missing_browser="raise")
        except ExportError as err:
            if not err.hung:
                warn_static_skipped()
            status = {"static": False, "error": str(err) if err.hung else STATIC_HELP}
            export(fig, out / "figures" / name, ("html",))
    return {"figures": figs, **status}


def write_report(out: str | Path, static: bool = True) -> Path:
    out = Path(out)
    made = write_figures(out, static)
    summary = json.loads((out / "summary.json").read_text())
    rel = pd.read_csv(out / "relations.csv")
    stats = pd.read_csv(out / "stats.csv")
    parts, first = [], True
    for name, fig in made["figures"].items():
        parts.append(
            "<section><h2>"
            f"{html.escape(fig.layout.title.text.split('<br>')[0] if fig.layout.title.text else name)}</h2>"
            + fig.to_html(full_html=False, include_plotlyjs=first, config={"displaylogo": False})
            + "</section>"
        )
        first = False
    h, raw, nc = summary["headline"], summary["raw"], summary["null_calibration"]
    pear, rawp = h.get("pearson", {}), raw.get("pearson", {})
    nan2 = [float("nan")] * 2
    bm = summary["backmap"].get(summary["methods"][0], {})
    cols = [
        "relation",
        "readability_best",
        "readability_best_kappa",
        "best_layer",
        "readability_fixed_kappa",
        "n_answers",
        "chance",
        "chance_majority",
        "n_finetune_subjects",
        "n_heldout",
        "pretrained_accuracy",
    ] + [c for c in rel.columns if c.startswith("generalization_") or c.startswith("train_accuracy_")]
    note = (
        ""
        if made["static"]
        else f"<p class=note>Static images were not exported: {html.escape(made['error'] or 'disabled')}</p>"
    )
    null = pd.read_csv(out / "null_calibration.csv")
    backmap = pd.read_csv(out / "backmap.csv")
    rob = pd.read_csv(out / "robustness.csv")
    untrained = summary.get("untrained_prompt_tokens") or []
    missing = summary.get("covariates", {}).get("missing") or {}
    warn = "".join(
        f"<p class=note>Covariate {html.escape(k)} is missing: {html.escape(v)}; the partial correlations use the "
        "others.</p>"
        for k, v in missing.items()
    )
    warn += (
        f"<p class=note>Prompt or label tokens the model was never trained on: {html.escape('; '.join(untrained))}</p>"
        if untrained
        else ""
    )
    failed = summary.get("failed_jobs") or {}
    first_warning = (
        f"<p class=note><b>{html.escape(failed['warning'])}</b></p>" if failed.get("warning") else ""
    )  # said before any number: those numbers rest on fewer fine-tunes than the design
    kept_r = (summary["headline"].get("with_failed_kept") or {}).get("r")
    failed_section = ""
    if failed.get("jobs") or failed.get("heldout_one_label"):
        kept = "counted in the statistics (keep_failed)" if not failed["excluded_from_statistics"] else "left out"
        rows = "".join(
            f"<tr><td>{html.escape(j['job'])}</td><td style='text-align:left'>{html.escape(j['reason'])}</td></tr>"
            for j in failed.get("jobs", [])
        )
        failed_section = (
            f"<section><h2>Failed fine-tunes ({failed['n_failed']} of {failed['n_finetunes']}, {kept})</h2>"
            "<p>A fine-tune that did not learn its fine-tuning set (training kappa below "
            f"{summary['config'].get('min_train_kappa')}, or a NaN loss) is a failed job, not a measurement.</p>"
            + (
                f"<p>The headline r with the failed main fine-tunes counted as measured: {kept_r:.3f} "
                "(training fit can itself depend on readability, so both are shown).</p>"
                if kept_r is not None
                else ""
            )
            + f"<table><tr><th>job</th><th>reason</th></tr>{rows}</table>"
            f"<p>Learned, but one label for every held-out subject (measured: no generalization; kept): "
            f"{html.escape(', '.join(failed.get('heldout_one_label', [])) or 'none')}.</p></section>"
        )
    page = f"""<!doctype html><html><head><meta charset="utf-8"><title>Generalization study:
{html.escape(summary["model"])}</title>
<style>body{{font-family:Arial,Helvetica,sans-serif;max-width:1500px;margin:2em auto;padding:0 1em;color:#222}}
table{{border-collapse:collapse;font-size:13px}}td,th{{border:1px solid #ccc;padding:3px 6px;text-align:right}}
th{{background:#f3f3f3}}.note{{color:#a00}}section{{margin:2em 0}}</style></head><body>
<h1>Does knowledge that is linear before fine-tuning generalize after it?</h1>
{first_warning}<p>Model <b>{html.escape(summary["model"])}</b>, {summary["n_relations"]} relations,
methods {", ".join(summary["methods"])}.
Both readability and generalization are measured as Cohen's kappa (0 = what a guess blind to the subject scores,
given the
answer distribution; 1 = perfect). Pearson r between best-layer readability and held-out generalization
({h["method"]} fine-tuning):
<b>{pear.get("r", float("nan")):.3f}</b> (95% CI {pear.get("ci", nan2)[0]:.3f} to {pear.get("ci", nan2)[1]:.3f},
{html.escape(str(pear.get("ci_method", "")))});
Monte-Carlo p = <b>{pear.get("p_monte_carlo", float("nan")):.3g}</b> against
{nc["n_sim"]} simulated studies of this design with no generalization beyond chance
(permutation p = {pear.get("p_value", float("nan")):.3g}).
On those simulated studies the Monte-Carlo test rejects at {nc["headline_false_positive_rate"]:.3f}
and the permutation test at
{nc["headline_permutation_false_positive_rate"]:.3f} (nominal {nc["alpha"]}).</p>
<p>Secondary: on raw accuracies r = {rawp.get("r", float("nan")):.3f}
(permutation p = {rawp.get("p_value", float("nan")):.3g},
Monte-Carlo p = {rawp.get("p_monte_carlo", float("nan")):.3g});
it is inflated because {html.escape(raw["why_inflated"])}: with no
generalization at all its permutation test rejects at {nc["raw_false_positive_rate"]:.3f}.</p>
<p>Robustness: r from {summary["robustness"]["r_min"]:.3f} to {summary["robustness"]["r_max"]:.3f} over
{summary["robustness"]["n_settings"]} settings.
Error back-mapping ({bm.get("method", "")}, {bm.get("n_errors", 0)} errors on
{bm.get("n_relations", 0)} informative relations):
a wrong label maps back into the probe's top-{summary["config"]["top_k"]} wrong
answers {bm.get("probe_ratio", float("nan")):.2f}x as often as a uniformly random wrong answer would
({bm.get("probe_ratio_shuffled", float("nan")):.2f}x the shuffled null), into the pretrained model's
{bm.get("model_ratio", float("nan")):.2f}x ({bm.get("model_ratio_shuffled", float("nan")):.2f}x shuffled;
paired Wilcoxon p =
{bm.get("wilcoxon_p", float("nan")):.3g}).</p>
{warn}{note}
{failed_section}
{"".join(parts)}
<section><h2>Null calibration</h2>{null.to_html(index=False, float_format=lambda v: f"{v:.4g}")}</section>
<section><h2>Error back-mapping (wrong answers only,
against a uniformly random wrong answer)</h2>{backmap.to_html(index=False, float_format=lambda v: f"{v:.3g}")}</section>
<section><h2>Robustness</h2>{rob.to_html(index=False, float_format=lambda v: f"{v:.3f}")}</section>
<section><h2>Statistics</h2>{stats.to_html(index=False, float_format=lambda v: f"{v:.4g}")}</section>
<section><h2>Relations</h2>{rel[cols].to_html(index=False, float_format=lambda v: f"{v:.3f}")}</section>
</body></html>"""
    path = out / "report.html"
    write_text(page, path)
    return path
