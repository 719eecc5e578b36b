"""Jacobian analyzers: per-example Jacobians, GrokAlign alignment, the GrokAlign regularizer,
linear relational embeddings, grokking on modular addition, and analyzers over training
checkpoints.

    >>> from jacobians import jacobian, jacobian_alignment, centroid_alignment
    >>> J = jacobian(model, prompts, wrt="hook_embed", of="logits")          # [n, vocab, d_model]
    >>> centroid_alignment(model, prompts)                                  # one VJP per batch
    >>> LinearRelationalEmbedding(model, layer=1, beta=2.0).run(relation)   # faithfulness, causality
"""

from .alignment import alignment_scores, centroid_alignment, jacobian_alignment, row_cosines
from .dynamics import track, trajectory_plot
from .jacobian import JacobianError, coordinates_per_pass, jacobian, jacobian_of, vjp
from .lre import LRE, LinearRelationalEmbedding, estimate_affine
from .regularizer import GrokAlignRegularizer, projected_norm_sq

__all__ = [
    "alignment_scores",
    "centroid_alignment",
    "jacobian_alignment",
    "row_cosines",
    "track",
    "trajectory_plot",
    "JacobianError",
    "jacobian",
    "jacobian_of",
    "coordinates_per_pass",
    "vjp",
    "LRE",
    "LinearRelationalEmbedding",
    "estimate_affine",
    "GrokAlignRegularizer",
    "projected_norm_sq",
]
