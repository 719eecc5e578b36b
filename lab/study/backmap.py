"""Error back-mapping, against a fair null.

When the fine-tuned model gives a held-out subject a wrong label, the bijection maps that label
back to the original answer it stands for, always a *wrong* answer for the subject (Munich ->
zebra -> Asia). Mehri & Schütze ask whether these answers are more often among the linear
probe's top answers for the subject than among the pretrained model's.

Comparing top-k lists that include the true answer is tilted: the pretrained model's list holds
the true answer almost always, the probe's less often, so the probe has more free slots for the
wrong answer and "wins" by chance. Here both lists rank **wrong answers only** (the true answer
removed, and answers the design left out of the relation removed, the first ``k`` left), and
each rate is compared with two null expectations:

- **uniform**: a uniformly random wrong answer, ``slots / (n_answers - 1)`` per error (``slots``
  = the list's length, ``k`` unless the list ranks fewer answers); a Poisson-binomial z-test;
- **shuffled**: the back-mapped answers shuffled among the relation's errors (100 shuffles), which
  keeps the fine-tuned model's preference for some labels and the lists' preference for common
  answers, so both lists can beat the uniform null through popularity alone; only the excess
  over the shuffled rate ties an error to the subject. (A shuffle can hand an error its own true
  answer, never in its list; with many answers this lowers the shuffled rate slightly.)

A subject without a ranking (the probe leaves out answers rarer than its folds) is not counted.
Relations with ``n_answers - 1 <= k`` (every wrong answer is in the list) carry no information
and are marked uninformative. Across relations: a paired Wilcoxon signed-rank test of probe vs
model rates.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from scipy import stats

COLUMNS = ["method", "relation", "n_answers", "n_errors", "informative"] + [
    f"{who}_{c}"
    for who in ("probe", "model")
    for c in ("n", "rate", "expected_rate", "ratio", "p_value", "shuffled_rate", "ratio_shuffled")
]


def backmap_table(errors: pd.DataFrame, n_answers: dict[str, int], k: int, runs: dict | None = None) -> pd.DataFrame:
    """One row per (method, relation) from the wrong held-out predictions of the main runs.
    ``runs``: (method, relation) -> the run's result (for the shuffled null)."""
    rows = []
    for (method, rel), g in errors.groupby(["method", "relation"], sort=False):
        n = n_answers[rel]
        row = {"method": method, "relation": rel, "n_answers": n, "n_errors": len(g), "informative": n - 1 > k}
        for who in ("probe", "model"):
            has = g[g[f"in_{who}_topk"].notna()] if f"in_{who}_topk" in g else g.iloc[:0]
            hits = has[f"in_{who}_topk"].astype(float).to_numpy()
            slots = (
                has[f"{who}_slots"].astype(float).to_numpy()
                if f"{who}_slots" in has
                else np.full(len(has), min(k, n - 1))
            )
            p = np.minimum(slots, n - 1) / (n - 1)
            rate, expected = (float(hits.mean()), float(p.mean())) if len(hits) else (np.nan, np.nan)
            var = float((p * (1 - p)).sum())
            z = (hits.sum() - p.sum()) / np.sqrt(var) if var > 0 else np.nan
            shuffled = (runs or {}).get((method, rel), {}).get(f"{who}_shuffled_rate")
            row.update(
                {
                    f"{who}_n": len(hits),
                    f"{who}_rate": rate,
                    f"{who}_expected_rate": expected,
                    f"{who}_ratio": rate / expected if expected else np.nan,
                    f"{who}_p_value": float(2 * stats.norm.sf(abs(z))) if np.isfinite(z) else np.nan,
                    f"{who}_shuffled_rate": np.nan if shuffled is None else shuffled,
                    f"{who}_ratio_shuffled": rate / shuffled if shuffled else np.nan,
                }
            )
        rows.append(row)
    return pd.DataFrame(rows, columns=COLUMNS)


def backmap_summary(table: pd.DataFrame, method: str) -> dict:
    """Pooled rates and observed / expected over the informative relations of ``method``, and the
    paired Wilcoxon test of probe vs model rates across them."""
    t = table[(table.method == method) & table.informative.astype(bool)]
    out = {
        "method": method,
        "n_relations": int(len(t)),
        "n_errors": int(t.n_errors.sum()),
        "n_uninformative_relations": int(((table.method == method) & ~table.informative.astype(bool)).sum()),
    }
    for who in ("probe", "model"):
        n = t[f"{who}_n"].astype(float)
        w = n / n.sum() if n.sum() else n
        for col in ("rate", "expected_rate", "shuffled_rate"):
            out[f"{who}_{col}"] = float((t[f"{who}_{col}"] * w).sum()) if len(t) and n.sum() else float("nan")
        out[f"{who}_ratio"] = (
            out[f"{who}_rate"] / out[f"{who}_expected_rate"] if out[f"{who}_expected_rate"] else float("nan")
        )
        out[f"{who}_ratio_shuffled"] = (
            out[f"{who}_rate"] / out[f"{who}_shuffled_rate"] if out[f"{who}_shuffled_rate"] else float("nan")
        )
    d = (t.probe_rate - t.model_rate).dropna().to_numpy()
    out["mean_difference"] = float(d.mean()) if len(d) else float("nan")
    out["wilcoxon_p"] = float(stats.wilcoxon(d).pvalue) if len(d) >= 2 and np.any(d != 0) else float("nan")
    return out
