"""Model handles: every way to load, and reading/writing sites through the same API."""

import pytest
import torch
from tiny_models import build, with_random_norms, word_tokenizer

import interp

PROMPTS = ["Vorn Kallit lives in the city of", "the capital of France is"]


@pytest.mark.parametrize("family", ["gpt2", "gpt_neox", "llama"])
def test_directory_loaders_match_the_hf_model(model_dirs, backend, family):
    model = interp.load_model(model_dirs[family], backend=backend)
    hf, _ = build(family)
    assert model.n_layers == 2 and model.d_model == 32 and model.n_heads == 4 and model.d_head == 8
    ids = torch.tensor([model.encode(PROMPTS[:1])[0].ids])
    with torch.no_grad():
        torch.testing.assert_close(model.run(PROMPTS[:1]), hf(input_ids=ids).logits, atol=1e-5, rtol=0)


@pytest.mark.parametrize("family", ["gpt2", "gpt_neox", "llama_gqa"])
def test_both_backends_list_the_same_sites_and_every_listed_site_fires(model_dirs, family):
    """A site a backend lists is one a capture can read: TransformerLens's bridge lists
    ``hook_pos_embed`` on rotary models, where no learned positions are added and it never fires."""
    models = {b: interp.load_model(model_dirs[family], backend=b) for b in interp.BACKENDS}
    sites = {b: m.sites for b, m in models.items()}
    assert sites["nnsight"] == sites["transformer_lens"]
    assert ("hook_pos_embed" in sites["nnsight"]) == (family == "gpt2")  # learned positions: GPT-2 only
    for model in models.values():
        acts = interp.capture(model, PROMPTS, sites=model.sites)
        assert set(acts) == set(model.sites) and all(a.shape[0] == len(PROMPTS) for a in acts.values())


def test_in_memory_modules_and_bridges(backend):
    hf, tok = build("gpt2")
    from_module = interp.load_model(hf, backend=backend, tokenizer=tok)
    from_dir_logits = from_module.run(PROMPTS)
    if backend == "transformer_lens":
        bridge = from_module.backend.bridge
        again = interp.load_model(bridge, backend="transformer_lens", tokenizer=tok)
        torch.testing.assert_close(again.run(PROMPTS), from_dir_logits)
    switched = interp.load_model(
        from_module, backend="nnsight" if backend == "transformer_lens" else "transformer_lens"
    )
    torch.testing.assert_close(switched.run(PROMPTS), from_dir_logits, atol=1e-5, rtol=0)


def test_boot_native_from_config():
    from transformer_lens.config import TransformerBridgeConfig

    cfg = TransformerBridgeConfig(
        d_model=32,
        d_head=8,
        n_layers=2,
        n_ctx=32,
        n_heads=4,
        d_vocab=len(word_tokenizer()),
        d_mlp=64,
        act_fn="gelu",
        seed=0,
    )
    model = interp.load_model(cfg, backend="transformer_lens", tokenizer=word_tokenizer())
    assert model.n_layers == 2 and "blocks.1.hook_resid_post" in model.sites
    acts = interp.capture(model, PROMPTS, sites=["blocks.1.hook_resid_post"])
    assert acts["blocks.1.hook_resid_post"].shape == (2, 32)
    with pytest.raises(ValueError, match="only the transformer_lens backend"):
        interp.load_model(cfg, backend="nnsight")


def _native_bridge():
    from transformer_lens.config import TransformerBridgeConfig

    from interp.backends.transformer_lens import TransformerLensBackend

    cfg = TransformerBridgeConfig(
        d_model=32, d_head=8, n_layers=2, n_ctx=32, n_heads=4, d_vocab=len(word_tokenizer()), d_mlp=64, act_fn="gelu"
    )
    cfg.seed = 0
    backend, _, _ = TransformerLensBackend.load(cfg, tokenizer=word_tokenizer())
    return backend.bridge


def test_a_bridge_loads_through_its_own_backend_without_naming_it():
    """A TransformerBridge is TransformerLens' own object: no backend= needed, none guessed wrong."""
    bridge = _native_bridge()
    model = interp.load_model(bridge, tokenizer=word_tokenizer())
    assert model.backend_name == "transformer_lens" and model.backend.bridge is bridge
    assert interp.load_model(model) is model  # a handle keeps its backend
    hf, tok = build("gpt2")
    assert interp.load_model(hf, tokenizer=tok).backend_name == interp.DEFAULT_BACKEND
    with pytest.raises(ValueError, match="rewritten the HuggingFace model"):  # asked for explicitly: refused
        interp.load_model(bridge, backend="nnsight", tokenizer=word_tokenizer())


def test_edge_attribution_and_faithfulness_on_a_native_model():
    """A native bridge has no HuggingFace layers: W_O comes from the bridge, and it is the W_O
    the model uses (attn_out = z W_O + b_O); EAP edges and faithfulness then run as on any model."""
    from circuits import AttributionPatching, Faithfulness, make_pairs

    model = interp.load_model(_native_bridge(), tokenizer=word_tokenizer())
    z, out = "blocks.1.attn.hook_z", "blocks.1.hook_attn_out"
    acts = interp.capture(model, PROMPTS, sites=[z, out], positions="all")
    w_o = model.head_output_weights(1)
    assert w_o.shape == (model.n_heads, model.d_head, model.d_model)
    b_o = model.backend.bridge.blocks[1].attn.b_O.detach()
    rebuilt = torch.einsum("nphe,hed->npd", acts[z], w_o) + b_o
    mask = acts.mask[..., None]
    torch.testing.assert_close(rebuilt * mask, acts[out] * mask, atol=1e-5, rtol=0)
    pre, inp = "blocks.1.hook_resid_pre", "blocks.1.attn.hook_in"
    acts2 = interp.capture(model, PROMPTS, sites=[pre, inp], positions="all")
    with torch.no_grad():
        normed = model.attention_norm(1)(acts2[pre])
    torch.testing.assert_close(normed * mask, acts2[inp] * mask, atol=1e-6, rtol=1e-6)
    mid, mlp_in = "blocks.1.hook_resid_mid", "blocks.1.mlp.hook_in"
    acts3 = interp.capture(model, PROMPTS, sites=[mid, mlp_in], positions="all")
    with torch.no_grad():
        normed = model.mlp_norm(1)(acts3[mid])
    torch.testing.assert_close(normed * mask, acts3[mlp_in] * mask, atol=1e-6, rtol=1e-6)
    pairs = make_pairs(
        model, ["the capital of France is", "Mira was born in"], ["the capital of Spain is", "Vorn was born in"],
        answer=["Paris", "Tokyo"], wrong=["Madrid", "Paris"],
    )  # fmt: skip
    edges = AttributionPatching(model, "logit_diff", progress=False).edges(pairs)
    assert len(edges) > 0 and edges.score.abs().sum() > 0
    curve = Faithfulness(model, "logit_diff", fractions=(0.1, 1.0), n_random=2, progress=False).run(
        pairs, {"EAP": edges}
    )
    assert {"EAP"} <= set(curve.method)


@pytest.mark.parametrize("family", ["gpt2", "gpt_neox", "llama_gqa", "bert"])
def test_head_input_weights_map_the_attention_input_to_q_k_v(model_dirs, backend, family):
    """``attn.hook_in`` is what the projections read, and ``head_input_weights`` their linear
    part: between any two positions, q/k/v differ by ``(u_i - u_j) @ W`` head by head (the bias
    cancels), on both backends, with key/value heads under grouped-query attention."""
    model = interp.load_model(model_dirs[family], backend=backend)
    names = {w: f"blocks.1.attn.hook_{w}" for w in "qkv"}
    acts = interp.capture(model, PROMPTS[:1], sites=["blocks.1.attn.hook_in", *names.values()], positions="all")
    u = acts["blocks.1.attn.hook_in"][0]  # [pos, d_model]
    for which, name in names.items():
        w = model.head_input_weights(1, which)
        heads = model.n_heads if which == "q" else model.n_kv_heads
        assert w.shape == (heads, model.d_model, model.d_head)
        got = acts[name][0] - acts[name][0, :1]  # [pos, head, d_head]
        want = torch.einsum("pd,hde->phe", u - u[:1], w)
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4, msg=lambda m: f"{which}: {m}")
    with pytest.raises(ValueError, match="'q', 'k' or 'v'"):
        model.head_input_weights(1, "z")


@pytest.mark.parametrize("family", ["gpt2", "gpt_neox", "llama_gqa", "bert"])
def test_attention_norm_maps_the_residual_to_the_attention_input(model_dirs, backend, family):
    """``attention_norm(l)`` applied outside the model to ``hook_resid_pre`` gives ``attn.hook_in``
    (the norm's own forward, so bit for bit up to the kernels; BERT's post-norm block: identity)."""
    model = interp.load_model(model_dirs[family], backend=backend)
    for layer in range(model.n_layers):
        pre, inp = f"blocks.{layer}.hook_resid_pre", f"blocks.{layer}.attn.hook_in"
        acts = interp.capture(model, PROMPTS, sites=[pre, inp], positions="all")
        with torch.no_grad():
            got = model.attention_norm(layer)(acts[pre])
        mask = acts.mask[..., None]
        torch.testing.assert_close(got * mask, acts[inp] * mask, atol=1e-6, rtol=1e-6)
    assert not torch.equal(acts[pre], acts[inp]) or family == "bert"


@pytest.mark.parametrize("family", ["gpt2", "gpt_neox", "llama_gqa", "bert"])
def test_mlp_norm_maps_the_residual_to_the_mlp_input(model_dirs, backend, family):
    """``mlp_norm(l)`` applied outside the model to the residual the MLP reads (``hook_resid_mid``
    in a sequential block, ``hook_resid_pre`` in GPT-NeoX's parallel one) gives ``mlp.hook_in``;
    BERT's post-norm MLP has no such residual, and says so. Norms drawn at random, so that the
    MLP's norm cannot pass for the attention's."""
    if family == "bert":
        with pytest.raises(ValueError, match="post-norm"):
            interp.load_model(model_dirs[family], backend=backend).mlp_norm(0)
        return
    hf, tok = with_random_norms(family)
    model = interp.load_model(hf, backend=backend, tokenizer=tok)
    for layer in range(model.n_layers):
        src = f"blocks.{layer}.hook_resid_mid" if family != "gpt_neox" else f"blocks.{layer}.hook_resid_pre"
        inp = f"blocks.{layer}.mlp.hook_in"
        acts = interp.capture(model, PROMPTS, sites=[src, inp], positions="all")
        with torch.no_grad():
            got = model.mlp_norm(layer)(acts[src])
        mask = acts.mask[..., None]
        torch.testing.assert_close(got * mask, acts[inp] * mask, atol=1e-5, rtol=1e-5)
        assert not torch.allclose(model.attention_norm(layer)(acts[src]) * mask, acts[inp] * mask, atol=1e-3)


@pytest.mark.parametrize("family", ["gpt2", "gpt_neox", "llama", "bert"])
def test_writes_agree_across_backends(model_dirs, family):
    """Zero-ablate one head's z and double the layer-0 MLP output: same logits on both backends."""

    def ablate(z):
        z = z.clone()
        z[:, :, 1] = 0
        return z

    hooks = {"blocks.0.attn.hook_z": ablate, "blocks.0.hook_mlp_out": lambda x: 2 * x}
    out = {}
    for b in ("transformer_lens", "nnsight"):
        model = interp.load_model(model_dirs[family], backend=b)
        with torch.no_grad():
            clean = model.run(PROMPTS)
            out[b] = model.run(PROMPTS, hooks=hooks)
        after = model.read(PROMPTS, ["blocks.1.hook_resid_post"])["blocks.1.hook_resid_post"]
        assert after.shape[:2] == clean.shape[:2]
        assert not torch.allclose(out[b], clean)
    if family != "bert":  # the TL bridge gives BERT an MLM head that this bare BertModel lacks
        torch.testing.assert_close(out["transformer_lens"], out["nnsight"], atol=1e-5, rtol=0)
    else:
        tl = interp.load_model(model_dirs[family], backend="transformer_lens")
        nn = interp.load_model(model_dirs[family], backend="nnsight")
        site = "blocks.1.hook_resid_post"
        a = {}
        for m in (tl, nn):
            with torch.no_grad():
                got = {}
                m.run(PROMPTS, hooks={**hooks, site: lambda x, m=m: got.__setitem__(m.backend_name, x)})
            a.update(got)
        torch.testing.assert_close(a["transformer_lens"], a["nnsight"], atol=1e-5, rtol=0)


def test_fingerprint_tracks_weights():
    hf, tok = build("gpt2")
    a = interp.load_model(hf, backend="nnsight", tokenizer=tok).fingerprint()
    with torch.no_grad():
        hf.transformer.wte.weight[0, 0] += 1.0
    b = interp.load_model(hf, backend="nnsight", tokenizer=tok).fingerprint()
    assert a != b and len(a) == 16


def test_the_transformer_lens_backend_never_changes_the_users_model():
    """Booting a TransformerBridge rewrites the modules it wraps; the backend wraps a copy, so the
    user's model, and an nnsight handle on it made before or after, keep working unchanged."""
    hf, tok = build("gpt2")
    x = torch.tensor([[1, 2, 3, 4]])
    with torch.no_grad():
        before_logits = hf(input_ids=x).logits.clone()
    modules_before = [type(m) for m in hf.modules()]
    early = interp.load_model(hf, backend="nnsight", tokenizer=tok)
    tl = interp.load_model(hf, backend="transformer_lens", tokenizer=tok)
    assert [type(m) for m in hf.modules()] == modules_before
    with torch.no_grad():
        assert torch.equal(hf(input_ids=x).logits, before_logits)
    site = "blocks.0.attn.hook_q"
    late = interp.load_model(tl, backend="nnsight")
    ref = interp.capture(tl, PROMPTS, sites=[site])[site]
    for handle in (early, late):
        torch.testing.assert_close(interp.capture(handle, PROMPTS, sites=[site])[site], ref, atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="rewritten the HuggingFace model"):
        interp.load_model(tl.backend.bridge, backend="nnsight", tokenizer=tok)


@pytest.mark.parametrize("which", ["world", "word"])
def test_prompts_tokenized_in_one_call_get_the_ids_of_one_call_each(which):
    """Scoring tokenizes a list of prompts in one tokenizer call (:func:`interp.scoring._ids`);
    the ids are those of one call per prompt, with and without special tokens."""
    from interp.scoring import _ids

    tok = interp.load_model("world").tokenizer if which == "world" else word_tokenizer()
    texts = ["Ada Lovelace is associated with the word", "", "  two  spaces here", " fox", "an unknownword"]
    for kwargs in ({}, {"add_special_tokens": False}):
        assert _ids(tok, texts, **kwargs) == [tok(t, **kwargs)["input_ids"] for t in texts]
    assert _ids(tok, []) == []
