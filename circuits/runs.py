"""Shared plumbing for the patching analyzers: site names, cached runs, batched metric values.

Everything here goes through ``Model.run(batch, hooks)``, so every analyzer runs unchanged on
both backends (TransformerLens ``TransformerBridge`` and nnsight).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace

import torch

from interp import memory
from interp.sites import site_name
from interp.tokens import Batch

from .metrics import Metric
from .pairs import Pairs

Tensor = torch.Tensor

#: the site vocabulary lives in :mod:`interp.sites`; ``site`` is its builder
site = site_name


def batch_of(pairs: Pairs, which: str) -> Batch:
    return pairs.clean if which == "clean" else pairs.corrupted


def tile_batch(b: Batch, k: int) -> Batch:
    rep = lambda t: t.repeat(k, *([1] * (t.dim() - 1)))  # noqa: E731
    return Batch(rep(b.input_ids), rep(b.attention_mask), rep(b.position_ids), rep(b.shift))


@torch.no_grad()
def cache(model, batch: Batch, sites) -> dict[str, Tensor]:
    """Activations at ``sites`` for one batch (no gradients)."""
    out: dict[str, Tensor] = {}

    def reader(name):
        def fn(act):
            out[name] = act.detach().clone()

        return fn

    with torch.no_grad():  # a read: no graph kept for the weights' gradients
        model.run(batch, {s: reader(s) for s in sites}, stop_early=True)
    return out


def last_logits(logits: Tensor, pairs: Pairs) -> Tensor:
    idx = pairs.last.to(logits.device)
    return logits[torch.arange(len(idx), device=logits.device), idx]


def prepare(model, pairs: Pairs, metric: Metric) -> Pairs:
    """Fill in what a metric needs from the clean run (its last-token logits, for KL), after
    checking that the one pass over every clean prompt fits."""
    metric.check(pairs)
    if metric.needs_clean_logits and pairs.clean_logits is None:
        memory.check_fits(
            memory.forward_bytes(model, len(pairs), pairs.n_pos, graph=False),
            model,
            f"the clean run of all {len(pairs)} pairs x {pairs.n_pos} positions (metric {metric.name!r} reads it)",
            "use fewer or shorter pairs, or a metric that does not read the clean run",
        )
        with torch.no_grad():
            logits = model.run(pairs.clean)
        pairs = replace(pairs, clean_logits=last_logits(logits, pairs).detach())
    return pairs


def blocks(logits: Tensor, pairs: Pairs, metric: Metric, k: int) -> Tensor:
    """Metric of ``k`` stacked copies of ``pairs`` (rows copy-major) -> ``[k, n]``."""
    n = len(pairs)
    return torch.stack([metric.reduce(logits[i * n : (i + 1) * n], pairs) for i in range(k)])


@torch.no_grad()
def metric_of(model, batch: Batch, pairs: Pairs, metric: Metric, hooks: Mapping[str, Callable] | None = None) -> Tensor:
    return metric.reduce(model.run(batch, hooks), pairs).detach()


def resolve_direction(direction: str) -> tuple[str, str]:
    """``"clean_into_corrupted"`` -> run the corrupted input, patch clean values in (target, source)."""
    table = {"clean_into_corrupted": ("corrupted", "clean"), "corrupted_into_clean": ("clean", "corrupted")}
    if direction not in table:
        raise ValueError(f"direction must be one of {sorted(table)}, got {direction!r}")
    return table[direction]


def chunk_size(batch_size: int, n: int) -> int:
    return max(1, batch_size // max(1, n))
