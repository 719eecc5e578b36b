"""Probes agree with scikit-learn, recover planted structure, fall to chance on noise."""

import numpy as np
import pandas as pd
import pytest
import torch
from sklearn.linear_model import LogisticRegression, Ridge

from interp.relations import Relation
from probes import DiffMeansProbe, LinearProbe, ProbeSweep, RidgeProbe, fit_logistic, sweep


def planted(n=400, d=24, classes=4, seed=0, noise=1.0):
    rng = np.random.default_rng(seed)
    centers = rng.normal(size=(classes, d)) * 1.5
    y = rng.integers(0, classes, size=n)
    X = centers[y] + noise * rng.normal(size=(n, d))
    return X, y


def test_check_estimator():
    from sklearn.utils.estimator_checks import check_estimator

    results = check_estimator(LinearProbe(), on_fail=None)
    failed = [(r["check_name"], r["exception"]) for r in results if r["status"] == "failed"]
    assert not failed and len(results) > 40


@pytest.mark.parametrize("classes", [2, 3, 7])
@pytest.mark.parametrize("C", [0.05, 1.0])
def test_linear_probe_matches_sklearn(classes, C):
    X, y = planted(classes=classes, noise=2.0)
    ours = LinearProbe(C=C, tol=1e-9).fit(X, y)
    ref = LogisticRegression(C=C, tol=1e-10, max_iter=10_000).fit(X, y)
    np.testing.assert_allclose(ours.coef_, ref.coef_, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(ours.intercept_, ref.intercept_, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(ours.predict_proba(X), ref.predict_proba(X), atol=1e-6)
    assert (ours.predict(X) == ref.predict(X)).mean() >= 0.99
    assert abs(ours.score(X, y) - ref.score(X, y)) <= 0.01


@pytest.mark.parametrize("classes", [2, 6])
def test_standardized_probe_matches_a_scaler_pipeline(classes):
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    X, y = planted(classes=classes, noise=2.0)
    X = X * np.linspace(0.1, 50, X.shape[1]) + 7.0  # uneven scales and offsets, like hidden states
    X[:, 0] = 3.0  # a constant feature
    ours = LinearProbe(C=0.3, standardize=True, tol=1e-9).fit(X, y)
    ref = make_pipeline(StandardScaler(), LogisticRegression(C=0.3, tol=1e-10, max_iter=10_000)).fit(X, y)
    np.testing.assert_allclose(ours.predict_proba(X), ref.predict_proba(X), atol=1e-6)


def test_linear_probe_takes_torch_tensors_and_string_labels():
    X, y = planted(classes=3)
    names = np.array(["crab", "zebra", "otter"])[y]
    probe = LinearProbe().fit(torch.tensor(X, dtype=torch.float32), names)
    assert set(probe.classes_) == {"crab", "zebra", "otter"}
    assert probe.score(torch.tensor(X), names) > 0.9


def test_batched_equals_single_fits():
    rng = np.random.default_rng(1)
    X = torch.tensor(rng.normal(size=(3, 150, 10)))
    y = torch.tensor(rng.integers(0, 4, size=(2, 150)))
    train = torch.tensor(rng.random((2, 150)) < 0.8)
    batched = fit_logistic(X, y, train, C=0.7, tol=1e-9, dtype=torch.float64)
    for g in range(3):
        for k in range(2):
            ref = LogisticRegression(C=0.7, tol=1e-10, max_iter=10_000).fit(
                X[g][train[k]].numpy(), y[k][train[k]].numpy()
            )
            np.testing.assert_allclose(batched.coef[g, k].numpy().T, ref.coef_, atol=1e-5)
    assert batched.converged.all()


@pytest.mark.parametrize("standardize", [False, True])
def test_fits_in_the_training_span_equal_the_full_fits_and_sklearn(standardize):
    """More features than rows (a hidden state of a real model): solving in the span of each
    problem's training rows reaches the same optimum, raw-space coefficients included."""
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    rng = np.random.default_rng(2)
    X = torch.tensor(rng.normal(size=(2, 60, 150)) * np.linspace(0.2, 20, 150) + 3.0)
    X[1, :, 0] = 3.0  # a constant feature
    X[0, 1] = X[0, 0]  # two subjects with one hidden state (a rank-deficient Gram matrix)
    y = torch.tensor(rng.integers(0, 3, size=(2, 60)))
    train = torch.tensor(rng.random((2, 60)) < 0.75)
    kw = dict(C=0.5, tol=1e-8, dtype=torch.float64, standardize=standardize, max_iter=5000)
    full = fit_logistic(X, y, train, reduce=False, **kw)
    span = fit_logistic(X, y, train, reduce=True, **kw)
    assert span.converged.all() and full.converged.all()
    # both stop at a gradient of 1e-8, not at the exact optimum: coefficients agree to 1e-5, the
    # raw-space intercepts (which absorb the features' offsets of ~3 times the weights) to 1e-4
    torch.testing.assert_close(span.coef, full.coef, atol=1e-5, rtol=0)
    torch.testing.assert_close(span.intercept, full.intercept, atol=1e-4, rtol=0)
    if not standardize:
        return  # scikit-learn's lbfgs stops short on unscaled features (scales 0.2 to 20): 2e-4 off both fits
    for g in range(2):
        for k in range(2):
            tr = train[k].numpy()
            ref = make_pipeline(StandardScaler(), LogisticRegression(C=0.5, tol=1e-12, max_iter=20_000))
            ref.fit(X[g].numpy()[tr], y[k].numpy()[tr])
            ours = torch.softmax(span.logits(X)[g, k], -1).numpy()
            np.testing.assert_allclose(ours, ref.predict_proba(X[g].numpy()), atol=1e-5)


def test_planted_direction_is_recovered():
    rng = np.random.default_rng(2)
    direction = rng.normal(size=32)
    direction /= np.linalg.norm(direction)
    X = rng.normal(size=(600, 32))
    y = (X @ direction > 0).astype(int)
    X += np.outer(2 * y - 1, direction)  # widen the margin along the direction
    for probe, attr in ((LinearProbe(), "coef_"), (DiffMeansProbe(), "direction_")):
        probe.fit(X, y)
        w = np.ravel(getattr(probe, attr))
        assert w @ direction / np.linalg.norm(w) > 0.9
        assert probe.score(X, y) > 0.95


def _relation(y, name="r"):
    subjects = [f"s{i}" for i in range(len(y))]
    return Relation(name, subjects, [f"a{v}" for v in y], "{} is")


def test_sweep_on_planted_and_shuffled_labels():
    X, y = planted(n=500, classes=5, noise=1.5)
    shuffled = np.random.default_rng(3).permutation(y)
    feats = {
        "real": {"blocks.0.hook_resid_post": torch.tensor(X, dtype=torch.float32)},
        "noise": {"blocks.0.hook_resid_post": torch.tensor(X, dtype=torch.float32)},
    }
    df = sweep(feats, [_relation(y, "real"), _relation(shuffled, "noise")], folds=5, seeds=(0, 1))
    assert len(df) == 2 * 5 * 2
    by = df.groupby("relation")[["accuracy", "control_accuracy", "selectivity", "chance"]].mean()
    assert by.loc["real", "accuracy"] > 0.8 and by.loc["real", "selectivity"] > 0.5
    assert abs(by.loc["noise", "accuracy"] - 0.2) < 0.06  # chance = 1/5
    assert abs(by.loc["noise", "selectivity"]) < 0.06
    assert set(df.columns) >= {
        "model",
        "relation",
        "site",
        "layer",
        "fold",
        "seed",
        "accuracy",
        "top_k_accuracy",
        "log_loss",
        "chance",
        "n_train",
        "n_classes",
        "control_accuracy",
        "selectivity",
    }


def test_sweep_matches_a_loop_of_sklearn():
    X, y = planted(n=300, classes=4, noise=2.5)
    from sklearn.model_selection import StratifiedKFold
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    for standardize in (False, True):
        if standardize:
            X = X * 30 + 5  # raw scales that only a standardized probe handles well
        cfg = ProbeSweep(folds=3, control=False, dtype=torch.float64, tol=1e-8, standardize=standardize)
        df = cfg.run({"r": {"blocks.0.hook_resid_post": torch.tensor(X)}}, [_relation(y)])
        for fold, (tr, te) in enumerate(StratifiedKFold(3, shuffle=True, random_state=0).split(X, y)):
            lr = LogisticRegression(max_iter=10_000, tol=1e-10)
            ref = (make_pipeline(StandardScaler(), lr) if standardize else lr).fit(X[tr], y[tr]).score(X[te], y[te])
            assert abs(df[df.fold == fold].accuracy.item() - ref) <= 0.01 + 1e-9
        assert df.converged.all()


def test_nonlinear_probes_read_what_a_linear_probe_cannot_and_match_sklearn():
    import warnings

    from sklearn.model_selection import StratifiedKFold
    from sklearn.neighbors import KNeighborsClassifier
    from sklearn.neural_network import MLPClassifier
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    from probes import readability_by_layer

    # four answers set by an XOR of two features and the sign of a third, uneven scales
    rng = np.random.default_rng(0)
    X = rng.normal(size=(500, 12)) * rng.uniform(0.5, 3, size=12)
    y = (X[:, 0] * X[:, 1] > 0).astype(int) + 2 * (X[:, 2] > 0)
    feats = {"r": {"blocks.0.hook_resid_post": torch.tensor(X, dtype=torch.float32)}}
    sweep_ = ProbeSweep(folds=5, nonlinear=("mlp", "knn"), knn_k=7)
    df = sweep_.run(feats, [_relation(y)])
    ro = sweep_.readout_
    mlp, knn, linear = 0.0, 0.0, 0.0
    for fold, (tr, te) in enumerate(StratifiedKFold(5, shuffle=True, random_state=0).split(X, y)):
        row = df[df.fold == fold].iloc[0]
        knn_ref = make_pipeline(StandardScaler(), KNeighborsClassifier(7)).fit(X[tr], y[tr])
        assert row.knn_accuracy == knn_ref.score(X[te], y[te])  # the same neighbours and votes
        got = ro[ro.fold == fold].set_index("subject").knn_predicted
        assert list(got.loc[[f"s{i}" for i in te]]) == [f"a{v}" for v in knn_ref.predict(X[te])]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # scikit-learn's convergence warning at max_iter
            ref = MLPClassifier((64,), alpha=1.0, max_iter=300, random_state=0)
            mlp += make_pipeline(StandardScaler(), ref).fit(X[tr], y[tr]).score(X[te], y[te]) / 5
        knn += row.knn_accuracy / 5
        linear += row.accuracy / 5
    ours = df.mlp_accuracy.mean()
    assert ours >= mlp - 0.05, (ours, mlp)  # as accurate as scikit-learn's MLP, within 5 points
    assert ours > linear + 0.25 and knn > linear  # the XOR half is out of a linear probe's reach
    layers = readability_by_layer(df, ro)
    assert {"mlp_kappa", "knn_kappa"} <= set(layers.columns)
    assert layers.mlp_kappa.item() > layers.kappa.item() + 0.3
    with pytest.raises(ValueError, match="not known"):
        ProbeSweep(nonlinear=("svm",))
    # kNN's k is each problem's own: batched beside a problem with 6 training rows, a problem with 30
    # votes with its 7 neighbours as it does alone
    from probes.nonlinear import knn_predict

    g = torch.Generator().manual_seed(0)
    Xs, Ys = torch.randn(2, 40, 4, generator=g), torch.randint(0, 3, (2, 1, 40), generator=g)
    Ts = torch.zeros(2, 1, 40, dtype=torch.bool)
    Ts[0, 0, :30], Ts[1, 0, :6] = True, True
    NCs = torch.full((2, 1), 3)
    assert torch.equal(knn_predict(Xs, Ys, Ts, NCs, k=7)[0], knn_predict(Xs[:1], Ys[:1], Ts[:1], NCs[:1], k=7)[0])


def test_sweep_is_deterministic_and_reads_out_rankings():
    X, y = planted(n=200, classes=4)
    feats = {"r": {"blocks.0.hook_resid_post": torch.tensor(X, dtype=torch.float32)}}
    a, b = ProbeSweep(folds=4, seeds=(7,)), ProbeSweep(folds=4, seeds=(7,))
    pd.testing.assert_frame_equal(a.run(feats, [_relation(y)]), b.run(feats, [_relation(y)]))
    ro = a.readout_
    assert len(ro) == 200 and ro.subject.is_unique
    assert (ro.predicted == ro.top_answers.str[0]).all()
    assert ((ro.answer_rank == 1) == (ro.predicted == ro.answer)).all()


def test_rare_answers_are_dropped_and_reported():
    y = np.array([0] * 30 + [1] * 30 + [2] * 2)
    X = np.random.default_rng(0).normal(size=(62, 8))
    df = sweep({"r": {"blocks.0.hook_resid_post": torch.tensor(X)}}, [_relation(y)], folds=5)
    assert (df.dropped_classes == 1).all() and (df.dropped_subjects == 2).all() and (df.n_classes == 2).all()


def test_ridge_probe_matches_sklearn():
    rng = np.random.default_rng(4)
    X = rng.normal(size=(120, 15))
    y = X @ rng.normal(size=15) + 0.1 * rng.normal(size=120)
    for alpha in (0.1, 10.0):
        ours, ref = RidgeProbe(alpha).fit(X, y), Ridge(alpha).fit(X, y)
        np.testing.assert_allclose(ours.coef_, ref.coef_, atol=1e-8)
        np.testing.assert_allclose(ours.predict(X), ref.predict(X), atol=1e-8)
    assert RidgeProbe(1.0).fit(X, y).score(X, y) > 0.99


# bad input ---------------------------------------------------------------------------------------
def test_single_class_is_an_error():
    with pytest.raises(ValueError, match="at least 2 classes"):
        LinearProbe().fit(np.ones((10, 3)), np.zeros(10))


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_non_finite_features(bad):
    X, y = planted(n=50)
    X[3, 2] = bad
    with pytest.raises(ValueError, match="NaN|infinity"):
        LinearProbe().fit(X, y)
    with pytest.raises(ValueError, match="NaN or inf"):
        sweep({"r": {"blocks.0.hook_resid_post": torch.tensor(X)}}, [_relation(y)])


def test_mismatched_lengths():
    X, y = planted(n=50)
    with pytest.raises(ValueError, match="inconsistent numbers of samples"):
        LinearProbe().fit(X, y[:-1])
    with pytest.raises(ValueError, match="49 rows of activations .* 50 samples"):
        sweep({"r": {"blocks.0.hook_resid_post": torch.tensor(X[:-1])}}, [_relation(y)])


def test_fewer_subjects_than_folds():
    with pytest.raises(ValueError, match="fewer than folds=5"):
        sweep({"r": {"blocks.0.hook_resid_post": torch.zeros(4, 3)}}, [_relation(np.array([0, 1, 0, 1]))], folds=5)
