"""Circuits in MIB's graph format, checked against files EAP-IG's own code wrote.

``tests/data/eap_ig_{sequential,parallel}.json`` were written by EAP-IG's ``Graph.to_json``
(``tests/data/make_eap_ig_fixtures.py`` says how) for the shipped world model's shape and for the
tiny GPT-NeoX model's (parallel attention and MLP). EAP-IG itself does not import under
TransformerLens 4, so the suite cannot call it; these files are its output.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import interp
from circuits import all_nodes, all_receivers
from circuits.mib import MIBFormatError, from_mib_node, mib_graph, read_mib_graph, to_mib_node, write_mib_graph
from circuits.path_patching import reaches

DATA = Path(__file__).parent / "data"


def full_edges(model, seed: int = 0) -> pd.DataFrame:
    """Every (node, receiver) edge of ``model`` with a random score, as AttributionPatching.edges names them."""
    rng = np.random.default_rng(seed)
    rows = [(n.name, r.name) for n in all_nodes(model) for r in all_receivers(model) if reaches(model, n, r)]
    return pd.DataFrame(rows, columns=["sender", "receiver"]).assign(score=rng.normal(size=len(rows)))


@pytest.fixture(scope="module")
def world():
    return interp.load_model("world")


@pytest.fixture(scope="module")
def neox(model_dirs):
    return interp.load_model(str(model_dirs["gpt_neox"]))


def test_names_map_both_ways():
    for ours, theirs in [("embed", "input"), ("L3H5", "a3.h5"), ("MLP2", "m2"), ("logits", "logits")]:
        assert to_mib_node(ours) == theirs and from_mib_node(theirs) == ours
    assert to_mib_node("L1H0.k") == "a1.h0<k>" and from_mib_node("a1.h0", "k") == "L1H0.k"
    with pytest.raises(MIBFormatError, match="not a node or receiver name"):
        to_mib_node("head 3")
    with pytest.raises(MIBFormatError, match="not a MIB node name"):
        from_mib_node("attn3")


@pytest.mark.parametrize("shape", ["sequential", "parallel"])
def test_a_graph_eap_ig_wrote_reads_back_and_is_written_identically(shape, world, neox):
    """The edges of EAP-IG's graph are exactly this toolkit's edges of a model of that shape (the
    parallel block: no head feeds its own layer's MLP), its scores read back exactly, and the same
    scores written here with EAP-IG's top-n selection give the file EAP-IG wrote, key for key:
    the same circuit after the same pruning."""
    model = world if shape == "sequential" else neox
    path = DATA / f"eap_ig_{shape}.json"
    theirs = json.loads(path.read_text())
    table = read_mib_graph(path, model)
    ours = full_edges(model)
    assert set(zip(table.sender, table.receiver)) == set(zip(ours.sender, ours.receiver))
    assert len(table) == len(theirs["edges"]) == len(ours)
    assert table.attrs["cfg"] == theirs["cfg"]
    scores = {k: v["score"] for k, v in theirs["edges"].items()}
    assert [scores[f"{to_mib_node(a)}->{to_mib_node(b)}"] for a, b in zip(table.sender, table.receiver)] == list(
        table.score
    )
    assert table.in_graph.sum() == sum(v["in_graph"] for v in theirs["edges"].values()) > 0
    top_n = {"sequential": 150, "parallel": 60}[shape]  # what the fixture's apply_topn was given
    assert mib_graph(table, model, top_n=top_n) == theirs


def test_round_trip_and_a_circuit_given_by_column(tmp_path, world):
    edges = full_edges(world, seed=1)
    path = write_mib_graph(edges, world, tmp_path / "g" / "graph.json", top_n=200)
    back = read_mib_graph(path, world)
    assert list(zip(back.sender, back.receiver)) == list(zip(edges.sender, edges.receiver))
    assert (back.score.to_numpy() == edges.score.to_numpy()).all()  # JSON floats round-trip exactly
    d = json.loads(path.read_text())
    assert list(back.in_graph) == [v["in_graph"] for v in d["edges"].values()]
    assert back.in_graph.sum() <= 200 and set(back.attrs["nodes"]) >= {"logits"}
    # a receiver column says which input of a head an edge enters
    assert set(back.receiver_input) == {"q", "k", "v", "mlp", "logits"}
    # a circuit of one's own: every kept edge leads from the input to the logits, or is pruned
    edges["mine"] = False
    edges.loc[(edges.sender == "embed") & (edges.receiver == "logits"), "mine"] = True
    edges.loc[(edges.sender == "L0H0") & (edges.receiver == "MLP3"), "mine"] = True  # cut off from the input
    g = mib_graph(edges, world, in_graph="mine")
    assert [k for k, v in g["edges"].items() if v["in_graph"]] == ["input->logits"]
    unpruned = mib_graph(edges, world, in_graph="mine", pruned=False)
    assert sum(v["in_graph"] for v in unpruned["edges"].values()) == 2
    # as EAP-IG without pruning: a node with an in-graph edge in and one out (input needs none in)
    assert {n for n, v in unpruned["nodes"].items() if v["in_graph"]} == {"input", "logits"}
    # no circuit given: a file of scores only
    assert not any(v["in_graph"] for v in mib_graph(edges, world)["edges"].values())


def test_what_the_format_cannot_hold_is_refused(tmp_path, world, model_dirs):
    gqa = interp.load_model(str(model_dirs["llama_gqa"]))
    with pytest.raises(MIBFormatError, match="grouped-query attention"):
        mib_graph(full_edges(gqa), gqa)
    edges = full_edges(world)
    with pytest.raises(MIBFormatError, match="lacks"):
        mib_graph(edges.drop(columns="score"), world)
    with pytest.raises(MIBFormatError, match="not both"):
        mib_graph(edges.assign(c=True), world, top_n=3, in_graph="c")
    with pytest.raises(MIBFormatError, match="NaN scores"):
        mib_graph(edges.assign(score=np.nan), world, top_n=3)
    with pytest.raises(MIBFormatError, match="edge table has"):
        mib_graph(edges, world, top_n=len(edges) + 1)
    with pytest.raises(MIBFormatError, match="True or False"):
        mib_graph(edges.assign(c=np.nan), world, in_graph="c")
    with pytest.raises(MIBFormatError, match="twice"):
        mib_graph(pd.concat([edges, edges.head(1)]), world)
    with pytest.raises(MIBFormatError, match="graph of another model"):
        read_mib_graph(DATA / "eap_ig_parallel.json", world)
    with pytest.raises(MIBFormatError, match="no MIB graph file"):
        read_mib_graph(tmp_path / "none.json")
    (tmp_path / "bad.json").write_text(json.dumps({"cfg": {}, "nodes": {}}))
    with pytest.raises(MIBFormatError, match="lacks"):
        read_mib_graph(tmp_path / "bad.json")
    (tmp_path / "bad.json").write_text(json.dumps({"cfg": {}, "nodes": {}, "edges": {"a0.h0=>m1": {"score": 1}}}))
    with pytest.raises(MIBFormatError, match="not a MIB edge name"):
        read_mib_graph(tmp_path / "bad.json")
    (tmp_path / "bad.json").write_text(json.dumps({"cfg": {}, "nodes": {}, "edges": {"input->a1.h0": {"score": 1}}}))
    with pytest.raises(MIBFormatError, match="names its input"):
        read_mib_graph(tmp_path / "bad.json")
