"""Circuits in MIB's graph format: edge scores that EAP-IG and the MIB circuit track read and write.

The circuit-localization track of MIB (Mueller et al. 2025) and the EAP-IG library exchange a
circuit as one JSON file, the one ``eap.graph.Graph.to_json`` writes and ``Graph.from_json``
reads::

    {"cfg":   {"n_layers": 12, "n_heads": 12, "parallel_attn_mlp": false, "d_model": 768},
     "nodes": {"input": {"in_graph": true}, "a0.h0": {"in_graph": false}, ..., "m0": {...},
               "logits": {"in_graph": true}},
     "edges": {"input->a0.h0<q>": {"score": 0.012, "in_graph": false}, ...,
               "a0.h3->m0": {...}, "m11->logits": {...}}}

Its nodes and edges are this toolkit's (:mod:`circuits.components`) under other names:

=================  ==================  =============================================
here               MIB / EAP-IG        what it is
=================  ==================  =============================================
``embed``          ``input``           the token (and position) embeddings
``L3H5``           ``a3.h5``           attention head 5 of layer 3 (its output)
``MLP3``           ``m3``              layer 3's MLP (its output, or its input as a receiver)
``L3H5.q``         ``a3.h5<q>``        that head's query input (``k``, ``v`` alike)
``logits``         ``logits``          the final residual stream
=================  ==================  =============================================

so an edge ``embed -> L1H0.k`` is ``input->a1.h0<k>``. :func:`mib_graph` turns the table of
:meth:`AttributionPatching.edges <circuits.AttributionPatching.edges>` (or any table with
``sender``, ``receiver`` and ``score``) into that dictionary, marking the circuit's edges
``in_graph`` (the ``top_n`` by absolute score, as MIB's evaluation selects them, or a column of
your own); :func:`write_mib_graph` writes it, and :func:`read_mib_graph` reads such a file back
into a tidy table with this toolkit's names, so scores computed elsewhere can be tested with
:class:`circuits.Faithfulness` or drawn with :func:`circuits.circuit_graph`.

Two limits, both refused with a message: MIB's graph has one key and one value input per
*query* head, so a model with grouped-query attention (shared key/value heads) has no faithful
export; and a file whose ``cfg`` does not match the model it is read for is refused by
:func:`read_mib_graph` when a model is given.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pandas as pd

from interp.results import write_text

from .components import group_size
from .path_patching import has_parallel_blocks

#: the columns of :func:`read_mib_graph`'s table
MIB_COLUMNS = ["sender", "receiver", "receiver_input", "score", "in_graph"]

_NODE = re.compile(r"^(?:input|logits|a(\d+)\.h(\d+)|m(\d+))$")
_EDGE = re.compile(r"^(?P<parent>[^-<>]+)->(?P<child>[^-<>]+?)(?:<(?P<qkv>[qkv])>)?$")


class MIBFormatError(ValueError):
    """A graph file or an edge table that MIB's format cannot hold or that does not parse."""


def mib_config(model) -> dict:
    """The ``cfg`` of a model's MIB graph: ``n_layers``, ``n_heads``, ``parallel_attn_mlp``, ``d_model``."""
    if group_size(model) > 1:
        raise MIBFormatError(
            f"{model!r} shares each key/value head among {group_size(model)} query heads (grouped-query "
            "attention); MIB's graph format has one key and one value input per query head, so its edges "
            "cannot be written there without inventing per-head scores. Keep the table (edges.to_csv)."
        )
    return {
        "n_layers": int(model.n_layers),
        "n_heads": int(model.n_heads),
        "parallel_attn_mlp": bool(has_parallel_blocks(model)),
        "d_model": int(model.d_model),
    }


def to_mib_node(name: str) -> str:
    """This toolkit's node or receiver name in MIB's spelling (``L3H5.q`` -> ``a3.h5<q>``)."""
    if name == "embed":
        return "input"
    if name == "logits":
        return "logits"
    m = re.fullmatch(r"L(\d+)H(\d+)(?:\.([qkv]))?", name)
    if m:
        return f"a{m[1]}.h{m[2]}" + (f"<{m[3]}>" if m[3] else "")
    m = re.fullmatch(r"MLP(\d+)", name)
    if m:
        return f"m{m[1]}"
    raise MIBFormatError(f"{name!r} is not a node or receiver name (embed, L3H5, L3H5.q, MLP3, logits)")


def from_mib_node(name: str, qkv: str | None = None) -> str:
    """MIB's node name (and an attention input) in this toolkit's spelling (``a3.h5``, ``q`` -> ``L3H5.q``)."""
    m = _NODE.fullmatch(name)
    if not m:
        raise MIBFormatError(f"{name!r} is not a MIB node name (input, a3.h5, m3, logits)")
    if name == "input":
        return "embed"
    if name == "logits":
        return "logits"
    if m[1] is not None:
        return f"L{m[1]}H{m[2]}" + (f".{qkv}" if qkv else "")
    return f"MLP{m[3]}"


def prune(edges: list[tuple[str, str]]) -> tuple[set[int], set[str]]:
    """EAP-IG's ``Graph.prune`` on in-graph edges given as ``(parent, child)`` MIB node names (the
    child without its ``<q>``): a node stays when it has an in-graph edge out and one in (``input``
    needs none in), an edge when its parent stays and its child does (``logits`` always does),
    repeated until nothing changes. Returns the indices of the edges kept and the nodes kept."""
    keep = set(range(len(edges)))
    while True:
        out = {edges[i][0] for i in keep}
        inn = {edges[i][1] for i in keep} | {"input"}
        nodes = out & inn
        kept = {i for i in keep if edges[i][0] in nodes and (edges[i][1] == "logits" or edges[i][1] in nodes)}
        if kept == keep:
            return keep, nodes
        keep = kept


def mib_graph(
    edges: pd.DataFrame, model, top_n: int | None = None, in_graph: str | None = None, pruned: bool = True
) -> dict:
    """The MIB graph dictionary of an edge table (``sender``, ``receiver``, ``score``; one row per
    edge, as :meth:`AttributionPatching.edges <circuits.AttributionPatching.edges>` returns).

    ``top_n``: the circuit is the ``top_n`` edges by absolute score (ties to the earlier row), then
    (``pruned``, as EAP-IG's ``apply_topn`` does by default) without the edges and nodes cut off
    from the input or the logits (:func:`prune`); ``in_graph``: or a boolean column of ``edges``
    says which edges are in it (pruned alike); neither: no edge is (a file of scores only).
    ``logits`` is always in the graph, as in EAP-IG. Edges of the model that the table lacks are
    left out of the file (EAP-IG reads them at score 0)."""
    missing = {"sender", "receiver", "score"} - set(edges.columns)
    if missing:
        raise MIBFormatError(f"the edge table lacks {sorted(missing)}: give AttributionPatching.edges()'s table")
    if top_n is not None and in_graph is not None:
        raise MIBFormatError("give top_n or in_graph, not both")
    if in_graph is not None and in_graph not in edges:
        raise MIBFormatError(f"no column {in_graph!r} in the edge table")
    if edges.duplicated(["sender", "receiver"]).any():
        raise MIBFormatError("the edge table has an edge twice: one row per (sender, receiver)")
    cfg = mib_config(model)
    if top_n is not None:
        if edges.score.isna().any():
            raise MIBFormatError("the edge table has NaN scores: top_n cannot rank them (drop or fill them first)")
        if not 0 <= top_n <= len(edges):
            raise MIBFormatError(f"top_n={top_n}, but the edge table has {len(edges)} edges")
        # ties in |score| go to the earlier row (EAP-IG breaks them by its own tensor order)
        chosen = edges.score.abs().rank(method="first", ascending=False) <= top_n
    elif in_graph is not None:
        if edges[in_graph].isna().any() or not set(edges[in_graph].unique()) <= {True, False}:
            raise MIBFormatError(f"the column {in_graph!r} must be True or False for every edge")
        chosen = edges[in_graph].astype(bool)
    else:
        chosen = pd.Series(False, index=edges.index)
    nodes = {"input": {"in_graph": False}}
    for layer in range(cfg["n_layers"]):
        nodes.update({f"a{layer}.h{h}": {"in_graph": False} for h in range(cfg["n_heads"])})
        nodes[f"m{layer}"] = {"in_graph": False}
    nodes["logits"] = {"in_graph": True}
    names = [(to_mib_node(a), to_mib_node(b)) for a, b in zip(edges.sender, edges.receiver)]
    for parent, child in names:
        for n in (parent, child.split("<")[0]):
            if n not in nodes:
                raise MIBFormatError(f"{n!r} is not a node of this model ({cfg['n_layers']} layers)")
    chosen = [i for i, c in enumerate(chosen) if c]
    ends = [(names[i][0], names[i][1].split("<")[0]) for i in chosen]
    if pruned:
        kept, kept_nodes = prune(ends)
        chosen = [chosen[i] for i in sorted(kept)]
    else:  # as EAP-IG's apply_topn(prune=False): a node with an in-graph edge in and one out
        kept_nodes = {a for a, _ in ends} & ({b for _, b in ends} | {"input"})
    for n in kept_nodes - {"logits"}:
        nodes[n]["in_graph"] = True
    on = set(chosen)
    out = {
        f"{parent}->{child}": {"score": float(score), "in_graph": i in on}
        for i, ((parent, child), score) in enumerate(zip(names, edges.score))
    }
    return {"cfg": cfg, "nodes": nodes, "edges": out}


def write_mib_graph(
    edges: pd.DataFrame,
    model,
    path: str | Path,
    top_n: int | None = None,
    in_graph: str | None = None,
    pruned: bool = True,
) -> Path:
    """Write :func:`mib_graph` to ``path`` as JSON (atomically); the file EAP-IG's
    ``Graph.from_json`` and MIB's evaluation read."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text(json.dumps(mib_graph(edges, model, top_n, in_graph, pruned)), path)
    return path


def read_mib_graph(path: str | Path, model=None) -> pd.DataFrame:
    """A MIB graph file as a tidy table with this toolkit's names (:data:`MIB_COLUMNS`), its
    ``cfg`` in ``attrs["cfg"]`` and the in-graph nodes in ``attrs["nodes"]``. With ``model``,
    the file's ``cfg`` must be the model's (layers, heads, block layout)."""
    path = Path(path)
    if not path.exists():
        raise MIBFormatError(f"no MIB graph file at {path}")
    d = json.loads(path.read_text())
    missing = {"cfg", "nodes", "edges"} - set(d)
    if missing:
        raise MIBFormatError(f"{path} is not a MIB graph file: it lacks {sorted(missing)}")
    if model is not None:
        mine = mib_config(model)
        theirs = {k: d["cfg"].get(k) for k in ("n_layers", "n_heads", "parallel_attn_mlp")}
        if theirs != {k: mine[k] for k in theirs}:
            raise MIBFormatError(f"{path} is a graph of another model: its cfg {theirs}, the model's {mine}")
    rows = []
    for name, info in d["edges"].items():
        m = _EDGE.fullmatch(name)
        if not m:
            raise MIBFormatError(f"{name!r} is not a MIB edge name (parent->child, or parent->a1.h0<q>)")
        if m["child"].startswith("a") and not m["qkv"]:
            raise MIBFormatError(f"{name!r}: an edge into an attention head names its input (<q>, <k> or <v>)")
        child = from_mib_node(m["child"], m["qkv"])
        rows.append(
            {
                "sender": from_mib_node(m["parent"]),
                "receiver": child,
                "receiver_input": m["qkv"] or ("mlp" if child.startswith("MLP") else "logits"),
                "score": float(info["score"]),
                "in_graph": bool(info.get("in_graph", False)),
            }
        )
    table = pd.DataFrame(rows, columns=MIB_COLUMNS)
    table.attrs["cfg"] = dict(d["cfg"])
    table.attrs["nodes"] = sorted(from_mib_node(n) for n, v in d["nodes"].items() if v.get("in_graph"))
    return table


__all__ = [
    "MIB_COLUMNS",
    "MIBFormatError",
    "from_mib_node",
    "mib_config",
    "mib_graph",
    "prune",
    "read_mib_graph",
    "to_mib_node",
    "write_mib_graph",
]
