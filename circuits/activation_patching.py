"""Activation patching: which activations carry the behaviour?

Run the model on one input of a clean/corrupted pair, replace one activation with its value from
the other input, and score the output with a metric (Meng et al. 2022; Wang et al. 2022). With
``direction="clean_into_corrupted"`` (denoising) the corrupted run gets a clean activation and
a high score means the activation is *sufficient* to restore the behaviour; with
``"corrupted_into_clean"`` (noising) the clean run gets a corrupted activation and a drop means
it is *necessary*.

Patchable sites: the residual stream (``resid_pre``, ``resid_mid``, ``resid_post``), block
outputs (``attn_out``, ``mlp_out``) and, per head, the head output ``z`` and its ``q``, ``k``,
``v`` — each at every position separately (``by_position=True``) or at all positions at once.

Implementation: instead of one forward pass per patch, ``K`` patches are stacked along the batch
(``K`` copies of the pairs, each copy with its own patch applied by a mask), so a sweep over all
``layer x head x position`` cells costs ``cells / K`` forward passes. Results equal
TransformerLens' ``patching.get_act_patch_*`` functions (tested).

    >>> ap = ActivationPatching(model, metric="logit_diff", sites=["resid_pre", "z"])
    >>> df = ap.run(pairs)          # columns: site, layer, head, position, score, normalized

With ``statistics=True`` every row also carries the per-pair effect's mean, standard error,
bootstrap interval and sign-flip p-value (:mod:`circuits.statistics`), and ``ap.per_pair_``
holds the per-pair scores ``[cells, n_pairs]`` (rows in the table's order) with
``ap.baseline_`` the unpatched run's ``[n_pairs]``.
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence

import pandas as pd
import torch

from interp import memory
from interp.progress import progress_bar
from interp.sites import HEAD_KINDS, SHORT_KINDS

from .metrics import as_metric
from .pairs import Pairs
from .runs import (
    batch_of,
    blocks,
    cache,
    chunk_size,
    metric_of,
    prepare,
    resolve_direction,
    site,
    tile_batch,
)
from .statistics import as_uncertainty, attach, check_memory

PATCHABLE = ("resid_pre", "resid_mid", "resid_post", "attn_out", "mlp_out", "z", "q", "k", "v")


class ActivationPatching:
    """Patch activations between clean and corrupted runs, one cell at a time, many cells a pass.

    Parameters
    ----------
    model : interp.Model
    metric : name (``"logit_diff"``, ``"answer_prob"``, ``"kl_to_clean"``), Metric or function
    sites : site kinds among :data:`PATCHABLE`
    by_position : patch each position separately (else all positions at once)
    direction : ``"clean_into_corrupted"`` (default) or ``"corrupted_into_clean"``
    layers, positions : restrict the grid (default: all)
    batch_size : rows per forward pass (patches x pairs)
    statistics : keep per-pair values and add effect, stderr, ci_low, ci_high, p_value, p_fdr
        (``True`` or a :class:`circuits.Uncertainty`)
    """

    def __init__(
        self,
        model,
        metric="logit_diff",
        sites: Sequence[str] = ("resid_pre",),
        by_position: bool = True,
        direction: str = "clean_into_corrupted",
        layers: Sequence[int] | None = None,
        positions: Sequence[int] | None = None,
        batch_size: int = 256,
        progress: bool | None = None,
        statistics=False,
    ):
        self.model = model
        self.metric = metric
        self.sites = sites
        self.by_position = by_position
        self.direction = direction
        self.layers = layers
        self.positions = positions
        self.batch_size = batch_size
        self.progress = progress
        self.statistics = statistics

    def _validate(self) -> None:
        """Check the configuration against the model; derived state ends in ``_``."""
        model = self.model
        self.metric_ = as_metric(self.metric)
        sites = [self.sites] if isinstance(self.sites, str) else list(self.sites)
        for s in sites:
            if s not in PATCHABLE:
                near = difflib.get_close_matches(s, PATCHABLE, n=2, cutoff=0.4)
                raise ValueError(
                    f"cannot patch site kind {s!r}; choose from {list(PATCHABLE)}"
                    + (f" (did you mean {near[0]!r}?)" if near else "")
                )
            if site(s, 0) not in model.sites:
                raise ValueError(
                    f"this model has no {s!r} site ({SHORT_KINDS[s]}); e.g. blocks with parallel attention "
                    "and MLP have no resid_mid"
                )
        self.sites_ = sites
        self.target_, self.source_ = resolve_direction(self.direction)
        self.layers_ = list(range(model.n_layers)) if self.layers is None else list(self.layers)
        bad = [lyr for lyr in self.layers_ if not 0 <= lyr < model.n_layers]
        if bad:
            raise ValueError(f"layers {bad} out of range: the model has layers 0..{model.n_layers - 1}")
        self.positions_ = None if self.positions is None else list(self.positions)
        self.uncertainty_ = as_uncertainty(self.statistics)

    def _cells(self, kind: str, n_pos: int, n_heads_at: dict[int, int]) -> list[tuple]:
        positions = self.positions_ if self.positions_ is not None else list(range(n_pos))
        cells = []
        for layer in self.layers_:
            heads = range(n_heads_at[layer]) if kind in HEAD_KINDS else [None]
            for head in heads:
                for pos in positions if self.by_position else [None]:
                    cells.append((layer, head, pos))
        return cells

    def run(self, pairs: Pairs) -> pd.DataFrame:
        """Score every cell, averaged over all pairs; a tidy DataFrame with one row per cell."""
        self._validate()
        self._check_memory(pairs)
        pairs = prepare(self.model, pairs, self.metric_)
        target_score = source_score = 0.0
        sums: dict[tuple, float] = {}
        kept: dict[tuple, list[torch.Tensor]] = {}  # per-pair scores, with statistics
        baseline: list[torch.Tensor] = []
        n_total = len(pairs)
        if self.uncertainty_ is not None:
            n_cells = 0
            for kind in self.sites_:
                heads = self.model.n_kv_heads if kind in ("k", "v") else self.model.n_heads
                n_cells += len(
                    self._cells(kind, pairs.n_pos, {lyr: heads if kind in HEAD_KINDS else 1 for lyr in self.layers_})
                )
            check_memory(n_cells, n_total, self.uncertainty_, "activation patching")
        parts = list(pairs.batches(self.batch_size))
        bar = progress_bar(
            total=len(parts) * len(self.sites_), desc="activation patching", unit="site batches", progress=self.progress
        )
        for part in parts:
            target, source = batch_of(part, self.target_), batch_of(part, self.source_)
            unpatched = metric_of(self.model, target, part, self.metric_)
            baseline.append(unpatched.float().cpu())
            target_score += float(unpatched.sum())
            source_score += float(metric_of(self.model, source, part, self.metric_).sum())
            for kind in self.sites_:
                names = {layer: site(kind, layer) for layer in self.layers_}
                src = cache(self.model, source, list(names.values()))
                n_heads_at = {layer: src[names[layer]].shape[2] if kind in HEAD_KINDS else 1 for layer in self.layers_}
                cells = self._cells(kind, part.n_pos, n_heads_at)
                k_max = chunk_size(self.batch_size, len(part))
                for i in range(0, len(cells), k_max):
                    chunk = cells[i : i + k_max]
                    scores = self._patched(part, target, src, names, kind, chunk)
                    for cell, s, row in zip(chunk, scores.sum(-1).tolist(), scores):
                        key = (kind, *cell)
                        sums[key] = sums.get(key, 0.0) + s
                        if self.uncertainty_ is not None:
                            kept.setdefault(key, []).append(row.float().cpu())
                bar.update(1)
        bar.close()
        target_score /= n_total
        source_score /= n_total
        rows = []
        span = source_score - target_score
        for key in sums:  # insertion order: site, layer, head, position
            kind, layer, head, pos = key
            score = sums[key] / n_total
            rows.append(
                {
                    "site": kind,
                    "layer": layer,
                    "head": head,
                    "position": pos,
                    "score": score,
                    "normalized": (score - target_score) / span if span != 0 else float("nan"),
                }
            )
        df = pd.DataFrame(rows)
        for col in ("head", "position"):
            df[col] = df[col].astype("Int64")
        df.attrs.update(
            metric=self.metric_.name,
            direction=self.direction,
            n_pairs=n_total,
            target_score=target_score,
            source_score=source_score,
            clean_score=target_score if self.target_ == "clean" else source_score,
            corrupted_score=source_score if self.target_ == "clean" else target_score,
        )
        if self.uncertainty_ is not None:
            self.baseline_ = torch.cat(baseline)
            self.per_pair_ = torch.stack([torch.cat(kept[key]) for key in sums])
            df = attach(df, self.per_pair_ - self.baseline_, self.uncertainty_)
        return df

    def _check_memory(self, pairs: Pairs) -> None:
        """Refuse before any pass if one pass, the source run's cache of one site kind (every
        layer) and the hook's tiled source rows would not fit."""
        model, n = self.model, min(self.batch_size, len(pairs))
        positions = pairs.n_pos if self.positions_ is None else len(self.positions_)
        cells = len(self.layers_) * model.n_heads * (positions if self.by_position else 1)  # at most
        rows = max(n, min(self.batch_size, n * cells))  # patches x pairs per pass
        need = (
            memory.forward_bytes(model, rows, pairs.n_pos, graph=False)
            + memory.activation_bytes(model, n, pairs.n_pos, sites=len(self.layers_))
            + memory.activation_bytes(model, rows, pairs.n_pos, sites=2)
        )
        memory.check_fits(
            need,
            model,
            f"activation patching of {len(self.layers_)} layers on passes of {rows} rows x {pairs.n_pos} positions",
            f"use a smaller batch_size (now {self.batch_size} rows per pass), fewer layers (layers=[...]) "
            "or shorter prompts",
        )

    @torch.no_grad()
    def _patched(self, part: Pairs, target, src, names, kind: str, chunk: list[tuple]) -> torch.Tensor:
        """Metric ``[K, n]`` with the ``K`` cells of ``chunk`` patched, one per copy of the pairs."""
        k, n = len(chunk), len(part)
        head_kind = kind in HEAD_KINDS
        hooks = {}
        for layer in sorted({c[0] for c in chunk}):
            name = names[layer]
            source_act = src[name]
            mask = torch.zeros((k,) + tuple(source_act.shape[1 : 3 if head_kind else 2]), dtype=torch.bool)
            for row, (lyr, head, pos) in enumerate(chunk):
                if lyr != layer:
                    continue
                p = slice(None) if pos is None else pos
                if head_kind:
                    mask[row, p, head] = True
                else:
                    mask[row, p] = True

            def hook(act, mask=mask, source_act=source_act):
                m = mask.to(act.device).repeat_interleave(n, dim=0)
                while m.dim() < act.dim():
                    m = m.unsqueeze(-1)
                src_rows = source_act.to(act.device, act.dtype).repeat(k, *([1] * (act.dim() - 1)))
                return torch.where(m, src_rows, act)

            hooks[name] = hook
        logits = self.model.run(tile_batch(target, k), hooks)
        return blocks(logits, part, self.metric_, k)
