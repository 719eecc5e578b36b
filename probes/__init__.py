"""Linear probes: is a piece of information linearly readable from a model's activations?

- :class:`LinearProbe`: scikit-learn compatible multinomial logistic probe (L2);
- :func:`fit_logistic`: the batched solver behind it, fitting thousands of probes at once;
- :class:`ProbeSweep` / :func:`sweep`: relations x sites x folds x seeds, with control tasks,
  as a tidy DataFrame, plus per-subject ranked read-outs; ``baselines=True`` adds the readability
  of the input embeddings and of random-weight models (:mod:`probes.baselines`);
- :class:`SparseProbeSweep`: k-sparse probes on the k features (of an SAE, :mod:`interp.sae_sites`)
  that differ most between answers, ranked on each training fold only (:mod:`probes.sparse_probing`);
- :class:`DiffMeansProbe`, :class:`RidgeProbe`: difference-of-means and continuous read-outs;
- :func:`best_layer_readability` / :func:`readability_by_layer` / :func:`best_layers`: the one definition
  of a relation's readability (chance-corrected, :mod:`probes.chance`);
- :mod:`probes.plots`: heatmaps and per-layer curves from a sweep table.
"""

from .diff_means import DiffMeansProbe
from .linear_probe import LinearProbe
from .logistic import LogisticFit, fit_logistic
from .readability import best_layer_readability, best_layers, readability_by_layer
from .ridge import RidgeProbe
from .sparse_probing import SparseProbeSweep, mean_difference_ranking
from .sweep import ProbeSweep, sweep

__all__ = [
    "DiffMeansProbe",
    "LinearProbe",
    "LogisticFit",
    "ProbeSweep",
    "RidgeProbe",
    "SparseProbeSweep",
    "best_layers",
    "fit_logistic",
    "mean_difference_ranking",
    "best_layer_readability",
    "readability_by_layer",
    "sweep",
]
