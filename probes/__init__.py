"""Linear probes: is a piece of information linearly readable from a model's activations?

- :class:`LinearProbe`: scikit-learn compatible multinomial logistic probe (L2);
- :func:`fit_logistic`: the batched solver behind it, fitting thousands of probes at once;
- :class:`ProbeSweep` / :func:`sweep`: relations x sites x folds x seeds, with control tasks,
  as a tidy DataFrame, plus per-subject ranked read-outs;
- :class:`DiffMeansProbe`, :class:`RidgeProbe`: difference-of-means and continuous read-outs;
- :mod:`probes.plots`: heatmaps and per-layer curves from a sweep table.
"""
from .diff_means import DiffMeansProbe
from .linear_probe import LinearProbe
from .logistic import LogisticFit, fit_logistic
from .ridge import RidgeProbe
from .sweep import ProbeSweep, sweep

__all__ = ["DiffMeansProbe", "LinearProbe", "LogisticFit", "ProbeSweep", "RidgeProbe", "fit_logistic", "sweep"]
