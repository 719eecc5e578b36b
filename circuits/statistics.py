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

Seeds follow TransformerLens 4's convention (``transformer_lens.utilities.statistics``): a
generator keyed by SHA-256 of the seed and a label, resamples drawn 256 at a time, so the same
seed gives the same interval as ``PatchingResult.bootstrap_ci(of_effect=True)`` and
``permutation_pvalue()`` on the same pairs (tested).

Cost: the per-pair values take ``4 * cells * n_pairs`` bytes (checked against ``max_bytes``
before any forward pass); the forward passes are the same as without statistics
(``benchmarks/patching_statistics.py`` measures the difference).
"""
from __future__ import annotations

import hashlib
import itertools
import math
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

ALTERNATIVES = ("two-sided", "greater", "less")
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
    need = 4 * cells * n_pairs
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
    """Percentile bootstrap interval of the mean over the last axis: ``[cells, n] -> ([cells], [cells])``."""
    x = values.float()
    n = x.shape[-1]
    gen = generator(config.seed, "bootstrap", "mean")
    means = []
    for start in range(0, config.n_resamples, CHUNK):
        count = min(CHUNK, config.n_resamples - start)
        idx = torch.randint(0, n, (count, n), generator=gen)
        means.append(x[..., idx].mean(-1))  # [cells, count]
    draws = torch.cat(means, -1)
    tail = (1 - config.confidence) / 2
    return torch.quantile(draws, tail, dim=-1), torch.quantile(draws, 1 - tail, dim=-1)


def sign_flip_p(effects: torch.Tensor, config: Uncertainty) -> torch.Tensor:
    """Sign-flip permutation p-value that the mean of each row is zero: ``[cells, n] -> [cells]``."""
    x = effects.float()
    n = x.shape[-1]
    observed = x.mean(-1, keepdim=True)
    tolerance = observed.abs() * (100 * torch.finfo(x.dtype).eps)  # summation-order ties count as hits

    def hits(signs: torch.Tensor) -> torch.Tensor:
        null = (x.unsqueeze(-2) * signs).mean(-1)  # [cells, patterns]
        if config.alternative == "two-sided":
            hit = null.abs() >= observed.abs() - tolerance
        elif config.alternative == "greater":
            hit = null >= observed - tolerance
        else:
            hit = null <= observed + tolerance
        return hit.sum(-1).to(x.dtype)

    if n <= EXACT_MAX_N:
        signs = torch.tensor(list(itertools.product((1.0, -1.0), repeat=n)), dtype=x.dtype)
        return hits(signs) / signs.shape[0]
    gen = generator(config.seed, "permutation")
    total = torch.zeros(x.shape[:-1], dtype=x.dtype)
    for start in range(0, config.n_permutations, CHUNK):
        count = min(CHUNK, config.n_permutations - start)
        signs = torch.randint(0, 2, (count, n), generator=gen).to(x.dtype) * 2 - 1
        total += hits(signs)
    return (total + 1) / (config.n_permutations + 1)


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
    n = x.shape[-1]
    low, high = bootstrap_ci(x, config)
    p = sign_flip_p(x, config).numpy()
    stderr = x.std(-1, unbiased=True) / math.sqrt(n) if n > 1 else torch.full(x.shape[:-1], float("nan"))
    return pd.DataFrame({"effect": x.mean(-1).numpy(), "stderr": stderr.numpy(), "ci_low": low.numpy(),
                         "ci_high": high.numpy(), "p_value": p, "p_fdr": fdr(p)})


def attach(df: pd.DataFrame, effects: torch.Tensor, config: Uncertainty) -> pd.DataFrame:
    """``df`` (one row per cell, in the order of ``effects``' rows) with the statistics columns."""
    stats = summarize(effects, config)
    out = pd.concat([df.reset_index(drop=True), stats], axis=1)
    out.attrs.update(df.attrs)
    out.attrs.update(confidence=config.confidence, n_resamples=config.n_resamples,
                     n_permutations=config.n_permutations, statistics_seed=config.seed,
                     p_exact=effects.shape[-1] <= EXACT_MAX_N)
    return out


def significant(df: pd.DataFrame) -> pd.Series:
    """Rows whose confidence interval excludes zero (needs ``ci_low`` / ``ci_high``)."""
    missing = [c for c in ("ci_low", "ci_high") if c not in df.columns]
    if missing:
        raise ValueError(f"no confidence intervals in this table (missing {missing}): run the analyzer with "
                         "statistics=True")
    return (df["ci_low"] > 0) | (df["ci_high"] < 0)
