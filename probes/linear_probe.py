"""``LinearProbe``: a scikit-learn classifier for "is this information linearly readable here?".

Multinomial logistic regression with an L2 penalty, fitted by the batched L-BFGS of
:mod:`probes.logistic` (so a single probe and a sweep of thousands are the same computation),
with scikit-learn's estimator contract: ``fit`` returns ``self``, learned state ends in ``_``,
and ``check_estimator`` passes. Accepts numpy arrays and torch tensors.

>>> probe = LinearProbe(C=1.0).fit(X_train, y_train)
>>> probe.score(X_test, y_test), probe.predict_proba(X_test)[:3]
"""

from __future__ import annotations

import numpy as np
import torch
from sklearn.base import BaseEstimator, ClassifierMixin
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import check_is_fitted, validate_data

from .logistic import fit_logistic


def to_numpy(a):
    """A torch tensor (any device) or array-like as something scikit-learn validates."""
    if isinstance(a, torch.Tensor):
        return a.detach().cpu().numpy()
    return a


class LinearProbe(ClassifierMixin, BaseEstimator):
    """L2-regularized multinomial logistic probe; same objective and optimum as
    ``LogisticRegression(C=C)`` (lbfgs), two-class problems included.

    Parameters
    ----------
    C : inverse regularization strength (as in scikit-learn).
    standardize : fit on standardized features, as ``make_pipeline(StandardScaler(),
        LogisticRegression(C))``; ``coef_`` and ``intercept_`` still act on the raw features.
    max_iter, tol : L-BFGS limits; ``tol`` bounds the largest gradient entry at the optimum.
    dtype : ``"float64"`` (default, for exact agreement) or ``"float32"``.
    device : where to fit (``"cpu"``, ``"cuda"``).
    """

    def __init__(
        self,
        C: float = 1.0,
        standardize: bool = False,
        max_iter: int = 1000,
        tol: float = 1e-6,
        dtype: str = "float64",
        device: str = "cpu",
    ):
        self.C = C
        self.standardize = standardize
        self.max_iter = max_iter
        self.tol = tol
        self.dtype = dtype
        self.device = device

    def fit(self, X, y):
        X, y = validate_data(self, to_numpy(X), to_numpy(y), dtype=[np.float64, np.float32])
        check_classification_targets(y)
        self.classes_, y_idx = np.unique(y, return_inverse=True)
        if len(self.classes_) < 2:
            raise ValueError(
                f"LinearProbe needs at least 2 classes in y to fit, but the data contain only one class: "
                f"{self.classes_[0]!r}. Check the labels (or drop this probe)."
            )
        if not self.C > 0:
            raise ValueError(f"C must be positive, got {self.C}")
        dtype = getattr(torch, self.dtype)
        fit = fit_logistic(
            torch.tensor(X, device=self.device),
            torch.tensor(y_idx, device=self.device),
            C=float(self.C),
            max_iter=self.max_iter,
            tol=self.tol,
            dtype=dtype,
            standardize=self.standardize,
        )
        W = fit.coef[0, 0].cpu().numpy().T  # [c, d]
        b = fit.intercept[0, 0].cpu().numpy()
        if len(self.classes_) == 2:  # scikit-learn's binary convention: one row, positive class
            W, b = W[1:] - W[:1], b[1:] - b[:1]
        self.coef_ = W.astype(np.float64)
        self.intercept_ = b.astype(np.float64)
        self.n_iter_ = np.array([int(fit.n_iter[0, 0])])
        self.converged_ = bool(fit.converged[0, 0])
        return self

    def decision_function(self, X):
        check_is_fitted(self)
        X = validate_data(self, to_numpy(X), reset=False, dtype=[np.float64, np.float32])
        scores = X @ self.coef_.T + self.intercept_
        return scores.ravel() if scores.shape[1] == 1 else scores

    def predict_proba(self, X):
        scores = self.decision_function(X)
        if scores.ndim == 1:
            scores = np.stack([-scores / 2, scores / 2], axis=1)
        scores = scores - scores.max(axis=1, keepdims=True)
        p = np.exp(scores)
        return p / p.sum(axis=1, keepdims=True)

    def predict_log_proba(self, X):
        return np.log(self.predict_proba(X))

    def predict(self, X):
        scores = self.decision_function(X)
        idx = (scores > 0).astype(int) if scores.ndim == 1 else scores.argmax(axis=1)
        return self.classes_[idx]
