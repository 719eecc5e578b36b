"""Path patching: the effect of sender components on receiver components through the direct path.

Activation patching says *which* components matter; path patching says *how they connect*
(Wang et al. 2022, IOI; Goldowsky-Dill et al. 2023). For a sender node ``u`` (an attention
head, an MLP or the embeddings) and a receiver input ``v`` (a head's query, key or value, an MLP's
input, or the final residual stream read by the unembedding):

1. cache the target run (by default the clean input) and the source run (the corrupted input);
2. run the target input with every attention head's output ``z`` frozen to its target value
   except the sender, which takes its source value. MLPs are either frozen too
   (``mlps="frozen"``) or recomputed (``mlps="recomputed"``; both variants are in use). Any change
   reaching the receiver now comes from ``u`` along the residual stream alone (and, with
   recomputed MLPs, through MLPs). Record the receiver's input (``q``/``k``/``v`` or the MLP's
   output, which is a function of its input only);
3. run the target input again, replacing only the receiver's recorded values; score the output.

The score of edge ``u -> v`` is the metric of step 3, averaged over pairs; ``normalized`` rescales
it so 0 is the unpatched target run and 1 the full source run.

Senders are batched: ``K`` senders ride in one forward pass as ``K`` copies of the pairs, each
copy with its own sender patched (a mask per copy), and step 3 batches (sender, receiver) rows
the same way, so all-heads path patching costs a few passes rather than one per sender.
Receivers are patched one at a time (one row per edge), or all together
(``joint_receivers=True``: one score per sender, as in the IOI paper's "heads -> name movers").

On models with grouped-query attention, keys and values are shared by a group of query heads;
the receiver ``L{l}H{h}.k`` (``h`` the group's first head) patches the group's key.

``statistics=True`` adds per-edge uncertainty over pairs (mean effect, standard error, bootstrap
interval, sign-flip p-value; :mod:`circuits.statistics`); ``per_pair_`` holds the per-pair scores.
"""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd
import torch

from interp import memory
from interp.progress import progress_bar

from .components import Node, Receiver, parse_nodes, parse_receivers
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

Tensor = torch.Tensor


def _logits_only(group: tuple[Receiver, ...]) -> bool:
    return len(group) == 1 and group[0].kind == "logits"


def receiver_site(model, r: Receiver) -> str:
    if r.kind == "head":
        return site(r.input, r.layer)
    if r.kind == "mlp":
        return site("mlp_out", r.layer)
    return site("resid_post", model.n_layers - 1)


def has_parallel_blocks(model) -> bool:
    return not any(s.endswith("hook_resid_mid") for s in model.sites)


def reaches(model, node: Node, receiver: Receiver) -> bool:
    """Does ``node`` write into the residual stream before ``receiver`` reads it?"""
    if receiver.kind == "logits":
        return True
    if node.kind == "embed":
        return True
    if node.layer < receiver.layer:
        return True
    # same layer: only an attention head feeding the MLP of a sequential block
    return (
        node.layer == receiver.layer
        and node.kind == "head"
        and receiver.kind == "mlp"
        and not has_parallel_blocks(model)
    )


def _head_index(act: Tensor, model, head: int) -> int:
    """Head ``head``'s slot in a per-head site (its key/value group under grouped-query attention)."""
    return head * act.shape[2] // model.n_heads


class PathPatching:
    """Sender -> receiver path patching, senders batched.

    Parameters
    ----------
    model : interp.Model
    metric : name, Metric or function (see :mod:`circuits.metrics`)
    senders : node names (``"embed"``, ``"L0H1"``, ``"MLP0"``) or None for every node
    receivers : receiver names (``"L1H2.k"``, ``"MLP1"``, ``"logits"``)
    mlps : ``"frozen"`` or ``"recomputed"`` in step 2
    direction : ``"corrupted_into_clean"`` (default: the clean run, senders corrupted) or
        ``"clean_into_corrupted"``
    sender_positions : patch senders only at these positions (default all)
    joint_receivers : patch all receivers together (one score per sender)
    batch_size : rows per forward pass
    statistics : ``True`` or a :class:`circuits.Uncertainty`: per-edge intervals and p-values
    """

    def __init__(
        self,
        model,
        metric="logit_diff",
        senders: Sequence | None = None,
        receivers: Sequence = ("logits",),
        mlps: str = "frozen",
        direction: str = "corrupted_into_clean",
        sender_positions: Sequence[int] | None = None,
        joint_receivers: bool = False,
        batch_size: int = 256,
        progress: bool | None = None,
        statistics=False,
    ):
        self.model = model
        self.metric = metric
        self.senders = senders
        self.receivers = receivers
        self.mlps = mlps
        self.direction = direction
        self.sender_positions = sender_positions
        self.joint_receivers = joint_receivers
        self.batch_size = batch_size
        self.progress = progress
        self.statistics = statistics

    def _validate(self) -> None:
        """Check the configuration against the model; derived state ends in ``_``."""
        if self.mlps not in ("frozen", "recomputed"):
            raise ValueError(f"mlps must be 'frozen' or 'recomputed', got {self.mlps!r}")
        self.metric_ = as_metric(self.metric)
        self.senders_ = parse_nodes(self.model, self.senders)
        self.receivers_ = parse_receivers(self.model, self.receivers)
        if not self.receivers_:
            raise ValueError("no receivers given")
        self.target_, self.source_ = resolve_direction(self.direction)
        self.sender_positions_ = None if self.sender_positions is None else list(self.sender_positions)
        self.groups_ = [tuple(self.receivers_)] if self.joint_receivers else [(r,) for r in self.receivers_]
        self.has_mlp_ = any(s.endswith("hook_mlp_out") for s in self.model.sites)
        self.uncertainty_ = as_uncertainty(self.statistics)

    # ------------------------------------------------------------------------------------------
    def run(self, pairs: Pairs) -> pd.DataFrame:
        self._validate()
        self._check_memory(pairs)
        pairs = prepare(self.model, pairs, self.metric_)
        n_total = len(pairs)
        edges = [(s, g) for s in self.senders_ for g in self.groups_ if any(reaches(self.model, s, r) for r in g)]
        if not edges:
            raise ValueError(
                "no sender writes before any receiver reads: choose senders in earlier layers than the receivers"
            )
        sums = {e: 0.0 for e in edges}
        kept: dict[tuple, list[Tensor]] = {e: [] for e in edges}
        baseline: list[Tensor] = []
        if self.uncertainty_ is not None:
            check_memory(len(edges), n_total, self.uncertainty_, "path patching")
        target_score = source_score = 0.0
        parts = list(pairs.batches(self.batch_size))
        senders = [s for s in self.senders_ if any(e[0] == s for e in edges)]
        bar = progress_bar(
            total=len(parts) * len(senders), desc="path patching", unit="sender batches", progress=self.progress
        )
        for part in parts:
            target, source = batch_of(part, self.target_), batch_of(part, self.source_)
            unpatched = metric_of(self.model, target, part, self.metric_)
            baseline.append(unpatched.float().cpu())
            target_score += float(unpatched.sum())
            source_score += float(metric_of(self.model, source, part, self.metric_).sum())
            names = self._frozen_sites()
            tgt, src = cache(self.model, target, names), cache(self.model, source, names)
            k_max = chunk_size(self.batch_size, len(part))
            for i in range(0, len(senders), k_max):
                chunk = senders[i : i + k_max]
                recorded, logits = self._step2(part, target, tgt, src, chunk)
                rows = [(k, g) for k, s in enumerate(chunk) for g in self.groups_ if (s, g) in sums]
                if any(_logits_only(g) for _, g in rows):
                    # the logits read the final residual, which step 2 has just computed: its own
                    # logits are what step 3 would give, with no second forward pass
                    direct = blocks(logits, part, self.metric_, len(chunk))  # [K, n]
                    for k, g in rows:
                        if _logits_only(g):
                            sums[(chunk[k], g)] += float(direct[k].sum())
                            if self.uncertainty_ is not None:
                                kept[(chunk[k], g)].append(direct[k].float().cpu())
                    rows = [(k, g) for k, g in rows if not _logits_only(g)]
                for j in range(0, len(rows), k_max):
                    sub = rows[j : j + k_max]
                    scores = self._step3(part, target, recorded, sub, len(chunk))
                    for (k, g), value, row in zip(sub, scores.sum(-1).tolist(), scores):
                        sums[(chunk[k], g)] += value
                        if self.uncertainty_ is not None:
                            kept[(chunk[k], g)].append(row.float().cpu())
                bar.update(len(chunk))
        bar.close()
        target_score /= n_total
        source_score /= n_total
        span = source_score - target_score
        out = []
        for (s, g), total in sums.items():
            score = total / n_total
            r = g[0]
            out.append(
                {
                    "sender": s.name,
                    "receiver": "+".join(x.name for x in g) if self.joint_receivers else r.name,
                    "sender_layer": s.layer,
                    "sender_head": s.head,
                    "receiver_layer": None if self.joint_receivers else r.layer,
                    "receiver_head": None if self.joint_receivers else r.head,
                    "receiver_input": None if self.joint_receivers else (r.input if r.kind == "head" else r.kind),
                    "score": score,
                    "normalized": (score - target_score) / span if span != 0 else float("nan"),
                }
            )
        df = pd.DataFrame(out)
        for col in ("sender_head", "receiver_layer", "receiver_head"):
            df[col] = df[col].astype("Int64")
        df.attrs.update(
            metric=self.metric_.name,
            direction=self.direction,
            mlps=self.mlps,
            n_pairs=n_total,
            target_score=target_score,
            source_score=source_score,
        )
        if self.uncertainty_ is not None:
            self.baseline_ = torch.cat(baseline)
            self.per_pair_ = torch.stack([torch.cat(kept[e]) for e in sums])
            df = attach(df, self.per_pair_ - self.baseline_, self.uncertainty_)
        return df

    # ------------------------------------------------------------------------------------------
    def _check_memory(self, pairs: Pairs) -> None:
        """Refuse before any pass if one pass, both runs' caches of every head's and MLP's output,
        the receivers' recorded inputs and the tiled rows would not fit."""
        model, n = self.model, min(self.batch_size, len(pairs))
        rows = max(n, min(self.batch_size, n * len(self.senders_)))
        recorded = len({receiver_site(model, r) for g in self.groups_ for r in g})
        need = (  # the sender pass's logits stay while the receivers' pass runs: a third logits tensor
            memory.forward_bytes(model, rows, pairs.n_pos, graph=False)
            + rows * pairs.n_pos * memory.vocab_size(model) * memory.element_bytes(model)
            + memory.activation_bytes(model, n, pairs.n_pos, sites=2 * len(self._frozen_sites()))
            + memory.activation_bytes(model, rows, pairs.n_pos, sites=recorded + 2)
        )
        memory.check_fits(
            need,
            model,
            f"path patching on passes of {rows} rows x {pairs.n_pos} positions",
            f"use a smaller batch_size (now {self.batch_size} rows per pass), fewer receivers or shorter prompts",
        )

    def _frozen_sites(self) -> list[str]:
        names = [site("z", layer) for layer in range(self.model.n_layers)]
        if self.has_mlp_:
            names += [site("mlp_out", layer) for layer in range(self.model.n_layers)]
        if any(s.kind == "embed" for s in self.senders_):
            names.append(site("embed"))
        return names

    def _pos_mask(self, n_pos: int) -> Tensor:
        m = torch.zeros(n_pos, dtype=torch.bool)
        if self.sender_positions_ is None:
            m[:] = True
        else:
            m[self.sender_positions_] = True
        return m

    @torch.no_grad()
    def _step2(self, part: Pairs, target, tgt: dict, src: dict, chunk: list[Node]) -> tuple[dict[str, Tensor], Tensor]:
        """Run the target with all heads (and frozen MLPs) at target values but the senders; record
        every receiver site. Returns site -> ``[K * n, ...]``, and the run's logits."""
        k, n, model = len(chunk), len(part), self.model
        pos = self._pos_mask(part.n_pos)
        want = {receiver_site(model, r) for g in self.groups_ for r in g}
        recorded: dict[str, Tensor] = {}

        def rows(mask_k: Tensor, act: Tensor) -> Tensor:
            """``[K, ...]`` sender mask -> ``[K * n, pos, ...]`` broadcastable to ``act``."""
            m = mask_k.repeat_interleave(n, dim=0)[:, None] & pos[None, :]
            while m.dim() < act.dim():
                m = m.unsqueeze(-1)
            return m.to(act.device)

        def tiled(t: Tensor, act: Tensor) -> Tensor:
            return t.to(act.device, act.dtype).repeat(k, *([1] * (act.dim() - 1)))

        hooks = {}
        for layer in range(model.n_layers):
            name = site("z", layer)
            heads = torch.zeros(k, tgt[name].shape[2], dtype=torch.bool)
            for i, s in enumerate(chunk):
                if s.kind == "head" and s.layer == layer:
                    heads[i, s.head] = True

            def z_hook(act, name=name, heads=heads):
                m = heads.repeat_interleave(n, dim=0)[:, None, :] & pos[None, :, None]
                m = m.unsqueeze(-1).to(act.device)
                return torch.where(m, tiled(src[name], act), tiled(tgt[name], act))

            hooks[name] = z_hook
            if self.has_mlp_:
                name = site("mlp_out", layer)
                is_sender = torch.tensor([s.kind == "mlp" and s.layer == layer for s in chunk])

                def mlp_hook(act, name=name, is_sender=is_sender):
                    if name in want:
                        recorded[name] = act.detach().clone()
                    base = tiled(tgt[name], act) if self.mlps == "frozen" else act
                    return torch.where(rows(is_sender, act), tiled(src[name], act), base)

                hooks[name] = mlp_hook
        if any(s.kind == "embed" for s in chunk):
            name = site("embed")
            is_sender = torch.tensor([s.kind == "embed" for s in chunk])
            hooks[name] = lambda act, name=name, m=is_sender: torch.where(rows(m, act), tiled(src[name], act), act)

        for name in want:
            if name in hooks:
                continue

            def record(act, name=name):
                recorded[name] = act.detach().clone()

            hooks[name] = record
        logits = model.run(tile_batch(target, k), hooks)
        return recorded, logits

    @torch.no_grad()
    def _step3(self, part: Pairs, target, recorded: dict, rows: list[tuple], k_chunk: int) -> Tensor:
        """Metric ``[R, n]`` for rows (sender index in chunk, receiver group): the target run with
        only that group's receivers replaced by the sender's recorded values."""
        n, model, r_count = len(part), self.model, len(rows)
        by_site: dict[str, list[tuple[int, Receiver]]] = {}
        for row, (_k, g) in enumerate(rows):
            for r in g:
                by_site.setdefault(receiver_site(model, r), []).append((row, r))
        hooks = {}
        for name, items in by_site.items():
            rec = recorded[name]

            def hook(act, rec=rec, items=items):
                new = act.clone()
                for row, r in items:
                    k = rows[row][0]
                    dst, srcr = slice(row * n, (row + 1) * n), slice(k * n, (k + 1) * n)
                    if r.kind == "head":
                        h = _head_index(act, model, r.head)
                        new[dst, :, h] = rec[srcr, :, h].to(act.dtype)
                    else:
                        new[dst] = rec[srcr].to(act.dtype)
                return new

            hooks[name] = hook
        logits = model.run(tile_batch(target, r_count), hooks)
        return blocks(logits, part, self.metric_, r_count)
