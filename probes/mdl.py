"""Minimum description length of a probe: the online (prequential) code of Voita & Titov 2020.

Accuracy says *whether* a probe can read a label; description length says how *easily*: how many
bits it takes to transmit the labels given the representations, when sender and receiver train
the same probe on what has been sent so far. Order the ``n`` examples (a seeded shuffle) and cut
them at ``t_1 < t_2 < ... < t_S = n`` (default: 0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 6.25, 12.5, 25, 50
and 100% of ``n``). The first block is sent with the uniform code, ``t_1 log2 K`` bits for ``K``
classes; each later block ``(t_i, t_{i+1}]`` is sent with a probe trained on the first ``t_i``
examples, costing its cross-entropy in bits. The online codelength is the sum; the uniform
codelength ``n log2 K`` is what sending the labels without the representation costs, and the
**compression** ``uniform / online`` is the quality measure (1: nothing gained; higher: the label
is linearly extractable, and from few examples). Unlike accuracy it charges a probe for needing
many examples, so a memorizing probe on random labels (Hewitt & Liang's control task) compresses
little.

The probes are the toolkit's L2 logistic regression with standardization (``C``: inverse
strength, as scikit-learn's), all blocks fitted at once by :func:`probes.logistic.fit_logistic`.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from .logistic import fit_logistic

#: Voita & Titov's block boundaries, as fractions of the data
FRACTIONS = (0.001, 0.002, 0.004, 0.008, 0.016, 0.032, 0.0625, 0.125, 0.25, 0.5, 1.0)


def block_ends(n: int, fractions: Sequence[float] = FRACTIONS, minimum: int = 2) -> list[int]:
    """Block boundaries ``t_1 < ... < t_S = n`` (the first holds at least ``minimum`` examples)."""
    ends = sorted({min(n, max(minimum, int(round(f * n)))) for f in fractions} | {n})
    return ends


def online_codelength(
    X,
    y: Sequence,
    fractions: Sequence[float] = FRACTIONS,
    C: float = 1.0,
    seed: int = 0,
    standardize: bool = True,
    tol: float = 1e-5,
    max_iter: int = 1000,
) -> dict:
    """Online codelength of ``y`` given ``X`` ``[n, d]`` (see the module docstring): ``mdl_bits``,
    ``uniform_bits``, ``compression``, ``n``, ``n_classes``, and ``block_bits`` (bits per block)."""
    X = torch.as_tensor(np.asarray(X), dtype=torch.float64)
    classes, idx = np.unique(np.asarray(y), return_inverse=True)
    n, K = len(idx), len(classes)
    if K < 2:
        raise ValueError(f"a codelength needs at least 2 classes, got {K}")
    order = np.random.default_rng(seed).permutation(n)
    Xo, yo = X[order], torch.as_tensor(idx[order])
    ends = block_ends(n, fractions)
    uniform_bits = n * np.log2(K)
    bits = [ends[0] * np.log2(K)]
    if len(ends) > 1:
        pos = torch.arange(n)
        train = torch.stack([pos < t for t in ends[:-1]])  # [S-1, n]: probe k sees the first t_k examples
        fit = fit_logistic(
            Xo[None],
            yo[None].expand(len(ends) - 1, n),
            train[None],
            torch.full((1, len(ends) - 1), K),
            C=C,
            dtype=torch.float64,
            standardize=standardize,
            tol=tol,
            max_iter=max_iter,
        )
        logp = torch.log_softmax(fit.logits(Xo[None])[0].double(), -1)  # [S-1, n, K]
        for k in range(len(ends) - 1):
            block = slice(ends[k], ends[k + 1])
            bits.append(float(-logp[k, block].gather(1, yo[block, None]).sum() / np.log(2)))
    total = float(sum(bits))
    return {
        "mdl_bits": total,
        "uniform_bits": float(uniform_bits),
        "compression": float(uniform_bits / total),
        "n": n,
        "n_classes": K,
        "block_bits": bits,
    }
