"""Concept erasure: remove from a representation exactly what a linear probe could read.

**LEACE** (Belrose et al. 2023, "LEACE: Perfect linear concept erasure in closed form"; the
``concept-erasure`` package): given states ``X`` ``[n, d]`` and a concept ``Z`` (here the one-hot
original answer, ``k`` classes), the affine map ``r(x) = x - P (x - mu)`` with the least
expected squared change such that ``Cov(r(X), Z) = 0``. Zero cross-covariance is equivalent to
*no linear classifier doing better than a constant one* on the fitting distribution, so after
erasure a probe for the answer is at chance (kappa 0) on the states the eraser was fitted on.
``P`` has rank at most ``k - 1``: LEACE removes a (k-1)-dimensional subspace, chosen by the
concept, in the whitened geometry of ``X``.

**Random subspace** (the control): an orthogonal projection removing a uniformly random subspace
of the same rank (``x - Q Q^T (x - mu)``, ``Q`` a seeded orthonormal ``[d, rank]``), so that "the
model lost ``rank`` dimensions at this site" and "the model lost the answer's dimensions" can
be told apart.

Both are fitted on the states they are given and nothing else: a study fits them on its
fine-tuning subjects only (no held-out subject informs the eraser).

**Readability after erasure** (:func:`erased_probe_kappa`): cross-validated probe kappa with the
eraser refitted inside each fold on the training rows only. Erasing with an eraser fitted on all
rows and then cross-validating gives *below*-chance kappas: equalizing the class means of the
whole set pushes each held-out fold's class means the opposite way of the training folds'.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from jaxtyping import Float
from sklearn.model_selection import StratifiedKFold

from .chance import kappa
from .readability import frequent, standardized_logistic

Tensor = torch.Tensor


@dataclass(frozen=True)
class Eraser:
    """An affine erasure ``x -> x - (x - bias) @ right.T @ left.T`` (``left``, ``right``: ``[d, r]``)."""

    left: Float[Tensor, "d r"]
    right: Float[Tensor, "d r"]
    bias: Float[Tensor, " d"]
    kind: str

    @property
    def rank(self) -> int:
        return int(torch.linalg.matrix_rank(self.left.double() @ self.right.double().T, atol=1e-6))

    def __call__(self, x: Float[Tensor, "... d"]) -> Float[Tensor, "... d"]:
        left, right, bias = (t.to(x.device, x.dtype) for t in (self.left, self.right, self.bias))
        return x - ((x - bias) @ right) @ left.T


def fit_leace(states: Float[Tensor, "n d"], labels: Sequence) -> Eraser:
    """The LEACE eraser of the class ``labels`` from ``states`` (see the module docstring)."""
    from concept_erasure import LeaceFitter  # imported when first used (it imports its own helpers)

    x = torch.as_tensor(np.asarray(states), dtype=torch.float64) if not isinstance(states, Tensor) else states.double()
    classes, idx = np.unique(np.asarray(labels), return_inverse=True)
    if len(classes) < 2:
        raise ValueError(f"erasing a concept needs at least 2 classes, got {len(classes)}")
    z = torch.nn.functional.one_hot(torch.as_tensor(idx), len(classes)).double()
    # the exact LEACE projection: the package's defaults would shrink it towards an orthogonal one
    # when erasure raises the covariance trace, and then linear information would remain
    eraser = LeaceFitter.fit(x, z, constrain_cov_trace=False).eraser
    return Eraser(eraser.proj_left.float(), eraser.proj_right.mH.float(), eraser.bias.float(), "leace")


def leftover(eraser: Eraser, states: Float[Tensor, "n d"], labels: Sequence) -> float:
    """The largest absolute cross-covariance between erased ``states`` and the one-hot ``labels``
    (0 up to rounding for a LEACE eraser on the states it was fitted on)."""
    x = eraser(torch.as_tensor(states).float()).double()
    _, idx = np.unique(np.asarray(labels), return_inverse=True)
    z = torch.nn.functional.one_hot(torch.as_tensor(idx)).double()
    return float(((x - x.mean(0)).T @ (z - z.mean(0)) / len(x)).abs().max())


def random_subspace(states: Float[Tensor, "n d"], rank: int, seed: int) -> Eraser:
    """Orthogonal projection removing a random ``rank``-dimensional subspace, centred on the
    states' mean (the control for :func:`fit_leace`)."""
    x = torch.as_tensor(np.asarray(states)) if not isinstance(states, Tensor) else states
    d = x.shape[1]
    gen = torch.Generator().manual_seed(seed)
    q, _ = torch.linalg.qr(torch.randn(d, rank, generator=gen, dtype=torch.float64))
    return Eraser(q.float(), q.float(), x.double().mean(0).float(), "random")


def erased_probe_kappa(x: np.ndarray, y: Sequence, folds: int = 5, seed: int = 0) -> float:
    """Cross-validated probe kappa (:func:`probes.readability.probe_kappa`) on LEACE-erased
    states, the eraser fitted inside each fold on its training rows (module docstring)."""
    y = np.asarray(y)
    keep = frequent(y, folds)
    x, y = x[keep], y[keep]
    if len(set(y)) < 2:
        return float("nan")
    pred = np.empty(len(y), dtype=object)
    for train, test in StratifiedKFold(folds, shuffle=True, random_state=seed).split(x, y):
        eraser = fit_leace(torch.as_tensor(x[train]), y[train])
        probe = standardized_logistic()
        probe.fit(eraser(torch.as_tensor(x[train])).numpy(), y[train])
        pred[test] = probe.predict(eraser(torch.as_tensor(x[test])).numpy())
    return kappa(list(y), list(pred))
