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
    y[: 200] = 0  # lopsided classes: balanced accuracy differs from accuracy
    df = ProbeSweep(folds=3, control=False, dtype=torch.float64, tol=1e-9).run(
        {"r": {"blocks.0.hook_resid_post": torch.tensor(X)}}, [_relation(y)])
    for fold, (tr, te) in enumerate(StratifiedKFold(3, shuffle=True, random_state=0).split(X, y)):
        ref = make_pipeline(StandardScaler(), LogisticRegression(max_iter=10_000, tol=1e-10)).fit(X[tr], y[tr])
        p = ref.predict_proba(X[te])
        auroc = roc_auc_score(y[te], p[:, 1]) if classes == 2 else roc_auc_score(y[te], p, multi_class="ovr")
        row = df[df.fold == fold].iloc[0]
        assert abs(row.balanced_accuracy - balanced_accuracy_score(y[te], p.argmax(1))) < 0.01
        assert abs(row.auroc - auroc) < 2e-3
    assert (df.balanced_accuracy < df.accuracy).all()


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
    fractions = (0.05, 0.1, 0.2, 0.4, 0.8, 1.0)  # a first block with every class (scikit-learn cannot score unseen ones)
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
