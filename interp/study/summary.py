"""Aggregate a finished study: tables, statistics, robustness, error back-mapping, figures, report."""
from __future__ import annotations

import json

import numpy as np
import pandas as pd

from .stats import COVARIATES, correlation_table, pearson

PAIRS = [("readability_best", "generalization"), ("readability_best_cc", "generalization_cc"),
         ("readability_fixed", "generalization"), ("readability_fixed_cc", "generalization_cc")]


def _cc(acc, chance):
    return (acc - chance) / (1 - chance)


def relation_table(study, readability, pretrained, runs, best) -> pd.DataFrame:
    c = study.config
    mean = readability.groupby(["relation", "layer"])[["accuracy", "chance", "selectivity"]].mean()
    rows = []
    for name in study.relations:
        b, f = best[name], study.fixed_layer
        chance = float(mean.loc[(name, b), "chance"])
        pre = pretrained[pretrained.relation == name]
        row = {"relation": name, "best_layer": b, "fixed_layer": f, "chance_probe": chance,
               "readability_best": float(mean.loc[(name, b), "accuracy"]), "selectivity_best": float(mean.loc[(name, b), "selectivity"]),
               "readability_fixed": float(mean.loc[(name, f), "accuracy"]),
               "pretrained_accuracy": float(pre.correct.mean()), "subject_frequency": float(pre.subject_frequency.mean())}
        row["readability_best_cc"] = _cc(row["readability_best"], chance)
        row["readability_fixed_cc"] = _cc(row["readability_fixed"], chance)
        props = study.relations[name].properties
        for k in ("augment", "bio", "templates", "mentions"):
            if k in props:
                row[k] = props[k]
        for m in c.methods:
            run = runs[(name, m, c.category, c.label_seeds[0], c.finetune_seeds[0])]
            row.update({"n_answers": run["n_answers"], "n_finetune_subjects": run["n_finetune_subjects"],
                        "n_heldout": run["n_heldout"], f"generalization_{m}": run["generalization"],
                        f"generalization_cc_{m}": run["generalization_cc"], f"train_accuracy_{m}": run["train_accuracy"],
                        f"steps_{m}": run["steps"]})
        rows.append(row)
    return pd.DataFrame(rows)


def _with_outcome(rel: pd.DataFrame, gen: dict) -> pd.DataFrame:
    t = rel.copy()
    t["generalization"] = t.relation.map(lambda r: gen[r]["generalization"])
    t["generalization_cc"] = t.relation.map(lambda r: gen[r]["generalization_cc"])
    return t


def summarize(study, readability, readout, pretrained, results, best) -> None:
    from ..store import atomic_write_bytes

    out, c = study.out, study.config
    done = [r for r in results if r["status"] == "done"]
    runs = {(r["relation"], r["method"], r["category"], r["label_seed"], r["finetune_seed"]): r for r in done}
    finetunes = pd.DataFrame([{k: v for k, v in r.items() if k not in ("predictions", "mapping")} for r in results])
    preds = pd.DataFrame([{**p, "job": r["job"], "relation": r["relation"], "method": r["method"], "category": r["category"],
                           "label_seed": r["label_seed"], "finetune_seed": r["finetune_seed"]}
                          for r in done for p in r["predictions"]])
    rel = relation_table(study, readability, pretrained, runs, best)

    stats_rows = []
    for m in c.methods:
        gen = {name: runs[(name, m, c.category, c.label_seeds[0], c.finetune_seeds[0])] for name in study.relations}
        t = _with_outcome(rel, gen)
        if len(t) >= 3:
            for x, y in PAIRS:
                stats_rows += [dict(method=m, **row) for row in correlation_table(t, x, y, COVARIATES, c.n_boot, c.n_perm)]
    stats = pd.DataFrame(stats_rows)

    # robustness: r (best-layer readability vs generalization) for each setting varied alone
    m0 = c.methods[0]
    settings = [("label assignment", f"label seed {l}", (m0, c.category, l, c.finetune_seeds[0])) for l in c.label_seeds]
    settings += [("fine-tuning seed", f"fine-tune seed {f}", (m0, c.category, c.label_seeds[0], f)) for f in c.finetune_seeds]
    settings += [("label category", cat, (m0, cat, c.label_seeds[0], c.finetune_seeds[0])) for cat in (c.category, *c.other_categories)]
    settings += [("method", m, (m, c.category, c.label_seeds[0], c.finetune_seeds[0])) for m in c.methods]
    rob_rows = []
    for varied, name, key in settings:
        have = [r for r in study.relations if (r, *key) in runs]
        if len(have) < 3:
            rob_rows.append({"varied": varied, "setting": name, "r": np.nan, "n": len(have)})
            continue
        t = rel.set_index("relation").loc[have]
        g = [runs[(r, *key)]["generalization"] for r in have]
        res = pearson(t.readability_best, g, n_boot=200, n_perm=200)
        rob_rows.append({"varied": varied, "setting": name, "r": res["r"], "ci_low": res["ci_low"], "ci_high": res["ci_high"], "n": len(have)})
    rob = pd.DataFrame(rob_rows)

    # error back-mapping, over the main runs of every method
    main = preds[(preds.category == c.category) & (preds.label_seed == c.label_seeds[0]) & (preds.finetune_seed == c.finetune_seeds[0])]
    errors = main[~main.correct.astype(bool)].astype({"in_probe_topk": float, "in_model_topk": float})
    backmap_rel = errors.groupby(["method", "relation"]).agg(
        n_errors=("subject", "size"), probe_topk_rate=("in_probe_topk", "mean"), model_topk_rate=("in_model_topk", "mean")
    ).reset_index()
    headline = stats[(stats.method == m0) & (stats.predictor == "readability_best") & (stats.outcome == "generalization")]
    head = {row.analysis: {"r": row.r, "p_value": row.p_value, **({"ci": [row.ci_low, row.ci_high]} if row.analysis == "pearson" else {})}
            for row in headline.itertuples()}
    summary = {
        "model": study.model.name, "n_relations": len(study.relations), "methods": list(c.methods),
        "headline": {"method": m0, "predictor": "readability_best", "outcome": "generalization", **head},
        "robustness": {"r_min": float(rob.r.min()), "r_max": float(rob.r.max()), "r_std": float(rob.r.std()), "n_settings": int(rob.r.notna().sum())},
        "backmap": {"n_errors": int(len(errors)), "probe_topk_rate": float(errors.in_probe_topk.mean()) if len(errors) else float("nan"),
                    "model_topk_rate": float(errors.in_model_topk.mean()) if len(errors) else float("nan")},
        "train_accuracy": {m: float(rel[f"train_accuracy_{m}"].mean()) for m in c.methods},
        "generalization": {m: float(rel[f"generalization_{m}"].mean()) for m in c.methods},
        "mean_readability_best": float(rel.readability_best.mean()),
        "skipped_jobs": [{"job": r["job"], "reason": r["reason"]} for r in results if r["status"] == "skipped"],
        "frequency_covariate": study.frequency_source, "fixed_layer": study.fixed_layer,
        "config": c.to_dict(),
    }
    for name, df in (("relations", rel), ("finetunes", finetunes), ("predictions", preds), ("stats", stats),
                     ("robustness", rob), ("backmap", backmap_rel)):
        atomic_write_bytes(out / f"{name}.csv", df.to_csv(index=False).encode())
    atomic_write_bytes(out / "summary.json", json.dumps(summary, indent=1, default=float).encode())
    from .report import write_report

    write_report(out)

