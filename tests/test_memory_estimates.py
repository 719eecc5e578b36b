"""Analyzers estimate their memory before any forward pass and refuse, naming what to restrict."""

import sys

import pytest
import torch

import interp
from circuits import (
    ActivationPatching,
    AttributionPatching,
    EdgePatching,
    Faithfulness,
    PathPatching,
    make_pairs,
)
from interp import memory
from interp.relations import Relation
from jacobians import coordinates_per_pass, jacobian
from probes import ProbeSweep, fit_logistic
from probes.logistic import solver_bytes

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


@pytest.mark.parametrize(
    "what",
    ["eap", "edge_patching", "faithfulness", "activation_patching", "path_patching", "nodes", "jacobian", "capture"],
)
def test_refuses_before_any_pass_when_memory_is_short(counted, monkeypatch, what):
    model, pairs, runs = counted
    monkeypatch.setattr(memory, "available_bytes", lambda device: 1024)
    with pytest.raises(MemoryError, match="batch_size") as err:
        if what == "eap":
            AttributionPatching(model, "logit_diff", progress=False).edges(pairs)
        elif what == "edge_patching":
            ep = EdgePatching(model, "logit_diff", progress=False)
            ep.evaluate(pairs, [[1.0] * len(ep.edges())])
        elif what == "activation_patching":
            ActivationPatching(model, "logit_diff", progress=False).run(pairs)
        elif what == "path_patching":
            PathPatching(model, "logit_diff", receivers=["logits"], progress=False).run(pairs)
        elif what == "nodes":
            AttributionPatching(model, "logit_diff", progress=False).nodes(pairs)
        elif what == "jacobian":
            jacobian(model, CLEAN, of="logits")
        elif what == "capture":
            interp.capture(model, CLEAN, sites=["blocks.1.hook_resid_post"], positions="all")
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


def test_probe_solver_refuses_and_says_what_to_restrict(monkeypatch):
    X = torch.randn(3, 40, 16)
    y = torch.randint(0, 3, (2, 40))
    monkeypatch.setattr(memory, "available_bytes", lambda device: 1024)
    with pytest.raises(MemoryError, match="max_elements or sites_per_pass"):
        fit_logistic(X, y)
    with pytest.raises(MemoryError, match="probes"):
        ProbeSweep(folds=2, control=False, progress=False).run(
            {"r": {"blocks.0.hook_resid_post": X[0]}}, [_relation(40)]
        )
    monkeypatch.setattr(memory, "enabled", False)
    assert fit_logistic(X, y).coef.shape == (3, 2, 16, 3)


def test_the_capture_estimate_counts_the_rows_it_holds(counted, monkeypatch, tmp_path):
    """Capture refuses when the captured rows would not fit, says to shard them into a store,
    and fits where a store holds one shard at a time."""
    model, _, runs = counted
    prompts = CLEAN * 50  # 100 prompts
    need = {}
    real = memory.check_fits
    monkeypatch.setattr(memory, "check_fits", lambda n, *a: need.setdefault("bytes", n) and real(n, *a))
    interp.capture(model, prompts, sites=["blocks.1.hook_resid_post"], positions="all", batch_size=10)
    whole = need.pop("bytes")
    n_pos = max(len(model.tokenizer(p)["input_ids"]) for p in prompts)
    assert whole >= 3 * 100 * n_pos * model.d_model * 4  # every token's row, three times, float32
    monkeypatch.setattr(memory, "available_bytes", lambda device: whole - 1)
    runs.clear()
    with pytest.raises(MemoryError, match="store=") as err:
        interp.capture(model, prompts, sites=["blocks.1.hook_resid_post"], positions="all", batch_size=10)
    assert runs == [] and "100 rows at once" in str(err.value)
    store = interp.capture(
        model, prompts, sites=["blocks.1.hook_resid_post"], positions="all", batch_size=10, store=tmp_path / "s",
        shard_size=10,
    )  # fmt: skip
    assert len(runs) == 10 and store is not None  # one shard's rows at a time fit


def test_the_estimate_grows_with_what_the_solver_holds():
    small = solver_bytes(2, 5, 100, 64, 4, torch.float32, reduce=False)
    assert small < solver_bytes(4, 5, 100, 64, 4, torch.float32, reduce=False)
    assert small < solver_bytes(2, 5, 100, 128, 4, torch.float32, reduce=False)
    assert solver_bytes(2, 5, 100, 4096, 4, torch.float32, reduce=True, m=80) < solver_bytes(
        2, 5, 100, 4096, 4, torch.float32, reduce=False
    )


def test_a_jacobian_in_several_vmapped_passes_equals_one_pass(counted, monkeypatch):
    """Short of memory, the output coordinates go through the backward pass a few at a time."""
    jac = sys.modules["jacobians.jacobian"]  # the module (the package's `jacobian` is the function)
    model, _, _ = counted
    whole = jacobian(model, CLEAN, wrt="hook_embed", of="blocks.1.hook_resid_post")
    calls = []
    original = torch.autograd.grad
    monkeypatch.setattr(torch.autograd, "grad", lambda *a, **k: calls.append(1) or original(*a, **k))
    monkeypatch.setattr(jac, "coordinates_per_pass", lambda *a: 10)
    parts = jacobian(model, CLEAN, wrt="hook_embed", of="blocks.1.hook_resid_post")
    torch.testing.assert_close(parts, whole, atol=1e-6, rtol=1e-5)
    assert len(calls) == -(-model.d_model // 10)


def test_coordinates_per_pass_follow_the_free_memory(counted, monkeypatch):
    model, _, _ = counted
    batch = model.batch(model.encode(CLEAN), "right")
    monkeypatch.setattr(memory, "available_bytes", lambda device: 2**34)
    plenty = coordinates_per_pass(model, batch, "hook_embed", "logits")
    monkeypatch.setattr(memory, "available_bytes", lambda device: 2**30)
    less = coordinates_per_pass(model, batch, "hook_embed", "logits")
    assert 1 <= less < plenty
    monkeypatch.setattr(memory, "enabled", False)
    assert coordinates_per_pass(model, batch, "hook_embed", "logits") is None


def _relation(n):
    return Relation("r", [f"s{i}" for i in range(n)], [f"a{i % 3}" for i in range(n)], "{} is")
