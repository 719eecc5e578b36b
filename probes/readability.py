"""Readability: how linearly decodable a relation's answer is, per layer and at its best layer.

The one definition every part of the toolkit uses (the study, the world report, the figures).
From a :class:`~probes.ProbeSweep` run (its table, one row per relation x site x fold x seed, and
its ``readout_``, every test subject's cross-validated prediction):

- :func:`readability_by_layer`: one row per (relation, layer): mean probe accuracy over folds,
  Cohen's kappa of the pooled cross-validated predictions (chance-corrected, :mod:`probes.chance`),
  the three chance levels of the probed subjects, the shuffled-label control's accuracy and the
  selectivity (and ``mlp_kappa`` / ``knn_kappa``, the same kappa of the nonlinear probes, when the
  sweep ran them: :mod:`probes.nonlinear`);
- :func:`best_layers`: each relation's best layer, the highest kappa (lowest layer on ties);
- :func:`best_layer_readability`: one row per relation at its best layer, the relation's *readability*.

For states already in hand (not a sweep over a model's layers), :func:`probe_kappa` is the same
measure in one call: the kappa of a standardized logistic probe, cross-validated (stratified
k-fold) or trained on one set and tested on another. :func:`probes.erasure.erased_probe_kappa`
is its twin on erased states.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import StratifiedKFold, cross_val_predict
from sklearn.pipeline import Pipeline, make_pipeline
from sklearn.preprocessing import StandardScaler

from .chance import chance_levels, kappa
from .nonlinear import NONLINEAR


def standardized_logistic(C: float = 1.0) -> Pipeline:
    """The readability probe on states in hand: ``StandardScaler() + LogisticRegression(C)``."""
    return make_pipeline(StandardScaler(), LogisticRegression(C=C, max_iter=2000))


def frequent(y: Sequence, folds: int) -> np.ndarray:
    """Mask of the rows whose label occurs at least ``folds`` times (stratified k-fold needs them)."""
    y = np.asarray(y)
    counts = pd.Series(y).value_counts()
    return np.isin(y, counts[counts >= folds].index)


def probe_kappa(
    x_fit: np.ndarray,
    y_fit: Sequence,
    x_test: np.ndarray | None = None,
    y_test: Sequence | None = None,
    folds: int = 5,
    seed: int = 0,
) -> float:
    """Kappa of a standardized logistic probe: cross-validated on ``(x_fit, y_fit)`` (stratified
    ``folds``-fold, shuffled with ``seed``), or trained there and tested on ``(x_test, y_test)``.
    Answers rarer than ``folds`` are left out of cross-validation; NaN when fewer than 2 remain."""
    y_fit = np.asarray(y_fit)
    probe = standardized_logistic()
    if x_test is None:
        keep = frequent(y_fit, folds)
        if len(set(y_fit[keep])) < 2:
            return float("nan")
        cv = StratifiedKFold(folds, shuffle=True, random_state=seed)
        pred = cross_val_predict(probe, x_fit[keep], y_fit[keep], cv=cv)
        return kappa(list(y_fit[keep]), list(pred))
    probe.fit(x_fit, y_fit)
    return kappa(list(y_test), list(probe.predict(x_test)))


def readability_by_layer(table: pd.DataFrame, readout: pd.DataFrame) -> pd.DataFrame:
    """One row per (relation, layer): mean probe accuracy over folds, Cohen's kappa of the pooled
    cross-validated predictions, the three chance levels of the probed subjects, the shuffled-label
    control's accuracy and the selectivity."""
    mean = table.groupby(["relation", "layer"])[["accuracy", "control_accuracy", "selectivity"]].mean()
    rows = []
    first_seed = readout.seed.min()
    for (rel, layer), g in readout[readout.seed == first_seed].groupby(["relation", "layer"], sort=False):
        levels = chance_levels(list(g.answer))
        m = mean.loc[(rel, layer)]
        rows.append(
            {
                "relation": rel,
                "layer": int(layer),
                "accuracy": float(m.accuracy),
                "kappa": kappa(list(g.answer), list(g.predicted)),
                "chance_uniform": levels["uniform"],
                "chance_prior": levels["prior"],
                "chance_majority": levels["majority"],
                "control_accuracy": float(m.control_accuracy),
                "selectivity": float(m.selectivity),
                "n_subjects": len(g),
                **{
                    f"{name}_kappa": kappa(list(g.answer), list(g[f"{name}_predicted"]))
                    for name in NONLINEAR
                    if f"{name}_predicted" in g
                },
            }
        )
    return pd.DataFrame(rows)


def best_layers(layers: pd.DataFrame) -> dict[str, int]:
    """Each relation's best layer: the highest probe kappa (the lowest layer on ties)."""
    out = {}
    for rel, g in layers.groupby("relation", sort=False):
        g = g.sort_values("layer")
        out[rel] = (
            int(g.layer.iloc[int(np.nanargmax(g.kappa.to_numpy()))]) if g.kappa.notna().any() else int(g.layer.iloc[0])
        )
    return out


def best_layer_readability(layers: pd.DataFrame) -> pd.DataFrame:
    """One row per relation: its :func:`readability_by_layer` row at its :func:`best_layers` layer."""
    best = best_layers(layers)
    rows = [layers[(layers.relation == rel) & (layers.layer == layer)].iloc[0] for rel, layer in best.items()]
    return pd.DataFrame(rows).reset_index(drop=True)
