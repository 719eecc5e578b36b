"""Circuits: activation patching, path patching and attribution patching on any ``interp.Model``.

Every analyzer takes a model handle from :func:`interp.load_model` (either backend), is
configured once, and returns tidy DataFrames from ``run`` / ``nodes`` / ``edges``:

    >>> from circuits import make_pairs, ActivationPatching, PathPatching, AttributionPatching
    >>> pairs = make_pairs(model, clean_prompts, corrupted_prompts, answer=..., wrong=...)
    >>> ActivationPatching(model, "logit_diff", sites=["resid_pre", "z"]).run(pairs)
    >>> PathPatching(model, "logit_diff", receivers=["L1H2.k", "logits"]).run(pairs)
    >>> AttributionPatching(model, "logit_diff", ig_steps=5).edges(pairs)

Any of them with ``statistics=True`` adds per-pair uncertainty (bootstrap intervals, sign-flip
p-values; :mod:`circuits.statistics`).

:mod:`lab.experiments.induction` ships a model with a known circuit (induction heads) to check them on.
"""
from .activation_patching import PATCHABLE, ActivationPatching
from .attribution import AttributionPatching
from .components import Node, Receiver, UnknownComponentError, all_nodes, all_receivers
from .metrics import (
    Metric,
    MetricError,
    answer_prob,
    as_metric,
    kl_to_clean,
    logit_diff,
)
from .pairs import PairLengthError, Pairs, make_pairs
from .path_patching import PathPatching
from .plots import circuit_graph, head_heatmap, position_heatmap
from .statistics import Uncertainty, significant

__all__ = [
    "ActivationPatching", "AttributionPatching", "PathPatching", "PATCHABLE", "Node", "Receiver",
    "UnknownComponentError", "all_nodes", "all_receivers", "Metric", "MetricError", "answer_prob", "as_metric",
    "kl_to_clean", "logit_diff", "PairLengthError", "Pairs", "make_pairs", "circuit_graph", "head_heatmap",
    "position_heatmap", "Uncertainty", "significant",
]
