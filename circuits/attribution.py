"""Attribution patching: activation patching's linear approximation, for every node and edge at once.

Activation patching needs one forward pass per patched component; attribution patching (Nanda
2023) estimates all of them from one forward and one backward pass by a first-order Taylor
expansion of the metric ``m`` around the run being patched:

    AtP(a)   = sum_pos (a_source - a_target) . dm/da                         (node scores)
    EAP(u->v) = sum_pos (w_u,source - w_u,target) . dm/d(input of v)          (edge scores)

where ``a`` is a node's activation (a head's ``z``, an MLP output, the embeddings), ``w_u`` is
node ``u``'s write into the residual stream (for a head ``z_u @ W_O``) and the input of ``v`` is
receiver ``v``'s own copy of the residual stream: the gradient that flows back through ``v``'s
query, key or value projection (or its MLP) alone (Syed, Rager & Conmy 2023).

With ``direction="clean_into_corrupted"`` (default) the gradient is taken on the corrupted run,
approximating the effect of patching clean activations into it; the scores are on the same scale
as :class:`~circuits.ActivationPatching` with the same direction (minus its unpatched baseline).

**EAP-IG** (Hanna et al. 2024): with ``ig_steps=m`` the gradient is averaged over ``m`` points on
the straight line between the target and source input embeddings (midpoints ``(j + 1/2) / m``),
integrated gradients' remedy for the saturation that makes one-point gradients miss large effects.

``statistics=True`` keeps each pair's score (an estimated effect) and adds its mean, standard
error, bootstrap interval and sign-flip p-value to every node or edge row
(:mod:`circuits.statistics`); ``per_pair_`` holds the per-pair scores.

Cost: node scores need one forward and one backward pass per IG step. Edge scores additionally
need every receiver's private input gradient; a backend-neutral model has no per-head copy of the
residual stream, so these are obtained by one extra forward per layer in which the layer's input
is a fresh leaf, and a backward through that layer's projections only. Everything is batched over
pairs; nothing is run per component.
"""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd
import torch

from interp.progress import progress_bar
from interp.sites import parse_site

from .components import Node, Receiver, parse_nodes, parse_receivers
from .metrics import as_metric
from .pairs import Pairs
from .path_patching import has_parallel_blocks, reaches, receiver_site
from .runs import batch_of, cache, prepare, resolve_direction, site
from .statistics import as_uncertainty, attach, check_memory

Tensor = torch.Tensor


def node_site(node: Node) -> str:
    return {"embed": site("embed"), "head": site("z", node.layer), "mlp": site("mlp_out", node.layer)}[node.kind]


class AttributionPatching:
    """AtP node scores, EAP edge scores and their integrated-gradients variants.

    Parameters
    ----------
    model : interp.Model
    metric : name, Metric or differentiable function of the logits
    ig_steps : None for plain AtP / EAP; ``m`` for the integrated-gradients variant (EAP-IG)
    direction : ``"clean_into_corrupted"`` (default) or ``"corrupted_into_clean"``
    nodes, receivers : restrict to these (default all)
    by_position : node scores per position (else summed over positions)
    batch_size : pairs per pass
    statistics : ``True`` or a :class:`circuits.Uncertainty`: per-row intervals and p-values over pairs
    """

    def __init__(
        self,
        model,
        metric="logit_diff",
        ig_steps: int | None = None,
        direction: str = "clean_into_corrupted",
        nodes: Sequence | None = None,
        receivers: Sequence | None = None,
        by_position: bool = False,
        batch_size: int = 64,
        progress: bool | None = None,
        statistics=False,
    ):
        self.model = model
        self.metric = metric
        self.ig_steps = ig_steps
        self.direction = direction
        self.nodes_spec = nodes  # the parameter `nodes` (the method `nodes()` has that attribute name)
        self.receivers = receivers
        self.by_position = by_position
        self.batch_size = batch_size
        self.progress = progress
        self.statistics = statistics

    def _validate(self) -> None:
        """Check the configuration against the model; derived state ends in ``_``."""
        if self.ig_steps is not None and (not isinstance(self.ig_steps, int) or self.ig_steps < 1):
            raise ValueError(f"ig_steps must be None or a positive integer, got {self.ig_steps!r}")
        self.metric_ = as_metric(self.metric)
        self.target_, self.source_ = resolve_direction(self.direction)
        self.nodes_ = parse_nodes(self.model, self.nodes_spec)
        self.receivers_ = parse_receivers(self.model, self.receivers)
        self.uncertainty_ = as_uncertainty(self.statistics)

    @property
    def method_name(self) -> str:
        """``"EAP"`` (one gradient) or ``"EAP-IG-inputs"`` (integrated gradients over the input embeddings)."""
        return "EAP" if self.ig_steps is None else "EAP-IG-inputs"

    @property
    def alphas(self) -> list[float]:
        if self.ig_steps is None:
            return [0.0]
        return [(j + 0.5) / self.ig_steps for j in range(self.ig_steps)]

    # gradient passes ---------------------------------------------------------------------------
    def _embed_hook(self, src_embed: Tensor, alpha: float):
        """The embeddings moved a fraction ``alpha`` of the way from target to source."""

        def fn(act):
            return act + alpha * (src_embed.to(act.device, act.dtype) - act.detach())

        return fn

    def _grads(self, part: Pairs, target, src_embed: Tensor, alpha: float, sites: list[str]) -> dict[str, Tensor]:
        """d(sum of per-pair metric)/d(activation) at ``sites``, on the run at ``alpha``."""
        leaves: dict[str, Tensor] = {}
        embed_name = site("embed")

        def leaf(name):
            move = self._embed_hook(src_embed, alpha) if (name == embed_name and alpha) else None

            def fn(act):
                if move is not None:
                    act = move(act)
                z = torch.zeros_like(act, requires_grad=True)
                leaves[name] = z
                return act + z

            return fn

        hooks = {s: leaf(s) for s in sites}
        if alpha and embed_name not in hooks:
            hooks[embed_name] = self._embed_hook(src_embed, alpha)
        with torch.enable_grad():
            logits = self.model.run(target, hooks)
            value = self.metric_.reduce(logits, part).sum()
            if not value.requires_grad:
                raise ValueError(
                    f"metric {self.metric_.name!r} is not differentiable with respect to the logits "
                    "(did it call .item(), argmax or detach?); attribution patching needs its gradient"
                )
            names = list(leaves)
            grads = torch.autograd.grad(value, [leaves[n] for n in names], allow_unused=True)
        return {n: (torch.zeros_like(leaves[n]) if g is None else g.detach()) for n, g in zip(names, grads)}

    # node scores -------------------------------------------------------------------------------
    def nodes(self, pairs: Pairs) -> pd.DataFrame:
        """AtP (or AtP-IG) score of every node, averaged over pairs."""
        self._validate()
        pairs = prepare(self.model, pairs, self.metric_)
        sites = sorted({node_site(n) for n in self.nodes_} | {site("embed")}, key=_order)
        totals: dict[str, Tensor] = {}
        kept: dict[str, list[Tensor]] = {s: [] for s in sites}  # per pair [n, pos, (head)], with statistics
        if self.uncertainty_ is not None:
            check_memory(
                len(self.nodes_) * (pairs.n_pos if self.by_position else 1),
                len(pairs),
                self.uncertainty_,
                "attribution patching",
            )
        bar = progress_bar(total=len(pairs), desc="attribution (nodes)", unit="pairs", progress=self.progress)
        for part in pairs.batches(self.batch_size):
            target, source = batch_of(part, self.target_), batch_of(part, self.source_)
            tgt, src = cache(self.model, target, sites), cache(self.model, source, sites)
            grad = self._mean_grads(part, target, src[site("embed")], sites)
            for s in sites:
                prod = (src[s] - tgt[s]) * grad[s]  # [n, pos, (head,) d]
                per_pair = prod.sum(-1)  # [n, pos, (head)]
                totals[s] = totals.get(s, 0) + per_pair.sum(0)
                if self.uncertainty_ is not None:
                    kept[s].append(per_pair.float().cpu())
            bar.update(len(part))
        bar.close()
        n = len(pairs)
        rows, per_rows = [], []
        for node in self.nodes_:
            t = totals[node_site(node)] / n
            vals = t[:, node.head] if node.kind == "head" else t
            if self.uncertainty_ is not None:
                each = torch.cat(kept[node_site(node)])  # [n, pos, (head)]
                each = each[:, :, node.head] if node.kind == "head" else each  # [n, pos]
            if self.by_position:
                rows += [_node_row(node, p, float(v)) for p, v in enumerate(vals.tolist())]
                if self.uncertainty_ is not None:
                    per_rows += list(each.T)
            else:
                rows.append(_node_row(node, None, float(vals.sum())))
                if self.uncertainty_ is not None:
                    per_rows.append(each.sum(1))
        df = pd.DataFrame(rows)
        for col in ("head", "position"):
            df[col] = df[col].astype("Int64")
        df.attrs.update(
            metric=self.metric_.name,
            direction=self.direction,
            ig_steps=self.ig_steps,
            n_pairs=n,
            method=self.method_name,
        )
        if self.uncertainty_ is not None:
            self.per_pair_ = torch.stack(per_rows)
            df = attach(df, self.per_pair_, self.uncertainty_)
        return df

    def _mean_grads(self, part, target, src_embed, sites) -> dict[str, Tensor]:
        acc: dict[str, Tensor] = {}
        for a in self.alphas:
            g = self._grads(part, target, src_embed, a, sites)
            for s, v in g.items():
                acc[s] = acc.get(s, 0) + v
        return {s: v / len(self.alphas) for s, v in acc.items()}

    # edge scores -------------------------------------------------------------------------------
    def edges(self, pairs: Pairs) -> pd.DataFrame:
        """EAP (or EAP-IG) score of every (sender node, receiver) edge, averaged over pairs."""
        self._validate()
        model = self.model
        pairs = prepare(model, pairs, self.metric_)
        senders = self.nodes_
        receivers = self.receivers_
        node_sites = sorted({node_site(n) for n in senders} | {site("embed")}, key=_order)
        rec_sites = sorted({receiver_site(model, r) for r in receivers}, key=_order)
        w_o = {layer: model.head_output_weights(layer) for layer in {s.layer for s in senders if s.kind == "head"}}
        scores = torch.zeros(len(senders), len(receivers), dtype=torch.float64)
        kept: list[Tensor] = []  # per pair [S, R, n], with statistics
        if self.uncertainty_ is not None:
            check_memory(len(senders) * len(receivers), len(pairs), self.uncertainty_, "edge attribution")
        bar = progress_bar(total=len(pairs), desc="attribution (edges)", unit="pairs", progress=self.progress)
        for part in pairs.batches(self.batch_size):
            target, source = batch_of(part, self.target_), batch_of(part, self.source_)
            tgt, src = cache(model, target, node_sites), cache(model, source, node_sites)
            writes = torch.stack([self._write_delta(s, src, tgt, w_o) for s in senders])  # [S, n, pos, d]
            r_in = torch.zeros((len(receivers),) + tuple(writes.shape[1:]), dtype=writes.dtype)
            for a in self.alphas:
                g = self._grads(part, target, src[site("embed")], a, rec_sites)
                r_in += self._receiver_inputs(part, target, src[site("embed")], a, g, receivers)
            r_in /= len(self.alphas)
            # per pair, one float64 matrix product [S, pos * d] x [pos * d, R] (never a float64
            # copy of the whole [S | R, n, pos, d] tensors)
            per_pair = torch.stack(
                [writes[:, i].flatten(1).double() @ r_in[:, i].flatten(1).double().T for i in range(len(part))], -1
            )  # [S, R, n]
            scores += per_pair.sum(-1)
            if self.uncertainty_ is not None:
                kept.append(per_pair.float().cpu())
            bar.update(len(part))
        bar.close()
        scores /= len(pairs)
        rows, cells = [], []
        for i, s in enumerate(senders):
            for j, r in enumerate(receivers):
                if reaches(model, s, r):
                    cells.append((i, j))
                    rows.append(
                        {
                            "sender": s.name,
                            "receiver": r.name,
                            "sender_layer": s.layer,
                            "sender_head": s.head,
                            "receiver_layer": r.layer,
                            "receiver_head": r.head,
                            "receiver_input": r.input if r.kind == "head" else r.kind,
                            "score": float(scores[i, j]),
                        }
                    )
        df = pd.DataFrame(rows)
        for col in ("sender_head", "receiver_head"):
            df[col] = df[col].astype("Int64")
        df.attrs.update(
            metric=self.metric_.name,
            direction=self.direction,
            ig_steps=self.ig_steps,
            n_pairs=len(pairs),
            method=self.method_name,
        )
        if self.uncertainty_ is not None:
            each = torch.cat(kept, -1)
            self.per_pair_ = torch.stack([each[i, j] for i, j in cells])
            df = attach(df, self.per_pair_, self.uncertainty_)
        return df

    @staticmethod
    def _write_delta(node: Node, src, tgt, w_o) -> Tensor:
        s = node_site(node)
        if node.kind == "head":
            dz = src[s][:, :, node.head] - tgt[s][:, :, node.head]  # [n, pos, d_head]
            return dz @ w_o[node.layer][node.head].to(dz.dtype)
        return src[s] - tgt[s]

    def _receiver_inputs(
        self, part, target, src_embed, alpha, g: dict[str, Tensor], receivers: list[Receiver]
    ) -> Tensor:
        """Each receiver's private input gradient ``J_v(x)^T dm/d(v)``: ``[R, n, pos, d_model]``.

        One forward pass serves every layer: the residual entering each receiver's layer (and
        between attention and MLP) is replaced by a detached leaf of the same value, which cuts
        the graph into per-layer pieces, so each receiver's input gradient is a backward through
        its own layer's norm and projection only. The receivers that read one site (the heads'
        q, k or v of a layer) go through that backward together, one batched call
        (``is_grads_batched``); heads sharing a key/value group under grouped-query attention
        share one slot and so one gradient."""
        model = self.model
        out: list[Tensor | None] = [None] * len(receivers)
        parallel = has_parallel_blocks(model)
        leaves: dict[str, Tensor] = {}
        acts: dict[str, Tensor] = {}

        def to_leaf(name):
            def fn(act):
                x = act.detach().clone().requires_grad_(True)
                leaves[name] = x
                return x

            return fn

        def keep(name):
            def fn(act):
                acts[name] = act

            return fn

        by_site: dict[str, list[int]] = {}
        hooks = {}
        for j, r in enumerate(receivers):
            if r.kind == "logits":
                out[j] = g[receiver_site(model, r)]
                continue
            by_site.setdefault(receiver_site(model, r), []).append(j)
            hooks[site("resid_pre", r.layer)] = to_leaf(site("resid_pre", r.layer))
            if not parallel:
                hooks[site("resid_mid", r.layer)] = to_leaf(site("resid_mid", r.layer))
        if not by_site:
            return torch.stack(out)
        if alpha:
            hooks[site("embed")] = self._embed_hook(src_embed, alpha)
        for name in by_site:
            hooks.setdefault(name, keep(name))
        with torch.enable_grad():
            model.run(target, hooks, stop_early=True)
            for name, idx in by_site.items():
                first = receivers[idx[0]]
                leaf = leaves[site("resid_pre" if (first.kind == "head" or parallel) else "resid_mid", first.layer)]
                grad_out = g[name]
                if first.kind != "head":
                    for j in idx:
                        (out[j],) = torch.autograd.grad(acts[name], leaf, grad_outputs=grad_out, retain_graph=True)
                    continue
                slots = sorted({receivers[j].head * acts[name].shape[2] // model.n_heads for j in idx})
                masked = torch.zeros(
                    (len(slots),) + tuple(grad_out.shape), dtype=grad_out.dtype, device=grad_out.device
                )
                for k, h in enumerate(slots):
                    masked[k, :, :, h] = grad_out[:, :, h]
                per_slot = _batched_input_grads(acts[name], leaf, masked)
                for j in idx:
                    out[j] = per_slot[slots.index(receivers[j].head * acts[name].shape[2] // model.n_heads)]
        return torch.stack([o.detach() for o in out])


def _batched_input_grads(output: Tensor, leaf: Tensor, grad_outputs: Tensor) -> Tensor:
    """``[m, ...leaf]``: the vector-Jacobian product of ``output`` with each of the ``m`` rows of
    ``grad_outputs``, in one vmapped backward (a loop where an operation has no batching rule)."""
    try:
        (grads,) = torch.autograd.grad(
            output, leaf, grad_outputs=grad_outputs, retain_graph=True, is_grads_batched=True
        )
        return grads
    except RuntimeError:
        rows = [torch.autograd.grad(output, leaf, grad_outputs=go, retain_graph=True)[0] for go in grad_outputs]
        return torch.stack(rows)


def _node_row(node: Node, position, score: float) -> dict:
    return {
        "node": node.name,
        "kind": node.kind,
        "layer": node.layer,
        "head": node.head,
        "position": position,
        "score": score,
    }


def _order(name: str):
    return parse_site(name).order
