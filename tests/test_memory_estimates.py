"""Analyzers estimate their memory before any forward pass and refuse, naming what to restrict."""

import pytest

import interp
from circuits import AttributionPatching, EdgePatching, Faithfulness, make_pairs, memory

CLEAN = ["Paris is the capital of France", "Rome is the capital of Italy"]
CORRUPTED = ["Berlin is the capital of France", "Madrid is the capital of Italy"]


@pytest.fixture
def counted(model_dirs, monkeypatch):
    model = interp.load_model(model_dirs["gpt2"])
    pairs = make_pairs(model, CLEAN, CORRUPTED, answer=["Paris", "Rome"], wrong=["Berlin", "Madrid"])
    runs = []
    original = model.run
    monkeypatch.setattr(model, "run", lambda *a, **k: runs.append(1) or original(*a, **k))
    return model, pairs, runs


def test_estimates_are_positive_and_grow_with_the_batch(counted):
    model, pairs, _ = counted
    one = memory.forward_bytes(model, 1, pairs.n_pos, graph=True)
    assert (
        0
        < memory.forward_bytes(model, 1, pairs.n_pos, graph=False)
        < one
        < memory.forward_bytes(model, 4, pairs.n_pos, graph=True)
    )
    assert memory.available_bytes("cpu") is None or memory.available_bytes("cpu") > 0


@pytest.mark.parametrize("what", ["eap", "edge_patching", "faithfulness"])
def test_refuses_before_any_pass_when_memory_is_short(counted, monkeypatch, what):
    model, pairs, runs = counted
    monkeypatch.setattr(memory, "available_bytes", lambda device: 1024)
    with pytest.raises(MemoryError, match="batch_size") as err:
        if what == "eap":
            AttributionPatching(model, "logit_diff", progress=False).edges(pairs)
        elif what == "edge_patching":
            ep = EdgePatching(model, "logit_diff", progress=False)
            ep.evaluate(pairs, [[1.0] * len(ep.edges())])
        else:
            edges = AttributionPatching(model, "logit_diff", progress=False)
            monkeypatch.setattr(memory, "available_bytes", lambda device: None)  # the scores themselves fit
            scores = edges.edges(pairs)
            monkeypatch.setattr(memory, "available_bytes", lambda device: 1024)
            runs.clear()
            Faithfulness(model, "logit_diff", fractions=(0.5, 1.0), n_random=1, progress=False).run(
                pairs, {"EAP": scores}
            )
    assert "GiB" in str(err.value) and "free on cpu" in str(err.value)
    assert (
        runs == [] or what == "faithfulness" and len(runs) <= 1
    )  # nothing run (faithfulness: at most its prepare pass)
