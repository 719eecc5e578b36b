"""Null calibration: would the study find its correlation in a model that does not generalize?

The hypothesis "readability predicts generalization" is tested by a correlation across
relations. A statistic is only evidence if studies *without* any generalization beyond chance
reject at the nominal rate. This module simulates such studies with this study's own design:

- each relation keeps its measured readability (raw and kappa), its covariates, its held-out
  subjects with their true labels, and the fine-tuned model's own label preferences (the share
  ``q_a`` of held-out subjects given each label in the main run);
- each simulated fine-tune labels every held-out subject by a draw from ``q``, *independent of
  the subject* (no generalization beyond chance: the noise is the binomial/multinomial noise of
  the real test-set sizes);
- every statistic the study reports is recomputed: Pearson r (permutation p, and the t-test p),
  Spearman, and the partial correlations with each covariate and with all jointly, on raw
  accuracies and on kappa.

The false-positive rate at ``alpha`` of each statistic, with its Monte-Carlo standard error, is
the calibration table. Raw accuracies carry the chance level (fewer or more lopsided answers give
a higher accuracy to a blind guess, and readability rises with them too), so the raw r rejects
far more often than ``alpha``; kappa is 0 in expectation for every blind guess, so its r holds
the nominal rate (tested on small settings in ``tests/test_study.py``).

**The recall contrast needs a second null.** "Recall predicts generalization with readability held
fixed" is tested against the null above, in which nothing generalizes, so a partial correlation
that any generalizing model would show is counted as evidence. If generalization follows the
*true* readability and the probe measures it with error, recall (correlated with the true value)
keeps a partial correlation through the error: residual confounding. :func:`recall_null_table`
simulates that null (a *fitted outcome*): true readability ``t = c0 + c1 recall + u`` (fitted on
the study's relations), measured as ``t + e`` with reliability ``lambda`` (the share of the
measured readability's variance that is true), generalization kappa ``a + b t + v`` (``b``
disattenuated, ``v`` the between-relation variance the fit leaves beyond sampling noise), each
held-out subject then labelled right with that probability and otherwise by a draw from the
fine-tuned model's label shares. Recall has no effect of its own; the table gives, per
``lambda``, how often the t-test of the partial r rejects, and the observed partial r's
Monte-Carlo p under that null.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd
from scipy import stats

from interp.resampling import correlation_permutation_p, monte_carlo_p, permutations

from .stats import COVARIATES

#: predictor columns of a study's relation table tested beside the headline, when present
OTHER_PREDICTORS = ("readability_above_baseline", "readability_above_surface")
#: recall (the pretrained model's accuracy), tested as a predictor with readability held fixed: the
#: paper's contrast the other way round
RECALL = "pretrained_accuracy"


@dataclass
class NullDesign:
    """What a simulated study keeps from the real one, per relation (in the same order)."""

    relations: list[str]
    truth: list[np.ndarray]  # per relation: held-out label codes [n_heldout]
    label_shares: list[np.ndarray]  # per relation: the fine-tuned model's label shares q [n_labels]
    readability: np.ndarray  # raw best-layer readability [R]
    readability_kappa: np.ndarray  # kappa best-layer readability [R]
    covariates: pd.DataFrame  # [R, covariates]
    observed: np.ndarray | None = None  # the study's raw generalization [R]
    observed_kappa: np.ndarray | None = None  # the study's generalization kappa [R]
    #: further kappa predictors tested against the same simulated outcomes, by column name [R]
    #: (readability above its baselines: lab.study.baselines)
    other_predictors: dict[str, np.ndarray] = field(default_factory=dict)


def null_design(
    relations: pd.DataFrame, predictions: pd.DataFrame, method: str, category: str, label_seed: int, finetune_seed: int
) -> NullDesign:
    """The null design of a finished study from its saved ``relations`` and ``predictions`` tables."""
    main = predictions[
        (predictions.method == method)
        & (predictions.category == category)
        & (predictions.label_seed == label_seed)
        & (predictions.finetune_seed == finetune_seed)
    ]
    truth, shares = [], []
    for name in relations.relation:
        g = main[main.relation == name]
        labels = sorted(set(g.label) | set(g.predicted_label))
        code = {lab: i for i, lab in enumerate(labels)}
        truth.append(g.label.map(code).to_numpy())
        shares.append(np.bincount(g.predicted_label.map(code).to_numpy(), minlength=len(labels)) / len(g))
    cov = relations[[c for c in COVARIATES if c in relations]].reset_index(drop=True)
    obs = relations.get(f"generalization_{method}")
    obs_k = relations.get(f"generalization_kappa_{method}")
    return NullDesign(
        list(relations.relation),
        truth,
        shares,
        relations.readability_best.to_numpy(float),
        relations.readability_best_kappa.to_numpy(float),
        cov,
        None if obs is None else obs.to_numpy(float),
        None if obs_k is None else obs_k.to_numpy(float),
        {c: relations[c].to_numpy(float) for c in OTHER_PREDICTORS if c in relations},
    )


def simulate_outcomes(design: NullDesign, n_sim: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Raw accuracy and kappa of ``n_sim`` blind fine-tunes per relation: two ``[n_sim, R]`` arrays."""
    rng = np.random.default_rng(seed)
    raw = np.empty((n_sim, len(design.relations)))
    kap = np.empty_like(raw)
    for j, (truth, q) in enumerate(zip(design.truth, design.label_shares)):
        n, L = len(truth), len(q)
        raw[:, j], kap[:, j] = _scores(rng.choice(L, size=(n_sim, n), p=q), truth, L)
    return raw, kap


def _scores(pred: np.ndarray, truth: np.ndarray, L: int) -> tuple[np.ndarray, np.ndarray]:
    """Accuracy and Cohen's kappa of each row of labels ``pred`` [S, n] against ``truth`` [n]
    (``L`` labels): two ``[S]`` arrays, kappa NaN where the chance agreement is 1."""
    n = len(truth)
    acc = (pred == truth[None, :]).mean(1)
    p_true = np.bincount(truth, minlength=L) / n
    p_e = (np.stack([np.bincount(row, minlength=L) for row in pred]) / n) @ p_true
    with np.errstate(invalid="ignore", divide="ignore"):
        return acc, np.where(p_e < 1 - 1e-12, (acc - p_e) / (1 - p_e), np.nan)


def _corr_rows(x: np.ndarray, Y: np.ndarray) -> np.ndarray:
    """Pearson r of a fixed ``x`` [R] with every row of ``Y`` [S, R]."""
    xs = (x - x.mean()) / x.std()
    Yc = Y - Y.mean(1, keepdims=True)
    sd = Yc.std(1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return (Yc @ xs) / len(x) / sd


def _t_p(r: np.ndarray, df: int) -> np.ndarray:
    if df < 1:  # too few relations for this partial correlation (fine-tunes failed): undefined
        return np.full(np.shape(r), np.nan)
    t = r * np.sqrt(df / np.maximum(1e-300, 1 - r * r))
    return 2 * stats.t.sf(np.abs(t), df)


def _residualize(v: np.ndarray, Z: np.ndarray) -> tuple[np.ndarray, int]:
    """Residuals of ``v`` ([R] or [S, R]) on the columns of ``Z`` (with a constant); the rank used."""
    Zc = np.column_stack([np.ones(len(Z)), Z])
    H = Zc @ np.linalg.pinv(Zc)
    k = int(np.linalg.matrix_rank(Zc)) - 1
    return v - v @ H.T, k


def null_statistics(
    x: np.ndarray,
    Y: np.ndarray,
    covariates: pd.DataFrame,
    n_perm: int = 999,
    seed: int = 0,
) -> dict[str, np.ndarray]:
    """p-values (and r) of every statistic the study reports, for each simulated outcome row.
    (Williams' comparison of two predictors is not among them: this null makes both correlations
    zero, while the comparison's null is two equal, possibly nonzero ones; the statistics table
    gives it a paired bootstrap interval over relations instead.)"""
    rng = np.random.default_rng(seed)
    S, R = Y.shape
    out: dict[str, np.ndarray] = {}
    r = _corr_rows(x, Y)
    out["pearson"] = r
    # permutation p, fresh permutations for every simulated study
    p_perm = np.array([correlation_permutation_p(x, Y[s], permutations(rng, R, n_perm), r[s]) for s in range(S)])
    out["p:pearson"] = np.where(np.isfinite(r), p_perm, np.nan)
    out["p:pearson (t-test)"] = _t_p(r, R - 2)
    rho = _corr_rows(stats.rankdata(x), stats.rankdata(Y, axis=1))
    out["spearman"], out["p:spearman"] = rho, _t_p(rho, R - 2)
    usable = [c for c in covariates if covariates[c].nunique() > 1]
    sets = [[c] for c in usable] + ([usable] if len(usable) > 1 and R - 2 - len(usable) >= 1 else [])
    for cols in sets:
        name = f"partial:{cols[0]}" if len(cols) == 1 else "partial:all"
        Z = covariates[cols].to_numpy(float)
        rx, k = _residualize(x, Z)
        ry, _ = _residualize(Y, Z)
        pr = _corr_rows(rx, ry)
        out[name], out[f"p:{name}"] = pr, _t_p(pr, R - 2 - k)
    return out


def _leave_one_out_p(simulated: np.ndarray) -> np.ndarray:
    """Each simulated study's Monte-Carlo p against all the others (NaN statistics: p = 1)."""
    a = np.where(np.isfinite(simulated), np.abs(simulated), -np.inf)
    srt = np.sort(a)
    count_ge = len(a) - np.searchsorted(srt, a - 1e-12, side="left")  # includes itself
    return np.where(np.isfinite(a), count_ge / len(a), 1.0)


def calibration_table(
    design: NullDesign, n_sim: int = 2000, alpha: float = 0.05, seed: int = 0, n_perm: int = 999
) -> pd.DataFrame:
    """False-positive rate at ``alpha`` of every statistic, raw and kappa, over ``n_sim`` null studies.

    Two tests per statistic: the conventional one the statistics table reports (permutation p for
    Pearson, t-distribution p for Spearman and the partials) and the **Monte-Carlo test** against
    this design's own null (the observed statistic ranked among the simulated ones). The
    conventional tests assume that, with no effect, the outcome is exchangeable across relations;
    here the sampling noise of generalization differs between relations (fewer answers and more
    imbalance, more noise) and those relations are not placed at random along readability, so a
    conventional test can reject too often. The Monte-Carlo test is exact under the simulated null
    whatever the noise (its false-positive rate is measured by testing each simulated study against
    the others), so the study headlines its p-value.

    Columns: ``outcome``, ``predictor``, ``analysis``, ``false_positive_rate`` (conventional test;
    an undefined statistic counts as no rejection), ``false_positive_rate_monte_carlo``, ``mc_se``
    (binomial standard error of the former), ``mean_r``, ``sd_r`` (the statistic's null
    distribution), ``observed_r`` and ``p_monte_carlo`` (the study's own statistic and its
    Monte-Carlo p, when the design carries the observed outcomes), ``n_sim``, ``n_undefined``,
    ``alpha``.
    """
    raw, kap = simulate_outcomes(design, n_sim, seed)
    rows = []
    tests = [
        ("generalization_kappa", "readability_best_kappa", design.readability_kappa, kap, design.observed_kappa),
        ("generalization", "readability_best", design.readability, raw, design.observed),
    ]
    for predictor, x in design.other_predictors.items():  # the same simulated outcomes, another predictor
        tests.append(("generalization_kappa", predictor, x, kap, design.observed_kappa))
    covariates = {predictor: design.covariates for _, predictor, *_ in tests}
    if RECALL in design.covariates and design.covariates[RECALL].nunique() > 1:  # recall, readability held fixed
        recall = design.covariates[RECALL].to_numpy(float)
        tests.append(("generalization_kappa", RECALL, recall, kap, design.observed_kappa))
        covariates[RECALL] = design.covariates.drop(columns=[RECALL]).assign(
            readability_best_kappa=design.readability_kappa
        )
    for outcome, predictor, x, Y, obs in tests:
        cov = covariates[predictor]
        res = null_statistics(x, Y, cov, n_perm=n_perm, seed=seed + 1)
        res_obs = null_statistics(x, obs[None, :], cov, n_perm=9, seed=seed) if obs is not None else {}
        for name in [k for k in res if not k.startswith("p:")] + ["pearson (t-test)"]:
            p = res[f"p:{name}"]
            r = res[name if name in res else "pearson"]
            r_obs = float(res_obs[name if name in res else "pearson"][0]) if res_obs else float("nan")
            fpr = float(np.mean(np.nan_to_num(p, nan=1.0) < alpha))
            rows.append(
                {
                    "outcome": outcome,
                    "predictor": predictor,
                    "analysis": name,
                    "false_positive_rate": fpr,
                    "false_positive_rate_monte_carlo": float(np.mean(_leave_one_out_p(r) < alpha)),
                    "mc_se": float(np.sqrt(fpr * (1 - fpr) / n_sim)),
                    "mean_r": float(np.nanmean(r)),
                    "sd_r": float(np.nanstd(r)),
                    "observed_r": r_obs,
                    "p_monte_carlo": monte_carlo_p(r, r_obs),
                    "n_sim": n_sim,
                    "n_undefined": int(np.isnan(p).sum()),
                    "alpha": alpha,
                }
            )
    return pd.DataFrame(rows)


def _method_designs(relations: pd.DataFrame, predictions: pd.DataFrame, config: dict, least: int):
    """``(method, NullDesign)`` for every fine-tuning method of a study with at least ``least``
    relations that have an outcome (a relation whose fine-tune failed has none)."""
    for m in config["methods"]:
        outcome = relations.get(f"generalization_kappa_{m}")
        rel = relations if outcome is None else relations[outcome.notna()]
        if len(rel) >= least:
            yield (
                m,
                null_design(
                    rel, predictions, m, config["category"], config["label_seeds"][0], config["finetune_seeds"][0]
                ),
            )


def null_tables(
    relations: pd.DataFrame, predictions: pd.DataFrame, config: dict, n_sim: int, seed: int
) -> pd.DataFrame:
    """The calibration table of every fine-tuning method of a study (a ``method`` column). Each
    method is simulated on the relations the statistics use for it: those with an outcome
    (``generalization_kappa_<method>``; a relation whose fine-tune failed has none,
    :mod:`lab.study.failures`), so that its Monte-Carlo p belongs to its r. A method with fewer
    than 3 such relations has no rows."""
    parts = [
        calibration_table(design, n_sim=n_sim, seed=seed, n_perm=config["n_perm"]).assign(method=m)
        for m, design in _method_designs(relations, predictions, config, least=3)
    ]
    if not parts:
        return pd.DataFrame(columns=["method", "outcome", "predictor", "analysis", "p_monte_carlo", "n_sim", "alpha"])
    t = pd.concat(parts, ignore_index=True)
    return t[["method"] + [c for c in t.columns if c != "method"]]


#: reliabilities of measured readability the recall contrast's fitted null is simulated at
RELIABILITIES = (1.0, 0.9, 0.8, 0.7, 0.6)


def _label_kappa(design: NullDesign, k: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Generalization kappa ``[S, R]`` of simulated fine-tunes in which each held-out subject of
    relation ``j`` gets its true label with probability ``k[s, j]`` (clipped to [0, 1]) and is
    otherwise labelled by a draw from the fine-tuned model's label shares."""
    S = k.shape[0]
    kap = np.empty_like(k)
    for j, (truth, q) in enumerate(zip(design.truth, design.label_shares)):
        n, L = len(truth), len(q)
        blind = rng.choice(L, size=(S, n), p=q)
        knows = rng.random((S, n)) < np.clip(k[:, j], 0, 1)[:, None]
        _, kap[:, j] = _scores(np.where(knows, truth[None, :], blind), truth, L)
    return kap


def recall_null_table(
    design: NullDesign,
    reliabilities: tuple[float, ...] = RELIABILITIES,
    n_sim: int = 2000,
    alpha: float = 0.05,
    seed: int = 0,
) -> pd.DataFrame:
    """The recall contrast (recall's partial r with generalization kappa, readability kappa held
    fixed) under the fitted-outcome null of the module docstring, one row per reliability.

    Columns: ``reliability``, ``observed_r`` (the study's partial r), ``mean_r`` and ``sd_r`` (its
    null distribution, shifted from 0 by the confounding: the sign of ``c1 b``), ``p_monte_carlo``
    (equal-tailed: twice the smaller share of simulated r beyond the observed),
    ``false_positive_rate`` (t-test at ``alpha``), ``slope`` (the fitted, disattenuated ``b``),
    ``min_reliability`` (the squared correlation of readability with recall: with recall measured
    without error, the truth's share of readability's variance is at least that, so lower
    reliabilities are left out), ``clipped_share`` (the share of simulated ``a + b t + v`` outside
    [0, 1], which the simulation clips: a subject cannot know its label with probability below 0,
    so the simulated kappa is then the blind one's, and the null is not exactly linear there),
    ``n_sim``, ``alpha``. Empty when the design has no recall that varies or no observed outcome.
    The error model is classical: the same variance for every relation, independent of recall.
    """
    cols = ["reliability", "observed_r", "mean_r", "sd_r", "p_monte_carlo", "false_positive_rate", "slope"]
    if RECALL not in design.covariates or design.covariates[RECALL].nunique() < 2 or design.observed_kappa is None:
        return pd.DataFrame(columns=[*cols, "n_sim", "alpha"])
    z = design.covariates[RECALL].to_numpy(float)
    x, y = design.readability_kappa, design.observed_kappa
    ok = np.isfinite(x) & np.isfinite(y) & np.isfinite(z)
    observed = _partial_r(z[ok], y[ok], x[ok])
    # outcome noise the sampling of held-out subjects already gives (blind fine-tunes' kappa variance)
    _, blind = simulate_outcomes(design, 400, seed)
    sampling = float(np.nanmean(np.nanvar(blind, axis=0)[ok]))
    c1, c0 = np.polyfit(z[ok], x[ok], 1)
    var_x, var_xz = float(np.var(x[ok])), float(np.var(x[ok] - (c0 + c1 * z[ok])))
    b_obs, a_obs = np.polyfit(x[ok], y[ok], 1)
    # recall is taken as measured without error, so the truth's share of readability's variance is at
    # least the share recall explains: a reliability below that is impossible, and is not simulated
    least = float(np.corrcoef(x[ok], z[ok])[0, 1] ** 2)
    rows = []
    for i, lam in enumerate(r for r in reliabilities if r >= least):
        rng = np.random.default_rng(seed + 1 + i)
        var_e = (1 - lam) * var_x
        var_u = max(var_xz - var_e, 0.0)
        b = b_obs / lam
        a = float(np.mean(y[ok]) - b * np.mean(x[ok]))
        resid = y[ok] - (a_obs + b_obs * x[ok])
        var_v = max(float(np.var(resid)) - sampling - b * b * var_e * lam, 0.0)  # var(t | x) = lam var_e
        t = c0 + c1 * z[None, :] + rng.normal(0, np.sqrt(var_u), (n_sim, len(z)))
        xs = t + rng.normal(0, np.sqrt(var_e), t.shape)
        k = a + b * t + rng.normal(0, np.sqrt(var_v), t.shape)
        clipped = float(np.mean((k < 0) | (k > 1)))  # a probability of knowing: clipped to [0, 1]
        ys = _label_kappa(design, k, rng)
        r = np.array([_partial_r(z[ok], ys[s, ok], xs[s, ok]) for s in range(n_sim)])
        p_t = _t_p(r, int(ok.sum()) - 3)
        rows.append(
            {
                "reliability": lam,
                "observed_r": observed,
                "mean_r": float(np.nanmean(r)),
                "sd_r": float(np.nanstd(r)),
                "p_monte_carlo": _equal_tailed_p(r, observed),
                "false_positive_rate": float(np.mean(np.nan_to_num(p_t, nan=1.0) < alpha)),
                "slope": float(b),
                "min_reliability": least,
                "clipped_share": clipped,
                "n_sim": n_sim,
                "alpha": alpha,
            }
        )
    return pd.DataFrame(rows)


def _equal_tailed_p(simulated: np.ndarray, observed: float) -> float:
    """Two-sided Monte-Carlo p of ``observed`` against a null that need not be centred at 0 (this
    one is not: residual confounding shifts it): twice the smaller tail, the observed value counted
    once in each."""
    r = simulated[np.isfinite(simulated)]
    if not np.isfinite(observed) or len(r) == 0:
        return float("nan")
    upper, lower = (1 + np.sum(r >= observed)) / (len(r) + 1), (1 + np.sum(r <= observed)) / (len(r) + 1)
    return float(min(1.0, 2 * min(upper, lower)))


def _partial_r(z: np.ndarray, y: np.ndarray, x: np.ndarray) -> float:
    """Partial correlation of ``z`` and ``y`` with ``x`` held fixed (NaN when undefined)."""
    ok = np.isfinite(y)
    if ok.sum() < 4:
        return float("nan")
    rz, _ = _residualize(z[ok], x[ok, None])
    ry, _ = _residualize(y[ok], x[ok, None])
    return float(_corr_rows(rz, ry[None, :])[0])


def recall_null_tables(
    relations: pd.DataFrame, predictions: pd.DataFrame, config: dict, n_sim: int, seed: int
) -> pd.DataFrame:
    """:func:`recall_null_table` for every fine-tuning method of a study (a ``method`` column), on
    the relations with an outcome, as :func:`null_tables` does."""
    parts = [
        recall_null_table(design, n_sim=n_sim, seed=seed).assign(method=m)
        for m, design in _method_designs(relations, predictions, config, least=4)
    ]
    if not parts or all(p.empty for p in parts):
        return pd.DataFrame(columns=["method", "reliability", "observed_r", "p_monte_carlo", "n_sim"])
    t = pd.concat([p for p in parts if not p.empty], ignore_index=True)
    return t[["method"] + [c for c in t.columns if c != "method"]]
