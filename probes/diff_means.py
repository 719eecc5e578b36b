"""Difference-of-means probes: the simplest linear read-out, with no optimization at all.

For two classes the direction is ``mu_1 - mu_0`` and an example is scored by its projection
onto it, thresholded halfway between the class means. For more classes each class gets the
direction ``mu_c - mu`` (its mean minus the grand mean) and an example goes to the class with
the nearest mean (``argmax_c x . mu_c - ||mu_c||^2 / 2``), i.e. a nearest-centroid classifier.
Often nearly as accurate as a logistic probe, and a useful lower bound: if the class means
already separate, the information is linearly readable without any fitting.
"""

from __future__ import annotations

import numpy as np
from sklearn.base import BaseEstimator, ClassifierMixin
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import check_is_fitted, validate_data

from .linear_probe import to_numpy


class DiffMeansProbe(ClassifierMixin, BaseEstimator):
    """Nearest-class-mean classifier; ``direction_`` is ``mu_1 - mu_0`` for two classes."""

    def fit(self, X, y):
        X, y = validate_data(self, to_numpy(X), to_numpy(y))
        check_classification_targets(y)
        self.classes_, idx = np.unique(y, return_inverse=True)
        if len(self.classes_) < 2:
            raise ValueError(f"DiffMeansProbe needs at least 2 classes, got only {self.classes_[0]!r}")
        self.means_ = np.stack([X[idx == c].mean(axis=0) for c in range(len(self.classes_))])
        self.directions_ = self.means_ - X.mean(axis=0)
        if len(self.classes_) == 2:
            self.direction_ = self.means_[1] - self.means_[0]
        return self

    def decision_function(self, X):
        check_is_fitted(self)
        X = validate_data(self, to_numpy(X), reset=False)
        scores = X @ self.means_.T - 0.5 * (self.means_**2).sum(axis=1)
        return scores[:, 1] - scores[:, 0] if len(self.classes_) == 2 else scores

    def predict(self, X):
        s = self.decision_function(X)
        return self.classes_[(s > 0).astype(int) if s.ndim == 1 else s.argmax(axis=1)]
