"""Aggregate a finished study: tables, statistics, null calibration, robustness, error
back-mapping, figures, report.

The headline is chance-free: Pearson r of best-layer readability *kappa* with generalization
*kappa* (:mod:`probes.chance`). The raw-accuracy r is kept as a secondary line: raw
accuracies share chance levels (both rise as answers get fewer or more lopsided), so it is
inflated, by how much the null-calibration table shows.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from interp.results import write_json, write_table

from .backmap import backmap_summary, backmap_table
from .baselines import baseline_columns
from .config import StudySpec
from .failures import failure_reason, failure_summary
from .null import null_tables, recall_null_tables
from .readout import Readability
from .report import write_report
from .stats import COVARIATES, RIVALS, correlation_table, pearson

#: (predictor, outcome) pairs the statistics table holds; the first is the headline
PAIRS = [
    ("readability_best_kappa", "generalization_kappa"),
    ("readability_fixed_kappa", "generalization_kappa"),
    ("readability_best", "generalization"),
    ("readability_fixed", "generalization"),
]
HEADLINE = PAIRS[0]
RAW = PAIRS[2]
#: the headline with readability above its baseline (:mod:`lab.study.baselines`), when measured
ABOVE = ("readability_above_baseline", "generalization_kappa")
ABOVE_SURFACE = ("readability_above_surface", "generalization_kappa")
#: the paper's contrast the other way round: does recall (the model's own accuracy on the relation)
#: predict generalization with readability held fixed? (its covariates: readability, then the rest)
RECALL = ("pretrained_accuracy", "generalization_kappa")


def relation_table(spec: StudySpec, layers, pretrained, runs, best, designed=None) -> pd.DataFrame:
    """One row per relation: readability, pretrained accuracy, frequency, the main design (from
    ``designed``: every fine-tune that ran, failed or not) and each method's outcome (from
    ``runs``: the fine-tunes the statistics use; NaN for a relation whose fine-tune failed)."""
    c = spec.config
    designed = runs if designed is None else designed
    lay = layers.set_index(["relation", "layer"])
    rows = []
    relations = spec.by_name
    for name in relations:
        b, f = best[name], spec.fixed_layer
        pre = pretrained[pretrained.relation == name]
        row = {
            "relation": name,
            "best_layer": b,
            "fixed_layer": f,
            "readability_best": float(lay.loc[(name, b), "accuracy"]),
            "readability_best_kappa": float(lay.loc[(name, b), "kappa"]),
            "readability_fixed": float(lay.loc[(name, f), "accuracy"]),
            "readability_fixed_kappa": float(lay.loc[(name, f), "kappa"]),
            "probe_chance_uniform": float(lay.loc[(name, b), "chance_uniform"]),
            "probe_chance_majority": float(lay.loc[(name, b), "chance_majority"]),
            "control_accuracy_best": float(lay.loc[(name, b), "control_accuracy"]),
            "selectivity_best": float(lay.loc[(name, b), "selectivity"]),
            "pretrained_accuracy": float(
                pd.to_numeric(pre.correct.astype(object), errors="coerce").astype(float).mean()
            ),
            "subject_frequency": float(pre.subject_frequency.mean()),
        }
        for probe in ("mlp", "knn"):  # nonlinear probes (probes.nonlinear), each at its own best layer
            if f"{probe}_kappa" in layers:
                k = lay.loc[name, f"{probe}_kappa"]
                row[f"readability_{probe}_kappa"] = float(k.max())
                row[f"{probe}_best_layer"] = int(k.idxmax()) if k.notna().any() else -1
        props = relations[name].properties
        for k in ("augment", "bio", "templates", "mentions", "derived_from"):
            if k in props:
                row[k] = props[k]
        main = designed[(name, c.methods[0], c.category, c.label_seeds[0], c.finetune_seeds[0])]
        row.update(
            {
                "n_answers": main["n_answers"],
                "n_finetune_subjects": main["n_finetune_subjects"],
                "n_heldout": main["n_heldout"],
                "chance": main["chance_prior"],
                "chance_uniform": main["chance_uniform"],
                "chance_majority": main["chance_majority"],
            }
        )
        for m in c.methods:
            key = (name, m, c.category, c.label_seeds[0], c.finetune_seeds[0])
            run = runs.get(key, {})
            row.update(
                {
                    f"generalization_{m}": run.get("generalization", np.nan),
                    f"generalization_kappa_{m}": run.get("generalization_kappa", np.nan),
                    f"train_accuracy_{m}": designed[key]["train_accuracy"],
                    f"steps_{m}": designed[key]["steps"],
                }
            )
        rows.append(row)
    return pd.DataFrame(rows)


def _with_outcome(rel: pd.DataFrame, gen: dict) -> pd.DataFrame:
    """``rel``'s relations that have an outcome in ``gen`` (a fine-tune the statistics use), with it."""
    t = rel[rel.relation.isin(list(gen))].copy()
    t["generalization"] = t.relation.map(lambda r: gen[r]["generalization"])
    t["generalization_kappa"] = t.relation.map(lambda r: gen[r]["generalization_kappa"])
    return t


def _with_failed(rel: pd.DataFrame, designed: dict, runs: dict, names: list[str], key: tuple, c) -> dict | None:
    """The headline Pearson r with the main method's failed fine-tunes counted as measured (None
    when none failed or they are kept anyway): training fit may itself depend on readability, so
    a reader sees how much leaving them out moves r."""
    failed = [n for n in names if (n, *key) in designed and (n, *key) not in runs]
    if not failed:
        return None
    t = _with_outcome(rel, {n: designed[(n, *key)] for n in names if (n, *key) in designed})
    if len(t) < 3:
        return {"r": float("nan"), "n": len(t), "failed_relations": failed}
    out = pearson(t[HEADLINE[0]], t["generalization_kappa"], c.n_boot, c.n_perm)
    return {
        "r": out["r"],
        "ci": [out["ci_low"], out["ci_high"]],
        "p_value": out["p_value"],
        "n": out["n"],
        "failed_relations": failed,
    }


def _correlations(t: pd.DataFrame, x: str, y: str, c) -> list[dict]:
    if len(t) < 3:  # a correlation needs 3 relations
        why = f"undefined ({len(t)} relations with a fine-tune that learned; needs 3)"
        row = dict(r=np.nan, ci_low=np.nan, ci_high=np.nan, ci_method=why, p_value=np.nan, n=len(t))
        return [dict(predictor=x, outcome=y, analysis="pearson", **row)]
    covariates = [HEADLINE[0], *COVARIATES] if x == RECALL[0] else COVARIATES
    rivals = RIVALS if x == HEADLINE[0] else []
    return correlation_table(t, x, y, covariates, c.n_boot, c.n_perm, rivals=rivals)


def robustness_table(spec: StudySpec, rel: pd.DataFrame, runs: dict) -> pd.DataFrame:
    """r (kappa, and raw beside it) for each setting varied alone; which relations a seed cannot
    change (full fine-tuning on one batch is deterministic: every seed gives the same model)."""
    c = spec.config
    m0 = c.methods[0]
    settings = [
        ("label assignment", f"label seed {l}", (m0, c.category, l, c.finetune_seeds[0])) for l in c.label_seeds
    ]
    settings += [
        ("fine-tuning seed", f"fine-tune seed {f}", (m0, c.category, c.label_seeds[0], f)) for f in c.finetune_seeds
    ]
    settings += [
        ("label category", cat, (m0, cat, c.label_seeds[0], c.finetune_seeds[0]))
        for cat in (c.category, *c.other_categories)
    ]
    settings += [("method", m, (m, c.category, c.label_seeds[0], c.finetune_seeds[0])) for m in c.methods]
    rows = []
    for varied, name, key in settings:
        have = [r for r in spec.by_name if (r, *key) in runs]
        invariant = (
            sorted(r for r in have if runs[(r, *key)].get("full_batch") and key[0] == "full")
            if varied == "fine-tuning seed"
            else []
        )
        row = {
            "varied": varied,
            "setting": name,
            "key": "/".join(map(str, key)),
            "n": len(have),
            "seed_invariant_relations": ", ".join(invariant),
        }
        if len(have) < 3:
            rows.append({**row, "r": np.nan, "r_raw": np.nan})
            continue
        t = rel.set_index("relation").loc[have]
        k = pearson(
            t.readability_best_kappa, [runs[(r, *key)]["generalization_kappa"] for r in have], n_boot=200, n_perm=200
        )
        raw = pearson(t.readability_best, [runs[(r, *key)]["generalization"] for r in have], n_boot=200, n_perm=200)
        rows.append({**row, "r": k["r"], "ci_low": k["ci_low"], "ci_high": k["ci_high"], "r_raw": raw["r"]})
    return pd.DataFrame(rows)


def apply_null(stats: pd.DataFrame, null: pd.DataFrame, summary: dict) -> tuple[pd.DataFrame, dict]:
    """Put the null calibration into the statistics table (``p_monte_carlo``: each statistic's
    p-value against the study's own simulated null) and the summary (the headline's p-value is the
    Monte-Carlo one; the conventional tests' false-positive rates are reported beside it)."""
    keys = ["method", "predictor", "outcome", "analysis"]
    stats = stats.merge(null[keys + ["p_monte_carlo"]], on=keys, how="left")
    m0 = summary["headline"]["method"]

    def row(part, analysis="pearson"):
        r = null[
            (null.method == m0) & (null.predictor == part[0]) & (null.outcome == part[1]) & (null.analysis == analysis)
        ]
        return r.iloc[0] if len(r) else None

    head, raw = row(HEADLINE), row(RAW)
    parts = {"headline": HEADLINE, "raw": RAW}
    if "above_baseline" in summary:
        parts.update(above_baseline=ABOVE, above_surface=ABOVE_SURFACE)
    for key, part in parts.items():
        for analysis, d in summary[key].items():
            if isinstance(d, dict) and "r" in d:
                hit = stats[
                    (stats.method == m0)
                    & (stats.predictor == part[0])
                    & (stats.outcome == part[1])
                    & (stats.analysis == analysis)
                ]
                d["p_monte_carlo"] = float(hit.p_monte_carlo.iloc[0]) if len(hit) else float("nan")
    kap = null[(null.method == m0) & (null.predictor == HEADLINE[0]) & (null.outcome == HEADLINE[1])]
    n_sim = int(null.n_sim.iloc[0]) if len(null) else 0
    summary["null_calibration"] = {
        "n_sim": n_sim,
        "alpha": float(null.alpha.iloc[0]) if len(null) else 0.05,
        "method": m0,
        "headline_test": "Monte-Carlo p against the study's simulated null",
        "headline_false_positive_rate": float(head.false_positive_rate_monte_carlo)
        if head is not None
        else float("nan"),
        "headline_permutation_false_positive_rate": float(head.false_positive_rate)
        if head is not None
        else float("nan"),
        "raw_false_positive_rate": float(raw.false_positive_rate) if raw is not None else float("nan"),
        "raw_monte_carlo_false_positive_rate": float(raw.false_positive_rate_monte_carlo)
        if raw is not None
        else float("nan"),
        "max_kappa_conventional_false_positive_rate": float(kap.false_positive_rate.max())
        if len(kap)
        else float("nan"),
        "max_kappa_monte_carlo_false_positive_rate": float(kap.false_positive_rate_monte_carlo.max())
        if len(kap)
        else float("nan"),
    }
    summary["headline"]["p_value_headline"] = summary["headline"].get("pearson", {}).get("p_monte_carlo", float("nan"))
    return stats, summary


def missing_covariates(spec: StudySpec, rel: pd.DataFrame) -> dict[str, str]:
    """Covariates undefined for this model (left out of the partial correlations), with the reason."""
    out = {}
    for c in COVARIATES:
        if c in rel and rel[c].isna().all():
            out[c] = (
                spec.model.scoring.answers_undefined if c == "pretrained_accuracy" else None
            ) or "undefined for this model"
    return out


#: the columns of ``predictions.csv`` that the statistics read (an empty table keeps them)
PREDICTION_COLUMNS = [
    "subject", "answer", "label", "predicted_label", "correct", "backmapped_answer", "job", "relation", "method",
    "category", "label_seed", "finetune_seed",
]  # fmt: skip


def _run_key(r: dict) -> tuple:
    return (r["relation"], r["method"], r["category"], r["label_seed"], r["finetune_seed"])


def classified(record: dict, min_train_kappa: float) -> dict:
    """A job's record, marked ``status: failed`` with the reason when its fine-tune did not learn
    (:func:`lab.study.failures.failure_reason`)."""
    if record["status"] != "done":
        return record
    reason = failure_reason(record, min_train_kappa)
    return {**record, "status": "failed", "reason": reason} if reason else record


def architecture(model) -> dict:
    """What a cross-model table needs to know of the model: its HuggingFace ``model_type``
    (the family), parameter count, layers and width. Parameters are counted on a fresh model of
    the same class and config built on the meta device (tied weights once), since a backend's
    wrapper may hold copies (TransformerLens' bridge runs GPT-2's fused q/k/v as three)."""
    hf = model.hf_model
    if hf is not None and hasattr(hf, "config"):
        with torch.device("meta"):
            module = type(hf)(hf.config)
    else:
        module = model.module
    return {
        "family": model.model_type,
        "parameters": int(sum(p.numel() for p in module.parameters())),
        "n_layers": model.n_layers,
        "d_model": model.d_model,
    }


def write_summary(
    spec: StudySpec,
    out: Path,
    readability: Readability,
    pretrained: pd.DataFrame,
    results: list[dict],
    best: dict[str, int],
    notes: Sequence[str] = (),
    lr_check: dict | None = None,
    baselines: pd.DataFrame | None = None,
) -> None:
    """The study's tables, ``summary.json`` and report in ``out``, from the results of its stages:
    the probe sweep (``readability``), the pretrained answers, every fine-tune's record
    (``results``), each relation's best layer, the learning-rate checks (``lr_check``, by
    method, when the study ran them) and the readability baselines (``baselines``, when measured:
    :mod:`lab.study.baselines`). Fine-tunes that did not learn are marked failed
    (:mod:`lab.study.failures`) and left out of the statistics unless ``keep_failed``."""
    c, names = spec.config, list(spec.by_name)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    results = [classified(r, c.min_train_kappa) for r in results]
    done = [r for r in results if r["status"] == "done" or (c.keep_failed and r["status"] == "failed")]
    runs = {_run_key(r): r for r in done}
    designed = {_run_key(r): r for r in results if r["status"] in ("done", "failed")}
    finetunes = pd.DataFrame([{k: v for k, v in r.items() if k not in ("predictions", "mapping")} for r in results])
    preds = pd.DataFrame(
        [
            {
                **p,
                "job": r["job"],
                "relation": r["relation"],
                "method": r["method"],
                "category": r["category"],
                "label_seed": r["label_seed"],
                "finetune_seed": r["finetune_seed"],
            }
            for r in done
            for p in r["predictions"]
        ],
        columns=None if done else PREDICTION_COLUMNS,  # every fine-tune failed: the columns still
    )
    rel = relation_table(spec, readability.layers, pretrained, runs, best, designed)
    if baselines is not None:
        kappas = dict(zip(rel.relation, rel.readability_best_kappa))
        rel = rel.merge(baseline_columns(baselines, best, kappas, c.baseline_flag), on="relation", how="left")
    pairs = PAIRS + ([ABOVE, ABOVE_SURFACE] if baselines is not None else [])
    if rel[RECALL[0]].nunique() > 1:  # an encoder has no recall (undefined: NaN)
        pairs.append(RECALL)
    m0 = c.methods[0]

    def main_key(name, m):
        return (name, m, c.category, c.label_seeds[0], c.finetune_seeds[0])

    stats_rows = []
    for m in c.methods:
        t = _with_outcome(rel, {name: runs[main_key(name, m)] for name in names if main_key(name, m) in runs})
        for x, y in pairs:
            stats_rows += [dict(method=m, **row) for row in _correlations(t, x, y, c)]
    stats = pd.DataFrame(stats_rows)

    # each method's null is simulated on the relations its statistics use (lab.study.null)
    null = null_tables(rel, preds, c.to_dict(), c.n_null, c.split_seed)
    recall_null = recall_null_tables(rel, preds, c.to_dict(), c.n_null, c.split_seed)
    rob = robustness_table(spec, rel, runs)
    unique_r = rob.drop_duplicates("key").r

    # error back-mapping, over the main runs of every method
    main = preds[
        (preds.category == c.category)
        & (preds.label_seed == c.label_seeds[0])
        & (preds.finetune_seed == c.finetune_seeds[0])
    ]
    errors = main[~main.correct.astype(bool)]
    main_runs = {(m, name): runs[main_key(name, m)] for m in c.methods for name in names if main_key(name, m) in runs}
    backmap = backmap_table(errors, dict(zip(rel.relation, rel.n_answers)), c.top_k, main_runs)

    def analyses(predictor, outcome):
        rows = stats[(stats.method == m0) & (stats.predictor == predictor) & (stats.outcome == outcome)]
        return {
            row.analysis: {
                "r": row.r,
                "p_value": row.p_value,
                **({"ci": [row.ci_low, row.ci_high], "ci_method": row.ci_method} if row.analysis == "pearson" else {}),
            }
            for row in rows.itertuples()
        }

    summary = {
        "model": spec.model.name,
        "backend": spec.model.backend_name,
        "architecture": architecture(spec.model),
        "n_relations": len(names),
        "methods": list(c.methods),
        "headline": {
            "method": m0,
            "predictor": HEADLINE[0],
            "outcome": HEADLINE[1],
            "measure": "Cohen's kappa",
            **analyses(*HEADLINE),
        },
        "raw": {
            "predictor": RAW[0],
            "outcome": RAW[1],
            **analyses(*RAW),
            "why_inflated": "raw accuracies share chance levels: with fewer or more lopsided answers "
            "a blind guess scores "
            "higher and readability is higher too, so raw accuracies correlate even with no generalization",
        },
        "robustness": {
            "r_min": float(unique_r.min()),
            "r_max": float(unique_r.max()),
            "r_std": float(unique_r.std()),
            "n_settings": int(unique_r.notna().sum()),
            "measure": "kappa",
            "note": "the main run appears once per kind of variation in robustness.csv; spread over distinct runs",
            "seed_invariant_relations": sorted({x for v in rob.seed_invariant_relations for x in v.split(", ") if x}),
        },
        "backmap": {m: backmap_summary(backmap, m) for m in c.methods},
        "covariates": {
            "n_finetune_subjects_vs_n_answers_r": float(np.corrcoef(rel.n_finetune_subjects, rel.n_answers)[0, 1])
            if rel.n_finetune_subjects.nunique() > 1 and rel.n_answers.nunique() > 1
            else float("nan"),
            "missing": missing_covariates(spec, rel),
        },
        "scoring": spec.model.scoring.kind,
        "train_accuracy": {m: float(rel[f"train_accuracy_{m}"].mean()) for m in c.methods},
        "generalization": {m: float(rel[f"generalization_{m}"].mean()) for m in c.methods},
        "generalization_kappa": {m: float(rel[f"generalization_kappa_{m}"].mean()) for m in c.methods},
        "mean_readability_best": float(rel.readability_best.mean()),
        "mean_readability_best_kappa": float(rel.readability_best_kappa.mean()),
        "skipped_jobs": [{"job": r["job"], "reason": r["reason"]} for r in results if r["status"] == "skipped"],
        "failed_jobs": failure_summary(results, c),
        "learning_rates": {"full": c.finetune.lr, "lora": c.finetune.lora_lr},
        "lr_check": {
            m: {
                "chosen": v["chosen"],
                "relation": v["relation"],
                "tried": [{k: t[k] for k in ("lr", "learned", "reason", "train_kappa", "steps")} for t in v["tried"]],
            }
            for m, v in (lr_check or {}).items()
        }
        or None,
        "untrained_prompt_tokens": list(notes),
        "frequency_covariate": spec.frequency_source,
        "fixed_layer": spec.fixed_layer,
        "config": c.to_dict(),
    }
    if baselines is not None:
        summary["above_baseline"] = {
            "predictor": ABOVE[0],
            "outcome": ABOVE[1],
            **analyses(*ABOVE),
            "flag_threshold": c.baseline_flag,
            "flagged_relations": sorted(rel.relation[rel.baseline_flagged.astype(bool)]),
            "surface_flagged_relations": sorted(rel.relation[rel.surface_flagged.astype(bool)]),
            "mean_baseline_kappa": float(rel.baseline_kappa.mean()),
            "mean_embedding_kappa": float(rel.embedding_kappa.mean()),
            "mean_random_kappa": float(rel.random_kappa.mean()),
            "mean_readability_above_baseline": float(rel.readability_above_baseline.mean()),
            "mean_readability_above_surface": float(rel.readability_above_surface.mean()),
            "baseline_seeds": list(c.baseline_seeds),
        }
        summary["above_surface"] = {
            "predictor": ABOVE_SURFACE[0],
            "outcome": ABOVE_SURFACE[1],
            **analyses(*ABOVE_SURFACE),
        }
    summary["headline"]["with_failed_kept"] = _with_failed(rel, designed, runs, names, main_key(names[0], m0)[1:], c)
    stats, summary = apply_null(stats, null, summary)
    for name, df in (
        ("relations", rel),
        ("finetunes", finetunes),
        ("predictions", preds),
        ("stats", stats),
        ("robustness", rob),
        ("backmap", backmap),
        ("null_calibration", null),
        ("recall_null", recall_null),
    ):
        write_table(df, out / f"{name}.csv")
    write_json(summary, out / "summary.json")
    write_report(out)


def calibrate_folder(out, n_sim: int | None = None, seed: int | None = None) -> pd.DataFrame:
    """Recompute the null-calibration table of a finished study folder from its saved tables (the
    ``interp study null DIR`` command); updates ``null_calibration.csv``, ``recall_null.csv`` (the
    recall contrast's fitted-outcome null), ``stats.csv``, ``summary.json`` and the report."""
    out = Path(out)
    summary = json.loads((out / "summary.json").read_text())
    c = summary["config"]
    n_sim, seed = n_sim or c.get("n_null", 2000), c["split_seed"] if seed is None else seed
    relations, predictions = pd.read_csv(out / "relations.csv"), pd.read_csv(out / "predictions.csv")
    table = null_tables(relations, predictions, c, n_sim, seed)
    recall_null = recall_null_tables(relations, predictions, c, n_sim, seed)
    stats = pd.read_csv(out / "stats.csv").drop(columns=["p_monte_carlo"], errors="ignore")
    stats, summary = apply_null(stats, table, summary)
    write_table(table, out / "null_calibration.csv")
    write_table(recall_null, out / "recall_null.csv")
    write_table(stats, out / "stats.csv")
    write_json(summary, out / "summary.json")
    write_report(out)
    return table
