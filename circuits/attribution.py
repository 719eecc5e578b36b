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
need every receiver's private input gradient. A backend-neutral model has no per-head copy of the
residual stream, but it needs none: a head's query reads ``norm(x) W_Q,h``, so its input gradient
is ``dm/dq_h`` projected through that head's ``W_Q,h`` and then taken back through the norm alone,
at the run's own residual (no second forward; the fused q/k/v projection is never differentiated
per head). Plain EAP reads the target run's activations from that same run: one forward of the
source, one forward and backward of the target, and per layer one backward through its norm
for all its heads. An edge's score is then a dot product of the sender's write with the
receiver's input gradient over positions and ``d_model``: per pair and receiving layer, one
matrix product of the writes of only the senders that come before that layer (about half of
all sender x receiver products at GPT-2-small shape), in float32, summed over pairs in float64.
Everything is batched over pairs; nothing is run per component.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import pandas as pd
import torch

from interp import memory
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

    def _grads(
        self,
        part: Pairs,
        target,
        src_embed: Tensor,
        alpha: float,
        sites: list[str],
        keep: Sequence[str] = (),
        read: Sequence[str] = (),
    ) -> tuple[dict[str, Tensor], dict[str, Tensor], dict[str, Tensor]]:
        """One forward and one backward pass of the run at ``alpha``.

        Returns ``(grads, kept, graph)``: d(sum of per-pair metric)/d(activation) at ``sites``;
        the values at ``keep`` (detached, as a cache would read them); and every site's activation
        still inside the forward pass's graph (retained), for ``read`` and every other hooked
        site, so a caller can take further gradients between two sites of this same run
        (:meth:`_receiver_inputs`)."""
        leaves: dict[str, Tensor] = {}
        kept: dict[str, Tensor] = {}
        graph: dict[str, Tensor] = {}
        embed_name = site("embed")
        grad_sites, keep_sites, read_sites = set(sites), set(keep), set(read)

        def hook(name):
            move = self._embed_hook(src_embed, alpha) if (name == embed_name and alpha) else None

            def fn(act):
                if move is not None:
                    act = move(act)
                if name in read_sites and not act.requires_grad:
                    # nothing upstream needs a gradient (frozen weights, no earlier leaf): a
                    # leaf here, of the same value, keeps what follows it in a graph
                    act = act.detach().requires_grad_(True)
                    graph[name] = act
                    return act
                graph[name] = act
                if name in keep_sites:
                    kept[name] = act.detach().clone()
                if name not in grad_sites:
                    return act if move is not None else None
                z = torch.zeros_like(act, requires_grad=True)
                leaves[name] = z
                return act + z

            return fn

        names_hooked = grad_sites | keep_sites | read_sites | ({embed_name} if alpha else set())
        hooks = {s: hook(s) for s in names_hooked}
        with torch.enable_grad():
            logits = self.model.run(target, hooks)
            value = self.metric_.reduce(logits, part).sum()
            if not value.requires_grad:
                raise ValueError(
                    f"metric {self.metric_.name!r} is not differentiable with respect to the logits "
                    "(did it call .item(), argmax or detach?); attribution patching needs its gradient"
                )
            names = list(leaves)
            grads = torch.autograd.grad(value, [leaves[n] for n in names], allow_unused=True, retain_graph=True)
        grads_at = {n: (torch.zeros_like(leaves[n]) if g is None else g.detach()) for n, g in zip(names, grads)}
        return grads_at, kept, graph

    # node scores -------------------------------------------------------------------------------
    def nodes(self, pairs: Pairs) -> pd.DataFrame:
        """AtP (or AtP-IG) score of every node, averaged over pairs."""
        self._validate()
        sites = sorted({node_site(n) for n in self.nodes_} | {site("embed")}, key=_order)
        rows = min(self.batch_size, len(pairs))
        memory.check_fits(  # the graph, both runs' caches of the node sites and their gradients
            memory.forward_bytes(self.model, rows, pairs.n_pos, graph=True)
            + memory.activation_bytes(self.model, rows, pairs.n_pos, sites=3 * len(sites)),
            self.model,
            f"node attribution of {len(sites)} sites on batches of {rows} pairs x {pairs.n_pos} positions",
            f"use a smaller batch_size (now {self.batch_size} pairs), fewer nodes (nodes=[...]) or shorter prompts",
        )
        pairs = prepare(self.model, pairs, self.metric_)
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
            g, _, _ = self._grads(part, target, src_embed, a, sites)
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
        self._check_edge_memory(pairs)
        w_in = self._input_weights(receivers)
        one_point = self.alphas == [0.0]  # plain EAP: the target run is the gradient's run
        order, reached = _sender_prefixes(model, senders, receivers)
        bar = progress_bar(total=len(pairs), desc="attribution (edges)", unit="pairs", progress=self.progress)
        for part in pairs.batches(self.batch_size):
            target, source = batch_of(part, self.target_), batch_of(part, self.source_)
            src = cache(model, source, node_sites)
            embed = src[site("embed")]  # [n, pos, d_model]: the shape of every write and input gradient
            tgt = None if one_point else cache(model, target, node_sites)
            per_pair = torch.zeros(len(part), len(senders), len(receivers), dtype=torch.float64)  # [n, S, R]
            writes = None
            for a in self.alphas:
                g, kept_here, graph = self._grads(
                    part, target, embed, a, rec_sites,
                    keep=node_sites if one_point else (), read=self._graph_sites(receivers),
                )  # fmt: skip
                tgt = kept_here if one_point else tgt
                if writes is None:  # [n, S, pos, d_model], senders in the order they write, filled in place
                    writes = embed.new_empty((len(part), len(senders), *embed.shape[1:]))
                    for t, i in enumerate(order):
                        writes[:, t] = self._write_delta(senders[i], src, tgt, w_o)
                for js, rows in self._receiver_inputs(g, graph, receivers, w_in):
                    k = max(reached[j] for j in js)  # the senders that write before these receivers read
                    per_pair[:, :k, js] += _contract(writes[:, :k], rows)
                del graph
            per_pair = per_pair[:, torch.argsort(torch.as_tensor(order))] / len(self.alphas)  # senders as given
            scores += per_pair.sum(0)
            if self.uncertainty_ is not None:
                kept.append(per_pair.permute(1, 2, 0).float().cpu())  # [S, R, n]
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

    def _check_edge_memory(self, pairs: Pairs) -> None:
        """Refuse before any pass if one batch's graph, caches, writes, one layer's receiver input
        gradients and the norm's backward on a chunk of them would not fit on the model's device,
        or the float64 per-pair scores (three copies while they are put back in order) in the
        CPU's memory."""
        model, rows, n_pos = self.model, min(self.batch_size, len(pairs)), pairs.n_pos
        R, S = len(self.receivers_), len(self.nodes_)
        if S == 0 or R == 0:
            raise ValueError(
                f"edge attribution needs at least one sender and one receiver (got {S} senders, {R} receivers): "
                "name some with nodes=[...] and receivers=[...], or leave them out for all"
            )
        per_layer = max(Counter(r.layer for r in self.receivers_ if r.kind == "head").values(), default=1)
        residual = rows * n_pos * model.d_model * memory.element_bytes(model)
        per_pair = (S + per_layer) * n_pos * model.d_model * memory.element_bytes(model)
        chunk = max(_CHUNK_BYTES, residual)  # at least one head's rows go through the norm at once
        need = (
            memory.forward_bytes(model, rows, n_pos, graph=True)
            + memory.forward_bytes(model, rows, n_pos, graph=False)
            + rows * per_pair
            + 5 * 2 * chunk  # the chunk's copies of the residual, the norm's output and its gradients (widened)
        )
        what = f"edge attribution of {S} senders x {R} receivers on batches of {rows} pairs x {n_pos} positions"
        advice = (
            f"use a smaller batch_size (each pair adds about {per_pair / 1024**2:.0f} MiB), fewer receivers "
            "or senders (receivers=[...], nodes=[...]), or shorter prompts"
        )
        memory.check_fits(need, model, what, advice)
        memory.check_fits(3 * rows * S * R * 8, "cpu", what, advice)

    @staticmethod
    def _write_delta(node: Node, src, tgt, w_o) -> Tensor:
        s = node_site(node)
        if node.kind == "head":
            dz = src[s][:, :, node.head] - tgt[s][:, :, node.head]  # [n, pos, d_head]
            return dz @ w_o[node.layer][node.head].to(dz.dtype)
        return src[s] - tgt[s]

    def _graph_sites(self, receivers: list[Receiver]) -> list[str]:
        """The sites whose in-graph values :meth:`_receiver_inputs` differentiates between: each
        receiving layer's residual input, its attention input and (sequential blocks) the
        residual entering its MLP. Hooked only to be read; their gradients are not taken."""
        parallel = has_parallel_blocks(self.model)
        names = set()
        for r in receivers:
            if r.kind == "head":
                names |= {site("resid_pre", r.layer), site("attn_in", r.layer)}
            elif r.kind == "mlp":
                names.add(site("resid_pre" if parallel else "resid_mid", r.layer))
        return sorted(names, key=_order)

    def _input_weights(self, receivers: list[Receiver]) -> dict[tuple[int, str], Tensor]:
        """``W_Q`` / ``W_K`` / ``W_V`` of each receiving layer, read once before any pass."""
        wanted = {(r.layer, r.input) for r in receivers if r.kind == "head"}
        return {key: self.model.head_input_weights(*key).detach() for key in sorted(wanted)}

    def _receiver_inputs(self, g: dict[str, Tensor], graph: dict[str, Tensor], receivers: list[Receiver], w_in):
        """Each receiver's private input gradient ``J_v(x)^T dm/d(v)``: yields ``(js, rows)``,
        receivers ``js`` (indices into ``receivers``, all reading at one place: a layer's heads,
        one MLP, the logits) and their gradients ``rows`` (``[len(js), n, pos, d_model]``).

        ``x`` is the residual stream entering the receiver's layer (or its MLP), ``v`` the
        receiver's own read of it. For a head's query (key, value) that read is
        ``q_h = norm(x) W_Q,h + b``: the gradient is projected through the head's own slice of
        ``W_Q`` (``[d_head, d_model]``, not the whole fused projection), then taken back through
        the norm alone (the layer's own norm module, :meth:`interp.Model.attention_norm`, applied to
        the run's residual with the heads' gradients as more rows of a batch: a norm acts on each
        position alone, so one backward serves several heads); heads sharing a key/value group
        under grouped-query attention share one gradient. An MLP's is a backward through its
        norm and the MLP; the logits' is the gradient at the final residual itself. Rows are made
        a few at a time, when they are asked for (:data:`_CHUNK_BYTES`)."""
        model = self.model
        parallel = has_parallel_blocks(model)
        slots_at: dict[int, dict[tuple[str, int], list[int]]] = {}  # layer -> (input, head slot) -> its receivers
        for j, r in enumerate(receivers):
            if r.kind == "logits":
                yield [j], g[receiver_site(model, r)][None]
            elif r.kind == "mlp":
                x = graph[site("resid_pre" if parallel else "resid_mid", r.layer)]
                (grad,) = torch.autograd.grad(
                    graph[receiver_site(model, r)], x, grad_outputs=g[receiver_site(model, r)], retain_graph=True
                )
                yield [j], grad.detach()[None]
            else:  # the head's slot: its group under grouped-query attention
                h = r.head * g[site(r.input, r.layer)].shape[2] // model.n_heads
                slots_at.setdefault(r.layer, {}).setdefault((r.input, h), []).append(j)
        buf = None  # one layer's rows, reused by every layer: allocated (and its pages faulted) once
        for layer, slots in slots_at.items():
            u, x = graph[site("attn_in", layer)], graph[site("resid_pre", layer)]
            norm = model.attention_norm(layer) if u is not x else None  # post-norm BERT reads x itself
            keys = list(slots)
            if buf is None:
                buf = x.new_empty((max(map(len, slots_at.values())), *x.shape))
            per_chunk = max(1, _CHUNK_BYTES // (x.numel() * x.element_size()))
            for start in range(0, len(keys), per_chunk):
                chunk = keys[start : start + per_chunk]
                rows = buf[start : start + len(chunk)]  # [chunk, n, pos, d_model]
                for t, (c, h) in enumerate(chunk):  # d m / d(norm output) through each head alone
                    torch.matmul(g[site(c, layer)][:, :, h], w_in[(layer, c)][h].to(x.device, x.dtype).T, out=rows[t])
                if norm is not None:
                    rows.copy_(_norm_input_grads(norm, x, rows))
            rows = buf[: len(keys)]
            js = [j for key in keys for j in slots[key]]
            if len(js) > len(keys):  # a slot read by several receivers (one named twice)
                rows = rows[[t for t, key in enumerate(keys) for _ in slots[key]]]
            yield js, rows


#: the heads' input gradients go back through the norm a few at a time, at most this many bytes
#: at once: small enough to stay in the allocator's reused memory (larger blocks are mapped and
#: unmapped on every allocation, and each page is faulted in again)
_CHUNK_BYTES = 8 * 2**20


def _sender_prefixes(model, senders: list[Node], receivers: list[Receiver]) -> tuple[list[int], list[int]]:
    """The senders in the order they write (``order``, indices into ``senders``) and, per
    receiver, how many of them come first and can reach it (``reached``): every edge into a
    receiver is from a prefix of that order, so its scores need only that prefix's writes."""
    order = sorted(range(len(senders)), key=lambda i: senders[i].order)
    reached = []
    for r in receivers:
        hits = [pos for pos, i in enumerate(order) if reaches(model, senders[i], r)]
        reached.append(hits[-1] + 1 if hits else 0)
    return order, reached


def _contract(writes: Tensor, rows: Tensor) -> Tensor:
    """``[n, k, r]`` float64: per pair, every sender's write (``writes``, ``[n, k, pos, d]``) dotted
    with every receiver's input gradient (``rows``, ``[r, n, pos, d]``), summed over positions
    and ``d``: one matrix product per pair, on views (no copy of either tensor), in float32 or
    wider (half-precision operands are widened first; float64 on a GPU where TF32 matmuls are
    allowed, ``torch.set_float32_matmul_precision`` below ``"highest"``)."""
    n, k, r = writes.shape[0], writes.shape[1], rows.shape[0]
    wide = torch.promote_types(writes.dtype, torch.float32)
    if wide == torch.float32 and writes.is_cuda and torch.get_float32_matmul_precision() != "highest":
        wide = torch.float64  # TF32 (a global setting) would round float32 products to ~1e-3
    out = torch.zeros(n, k, r, dtype=torch.float64, device=writes.device)
    for i in range(n if k and r else 0):
        a = writes[i].flatten(1).to(wide)  # [k, pos * d]
        b = rows[:, i].flatten(1).to(wide)  # [r, pos * d]
        out[i] = a @ b.T
    return out.cpu()


def _norm_input_grads(norm, x: Tensor, grad_outputs: Tensor) -> Tensor:
    """``[m, ...x]``: the vector-Jacobian product of ``norm`` at ``x`` with each of the ``m``
    rows of ``grad_outputs``. A norm acts on each position's vector alone, so the ``m`` rows are
    one batch of ``m`` copies of ``x``: one forward and one backward of the norm, where a vmapped
    backward (``is_grads_batched``) falls back to a loop over the rows for LayerNorm."""
    m = grad_outputs.shape[0]
    with torch.enable_grad():
        xs = x.detach().expand(m, *x.shape).reshape(m * x.shape[0], *x.shape[1:]).requires_grad_(True)
        (grads,) = torch.autograd.grad(norm(xs), xs, grad_outputs=grad_outputs.reshape(xs.shape))
    return grads.view(grad_outputs.shape)


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
