"""Uncertainty for patching results: per-pair effects, bootstrap intervals, sign-flip p-values.

A patching score is a mean over prompt pairs, and a mean over 20 pairs of a quantity that
varies from pair to pair is a noisy number. With ``statistics=True`` the patching analyzers keep
every pair's value (``[cells, n_pairs]``, float32) and add to every row:

- ``effect``: the mean per-pair change from the unpatched run (``score - target_score``; for
  attribution scores, which are effects already, the score itself);
- ``stderr``: its standard error (unbiased std / sqrt(n));
- ``ci_low``, ``ci_high``: a percentile bootstrap interval of the mean effect (resampling pairs
  with replacement, ``n_resamples`` times);
- ``p_value``: a paired sign-flip permutation test of "the mean effect is zero": under the null
  each pair's effect is symmetric about zero, so flipping signs at random gives its distribution;
  exact (all ``2**n`` sign patterns) for ``n <= 12`` pairs, Monte-Carlo
  (``(hits + 1) / (n_permutations + 1)``) above;
- ``p_fdr``: the p-values adjusted for the number of cells in the table (Benjamini-Hochberg). A
  heatmap of 200 cells has about 10 cells with ``p < 0.05`` by chance alone: read ``p_fdr``, or
  mask cells whose interval covers zero *and* say that the mask is per cell.

**Small samples.** The sign-flip test is exact at any number of pairs (with 3 pairs it can never
go below 0.25); the percentile bootstrap is not: under a null it covers 0 only about 74% of the
time with 3 pairs, 88% with 8 and 93-95% from about 20 (measured; tests). So :func:`significant`,
which the heatmap masks use, calls a cell significant only when its interval excludes 0 *and*
its p-value is below ``1 - confidence``; with few pairs the p-value decides.

**Float noise.** Patched and unpatched runs are different batch shapes, so a patch that changes
nothing can differ from the baseline by ~1e-7 in the same direction for every pair, which a
sign-flip test would call significant. Per-pair effects smaller than ``atol`` are set to 0
before the statistics.

Seeds follow TransformerLens 4's convention (``transformer_lens.utilities.statistics``): a
generator keyed by SHA-256 of the seed and a label, resamples drawn 256 at a time, so the same
seed gives the same interval as ``PatchingResult.bootstrap_ci(of_effect=True)`` and
``permutation_pvalue()`` on the same pairs (tested).

The resampled means and the sign-flip test are :mod:`interp.resampling`'s, the study's too.

Cost: the per-pair values take ``4 * cells * n_pairs`` bytes; resampling works on blocks of
cells (:func:`interp.resampling.block_cells`: up to 256, fewer when pairs are many), so its
memory is bounded by the block (``block x draws x n``, about 256 MiB), not by
``cells x draws x n``. The total is checked against ``max_bytes`` before any forward pass; the
forward passes are the same as without statistics (``benchmarks/patching_statistics.py``
measures the difference).
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from interp import resampling

ALTERNATIVES = resampling.ALTERNATIVES
CHUNK = 256
EXACT_MAX_N = 12


@dataclass(frozen=True)
class Uncertainty:
    """How patching analyzers compute their statistics (``statistics=Uncertainty(...)``; ``True``
    means these defaults)."""

    n_resamples: int = 1000
    n_permutations: int = 1000
    confidence: float = 0.95
    alternative: str = "two-sided"
    seed: int = 0
    #: refuse (before running) when the per-pair values would take more than this
    max_bytes: int = 2 * 1024**3
    #: per-pair effects smaller than this are float noise between batch shapes: set to 0
    atol: float = 1e-5

    def __post_init__(self):
        if not 0 < self.confidence < 1:
            raise ValueError(f"confidence must be in (0, 1), got {self.confidence}")
        if self.n_resamples < 1 or self.n_permutations < 1:
            raise ValueError("n_resamples and n_permutations must be >= 1")
        if self.alternative not in ALTERNATIVES:
            raise ValueError(f"alternative must be one of {ALTERNATIVES}, got {self.alternative!r}")


def as_uncertainty(statistics) -> Uncertainty | None:
    """``False``/``None`` -> no statistics; ``True`` -> defaults; an :class:`Uncertainty` as is."""
    if statistics is None or statistics is False:
        return None
    if statistics is True:
        return Uncertainty()
    if isinstance(statistics, Uncertainty):
        return statistics
    raise TypeError(f"statistics must be a bool or circuits.Uncertainty(...), got {type(statistics).__name__}")


def check_memory(cells: int, n_pairs: int, config: Uncertainty, what: str) -> None:
    """Refuse before running when the kept table plus the resampling's working memory would not fit."""
    draws = max(config.n_resamples * n_pairs, 2 ** min(n_pairs, EXACT_MAX_N), config.n_permutations)
    # a block of cells' gathered draws (fewer cells a block when pairs are many), and the draws
    block = min(cells, resampling.block_cells(config.n_resamples, n_pairs, 4))
    work = 4 * block * (draws + n_pairs) + 4 * 2 * draws

    need = 4 * cells * n_pairs + work
    if need > config.max_bytes:
        raise MemoryError(
            f"{what} with statistics would keep {cells} cells x {n_pairs} pairs = {need / 1024**3:.1f} GiB of "
            f"per-pair values (limit {config.max_bytes / 1024**3:.1f} GiB): restrict the grid (layers, positions, "
            "senders), use fewer pairs, or raise Uncertainty(max_bytes=...)"
        )


def generator(seed: int, *labels) -> torch.Generator:
    """A CPU generator keyed by ``seed`` and labels (SHA-256, stable across processes)."""
    key = ":".join([str(seed), *map(str, labels)]).encode()
    value = int.from_bytes(hashlib.sha256(key).digest()[:8], "little") & 0x7FFFFFFFFFFFFFFF
    return torch.Generator(device="cpu").manual_seed(value)


def bootstrap_ci(values: torch.Tensor, config: Uncertainty) -> tuple[torch.Tensor, torch.Tensor]:
    """Percentile bootstrap interval of the mean over the last axis: ``[cells, n] -> ([cells], [cells])``
    (the draws: TransformerLens' generator; the means and interval: :mod:`interp.resampling`)."""
    x = values.float().reshape(-1, values.shape[-1])
    n = x.shape[-1]
    gen = generator(config.seed, "bootstrap", "mean")
    idx = torch.cat(
        [
            torch.randint(0, n, (min(CHUNK, config.n_resamples - start), n), generator=gen)
            for start in range(0, config.n_resamples, CHUNK)
        ]
    )
    means = resampling.resampled_means(x.numpy(), idx.numpy())  # [cells, resamples]
    low, high = resampling.percentile_interval(means, config.confidence)
    shape = values.shape[:-1]
    return torch.as_tensor(low).reshape(shape), torch.as_tensor(high).reshape(shape)


def sign_flip_p(effects: torch.Tensor, config: Uncertainty) -> torch.Tensor:
    """Sign-flip permutation p-value that the mean of each row is zero: ``[cells, n] -> [cells]``
    (exact up to :data:`EXACT_MAX_N` pairs; :func:`interp.resampling.sign_flip_p`)."""
    x = effects.float().reshape(-1, effects.shape[-1])
    n = x.shape[-1]
    exact = n <= EXACT_MAX_N
    if exact:
        signs = resampling.all_sign_patterns(n)
    else:
        gen = generator(config.seed, "permutation")
        signs = torch.cat(
            [
                torch.randint(0, 2, (min(CHUNK, config.n_permutations - s), n), generator=gen).float() * 2 - 1
                for s in range(0, config.n_permutations, CHUNK)
            ]
        ).numpy()
    p = resampling.sign_flip_p(x.numpy(), signs, config.alternative, exact=exact)
    return torch.as_tensor(np.asarray(p, dtype=np.float32)).reshape(effects.shape[:-1])


def fdr(p: np.ndarray) -> np.ndarray:
    """Benjamini-Hochberg adjusted p-values (NaN stays NaN)."""
    p = np.asarray(p, dtype=float)
    out = np.full_like(p, np.nan)
    ok = ~np.isnan(p)
    q = p[ok]
    m = len(q)
    if m == 0:
        return out
    order = np.argsort(q)
    ranked = q[order] * m / np.arange(1, m + 1)
    ranked = np.minimum.accumulate(ranked[::-1])[::-1]
    adj = np.empty(m)
    adj[order] = np.minimum(ranked, 1.0)
    out[ok] = adj
    return out


def summarize(effects: torch.Tensor, config: Uncertainty) -> pd.DataFrame:
    """The statistics columns for per-pair effects ``[cells, n]``, one row per cell."""
    x = effects.float()
    x = torch.where(x.abs() < config.atol, torch.zeros_like(x), x)
    n = x.shape[-1]
    low, high = bootstrap_ci(x, config)
    p = sign_flip_p(x, config).numpy()
    stderr = x.std(-1, correction=1) / math.sqrt(n) if n > 1 else torch.full(x.shape[:-1], float("nan"))
    return pd.DataFrame(
        {
            "effect": x.mean(-1).numpy(),
            "stderr": stderr.numpy(),
            "ci_low": low.numpy(),
            "ci_high": high.numpy(),
            "p_value": p,
            "p_fdr": fdr(p),
        }
    )


def attach(df: pd.DataFrame, effects: torch.Tensor, config: Uncertainty) -> pd.DataFrame:
    """``df`` (one row per cell, in the order of ``effects``' rows) with the statistics columns."""
    stats = summarize(effects, config)
    out = pd.concat([df.reset_index(drop=True), stats], axis=1)
    out.attrs.update(df.attrs)
    out.attrs.update(
        confidence=config.confidence,
        n_resamples=config.n_resamples,
        n_permutations=config.n_permutations,
        statistics_seed=config.seed,
        p_exact=effects.shape[-1] <= EXACT_MAX_N,
        statistics_pairs=int(effects.shape[-1]),
    )
    return out


def significant(df: pd.DataFrame, by: str = "p_value") -> pd.Series:
    """Rows whose confidence interval excludes zero *and* whose ``by`` p-value (``"p_value"``, or
    ``"p_fdr"`` for the table-wide correction) is below ``1 - confidence``: the interval alone
    is anti-conservative with few pairs (module docstring)."""
    need = ["ci_low", "ci_high", by]
    missing = [c for c in need if c not in df.columns]
    if missing:
        raise ValueError(f"no statistics in this table (missing {missing}): run the analyzer with statistics=True")
    alpha = 1 - df.attrs.get("confidence", 0.95)
    return ((df["ci_low"] > 0) | (df["ci_high"] < 0)) & (df[by] < alpha)
