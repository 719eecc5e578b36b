"""In-context linear regression with task vectors from a union of subspaces (Kwon et al. 2026).

A prompt is ``(x_1, y_1, ..., x_k, y_k, x_query)`` with ``x_i ~ N(0, I_d)`` and ``y_i = <w, x_i>``
for a task vector ``w`` that is fixed within the prompt; a transformer trained on many prompts
learns to regress in context. The seed paper's question: if training task vectors come from a
*union* of low-dimensional subspaces, does the model generalize across their span (to tasks
with zero training density), and does training on one isolated subspace fail to? Here both
conditions are trained on CPU in seconds, tested in and out of distribution, and the task vector
is probed in the residual stream at the query token (ridge regression per layer, held-out R^2):
is ``w`` linearly readable where the model needs it?

    >>> task = SubspaceTasks(d=8, n_subspaces=2, rank=2, seed=0)
    >>> model, log = train_icl(task, train_on=[0, 1])        # union of both subspaces
    >>> evaluate_icl(model, task)                            # MSE per test distribution
    >>> task_vector_readability(model, task)                 # probe R^2 per layer
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pandas as pd
import torch
from torch import nn

from interp.training import TrainingLoop, seed_torch


@dataclass
class SubspaceTasks:
    """Task vectors from ``n_subspaces`` mutually orthogonal ``rank``-dim subspaces of R^d."""

    d: int = 8
    n_subspaces: int = 2
    rank: int = 2
    n_examples: int = 16
    seed: int = 0

    def __post_init__(self):
        if self.n_subspaces * self.rank > self.d:
            raise ValueError(f"{self.n_subspaces} orthogonal subspaces of rank {self.rank} do not fit in R^{self.d}")
        g = torch.Generator().manual_seed(self.seed)
        q, _ = torch.linalg.qr(torch.randn(self.d, self.d, generator=g))
        self.bases = [q[:, i * self.rank : (i + 1) * self.rank] for i in range(self.n_subspaces)]

    def task_vectors(self, n: int, source, generator: torch.Generator) -> torch.Tensor:
        """``n`` task vectors: ``source`` a subspace index, a list of them (union: each vector from one,
        uniformly), ``"span"`` (a sum of components from every subspace, norm-matched), or ``"full"``."""
        if source == "full":
            return torch.randn(n, self.d, generator=generator) * (self.rank / self.d) ** 0.5
        if source == "span":
            parts = [torch.randn(n, self.rank, generator=generator) @ b.T for b in self.bases]
            return sum(parts) / len(parts) ** 0.5
        choices = [source] if isinstance(source, int) else list(source)
        which = torch.tensor(choices)[torch.randint(len(choices), (n,), generator=generator)]
        coef = torch.randn(n, self.rank, generator=generator)
        basis = torch.stack(self.bases)[which]  # [n, d, rank]
        return torch.einsum("ndr,nr->nd", basis, coef)

    def batch(self, n: int, source, generator: torch.Generator):
        """``(tokens [n, 2k + 1, d + 1], y [n, k + 1], w [n, d])``; x tokens ``[x, 0]``, y tokens ``[0, y]``."""
        w = self.task_vectors(n, source, generator)
        k = self.n_examples
        x = torch.randn(n, k + 1, self.d, generator=generator)
        y = torch.einsum("nkd,nd->nk", x, w)
        tokens = torch.zeros(n, 2 * k + 1, self.d + 1)
        tokens[:, 0::2, : self.d] = x
        tokens[:, 1::2, self.d] = y[:, :k]
        return tokens, y, w


class ICLTransformer(nn.Module):
    """A small pre-norm causal transformer over real-valued tokens; ``forward`` returns the
    prediction at every x position and the residual stream after each block."""

    def __init__(self, d_in: int, d_model: int = 64, n_layers: int = 3, n_heads: int = 4, n_ctx: int = 64):
        super().__init__()
        self.read_in = nn.Linear(d_in, d_model)
        self.pos = nn.Parameter(torch.randn(n_ctx, d_model) * 0.02)
        self.blocks = nn.ModuleList(
            nn.TransformerEncoderLayer(d_model, n_heads, 4 * d_model, dropout=0.0, batch_first=True, norm_first=True)
            for _ in range(n_layers)
        )
        self.read_out = nn.Linear(d_model, 1)

    def forward(self, tokens: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
        t = tokens.shape[1]
        h = self.read_in(tokens) + self.pos[:t]
        mask = nn.Transformer.generate_square_subsequent_mask(t, device=tokens.device)
        resid = [h]
        for block in self.blocks:
            h = block(h, src_mask=mask, is_causal=True)
            resid.append(h)
        return self.read_out(h[:, 0::2]).squeeze(-1), resid


def train_icl(
    task: SubspaceTasks,
    train_on: Sequence[int] | int | str,
    steps: int = 1500,
    batch_size: int = 64,
    lr: float = 1e-3,
    seed: int = 0,
    d_model: int = 64,
    n_layers: int = 3,
) -> tuple[ICLTransformer, pd.DataFrame]:
    """Train on prompts whose task vectors come from ``train_on``; returns the model and a loss log."""
    seed_torch(seed)
    model = ICLTransformer(task.d + 1, d_model, n_layers, n_ctx=2 * task.n_examples + 1)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    g = torch.Generator().manual_seed(seed + 1)
    model.train()
    loop = TrainingLoop(steps, desc="in-context regression", progress=False)
    for step in loop:
        tokens, y, _ = task.batch(batch_size, train_on, g)
        pred, _ = model(tokens)
        loss = nn.functional.mse_loss(pred, y)
        loop.optimize(loss, opt)
        if loop.logging(step):
            loop.log(step, loss=loss.item())
    model.eval()
    return model, pd.DataFrame(loop.rows).drop(columns="seconds")


@torch.no_grad()
def evaluate_icl(
    model: ICLTransformer, task: SubspaceTasks, sources: dict | None = None, n: int = 2000, seed: int = 123
) -> pd.DataFrame:
    """Query-token MSE per test distribution, normalized by the prediction-free baseline E[y^2]."""
    sources = sources or {**{f"subspace {i}": i for i in range(task.n_subspaces)}, "span": "span", "full": "full"}
    rows = []
    for name, src in sources.items():
        g = torch.Generator().manual_seed(seed)
        tokens, y, _ = task.batch(n, src, g)
        pred, _ = model(tokens)
        mse = nn.functional.mse_loss(pred[:, -1], y[:, -1]).item()
        rows.append({"test": name, "mse": mse, "normalized_mse": mse / y[:, -1].pow(2).mean().item()})
    return pd.DataFrame(rows)


@torch.no_grad()
def task_vector_readability(
    model: ICLTransformer, task: SubspaceTasks, source="span", n: int = 2000, alpha: float = 1.0, seed: int = 7
) -> pd.DataFrame:
    """Held-out R^2 of a ridge probe from the residual stream at the query token to ``w``, per layer."""
    from sklearn.linear_model import Ridge
    from sklearn.metrics import r2_score

    g = torch.Generator().manual_seed(seed)
    tokens, _, w = task.batch(n, source, g)
    _, resid = model(tokens)
    half = n // 2
    rows = []
    for layer, h in enumerate(resid):
        feats = h[:, -1].numpy()
        probe = Ridge(alpha=alpha).fit(feats[:half], w[:half].numpy())
        rows.append({"layer": layer, "r2": float(r2_score(w[half:].numpy(), probe.predict(feats[half:])))})
    return pd.DataFrame(rows)


def compare_conditions(task: SubspaceTasks, steps: int = 1500, seed: int = 0) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Train on the union of all subspaces and on subspace 0 alone; MSE and probe tables per condition."""
    union = list(range(task.n_subspaces))
    evals, probes = [], []
    for name, src in (("union", union), ("single subspace", 0)):
        model, _ = train_icl(task, src, steps=steps, seed=seed)
        evals.append(evaluate_icl(model, task).assign(trained_on=name))
        probes.append(task_vector_readability(model, task).assign(trained_on=name))
    return pd.concat(evals, ignore_index=True), pd.concat(probes, ignore_index=True)


__all__ = [
    "SubspaceTasks",
    "ICLTransformer",
    "train_icl",
    "evaluate_icl",
    "task_vector_readability",
    "compare_conditions",
]
