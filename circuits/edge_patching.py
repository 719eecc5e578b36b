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

No backend has a private residual stream per receiver, and none is needed for a head: its query
(key, value) reads ``norm(x) W_h + b``, so with ``x - delta`` in its place it reads

    q_h' = q_h + (norm(x - delta) - norm(x)) W_h

with the layer's own norm (:meth:`interp.Model.attention_norm`) and the head's slice of the
projection (:meth:`interp.Model.head_input_weights`); the bias cancels. At each layer the patched
heads' deltas are one matrix product (the edge weights times the senders' differences) and their
q/k/v are changed in the one real run. An MLP reads its whole input through a nonlinearity, so
each layer's patched MLP gets a copy of the batch (row block 1), given ``x - delta`` before the
MLP and its output copied into the real run (block 0). One forward pass per set of edges, of one
copy of the pairs, or two when an MLP receiver is patched.

Checks (tests): with nothing patched the metric is the target run's; with every edge patched
(counterfactual) it is the source run's; one patched edge equals :class:`PathPatching` of that
edge with frozen MLPs; all edges out of a head equal activation patching of that head's ``z``;
on grouped-query models a key/value receiver is its group's shared key/value.

    >>> ep = EdgePatching(model, "logit_diff")              # edges: ep.edges(), one row per edge
    >>> per_pair = ep.evaluate(pairs, masks)                 # masks: [K, n_edges] -> [K, n_pairs]
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import pandas as pd
import torch
from jaxtyping import Float

from interp import memory
from interp.progress import progress_bar

from .components import Node, Receiver, parse_nodes, parse_receivers
from .metrics import as_metric
from .pairs import Pairs
from .path_patching import has_parallel_blocks, reaches
from .runs import batch_of, cache, prepare, resolve_direction, site, tile_batch

Tensor = torch.Tensor
ABLATIONS = ("counterfactual", "mean")


def _mixing(rs: list[Receiver], weights: dict, column: dict[Node, int]) -> tuple[int, Tensor]:
    """The edge weights of a group of receivers over the senders' columns ``[receivers, k]``, with
    ``k`` one past the last sender patched into any of them (later senders need not be written)."""
    k = 1 + max(column[s] for r in rs for s, _ in weights[r])
    mix = [[0.0] * k for _ in rs]
    for i, r in enumerate(rs):
        for s, a in weights[r]:
            mix[i][column[s]] += a
    return k, torch.tensor(mix, dtype=torch.float32)


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
        self.column_ = {s: i for i, s in enumerate(self.senders_)}  # each sender's row of the differences
        self.w_o_: dict[int, Tensor] = {}
        for layer in sorted({s.layer for s in self.senders_ if s.kind == "head"}):
            self._w_o(layer)
        # what a patched head receiver's own q/k/v is computed from (read once, outside any pass)
        heads = {(r.layer, r.input) for r in self.receivers_ if r.kind == "head"}
        self.w_in_ = {key: self.model.head_input_weights(*key).detach() for key in sorted(heads)}
        self.norm_ = {layer: self.model.attention_norm(layer) for layer in sorted({k[0] for k in heads})}

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
        heads_per_layer = max(Counter(r.layer for r in self.receivers_ if r.kind == "head").values(), default=0)
        # the source's writes and this run's differences per sender; the patched heads' norm inputs
        writes = (2 * len(self.senders_) + heads_per_layer) * per_batch * pairs.n_pos * self.model.d_model
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
        """Which receivers have patched inputs, with their weights; MLP receivers grouped by layer
        with their copy slot (heads and the logits need no copy)."""
        weights: dict[Receiver, list[tuple[Node, float]]] = {}
        for (s, r), a in zip(self.edges_, mask.tolist()):
            if a != 0.0:
                weights.setdefault(r, []).append((s, a))
        by_layer: dict[int, dict[Receiver, int]] = {}
        for r in weights:
            if r.kind != "mlp":
                continue
            slots = by_layer.setdefault(r.layer, {})
            slots[r] = len(slots) + 1
        groups = {("logits", None): [r for r in weights if r.kind == "logits"]}
        for r in sorted(weights, key=lambda r: ("qkv".find(r.input or "q"), r.head or 0)):  # q, k, v rows contiguous
            if r.kind != "logits":
                groups.setdefault((r.kind, r.layer), []).append(r)
        mixes = {key: _mixing(rs, weights, self.column_) for key, rs in groups.items() if rs}
        return {"weights": weights, "by_layer": by_layer, "groups": groups, "mixes": mixes}

    @torch.no_grad()
    def _run(self, part: Pairs, target, source_writes: dict[Node, Tensor], plan: dict, copies: int) -> Tensor:
        model, n = self.model, len(part)
        weights, by_layer = plan["weights"], plan["by_layer"]
        column = self.column_
        heads_at: dict[int, list[Node]] = {}
        for s in self.senders_:
            if s.kind == "head":
                heads_at.setdefault(s.layer, []).append(s)
        mlp_senders = {s.layer: s for s in self.senders_ if s.kind == "mlp"}
        embed = next((s for s in self.senders_ if s.kind == "embed"), None)
        head_receivers = {key[1]: rs for key, rs in plan["groups"].items() if key[0] == "head"}
        mixes = plan["mixes"]
        # this run's write minus the ablated one, per sender (block 0), filled in as the pass goes
        like = next(iter(source_writes.values()))
        shape = (len(self.senders_), n, target.input_ids.shape[1], model.d_model)
        diffs = torch.zeros(shape, dtype=like.dtype, device=like.device)

        def record(senders: list[Node], written: Tensor) -> None:
            """``written``: the senders' writes in this run, ``[len(senders), n, pos, d]``."""
            for s, w in zip(senders, written):
                diffs[column[s]] = w - source_writes[s].to(w.device, w.dtype)

        def deltas(key) -> Tensor:
            """``[receivers, n, pos, d]``: the patched edges' sum for each receiver of a group (a
            layer's heads, its MLP, the logits): the edge weights ``[receivers, senders]`` times
            the senders' differences, one matrix product."""
            k, mix = mixes[key]
            return (mix.to(diffs.device, diffs.dtype) @ diffs[:k].flatten(1)).view(len(mix), *diffs.shape[1:])

        def block(c: int) -> slice:
            return slice(c * n, (c + 1) * n)

        hooks = {}
        state: dict[str, Tensor] = {}

        def give_copies(act: Tensor, layer: int, mlp_slots: dict[Receiver, int]) -> Tensor:
            """Each patched MLP's copy block gets block 0's residual minus its patched edges."""
            act = act.clone()
            x = act[block(0)]
            for r, d in zip(mlp_slots, deltas(("mlp", layer))):
                act[block(mlp_slots[r])] = x - d
            return act

        def on_resid_pre(layer: int, mlp_slots: dict[Receiver, int]):
            """Block 0's residual read for the layer's patched heads; the MLP receivers' copies
            (parallel blocks) get block 0's value minus their patched edges."""

            def hook(act):
                x = act[block(0)]
                if layer in head_receivers:
                    state["moved"] = self.norm_[layer](x[None] - deltas(("head", layer)))  # [R_l, n, pos, d]
                return give_copies(act, layer, mlp_slots) if mlp_slots else None

            return hook

        def on_attn_in(act):
            state["u"] = act[block(0)]

        def on_qkv(layer: int, which: str):
            """A patched head reads ``norm(x - delta) W_h`` where the model computed ``norm(x) W_h``:
            its q/k/v moves by ``(norm(x - delta) - norm(x)) W_h`` (the bias cancels)."""
            rs = head_receivers[layer]
            rows = [i for i, r in enumerate(rs) if r.input == which]  # contiguous (see _plan)
            heads = [r.head for r in rs if r.input == which]

            def hook(act):
                act = act.clone()
                slots = [h * act.shape[2] // model.n_heads for h in heads]  # each head's slot (its group under GQA)
                w = self.w_in_[(layer, which)][slots].to(act.device, act.dtype)  # [m, d_model, d_head]
                moved = state["moved"][rows[0] : rows[-1] + 1]
                act[block(0), :, slots] += torch.einsum("mnpd,mde->npme", moved - state["u"], w)
                return act

            return hook if rows else None

        def on_embed(act):
            if embed is not None:
                record([embed], act[block(0)][None])

        hooks[site("embed")] = on_embed
        for layer in range(model.n_layers):
            mlp_slots = by_layer.get(layer, {})
            if layer in head_receivers or (mlp_slots and self.parallel_):
                hooks[site("resid_pre", layer)] = on_resid_pre(layer, mlp_slots if self.parallel_ else {})
            if layer in head_receivers:
                hooks[site("attn_in", layer)] = on_attn_in
                for which in "qkv":
                    fn = on_qkv(layer, which)
                    if fn is not None:
                        hooks[site(which, layer)] = fn
            if layer in heads_at:

                def on_z(act, layer=layer):
                    senders = heads_at[layer]
                    heads = [s.head for s in senders]
                    w = self._w_o(layer)[heads].to(act.device, act.dtype)  # [m, d_head, d_model]
                    record(senders, torch.einsum("npme,med->mnpd", act[block(0)][:, :, heads], w))

                hooks[site("z", layer)] = on_z
            if mlp_slots and not self.parallel_:

                def on_mid(act, mlp_slots=mlp_slots, layer=layer):
                    return give_copies(act, layer, mlp_slots)

                hooks[site("resid_mid", layer)] = on_mid
            if mlp_slots or layer in mlp_senders:

                def on_mlp(act, mlp_slots=mlp_slots, layer=layer):
                    if mlp_slots:
                        act = act.clone()
                        for _, c in mlp_slots.items():
                            act[block(0)] = act[block(c)]
                    if layer in mlp_senders:
                        record([mlp_senders[layer]], act[block(0)][None])
                    return act

                hooks[site("mlp_out", layer)] = on_mlp
        logits_r = next((r for r in weights if r.kind == "logits"), None)
        if logits_r is not None:

            def on_post(act):
                act = act.clone()
                act[block(0)] = act[block(0)] - deltas(("logits", None))[0]
                return act

            hooks[site("resid_post", model.n_layers - 1)] = on_post
        logits = model.run(tile_batch(target, copies), hooks)
        return self.metric_.reduce(logits[block(0)], part)
