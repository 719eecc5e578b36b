"""Capture equals the references: TransformerLens ``run_with_cache`` and HF hidden states."""

import pytest
import torch

import interp
from interp import Prompt

PROMPTS = [
    Prompt("Vorn Kallit lives in the city of", "Vorn Kallit"),
    Prompt("the capital of France is", "France"),
    Prompt("Mira was born in Tokyo", "Mira"),
]
FAMILIES = ["gpt2", "gpt_neox", "llama", "bert"]


def _unembedding(model):
    """The module computing the logits (None for a model without an LM head)."""
    if model.backend.name == "transformer_lens":
        return getattr(model.backend.bridge, "unembed", None)
    return model.backend.hf_model.get_output_embeddings()


def test_transformer_lens_backend_equals_run_with_cache(model_dirs):
    """Bit-exact where the shapes are identical (each prompt captured alone, as ``run_with_cache``
    sees it); equal within 1e-6 inside a padded batch of 2, whose matmuls have other shapes, and
    CPUs' kernels may round those differently (exact on one machine, 1e-7 apart on another)."""
    model = interp.load_model(model_dirs["gpt2"], backend="transformer_lens")
    sites = model.sites
    alone = interp.capture(model, PROMPTS, sites=sites, positions="all", batch_size=1)
    batched = interp.capture(model, PROMPTS, sites=sites, positions="all", batch_size=2)
    for i, p in enumerate(PROMPTS):
        ids = torch.tensor([model.encode([p])[0].ids])
        _, cache = model.backend.bridge.run_with_cache(ids)
        n = ids.shape[1]
        for s in sites:
            assert torch.equal(alone[s][i, :n], cache[s][0]), s
            torch.testing.assert_close(batched[s][i, :n], cache[s][0], atol=1e-6, rtol=0, msg=lambda m: f"{s}: {m}")


@pytest.mark.parametrize("family", FAMILIES)
def test_nnsight_backend_equals_hf_hidden_states(model_dirs, family):
    model = interp.load_model(model_dirs[family], backend="nnsight")
    layers = range(model.n_layers)
    sites = [f"blocks.{l}.hook_resid_pre" for l in layers] + [f"blocks.{l}.hook_resid_post" for l in layers]
    acts = interp.capture(model, PROMPTS, sites=sites, positions="last", batch_size=8)
    hf = model.backend.hf_model
    for i, p in enumerate(PROMPTS):
        ids = torch.tensor([model.encode([p])[0].ids])
        with torch.no_grad():
            hs = hf(input_ids=ids, output_hidden_states=True).hidden_states
        for l in layers:
            torch.testing.assert_close(acts[f"blocks.{l}.hook_resid_pre"][i], hs[l][0, -1], atol=1e-5, rtol=0)
            if l < model.n_layers - 1 or family == "bert":  # decoders' last hidden state is after the final norm
                torch.testing.assert_close(acts[f"blocks.{l}.hook_resid_post"][i], hs[l + 1][0, -1], atol=1e-5, rtol=0)


@pytest.mark.parametrize("family", FAMILIES)
def test_backends_agree_on_the_same_model(model_dirs, family):
    tl = interp.load_model(model_dirs[family], backend="transformer_lens")
    nn = interp.load_model(model_dirs[family], backend="nnsight")
    common = [s for s in nn.sites if s in tl.backend.accepted_sites]
    assert any("hook_z" in s for s in common) and any("hook_resid_post" in s for s in common)
    a = interp.capture(tl, PROMPTS, sites=common, positions="subject_last")
    b = interp.capture(nn, PROMPTS, sites=common, positions="subject_last")
    for s in common:
        torch.testing.assert_close(a[s], b[s], atol=1e-5, rtol=0, msg=lambda m: f"{family} {s}: {m}")


@pytest.mark.parametrize("side", ["left", "right"])
def test_padding_does_not_change_activations(model_dirs, backend, side):
    model = interp.load_model(model_dirs["llama"], backend=backend)
    sites = ["blocks.1.hook_resid_post", "blocks.0.attn.hook_z"]
    batch = interp.capture(model, PROMPTS, sites=sites, positions="subject_last", padding_side=side, batch_size=3)
    for i, p in enumerate(PROMPTS):
        alone = interp.capture(model, [p], sites=sites, positions="subject_last")
        for s in sites:
            torch.testing.assert_close(batch[s][i], alone[s][0], atol=1e-5, rtol=0)


def test_subject_positions_come_from_character_spans(model_dirs, backend):
    model = interp.load_model(model_dirs["gpt2"], backend=backend)
    enc = model.encode(PROMPTS[:1])[0]
    from interp.tokens import resolve_positions

    # "Vorn Kallit lives ..." -> subject tokens 0 and 1 in a word-level tokenizer
    assert resolve_positions(enc, PROMPTS[0], "subject_last", 0) == [1]
    assert resolve_positions(enc, PROMPTS[0], "subject_first", 0) == [0]
    acts = interp.capture(model, PROMPTS[:1], sites=["blocks.0.hook_resid_post"], positions=[0, 1, -1])
    every = interp.capture(model, PROMPTS[:1], sites=["blocks.0.hook_resid_post"], positions="all")
    full = every["blocks.0.hook_resid_post"][0]
    torch.testing.assert_close(acts["blocks.0.hook_resid_post"][0], full[[0, 1, len(enc) - 1]])


def test_minilm_through_both_backends(minilm_dir):
    prompts = [Prompt("Paris is the capital of France", "Paris"), Prompt("The Nile flows through Egypt", "Nile")]
    tl = interp.load_model(minilm_dir, backend="transformer_lens")
    nn = interp.load_model(minilm_dir, backend="nnsight")
    assert tl.n_layers == nn.n_layers == 6 and tl.d_model == nn.d_model == 384
    sites = [f"blocks.{l}.hook_resid_post" for l in range(6)]
    a = interp.capture(tl, prompts, sites=sites, positions="subject_last")
    b = interp.capture(nn, prompts, sites=sites, positions="subject_last")
    hf = nn.backend.hf_model
    enc = nn.tokenizer([p.text for p in prompts], return_tensors="pt", padding=True)
    with torch.no_grad():
        hs = hf(**enc, output_hidden_states=True).hidden_states
    for l, s in enumerate(sites):
        torch.testing.assert_close(a[s], b[s], atol=1e-5, rtol=0)
        # subject_last of "Paris ..." is token 1 ([CLS] paris ...); of "The Nile" token 2
        torch.testing.assert_close(b[s][0], hs[l + 1][0, 1], atol=1e-5, rtol=0)
        torch.testing.assert_close(b[s][1], hs[l + 1][1, 2], atol=1e-5, rtol=0)


def _blocks(model) -> torch.nn.ModuleList:
    backend = model.backend
    if model.backend_name == "transformer_lens":
        return backend.bridge.blocks
    return backend.hf_model.get_submodule(backend._base + backend.arch.layers)


def _attention(block: torch.nn.Module) -> torch.nn.Module:
    return next(m for name, m in block.named_children() if "att" in name)  # attn, self_attn, attention


@pytest.mark.parametrize("family", ["gpt2", "llama_gqa", "bert"])
def test_capture_stops_after_the_last_requested_block(model_dirs, backend, family):
    """Capturing early sites runs only the blocks up to them, with the same values as a full pass.
    A block counts as run when its attention runs (TransformerLens stops at the entry of the first
    block it skips, nnsight inside the output of the last block it runs)."""
    model = interp.load_model(model_dirs[family], backend=backend)
    blocks = _blocks(model)
    assert len(blocks) == model.n_layers >= 2
    calls = [0] * len(blocks)
    handles = [
        _attention(b).register_forward_pre_hook(lambda m, i, k=k: calls.__setitem__(k, calls[k] + 1))
        for k, b in enumerate(blocks)
    ]
    try:
        early = ["hook_embed", "blocks.0.hook_resid_post"]
        early = [s for s in early if s in model.sites]
        stopped = interp.capture(model, PROMPTS, sites=early, positions="all", batch_size=8)
        assert calls[0] == 1 and calls[1:] == [0] * (len(blocks) - 1), calls
        unembed = _unembedding(model)
        heads = [0]
        if unembed is not None:
            handles.append(unembed.register_forward_hook(lambda m, i, o: heads.__setitem__(0, heads[0] + 1)))
        full = interp.capture(model, PROMPTS, sites=early + [model.resid_site(model.n_layers - 1)], positions="all")
        assert calls[-1] == 1  # a site in the last block needs every block ...
        assert heads[0] == 0  # ... but not the unembedding
        if unembed is not None:
            model.run(PROMPTS)
            assert heads[0] == 1
    finally:
        for h in handles:
            h.remove()
    for s in early:
        assert torch.equal(stopped[s], full[s]), s
    if backend == "transformer_lens":  # a bridge's own hook name has no known place: no early stop
        both = interp.capture(model, PROMPTS, sites=["blocks.1.hook_in", "blocks.1.hook_resid_post"], positions="all")
        torch.testing.assert_close(both["blocks.1.hook_resid_post"], full[model.resid_site(1)], atol=0, rtol=0)
    # a pass that writes and reads the logits is never stopped
    assert model.run(PROMPTS, {"blocks.0.hook_resid_post": lambda a: a}) is not None
