"""Edge patching: the exact effect of replacing any set of edges at once.

Path patching asks what one sender does to one receiver; a *circuit* is a set of edges, and its
test needs every other edge replaced at the same time. In the residual-stream view of a
transformer each receiver ``v`` (a head's query, key or value input, an MLP's input, the
unembedding's input) reads the sum of the writes of every node ``u`` before it:

    x_v = sum_u w_u + (constants)          w_u = z_u W_O (head), MLP output, token embedding

Patching the edge ``u -> v`` replaces ``w_u`` *in ``v``'s copy of the sum only*:

    x_v' = x_v - sum_{u : (u, v) patched} a_uv (w_u - w~_u)

with ``w~_u`` the write of ``u`` under the ablation (``counterfactual``: its value on the other
input of the pair; ``mean``: its mean over all pairs' target inputs, per position) and ``a_uv``
in ``[0, 1]`` the fraction patched (1 for circuits; fractions give the derivative that edge
attribution estimates). Every node downstream is recomputed from its patched inputs, so
``w_u`` above is ``u``'s output *in this run*, not in the clean run.

No backend has a private residual stream per receiver, so the run is batched: row block 0 is
the real run; at each layer, block ``c`` gets ``x - delta_c`` for receiver ``c`` of that layer
and its query/key/value (or MLP output) is copied into block 0 before the layer's attention (or
MLP) reads it. One forward pass per set of edges, ``1 + (receivers of the busiest layer)``
copies of the pairs.

Checks (tests): with nothing patched the metric is the target run's; with every edge patched
(counterfactual) it is the source run's; one patched edge equals :class:`PathPatching` of that
edge with frozen MLPs; all edges out of a head equal activation patching of that head's ``z``;
on grouped-query models a key/value receiver is its group's shared key/value.

    >>> ep = EdgePatching(model, "logit_diff")              # edges: ep.edges(), one row per edge
    >>> per_pair = ep.evaluate(pairs, masks)                 # masks: [K, n_edges] -> [K, n_pairs]
"""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd
import torch
from jaxtyping import Float

from interp.progress import progress_bar

from . import memory
from .components import Node, Receiver, parse_nodes, parse_receivers
from .metrics import as_metric
from .pairs import Pairs
from .path_patching import has_parallel_blocks, reaches
from .runs import batch_of, cache, prepare, resolve_direction, site, tile_batch

Tensor = torch.Tensor
ABLATIONS = ("counterfactual", "mean")


class EdgePatching:
    """Patch any set of (sender, receiver) edges at once; the engine behind :class:`Faithfulness`.

    Parameters
    ----------
    model : interp.Model
    metric : name, Metric or function (see :mod:`circuits.metrics`)
    senders, receivers : restrict the graph (default: every node and receiver)
    ablation : ``"counterfactual"`` (a patched edge carries the sender's value on the other input)
        or ``"mean"`` (its mean over the pairs' target inputs, per position)
    direction : ``"corrupted_into_clean"`` (default: run the clean input, patched edges carry
        corrupted values: ablation) or ``"clean_into_corrupted"``
    batch_size : rows per forward pass (pairs x copies)
    """

    def __init__(
        self,
        model,
        metric="logit_diff",
        senders: Sequence | None = None,
        receivers: Sequence | None = None,
        ablation: str = "counterfactual",
        direction: str = "corrupted_into_clean",
        batch_size: int = 512,
        progress: bool | None = None,
    ):
        self.model = model
        self.metric = metric
        self.senders = senders
        self.receivers = receivers
        self.ablation = ablation
        self.direction = direction
        self.batch_size = batch_size
        self.progress = progress

    def _validate(self) -> None:
        if self.ablation not in ABLATIONS:
            raise ValueError(f"ablation must be one of {ABLATIONS}, got {self.ablation!r}")
        self.metric_ = as_metric(self.metric)
        self.target_, self.source_ = resolve_direction(self.direction)
        self.senders_ = parse_nodes(self.model, self.senders)
        self.receivers_ = parse_receivers(self.model, self.receivers)
        self.edges_ = [(s, r) for s in self.senders_ for r in self.receivers_ if reaches(self.model, s, r)]
        if not self.edges_:
            raise ValueError("no sender writes before any receiver reads: choose senders in earlier layers")
        self.parallel_ = has_parallel_blocks(self.model)
        self.w_o_: dict[int, Tensor] = {}
        for layer in sorted({s.layer for s in self.senders_ if s.kind == "head"}):
            self._w_o(layer)

    def edges(self) -> pd.DataFrame:
        """The graph's edges in the order masks index them: ``sender, receiver, ...`` per row."""
        self._validate()
        return pd.DataFrame(
            [
                {
                    "sender": s.name,
                    "receiver": r.name,
                    "sender_layer": s.layer,
                    "sender_head": s.head,
                    "receiver_layer": r.layer,
                    "receiver_head": r.head,
                    "receiver_input": r.input if r.kind == "head" else r.kind,
                }
                for s, r in self.edges_
            ]
        )

    # ------------------------------------------------------------------------------------------
    def evaluate(self, pairs: Pairs, masks: Float[Tensor, "k edges"]) -> Float[Tensor, "k n"]:
        """The metric per pair with each mask's edges patched (entries in ``[0, 1]``: the fraction
        of the edge replaced): ``[K, n_pairs]``."""
        self._validate()
        masks = torch.as_tensor(masks, dtype=torch.float32)
        if masks.dim() == 1:
            masks = masks[None]
        if masks.shape[-1] != len(self.edges_):
            raise ValueError(
                f"masks have {masks.shape[-1]} entries per row but the graph has {len(self.edges_)} "
                "edges (see EdgePatching.edges())"
            )
        pairs = prepare(self.model, pairs, self.metric_)
        means = self._mean_writes(pairs) if self.ablation == "mean" else None
        active = [self._plan(m) for m in masks]
        # each set of edges runs with the copies its busiest layer needs (the full model with one);
        # the batch of pairs is sized for the largest, so no pass exceeds batch_size rows
        copies = [1 + max((len(slots) for slots in plan["by_layer"].values()), default=0) for plan in active]
        per_batch = max(1, self.batch_size // max(copies))
        rows = per_batch * max(copies)
        writes = 2 * len(self.senders_) * per_batch * pairs.n_pos * self.model.d_model  # source's and this run's
        memory.check_fits(
            memory.forward_bytes(self.model, rows, pairs.n_pos, graph=False)
            + writes * memory.element_bytes(self.model),
            self.model,
            f"edge patching with {max(copies)} copies of batches of {per_batch} pairs x {pairs.n_pos} positions",
            f"use a smaller batch_size (now {self.batch_size} rows per pass) or shorter prompts",
        )
        out = torch.zeros(len(masks), len(pairs))
        bar = progress_bar(
            total=len(masks) * len(pairs), desc="edge patching", unit="pair runs", progress=self.progress
        )
        start = 0
        for part in pairs.batches(per_batch):
            target = batch_of(part, self.target_)
            source_writes = means if means is not None else self._writes_of(batch_of(part, self.source_))
            for k, plan in enumerate(active):
                out[k, start : start + len(part)] = (
                    self._run(part, target, source_writes, plan, copies[k]).float().cpu()
                )
                bar.update(len(part))
            start += len(part)
        bar.close()
        return out

    # ------------------------------------------------------------------------------------------
    def _node_sites(self) -> list[str]:
        names = {site("embed")}
        for s in self.senders_:
            names.add(
                site("z", s.layer)
                if s.kind == "head"
                else site("mlp_out", s.layer)
                if s.kind == "mlp"
                else site("embed")
            )
        return sorted(names)

    def _w_o(self, layer: int) -> Tensor:
        """``W_O`` of ``layer``, read once (outside any forward pass: backends cannot nest them)."""
        if layer not in self.w_o_:
            self.w_o_[layer] = self.model.head_output_weights(layer).detach()
        return self.w_o_[layer]

    def _writes_from(self, acts: dict[str, Tensor]) -> dict[Node, Tensor]:
        """Each sender's write into the residual stream ``[n, pos, d_model]`` from cached activations."""
        out = {}
        for s in self.senders_:
            if s.kind == "embed":
                out[s] = acts[site("embed")]
            elif s.kind == "mlp":
                out[s] = acts[site("mlp_out", s.layer)]
            else:
                z = acts[site("z", s.layer)][:, :, s.head]
                out[s] = z @ self._w_o(s.layer)[s.head].to(z.device, z.dtype)
        return out

    def _writes_of(self, batch) -> dict[Node, Tensor]:
        return self._writes_from(cache(self.model, batch, self._node_sites()))

    def _mean_writes(self, pairs: Pairs) -> dict[Node, Tensor]:
        """Mean write of each sender over all pairs' target inputs, per position ``[1, pos, d]``,
        over the pairs whose prompt reaches that position (padding is not averaged in)."""
        sums: dict[Node, Tensor] = {}
        count = 0
        for part in pairs.batches(self.batch_size):
            batch = batch_of(part, self.target_)
            real = batch.attention_mask.float()[..., None]  # [n, pos, 1]
            count = count + real.sum(0, keepdim=True)
            for s, w in self._writes_of(batch).items():
                sums[s] = sums.get(s, 0) + (w * real.to(w.device, w.dtype)).sum(0, keepdim=True)
        return {s: v / count.clamp(min=1).to(v.device, v.dtype) for s, v in sums.items()}

    def _plan(self, mask: Tensor) -> dict:
        """Which receivers have patched inputs, grouped by layer, with their copy slot and weights."""
        weights: dict[Receiver, list[tuple[Node, float]]] = {}
        for (s, r), a in zip(self.edges_, mask.tolist()):
            if a != 0.0:
                weights.setdefault(r, []).append((s, a))
        by_layer: dict[int, dict[Receiver, int]] = {}
        for r in weights:
            if r.kind == "logits":
                continue
            slots = by_layer.setdefault(r.layer, {})
            slots[r] = len(slots) + 1
        return {"weights": weights, "by_layer": by_layer}

    @torch.no_grad()
    def _run(self, part: Pairs, target, source_writes: dict[Node, Tensor], plan: dict, copies: int) -> Tensor:
        model, n = self.model, len(part)
        weights, by_layer = plan["weights"], plan["by_layer"]
        writes: dict[Node, Tensor] = {}  # this run's writes (block 0), filled in as the pass goes
        heads_at: dict[int, list[Node]] = {}
        for s in self.senders_:
            if s.kind == "head":
                heads_at.setdefault(s.layer, []).append(s)
        mlp_senders = {s.layer: s for s in self.senders_ if s.kind == "mlp"}
        embed = next((s for s in self.senders_ if s.kind == "embed"), None)

        def delta(r: Receiver, like: Tensor) -> Tensor:
            d = torch.zeros_like(like)
            for s, a in weights.get(r, []):
                src = source_writes[s].to(like.device, like.dtype)
                d = d + a * (writes[s] - src)
            return d

        def block(c: int) -> slice:
            return slice(c * n, (c + 1) * n)

        hooks = {}

        def inputs(slots: dict[Receiver, int]):
            """A hook giving block ``c`` the input of receiver ``r``: block 0's value minus its patched edges."""

            def hook(act):
                act = act.clone()
                x = act[block(0)]
                for r, c in slots.items():
                    act[block(c)] = x - delta(r, x)
                return act

            return hook

        def on_embed(act):
            if embed is not None:
                writes[embed] = act[block(0)].clone()

        hooks[site("embed")] = on_embed
        for layer in range(model.n_layers):
            slots = by_layer.get(layer, {})
            head_slots = {r: c for r, c in slots.items() if r.kind == "head"}
            mlp_slots = {r: c for r, c in slots.items() if r.kind == "mlp"}
            pre_slots = {**head_slots, **(mlp_slots if self.parallel_ else {})}
            if pre_slots:
                hooks[site("resid_pre", layer)] = inputs(pre_slots)
            for which in "qkv":
                moved = {r: c for r, c in head_slots.items() if r.input == which}
                if not moved:
                    continue

                def on_qkv(act, moved=moved):
                    act = act.clone()
                    for r, c in moved.items():
                        h = r.head * act.shape[2] // model.n_heads  # the head's slot (its group under GQA)
                        act[block(0), :, h] = act[block(c), :, h]
                    return act

                hooks[site(which, layer)] = on_qkv
            if layer in heads_at:

                def on_z(act, layer=layer):
                    w = self._w_o(layer).to(act.device, act.dtype)
                    for s in heads_at[layer]:
                        writes[s] = act[block(0), :, s.head] @ w[s.head]

                hooks[site("z", layer)] = on_z
            if mlp_slots and not self.parallel_:
                hooks[site("resid_mid", layer)] = inputs(mlp_slots)
            if mlp_slots or layer in mlp_senders:

                def on_mlp(act, mlp_slots=mlp_slots, layer=layer):
                    if mlp_slots:
                        act = act.clone()
                        for _, c in mlp_slots.items():
                            act[block(0)] = act[block(c)]
                    if layer in mlp_senders:
                        writes[mlp_senders[layer]] = act[block(0)].clone()
                    return act

                hooks[site("mlp_out", layer)] = on_mlp
        logits_r = next((r for r in weights if r.kind == "logits"), None)
        if logits_r is not None:

            def on_post(act):
                act = act.clone()
                x = act[block(0)]
                act[block(0)] = x - delta(logits_r, x)
                return act

            hooks[site("resid_post", model.n_layers - 1)] = on_post
        logits = model.run(tile_batch(target, copies), hooks)
        return self.metric_.reduce(logits[block(0)], part)
