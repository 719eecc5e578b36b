"""Probe quality beyond accuracy: balanced accuracy and AUROC against scikit-learn, and the
online codelength (MDL) against a naive loop of scikit-learn probes."""

import numpy as np
import pytest
import torch
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import balanced_accuracy_score, roc_auc_score
from sklearn.model_selection import StratifiedKFold
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

from interp.relations import Relation
from probes import ProbeSweep
from probes.mdl import block_ends, online_codelength
from probes.sweep import _class_balanced


def planted(n, classes, noise, seed=0, d=12):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, classes, n)
    X = rng.normal(size=(n, d)) * noise + np.eye(classes, d)[y] * 2
    return X, y


def _relation(y, name="r"):
    return Relation(name, [f"s{i}" for i in range(len(y))], [f"a{v}" for v in y], "{} is")


@pytest.mark.parametrize("classes", [2, 4])
def test_balanced_accuracy_and_auroc_match_sklearn(classes):
    X, y = planted(300, classes, 1.5)
    y[:200] = 0  # lopsided classes: balanced accuracy differs from accuracy
    df = ProbeSweep(folds=3, control=False, dtype=torch.float64, tol=1e-9).run(
        {"r": {"blocks.0.hook_resid_post": torch.tensor(X)}}, [_relation(y)]
    )
    for fold, (tr, te) in enumerate(StratifiedKFold(3, shuffle=True, random_state=0).split(X, y)):
        ref = make_pipeline(StandardScaler(), LogisticRegression(max_iter=10_000, tol=1e-10)).fit(X[tr], y[tr])
        p = ref.predict_proba(X[te])
        auroc = roc_auc_score(y[te], p[:, 1]) if classes == 2 else roc_auc_score(y[te], p, multi_class="ovr")
        row = df[df.fold == fold].iloc[0]
        assert abs(row.balanced_accuracy - balanced_accuracy_score(y[te], p.argmax(1))) < 0.01
        assert abs(row.auroc - auroc) < 2e-3
    assert (df.balanced_accuracy < df.accuracy).all()


@pytest.mark.parametrize("c", [2, 3, 7])
def test_fold_metrics_equal_sklearn_on_the_same_probabilities(c):
    """The vectorized balanced accuracy and AUROC equal scikit-learn's functions on identical
    inputs (1e-12): lopsided classes, tied scores, and a class missing from the fold (NaN where
    scikit-learn refuses)."""
    rng = np.random.default_rng(c)
    for trial in range(40):
        n = int(rng.integers(c + 2, 60))
        y = rng.choice(c, n, p=rng.dirichlet(np.ones(c)))
        y[:c] = np.arange(c)  # every class present ...
        if trial % 5 == 4:
            y[y == c - 1] = 0  # ... but in some folds one is missing
        probs = rng.dirichlet(np.ones(c), n)
        if trial % 3 == 0:
            probs = np.round(probs, 1) + 1e-3  # ties
        got = _class_balanced(y, probs, c)
        assert got["balanced_accuracy"] == pytest.approx(balanced_accuracy_score(y, probs.argmax(1)), abs=1e-12)
        try:
            ref = (
                roc_auc_score(y, probs[:, 1])
                if c == 2
                else roc_auc_score(y, probs / probs.sum(-1, keepdims=True), multi_class="ovr", labels=list(range(c)))
            )
        except ValueError:
            ref = float("nan")
        if np.isnan(ref):
            assert np.isnan(got["auroc"]), trial
        else:
            assert got["auroc"] == pytest.approx(ref, abs=1e-12), trial


def _naive_codelength(X, y, seed, fractions):
    """Voita & Titov's online code, one scikit-learn probe per block."""
    classes, idx = np.unique(y, return_inverse=True)
    order = np.random.default_rng(seed).permutation(len(y))
    X, idx = X[order], idx[order]
    ends = block_ends(len(y), fractions)
    bits = ends[0] * np.log2(len(classes))
    for a, b in zip(ends[:-1], ends[1:]):
        probe = make_pipeline(StandardScaler(), LogisticRegression(max_iter=10_000, tol=1e-10)).fit(X[:a], idx[:a])
        p = np.full((b - a, len(classes)), 0.0)
        p[:, probe.classes_] = probe.predict_proba(X[a:b])
        bits += -np.log2(p[np.arange(b - a), idx[a:b]]).sum()
    return bits


def test_online_codelength_matches_a_naive_loop_and_separates_real_from_random_labels():
    X, y = planted(400, 3, 1.0)
    fractions = (
        0.05,
        0.1,
        0.2,
        0.4,
        0.8,
        1.0,
    )  # a first block with every class (scikit-learn cannot score unseen ones)
    first = block_ends(len(y), fractions)[0]
    seed = next(s for s in range(100) if len(set(y[np.random.default_rng(s).permutation(len(y))[:first]])) == 3)
    got = online_codelength(X, y, fractions, seed=seed, tol=1e-9)
    ref = _naive_codelength(X, y, seed, fractions)
    assert abs(got["mdl_bits"] - ref) / ref < 0.01
    assert got["uniform_bits"] == pytest.approx(400 * np.log2(3))
    shuffled = online_codelength(X, np.random.default_rng(1).permutation(y))
    assert got["compression"] > 1.5 > 1.05 > shuffled["compression"]


def test_sweep_reports_codelength_when_asked():
    X, y = planted(200, 3, 1.0)
    feats = {"r": {"blocks.0.hook_resid_post": torch.tensor(X, dtype=torch.float32)}}
    df = ProbeSweep(folds=5, mdl=True).run(feats, [_relation(y)])
    assert df.compression.nunique() == 1 and df.compression.iloc[0] > 1
    assert "compression" not in ProbeSweep(folds=5).run(feats, [_relation(y)])


def test_williams_test_is_calibrated_and_has_power():
    """Two predictors equally correlated with the outcome (and with each other): 5% false positives."""
    from lab.study.stats import williams_t

    rng = np.random.default_rng(0)

    def rate(c_yx, c_yz, n=24, sims=1500):
        cov = np.array([[1, c_yx, c_yz], [c_yx, 1, 0.7], [c_yz, 0.7, 1]])
        chol = np.linalg.cholesky(cov)
        hits = 0
        for _ in range(sims):
            r = np.corrcoef((rng.standard_normal((n, 3)) @ chol.T).T)
            hits += williams_t(r[0, 1], r[0, 2], r[1, 2], n)["p_value"] < 0.05
        return hits / sims

    assert 0.035 < rate(0.6, 0.6) < 0.065
    assert rate(0.85, 0.45) > 0.8


def test_compare_predictors_on_a_finished_study(finished_study, tmp_path):
    """Every predictor next to readability, with the paired difference of correlations."""
    import shutil

    import interp
    from lab.study.predictors import READABILITY, compare_predictors
    from lab.world import from_world, load_world

    out = tmp_path / "study"
    shutil.copytree(finished_study[0], out)  # the session's study stays as other tests expect it
    model = interp.load_model("world")
    table = compare_predictors(out, model, from_world(load_world()), n_boot=200, n_perm=200)
    assert (out / "predictors.csv").exists() and (out / "predictor_correlations.csv").exists()
    full = table[table.outcome == "generalization_kappa_full"].set_index("predictor")
    assert {"readability_best", "compression_best", "selectivity_best", "auroc_best", "balanced_accuracy_best"} <= set(
        full.index
    )
    for p, row in full.drop(index=READABILITY).iterrows():
        if np.isnan(row.pearson_r):  # a predictor constant over the 4 relations (LRE causality) has no r
            continue
        assert row.r_minus_readability == pytest.approx(row.pearson_r - full.loc[READABILITY, "pearson_r"], abs=1e-9), p
        if not np.isnan(row.diff_ci_low):
            assert row.diff_ci_low <= row.diff_ci_high
    cached = compare_predictors(out, n_boot=200, n_perm=200)  # second call: from predictors.csv, no model
    np.testing.assert_allclose(cached.pearson_r.to_numpy(), table.pearson_r.to_numpy(), rtol=1e-9)


def test_compare_predictors_says_what_it_needs_before_any_work(tmp_path):
    """No cached predictors and no model: a clear error naming the missing file and the fix."""
    import pandas as pd

    from lab.study.predictors import compare_predictors

    pd.DataFrame({"relation": ["a", "b"], "readability_kappa": [0.1, 0.2]}).to_csv(tmp_path / "relations.csv")
    with pytest.raises(ValueError, match=r"predictors\.csv does not exist yet: pass the study's model and relations"):
        compare_predictors(tmp_path)
