"""One estimate over pretraining seeds: the study's correlation with the run-to-run noise in it.

A study of one pretrained model measures one draw of pretraining: another seed of the same
recipe gives another model, other readabilities and other fine-tunes. Several seeds' studies of
the same relations are pooled here, so that the estimate's interval carries both sources of
uncertainty a reader cares about:

- **relations**: the study's r is over a sample of relations (each seed's bootstrap CI);
- **pretraining runs**: the seeds' r differ (their SD is reported beside the pooled value).

The pooled r is ``tanh(mean_s atanh(r_s))`` (Fisher z averaged over seeds). Its interval is a
two-level bootstrap: each draw resamples the seeds (with replacement) and the relations (one
set of relation indices for all seeds, since every seed studies the same relations), recomputes
each drawn seed's r on the drawn relations and averages their z. With few seeds the seed level
is coarse (3 seeds give 10 distinct multisets), which the interval then reflects rather than
hides. Measured coverage of the 95% interval, 24 relations and 3 seeds (300 simulated sets of
studies): 0.90 when the seeds agree exactly, 0.94 when each seed adds its own noise (SD 0.3 of the
relations' spread); a percentile interval of a correlation on 24 cases covers slightly less than
nominal. Each seed's own Monte-Carlo p (its study's simulated null) is listed beside it.

>>> pooled, per_seed = pool_over_seeds(["results/study_seed0", "results/study_seed1", "results/study_seed2"])
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from interp.resampling import percentile_interval

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
    seeds = rng.integers(0, k, (n_boot, k))
    rels = rng.integers(0, n, (n_boot, n))
    rb = _r(x[seeds[:, :, None], rels[:, None, :]], y[seeds[:, :, None], rels[:, None, :]])  # [B, k]
    zb = np.nanmean(np.arctanh(np.clip(rb, -0.999999, 0.999999)), axis=1)
    zb = zb[np.isfinite(zb)]
    low, high = percentile_interval(np.tanh(zb), confidence)
    return {
        "r_pooled": float(np.tanh(z.mean())),
        "ci_low": low,
        "ci_high": high,
        "seed_sd": float(r.std(ddof=1)),
        "r_min": float(r.min()),
        "r_max": float(r.max()),
        "n_seeds": k,
        "n_relations": n,
        "n_boot": int(len(zb)),
    }


def pool_over_seeds(
    folders: Sequence[str | Path],
    predictor: str = "readability_best_kappa",
    n_boot: int = 5000,
    seed: int = 0,
) -> tuple[dict, pd.DataFrame]:
    """The pooled headline of finished studies of one recipe's pretraining seeds (``folders``):
    the pooled r with its two-level interval, and one row per seed (its r, bootstrap CI and
    Monte-Carlo p from its own summary). Only relations with an outcome in every study are pooled."""
    if len(folders) < 2:
        raise CompareError(f"pooling over seeds needs at least 2 study folders, got {len(folders)}")
    loaded = [load_study(f) for f in folders]
    methods = {s["headline"]["method"] for s, _ in loaded}
    if len(methods) > 1:
        raise CompareError(f"the studies' headline methods differ ({', '.join(sorted(methods))}); pool one method")
    method = methods.pop()
    outcome = f"generalization_kappa_{method}"
    tables = [r.set_index("relation")[[predictor, outcome]].dropna() for _, r in loaded]
    shared = sorted(set.intersection(*(set(t.index) for t in tables)))
    x = np.stack([t.loc[shared, predictor].to_numpy(float) for t in tables])
    y = np.stack([t.loc[shared, outcome].to_numpy(float) for t in tables])
    pooled = pooled_correlation(x, y, n_boot, seed)
    pooled.update(predictor=predictor, outcome=outcome, method=method)
    rows = []
    for folder, (s, _rel), xs, ys in zip(folders, loaded, x, y):
        p = s["headline"].get("pearson", {})
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


__all__ = ["pool_over_seeds", "pooled_correlation"]
