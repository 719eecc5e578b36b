"""The study's measures mean what they say: kappa, chance levels, the budget design, the null
calibration of every statistic, and the back-mapping baseline."""

import numpy as np
import pandas as pd
import pytest
from scipy import stats as sps
from sklearn.metrics import cohen_kappa_score

from lab.study.backmap import backmap_summary, backmap_table
from lab.study.design import finetune_budget, per_answer
from lab.study.null import NullDesign, _label_kappa, calibration_table, recall_null_table, simulate_outcomes
from lab.study.stats import pearson, permutation_p
from probes.chance import chance_levels, kappa


def test_kappa_equals_sklearn_and_is_zero_for_every_blind_guess():
    rng = np.random.default_rng(0)
    true = rng.choice(list("abcd"), size=400, p=[0.55, 0.25, 0.15, 0.05])
    pred = np.where(rng.random(400) < 0.6, true, rng.choice(list("abcd"), size=400))
    assert kappa(list(true), list(pred)) == pytest.approx(cohen_kappa_score(true, pred))
    assert kappa(list(true), ["a"] * 400) == pytest.approx(0.0)  # the majority answer scores 0, not 0.55 - 0.25
    uniform = [np.mean([kappa(list(true), list(rng.choice(list("abcd"), 400))) for _ in range(200)])]
    prior = [np.mean([kappa(list(true), list(rng.permutation(true))) for _ in range(200)])]
    assert abs(uniform[0]) < 0.01 and abs(prior[0]) < 0.01
    assert kappa(list(true), list(true)) == 1.0 and np.isnan(kappa(["a", "a"], ["a", "a"]))


def test_chance_levels_of_an_imbalanced_relation():
    levels = chance_levels(["x"] * 6 + ["y"] * 3 + ["z"])
    assert levels == pytest.approx({"uniform": 1 / 3, "prior": 0.36 + 0.09 + 0.01, "majority": 0.6})
    with pytest.raises(ValueError, match="at least one"):
        chance_levels([])


def test_the_budget_design_decouples_finetuning_subjects_from_answers():
    rng = np.random.default_rng(1)
    n_answers = rng.integers(2, 31, size=200)
    n_ft = [per_answer(finetune_budget(f"relation{i}", 40, 120, seed=0), n) * n for i, n in enumerate(n_answers)]
    r = sps.pearsonr(n_ft, n_answers).statistic
    assert abs(r) < 0.5  # a fixed number per answer would make it exactly 1
    assert (
        finetune_budget("city", 40, 120, 0)
        == finetune_budget("city", 40, 120, 0)
        != finetune_budget("city", 40, 120, 1)
    )


@pytest.mark.slow
def test_our_permutation_p_matches_scipy():
    rng = np.random.default_rng(2)
    x = rng.normal(size=15)
    y = 0.4 * x + rng.normal(size=15)
    ref = sps.permutation_test(
        (x, y), lambda a, b: sps.pearsonr(a, b).statistic, permutation_type="pairings", n_resamples=9999, random_state=0
    ).pvalue
    assert permutation_p(x, y, 9999, np.random.default_rng(3)) == pytest.approx(ref, abs=0.02)


def test_a_failed_bca_interval_is_reported():
    x = np.array([0.0, 0.0, 0.0, 1.0, 1.0])
    y = np.array([0.1, 0.3, 0.2, 0.9, 1.0])
    res = pearson(x, y, n_boot=200, n_perm=99)
    assert res["ci_method"].startswith("percentile (BCa failed")
    assert np.isfinite(res["ci_low"]) and res["ci_low"] <= res["r"] <= res["ci_high"]
    z = np.random.default_rng(0).normal(size=30)
    assert pearson(z, z + np.random.default_rng(1).normal(size=30), n_boot=200, n_perm=99)["ci_method"] == "BCa"


def _null_design(n_rel=16, seed=0) -> NullDesign:
    """Relations like the world's: 2 to 30 answers, imbalanced, readability higher with fewer answers."""
    rng = np.random.default_rng(seed)
    truth, shares, read, read_k, rows = [], [], [], [], []
    for _j in range(n_rel):
        n = int(rng.integers(2, 31))
        p = rng.dirichlet(np.full(n, 3.0))
        t = rng.choice(n, size=int(rng.integers(150, 900)), p=p)
        truth.append(t)
        shares.append(np.full(n, 1 / n))  # the fine-tuned model's labels, blind to the subject
        k = float(np.clip(rng.normal(0.4, 0.25), 0, 1))
        chance = float((np.bincount(t, minlength=n) / len(t)) @ (np.bincount(t, minlength=n) / len(t)))
        read_k.append(k)
        read.append(chance + (1 - chance) * k * 0.5 + 0.5 / n)  # raw readability carries chance, like a probe's
        rows.append({"n_answers": n, "n_finetune_subjects": int(rng.integers(40, 121)), "chance": chance})
    return NullDesign(
        [f"r{j}" for j in range(n_rel)], truth, shares, np.array(read), np.array(read_k), pd.DataFrame(rows)
    )


def test_null_simulation_outcomes_have_no_generalization():
    d = _null_design()
    raw, kap = simulate_outcomes(d, 300, seed=0)
    assert raw.shape == kap.shape == (300, 16)
    # the blind fine-tune's raw accuracy is its chance level, 1/n for a uniform labeller; kappa is 0
    expected = np.array([1 / len(q) for q in d.label_shares])
    assert np.abs(raw.mean(0) - expected).max() < 0.02 and np.abs(kap.mean(0)).max() < 0.02


def test_kappa_statistics_hold_the_nominal_rate_and_raw_r_does_not():
    table = calibration_table(_null_design(), n_sim=500, seed=0, n_perm=499)
    kap = table[table.outcome == "generalization_kappa"].set_index("analysis")
    raw = table[table.outcome == "generalization"].set_index("analysis")
    assert kap.loc["pearson", "false_positive_rate"] <= 0.06  # the headline statistic is calibrated
    assert (kap.false_positive_rate <= 0.08).all()  # every kappa statistic, within Monte-Carlo error
    assert raw.loc["pearson", "false_positive_rate"] > 0.3  # chance levels alone make raw accuracies correlate
    assert set(kap.index) >= {"pearson", "spearman", "partial:n_answers", "partial:chance", "partial:all"}
    # the Monte-Carlo test against the design's own null is exact, whatever the noise
    assert table.false_positive_rate_monte_carlo.between(0.03, 0.07).all()


def test_the_recall_contrast_is_calibrated_on_the_null_and_williams_is_left_to_the_bootstrap():
    from dataclasses import replace

    d = _null_design(n_rel=20, seed=2)
    rng = np.random.default_rng(5)
    recall = np.clip(0.5 + 0.3 * rng.normal(size=len(d.relations)), 0, 1)
    d = replace(d, covariates=d.covariates.assign(pretrained_accuracy=recall))
    table = calibration_table(d, n_sim=400, seed=0, n_perm=199)
    rec = table[table.predictor == "pretrained_accuracy"].set_index("analysis")
    assert "partial:readability_best_kappa" in rec.index  # recall with readability held fixed
    assert "partial:pretrained_accuracy" not in rec.index  # never controlled for itself
    assert rec.false_positive_rate_monte_carlo.between(0.02, 0.08).all()
    # a null of no generalization makes both of Williams' correlations zero; its comparison of two
    # equal nonzero correlations is not calibrated here (the statistics table bootstraps it)
    assert not table.analysis.str.startswith("williams").any()


def _confounded_design(recall_effect: float, reliability: float, seed: int = 3) -> NullDesign:
    """A study whose generalization follows the *true* readability (plus ``recall_effect`` x recall),
    with recall correlated to that truth and readability measured at ``reliability``."""
    from dataclasses import replace

    d = _null_design(n_rel=24, seed=seed)
    rng = np.random.default_rng(seed + 10)
    recall = rng.uniform(0.4, 1.0, 24)
    true = np.clip(0.9 - 0.8 * recall + rng.normal(0, 0.1, 24), 0, 1)  # recall and readability anti-correlated
    measured = true + rng.normal(0, np.sqrt((1 / reliability - 1) * true.var()), 24)
    k = 0.05 + 0.4 * true + recall_effect * (recall - recall.mean())
    observed = _label_kappa(d, k[None, :], rng)[0]
    return replace(
        d,
        readability_kappa=measured,
        covariates=d.covariates.assign(pretrained_accuracy=recall),
        observed_kappa=observed,
    )


def test_the_recall_contrast_has_a_fitted_outcome_null():
    """With readability measured exactly, the t-test of recall's partial r holds its level and the
    null is centred at 0; with error, residual confounding shifts the null (here recall and
    readability correlate negatively, so towards negative r) and the t-test rejects too often;
    a real recall effect is found against the fitted null."""
    table = recall_null_table(_confounded_design(0.0, 1.0), reliabilities=(1.0, 0.7, 0.5), n_sim=400, seed=0)
    # recall explains 65% of readability's variance here, so a reliability of 0.5 is impossible: left out
    assert list(table.reliability) == [1.0, 0.7] and (table.min_reliability > 0.5).all()
    exact, noisy = table.iloc[0], table.iloc[1]
    assert abs(exact.mean_r) < 0.05 and exact.false_positive_rate <= 0.09
    assert noisy.mean_r < -0.15 and noisy.false_positive_rate > 0.15
    assert set(table.columns) >= {"reliability", "observed_r", "p_monte_carlo", "false_positive_rate", "slope"}
    effect = recall_null_table(_confounded_design(0.5, 1.0), reliabilities=(1.0,), n_sim=400, seed=0)
    assert effect.observed_r.iloc[0] > 0.4 and effect.p_monte_carlo.iloc[0] < 0.05
    # no recall that varies (an encoder), or no observed outcome: no rows
    d = _confounded_design(0.0, 1.0)
    assert recall_null_table(replace_observed(d), n_sim=10).empty


def replace_observed(d: NullDesign) -> NullDesign:
    from dataclasses import replace

    return replace(d, observed_kappa=None)


def test_monte_carlo_p_of_an_observed_statistic():
    from interp.resampling import monte_carlo_p

    sims = np.linspace(-1, 1, 199)
    assert monte_carlo_p(sims, 0.0) == pytest.approx(200 / 200)
    assert monte_carlo_p(sims, 0.999) == pytest.approx(3 / 200)  # -1, 1 and itself
    assert np.isnan(monte_carlo_p(sims, float("nan")))
    # one-sided: only draws on the observed side count; undefined draws count neither way
    assert monte_carlo_p(sims, 0.999, "greater") == pytest.approx(2 / 200)  # 1 and itself
    assert monte_carlo_p(sims, -0.999, "less") == pytest.approx(2 / 200)
    assert monte_carlo_p(np.r_[sims, np.nan, np.inf], 0.999) == monte_carlo_p(sims, 0.999)
    # a draw equal to the observed value up to summation-order noise is a hit; tolerance 0 is exact
    assert monte_carlo_p(np.array([0.5]), 0.5 + 1e-14, "greater") == 1.0
    assert monte_carlo_p(np.array([0.5]), 0.5 + 1e-14, "greater", tolerance=0.0) == 0.5
    with pytest.raises(ValueError, match="alternative"):
        monte_carlo_p(sims, 0.0, "both")
    assert np.isnan(monte_carlo_p(np.array([np.nan, np.inf]), 0.5))  # no defined draw: no p


def test_the_correlation_permutation_test_is_a_naive_loop():
    from interp.resampling import correlation_permutation_p, permutations

    rng = np.random.default_rng(0)
    x, y = rng.normal(size=12), rng.normal(size=12)
    perms = permutations(np.random.default_rng(1), 12, 500)
    assert sorted(perms[7]) == list(range(12))
    r = np.corrcoef(x, y)[0, 1]
    hits = sum(abs(np.corrcoef(x[p], y)[0, 1]) >= abs(r) - 1e-12 for p in perms)
    assert correlation_permutation_p(x, y, perms) == pytest.approx((1 + hits) / 501)


def test_backmap_against_a_uniformly_random_wrong_answer():
    """Wrong labels that map back to a uniformly random wrong answer give observed/expected ~1 for
    both lists, however often the lists contain the true answer."""
    rng = np.random.default_rng(0)
    n, k, rows = 10, 3, []
    answers = [f"a{i}" for i in range(n)]
    for rel in ("r1", "r2", "r3"):
        for _ in range(2000):
            true = rng.choice(answers)
            wrong = [a for a in answers if a != true]
            back = rng.choice(wrong)
            probe_wrong = list(rng.choice(wrong, k, replace=False))
            model_wrong = list(rng.choice(wrong, k, replace=False))
            rows.append(
                {
                    "method": "full",
                    "relation": rel,
                    "in_probe_topk": back in probe_wrong,
                    "in_model_topk": back in model_wrong,
                    "probe_slots": k,
                    "model_slots": k,
                }
            )
    rows[0]["in_probe_topk"], rows[0]["probe_slots"] = None, None  # a subject the probe did not rank is not a miss
    table = backmap_table(pd.DataFrame(rows), {"r1": n, "r2": n, "r3": n}, k)
    assert np.allclose(table.probe_expected_rate, 3 / 9) and np.allclose(table.model_expected_rate, 3 / 9)
    assert table.probe_n.tolist() == [1999, 2000, 2000] and table.n_errors.tolist() == [2000] * 3
    assert table.probe_ratio.between(0.9, 1.1).all() and table.model_ratio.between(0.9, 1.1).all()
    s = backmap_summary(table, "full")
    assert s["n_relations"] == 3 and s["probe_ratio"] == pytest.approx(1, abs=0.05)
    assert (table.probe_p_value > 0.001).all()
    empty = backmap_table(pd.DataFrame(columns=["method", "relation", "in_probe_topk", "in_model_topk"]), {}, k)
    assert list(empty.columns) and backmap_summary(empty, "full")["n_errors"] == 0


def test_shuffled_backmap_null_keeps_popularity():
    """Errors that always map back to the most popular answer, which both lists always rank first:
    4x a uniformly random wrong answer, but exactly what the shuffled null expects."""
    from lab.study.study import shuffled_backmap_rates

    lists = [("probe", f"t{i % 5}", "pop", ["pop", "x", "y"]) for i in range(200)]
    assert shuffled_backmap_rates(lists)["probe_shuffled_rate"] == pytest.approx(1.0)
