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
q/k/v are changed in the one real run. An MLP reads ``norm(x)`` through its own norm, so a
patched MLP is given ``norm(x - delta)`` (:meth:`interp.Model.mlp_norm`) at its input site
(``mlp.hook_in``) and computes its patched output in the real run; no copy of the batch is
needed, and the pass costs one forward of the pairs plus a norm per patched receiver.

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

from .components import Node, parse_nodes, parse_receivers
from .metrics import as_metric
from .pairs import Pairs
from .path_patching import has_parallel_blocks, reaches
from .runs import batch_of, cache, prepare, resolve_direction, site

Tensor = torch.Tensor
ABLATIONS = ("counterfactual", "mean")
#: a group's patched-edge sum is taken as "every sender less the unpatched edges" when fewer than
#: this share of the senders run so far have an unpatched edge into it
COMPLEMENT_BELOW = 0.5


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
    batch_size : pairs per forward pass
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
        twice = sorted(s.name for s, count in Counter(self.senders_).items() if count > 1)
        if twice:
            raise ValueError(f"senders listed more than once: {twice}; list each node once")
        self.receivers_ = parse_receivers(self.model, self.receivers)
        self.edges_ = [(s, r) for s in self.senders_ for r in self.receivers_ if reaches(self.model, s, r)]
        if not self.edges_:
            raise ValueError("no sender writes before any receiver reads: choose senders in earlier layers")
        self.parallel_ = has_parallel_blocks(self.model)
        self.column_ = {s: i for i, s in enumerate(self.senders_)}  # each sender's row of the differences
        # each edge's (receiver, sender column), and the receivers in the groups a pass patches
        # together (a layer's heads, q then k then v rows by head; a layer's MLP; the logits)
        index = {r: i for i, r in enumerate(self.receivers_)}
        self.edge_at_ = (
            torch.tensor([index[r] for _, r in self.edges_]),
            torch.tensor([self.column_[s] for s, _ in self.edges_]),
        )
        self.groups_: dict[tuple, Tensor] = {}
        for r in sorted(self.receivers_, key=lambda r: ("qkv".find(r.input or "q"), r.head or 0)):
            key = ("logits", None) if r.kind == "logits" else (r.kind, r.layer)
            self.groups_.setdefault(key, []).append(index[r])
        self.groups_ = {key: torch.tensor(rows) for key, rows in self.groups_.items()}
        self.w_o_: dict[int, Tensor] = {}
        for layer in sorted({s.layer for s in self.senders_ if s.kind == "head"}):
            self._w_o(layer)
        # what a patched head receiver's own q/k/v is computed from (read once, outside any pass)
        heads = {(r.layer, r.input) for r in self.receivers_ if r.kind == "head"}
        self.w_in_ = {key: self.model.head_input_weights(*key).detach() for key in sorted(heads)}
        self.norm_ = {layer: self.model.attention_norm(layer) for layer in sorted({k[0] for k in heads})}
        self.mlp_norm_ = {r.layer: self.model.mlp_norm(r.layer) for r in self.receivers_ if r.kind == "mlp"}

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
        per_batch = max(1, min(self.batch_size, len(pairs)))
        heads_per_layer = max(Counter(r.layer for r in self.receivers_ if r.kind == "head").values(), default=0)
        # the source's writes and this run's differences per sender (and a gathered half of them);
        # the patched receivers' norm inputs and outputs, and the previous layer's, and the running sum
        writes = (5 * len(self.senders_) // 2 + 3 * heads_per_layer + 3) * per_batch * pairs.n_pos * self.model.d_model
        memory.check_fits(
            memory.forward_bytes(self.model, per_batch, pairs.n_pos, graph=False)
            + writes * memory.element_bytes(self.model),
            self.model,
            f"edge patching in batches of {per_batch} pairs x {pairs.n_pos} positions",
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
                out[k, start : start + len(part)] = self._run(part, target, source_writes, plan).float().cpu()
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
        """Per group of receivers with a patched input: the receivers, and their edge weights over
        the senders' columns ``[receivers, k]``, ``k`` one past the last sender patched into any
        of them (later senders need not be written)."""
        weights = torch.zeros(len(self.receivers_), len(self.senders_))
        weights.index_put_(self.edge_at_, mask.cpu(), accumulate=True)
        patched = weights != 0
        groups, mixes = {}, {}
        for key, rows in self.groups_.items():
            rows = rows[patched[rows].any(1)]
            if len(rows):
                k = 1 + int(patched[rows].any(0).nonzero().max())
                groups[key] = [self.receivers_[i] for i in rows.tolist()]
                mixes[key] = (k, weights[rows, :k])
        return {"groups": groups, "mixes": mixes}

    @torch.no_grad()
    def _run(self, part: Pairs, target, source_writes: dict[Node, Tensor], plan: dict) -> Tensor:
        model, n = self.model, len(part)
        column = self.column_
        heads_at: dict[int, list[Node]] = {}
        for s in self.senders_:
            if s.kind == "head":
                heads_at.setdefault(s.layer, []).append(s)
        mlp_senders = {s.layer: s for s in self.senders_ if s.kind == "mlp"}
        embed = next((s for s in self.senders_ if s.kind == "embed"), None)
        head_receivers = {key[1]: rs for key, rs in plan["groups"].items() if key[0] == "head"}
        mlp_receivers = {key[1] for key in plan["groups"] if key[0] == "mlp"}
        mixes = plan["mixes"]
        # this run's write minus the ablated one, per sender, filled in as the pass goes
        like = next(iter(source_writes.values()))
        shape = (len(self.senders_), n, target.input_ids.shape[1], model.d_model)
        diffs = torch.zeros(shape, dtype=like.dtype, device=like.device)
        total = torch.zeros(shape[1:], dtype=torch.float32, device=like.device)  # their sum so far (float32:
        # in half precision the complement below would cancel large terms against a rounded sum)
        ran = torch.zeros(len(self.senders_), dtype=torch.bool)

        def record(senders: list[Node], written: Tensor) -> None:
            """``written``: the senders' writes in this run, ``[len(senders), n, pos, d]``."""
            for s, w in zip(senders, written):
                diffs[column[s]] = w - source_writes[s].to(w.device, w.dtype)
                total.add_(diffs[column[s]])
                ran[column[s]] = True

        def deltas(key) -> Tensor:
            """``[receivers, n, pos, d]``: the patched edges' sum for each receiver of a group (a
            layer's heads, its MLP, the logits): the edge weights ``[receivers, senders]`` times
            the senders' differences, one matrix product. Where most weights are 1 (a circuit's
            complement: what faithfulness patches) it is the sum of every sender run so far less
            the few edges not patched, over those senders' columns only, in float32."""
            k, mix = mixes[key]
            rest = ran.float().expand(len(mix), -1).clone()
            rest[:, :k] -= mix
            cols = rest.any(0).nonzero()[:, 0]
            if len(cols) < COMPLEMENT_BELOW * k:
                out = total.flatten()[None] - rest[:, cols].to(total.device) @ diffs[cols].flatten(1).float()
                out = out.to(diffs.dtype)
            else:
                out = mix.to(diffs) @ diffs[:k].flatten(1)
            return out.view(len(mix), *diffs.shape[1:])

        hooks = {}
        state: dict[str, Tensor] = {}

        def on_resid(layer: int, heads: bool, mlp: bool):
            """Read the residual a patched receiver would read: the layer's heads' norm inputs at
            ``resid_pre``; the MLP's at ``resid_mid`` (``resid_pre`` in a parallel block)."""

            def hook(act):
                if heads:  # x - delta per receiver, in the deltas' own memory  [R_l, n, pos, d]
                    state["normed"] = self.norm_[layer](deltas(("head", layer)).neg_().add_(act))
                if mlp:
                    state["mlp_in"] = self.mlp_norm_[layer](deltas(("mlp", layer))[0].neg_().add_(act))

            return hook

        def on_mlp_in(act):
            return state.pop("mlp_in").to(act.dtype)

        def on_attn_in(act):
            # norm(x - delta) - norm(x), what the projections move by (pop: once per layer, or a KeyError)
            state["moved"] = state.pop("normed").sub_(act)

        def on_qkv(layer: int, which: str):
            """A patched head reads ``norm(x - delta) W_h`` where the model computed ``norm(x) W_h``:
            its q/k/v moves by ``(norm(x - delta) - norm(x)) W_h`` (the bias cancels)."""
            rs = head_receivers[layer]
            rows = [i for i, r in enumerate(rs) if r.input == which]  # contiguous (see _plan)
            heads = [r.head for r in rs if r.input == which]

            def hook(act):
                act = act.clone()
                slots = [h * act.shape[2] // model.n_heads for h in heads]  # each head's slot (its group under GQA)
                if slots == list(range(slots[0], slots[-1] + 1)):
                    slots = slice(slots[0], slots[-1] + 1)  # consecutive heads: views, no gather or scatter
                w = self.w_in_[(layer, which)][slots].to(act.device, act.dtype)  # [m, d_model, d_head]
                moved = state["moved"][rows[0] : rows[-1] + 1]
                act[:, :, slots] += torch.einsum("mnpd,mde->npme", moved, w)
                return act

            return hook if rows else None

        def on_embed(act):
            if embed is not None:
                record([embed], act[None])

        hooks[site("embed")] = on_embed
        for layer in range(model.n_layers):
            heads, mlp = layer in head_receivers, layer in mlp_receivers
            if heads or (mlp and self.parallel_):
                hooks[site("resid_pre", layer)] = on_resid(layer, heads, mlp and self.parallel_)
            if mlp and not self.parallel_:
                hooks[site("resid_mid", layer)] = on_resid(layer, False, True)
            if mlp:
                hooks[site("mlp_in", layer)] = on_mlp_in
            if heads:
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
                    record(senders, torch.einsum("npme,med->mnpd", act[:, :, heads], w))

                hooks[site("z", layer)] = on_z
            if layer in mlp_senders:

                def on_mlp(act, layer=layer):
                    record([mlp_senders[layer]], act[None])

                hooks[site("mlp_out", layer)] = on_mlp
        if ("logits", None) in mixes:

            def on_post(act):
                return act - deltas(("logits", None))[0]

            hooks[site("resid_post", model.n_layers - 1)] = on_post
        logits = model.run(target, hooks)
        if "mlp_in" in state or "normed" in state:  # a hook point that exists but never ran
            raise RuntimeError(
                f"this model's {'mlp.hook_in' if 'mlp_in' in state else 'attn.hook_in'} site did not run in "
                "the forward pass, so a patched receiver was not patched; please report the architecture"
            )
        return self.metric_.reduce(logits, part)
