"""Components of a transformer that circuits are made of, and how to name them.

A *node* is something that writes into the residual stream: the token embeddings (``embed``),
an attention head (``L{layer}H{head}``, its output ``z`` times ``W_O``) or an MLP
(``MLP{layer}``). A *receiver* is where a node's write is read: a head's query, key or value
input (``L1H3.q``, ``L1H3.k``, ``L1H3.v``), an MLP's input (``MLP2``) or the final residual
stream that the unembedding reads (``logits``). An edge is a (node, receiver) pair with the
node strictly before the receiver.

Under grouped-query attention (Llama 3, Qwen 2: ``n_kv_heads < n_heads``) a key or value is
shared by a group of ``n_heads // n_kv_heads`` query heads, so it is one receiver, named after
the group's first query head: with 4 heads in 2 groups the key receivers of layer 1 are
``L1H0.k`` (read by heads 0 and 1) and ``L1H2.k`` (heads 2 and 3); ``L1H1.k`` is an error that
says so. Queries stay per head.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable
from dataclasses import dataclass


class UnknownComponentError(ValueError):
    """A component name that the model does not have."""


@dataclass(frozen=True)
class Node:
    kind: str  # "embed" | "head" | "mlp"
    layer: int = -1  # -1 for the embeddings
    head: int | None = None

    @property
    def name(self) -> str:
        if self.kind == "embed":
            return "embed"
        if self.kind == "head":
            return f"L{self.layer}H{self.head}"
        return f"MLP{self.layer}"

    @property
    def order(self) -> tuple[int, int]:
        """Where the node writes: (layer, 0 for attention / 1 for MLP); embeddings first."""
        return (self.layer, 1 if self.kind == "mlp" else 0)

    def __str__(self) -> str:
        return self.name


@dataclass(frozen=True)
class Receiver:
    kind: str  # "head" | "mlp" | "logits"
    layer: int
    head: int | None = None
    input: str = "resid"  # "q" | "k" | "v" for heads; "resid" otherwise

    @property
    def name(self) -> str:
        if self.kind == "head":
            return f"L{self.layer}H{self.head}.{self.input}"
        if self.kind == "mlp":
            return f"MLP{self.layer}"
        return "logits"

    @property
    def order(self) -> tuple[int, int]:
        return (self.layer, 1 if self.kind == "mlp" else 0)

    def reads(self, node: Node) -> bool:
        """True when ``node`` writes before this receiver reads (an edge can exist)."""
        return node.order < self.order

    def __str__(self) -> str:
        return self.name


_HEAD = re.compile(r"^L(\d+)H(\d+)$")
_HEAD_IN = re.compile(r"^L(\d+)H(\d+)\.([qkv])$")
_MLP = re.compile(r"^MLP(\d+)$")


def all_nodes(model, mlps: bool = True, embed: bool = True) -> list[Node]:
    has_mlp = any(s.endswith("hook_mlp_out") for s in model.sites)
    out = [Node("embed")] if embed else []
    for layer in range(model.n_layers):
        out += [Node("head", layer, h) for h in range(model.n_heads)]
        if mlps and has_mlp:
            out.append(Node("mlp", layer))
    return out


def group_size(model) -> int:
    """Query heads per key/value head (1 without grouped-query attention)."""
    return model.n_heads // getattr(model, "n_kv_heads", model.n_heads)


def all_receivers(model, inputs: str = "qkv", mlps: bool = True, logits: bool = True) -> list[Receiver]:
    has_mlp = any(s.endswith("hook_mlp_out") for s in model.sites)
    group = group_size(model)
    out = []
    for layer in range(model.n_layers):
        out += [
            Receiver("head", layer, h, c) for h in range(model.n_heads) for c in inputs if c == "q" or h % group == 0
        ]
        if mlps and has_mlp:
            out.append(Receiver("mlp", layer))
    if logits:
        out.append(Receiver("logits", model.n_layers))
    return out


def _unknown(text: str, valid: list[str], what: str) -> UnknownComponentError:
    near = difflib.get_close_matches(str(text), valid, n=3, cutoff=0.5)
    hint = f"; did you mean {', '.join(map(repr, near))}?" if near else ""
    return UnknownComponentError(
        f"unknown {what} {text!r}{hint} Valid names look like {', '.join(valid[:3])}, ... {valid[-1]} "
        f"({len(valid)} in this model)."
    )


def _parse(spec, valid: list, cls: type, what: str):
    by_name = {x.name: x for x in valid}
    name = spec.name if isinstance(spec, cls) else str(spec)
    if name in by_name and (not isinstance(spec, cls) or spec in valid):
        return by_name[name]
    raise _unknown(name, list(by_name), what)


def parse_node(model, spec) -> Node:
    """A :class:`Node` from ``"embed"``, ``"L1H3"``, ``"MLP2"`` or a Node (checked against the model)."""
    return _parse(spec, all_nodes(model), Node, "node")


def parse_receiver(model, spec) -> Receiver:
    """A :class:`Receiver` from ``"L1H3.k"``, ``"MLP2"``, ``"logits"`` or a Receiver."""
    name = spec.name if isinstance(spec, Receiver) else str(spec)
    m, group = _HEAD_IN.match(name), group_size(model)
    if m and m.group(3) in "kv" and group > 1 and int(m.group(2)) % group and int(m.group(2)) < model.n_heads:
        layer, head, which = int(m.group(1)), int(m.group(2)), m.group(3)
        first = head - head % group
        raise UnknownComponentError(
            f"receiver {name!r}: this model uses grouped-query attention ({model.n_heads} query heads share "
            f"{model.n_kv_heads} key/value heads), so head {head} reads the {'key' if which == 'k' else 'value'} "
            f"of the group of heads {first}..{first + group - 1}; that receiver is named 'L{layer}H{first}.{which}'"
        )
    return _parse(spec, all_receivers(model), Receiver, "receiver")


def parse_nodes(model, specs: Iterable | None) -> list[Node]:
    if specs is None:
        return all_nodes(model)
    if isinstance(specs, (str, Node)):
        specs = [specs]
    return [parse_node(model, s) for s in specs]


def parse_receivers(model, specs: Iterable | None) -> list[Receiver]:
    if specs is None:
        return all_receivers(model)
    if isinstance(specs, (str, Receiver)):
        specs = [specs]
    return [parse_receiver(model, s) for s in specs]
