"""Probing on SAE features: dense ProbeSweeps at feature sites, and k-sparse probes whose features
are ranked on each training fold only (ProbeSweep's ``select``)."""

from __future__ import annotations

import importlib
from pathlib import Path

import numpy as np
import pytest
import torch
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import StratifiedKFold
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

import interp
from interp.relations import Relation
from interp.sae import load_sae
from interp.sae_sites import attach_sae, feature_site
from probes import ProbeSweep, SparseProbeSweep, mean_difference_ranking

SAE_DIR = Path(__file__).parent / "data" / "sae_lens" / "standard"


def planted(n=48, d=40, seed=0):
    """Three answers; features 0-11 carry the answer weakly, with noise, so that which of them rank
    first depends on the rows a ranking sees; the rest are noise."""
    rng = np.random.default_rng(seed)
    y = np.arange(n) % 3
    X = rng.normal(size=(n, d))
    X[:, :12] += 0.6 * (y[:, None] == (np.arange(12) % 3)[None, :])
    relation = Relation("planted", [f"s{i}" for i in range(n)], [f"a{v}" for v in y], "{} is")
    return relation, torch.tensor(X, dtype=torch.float32), y


def naive_rankings(X, y, folds, seed, labels=None):
    """Every fold's ranking, written as the textbook loop: split (stratified by the answers ``y``),
    then score the training rows (by ``labels``, default ``y``: the control task has its own)."""
    labels = y if labels is None else labels
    out = {}
    split = StratifiedKFold(n_splits=folds, shuffle=True, random_state=seed)
    for fold, (train, _test) in enumerate(split.split(np.zeros(len(y)), y)):
        Xt, yt = X.numpy().astype(np.float64)[train], labels[train]
        gaps = [np.abs(Xt[yt == c].mean(0) - Xt[yt != c].mean(0)) for c in np.unique(labels)]
        out[fold] = np.argsort(-np.max(gaps, axis=0), kind="stable")
    return out


def control_labels(y, seed):
    """The control task's answers for split ``seed``: ProbeSweep's seeded permutation of the answers
    (probes/sweep.py, ``_prepare``)."""
    return np.random.default_rng(10_000 + seed).permutation(y)


def test_each_folds_ranking_sees_its_training_rows_only():
    relation, X, y = planted()
    sweep = SparseProbeSweep(ks=(1, 2, 4), folds=4, seeds=(0, 1), C=0.5)
    table = sweep.run({"planted": {"f": X}}, [relation])
    assert len(table) == 3 * 4 * 2 and set(table["k"]) == {1, 2, 4} and (table["selection"] == "mean_difference").all()
    assert set(table["site"]) == {"f"} and set(sweep.readout_["k"]) == {1, 2, 4}
    on_all_data = mean_difference_ranking(X, y)
    differs = 0
    r = sweep.ranking_
    for seed in (0, 1):
        for fold, expected in naive_rankings(X, y, 4, seed).items():
            probe = r[(r["seed"] == seed) & (r["fold"] == fold)]
            ours = probe.query("labels == 'task'").sort_values("rank")["feature"].to_numpy()
            np.testing.assert_array_equal(ours, expected[:4])
            differs += not np.array_equal(ours, on_all_data[:4])
            # the control task's features are ranked by its own answers, on the same training rows
            control = probe.query("labels == 'control'").sort_values("rank")["feature"].to_numpy()
            np.testing.assert_array_equal(control, naive_rankings(X, y, 4, seed, control_labels(y, seed))[fold][:4])
    assert differs > 0  # ranking on all subjects would have chosen other features: that would leak


@pytest.mark.parametrize("seeds", [(1,), (0, 1)])
def test_a_k_sparse_row_is_the_probe_on_that_folds_features(seeds):
    """The row of (seed, fold, k) is scikit-learn's StandardScaler + LogisticRegression on the k
    features ranked on that training fold, scored on its test fold (whatever other seeds the sweep has)."""
    relation, X, y = planted()
    sweep = SparseProbeSweep(ks=(2,), folds=4, seeds=seeds, C=0.5, tol=1e-8)
    table = sweep.run({"planted": {"f": X}}, [relation])
    assert len(table) == 4 * len(seeds)
    for seed in seeds:
        split = StratifiedKFold(n_splits=4, shuffle=True, random_state=seed)
        for fold, (train, test) in enumerate(split.split(np.zeros(len(y)), y)):
            row = table.query("fold == @fold and seed == @seed").iloc[0]
            for labels, column in ((y, "accuracy"), (control_labels(y, seed), "control_accuracy")):
                top = naive_rankings(X, y, 4, seed, labels)[fold][:2]
                ref = make_pipeline(StandardScaler(), LogisticRegression(C=0.5, tol=1e-10, max_iter=10_000))
                ref.fit(X.numpy()[train][:, top], labels[train])
                assert row[column] == pytest.approx(ref.score(X.numpy()[test][:, top], labels[test]))


def test_each_k_fits_one_probe_per_fold(monkeypatch):
    relation, X, _ = planted()
    fitted = []
    module = importlib.import_module("probes.sweep")  # the module (probes.sweep is also a function's name)
    real = module.fit_logistic

    def counting(X, y, *args, **kwargs):
        fitted.append(y.shape[0] * y.shape[1])  # groups x problems
        return real(X, y, *args, **kwargs)

    monkeypatch.setattr(module, "fit_logistic", counting)
    SparseProbeSweep(ks=(1, 2), folds=4, seeds=(0, 1), control=False).run({"planted": {"f": X}}, [relation])
    assert sum(fitted) == 2 * 4 * 2  # ks x folds x seeds


def test_dense_rows_and_planted_signal():
    relation, X, y = planted(n=60, seed=3)
    table = SparseProbeSweep(ks=(1, 8, None), folds=3, seeds=(0,)).run({"planted": {"f": X}}, [relation])
    dense = table.query("selection == 'all'")
    assert set(dense["k"]) == {40} and len(dense) == 3
    reference = ProbeSweep(folds=3, seeds=(0,)).run({"planted": {"f": X}}, [relation])
    np.testing.assert_allclose(dense["accuracy"].to_numpy(), reference["accuracy"].to_numpy())
    by_k = table.groupby("k").accuracy.mean()
    assert by_k[8] > by_k[1] > 1 / 3 and "control_accuracy" in table and "selectivity" in table


def test_wrong_settings_are_refused_before_any_fit():
    relation, X, _ = planted()
    stored = {"planted": {"f": X}}
    with pytest.raises(ValueError, match=r"k=64 is more features than the sites \{'f': 40\}"):
        SparseProbeSweep(folds=3).run(stored, [relation])
    for ks in [(0, 2), (2, 2), (), (1.5,)]:
        with pytest.raises(ValueError, match="ks"):
            SparseProbeSweep(ks=ks).run(stored, [relation])
    with pytest.raises(ValueError, match="mdl reads all subjects at once"):
        SparseProbeSweep(ks=(2,), mdl=True).run(stored, [relation])
    with pytest.raises(ValueError, match="baselines reads all subjects at once"):
        SparseProbeSweep(ks=(2,), baselines=True).run(stored, [relation])
    with pytest.raises(ValueError, match="mdl cannot be combined with select"):
        ProbeSweep(mdl=True, select=lambda X, y, c: [0])
    for wrong in ([], [0, 0], [40], [[0, 1]], [0.5]):
        with pytest.raises(ValueError, match="select must return distinct feature indices"):
            ProbeSweep(folds=3, select=lambda X, y, c, wrong=wrong: wrong).run(stored, [relation])


def test_without_a_readout_the_dense_and_sparse_rows_still_come():
    relation, X, _ = planted()
    sweep = SparseProbeSweep(ks=(1, None), folds=3, readout=False)
    table = sweep.run({"planted": {"f": X}}, [relation])
    assert sorted(set(table["k"])) == [1, 40] and sweep.readout_.empty


@pytest.fixture(scope="module")
def world():
    return interp.load_model("world")


def world_relation(model, n=24):
    names = [t for t in model.tokenizer.get_vocab() if t[:1].isupper() and t.isalpha() and len(t) > 3]
    subjects = sorted(names)[:n]
    return Relation("two_groups", subjects, [("x", "y")[i % 2] for i in range(n)], "{} has a")


def test_probe_sweeps_run_on_the_features_of_an_attached_sae(world):
    sae = load_sae(SAE_DIR)
    model = attach_sae(world, sae)
    relation, site = world_relation(world), feature_site(sae.hook_name)
    dense = ProbeSweep(sites=[site], folds=2, seeds=(0,), control=False).run(model, [relation])
    assert set(dense["site"]) == {site} and set(dense["layer"]) == {1} and len(dense) == 2
    sparse = SparseProbeSweep(ks=(1, 4, None), folds=2, seeds=(0,), control=False)
    table = sparse.run(model, [relation])  # sites default to the attached SAE's features
    assert set(table["site"]) == {site} and sorted(set(table["k"])) == [1, 4, 256]
    np.testing.assert_allclose(table.query("k == 256")["accuracy"].to_numpy(), dense["accuracy"].to_numpy())
    # the ranking is of the features themselves: recompute fold 0's from a capture of the site
    acts = interp.capture(model, relation.prompts(), sites=[site], positions="subject_last")[site]
    y = np.arange(len(relation)) % 2
    train = np.ones(len(y), bool)
    split = StratifiedKFold(n_splits=2, shuffle=True, random_state=0)
    train[next(iter(split.split(np.zeros(len(y)), y)))[1]] = False
    expected = mean_difference_ranking(acts[train], y[train])[:4]
    ranked = sparse.ranking_.query("fold == 0 and labels == 'task'").sort_values("rank")["feature"]
    np.testing.assert_array_equal(ranked, expected)
    with pytest.raises(ValueError, match="has no SAE attached"):
        SparseProbeSweep(ks=(1,)).run(world, [relation])
