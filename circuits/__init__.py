"""Circuits: activation patching, path patching and attribution patching on any ``interp.Model``.

Every analyzer takes a model handle from :func:`interp.load_model` (either backend), is
configured once, and returns tidy DataFrames from ``run`` / ``nodes`` / ``edges``:

    >>> from circuits import make_pairs, ActivationPatching, PathPatching, AttributionPatching
    >>> pairs = make_pairs(model, clean_prompts, corrupted_prompts, answer=..., wrong=...)
    >>> ActivationPatching(model, "logit_diff", sites=["resid_pre", "z"]).run(pairs)
    >>> PathPatching(model, "logit_diff", receivers=["L1H2.k", "logits"]).run(pairs)
    >>> AttributionPatching(model, "logit_diff", ig_steps=5).edges(pairs)

A circuit is tested whole: :class:`EdgePatching` patches any set of edges at once and
:class:`Faithfulness` scores the top-k circuits of any ranking against random ones (MIB's CPR and
CMD):

    >>> Faithfulness(model, "logit_diff", n_random=20).run(pairs, {"EAP-IG": edges})

Edge scores travel in MIB's graph format (:mod:`circuits.mib`), the JSON that EAP-IG and the MIB
circuit track read and write:

    >>> write_mib_graph(edges, model, "circuit.json", top_n=200); read_mib_graph("circuit.json", model)

Any of the patching analyzers with ``statistics=True`` adds per-pair uncertainty (bootstrap intervals, sign-flip
p-values; :mod:`circuits.statistics`).

:mod:`lab.experiments.induction` ships a model with a known circuit (induction heads) to check them on.
"""

from .activation_patching import PATCHABLE, ActivationPatching
from .attribution import AttributionPatching
from .components import Node, Receiver, UnknownComponentError, all_nodes, all_receivers
from .edge_patching import EdgePatching
from .faithfulness import MIB_FRACTIONS, Faithfulness
from .metrics import (
    Metric,
    MetricError,
    answer_logprob,
    answer_prob,
    as_metric,
    kl_to_clean,
    logit_diff,
)
from .mib import MIBFormatError, mib_graph, read_mib_graph, write_mib_graph
from .pairs import (
    AnswerError,
    PairLengthError,
    Pairs,
    UnknownTokenError,
    make_pairs,
    matched_pairs,
    pairs_from_template,
)
from .path_patching import PathPatching
from .plots import circuit_graph, faithfulness_plot, head_heatmap, position_heatmap
from .statistics import Uncertainty, significant
from .token_attribution import TokenAttribution, TokenAttributionError, token_figure

__all__ = [
    "MIBFormatError",
    "mib_graph",
    "read_mib_graph",
    "write_mib_graph",
    "ActivationPatching",
    "AttributionPatching",
    "TokenAttribution",
    "TokenAttributionError",
    "token_figure",
    "PathPatching",
    "PATCHABLE",
    "Node",
    "Receiver",
    "UnknownComponentError",
    "all_nodes",
    "all_receivers",
    "Metric",
    "MetricError",
    "answer_logprob",
    "answer_prob",
    "as_metric",
    "kl_to_clean",
    "logit_diff",
    "AnswerError",
    "PairLengthError",
    "Pairs",
    "UnknownTokenError",
    "make_pairs",
    "matched_pairs",
    "pairs_from_template",
    "circuit_graph",
    "head_heatmap",
    "position_heatmap",
    "Uncertainty",
    "significant",
    "EdgePatching",
    "Faithfulness",
    "MIB_FRACTIONS",
    "faithfulness_plot",
]
