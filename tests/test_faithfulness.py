"""Edge patching (the exact effect of any set of edges) and circuit faithfulness (MIB's CPR / CMD)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
from tiny_models import with_random_norms

import circuits.edge_patching
import interp
from circuits import (
    ActivationPatching,
    AttributionPatching,
    EdgePatching,
    Faithfulness,
    PathPatching,
    UnknownComponentError,
    faithfulness_plot,
    make_pairs,
)
from circuits.faithfulness import areas
from circuits.metrics import as_metric
from circuits.runs import metric_of

CLEAN = [
    "Paris is the capital of France",
    "Rome is the capital of Italy",
    "Tokyo is the capital of Japan",
    "Mira is the capital of Spain",
]
CORRUPTED = [
    "Berlin is the capital of France",
    "Madrid is the capital of Italy",
    "Vorn is the capital of Japan",
    "Oba is the capital of Spain",
]


def _pairs(model):
    return make_pairs(
        model, CLEAN, CORRUPTED, answer=["Paris", "Rome", "Tokyo", "Mira"], wrong=["Berlin", "Madrid", "Vorn", "Oba"]
    )


@pytest.mark.parametrize("family", ["gpt2", "llama_gqa", "gpt_neox"])  # sequential, grouped-query, parallel blocks
def test_edge_patching_endpoints_and_single_edges(model_dirs, backend, family):
    model = interp.load_model(model_dirs[family], backend=backend)
    pairs = _pairs(model)
    ep = EdgePatching(model, "logit_diff", progress=False)
    edges = ep.edges()
    n = len(edges)
    out = ep.evaluate(pairs, torch.stack([torch.zeros(n), torch.ones(n)]))
    metric = as_metric("logit_diff")
    torch.testing.assert_close(out[0], metric_of(model, pairs.clean, pairs, metric), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out[1], metric_of(model, pairs.corrupted, pairs, metric), atol=1e-5, rtol=1e-5)
    assert (out[0] - out[1]).abs().max() > 1e-3  # the two runs differ, so the check has teeth
    # one patched edge == path patching of that edge with frozen MLPs (the direct path alone)
    picks = edges.sample(8, random_state=0)
    masks = torch.zeros(len(picks), n)
    masks[torch.arange(len(picks)), torch.tensor(picks.index.tolist())] = 1.0
    single = ep.evaluate(pairs, masks).mean(-1)
    for value, row in zip(single.tolist(), picks.itertuples()):
        pp = PathPatching(model, senders=[row.sender], receivers=[row.receiver], mlps="frozen", progress=False).run(
            pairs
        )
        assert value == pytest.approx(pp.score.item(), abs=1e-5), (row.sender, row.receiver)


@pytest.mark.parametrize("family", ["gpt2", "gpt_neox"])  # an MLP reading resid_mid / resid_pre
def test_mlp_receivers_are_patched_in_the_one_run(model_dirs, backend, family):
    """Edges into MLPs (from the embeddings, an earlier head, the same layer's head in a
    sequential block) equal path patching of that edge, and every pass runs the pairs once: a
    patched MLP reads ``mlp_norm(x - delta)`` at ``mlp.hook_in``, not a copy of the batch (all
    MLPs at once: the endpoint test above). Norms drawn at random, so no norm can stand in for
    another."""
    hf, tok = with_random_norms(family)
    model = interp.load_model(hf, backend=backend, tokenizer=tok)
    pairs = _pairs(model)
    ep = EdgePatching(model, "logit_diff", progress=False)
    edges = ep.edges()
    into_mlp = edges[edges.receiver_input == "mlp"]
    senders = [s for s in ("embed", "L0H1", "L1H2") if (into_mlp.sender == s).any()]
    picks = [into_mlp[into_mlp.sender == s].index[-1] for s in senders]
    assert len(picks) == (3 if family == "gpt2" else 2)  # a parallel block's heads do not feed its own MLP
    rows = []
    run = model.backend.run

    def counting(input_ids, *args, **kwargs):
        rows.append(input_ids.shape[0])
        return run(input_ids, *args, **kwargs)

    masks = torch.zeros(len(picks), len(edges))
    for i, j in enumerate(picks):
        masks[i, j] = 1.0
    model.backend.run = counting
    try:
        got = ep.evaluate(pairs, masks).mean(-1)
    finally:
        model.backend.run = run
    assert set(rows) == {len(pairs)}, rows
    for value, j in zip(got.tolist(), picks):
        row = edges.loc[j]
        pp = PathPatching(model, senders=[row.sender], receivers=[row.receiver], mlps="frozen", progress=False)
        assert value == pytest.approx(pp.run(pairs).score.item(), abs=1e-5), (row.sender, row.receiver)


@pytest.mark.parametrize("family", ["gpt2", "gpt_neox"])
def test_complement_sums_equal_the_dense_product(model_dirs, family, monkeypatch):
    """Masks that patch most edges (a circuit's complement) take the edge sum as every sender less
    the unpatched edges; forced to the dense product instead, the metric is the same."""
    model = interp.load_model(model_dirs[family], backend="nnsight")
    pairs = _pairs(model)
    ep = EdgePatching(model, "logit_diff", progress=False)
    n = len(ep.edges())
    gen = torch.Generator().manual_seed(0)
    masks = (torch.rand(3, n, generator=gen) > torch.tensor([[0.02], [0.1], [0.3]])).float()
    edges = ep.edges()
    chain = ((edges.sender == "embed") & edges.receiver.str.startswith("L0H1")) | (
        (edges.sender == "L0H1") & (edges.receiver == "logits")
    )  # kept: the subject's embedding reaches the logits through L0H1
    masks = torch.cat([masks, 1 - torch.tensor(chain.to_numpy(), dtype=torch.float32)[None]])
    fast = ep.evaluate(pairs, masks)
    monkeypatch.setattr(circuits.edge_patching, "COMPLEMENT_BELOW", 0.0)
    dense = ep.evaluate(pairs, masks)
    torch.testing.assert_close(fast, dense, atol=1e-6, rtol=1e-5)
    assert (fast[-1] - ep.evaluate(pairs, torch.ones(1, n))[0]).abs().max() > 1e-3  # the kept chain matters
    with pytest.raises(ValueError, match="more than once"):
        EdgePatching(model, senders=["L0H1", "L0H1"]).edges()


def test_all_edges_out_of_a_node_equal_activation_patching(model_dirs):
    model = interp.load_model(model_dirs["gpt2"], backend="nnsight")
    pairs = _pairs(model)
    ep = EdgePatching(model, "logit_diff", progress=False)
    edges = ep.edges()
    ap = ActivationPatching(
        model, sites=["z"], by_position=False, direction="corrupted_into_clean", progress=False
    ).run(pairs)
    for head in ("L0H1", "L1H3"):
        mask = torch.tensor((edges.sender == head).to_numpy(), dtype=torch.float32)
        got = ep.evaluate(pairs, mask).mean().item()
        layer, h = int(head[1]), int(head[3])
        assert got == pytest.approx(ap[(ap.layer == layer) & (ap["head"] == h)].score.item(), abs=1e-5)


def test_mean_ablation_replaces_a_node_by_its_mean(model_dirs, backend):
    """Mean over the pairs that reach each position (pairs of different lengths: padding is not
    averaged in); small batches give the same numbers as one."""
    model = interp.load_model(model_dirs["llama_gqa"], backend=backend)
    pairs = make_pairs(
        model,
        CLEAN + ["Rome is the capital of Italy and it is located in Spain"],
        CORRUPTED + ["Madrid is the capital of Italy and it is located in Spain"],
        answer=["Paris", "Rome", "Tokyo", "Mira", "Rome"],
        wrong=["Berlin", "Madrid", "Vorn", "Oba", "Madrid"],
    )
    ep = EdgePatching(model, "logit_diff", ablation="mean", progress=False)
    edges = ep.edges()
    mask = torch.tensor((edges.sender == "L0H2").to_numpy(), dtype=torch.float32)
    got = ep.evaluate(pairs, mask)[0]
    small = EdgePatching(model, "logit_diff", ablation="mean", batch_size=10, progress=False)
    torch.testing.assert_close(small.evaluate(pairs, mask)[0], got, atol=1e-5, rtol=1e-5)  # 2 pairs per pass
    z = model.read(pairs.clean, ["blocks.0.attn.hook_z"])["blocks.0.attn.hook_z"]
    real = pairs.clean.attention_mask.float()[:, :, None]
    mean = (z[:, :, 2] * real).sum(0) / real.sum(0)

    def hook(act):
        act = act.clone()
        act[:, :, 2] = mean
        return act

    ref = metric_of(model, pairs.clean, pairs, as_metric("logit_diff"), {"blocks.0.attn.hook_z": hook})
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-5)


def test_edge_attribution_is_the_derivative_of_the_exact_edge_effect_under_gqa(backend):
    """On a grouped-query model, EAP's score of every edge (into queries, shared keys/values, MLPs
    and logits) equals the derivative of the exact effect of patching a fraction t of that edge.
    Norms drawn at random, so a head's input gradient taken back through another layer's norm
    (or the MLP's) would not pass."""
    hf, tok = with_random_norms("llama_gqa")
    model = interp.load_model(hf, backend=backend, tokenizer=tok)
    assert model.n_kv_heads == 2 < model.n_heads
    pairs = _pairs(model)
    eap = AttributionPatching(model, "logit_diff", progress=False).edges(pairs)
    ep = EdgePatching(model, "logit_diff", direction="clean_into_corrupted", progress=False)
    edges = ep.edges()
    assert {"L1H0.k", "L1H2.k", "L1H1.q"} <= set(edges.receiver) and "L1H1.k" not in set(edges.receiver)
    merged = edges.reset_index().merge(eap, on=["sender", "receiver"])
    assert len(merged) == len(edges)
    t = 1e-2
    masks = torch.zeros(2 * len(edges), len(edges))
    for i in range(len(edges)):
        masks[2 * i, i], masks[2 * i + 1, i] = t, -t
    m = ep.evaluate(pairs, masks).double().mean(-1)
    derivative = ((m[0::2] - m[1::2]) / (2 * t)).numpy()[merged["index"].to_numpy()]
    np.testing.assert_allclose(derivative, merged.score.to_numpy(), atol=2e-4, rtol=2e-2)
    assert np.abs(merged.score).max() > 1e-2


def test_gqa_receivers_name_the_group(model_dirs):
    model = interp.load_model(model_dirs["llama_gqa"], backend="nnsight")
    with pytest.raises(UnknownComponentError, match="named 'L1H0.k'"):
        PathPatching(model, receivers=["L1H1.k"]).run(_pairs(model))


# --- the known circuit: induction ---------------------------------------------------------------------
@pytest.fixture(scope="module")
def induction():
    from lab.experiments.induction import induction_pairs, previous_token_scores

    model = interp.load_model("induction")
    pairs = induction_pairs(model, n=24)
    prev = int(previous_token_scores(model, pairs).argmax())
    # under the single-token corruption the path is: the previous-token head reads the changed token's
    # embedding (its value), writes it into the next position, where both induction heads' keys read it;
    # the induction heads write the answer into the logits
    known = {
        ("embed", f"L0H{prev}.v"),
        (f"L0H{prev}", "L1H0.k"),
        (f"L0H{prev}", "L1H1.k"),
        ("L1H0", "logits"),
        ("L1H1", "logits"),
    }
    return model, pairs, known


@pytest.mark.slow
def test_faithfulness_recovers_the_induction_circuit(induction):
    from lab.experiments.induction import induction_metric

    model, pairs, known = induction
    ep = EdgePatching(model, induction_metric, progress=False)
    edges = ep.edges()
    keys = list(zip(edges.sender, edges.receiver))

    def faithfulness(circuit):
        mask = torch.tensor([0.0 if k in circuit else 1.0 for k in keys])
        m = ep.evaluate(pairs, torch.stack([torch.zeros(len(keys)), torch.ones(len(keys)), mask])).double().mean(-1)
        return float((m[2] - m[1]) / (m[0] - m[1]))

    assert faithfulness(known) > 0.95  # 5 of 46 edges carry the behaviour
    for edge in known:
        assert faithfulness(known - {edge}) < 0.7, edge  # and each of them is needed

    ig = AttributionPatching(model, induction_metric, ig_steps=5, progress=False).edges(pairs)
    top = ig.reindex(ig.score.abs().sort_values(ascending=False).index).head(len(known))
    assert set(zip(top.sender, top.receiver)) == known  # EAP-IG-inputs ranks the true circuit first

    fa = Faithfulness(model, induction_metric, n_random=19, progress=False)
    curve = fa.run(pairs, {"EAP-IG-inputs": ig})
    summary = fa.summary_.iloc[0]
    ours = curve[curve.method == "EAP-IG-inputs"].set_index("fraction").faithfulness
    assert ours[1.0] == pytest.approx(1.0) and ours[0.2] > 0.95  # 9 edges: the circuit and then some
    assert summary.p_random_cpr == pytest.approx(1 / 20)  # better than every random circuit
    assert summary.cpr > summary.random_cpr_mean + 3 * summary.random_cpr_sd
    assert summary.cpr_low <= summary.cpr <= summary.cpr_high
    assert summary.cpr + summary.cmd == pytest.approx(1.0, abs=1e-6)  # f stays in [0, 1]; sizes run from 0 items to all
    fig = faithfulness_plot(curve, fa.summary_)
    assert {t.name for t in fig.data} >= {"EAP-IG-inputs", "random (19)"}


def test_node_faithfulness_and_bad_inputs(induction):
    from lab.experiments.induction import induction_metric

    model, pairs, _ = induction
    nodes = AttributionPatching(model, induction_metric, progress=False).nodes(pairs)
    fa = Faithfulness(model, induction_metric, level="node", fractions=[0.3, 0.6, 1.0], n_random=5, progress=False)
    curve = fa.run(pairs, nodes)
    assert curve.attrs["n_items"] == len(nodes)
    ours = curve[curve.method == "scores"]
    assert ours.faithfulness.iloc[-1] == pytest.approx(1.0)
    row = fa.summary_.iloc[0]
    if ours.faithfulness.between(-1e-6, 1 + 1e-6).all():  # the area runs from the empty circuit (0) to all items (1)
        assert row.cpr + row.cmd == pytest.approx(1.0, abs=1e-6)
    assert row.n_unscored == 0 and row.n_tied >= 1  # the two zero MLPs tie
    assert row.excess_low <= row.excess_high
    with pytest.raises(ValueError, match="needs columns"):
        fa.run(pairs, nodes.drop(columns="node"))
    with pytest.raises(ValueError, match="one score per node"):
        fa.run(pairs, pd.concat([nodes, nodes]))
    with pytest.raises(ValueError, match="increasing"):
        Faithfulness(model, induction_metric, fractions=[0.5, 0.1]).run(pairs, nodes)
    with pytest.raises(ValueError, match="level"):
        Faithfulness(model, induction_metric, level="head").run(pairs, nodes)
    edges = AttributionPatching(model, induction_metric, progress=False).edges(pairs)
    with pytest.raises(ValueError, match="not in this model's graph"):
        Faithfulness(model, induction_metric, receivers=["logits"]).run(pairs, edges)
    with pytest.raises(ValueError, match="names the baseline"):
        Faithfulness(model, induction_metric).run(pairs, {"random": edges})
    to_logits = edges[edges.receiver == "logits"]
    with pytest.raises(ValueError, match="allow_unscored=True"):
        Faithfulness(model, induction_metric, n_random=2).run(pairs, to_logits)
    fa = Faithfulness(model, induction_metric, n_random=2, allow_unscored=True, progress=False)
    fa.run(pairs, to_logits)
    assert fa.summary_.n_unscored.iloc[0] == len(edges) - len(to_logits)


def test_areas_are_trapezoids():
    x = np.array([0.1, 0.5, 1.0])
    cpr, cmd = areas(x, np.array([0.0, 1.0, 1.0]))
    assert cpr == pytest.approx(0.2 + 0.5) and cmd == pytest.approx(0.2)
    cpr, cmd = areas(x, np.array([[0.0, 0.5, 1.5]]))  # leading axes are kept; over-performance counts in CMD
    assert cpr.shape == (1,) and cmd[0] == pytest.approx(0.4 * 0.75 + 0.5 * 0.5)
