"""The circuits findings page, built only from saved results folders (``interp circuits
induction`` and ``interp circuits relation``), so the numbers in the documentation are the
numbers in the tables. ``interp circuits findings`` writes it (``docs/circuit_findings.md``)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd

from interp.results import load_table, write_text
from lab.markdown import md_table, num


def reading(stats: pd.DataFrame, curve: pd.DataFrame) -> str:
    """How to read the numbers, with the settings the saved tables were made with."""
    level = round(100 * stats.attrs.get("confidence", 0.95))
    perms = stats.attrs.get("n_permutations", "?")
    return f"""## How to read these numbers

- **Per-pair uncertainty.** Every patching score is a mean over prompt pairs. `effect` is the
  mean change from the unpatched run in the metric's units; `ci_low`-`ci_high` a {level}%
  percentile bootstrap interval of it ({stats.attrs.get("n_resamples", "?")} resamples of pairs),
  `p_value` a sign-flip permutation p-value that it is zero (exact for 12 pairs or fewer, {perms}
  random sign patterns above), `p_fdr` the p-values adjusted for the number of cells in the
  table (Benjamini-Hochberg). The interval and p are for `effect`; `normalized` divides by the
  clean-corrupted difference, a noisy number of its own when that difference is small. The
  same seed gives the same intervals as TransformerLens 4's `PatchingResult` on the same pairs
  (`circuits/statistics.py`).
- **Faithfulness** (MIB, Mueller et al. 2025). The top-k items (edges or nodes) by |score| form
  a circuit; every other edge carries its {curve.attrs.get("ablation", "counterfactual")} value
  (computed exactly by `circuits.EdgePatching`); f = (m(C) - m(empty)) / (m(full) - m(empty)).
  CPR is the area under f over the fraction of items kept, from the empty circuit to all items
  (higher is better), CMD the area between f and 1 (0 is best), trapezoids on a linear axis.
  `cpr_low`-`cpr_high`: bootstrap over pairs. `random`: random orderings of the same items;
  `excess_cpr` is CPR minus the random mean, with a bootstrap interval over pairs;
  `p_random_cpr` the fraction of random circuits with CPR at least as high on these pairs (+1
  correction, so never below 1 / (n_random + 1)).
"""


def _copy_figure(src: Path, figures_to: Path | None, name: str) -> str:
    if figures_to is None or not src.exists():
        return ""
    figures_to.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src, figures_to / name)
    return f"\n![{name}]({name})\n"


def _faithfulness(summary: pd.DataFrame, extra: tuple[str, ...] = ()) -> str:
    cols = [
        *extra,
        "method",
        "cpr",
        "cpr_low",
        "cpr_high",
        "cmd",
        "random_cpr_mean",
        "random_cpr_sd",
        "excess_cpr",
        "excess_low",
        "excess_high",
        "p_random_cpr",
    ]
    return md_table(summary[[c for c in cols if c in summary]])


def induction_section(folder: Path, figures_to: Path | None = None) -> str:
    summary = json.loads((folder / "summary.json").read_text())
    prev = ", ".join(f"L0H{i} {v:.2f}" for i, v in enumerate(summary["previous_token_scores"]))
    ind = ", ".join(f"L1H{i} {v:.2f}" for i, v in enumerate(summary["induction_scores"]))
    pp = load_table(folder, "path_patching")
    n_pairs = pp.attrs.get("n_pairs")
    top = pp.reindex((pp.score - pp.attrs["target_score"]).abs().sort_values(ascending=False).index).head(6)
    top = top[["sender", "receiver", "normalized", "effect", "ci_low", "ci_high", "p_value", "p_fdr"]]
    ap = load_table(folder, "activation_patching")
    heads = ap[["layer", "head", "normalized", "effect", "ci_low", "ci_high", "p_value", "p_fdr"]]
    edges = load_table(folder, "faithfulness_summary")
    nodes = load_table(folder, "node_faithfulness_summary")
    curve = load_table(folder, "faithfulness")
    lines = [
        "## Induction heads (a known circuit)",
        "",
        f"`interp circuits induction --out {folder}` ({n_pairs} pairs, single-token corruption). Attention "
        f"to the previous token: {prev}; induction scores: {ind}. Metric: the answer's log-probability, clean "
        f"{num(summary['clean_metric'])}, corrupted {num(summary['corrupted_metric'])}.",
        "",
        "**Path patching** (corrupted senders into the clean run, frozen MLPs), the six edges with the largest effect:",
        "",
        md_table(top),
        "",
        "**Activation patching** of each head's output (clean into corrupted, all positions):",
        "",
        md_table(heads),
        "",
        _known(summary),
        f"**Faithfulness of edge circuits** ({curve.attrs.get('n_edges')} edges, MIB's grid of sizes; EAP and "
        f"EAP-IG-inputs rankings against {int(edges.attrs.get('n_random', 0))} random orderings):",
        "",
        _faithfulness(edges),
        _copy_figure(folder / "figures" / "faithfulness.png", figures_to, "circuits_induction_faithfulness.png"),
        f"**Faithfulness of node circuits** (AtP ranking of the embeddings, heads and MLPs, "
        f"{load_table(folder, 'node_faithfulness').attrs.get('n_items')} nodes; every size, since MIB's grid is "
        "too coarse for so few):",
        "",
        _faithfulness(nodes),
        _copy_figure(
            folder / "figures" / "node_faithfulness.png", figures_to, "circuits_induction_node_faithfulness.png"
        ),
    ]
    return "\n".join(lines)


def _known(summary: dict) -> str:
    known = summary.get("known_circuit")
    if not known:
        return ""
    edges = ", ".join(f"{a} -> {b}" for a, b in known["edges"])
    top = "are exactly these" if known["top_eap_ig_edges_are_the_circuit"] else "are *not* these"
    return (
        f"**The known circuit.** From the attention patterns, {len(known['edges'])} of the "
        f"{known['n_graph_edges']} edges should carry the behaviour: {edges}. Kept alone (every other edge "
        f"patched) they give f = {num(known['faithfulness'])}; EAP-IG-inputs' top {len(known['edges'])} edges "
        f"{top}.\n"
    )


def relation_section(folder: Path, figures_to: Path | None = None) -> str:
    rc = load_table(folder, "relation_circuit")
    relation = rc.attrs.get("relation", "")
    lines = [
        f"## A relation before and after fine-tuning: `{relation}`",
        "",
        f"`interp circuits relation {relation} --model {rc.attrs.get('model', 'world')} --out {folder}` "
        f"({rc.attrs.get('method')} "
        f"fine-tune, label category {rc.attrs.get('category')}). Logit difference clean / corrupted: before "
        f"{num(rc.attrs['before']['clean_score'])} / {num(rc.attrs['before']['corrupted_score'])}, after "
        f"{num(rc.attrs['after']['clean_score'])} / {num(rc.attrs['after']['corrupted_score'])}.",
        "",
    ]
    for stage in ("before", "after"):
        part = rc[rc.stage == stage]
        n_sig = int(((part.ci_low > 0) | (part.ci_high < 0)).sum())
        lines += [
            f"**{stage.capitalize()}**: {n_sig} of {len(part)} components have a 95% interval excluding 0, "
            f"{int((part.p_fdr < 0.05).sum())} an FDR-adjusted p below 0.05. The five largest:",
            "",
            md_table(
                part.sort_values("normalized", ascending=False).head(5)[
                    ["component", "normalized", "effect", "ci_low", "ci_high", "p_value", "p_fdr"]
                ]
            ),
            "",
        ]
    if (folder / "faithfulness_summary.csv").exists():
        summary = load_table(folder, "faithfulness_summary")
        lines += [
            "**Faithfulness** of EAP-IG-inputs' edge circuits on each side (the interval is wide when the "
            "clean and corrupted runs are close, as the denominator of f is their difference):",
            "",
            _faithfulness(summary, ("stage",)),
        ]
        for stage in ("before", "after"):
            lines.append(
                _copy_figure(
                    folder / "figures" / f"faithfulness_{stage}.png",
                    figures_to,
                    f"circuits_relation_faithfulness_{stage}.png",
                )
            )
    return "\n".join(lines)


def write_circuit_findings(
    induction: str | Path, relation: str | Path | None = None, out: str | Path = "docs/circuit_findings.md"
) -> Path:
    """The findings page from an induction results folder and, optionally, a relation's."""
    out = Path(out)
    figures_to = out.parent
    induction = Path(induction)
    parts = [
        "# Circuits: findings (generated)",
        "",
        "Generated by `interp circuits findings` from saved results folders; do not edit by hand. "
        "Methods: [circuits](circuits.md).",
        "",
        reading(load_table(induction, "activation_patching"), load_table(induction, "faithfulness")),
        induction_section(induction, figures_to),
    ]
    if relation is not None:
        parts += ["", relation_section(Path(relation), figures_to)]
    write_text("\n".join(parts).rstrip() + "\n", out)
    return out
