"""Nonlinear probes: is an answer decodable at all, not only linearly?

The study's claim is about *linear* readability. To test the word "linear", the same states, the
same subjects and the same folds are also read by two probes that are not linear:

- **MLP**: one hidden layer (ReLU, 64 units), trained full-batch with Adam (300 steps) and an L2
  penalty on its weights (scikit-learn's ``MLPClassifier`` objective: mean cross-entropy +
  ``alpha / (2 n) ||W||^2``) of the linear probe's strength (``alpha = 1 / C`` with C = 1: the
  logistic probe's objective is the same with no hidden layer), on features standardized with the
  training fold's mean and standard deviation. Tested against scikit-learn's ``MLPClassifier``
  (as accurate on a task no linear probe can read, within a stated tolerance); the L2 strength
  matters more than the optimizer (on that task: held-out accuracy 0.71 with alpha 1e-3, 0.84
  with 1);
- **kNN**: the majority answer of the ``k`` nearest training subjects (Euclidean distance on the
  same standardized features; ties between answers go to the first in sorted order, as
  scikit-learn's ``KNeighborsClassifier`` breaks them).

**The MLP's kappa is a noisy measurement.** Its objective is not convex: a 1e-6 relative
perturbation of the states flips 3-6% of its held-out predictions on a world relation (12 answers,
held-out accuracy 0.3; measured with Adam at three step sizes, and more with L-BFGS run to
convergence, which lands in other minima), and the two backends' states (1e-7 apart) move its
kappa by up to 0.03. The linear probe's predictions do not move (its optimum is unique), and kNN's
move only at exact distance ties. Read a difference between the MLP's kappa and the linear one
against that noise.

Both are fitted for every problem of a sweep at once, as :mod:`probes.logistic` fits the linear
probe: ``X`` is ``[G, n, d]`` (G groups of padded rows), ``Y`` and ``T`` are ``[G, K, n]`` (K
problems per group: folds x seeds; label -1 on padding, ``T`` marks training rows), ``NC`` is
``[G, K]`` (each problem's number of classes). ``ProbeSweep(nonlinear=("mlp", "knn"))`` adds their
accuracies to every row (``mlp_accuracy``, ``knn_accuracy``) and their predictions to the
read-out (``mlp_predicted``, ``knn_predicted``), from which :func:`probes.readability_by_layer`
takes ``mlp_kappa`` and ``knn_kappa`` as it takes ``kappa``.

>>> logits = fit_mlp(X, Y, T, NC)          # [G, K, n, c]; argmax on held-out rows = predictions
>>> predicted = knn_predict(X, Y, T, NC)   # [G, K, n]
"""

from __future__ import annotations

import torch

NONLINEAR = ("mlp", "knn")


def standardized(X: torch.Tensor, T: torch.Tensor) -> torch.Tensor:
    """``X`` (``[G, n, d]``) standardized per problem with its training rows' mean and standard
    deviation (population, as ``StandardScaler``; a constant feature is left centred): ``[G, K, n, d]``."""
    w = T.to(X.dtype)[..., None]  # [G, K, n, 1]
    count = w.sum(2, keepdim=True).clamp_min(1)
    Xe = X[:, None]
    mean = (Xe * w).sum(2, keepdim=True) / count
    var = (((Xe - mean) ** 2) * w).sum(2, keepdim=True) / count
    std = var.sqrt()
    return (Xe - mean) / torch.where(std > 0, std, torch.ones_like(std))


def fit_mlp(
    X: torch.Tensor,
    Y: torch.Tensor,
    T: torch.Tensor,
    NC: torch.Tensor,
    hidden: int = 64,
    alpha: float = 1.0,
    steps: int = 300,
    lr: float = 2e-2,
    seed: int = 0,
) -> torch.Tensor:
    """One-hidden-layer MLPs for every problem at once (module docstring); returns the logits of
    every row ``[G, K, n, c_max]`` (classes beyond a problem's ``NC`` at -inf)."""
    G, K, n = Y.shape
    d, c = X.shape[-1], int(NC.max())
    Xs = standardized(X, T)
    gen = torch.Generator().manual_seed(seed)

    def init(fan_in, *shape):  # scikit-learn's Glorot-uniform bound for ReLU layers
        bound = (6.0 / (fan_in + shape[-1])) ** 0.5
        return ((torch.rand(G, K, *shape, generator=gen, dtype=X.dtype) * 2 - 1) * bound).to(X.device)

    W1, b1 = init(d, d, hidden), init(d, 1, hidden)
    W2, b2 = init(hidden, hidden, c), init(hidden, 1, c)
    params = [p.requires_grad_() for p in (W1, b1, W2, b2)]
    opt = torch.optim.Adam(params, lr=lr)
    valid = torch.arange(c, device=X.device) < NC[..., None, None]  # [G, K, 1, c]
    train = T & (Y >= 0)
    n_train = train.sum(-1).clamp_min(1).to(X.dtype)  # [G, K]
    target = Y.clamp_min(0)

    def logits():
        h = torch.relu(Xs @ W1 + b1)
        return (h @ W2 + b2).masked_fill(~valid, float("-inf"))

    for _ in range(steps):
        opt.zero_grad()
        logp = torch.log_softmax(logits(), -1)
        nll = -logp.gather(-1, target[..., None])[..., 0]  # [G, K, n]
        loss = (nll * train).sum(-1) / n_train
        penalty = alpha / (2 * n_train) * ((W1**2).sum((-2, -1)) + (W2**2).sum((-2, -1)))
        (loss + penalty).sum().backward()
        opt.step()
    with torch.no_grad():
        return logits()


def knn_predict(X: torch.Tensor, Y: torch.Tensor, T: torch.Tensor, NC: torch.Tensor, k: int = 10) -> torch.Tensor:
    """The majority answer among each row's ``k`` nearest training rows (module docstring), for
    every problem: ``[G, K, n]`` class indices (a training row's own label counts for itself:
    read the held-out rows)."""
    Xs = standardized(X, T)  # [G, K, n, d]
    train = T & (Y >= 0)
    dist = torch.cdist(Xs, Xs)  # [G, K, n, n]
    dist = dist.masked_fill(~train[:, :, None, :], float("inf"))
    kk = min(k, dist.shape[-1])
    nearest = dist.topk(kk, dim=-1, largest=False)  # [G, K, n, kk]
    labels = Y[:, :, None, :].expand(-1, -1, Y.shape[-1], -1).gather(-1, nearest.indices)
    # each problem votes with its own min(k, training rows) neighbours: a neighbour at infinite
    # distance is no training row (padding, or a problem with fewer than k) and has no vote
    real = torch.isfinite(nearest.values).long()
    c = int(NC.max())
    votes = torch.zeros(*labels.shape[:-1], c, dtype=torch.long, device=X.device)
    votes.scatter_add_(-1, labels.clamp_min(0), real)
    return votes.argmax(-1)  # first (lowest) class on ties


__all__ = ["NONLINEAR", "fit_mlp", "knn_predict", "standardized"]
