"""Error back-mapping, against a fair null.

When the fine-tuned model gives a held-out subject a wrong label, the bijection maps that label
back to the original answer it stands for, always a *wrong* answer for the subject (Munich ->
zebra -> Asia). Mehri & Schütze ask whether these answers are more often among the linear
probe's top answers for the subject than among the pretrained model's.

Comparing top-k lists that include the true answer is tilted: the pretrained model's list holds
the true answer almost always, the probe's less often, so the probe has more free slots for the
wrong answer and "wins" by chance. Here both lists rank **wrong answers only** (the true answer
removed, the first ``k`` left), so each has exactly ``k`` slots, and each rate is compared with
its null expectation, a uniformly random wrong answer: ``k / (n_answers - 1)``. Relations with
``n_answers - 1 <= k`` (every wrong answer is in the list) carry no information and are marked
uninformative. Per relation: observed rate, expected rate, their ratio and a binomial test;
across relations: a paired Wilcoxon signed-rank test of probe vs model rates.
"""
from __future__ import annotations

import numpy as np
import pandas as pd
from scipy import stats


def backmap_table(errors: pd.DataFrame, n_answers: dict[str, int], k: int) -> pd.DataFrame:
    """One row per (method, relation) from the wrong held-out predictions of the main runs."""
    rows = []
    for (method, rel), g in errors.groupby(["method", "relation"], sort=False):
        n = n_answers[rel]
        expected = min(k, n - 1) / (n - 1)
        row = {"method": method, "relation": rel, "n_answers": n, "n_errors": len(g), "expected_rate": expected,
               "informative": n - 1 > k}
        for who in ("probe", "model"):
            hits = g[f"in_{who}_topk"].astype(float)
            rate = float(hits.mean())
            row[f"{who}_rate"] = rate
            row[f"{who}_ratio"] = rate / expected
            row[f"{who}_p_value"] = float(stats.binomtest(int(hits.sum()), len(g), expected).pvalue) if n - 1 > k else np.nan
        rows.append(row)
    return pd.DataFrame(rows)


def backmap_summary(table: pd.DataFrame, method: str) -> dict:
    """Pooled rates and observed / expected over the informative relations of ``method``, and the
    paired Wilcoxon test of probe vs model rates across them."""
    t = table[(table.method == method) & table.informative]
    out = {"method": method, "n_relations": int(len(t)), "n_errors": int(t.n_errors.sum()),
           "n_uninformative_relations": int(((table.method == method) & ~table.informative).sum())}
    if not len(t):
        return {**out, "probe_rate": np.nan, "model_rate": np.nan, "expected_rate": np.nan,
                "probe_ratio": np.nan, "model_ratio": np.nan, "wilcoxon_p": np.nan}
    w = t.n_errors / t.n_errors.sum()
    for col in ("probe_rate", "model_rate", "expected_rate"):
        out[col] = float((t[col] * w).sum())
    out["probe_ratio"] = out["probe_rate"] / out["expected_rate"]
    out["model_ratio"] = out["model_rate"] / out["expected_rate"]
    d = (t.probe_rate - t.model_rate).to_numpy()
    out["mean_difference"] = float(d.mean())
    out["wilcoxon_p"] = float(stats.wilcoxon(d).pvalue) if len(d) >= 2 and np.any(d != 0) else np.nan
    return out
