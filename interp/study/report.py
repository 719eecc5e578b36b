"""The study's report: one self-contained HTML page (plotly.js inlined once, no network), plus
every figure as HTML and, when a Chromium is available to kaleido, PNG/SVG/PDF."""
from __future__ import annotations

import html
import json
from pathlib import Path

import pandas as pd

from ..plots import ExportError, export
from ..store import atomic_write_bytes
from .figures import build_all


def write_figures(out: str | Path, static: bool = True) -> dict:
    out = Path(out)
    figs = build_all(out)
    status = {"static": static, "error": None}
    for name, fig in figs.items():
        formats = ("html", "png", "svg", "pdf") if status["static"] else ("html",)
        try:
            export(fig, out / "figures" / name, formats)
        except ExportError as err:
            status = {"static": False, "error": str(err)}
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
        parts.append(f"<section><h2>{html.escape(fig.layout.title.text.split('<br>')[0] if fig.layout.title.text else name)}</h2>"
                     + fig.to_html(full_html=False, include_plotlyjs=first, config={"displaylogo": False}) + "</section>")
        first = False
    h = summary["headline"]
    pear = h.get("pearson", {})
    cols = ["relation", "readability_best", "best_layer", "readability_fixed", "pretrained_accuracy"] + \
           [c for c in rel.columns if c.startswith("generalization_") or c.startswith("train_accuracy_")]
    note = "" if made["static"] else f"<p class=note>Static images were not exported: {html.escape(made['error'] or 'disabled')}</p>"
    page = f"""<!doctype html><html><head><meta charset="utf-8"><title>Generalization study: {html.escape(summary['model'])}</title>
<style>body{{font-family:Arial,Helvetica,sans-serif;max-width:1500px;margin:2em auto;padding:0 1em;color:#222}}
table{{border-collapse:collapse;font-size:13px}}td,th{{border:1px solid #ccc;padding:3px 6px;text-align:right}}
th{{background:#f3f3f3}}.note{{color:#a00}}section{{margin:2em 0}}</style></head><body>
<h1>Does knowledge that is linear before fine-tuning generalize after it?</h1>
<p>Model <b>{html.escape(summary['model'])}</b>, {summary['n_relations']} relations, methods {', '.join(summary['methods'])}.
Pearson r between best-layer readability and held-out generalization ({h['method']} fine-tuning):
<b>{pear.get('r', float('nan')):.3f}</b> (95% CI {pear.get('ci', [float('nan')] * 2)[0]:.3f} to {pear.get('ci', [float('nan')] * 2)[1]:.3f},
permutation p = {pear.get('p_value', float('nan')):.3g}). Robustness: r from {summary['robustness']['r_min']:.3f} to
{summary['robustness']['r_max']:.3f} over {summary['robustness']['n_settings']} settings. Error back-mapping: of
{summary['backmap']['n_errors']} wrong labels, {summary['backmap']['probe_topk_rate']:.2f} map back to an answer in the probe's
top-{summary['config']['top_k']}, {summary['backmap']['model_topk_rate']:.2f} to one in the pretrained model's top-{summary['config']['top_k']}.</p>
{note}
{''.join(parts)}
<section><h2>Statistics</h2>{stats.to_html(index=False, float_format=lambda v: f'{v:.4g}')}</section>
<section><h2>Relations</h2>{rel[cols].to_html(index=False, float_format=lambda v: f'{v:.3f}')}</section>
</body></html>"""
    path = out / "report.html"
    atomic_write_bytes(path, page.encode())
    return path
