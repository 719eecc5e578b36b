"""Resampling: the one bootstrap and the one sign-flip test of the project.

Both the patching analyzers (:mod:`circuits.statistics`, per cell over prompt pairs) and the
study (:mod:`lab.study`, over subjects or relations) put uncertainty on a mean by resampling. The
draws (which rows a resample takes, which signs a flip uses) come from the caller, who owns the
seed convention (TransformerLens' SHA-256-keyed torch generator for patching, a numpy
``default_rng(seed)`` for the study); what is computed from them is written once, here:

- :func:`bootstrap_indices`: ``n_resamples`` resamples of ``n`` rows with replacement;
- :func:`resampled_means`: the mean of ``values`` over each resample's rows, for every cell at
  once (``values[..., idx].mean(-1)``), computed a block of cells at a time, as many as fit in
  :data:`WORK_BYTES` (at most :data:`BLOCK`, at least one), so that memory stays bounded by
  ``block x resamples x n`` whatever the number of rows (a cell's mean does not depend on the
  block beyond the last digit: numpy orders a block's sums by its shape; blocks of the default
  size, used unless rows are many, are the ones every saved result was computed with);
- :func:`percentile_interval`: the percentile bootstrap interval of those means;
- :func:`sign_flip_p`: the paired sign-flip permutation test that a mean is zero. Under the null
  each row's value is symmetric about zero, so the means with random signs are its distribution.
  With all ``2**n`` sign patterns the test is exact (``hits / 2**n``); with ``k`` random patterns
  it is Monte-Carlo, ``(hits + 1) / (k + 1)``, counting the observed pattern once. A flipped mean
  within float noise of the observed one (summation order) counts as a hit;
- :func:`monte_carlo_p`: the p-value of an observed statistic against draws of it under the null
  (a permutation test's shuffles, a simulated null, random circuits): ``(1 + hits) / (1 + n)``
  (Besag & Clifford 1991; the observed value counts as one of the draws, so p is never 0), where
  a hit is a draw at least as extreme, within ``tolerance`` (summation-order noise), and a draw
  that is not finite (an undefined statistic) is left out;
- :func:`permutations` and :func:`correlation_permutation_p`: the permutation test of Pearson r,
  pairings shuffled (one call to ``rng.permuted`` for all of them).

>>> rng = np.random.default_rng(0)
>>> means = resampled_means(values, bootstrap_indices(rng, len(values), 2000))   # [2000]
>>> low, high = percentile_interval(means)
>>> p = sign_flip_p(values, rng.choice([-1.0, 1.0], (2000, len(values))))
>>> p_r = correlation_permutation_p(x, y, permutations(rng, len(x), 2000))
>>> p_null = monte_carlo_p(simulated_r, observed_r)              # two-sided: |draw| >= |observed|
"""

from __future__ import annotations

import itertools

import numpy as np

ALTERNATIVES = ("two-sided", "greater", "less")
#: cells resampled at a time, at most (bounds memory to ``BLOCK x resamples x n`` values)
BLOCK = 256
#: the working memory of one block of :func:`resampled_means` (fewer cells a block when rows are many)
WORK_BYTES = 256 * 2**20


def block_cells(n_resamples: int, n: int, itemsize: int = 8) -> int:
    """Cells :func:`resampled_means` gathers at a time for ``n_resamples`` resamples of ``n`` rows."""
    return int(max(1, min(BLOCK, WORK_BYTES // max(1, n_resamples * n * itemsize))))


def bootstrap_indices(rng: np.random.Generator, n: int, n_resamples: int) -> np.ndarray:
    """``[n_resamples, n]`` row indices drawn with replacement (one call to ``rng.integers``)."""
    return rng.integers(0, n, (n_resamples, n))


def resampled_means(values, idx: np.ndarray) -> np.ndarray:
    """Mean of ``values`` (``[..., n]``) over each resample's rows ``idx`` (``[resamples, n]``):
    ``[..., resamples]``, in ``values``' float precision."""
    x = np.asarray(values)
    flat = x.reshape(-1, x.shape[-1])
    rows = block_cells(idx.shape[0], idx.shape[1], flat.dtype.itemsize)
    out = np.concatenate([b[:, idx].mean(-1) for b in _blocks(flat, rows)]) if len(flat) else flat[:, :0]
    return out.reshape(*x.shape[:-1], idx.shape[0])


def percentile_interval(draws, confidence: float | None = None) -> tuple:
    """The percentile interval of ``draws`` over the last axis (linear interpolation, as
    ``np.quantile``): floats for one cell, arrays for many. ``confidence=None`` is the 95% interval
    at the quantiles 0.025 and 0.975 exactly; a float ``c`` takes ``(1 - c) / 2`` and its
    complement (in floats, ``(1 - 0.95) / 2`` is 0.025000000000000022: the two spellings differ in
    the last digit of an interval, and both are kept so that saved results do not change)."""
    draws = np.asarray(draws)
    if confidence is None:
        q_low, q_high = 0.025, 0.975
    else:
        q_low = (1 - confidence) / 2
        q_high = 1 - q_low
    low, high = np.quantile(draws, q_low, axis=-1), np.quantile(draws, q_high, axis=-1)
    if draws.ndim == 1:
        return float(low), float(high)
    return low, high


def all_sign_patterns(n: int) -> np.ndarray:
    """Every one of the ``2**n`` sign patterns, ``[2**n, n]`` (for the exact test)."""
    return np.array(list(itertools.product((1.0, -1.0), repeat=n)))


def sign_flip_p(values, signs: np.ndarray, alternative: str = "two-sided", exact: bool = False) -> np.ndarray | float:
    """Sign-flip p-value that the mean of ``values`` (``[..., n]``) is zero, from the sign
    patterns ``signs`` (``[patterns, n]``): every pattern when ``exact``
    (:func:`all_sign_patterns`), else random ones (module docstring). A float for one cell."""
    if alternative not in ALTERNATIVES:
        raise ValueError(f"alternative must be one of {ALTERNATIVES}, got {alternative!r}")
    x = np.asarray(values)
    flat = x.reshape(-1, x.shape[-1])
    n = flat.shape[-1]
    signs = np.asarray(signs, dtype=flat.dtype)
    plus = 0.0 if exact else 1.0
    out = []
    for block in _blocks(flat):
        observed = block.mean(-1, keepdims=True)
        # summation-order ties count as hits
        tolerance = np.maximum(np.abs(observed) * (100 * np.finfo(block.dtype).eps), 1e-12)
        null = block @ signs.T / n  # [cells, patterns]
        if alternative == "two-sided":
            hit = np.abs(null) >= np.abs(observed) - tolerance
        elif alternative == "greater":
            hit = null >= observed - tolerance
        else:
            hit = null <= observed + tolerance
        out.append((hit.sum(-1) + plus) / (signs.shape[0] + plus))
    p = np.concatenate(out) if out else np.zeros(0)
    return float(p[0]) if x.ndim == 1 else p.reshape(x.shape[:-1])


def monte_carlo_p(null, observed: float, alternative: str = "two-sided", tolerance: float = 1e-12) -> float:
    """``(1 + hits) / (1 + n)`` of ``observed`` against ``null`` draws of the statistic (module
    docstring). A hit is a finite draw with ``|draw| >= |observed| - tolerance`` (two-sided),
    ``draw >= observed - tolerance`` (greater) or ``draw <= observed + tolerance`` (less); draws
    that are not finite are left out of hits and of ``n``. NaN when ``observed`` is not finite or no
    draw is. The two-sided test compares magnitudes, so it suits a null centred on 0 (a
    correlation, a difference); for a null centred elsewhere use a one-sided alternative."""
    if alternative not in ALTERNATIVES:
        raise ValueError(f"alternative must be one of {ALTERNATIVES}, got {alternative!r}")
    draws = np.asarray(null, dtype=float).ravel()
    draws = draws[np.isfinite(draws)]
    if not np.isfinite(observed) or not len(draws):
        return float("nan")
    if alternative == "two-sided":
        hits = np.sum(np.abs(draws) >= abs(observed) - tolerance)
    elif alternative == "greater":
        hits = np.sum(draws >= observed - tolerance)
    else:
        hits = np.sum(draws <= observed + tolerance)
    return float((1 + hits) / (1 + len(draws)))


def permutations(rng: np.random.Generator, n: int, n_perm: int) -> np.ndarray:
    """``[n_perm, n]``: each row a random ordering of ``range(n)`` (one call to ``rng.permuted``)."""
    return rng.permuted(np.tile(np.arange(n), (n_perm, 1)), axis=1)


def correlation_permutation_p(x, y, perms: np.ndarray, observed: float | None = None) -> float:
    """Two-sided permutation p of Pearson r(x, y): r recomputed with ``x`` reordered by each row
    of ``perms`` (:func:`permutations`), against ``observed`` (by default r itself), by
    :func:`monte_carlo_p`. Vectorized (one matrix product), so that a simulated null can afford
    it for thousands of studies."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    xs, ys = (x - x.mean()) / x.std(), (y - y.mean()) / y.std()
    r = float(xs @ ys) / len(x) if observed is None else observed
    return monte_carlo_p(xs[perms] @ ys / len(x), r)


def _blocks(x: np.ndarray, rows: int = BLOCK):
    for start in range(0, x.shape[0], rows):
        yield x[start : start + rows]
