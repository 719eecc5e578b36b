"""``RidgeProbe``: linear read-out of continuous targets (a year, a count, a coordinate).

Closed-form ridge regression on centered data, ``w = (Xc^T Xc + alpha I)^{-1} Xc^T yc`` with an
unpenalized intercept: the same solution as ``sklearn.linear_model.Ridge(alpha)``. Several
targets (columns of ``y``) are solved at once. Score is R^2.
"""

from __future__ import annotations

import numpy as np
import torch
from sklearn.base import BaseEstimator, RegressorMixin
from sklearn.utils.validation import check_is_fitted, validate_data

from .linear_probe import to_numpy


class RidgeProbe(RegressorMixin, BaseEstimator):
    def __init__(self, alpha: float = 1.0):
        self.alpha = alpha

    def fit(self, X, y):
        X, y = validate_data(self, to_numpy(X), to_numpy(y), multi_output=True, y_numeric=True, dtype=np.float64)
        if self.alpha < 0:
            raise ValueError(f"alpha must be non-negative, got {self.alpha}")
        Xt, yt = torch.tensor(X), torch.tensor(y, dtype=torch.float64)
        x_mean, y_mean = Xt.mean(0), yt.mean(0)
        Xc, yc = Xt - x_mean, yt - y_mean
        A = Xc.T @ Xc + self.alpha * torch.eye(X.shape[1], dtype=torch.float64)
        W = torch.linalg.lstsq(A, Xc.T @ (yc if yc.dim() == 2 else yc[:, None])).solution
        coef = W.T.numpy()
        self.coef_ = coef[0] if y.ndim == 1 else coef
        self.intercept_ = (y_mean - x_mean @ W).numpy()
        if y.ndim == 1:
            self.intercept_ = float(self.intercept_[0])
        return self

    def predict(self, X):
        check_is_fitted(self)
        X = validate_data(self, to_numpy(X), reset=False, dtype=np.float64)
        return X @ self.coef_.T + self.intercept_
