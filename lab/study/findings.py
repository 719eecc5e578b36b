"""The study's findings page: a Markdown document built only from a finished study's saved
tables (and, optionally, a causal test's), so the numbers in the documentation are always the
numbers in the results folder. ``interp study findings`` writes it (``docs/study.md``)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd

from interp.results import write_text
from lab.markdown import md_table, num, pval

from .interventions import section as interventions_summary
from .stats import control_two_ways

METHODS = (
    """## How to read these numbers

- **Kappa, not accuracy.** Readability (cross-validated probe predictions) and generalization
  (held-out predictions after relabelling) are Cohen's kappa against the empirical answer
  distribution of the evaluated subjects: 0 for every guess blind to the subject (uniform,
  prior-matched, always the majority answer), 1 for perfect. Raw accuracies rise as answers get
  fewer or more lopsided whatever the model knows, so their correlation across relations is
  partly chance levels correlating with themselves (`probes/chance.py`).
- **Monte-Carlo p.** The headline p-value ranks the observed statistic among 2,000 simulated
  studies of the same design (relations, held-out sets, readability values, the fine-tuned
  model's label preferences) in which nothing generalizes beyond chance. It is exact under that
  null; the conventional tests assume outcomes exchangeable across relations, which the unequal
  noise of kappa breaks, and the calibration table shows by how much (`lab/study/null.py`).
- **Design.** Each relation's number of fine-tuning subjects is a budget drawn independently of
  its number of answers, so the two covariates are different variables; the chance level is a
  covariate of its own.
- **Back-mapping.** Both top-k lists rank wrong answers only, and each hit rate is compared with
  a uniformly random wrong answer and with the back-mapped answers shuffled among a relation's
  errors (which keeps label and answer popularity) (`lab/study/backmap.py`).
- **Causal test.** The two worlds write every non-manipulated relation identically (document
  hashes compared before any training; `writing_identical` in `causal.csv`); differences in differences """
    """come with a bootstrap CI and a permutation p over
  relations.
"""
)


def baseline_lines(s: dict, rel: pd.DataFrame) -> list[str]:
    """Readability above its baselines (:mod:`lab.study.baselines`): the two correlations beside
    the headline, the flagged relations and the per-relation table; nothing for a study that did
    not measure them."""
    if "above_baseline" not in s:
        return []
    ab, su = s["above_baseline"], s["above_surface"]
    thr = ab["flag_threshold"]

    def corr(d):
        p = d["pearson"]
        mc = pval(p.get("p_monte_carlo"))
        return f"r = **{num(p['r'])}** ({num(p['ci'][0])} to {num(p['ci'][1])}; Monte-Carlo p = {mc})"

    cols = ["relation", "best_layer", "readability_best_kappa", "random_kappa", "embedding_kappa",
            "readability_above_surface", "readability_above_baseline", "surface_flagged",
            "baseline_flagged"]  # fmt: skip
    return [
        "**Readability above baseline.** The same probe, folds and kappa on the same architecture with "
        f"random weights ({len(ab['baseline_seeds'])} seeds; surface form: token identity and mixing, nothing learned) "
        "and on the input embeddings (the token table: learned, so on a model whose subjects have tokens of their "
        "own it holds knowledge too). Readability above the random-weight baseline vs generalization: "
        f"{corr(su)}; above the larger of the two baselines: {corr(ab)}. Mean baseline kappa: random weights "
        f"{num(ab['mean_random_kappa'])}, embeddings {num(ab['mean_embedding_kappa'])}. Relations whose random-weight "
        f"kappa exceeds {thr} (readable from their tokens): {', '.join(ab['surface_flagged_relations']) or 'none'}; "
        f"whose larger baseline does: {len(ab['flagged_relations'])} of {len(rel)}.",
        "",
        md_table(rel[[c for c in cols if c in rel]].sort_values("readability_best_kappa", ascending=False)),
        "",
    ]


def controls_lines(stats: pd.DataFrame, method: str, recall_null: pd.DataFrame | None = None) -> list[str]:
    """Readability against its covariates and rivals, from the statistics table (the main method):
    the partial r with each covariate held fixed, the paper's contrast both ways (recall with
    readability held fixed, and readability with recall held fixed; the first also against its
    fitted-outcome null, ``recall_null``, where the study saved one), and Williams' test of linear
    readability against nonlinear decodability; nothing for a study that measured none of them."""
    t = stats[stats.method == method]
    head = t[t.predictor == "readability_best_kappa"].set_index("analysis")
    rec = t[t.predictor == "pretrained_accuracy"].set_index("analysis")

    def stat(frame, analysis):
        if analysis not in frame.index:
            return None
        row = frame.loc[analysis]
        return f"{num(row.r)} (Monte-Carlo p = {pval(row.get('p_monte_carlo'))}, conventional p = {pval(row.p_value)})"

    names = {
        "partial:embedding_kappa": "the embedding-row probe",
        "partial:pretrained_accuracy": "recall",
        "partial:readability_mlp_kappa": "the MLP probe",
        "partial:readability_knn_kappa": "the kNN probe",
        "partial:all": "all covariates jointly",
    }
    parts = [f"{label}: {stat(head, a)}" for a, label in names.items() if stat(head, a)]
    out = []
    if parts:
        out.append("**Readability with each covariate held fixed** (partial r): " + "; ".join(parts) + ".")
    if "pearson" in rec.index:
        out.append(
            "**The paper's contrast, both ways.** Recall (the model's own accuracy on the relation) vs "
            f"generalization: r = {stat(rec, 'pearson')}; with readability held fixed: "
            f"{stat(rec, 'partial:readability_best_kappa') or 'n/a'}. Readability with recall held fixed: "
            f"{stat(head, 'partial:pretrained_accuracy') or 'n/a'}."
        )
    rivals = [a for a in head.index if a.startswith("williams:")]
    if rivals:

        def diff(a):
            row = head.loc[a]
            name = a.removeprefix("williams:readability_").removesuffix("_kappa").upper()
            return (
                f"{name}: {num(row.r)} (paired bootstrap 95% CI {num(row.ci_low)} to {num(row.ci_high)}; "
                f"Williams p = {pval(row.p_value)})"
            )

        out.append(
            "**Is it linear?** r(linear readability, generalization) minus r(nonlinear decodability, "
            "generalization): " + "; ".join(diff(a) for a in rivals) + ". A positive difference favours linear "
            "readability. The study's simulated null (no generalization at all) cannot calibrate this comparison "
            "(its null is two equal, possibly nonzero correlations), so the interval resamples relations instead; "
            "the MLP's kappa is the noisier measure (its objective is not convex), which attenuates its "
            "correlation and favours the linear probe."
        )
    fitted = None if recall_null is None else recall_null[recall_null.method == method]
    if "pearson" in rec.index and (fitted is None or fitted.empty):
        out.append(
            "Caveat on the contrast: its Monte-Carlo p is against a null of no generalization at all; if "
            "generalization follows readability and readability is measured with noise, recall can keep a partial "
            "correlation through the part of readability the probe missed (residual confounding), which that null "
            "does not simulate."
        )
    elif "pearson" in rec.index:
        cells = "; ".join(
            f"reliability {r.reliability:g}: null mean {num(r.mean_r)}, p = {pval(r.p_monte_carlo)}, the t-test "
            f"rejecting {num(r.false_positive_rate)} of the time"
            for r in fitted.itertuples()
        )
        out.append(
            "**Recall against its fitted-outcome null** (`recall_null.csv`): if generalization followed the true "
            "readability alone and the probe measured it with error, recall would keep a partial r through the "
            "part the probe missed (residual confounding). Simulated at each reliability (the share of measured "
            "readability's variance that is true; at least "
            f"{num(fitted.min_reliability.iloc[0])}, the share recall explains, so lower ones are left out), with "
            f"the equal-tailed Monte-Carlo p of the observed {num(fitted.observed_r.iloc[0])}: {cells}. The error "
            "is classical (one variance for every relation, independent of recall), and "
            f"{num(100 * fitted.clipped_share.mean(), 0)}% of the simulated probabilities of knowing fell outside "
            "[0, 1] and were clipped."
        )
    return [line + "\n" for line in out]


def study_section(study: Path, figures_to: Path | None = None, prefix: str = "study") -> str:
    s = json.loads((study / "summary.json").read_text())
    stats = pd.read_csv(study / "stats.csv")
    rel = pd.read_csv(study / "relations.csv")
    null = pd.read_csv(study / "null_calibration.csv")
    rob = pd.read_csv(study / "robustness.csv")
    bm = pd.read_csv(study / "backmap.csv")
    c = s["config"]
    h, nc = s["headline"], s["null_calibration"]
    out = [f"## The generalization study: {s['model']}, {s['n_relations']} relations", ""]
    if figures_to is not None and (study / "figures" / f"scatter_{c['methods'][0]}.png").exists():
        figures_to.mkdir(parents=True, exist_ok=True)
        for name in (f"scatter_{c['methods'][0]}", "null_calibration", "backmap"):
            src = study / "figures" / f"{name}.png"
            if src.exists():
                shutil.copyfile(src, figures_to / f"{prefix}_{name}.png")
        out += [f"![readability vs generalization, kappa]({prefix}_scatter_{c['methods'][0]}.png)", ""]
    pear = h["pearson"]
    out += [
        f"**Headline** ({h['method']} fine-tuning): Pearson r of best-layer readability kappa with held-out "
        f"generalization kappa = **{num(pear['r'])}** (95% CI {num(pear['ci'][0])} to {num(pear['ci'][1])}, "
        f"{pear['ci_method']}); "
        f"Monte-Carlo p = **{pval(pear.get('p_monte_carlo'))}** against {nc['n_sim']} simulated studies "
        "of this design with no "
        f"generalization beyond chance (permutation p = {pval(pear['p_value'])}). "
        "On those null studies the Monte-Carlo test "
        f"rejects at {num(nc['headline_false_positive_rate'])} and the permutation test at "
        f"{num(nc['headline_permutation_false_positive_rate'])} (nominal {nc['alpha']}). The raw-accuracy r "
        f"({num(s['raw']['pearson']['r'])}) is inflated: {s['raw']['why_inflated']}; its permutation test rejects at "
        f"{num(nc['raw_false_positive_rate'])} with no generalization at all.",
        "",
    ]
    out += baseline_lines(s, rel)
    recall_null = pd.read_csv(study / "recall_null.csv") if (study / "recall_null.csv").exists() else None
    out += controls_lines(stats, h["method"], recall_null)
    out += [
        "Mean generalization kappa: "
        + ", ".join(f"{m} {num(v)}" for m, v in s["generalization_kappa"].items())
        + " (raw accuracy "
        + ", ".join(f"{m} {num(v)}" for m, v in s["generalization"].items())
        + "); mean readability "
        f"kappa {num(s['mean_readability_best_kappa'])} (raw {num(s['mean_readability_best'])}). Correlation of the "
        "two design covariates, fine-tuning subjects vs answers: "
        f"r = {num(s['covariates']['n_finetune_subjects_vs_n_answers_r'])}.",
        "",
    ]
    missing = s.get("covariates", {}).get("missing") or {}
    out += [
        f"Subject frequency covariate: {s.get('frequency_covariate', 'n/a')}."
        + "".join(
            f" Covariate `{k}` is missing ({v}); the partial correlations use the others." for k, v in missing.items()
        ),
        "",
    ]
    out += ["### Statistics", ""]
    t = stats[stats.analysis != "pearson (t-test)"][
        ["method", "predictor", "outcome", "analysis", "r", "ci_low", "ci_high", "p_value", "p_monte_carlo", "n"]
    ]
    out += [md_table(t), ""]
    out += [
        "### Null calibration (false-positive rate at alpha = 0.05)",
        "",
        "Conventional test (permutation for Pearson, t for the others) "
        "and Monte-Carlo test against the design's own null.",
        "",
        md_table(
            null[
                [
                    "method",
                    "outcome",
                    "analysis",
                    "false_positive_rate",
                    "false_positive_rate_monte_carlo",
                    "mc_se",
                    "mean_r",
                    "sd_r",
                    "observed_r",
                    "p_monte_carlo",
                ]
            ]
        ),
        "",
    ]
    out += [
        "### Robustness (Pearson r of kappas; raw beside it)",
        "",
        md_table(
            rob[
                [
                    c
                    for c in ("varied", "setting", "n", "r", "ci_low", "ci_high", "r_raw", "seed_invariant_relations")
                    if c in rob
                ]
            ]
        ),
        "",
    ]
    out += [
        "### Error back-mapping (top-{k} among wrong answers, against a uniformly random wrong answer)".format(
            k=c["top_k"]
        ),
        "",
    ]
    for m, b in s["backmap"].items():
        out += [
            f"- {m}: {b['n_errors']} errors on {b['n_relations']} informative relations "
            f"({b['n_uninformative_relations']} with too few answers left out). Probe top-{c['top_k']}: "
            f"{num(b['probe_rate'])} = {num(b['probe_ratio'], 2)}x a uniformly random wrong answer, "
            f"{num(b['probe_ratio_shuffled'], 2)}x the shuffled null; pretrained model: {num(b['model_rate'])} = "
            f"{num(b['model_ratio'], 2)}x uniform, {num(b['model_ratio_shuffled'], 2)}x shuffled; paired Wilcoxon "
            f"(probe vs model) p = {pval(b['wilcoxon_p'])}."
        ]
    out += [
        "",
        md_table(
            bm[bm.informative.astype(bool)][
                [
                    "method",
                    "relation",
                    "n_answers",
                    "n_errors",
                    "probe_rate",
                    "probe_expected_rate",
                    "probe_shuffled_rate",
                    "model_rate",
                    "model_expected_rate",
                    "model_shuffled_rate",
                ]
            ]
        ),
        "",
    ]
    cols = [
        "relation",
        "n_answers",
        "n_finetune_subjects",
        "n_heldout",
        "chance",
        "chance_majority",
        "readability_best",
        "readability_best_kappa",
        "best_layer",
    ] + [x for x in rel.columns if x.startswith("generalization_")]
    out += ["### Relations", "", md_table(rel[cols].sort_values("readability_best_kappa", ascending=False)), ""]
    return "\n".join(out)


def real_model_section(study: Path, figures_to: Path | None = None) -> str:
    """The study on a pretrained model and real facts (``interp study --model minilm``): which LRE
    relations qualified and why the others did not, then the same section as the world's."""
    q = pd.read_csv(study / "qualification.csv")
    reasons = q[~q.qualifies.astype(bool)].reason.str.replace(r"^\d+ ", "N ", regex=True).value_counts()
    out = [
        f"## Real facts on a pretrained encoder: {len(q)} LRE relations, {int(q.qualifies.sum())} qualify",
        "",
        "A relation qualifies when at least 2 of its answers have 6 or more distinct subjects (at most the 20 most "
        "frequent answers kept) and the design leaves at least 20 held-out subjects (`lab/study/relations.py`). "
        "Left out: " + "; ".join(f"{n} x '{r}'" for r, n in reasons.items()) + ".",
        "",
        md_table(
            q[q.qualifies.astype(bool)][
                [
                    "relation",
                    "n_subjects",
                    "n_answers",
                    "answers_kept",
                    "per_answer",
                    "n_finetune_subjects",
                    "n_heldout",
                    "dropped_answers",
                ]
            ]
        ),
        "",
    ]
    rel = pd.read_csv(study / "relations.csv")
    summary = json.loads((study / "summary.json").read_text())
    m0 = summary["methods"][0]
    rel = rel[rel[f"generalization_kappa_{m0}"].notna()]  # a relation whose fine-tune failed has no outcome
    x, y = rel.readability_best_kappa.to_numpy(float), rel[f"generalization_kappa_{m0}"].to_numpy(float)
    loo = sorted(
        (float(np.corrcoef(np.delete(x, i), np.delete(y, i))[0, 1]), name) for i, name in enumerate(rel.relation)
    )
    out += [
        f"Leave one relation out, the headline r ranges from {num(loo[0][0])} (without {loo[0][1]}) to "
        f"{num(loo[-1][0])} (without {loo[-1][1]}).",
        "",
    ]
    unfit = rel[[c for c in rel.columns if c.startswith("train_accuracy_")]].lt(1).sum()
    out += [
        "Fine-tunes that did not learn every fine-tuning subject within the step budget (main runs): "
        + ", ".join(f"{c.removeprefix('train_accuracy_')} {int(n)} of {len(rel)}" for c, n in unfit.items())
        + ".",
        "",
    ]
    failed = summary.get("failed_jobs")
    if failed is not None:  # studies since failed fine-tunes are classified (lab.study.failures)
        out += [
            f"Failed fine-tunes (did not learn their fine-tuning set, or a NaN loss): {failed['n_failed']} of "
            f"{failed['n_finetunes']}, {'left out of' if failed['excluded_from_statistics'] else 'kept in'} the "
            "statistics" + (f": {', '.join(j['job'] for j in failed['jobs'])}." if failed["jobs"] else "."),
            "",
        ]
    section = study_section(study, figures_to, prefix="study_real")
    return "\n".join(out) + "\n" + section.replace("## The generalization study:", "### The generalization study:", 1)


def interventions_section(folder: Path, figures_to: Path | None = None, real: bool = False) -> str:
    """Erasure and steering (``interp study interventions``), from its saved tables (``real``: the
    run on the pretrained model, a subsection of its own with its own figures)."""
    t = pd.read_csv(folder / "interventions.csv")
    title = (
        "### Interventions on the pretrained encoder"
        if real
        else "## Interventions: erase or steer the readable direction"
    )
    tag = "interventions_real" if real else "interventions"
    out = [title, "", interventions_summary(folder), ""]
    if figures_to is not None:
        for name in ("erasure", "excess_drop"):
            src = folder / "figures" / f"interventions_{name}.png"
            if src.exists():
                figures_to.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(src, figures_to / f"{tag}_{name}.png")
                out += [f"![{name}]({tag}_{name}.png)", ""]
    cols = [
        "relation",
        "layer",
        "rank",
        "readability_kappa",
        "probe_before_kappa",
        "probe_after_kappa",
        "transfer_after_kappa",
        "moved_leace",
        "moved_random",
        "generalization_none",
        "generalization_random",
        "generalization_leace",
        "excess_drop",
        "excess_drop_ci_low",
        "excess_drop_ci_high",
        "recall_none",
        "recall_leace",
        "bottleneck_probe_before_kappa",
        "bottleneck_probe_after_tuned_kappa",
        "generalization_bottleneck_random",
        "generalization_bottleneck_leace",
        "bottleneck_excess_drop",
        "recall_bottleneck_leace",
        "recall_bottleneck_random",
        "generalization_alltoken_random",
        "generalization_alltoken_leace",
        "alltoken_excess_drop",
        "recall_alltoken_leace",
        "n_steered",
        "switch_rate",
        "switch_rate_random",
        "switch_excess_ci_low",
        "switch_excess_ci_high",
    ]
    out += [md_table(t[[c for c in cols if c in t]].sort_values("readability_kappa", ascending=False)), ""]
    return "\n".join(out)


def causal_section(causal: Path) -> str:
    s = json.loads((causal / "causal.json").read_text())
    df = pd.read_csv(causal / "causal.csv")
    out = [
        "## The causal test: augmented vs plain writing",
        "",
        f"Manipulated: {', '.join(s['manipulated'])} ({s['method']} fine-tuning; kappa). "
        "Writing of every other relation "
        f"identical in both worlds: {bool(df[~df.manipulated].writing_identical.all())} (document hashes).",
        "",
    ]
    rows = []
    for vs, d in s["difference_in_differences"].items():
        for col, v in d.items():
            rows.append(
                {
                    "against": vs,
                    "change in": col,
                    "difference in differences": v["estimate"],
                    "ci_low": v["ci_low"],
                    "ci_high": v["ci_high"],
                    "p (permutation)": v["p_value"],
                }
            )
    out += [md_table(pd.DataFrame(rows)), "", "Mean change (plain - augmented) per group:", ""]
    out += [md_table(pd.DataFrame([{"group": g, "n": s["n"][g], **v} for g, v in s["mean_delta"].items()])), ""]
    out += [
        md_table(
            df[
                [
                    "relation",
                    "manipulated",
                    "derived_from_manipulated",
                    "writing_identical",
                    "delta_readability",
                    "delta_generalization",
                    "delta_readability_raw",
                    "delta_generalization_raw",
                ]
            ]
        ),
        "",
    ]
    return "\n".join(out)


def world_section(report: Path) -> str:
    """What the world model knows, from a saved ``interp world report --out FILE`` table."""
    df = pd.read_csv(report)
    aug = df[df.augment.astype(bool)]
    out = [
        "## The embedded world model: what it knows",
        "",
        "`interp world report`: recall is the greedy next token on every fact's corpus query (all subjects); "
        "readability "
        f"is the 5-fold probe accuracy at the subject's last token at the relation's best layer (the highest kappa, "
        f"`probes.readability`), chance = 1/#answers. Mean recall "
        f"**{num(df.recall.mean())}** (lowest {df.loc[df.recall.idxmin(), 'relation']} {num(df.recall.min())}); "
        "readability "
        f"{num(df.readability.min())} to {num(df.readability.max())}; the {len(aug)} augmented relations average "
        f"{num(aug.readability.mean())} readability against "
        f"{num(df[~df.augment.astype(bool)].readability.mean())} for the rest.",
        "",
        md_table(df),
        "",
    ]
    return "\n".join(out)


def ablation_section(folder: Path) -> str:
    """One row per variant of the world model's recipe, from ``interp world ablate``'s tables."""
    df = pd.read_csv(folder / "ablation.csv")
    plan = json.loads((folder / "ablation_plan.json").read_text())
    cols = [
        "variant",
        "factor",
        "checkpoint",
        "steps",
        "recall",
        "readability",
        "generalization",
        "generalization_max",
        "relations_ge_0.5",
        "relations_le_0.05",
        "r",
        "pretrain_minutes",
    ]
    out = [
        "## What makes knowledge active: the ablation",
        "",
        f"`interp world ablate --steps {plan['steps']}`: each row changes one factor of the shipped recipe; "
        "world variants "
        f"are pretrained for {plan['steps']} steps (the baseline row too, so rows compare like with like; the shipped "
        "checkpoint has more), and every row is measured with a reduced study (one label assignment, one seed, full "
        "fine-tuning unless the row says otherwise). Rows that change only the fine-tuning need no pretraining: they "
        "fine-tune the recipe's own model (`checkpoint` = shipped) and compare with its row. Readability and "
        "generalization are mean kappas over relations; `r` is the study's headline correlation of the two across "
        "relations.",
        "",
        md_table(df[[c for c in cols if c in df]]),
        "",
    ]
    return "\n".join(out)


def randomized_section(folder: Path, docs: Path | None = None) -> str:
    """The randomized causal test (:mod:`lab.study.randomized`): the pre-registered statistics,
    the decision, power, the per-relation table and (copied into ``docs``) its figure."""
    s = json.loads((folder / "randomized.json").read_text())
    df = pd.read_csv(folder / "randomized.csv")
    arms = pd.read_csv(folder / "randomized_arms.csv")

    def ci(d: dict) -> str:
        return f"{d['estimate']:.3f} [{d['ci_low']:.3f}, {d['ci_high']:.3f}]"

    p, c = s["primary_mean_delta_generalization"], s["negative_control_mean_delta_generalization"]
    rows = [
        {
            "statistic": "first stage: mean Δρ, manipulated",
            "estimate [95% CI]": ci(s["first_stage_delta_readability"]),
            "p (randomization)": "",
        },
        {"statistic": "mean Δρ, controls", "estimate [95% CI]": ci(s["first_stage_controls"]), "p (randomization)": ""},
        {
            "statistic": "mean Δ recall, manipulated",
            "estimate [95% CI]": ci(s["recall_delta"]),
            "p (randomization)": "",
        },
        {
            "statistic": "**primary**: mean Δg, manipulated",
            "estimate [95% CI]": ci(p),
            "p (randomization)": f"{p['p_value']:.4f}",
        },
        {
            "statistic": "negative control: mean Δg, controls",
            "estimate [95% CI]": ci(c),
            "p (randomization)": f"{c['p_value']:.4f}",
        },
    ]
    for key, label in (("beta", "β = ΣΔg / ΣΔρ"), ("cross_sectional_slope", "cross-sectional slope (pooled arms)")):
        if key in s:
            rows.append({"statistic": label, "estimate [95% CI]": ci(s[key]), "p (randomization)": ""})
    power = s.get("power", {})
    out = [
        "## The causal test: writing randomized per subject, one pretraining run",
        "",
        "`interp study causal` (pre-registered in [the protocol](protocol.md)). "
        f"Manipulated: {', '.join(s['manipulated'])}; "
        f"controls (written identically for both arms): {len(s['controls'])} relations. Arms: "
        f"{s['arms']['augmented']} augmented, {s['arms']['plain']} plain subjects. Δ = augmented − plain, in kappa; "
        f"CIs bootstrap relations; p from {p['n_redraws']} stratified redraws of the arms "
        f"(null SD of T {p['null_sd']:.3f}). Fine-tunes: {s['n_finetunes']}, failed: {len(s['failed_finetunes'])}.",
        "",
        md_table(pd.DataFrame(rows)),
        "",
        f"**Decision (pre-registered rule): {s['decision']}.** Power from the design: the smallest mean Δg detected "
        f"with 80% power is {power.get('smallest_effect_80', float('nan')):.3f} (at generalization kappa "
        f"{power.get('base_kappa', float('nan'))}).",
        "",
        "Fine-tuned on one arm only (manipulated relations; mean held-out kappa by the held-out subjects' arm):",
        "",
        md_table(
            pd.DataFrame(
                [{"fine-tuned on": k.removeprefix("finetuned on "), **v} for k, v in s["one_arm_finetunes"].items()]
            )
        ),
        "",
        md_table(
            df[
                [
                    "relation",
                    "group",
                    "readability_augmented",
                    "readability_plain",
                    "delta_readability",
                    "recall_augmented",
                    "recall_plain",
                    "generalization_augmented",
                    "generalization_plain",
                    "delta_generalization",
                ]
            ]
        ),
        "",
        f"Per (relation, source, arm): `randomized_arms.csv` ({len(arms)} rows).",
        "",
    ]
    x = s.get("exploratory_manipulated_minus_controls")
    if x:
        d = x["delta_generalization"]
        out[8:8] = [
            f"Exploratory (not pre-registered): the manipulated relations beyond the controls, Δρ "
            f"{x['delta_readability']:.3f} and Δg {d['estimate']:.3f} (randomization p = {d['p_value']:.3f}, "
            f"null SD {d['null_sd']:.3f}).",
            "",
        ]
    png = folder / "figures" / "randomized_effects.png"
    if docs is not None and png.exists():
        shutil.copyfile(png, docs / "study_randomized_effects.png")
        out += ["![Δρ vs Δg per relation, 95% CIs](study_randomized_effects.png)", ""]
    return "\n".join(out)


def _span(n: pd.Series) -> str:
    lo, hi = int(n.min()), int(n.max())
    return str(lo) if lo == hi else f"{lo} to {hi}"


def compare_section(folder: Path, docs: Path | None = None) -> str:
    """The study across models (``interp study compare``), from its saved tables."""
    table = pd.read_csv(folder / "compare.csv")
    meta = json.loads((folder / "compare_agreement.json").read_text())
    pairs = pd.read_csv(folder / "compare_agreement.csv")
    lo, hi = meta["paper_band"]
    shown = table[
        ["model", "family", "parameters", "relations", "n", "r", "ci_low", "ci_high", "p_monte_carlo",
         "partial_r_all", "mean_generalization_kappa", "mean_readability_kappa", "r_above_surface",
         "failed_finetunes", "finetunes"]
    ].copy()  # fmt: skip
    shown["parameters"] = shown.parameters.map(lambda v: f"{v / 1e6:.2f}M" if pd.notna(v) else "n/a")
    out = [
        "## The study across models",
        "",
        f"`interp study compare` over {len(table)} finished studies: within each model, Pearson r of best-layer "
        f"readability kappa with generalization kappa ({table.method.iloc[0]} fine-tuning, every study's headline "
        "method), its 95% bootstrap CI and Monte-Carlo p against that study's simulated null, and the partial r "
        "with every covariate. The world zoo's models read one corpus with one recipe and differ in architecture "
        "family (`lab/world/zoo.py`: also in parameter count, and each is one pretraining run); their relations, "
        f"labels and design are identical. The paper reports r = {lo}-{hi} within each of 11 LMs. "
        "`r_above_surface`: the same r with readability minus the random-weights probe baseline (surface form; "
        "n/a where a study did not measure it).",
        "",
        md_table(shown),
        "",
    ]
    inside = table[table.r.between(lo, hi)].model.tolist()
    above = table[table.r > hi].model.tolist()
    below = table[table.r < lo].model.tolist()
    out += [
        f"Inside the paper's band: {', '.join(inside) or 'none'}; above it: {', '.join(above) or 'none'}; "
        f"below it: {', '.join(below) or 'none'}. The CIs are wide (n = {_span(table.n)} relations per model): a "
        "model outside the band is not evidence against it unless its CI excludes the band.",
        "",
        "**Do models agree on which relations are readable?**",
        "",
    ]
    for measure, label in (("readability_kappa", "Readability"), ("generalization_kappa", "Generalization")):
        w = meta["kendalls_w"][measure]
        part = pairs[pairs.measure == measure]
        out.append(
            f"- {label}: Kendall's W = {num(w['w'])} over {w['n_relations']} relations shared by "
            f"{w['n_models']} models ({', '.join(w['models'])}; Friedman p = {pval(w['p_friedman'])}, permutation "
            f"p = {pval(w['p_permutation'])}); pairwise Spearman rho "
            + "; ".join(f"{r.model_a} vs {r.model_b} {num(r.rho, 2)}" for r in part.itertuples() if r.n >= 3)
            + "."
        )
    out.append("")
    for name, alt in (("compare_forest", "r per model with 95% CIs, the paper's band shaded"),
                      ("compare_scatter", "readability vs generalization per model, shared axes")):  # fmt: skip
        png = folder / "figures" / f"{name}.png"
        if docs is not None and png.exists():
            shutil.copyfile(png, docs / f"study_{name}.png")
            out += [f"![{alt}](study_{name}.png)", ""]
    return "\n".join(out)


def surface_control_section(folder: Path, name: str | None = None) -> str:
    """The surface-form control taken two ways on one saved study (:func:`lab.study.stats.control_two_ways`):
    readability minus the random-weight probe's kappa, and readability with it regressed out, each
    with every relation's leave-one-out influence, and the verdict the control's own coefficient
    supports. Built from ``relations.csv`` and ``summary.json`` alone."""

    rel = pd.read_csv(folder / "relations.csv")
    summary = json.loads((folder / "summary.json").read_text())
    m0 = summary["methods"][0]
    name = name or summary["model"]
    if "random_kappa" not in rel:
        return f"## {name}\n\nThis study did not measure the probe baselines.\n"
    s, loo = control_two_ways(rel, "readability_best_kappa", "random_kappa", f"generalization_kappa_{m0}")
    sub, part = s["subtraction"], s["partial"]
    lo, hi = s["slope_sum_ci"]
    if lo > 0 or hi < 0:
        verdict = (
            f"The data reject the subtraction's assumption: it needs the baseline's coefficient to be minus "
            f"readability's (sum 0), and the sum is {num(s['slope_sum'])} (95% CI {num(lo)} to {num(hi)}); the "
            f"baseline enters generalization {'with' if s['control_slope'] > 0 else 'against'} readability, so "
            "the regression form (partial and semipartial r) is the one to read"
        )
    else:
        verdict = (
            f"The sum of the two coefficients ({num(s['slope_sum'])}, 95% CI {num(lo)} to {num(hi)}) is compatible "
            "with 0, as the subtraction assumes: both forms are admissible"
        )
    table = loo.sort_values("change_subtraction", key=abs, ascending=False)
    return "\n".join(
        [
            f"## {name}: {s['n']} relations, {m0} fine-tuning",
            "",
            f"- **Subtraction** (readability minus the random-weight probe's kappa): r = **{num(sub['r'])}** "
            f"(95% CI {num(sub['ci_low'])} to {num(sub['ci_high'])}, permutation p = {pval(sub['p_value'])}); leave "
            f"one relation out: {num(s['loo_subtraction'][0])} to {num(s['loo_subtraction'][1])} "
            f"(most influential: {s['most_influential_subtraction']}).",
            f"- **Regression** (partial r, the baseline regressed out of both): r = **{num(part['r'])}** (t test, "
            f"{part['df']} df: p = {pval(part['p_value'])}); leave one relation out: {num(s['loo_partial'][0])} to "
            f"{num(s['loo_partial'][1])} (most influential: {s['most_influential_partial']}).",
            f"- Semipartial r (readability with the baseline regressed out, generalization left raw: the "
            f"subtraction's like-for-like partner): {num(s['semipartial_r'])}.",
            f"- In generalization ~ readability + baseline: readability's slope {num(s['predictor_slope'])}, the "
            f"baseline's {num(s['control_slope'])} (95% CI {num(s['control_slope_ci'][0])} to "
            f"{num(s['control_slope_ci'][1])}); readability and the baseline correlate at "
            f"{num(s['r_predictor_control'])}.",
            "",
            f"**Verdict.** {verdict}.",
            "",
            md_table(table),
            "",
        ]
    )


def write_surface_control(folders, out: str | Path = "docs/surface_control.md", names=None) -> Path:
    """``docs/surface_control.md``: :func:`surface_control_section` for each saved study folder."""
    parts = [
        "# The surface-form control, two ways",
        "",
        "Generated by `interp study surface-control` from saved study tables (`relations.csv`, `summary.json`); "
        "do not edit by hand.",
        "",
        "A probe can read an answer from the subject's tokens rather than from what the model computed. The "
        "study measures that with the same probe on the same architecture with random weights (the *surface* "
        "baseline, `lab.study.baselines`). It can be removed from readability two ways: subtract it (which "
        "assumes it enters generalization one-for-one), or regress it out (which lets the data say how much it "
        "enters). Where the two disagree, the baseline's own coefficient says which assumption the data support. "
        "Caveats: the partial r's p-value is a t test, not the study's simulated null; and a baseline measured "
        "with noise (a mean of 3 random-weight seeds) is under-corrected by regression (errors in variables), "
        "so the partial r may overstate what survives the control, as the subtraction understates it when the "
        "baseline's coefficient is below 1.",
        "",
    ]
    names = list(names) if names else [None] * len(folders)
    for folder, name in zip(folders, names):
        parts.append(surface_control_section(Path(folder), name))
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_text("\n".join(parts), out)
    return out


def write_findings(
    study: str | Path,
    out: str | Path = "docs/study.md",
    causal: str | Path | None = None,
    command: str = "interp study",
    world: str | Path | None = None,
    ablation: str | Path | None = None,
    real: str | Path | None = None,
    interventions: str | Path | None = None,
    randomized: str | Path | None = None,
    compare: str | Path | None = None,
    interventions_real: str | Path | None = None,
) -> Path:
    """Write the findings page from saved results (and copy the headline figures beside it):
    the study, and optionally the causal test, the world model's report table, the ablation and a
    study on a pretrained model (``real``: e.g. ``interp study --model minilm``'s folder), and the
    interventions (``interventions``: ``interp study interventions``' folder; ``interventions_real``:
    its run on the pretrained model), and the study across models (``compare``: ``interp study
    compare``'s folder)."""
    study, out = Path(study), Path(out)
    parts = [
        "# Findings: the generalization study",
        "",
        f"Generated by `interp study findings` from the saved tables of `{command}`; do not edit by hand.",
        "",
        METHODS,
        study_section(study, out.parent),
    ]
    if randomized is not None and (Path(randomized) / "randomized.json").exists():
        parts.append(randomized_section(Path(randomized), out.parent))
    if causal is not None and (Path(causal) / "causal.json").exists():
        parts.append(causal_section(Path(causal)))
    if world is not None and Path(world).exists():
        parts.append(world_section(Path(world)))
    if ablation is not None and (Path(ablation) / "ablation.csv").exists():
        parts.append(ablation_section(Path(ablation)))
    if interventions is not None and (Path(interventions) / "interventions.csv").exists():
        parts.append(interventions_section(Path(interventions), out.parent))
    if real is not None and (Path(real) / "qualification.csv").exists():
        parts.append(real_model_section(Path(real), out.parent))
    if interventions_real is not None and (Path(interventions_real) / "interventions.csv").exists():
        parts.append(interventions_section(Path(interventions_real), out.parent, real=True))
    if compare is not None and (Path(compare) / "compare.csv").exists():
        parts.append(compare_section(Path(compare), out.parent))
    out.parent.mkdir(parents=True, exist_ok=True)
    write_text("\n".join(parts), out)
    return out
