"""GrokAlign's Jacobian alignment measures (Walker, Humayun, Balestriero & Baraniuk 2025).

A network is *Jacobian-aligned* at an input ``x`` when every row of its input-output Jacobian
``J_x`` (one row per output coordinate) is a multiple of ``x`` itself: locally, the network acts
like ``y ~ J_x x`` with each output reading the input along the input's own direction. GrokAlign
finds that grokked (generalizing) networks are aligned and that encouraging alignment speeds
grokking up. Measures, per example:

- ``row_cosines``: ``cos(J_x[i], x)`` for every output ``i``;
- ``alignment``: ``sum_i (J_x[i] . x_hat)^2 / ||J_x||_F^2`` -- the share of the Jacobian's energy
  along ``x`` (1 exactly when every row is a multiple of ``x``; ``1 / d_in`` for random rows);
- ``mean_abs_cosine``: the mean of ``|row_cosines|``;
- the *centroid* ``mu_x = J_x^T 1`` (one vector-Jacobian product), ``centroid_alignment =
  cos(mu_x, x)``, ``<mu_x, x>`` and ``||mu_x||``.

``x`` and the Jacobian's input side may span several positions (flattened together).
"""

from __future__ import annotations

import pandas as pd
import torch
from jaxtyping import Float

from .jacobian import batches, check_order, coordinates_per_pass, forward_with_input, jacobian_of, vjp

Tensor = torch.Tensor


def _flat(x: Tensor) -> Tensor:
    return x.reshape(x.shape[0], -1)


def row_cosines(J: Float[Tensor, "batch d_out d_in"], x: Float[Tensor, "batch d_in"]) -> Float[Tensor, "batch d_out"]:
    J = J.reshape(J.shape[0], J.shape[1], -1)
    x = _flat(x)
    return torch.nn.functional.cosine_similarity(J, x[:, None, :].expand_as(J), dim=-1, eps=1e-12)


def alignment_scores(J: Float[Tensor, "batch d_out d_in"], x: Float[Tensor, "batch d_in"]) -> pd.DataFrame:
    """Per-example alignment measures from full Jacobians (see the module docstring)."""
    J = J.reshape(J.shape[0], J.shape[1], -1).double()
    x = _flat(x).double()
    x_hat = x / x.norm(dim=-1, keepdim=True).clamp_min(1e-30)
    along = torch.einsum("boi,bi->bo", J, x_hat)
    energy = (J**2).sum((1, 2)).clamp_min(1e-30)
    cos = row_cosines(J, x)
    mu = J.sum(1)  # J^T 1
    return pd.DataFrame(
        {
            "alignment": ((along**2).sum(-1) / energy).tolist(),
            "mean_abs_cosine": cos.abs().mean(-1).tolist(),
            **centroid_columns(mu, x),
        }
    )


def centroid_columns(mu: Tensor, x: Tensor) -> dict[str, list[float]]:
    mu, x = _flat(mu).double(), _flat(x).double()
    return {
        "centroid_alignment": torch.nn.functional.cosine_similarity(mu, x, dim=-1, eps=1e-30).tolist(),
        "centroid_dot": (mu * x).sum(-1).tolist(),
        "centroid_norm": mu.norm(dim=-1).tolist(),
    }


def centroid_alignment(
    model,
    prompts,
    wrt: str = "hook_embed",
    of: str = "logits",
    wrt_position="last",
    of_position="last",
    batch_size: int = 32,
) -> pd.DataFrame:
    """``cos(mu_x, x)``, ``<mu_x, x>``, ``||mu_x||`` per prompt, from one VJP per batch."""
    x, mu = vjp(model, prompts, None, wrt, of, wrt_position, of_position, batch_size)
    return pd.DataFrame(centroid_columns(mu, x))


def jacobian_alignment(
    model,
    prompts,
    wrt: str = "hook_embed",
    of: str = "logits",
    wrt_position="last",
    of_position="last",
    batch_size: int = 16,
    x: Tensor | None = None,
) -> pd.DataFrame:
    """All alignment measures per prompt, from full per-example Jacobians."""
    check_order(model, wrt, of)
    frames = []
    for _, batch, wpos, opos in batches(model, prompts, batch_size, wrt_position, of_position):
        chunk = coordinates_per_pass(model, batch, wrt, of)
        xs, y = forward_with_input(model, batch, wrt, of, wpos, opos)
        frames.append(alignment_scores(jacobian_of(y, xs, chunk=chunk).detach(), xs.detach()))
    return pd.concat(frames, ignore_index=True)
