"""The GrokAlign regularizer: a drop-in loss term that penalizes the Jacobian's Frobenius norm.

    loss = task_loss + lam * mean_batch ||J_x||_F

``||J_x||_F`` is estimated with one random projection per example: for ``v`` uniform on the unit
sphere of the ``C``-dimensional output space, ``E[C ||v^T J_x||^2] = ||J_x||_F^2`` exactly
(unbiased for the squared norm), and ``v^T J_x`` is one vector-Jacobian product. The estimate
``sqrt(C ||v^T J_x||^2)`` is backpropagated (``create_graph=True``), so the penalty's gradient
reaches the weights. lam = 1e-3 in the paper's transformer and MNIST runs.

It needs the double backward of everything between ``x`` and the outputs; PyTorch's fused CPU
attention kernel has none, so compute attention by the math path
(``torch.nn.attention.sdpa_kernel(SDPBackend.MATH)``) or explicitly.

    >>> reg = GrokAlignRegularizer(lam=1e-3)
    >>> x = embed(tokens)                     # [batch, ..., d]; must be part of the graph
    >>> logits = rest_of_model(x)             # [batch, C]
    >>> loss = task_loss + reg(logits, x)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from jaxtyping import Float

Tensor = torch.Tensor


def projected_norm_sq(
    outputs: Float[Tensor, "batch C"],
    inputs: Tensor,
    n_proj: int = 1,
    generator: torch.Generator | None = None,
    create_graph: bool = True,
) -> Float[Tensor, " batch"]:
    """Unbiased estimate of ``||J||_F^2`` per example: ``C ||v^T J||^2`` averaged over ``n_proj`` draws."""
    if outputs.dim() != 2:
        raise ValueError(f"outputs must be [batch, C] (e.g. last-position logits), got shape {tuple(outputs.shape)}")
    if not inputs.requires_grad:
        raise ValueError("inputs must be part of the autograd graph (requires_grad) so the Jacobian exists")
    c = outputs.shape[1]
    total = outputs.new_zeros(outputs.shape[0])
    for _ in range(n_proj):
        v = torch.randn(outputs.shape, generator=generator, dtype=outputs.dtype).to(outputs.device)
        v = v / v.norm(dim=-1, keepdim=True)
        (g,) = torch.autograd.grad(outputs, inputs, grad_outputs=v, create_graph=create_graph, retain_graph=True)
        total = total + c * g.reshape(g.shape[0], -1).pow(2).sum(-1)
    return total / n_proj


@dataclass
class GrokAlignRegularizer:
    """``lam * mean_batch ||J_x||_F`` with the random-projection estimator (differentiable)."""

    lam: float = 1e-3
    n_proj: int = 1
    squared: bool = False  # penalize the (unbiased) squared norm instead of the norm

    def __call__(self, outputs: Tensor, inputs: Tensor, generator: torch.Generator | None = None) -> Tensor:
        sq = projected_norm_sq(outputs, inputs, self.n_proj, generator)
        per = sq if self.squared else sq.clamp_min(1e-12).sqrt()
        return self.lam * per.mean()
