"""Statistics across relations: does readability predict generalization?

- **Pearson r** (``scipy.stats.pearsonr``) with a bootstrap confidence interval over relations
  (``scipy.stats.bootstrap``, paired resampling, BCa; where BCa is undefined on a degenerate
  sample the percentile interval is used and the ``ci_method`` column says so) and a two-sided
  permutation p-value (:func:`permutation_p`: pairings shuffled, ``(1 + #{|r*| >= |r|}) /
  (1 + n_perm)``; vectorized so that :mod:`lab.study.null` can afford it thousands of times);
  bootstrap draws and intervals are :mod:`interp.resampling`'s, as everywhere in the project;
- **Spearman rho** (``scipy.stats.spearmanr``);
- **partial correlation** controlling for covariates: both variables are residualized on the
  covariates by OLS (``statsmodels``), the residuals are correlated, and the p-value uses a t
  distribution with ``n - 2 - k`` degrees of freedom for ``k`` linearly independent covariates
  (collinear covariates, such as the number of fine-tuning subjects when it is ``n_finetune``
  times the number of answers, are absorbed by the pseudo-inverse and counted once).
"""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd
from scipy import stats

from interp.resampling import bootstrap_indices, correlation_permutation_p, percentile_interval, permutations

#: covariates the partial correlations control for, separately and jointly, those a study measured
#: (``chance``: the prior-matched chance level sum p_a^2 of the held-out subjects' answers;
#: ``pretrained_accuracy``: recall, the model's own accuracy on the original relation;
#: ``embedding_kappa``: the same probe on the name's input embeddings, :mod:`lab.study.baselines`;
#: ``readability_mlp_kappa`` / ``readability_knn_kappa``: nonlinear probes on the same states and
#: folds, :mod:`probes.nonlinear`)
COVARIATES = ["n_finetune_subjects", "n_answers", "chance", "pretrained_accuracy", "subject_frequency",
              "embedding_kappa", "readability_mlp_kappa", "readability_knn_kappa"]  # fmt: skip
#: rival predictors of generalization that the headline's readability is compared with (Williams'
#: test of two correlations sharing the outcome): decodability that is not linear
RIVALS = ["readability_mlp_kappa", "readability_knn_kappa"]


def permutation_p(x, y, n_perm: int = 2000, rng=None) -> float:
    """Two-sided permutation p-value of Pearson r: the share of ``n_perm`` shuffled pairings
    whose |r| reaches the observed |r|, counting the observed pairing once
    (:func:`interp.resampling.correlation_permutation_p`, ``y`` reordered)."""
    rng = rng if rng is not None else np.random.default_rng(0)
    return correlation_permutation_p(y, x, permutations(rng, len(x), n_perm))


def pearson(x, y, n_boot: int = 2000, n_perm: int = 2000, seed: int = 0, ci: float = 0.95) -> dict:
    x, y = np.asarray(x, float), np.asarray(y, float)
    n = len(x)
    if n < 3:
        raise ValueError(f"a correlation across relations needs at least 3 relations, got {n}")
    if not (np.isfinite(x).all() and np.isfinite(y).all()):
        return {
            "r": np.nan,
            "ci_low": np.nan,
            "ci_high": np.nan,
            "ci_method": "undefined (a value is NaN)",
            "p_value": np.nan,
            "n": n,
        }
    if np.std(x) == 0 or np.std(y) == 0:
        return {
            "r": np.nan,
            "ci_low": np.nan,
            "ci_high": np.nan,
            "ci_method": "undefined (a constant variable)",
            "p_value": np.nan,
            "n": n,
        }
    r = stats.pearsonr(x, y).statistic
    stat = lambda a, b: stats.pearsonr(a, b).statistic  # noqa: E731
    rng = np.random.default_rng(seed)
    method = "BCa"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # scipy warns of degenerate resamples; BCa's NaN is handled below
        try:
            boot = stats.bootstrap(
                (x, y),
                stat,
                paired=True,
                vectorized=False,
                n_resamples=n_boot,
                confidence_level=ci,
                method="BCa",
                random_state=rng,
            )
            lo, hi = boot.confidence_interval
            if not (np.isfinite(lo) and np.isfinite(hi)):
                raise ValueError("BCa interval is NaN")
        except Exception as err:  # BCa is undefined on degenerate resamples: percentile, and say so
            method = f"percentile (BCa failed: {err})"
            lo, hi = _percentile_interval(x, y, n_boot, ci, np.random.default_rng(seed))
    p = permutation_p(x, y, n_perm, np.random.default_rng(seed + 1))
    return {"r": float(r), "ci_low": float(lo), "ci_high": float(hi), "ci_method": method, "p_value": p, "n": n}


def _percentile_interval(x, y, n_boot: int, ci: float, rng) -> tuple[float, float]:
    """Paired percentile bootstrap of Pearson r; resamples where r is undefined (a constant
    variable) are left out rather than making the interval NaN."""
    idx = bootstrap_indices(rng, len(x), n_boot)
    xb, yb = x[idx], y[idx]
    xc, yc = xb - xb.mean(1, keepdims=True), yb - yb.mean(1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        r = (xc * yc).sum(1) / np.sqrt((xc**2).sum(1) * (yc**2).sum(1))
    r = r[np.isfinite(r)]
    if not len(r):
        return float("nan"), float("nan")
    return percentile_interval(r, ci)


def spearman(x, y) -> dict:
    res = stats.spearmanr(x, y)
    return {"r": float(res.statistic), "p_value": float(res.pvalue), "n": len(x)}


def partial(x, y, covariates: pd.DataFrame) -> dict:
    """Correlation of x and y with the linear effect of ``covariates`` removed from both."""
    import statsmodels.api as sm

    x, y = np.asarray(x, float), np.asarray(y, float)
    Z = sm.add_constant(np.asarray(covariates, float), has_constant="add")
    k = (
        int(np.linalg.matrix_rank(Z)) - 1
    )  # collinear covariates (e.g. n_finetune_subjects = n_finetune x n_answers) count once
    n = len(x)
    if n - 2 - k < 1:
        raise ValueError(f"too few relations ({n}) for a partial correlation with {k} covariates")
    with warnings.catch_warnings():  # rank deficiency is expected and handled (see docstring)
        warnings.simplefilter("ignore")
        rx = sm.OLS(x, Z).fit(method="pinv").resid  # the pseudo-inverse handles collinear covariates
        ry = sm.OLS(y, Z).fit(method="pinv").resid
    if np.std(rx) < 1e-12 or np.std(ry) < 1e-12:
        return {"r": np.nan, "p_value": np.nan, "n": n, "df": n - 2 - k}
    r = float(np.corrcoef(rx, ry)[0, 1])
    df = n - 2 - k
    t = r * np.sqrt(df / max(1e-300, 1 - r * r))
    return {"r": r, "p_value": float(2 * stats.t.sf(abs(t), df)), "n": n, "df": df}


def correlation_table(
    table: pd.DataFrame,
    predictor: str,
    outcome: str,
    covariates: list[str],
    n_boot: int,
    n_perm: int,
    seed: int = 0,
    rivals: list[str] = (),
) -> list[dict]:
    """Pearson (with CI and permutation p), Spearman, partial correlations (each covariate alone,
    then all jointly) of ``predictor`` with ``outcome`` across the rows of ``table``, and
    Williams' test against each of ``rivals`` (``williams:<rival>``: ``r`` is the difference of
    the two correlations)."""
    x, y = table[predictor].to_numpy(float), table[outcome].to_numpy(float)
    rows = [
        dict(analysis="pearson", **pearson(x, y, n_boot, n_perm, seed)),
        dict(analysis="spearman", **spearman(x, y)),
    ]
    # a partial correlation on one covariate needs n - 3 >= 1 degrees of freedom (fewer relations
    # remain when fine-tunes failed: lab.study.failures); with fewer it is left out. A covariate
    # the study did not measure (no column) or the predictor itself is left out too
    usable = (
        [c for c in covariates if c != predictor and c in table and table[c].nunique() > 1] if len(table) >= 4 else []
    )
    for c in usable:
        rows.append(dict(analysis=f"partial:{c}", **partial(x, y, table[[c]])))
    if len(usable) > 1 and len(table) - 2 - len(usable) >= 1:
        rows.append(dict(analysis="partial:all", **partial(x, y, table[usable])))
    for z in rivals:
        if z in table and z != predictor and table[z].nunique() > 1 and len(table) >= 4:
            rows.append(dict(analysis=f"williams:{z}", **williams(x, table[z].to_numpy(float), y, n_boot, seed)))
    return [dict(predictor=predictor, outcome=outcome, **r) for r in rows]


def williams(x, z, y, n_boot: int = 2000, seed: int = 0) -> dict:
    """``r(x, y) - r(z, y)`` (in ``r``) with Williams' t test p (:func:`williams_t`) that the two
    correlations with ``y`` are equal, and a paired percentile bootstrap interval over the rows
    (:func:`correlation_difference`); rows missing any of the three are left out. The study's
    simulated null (no generalization at all) cannot calibrate this comparison, whose null is two
    equal and possibly nonzero correlations: read the interval. With strongly correlated
    predictors (a linear and an MLP probe's kappas, r ~ 0.99) the test has little power, and a
    noisier predictor's correlation is attenuated, which favours the less noisy one."""
    d = correlation_difference(x, z, y, n_boot=n_boot, seed=seed)
    return {"r": d["diff"], "ci_low": d["ci_low"], "ci_high": d["ci_high"], "p_value": d["p_williams"],
            "n": d["n"], "t": d["t_williams"]}  # fmt: skip


def williams_t(r_yx: float, r_yz: float, r_xz: float, n: int) -> dict:
    """Williams' t test (Steiger 1980, eq. 7) that two correlations sharing a variable are equal:
    ``r(y, x)`` vs ``r(y, z)``, with ``r(x, z)`` their predictors' correlation, on ``n`` cases;
    t with ``n - 3`` degrees of freedom, two-sided p."""
    from scipy import stats as sps

    if n < 4:
        return {"t": float("nan"), "p_value": float("nan")}
    r_yx, r_yz = np.asarray(r_yx, float), np.asarray(r_yz, float)  # arrays: one test per element
    det = 1 - r_yx**2 - r_yz**2 - r_xz**2 + 2 * r_yx * r_yz * r_xz
    mean = (r_yx + r_yz) / 2
    denom = 2 * (n - 1) / (n - 3) * det + mean**2 * (1 - r_xz) ** 3
    with np.errstate(invalid="ignore", divide="ignore"):
        t = np.where(denom > 0, (r_yx - r_yz) * np.sqrt((n - 1) * (1 + r_xz) / np.where(denom > 0, denom, 1)), np.nan)
    p = 2 * sps.t.sf(np.abs(t), n - 3)
    if t.ndim == 0:
        return {"t": float(t), "p_value": float(p)}
    return {"t": t, "p_value": p}


def correlation_difference(x, z, y, n_boot: int = 2000, seed: int = 0, ci: float = 0.95) -> dict:
    """``r(x, y) - r(z, y)`` with a paired percentile bootstrap interval (cases resampled together)
    and Williams' t test."""
    x, z, y = (np.asarray(v, dtype=float) for v in (x, z, y))
    ok = ~(np.isnan(x) | np.isnan(z) | np.isnan(y))
    x, z, y = x[ok], z[ok], y[ok]
    n = len(y)
    r = lambda a, b: float(np.corrcoef(a, b)[0, 1])  # noqa: E731
    diff = r(x, y) - r(z, y)
    draws = [
        r(x[i], y[i]) - r(z[i], y[i])
        for i in bootstrap_indices(np.random.default_rng(seed), n, n_boot)
        if np.std(x[i]) > 0 and np.std(z[i]) > 0 and np.std(y[i]) > 0
    ]
    low, high = percentile_interval(draws, ci) if draws else (np.nan, np.nan)
    w = williams_t(r(x, y), r(z, y), r(x, z), n)
    return {
        "diff": diff,
        "ci_low": float(low),
        "ci_high": float(high),
        "p_williams": w["p_value"],
        "t_williams": w["t"],
        "n": n,
        "n_boot_used": len(draws),
    }  # resamples where a variable was constant have no r and are dropped


def control_two_ways(
    table: pd.DataFrame, predictor: str, control: str, outcome: str, label: str = "relation", **pearson_kw
) -> tuple[dict, pd.DataFrame]:
    """A control variable removed from ``predictor`` two ways, with each row's leave-one-out
    influence on both:

    - **subtraction**: Pearson r of ``predictor - control`` with ``outcome`` (:func:`pearson`). It
      assumes ``outcome = a + b (predictor - control)``: in ``outcome ~ predictor + control`` the
      control's coefficient is minus the predictor's (their sum is 0);
    - **regression** (partial r, :func:`partial`): ``predictor`` and ``outcome`` residualized on the
      control by OLS, so the data set the control's coefficient. Equivalent to the t test of
      ``predictor``'s coefficient in ``outcome ~ predictor + control``. Its like-for-like partner
      of the subtraction (the outcome left raw) is the **semipartial** r: ``outcome`` with
      ``predictor`` residualized on the control.

    Whether the subtraction's assumption holds is tested directly: ``slope_sum`` is the sum of the
    two coefficients with its 95% interval (it excludes 0: the data reject the subtraction).
    Returns the summary and one row per left-out row: ``r_subtraction`` and ``r_partial`` without
    it, and their changes."""
    import statsmodels.api as sm

    t = table[[label, predictor, control, outcome]].dropna()
    x, z, y = (t[c].to_numpy(float) for c in (predictor, control, outcome))
    sub = pearson(x - z, y, **pearson_kw)
    part = partial(x, y, t[[control]])
    fit = sm.OLS(y, sm.add_constant(np.column_stack([x, z]))).fit()
    contrast = fit.t_test([0, 1, 1])
    x_res = x - np.polyval(np.polyfit(z, x, 1), z)
    semipartial = float(np.corrcoef(x_res, y)[0, 1])
    rows = []
    for i, name in enumerate(t[label]):
        keep = np.arange(len(t)) != i
        rs = float(np.corrcoef(x[keep] - z[keep], y[keep])[0, 1])
        rp = partial(x[keep], y[keep], t[[control]].iloc[keep])["r"]
        rows.append({label: name, "r_subtraction": rs, "r_partial": rp})
    loo = pd.DataFrame(rows)
    loo["change_subtraction"] = loo.r_subtraction - sub["r"]
    loo["change_partial"] = loo.r_partial - part["r"]
    summary = {
        "predictor": predictor,
        "control": control,
        "outcome": outcome,
        "n": len(t),
        "subtraction": sub,
        "partial": part,
        "predictor_slope": float(fit.params[1]),
        "control_slope": float(fit.params[2]),
        "control_slope_ci": [float(v) for v in fit.conf_int()[2]],
        "slope_sum": float(np.asarray(contrast.effect).ravel()[0]),
        "slope_sum_ci": [float(v) for v in np.asarray(contrast.conf_int()).ravel()],
        "semipartial_r": semipartial,
        "r_predictor_control": float(np.corrcoef(x, z)[0, 1]),
        "loo_subtraction": [float(loo.r_subtraction.min()), float(loo.r_subtraction.max())],
        "loo_partial": [float(loo.r_partial.min()), float(loo.r_partial.max())],
        "most_influential_subtraction": str(loo.loc[loo.change_subtraction.abs().idxmax(), label]),
        "most_influential_partial": str(loo.loc[loo.change_partial.abs().idxmax(), label]),
    }
    return summary, loo
