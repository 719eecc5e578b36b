"""Aggregate a finished study: tables, statistics, null calibration, robustness, error
back-mapping, figures, report.

The headline is chance-free: Pearson r of best-layer readability *kappa* with generalization
*kappa* (:mod:`interp.study.chance`). The raw-accuracy r is kept as a secondary line: raw
accuracies share chance levels (both rise as answers get fewer or more lopsided), so it is
inflated, by how much the null-calibration table shows.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from .backmap import backmap_summary, backmap_table
from .null import calibration_table, null_design
from .stats import COVARIATES, correlation_table, pearson
from .tables import write_csv, write_json

#: (predictor, outcome) pairs the statistics table holds; the first is the headline
PAIRS = [("readability_best_kappa", "generalization_kappa"), ("readability_fixed_kappa", "generalization_kappa"),
         ("readability_best", "generalization"), ("readability_fixed", "generalization")]
HEADLINE = PAIRS[0]
RAW = PAIRS[2]


def relation_table(study, layers, pretrained, runs, best) -> pd.DataFrame:
    c = study.config
    lay = layers.set_index(["relation", "layer"])
    rows = []
    for name in study.relations:
        b, f = best[name], study.fixed_layer
        pre = pretrained[pretrained.relation == name]
        row = {"relation": name, "best_layer": b, "fixed_layer": f,
               "readability_best": float(lay.loc[(name, b), "accuracy"]), "readability_best_kappa": float(lay.loc[(name, b), "kappa"]),
               "readability_fixed": float(lay.loc[(name, f), "accuracy"]), "readability_fixed_kappa": float(lay.loc[(name, f), "kappa"]),
               "probe_chance_uniform": float(lay.loc[(name, b), "chance_uniform"]),
               "probe_chance_majority": float(lay.loc[(name, b), "chance_majority"]),
               "control_accuracy_best": float(lay.loc[(name, b), "control_accuracy"]),
               "selectivity_best": float(lay.loc[(name, b), "selectivity"]),
               "pretrained_accuracy": float(pre.correct.mean()), "subject_frequency": float(pre.subject_frequency.mean())}
        props = study.relations[name].properties
        for k in ("augment", "bio", "templates", "mentions", "derived_from"):
            if k in props:
                row[k] = props[k]
        main = runs[(name, c.methods[0], c.category, c.label_seeds[0], c.finetune_seeds[0])]
        row.update({"n_answers": main["n_answers"], "n_finetune_subjects": main["n_finetune_subjects"],
                    "n_heldout": main["n_heldout"], "chance": main["chance_prior"], "chance_uniform": main["chance_uniform"],
                    "chance_majority": main["chance_majority"]})
        for m in c.methods:
            run = runs[(name, m, c.category, c.label_seeds[0], c.finetune_seeds[0])]
            row.update({f"generalization_{m}": run["generalization"], f"generalization_kappa_{m}": run["generalization_kappa"],
                        f"train_accuracy_{m}": run["train_accuracy"], f"steps_{m}": run["steps"]})
        rows.append(row)
    return pd.DataFrame(rows)


def _with_outcome(rel: pd.DataFrame, gen: dict) -> pd.DataFrame:
    t = rel.copy()
    t["generalization"] = t.relation.map(lambda r: gen[r]["generalization"])
    t["generalization_kappa"] = t.relation.map(lambda r: gen[r]["generalization_kappa"])
    return t


def robustness_table(study, rel: pd.DataFrame, runs: dict) -> pd.DataFrame:
    """r (kappa, and raw beside it) for each setting varied alone; which relations a seed cannot
    change (full fine-tuning on one batch is deterministic: every seed gives the same model)."""
    c = study.config
    m0 = c.methods[0]
    settings = [("label assignment", f"label seed {l}", (m0, c.category, l, c.finetune_seeds[0])) for l in c.label_seeds]
    settings += [("fine-tuning seed", f"fine-tune seed {f}", (m0, c.category, c.label_seeds[0], f)) for f in c.finetune_seeds]
    settings += [("label category", cat, (m0, cat, c.label_seeds[0], c.finetune_seeds[0])) for cat in (c.category, *c.other_categories)]
    settings += [("method", m, (m, c.category, c.label_seeds[0], c.finetune_seeds[0])) for m in c.methods]
    rows = []
    for varied, name, key in settings:
        have = [r for r in study.relations if (r, *key) in runs]
        invariant = sorted(r for r in have if runs[(r, *key)].get("full_batch") and key[0] == "full") \
            if varied == "fine-tuning seed" else []
        row = {"varied": varied, "setting": name, "key": "/".join(map(str, key)), "n": len(have),
               "seed_invariant_relations": ", ".join(invariant)}
        if len(have) < 3:
            rows.append({**row, "r": np.nan, "r_raw": np.nan})
            continue
        t = rel.set_index("relation").loc[have]
        k = pearson(t.readability_best_kappa, [runs[(r, *key)]["generalization_kappa"] for r in have], n_boot=200, n_perm=200)
        raw = pearson(t.readability_best, [runs[(r, *key)]["generalization"] for r in have], n_boot=200, n_perm=200)
        rows.append({**row, "r": k["r"], "ci_low": k["ci_low"], "ci_high": k["ci_high"], "r_raw": raw["r"]})
    return pd.DataFrame(rows)


def summarize(study, readability, layers, readout, pretrained, results, best, notes=()) -> None:
    out, c = study.out, study.config
    done = [r for r in results if r["status"] == "done"]
    runs = {(r["relation"], r["method"], r["category"], r["label_seed"], r["finetune_seed"]): r for r in done}
    finetunes = pd.DataFrame([{k: v for k, v in r.items() if k not in ("predictions", "mapping")} for r in results])
    preds = pd.DataFrame([{**p, "job": r["job"], "relation": r["relation"], "method": r["method"], "category": r["category"],
                           "label_seed": r["label_seed"], "finetune_seed": r["finetune_seed"]}
                          for r in done for p in r["predictions"]])
    rel = relation_table(study, layers, pretrained, runs, best)
    m0 = c.methods[0]

    stats_rows = []
    for m in c.methods:
        gen = {name: runs[(name, m, c.category, c.label_seeds[0], c.finetune_seeds[0])] for name in study.relations}
        t = _with_outcome(rel, gen)
        for x, y in PAIRS:
            stats_rows += [dict(method=m, **row) for row in correlation_table(t, x, y, COVARIATES, c.n_boot, c.n_perm)]
    stats = pd.DataFrame(stats_rows)

    design = null_design(rel, preds, m0, c.category, c.label_seeds[0], c.finetune_seeds[0])
    null, null_rs = calibration_table(design, n_sim=c.n_null, seed=c.split_seed, n_perm=c.n_perm, return_r=True)
    rob = robustness_table(study, rel, runs)
    unique_r = rob.drop_duplicates("key").r if "key" in rob else rob.r

    # error back-mapping, over the main runs of every method
    main = preds[(preds.category == c.category) & (preds.label_seed == c.label_seeds[0]) & (preds.finetune_seed == c.finetune_seeds[0])]
    errors = main[~main.correct.astype(bool)]
    main_runs = {(m, name): runs[(name, m, c.category, c.label_seeds[0], c.finetune_seeds[0])] for m in c.methods for name in study.relations}
    backmap = backmap_table(errors, dict(zip(rel.relation, rel.n_answers)), c.top_k, main_runs)

    def analyses(predictor, outcome):
        rows = stats[(stats.method == m0) & (stats.predictor == predictor) & (stats.outcome == outcome)]
        return {row.analysis: {"r": row.r, "p_value": row.p_value,
                               **({"ci": [row.ci_low, row.ci_high], "ci_method": row.ci_method} if row.analysis == "pearson" else {})}
                for row in rows.itertuples()}

    def null_p(outcome):
        """Share of simulated null studies whose |r| reaches the observed |r| (a calibrated p)."""
        row = stats[(stats.method == m0) & (stats.outcome == outcome) & (stats.analysis == "pearson")
                    & (stats.predictor == (HEADLINE if outcome == HEADLINE[1] else RAW)[0])]
        sims = null_rs.get(outcome)
        if not len(row) or sims is None or not np.isfinite(row.r.iloc[0]):
            return float("nan")
        sims = sims[np.isfinite(sims)]
        return float((1 + np.sum(np.abs(sims) >= abs(row.r.iloc[0]) - 1e-12)) / (1 + len(sims)))

    def fpr(outcome, analysis):
        row = null[(null.outcome == outcome) & (null.analysis == analysis)]
        return float(row.false_positive_rate.iloc[0]) if len(row) else float("nan")

    summary = {
        "model": study.model.name, "n_relations": len(study.relations), "methods": list(c.methods),
        "headline": {"method": m0, "predictor": HEADLINE[0], "outcome": HEADLINE[1], "measure": "Cohen's kappa",
                     **analyses(*HEADLINE), "null_false_positive_rate": fpr(HEADLINE[1], "pearson"),
                     "null_p_value": null_p(HEADLINE[1])},
        "raw": {"predictor": RAW[0], "outcome": RAW[1], **analyses(*RAW), "null_false_positive_rate": fpr(RAW[1], "pearson"),
                "null_p_value": null_p(RAW[1]),
                "why_inflated": "raw accuracies share chance levels: with fewer or more lopsided answers a blind guess scores "
                                "higher and readability is higher too, so raw accuracies correlate even with no generalization"},
        "null_calibration": {"n_sim": c.n_null, "alpha": 0.05,
                             "headline_false_positive_rate": fpr(HEADLINE[1], "pearson"),
                             "raw_false_positive_rate": fpr(RAW[1], "pearson"),
                             "max_kappa_false_positive_rate": float(null[null.outcome == HEADLINE[1]].false_positive_rate.max())},
        "robustness": {"r_min": float(unique_r.min()), "r_max": float(unique_r.max()), "r_std": float(unique_r.std()),
                       "n_settings": int(unique_r.notna().sum()), "measure": "kappa",
                       "note": "the main run appears once per kind of variation in robustness.csv; spread over distinct runs",
                       "seed_invariant_relations": sorted({x for v in rob.seed_invariant_relations for x in v.split(", ") if x})},
        "backmap": {m: backmap_summary(backmap, m) for m in c.methods},
        "covariates": {"n_finetune_subjects_vs_n_answers_r": float(np.corrcoef(rel.n_finetune_subjects, rel.n_answers)[0, 1])
                       if rel.n_finetune_subjects.nunique() > 1 and rel.n_answers.nunique() > 1 else float("nan")},
        "train_accuracy": {m: float(rel[f"train_accuracy_{m}"].mean()) for m in c.methods},
        "generalization": {m: float(rel[f"generalization_{m}"].mean()) for m in c.methods},
        "generalization_kappa": {m: float(rel[f"generalization_kappa_{m}"].mean()) for m in c.methods},
        "mean_readability_best": float(rel.readability_best.mean()),
        "mean_readability_best_kappa": float(rel.readability_best_kappa.mean()),
        "skipped_jobs": [{"job": r["job"], "reason": r["reason"]} for r in results if r["status"] == "skipped"],
        "untrained_prompt_tokens": list(notes),
        "frequency_covariate": study.frequency_source, "fixed_layer": study.fixed_layer,
        "config": c.to_dict(),
    }
    for name, df in (("relations", rel), ("finetunes", finetunes), ("predictions", preds), ("stats", stats),
                     ("robustness", rob), ("backmap", backmap), ("null_calibration", null)):
        write_csv(df, out / f"{name}.csv")
    write_json(summary, out / "summary.json")
    from .report import write_report

    write_report(out)
