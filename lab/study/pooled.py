"""One estimate over pretraining seeds: the study's correlation with the run-to-run noise in it.

A study of one pretrained model measures one draw of pretraining: another seed of the same
recipe gives another model, other readabilities and other fine-tunes. Several seeds' studies of
the same relations are pooled here, so that the estimate's interval carries both sources of
uncertainty a reader cares about:

- **relations**: the study's r is over a sample of relations (each seed's bootstrap CI);
- **pretraining runs**: the seeds' r differ (their SD is reported beside the pooled value).

The pooled r is ``tanh(mean_s atanh(r_s))`` (Fisher z averaged over seeds). Its interval adds two
variances of that mean z: the relations' (a bootstrap that resamples one set of relation indices
for all seeds, since every seed studies the same relations) and the seeds' (their z's sample
variance over k), with a t quantile whose degrees of freedom (Welch-Satterthwaite) come from the
k seeds, so that three seeds widen it as they should. (A first version resampled the seeds in the
bootstrap instead: with 3 seeds that shrinks their variance by a third and has no t widening; a
review measured its coverage at 0.85 and 0.77 for seed-to-seed z SDs of 0.6 and 1.0.) Measured
coverage of this interval's nominal 95%, 24 relations and 3 seeds whose true z differ by an SD of
0, 0.3, 0.6 and 1.0 (300 simulated sets each): 0.94, 0.93, 0.91, 0.92. Each seed's own r, CI and
Monte-Carlo p (its study's simulated null, on all its relations; the pooled value uses the
relations every seed has) is listed beside it.

>>> pooled, per_seed = pool_over_seeds(["results/study_seed0", "results/study_seed1", "results/study_seed2"])
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats

from .compare import CompareError, load_study


def _r(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Pearson r along the last axis (NaN where a variable is constant)."""
    xc, yc = x - x.mean(-1, keepdims=True), y - y.mean(-1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        return (xc * yc).sum(-1) / np.sqrt((xc**2).sum(-1) * (yc**2).sum(-1))


def pooled_correlation(
    x: np.ndarray, y: np.ndarray, n_boot: int = 5000, seed: int = 0, confidence: float = 0.95
) -> dict:
    """Pooled r of ``x`` and ``y`` (``[seeds, relations]``, the same relations in the same order)
    with the two-level bootstrap interval (module docstring)."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    if x.shape != y.shape or x.ndim != 2:
        raise ValueError(f"x and y must both be [seeds, relations]; got {x.shape} and {y.shape}")
    k, n = x.shape
    if k < 2 or n < 4:
        raise ValueError(f"pooling needs at least 2 seeds and 4 shared relations; got {k} seeds, {n} relations")
    r = _r(x, y)
    z = np.arctanh(np.clip(r, -0.999999, 0.999999))
    rng = np.random.default_rng(seed)
    rels = rng.integers(0, n, (n_boot, n))
    zb = np.arctanh(np.clip(_r(x[:, rels].transpose(1, 0, 2), y[:, rels].transpose(1, 0, 2)), -0.999999, 0.999999))
    zb = np.nanmean(zb, axis=1)  # [B]: the seeds' mean z on each resample of the relations
    v_rel = float(np.nanvar(zb, ddof=1))
    v_seed = float(z.var(ddof=1)) / k
    se = np.sqrt(v_rel + v_seed)
    # Welch-Satterthwaite: the seed term is estimated from k seeds (k - 1 df), the relation term
    # from many resamples; with no seed-to-seed spread the interval is the normal one
    df = np.inf if v_seed == 0 else se**4 * (k - 1) / v_seed**2
    q = float(stats.t.ppf(0.5 + confidence / 2, df)) if np.isfinite(df) else float(stats.norm.ppf(0.5 + confidence / 2))
    low, high = float(np.tanh(z.mean() - q * se)), float(np.tanh(z.mean() + q * se))
    return {
        "r_pooled": float(np.tanh(z.mean())),
        "r_seeds": [float(v) for v in r],
        "ci_low": low,
        "ci_high": high,
        "seed_sd": float(r.std(ddof=1)),
        "r_min": float(r.min()),
        "r_max": float(r.max()),
        "n_seeds": k,
        "n_relations": n,
        "n_boot": int(np.isfinite(zb).sum()),
        "df": float(df),
    }


def pool_over_seeds(
    folders: Sequence[str | Path],
    predictor: str = "readability_best_kappa",
    n_boot: int = 5000,
    seed: int = 0,
    method: str | None = None,
) -> tuple[dict, pd.DataFrame]:
    """The pooled headline of finished studies of one recipe's pretraining seeds (``folders``):
    the pooled r with its two-level interval, and one row per seed (its r, bootstrap CI and
    Monte-Carlo p from its own ``stats.csv``, else its summary's headline). Only relations with an
    outcome in every study are pooled. ``method``: the fine-tuning method pooled (default: the
    studies' headline method; another, e.g. ``"lora"``, must be one every study ran)."""
    if len(folders) < 2:
        raise CompareError(f"pooling over seeds needs at least 2 study folders, got {len(folders)}")
    loaded = [load_study(f) for f in folders]
    if method is None:
        methods = {s["headline"]["method"] for s, _ in loaded}
        if len(methods) > 1:
            raise CompareError(f"the studies' headline methods differ ({', '.join(sorted(methods))}); pool one method")
        method = methods.pop()
    ran = [s.get("methods", [s["headline"]["method"]]) for s, _ in loaded]
    missing = [str(f) for f, methods_run in zip(folders, ran) if method not in methods_run]
    if missing:
        raise CompareError(f"method {method!r} is not in every study (missing from {', '.join(missing)})")
    outcome = f"generalization_kappa_{method}"
    tables = [r.set_index("relation")[[predictor, outcome]].dropna() for _, r in loaded]
    shared = sorted(set.intersection(*(set(t.index) for t in tables)))
    x = np.stack([t.loc[shared, predictor].to_numpy(float) for t in tables])
    y = np.stack([t.loc[shared, outcome].to_numpy(float) for t in tables])
    pooled = pooled_correlation(x, y, n_boot, seed)
    pooled.update(predictor=predictor, outcome=outcome, method=method)
    rows = []
    for folder, (s, _rel), xs, ys in zip(folders, loaded, x, y):
        p = _pearson(folder, s, method, predictor)
        ci = p.get("ci", [np.nan, np.nan])
        rows.append(
            {
                "study": str(folder),
                "model": s["model"],
                "r": float(_r(xs, ys)),
                "r_all_relations": p.get("r", np.nan),
                "ci_low": ci[0],
                "ci_high": ci[1],
                "p_monte_carlo": p.get("p_monte_carlo", np.nan),
                "n_relations": len(shared),
            }
        )
    return pooled, pd.DataFrame(rows)


def _pearson(folder: str | Path, summary: dict, method: str, predictor: str) -> dict:
    """A study's own Pearson test of ``predictor`` with ``method``'s generalization kappa: from its
    ``stats.csv`` where saved (every method), else from its summary's headline."""
    path = Path(folder) / "stats.csv"
    if path.exists():
        st = pd.read_csv(path)
        hit = st[
            (st.method == method)
            & (st.predictor == predictor)
            & (st.outcome == "generalization_kappa")
            & (st.analysis == "pearson")
        ]
        if len(hit):
            row = hit.iloc[0]
            return {"r": row.r, "ci": [row.ci_low, row.ci_high], "p_monte_carlo": row.p_monte_carlo}
    return summary["headline"].get("pearson", {}) if summary["headline"]["method"] == method else {}


__all__ = ["pool_over_seeds", "pooled_correlation"]
