"""Circuits: parity with TransformerLens' patching, naive references and analytic gradients."""

from __future__ import annotations

import random
import sys

import pytest
import torch
from naive_patching import naive_path_patch
from tiny_models import with_random_norms

import interp
from circuits import (
    ActivationPatching,
    AttributionPatching,
    MetricError,
    PairLengthError,
    PathPatching,
    UnknownComponentError,
    all_nodes,
    make_pairs,
)
from circuits.components import parse_receivers
from circuits.metrics import as_metric

CLEAN = ["Paris is the capital of France", "Rome is the capital of Italy", "Tokyo is the capital of Japan"]
CORRUPTED = ["Berlin is the capital of France", "Madrid is the capital of Italy", "Vorn is the capital of Japan"]
ANSWER, WRONG = ["Paris", "Rome", "Tokyo"], ["Berlin", "Madrid", "Vorn"]


def _pairs(model):
    return make_pairs(model, CLEAN, CORRUPTED, answer=ANSWER, wrong=WRONG)


def _tl_metric(pairs):
    a, w, rows = pairs.answer, pairs.wrong, torch.arange(len(pairs.answer))
    return lambda logits: (logits[rows, -1, a] - logits[rows, -1, w]).mean()


# --- activation patching == transformer_lens.patching ---------------------------------------------
TL_FUNCTIONS = {
    ("resid_pre", True): "get_act_patch_resid_pre",
    ("resid_mid", True): "get_act_patch_resid_mid",
    ("attn_out", True): "get_act_patch_attn_out",
    ("mlp_out", True): "get_act_patch_mlp_out",
    ("z", True): "get_act_patch_attn_head_out_by_pos",
    ("q", True): "get_act_patch_attn_head_q_by_pos",
    ("k", False): "get_act_patch_attn_head_k_all_pos",
    ("v", False): "get_act_patch_attn_head_v_all_pos",
    ("z", False): "get_act_patch_attn_head_out_all_pos",
}


@pytest.mark.parametrize("family", ["gpt2", "llama"])
@pytest.mark.parametrize("kind,by_position", list(TL_FUNCTIONS))
def test_activation_patching_equals_transformer_lens(model_dirs, backend, family, kind, by_position):
    from transformer_lens import patching

    model = interp.load_model(model_dirs[family], backend=backend)
    bridge = interp.load_model(model_dirs[family], backend="transformer_lens").backend.bridge
    pairs = _pairs(model)
    df = ActivationPatching(
        model, "logit_diff", sites=[kind], by_position=by_position, batch_size=20, progress=False
    ).run(pairs)
    _, clean_cache = bridge.run_with_cache(pairs.clean.input_ids)
    ref = getattr(patching, TL_FUNCTIONS[(kind, by_position)])(
        bridge, pairs.corrupted.input_ids, clean_cache, _tl_metric(pairs)
    )
    ours = torch.tensor(df["score"].to_numpy(), dtype=ref.dtype)
    if kind in ("z", "q") and by_position:  # ours: layer, head, position; TL: layer, position, head
        ours = ours.reshape(ref.shape[0], ref.shape[2], ref.shape[1]).transpose(1, 2)
    torch.testing.assert_close(ours.reshape(ref.shape), ref, atol=1e-5, rtol=1e-5)
    assert df["score"].std() > 0  # patching did something


def test_activation_patching_directions_and_normalization(model_dirs, backend):
    model = interp.load_model(model_dirs["gpt2"], backend=backend)
    pairs = _pairs(model)
    fwd = ActivationPatching(model, "logit_diff", sites=["resid_pre"], progress=False).run(pairs)
    back = ActivationPatching(
        model, "logit_diff", sites=["resid_pre"], direction="corrupted_into_clean", progress=False
    ).run(pairs)
    assert fwd.attrs["clean_score"] == pytest.approx(back.attrs["clean_score"], abs=1e-5)
    # the prompts differ only in their first token: patching layer 0's residual there swaps the whole input
    full = fwd[(fwd.layer == 0) & (fwd.position == 0)]
    assert float(full.normalized.iloc[0]) == pytest.approx(1.0, abs=1e-4)
    assert float(fwd[(fwd.layer == 0) & (fwd.position == 3)].normalized.iloc[0]) == pytest.approx(0.0, abs=1e-4)
    full_back = back[(back.layer == 0) & (back.position == 0)]
    assert float(full_back.score.iloc[0]) == pytest.approx(fwd.attrs["corrupted_score"], abs=1e-4)


# --- path patching == a naive loop; == TransformerLens' direct path patching ----------------------------
@pytest.mark.parametrize("family", ["gpt2", "llama", "gpt_neox"])
@pytest.mark.parametrize("mlps", ["frozen", "recomputed"])
def test_path_patching_equals_naive_reference(model_dirs, backend, family, mlps):
    model = interp.load_model(model_dirs[family], backend=backend)
    pairs = _pairs(model)
    receivers = ["L1H0.q", "L1H2.k", "L1H3.v", "MLP1", "MLP0", "logits"]
    df = PathPatching(model, "logit_diff", receivers=receivers, mlps=mlps, batch_size=12, progress=False).run(pairs)
    metric = as_metric("logit_diff")
    senders = {s.name: s for s in all_nodes(model)}
    assert len(df) >= 30
    for row in df.itertuples():
        ref = naive_path_patch(
            model, pairs, metric, senders[row.sender], parse_receivers(model, [row.receiver])[0], mlps
        )
        assert row.score == pytest.approx(ref, abs=1e-5), (row.sender, row.receiver)


def test_mlp_variants_differ(model_dirs):
    model = interp.load_model(model_dirs["gpt2"], backend="nnsight")
    pairs = _pairs(model)
    frozen = PathPatching(model, senders=["embed", "L0H1"], receivers=["logits"], mlps="frozen", progress=False).run(
        pairs
    )
    recomputed = PathPatching(
        model, senders=["embed", "L0H1"], receivers=["logits"], mlps="recomputed", progress=False
    ).run(pairs)
    assert (frozen.score - recomputed.score).abs().max() > 1e-4  # the option changes what is measured


@pytest.mark.parametrize("component", ["q", "k", "v"])
def test_path_patching_equals_transformer_lens_direct_path(model_dirs, backend, component):
    from transformer_lens import patching

    model = interp.load_model(model_dirs["gpt2"], backend=backend)
    bridge = interp.load_model(model_dirs["gpt2"], backend="transformer_lens").backend.bridge
    pairs = _pairs(model)
    _, cc = bridge.run_with_cache(pairs.clean.input_ids)
    _, xc = bridge.run_with_cache(pairs.corrupted.input_ids)
    ref = patching.get_act_patch_direct_path(
        bridge, pairs.corrupted.input_ids, cc, xc, _tl_metric(pairs), 0, 2, component=component, verbose=False
    )
    df = PathPatching(
        model,
        senders=["L0H2"],
        receivers=[f"L1H{h}.{component}" for h in range(4)],
        mlps="frozen",
        direction="clean_into_corrupted",
        progress=False,
    ).run(pairs)
    torch.testing.assert_close(torch.tensor(df.score.to_numpy(), dtype=ref.dtype), ref[1], atol=1e-5, rtol=1e-5)


def test_joint_receivers(model_dirs):
    model = interp.load_model(model_dirs["gpt2"], backend="transformer_lens")
    pairs = _pairs(model)
    df = PathPatching(
        model, senders=["L0H0", "L0H3"], receivers=["L1H0.q", "L1H1.k"], joint_receivers=True, progress=False
    ).run(pairs)
    assert list(df.receiver.unique()) == ["L1H0.q+L1H1.k"] and len(df) == 2


# --- attribution patching == analytic gradients --------------------------------------------------------
def _hf_reference(model_dir, pairs, alphas=(0.0,)):
    """Head-output gradients and q-input gradients computed by hand on the HuggingFace GPT-2, on the
    corrupted run or, for EAP-IG-inputs, averaged over runs whose token embeddings are moved a
    fraction ``alpha`` of the way to the clean ones."""
    from transformers import GPT2LMHeadModel

    hf = GPT2LMHeadModel.from_pretrained(model_dir).eval()
    n, heads = len(pairs), hf.config.n_head
    d_head = hf.config.n_embd // heads

    def run(ids, grads, alpha=0.0):
        z, resid, qkv = {}, {}, {}
        handles = []
        for layer, block in enumerate(hf.transformer.h):

            def pre_z(mod, args, layer=layer):
                if grads:
                    args[0].retain_grad()
                z[layer] = args[0]

            def pre_block(mod, args, kwargs, layer=layer):
                resid[layer] = args[0] if args else kwargs["hidden_states"]

            def out_qkv(mod, args, out, layer=layer):
                if grads:
                    out.retain_grad()
                qkv[layer] = out

            handles += [
                block.attn.c_proj.register_forward_pre_hook(pre_z),
                block.register_forward_pre_hook(pre_block, with_kwargs=True),
                block.attn.c_attn.register_forward_hook(out_qkv),
            ]
        embeds = hf.transformer.wte(ids)
        if alpha:
            embeds = embeds + alpha * (hf.transformer.wte(pairs.clean.input_ids) - embeds).detach()
        logits = hf(inputs_embeds=embeds).logits
        for h in handles:
            h.remove()
        return logits, z, resid, qkv

    with torch.no_grad():
        _, z_clean, _, _ = run(pairs.clean.input_ids, False)
        _, z_corr, _, _ = run(pairs.corrupted.input_ids, False)
    rows = torch.arange(n)
    block = hf.transformer.h[1]
    w_o = hf.transformer.h[0].attn.c_proj.weight.reshape(heads, d_head, -1)
    node = {layer: torch.zeros(heads) for layer in z_corr}
    r_in = torch.zeros(heads, n, pairs.n_pos, hf.config.n_embd)
    for alpha in alphas:
        logits, z_run, resid, qkv = run(pairs.corrupted.input_ids, True, alpha)
        (logits[rows, -1, pairs.answer] - logits[rows, -1, pairs.wrong]).sum().backward()
        for layer in z_run:
            dz = (z_clean[layer] - z_corr[layer]).reshape(n, -1, heads, d_head)
            g = z_run[layer].grad.reshape(n, -1, heads, d_head)
            node[layer] += (dz * g).sum((0, 1, 3)).detach() / n / len(alphas)
        # receiver L1H{r}.q: the gradient through head r's query alone, w.r.t. the block's input
        x = resid[1].detach().requires_grad_(True)
        q = block.attn.c_attn(block.ln_1(x))[..., : hf.config.n_embd].reshape(n, -1, heads, d_head)
        g_q = qkv[1].grad[..., : hf.config.n_embd].reshape(n, -1, heads, d_head)
        for r in range(heads):
            (gx,) = torch.autograd.grad(q[:, :, r], x, grad_outputs=g_q[:, :, r], retain_graph=True)
            r_in[r] += gx.detach() / len(alphas)
    edge = torch.zeros(heads, heads)
    dz0 = (z_clean[0] - z_corr[0]).reshape(n, -1, heads, d_head)
    for r in range(heads):
        for s in range(heads):
            edge[s, r] = ((dz0[:, :, s] @ w_o[s] * r_in[r]).sum() / n).detach()
    return node, edge


@pytest.mark.parametrize("ig_steps", [None, 4])
def test_attribution_equals_analytic_gradients(model_dirs, backend, ig_steps):
    """EAP and EAP-IG-inputs (4 midpoints between the corrupted and clean token embeddings)
    equal a hand computation on the HuggingFace model."""
    model = interp.load_model(model_dirs["gpt2"], backend=backend)
    pairs = _pairs(model)
    alphas = (0.0,) if ig_steps is None else tuple((j + 0.5) / ig_steps for j in range(ig_steps))
    node_ref, edge_ref = _hf_reference(model_dirs["gpt2"], pairs, alphas)
    nodes = AttributionPatching(model, "logit_diff", ig_steps=ig_steps, progress=False).nodes(pairs)
    for layer, ref in node_ref.items():
        ours = torch.tensor(nodes[(nodes.kind == "head") & (nodes.layer == layer)].score.to_numpy(), dtype=ref.dtype)
        torch.testing.assert_close(ours, ref, atol=1e-6, rtol=1e-4)
    at = AttributionPatching(model, "logit_diff", ig_steps=ig_steps, progress=False)
    edges = at.edges(pairs)
    assert edges.attrs["method"] == ("EAP" if ig_steps is None else "EAP-IG-inputs")
    for s in range(4):
        for r in range(4):
            got = edges[(edges.sender == f"L0H{s}") & (edges.receiver == f"L1H{r}.q")].score.item()
            assert got == pytest.approx(edge_ref[s, r].item(), abs=1e-6, rel=1e-4)


@pytest.mark.parametrize("family", ["gpt2", "llama_gqa"])
def test_edge_attribution_with_frozen_weights(model_dirs, backend, family):
    """Users freeze a model's weights (``requires_grad_(False)``) to save memory: edge scores are
    the same, although nothing upstream of the first layer is then in a graph."""
    model = interp.load_model(model_dirs[family], backend=backend)
    pairs = _pairs(model)
    before = AttributionPatching(model, "logit_diff", progress=False).edges(pairs)
    model.module.requires_grad_(False)
    after = AttributionPatching(model, "logit_diff", progress=False).edges(pairs)
    assert before.score.abs().max() > 0
    torch.testing.assert_close(after.score.to_numpy(), before.score.to_numpy(), atol=1e-7, rtol=1e-5)


@pytest.mark.parametrize("ig_steps", [None, 2])
@pytest.mark.parametrize("family", ["gpt2", "llama_gqa", "gpt_neox"])
def test_edge_scores_do_not_depend_on_the_order_or_the_chunking(family, ig_steps, monkeypatch):
    """Senders and receivers named in any order get the scores they get in the model's order
    (the products run over the senders in writing order, then are put back), and heads' input
    gradients taken back through the norm one at a time equal those taken several at once
    (norms drawn at random, so no layer's norm can stand in for another's)."""
    attribution = sys.modules["circuits.attribution"]
    hf, tok = with_random_norms(family)
    model = interp.load_model(hf, tokenizer=tok)
    pairs = _pairs(model)
    plain = AttributionPatching(model, "logit_diff", ig_steps=ig_steps, progress=False).edges(pairs)
    senders = sorted(set(plain.sender))
    receivers = sorted(set(plain.receiver))
    random.Random(0).shuffle(senders)
    random.Random(1).shuffle(receivers)
    monkeypatch.setattr(attribution, "_CHUNK_BYTES", 1)  # one head's gradient per backward through the norm
    shuffled = AttributionPatching(
        model, "logit_diff", ig_steps=ig_steps, nodes=senders, receivers=receivers, progress=False
    ).edges(pairs)
    assert list(dict.fromkeys(shuffled.sender)) == senders  # rows in the order asked for
    merged = plain.merge(shuffled, on=["sender", "receiver"], suffixes=("", "_shuffled"))
    assert len(merged) == len(plain) == len(shuffled)
    torch.testing.assert_close(merged.score_shuffled.to_numpy(), merged.score.to_numpy(), atol=1e-9, rtol=1e-6)
    assert plain.score.abs().max() > 1e-3


def test_integrated_gradients_are_complete(model_dirs, backend):
    """IG at the embeddings sums to the metric's total change (midpoint rule: error O(1/m^2))."""
    model = interp.load_model(model_dirs["gpt2"], backend=backend)
    pairs = _pairs(model)
    act = ActivationPatching(model, "logit_diff", sites=["resid_pre"], layers=[0], progress=False).run(pairs)
    total = act.attrs["source_score"] - act.attrs["target_score"]
    ig = AttributionPatching(model, "logit_diff", ig_steps=24, nodes=["embed"], progress=False).nodes(pairs)
    plain = AttributionPatching(model, "logit_diff", nodes=["embed"], progress=False).nodes(pairs)
    assert ig.score.item() == pytest.approx(total, rel=0.02)
    assert abs(plain.score.item() - total) > abs(ig.score.item() - total)  # IG is closer than one gradient


# --- bad input --------------------------------------------------------------------------------------------
def test_bad_inputs(model_dirs):
    model = interp.load_model(model_dirs["gpt2"], backend="nnsight")
    with pytest.raises(PairLengthError, match="same length"):
        make_pairs(model, ["Paris is the capital of France"], ["Paris is a capital"])
    with pytest.raises(ValueError, match="one corrupted prompt per clean prompt"):
        make_pairs(model, CLEAN, CORRUPTED[:2])
    pairs = _pairs(model)
    # analyzers are configured without logic (scikit-learn's rule); the configuration is checked
    # when they are applied, before any forward pass
    with pytest.raises(UnknownComponentError, match="L1H3"):
        PathPatching(model, receivers=["L1H3.z"]).run(pairs)
    with pytest.raises(UnknownComponentError, match="L0H1"):
        PathPatching(model, senders=["L0H01"]).run(pairs)
    with pytest.raises(ValueError, match="at least one sender and one receiver"):
        AttributionPatching(model, nodes=[], progress=False).edges(pairs)
    with pytest.raises(ValueError, match="did you mean 'resid_pre'"):
        ActivationPatching(model, sites=["resid_prev"]).run(pairs)
    with pytest.raises(ValueError, match="unknown metric"):
        ActivationPatching(model, metric="logit_dif").run(pairs)
    with pytest.raises(MetricError, match="scalar or one value per pair"):
        ActivationPatching(model, metric=lambda logits: logits[:, -1], progress=False).run(pairs)
    with pytest.raises(ValueError, match="not differentiable"):
        AttributionPatching(model, metric=lambda logits: logits[:, -1].argmax(-1).float(), progress=False).nodes(pairs)
    with pytest.raises(ValueError, match="needs answer tokens"):
        ActivationPatching(model, progress=False).run(make_pairs(model, CLEAN, CORRUPTED))


def test_plots(model_dirs, tmp_path):
    from circuits import circuit_graph, head_heatmap, position_heatmap

    model = interp.load_model(model_dirs["gpt2"], backend="nnsight")
    pairs = _pairs(model)
    ap = ActivationPatching(model, sites=["z", "resid_pre"], progress=False).run(pairs)
    fig = head_heatmap(ap[ap.site == "z"].groupby(["layer", "head"], as_index=False).score.mean())
    assert fig.data[0].z.shape == (2, 4)
    assert position_heatmap(ap, site="resid_pre").data[0].z.shape == (2, pairs.n_pos)
    pp = PathPatching(model, receivers=["L1H0.k", "L1H1.q", "logits"], progress=False).run(pairs)
    g = circuit_graph(pp, top=5, baseline=pp.attrs["target_score"])
    assert len([t for t in g.data if t.mode == "lines"]) == 5


# --- the known circuit ----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def induction(request):
    from lab.experiments.induction import induction_pairs

    model = interp.load_model("induction", backend="nnsight")
    return model, induction_pairs(model, n=24)


def test_path_patching_finds_induction_circuit(induction, backend):
    from lab.experiments.induction import induction_metric, induction_scores, previous_token_scores

    model, pairs = induction
    if backend == "transformer_lens":
        model = interp.load_model("induction", backend=backend)
    prev = previous_token_scores(model, pairs)
    ind = induction_scores(model, pairs)
    prev_head = int(prev.argmax())
    assert prev[prev_head] > 0.6 and ind.min() > 0.6  # a previous-token head and induction heads exist
    receivers = [f"L1H{h}.{c}" for h in range(model.n_heads) for c in "qkv"]
    df = PathPatching(
        model, induction_metric, senders=[f"L0H{h}" for h in range(model.n_heads)], receivers=receivers, progress=False
    ).run(pairs)
    top = df.sort_values("score").iloc[0]  # corrupting the sender lowers the metric most
    assert top.sender == f"L0H{prev_head}" and top.receiver_input == "k"
    assert top.normalized > 0.2
    by_input = df[df.sender == f"L0H{prev_head}"].groupby("receiver_input").normalized.sum()
    assert by_input["k"] > 3 * max(abs(by_input["q"]), abs(by_input["v"]))  # K-composition, not Q or V


def test_single_token_corruption_isolates_the_previous_token_path():
    """Replacing the whole first copy also changes the current-token information reaching the
    keys, so path patching credits a head that barely attends to the previous token; replacing
    one token of the first copy (metric: the answer's log-probability at its second occurrence)
    leaves only the previous-token path, matching the attention-pattern truth."""
    from lab.experiments.induction import induction_metric, induction_pairs, previous_token_scores

    model = interp.load_model("induction")
    receivers = [f"L1H{h}.{c}" for h in range(model.n_heads) for c in "qkv"]
    credit = {}
    for corruption in ("token", "copy"):
        pairs = induction_pairs(model, n=24, corruption=corruption)
        prev = previous_token_scores(model, pairs)
        weak = int(prev.argmin())
        assert prev[weak] < 0.3 < 0.6 < prev.max()
        df = PathPatching(
            model,
            induction_metric,
            senders=[f"L0H{h}" for h in range(model.n_heads)],
            receivers=receivers,
            progress=False,
        ).run(pairs)
        top = df.sort_values("normalized", ascending=False).iloc[0]
        assert top.sender == f"L0H{int(prev.argmax())}" and top.receiver_input == "k"
        credit[corruption] = df[df.sender == f"L0H{weak}"].normalized.abs().max()
    assert credit["token"] < 0.02 < 0.05 < credit["copy"], credit


def test_attribution_tracks_activation_patching_on_induction(induction):
    """Per (head, position) cell, AtP's linear estimates follow the exact patching effects."""
    from scipy.stats import pearsonr, spearmanr

    from lab.experiments.induction import induction_metric

    model, pairs = induction
    heads = [f"L{l}H{h}" for l in range(2) for h in range(2)]
    ap = ActivationPatching(model, induction_metric, sites=["z"], progress=False).run(pairs)
    nodes = AttributionPatching(model, induction_metric, nodes=heads, by_position=True, progress=False).nodes(pairs)
    assert list(zip(nodes.layer, nodes["head"], nodes.position)) == list(zip(ap.layer, ap["head"], ap.position))
    effects = (ap.score - ap.attrs["target_score"]).to_numpy()
    assert pearsonr(effects, nodes.score.to_numpy()).statistic > 0.8
    assert spearmanr(effects, nodes.score.to_numpy()).statistic > 0.4


def test_induction_training_runs(tmp_path):
    from lab.experiments.induction import InductionConfig, train_induction_model

    path = train_induction_model(tmp_path / "ind", InductionConfig(steps=20), progress=False)
    model = interp.load_model(path, backend="transformer_lens")
    assert model.n_layers == 2 and (path / "train_log.json").exists()
    again = train_induction_model(tmp_path / "ind2", InductionConfig(steps=20), progress=False)
    from safetensors.torch import load_file

    a, b = load_file(path / "model.safetensors"), load_file(again / "model.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a)  # same seed, same weights


@pytest.mark.slow
def test_relation_circuit_before_and_after(tmp_path):
    from circuits.figures import write_figures
    from interp.results import load_table, save_table
    from lab.experiments.relation_circuit import relation_circuit, relation_faithfulness, relation_stages
    from lab.study import FinetuneConfig
    from lab.world import from_world, load_world

    model = interp.load_model("world", backend="nnsight")
    (rel,) = from_world(load_world(), ["continent"])
    stages = relation_stages(model, rel, n_pairs=12, finetune_config=FinetuneConfig(max_steps=30))
    df = relation_circuit(model, rel, progress=False, stages=stages)
    assert set(df.stage) == {"before", "after"}
    assert len(df) == 2 * (model.n_layers * model.n_heads + model.n_layers)
    assert df.attrs["before"]["clean_score"] > df.attrs["before"]["corrupted_score"]  # the model knows the fact
    assert df[["ci_low", "ci_high", "p_value"]].notna().all().all()
    save_table(df, tmp_path, "relation_circuit")
    assert load_table(tmp_path, "relation_circuit").attrs["relation"] == "continent"
    curve, summary = relation_faithfulness(stages[0], ig_steps=2, n_random=3)
    assert list(summary.stage) == ["before", "after"] and (summary.p_random_cpr > 0).all()
    before = curve[(curve.stage == "before") & (curve.method != "random")].set_index("fraction").faithfulness
    assert before[1.0] == pytest.approx(1.0) and before.iloc[0] == pytest.approx(0.0, abs=1e-6)
    curve.attrs["relation"] = "continent"
    save_table(curve, tmp_path, "faithfulness")
    save_table(summary, tmp_path, "faithfulness_summary")
    written = write_figures(tmp_path, formats=("html", "png"))
    assert {"relation_before.png", "faithfulness_before.png", "faithfulness_after.png"} <= {p.name for p in written}


@pytest.mark.slow
def test_cli_induction_and_figures(tmp_path):
    import json

    from typer.testing import CliRunner

    from lab.cli import app

    out = tmp_path / "ind"
    result = CliRunner().invoke(
        app, ["circuits", "induction", "--out", str(out), "--pairs", "8", "--n-random", "5", "--formats", "html,png"]
    )
    assert result.exit_code == 0, result.output
    assert (out / "path_patching.csv").exists() and (
        out / "figures" / "circuit_path_patching.png"
    ).stat().st_size > 5000
    assert (out / "figures" / "faithfulness.png").exists() and (out / "figures" / "node_faithfulness.png").exists()
    summary = json.loads((out / "summary.json").read_text())
    assert summary["faithfulness"]["EAP-IG-inputs"]["cpr"] > summary["faithfulness"]["EAP-IG-inputs"]["random_cpr"]
    assert summary["top_head_edge"]["p_value"] < 0.05
    (out / "figures" / "circuit_path_patching.png").unlink()
    result = CliRunner().invoke(app, ["figures", str(out), "--formats", "png"])
    assert result.exit_code == 0 and (out / "figures" / "circuit_path_patching.png").exists()


@pytest.mark.parametrize("metric", ["kl_to_clean", "answer_prob"])
def test_other_metrics(model_dirs, metric):
    model = interp.load_model(model_dirs["llama"], backend="nnsight")
    pairs = _pairs(model)
    df = ActivationPatching(model, metric, sites=["resid_pre"], layers=[0], progress=False).run(pairs)
    clean, corrupted = df.attrs["clean_score"], df.attrs["corrupted_score"]
    if metric == "kl_to_clean":
        assert clean == pytest.approx(0.0, abs=1e-6) and corrupted > 1e-4
    else:
        assert 0 < corrupted < clean < 1 or 0 < clean < corrupted < 1
    restored = df[df.position == 0].score.item()  # the differing token: patching it restores the clean run
    assert restored == pytest.approx(clean, abs=1e-5)


def test_relation_pairs_pair_equal_lengths_with_different_answers():
    import pandas as pd

    from lab.experiments.circuit_findings import reading
    from lab.experiments.relation_circuit import relation_pairs
    from lab.world import from_world, load_world

    model = interp.load_model("world")
    (rel,) = from_world(load_world(), ["country"])
    prompts = [p.text for p in rel.prompts()]
    pairs = relation_pairs(model, prompts, rel.answers, n=6, seed=0)
    assert len(pairs) == 6
    assert (pairs.clean.attention_mask.sum(-1) == pairs.corrupted.attention_mask.sum(-1)).all()
    assert (pairs.answer != pairs.wrong).all()
    assert relation_pairs(model, prompts, rel.answers, n=6, seed=0).answer.tolist() == pairs.answer.tolist()
    with pytest.raises(ValueError, match="cannot build patching pairs"):
        relation_pairs(model, prompts[:1], rel.answers[:1], n=2)
    # the findings page's reading guide states the settings the saved tables were made with
    stats, curve = pd.DataFrame(), pd.DataFrame()
    stats.attrs.update(confidence=0.9, n_resamples=500, n_permutations=2000)
    curve.attrs.update(ablation="mean")
    text = reading(stats, curve)
    assert "a 90%" in text and "500 resamples" in text and "2000" in text and "mean value" in text
