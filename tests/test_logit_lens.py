"""The logit lens against the model's own read-out applied by hand, on every family and backend."""

from __future__ import annotations

import pandas as pd
import pytest
import torch
from tiny_models import build

import interp
from interp.lens import LogitLensError, logit_lens

PROMPTS = ["Vorn Kallit lives in the city of", "Mira Tesh was born in"]


def _naive(hf, tok, prompt: str, family: str) -> list[torch.Tensor]:
    """Each block's output at the last token, through the final norm and the unembedding by hand."""
    if family == "gpt2":
        blocks, norm = hf.transformer.h, hf.transformer.ln_f
    elif family == "gpt_neox":
        blocks, norm = hf.gpt_neox.layers, hf.gpt_neox.final_layer_norm
    else:
        blocks, norm = hf.model.layers, hf.model.norm
    outs = []
    handles = [
        b.register_forward_hook(lambda m, i, o: outs.append((o[0] if isinstance(o, tuple) else o)[0, -1]))
        for b in blocks
    ]
    ids = tok(prompt, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        own = hf(ids).logits[0, -1]
        lens = [hf.get_output_embeddings()(norm(h)) for h in outs]
    for h in handles:
        h.remove()
    return lens, own


@pytest.mark.parametrize("family", ["gpt2", "gpt_neox", "llama", "llama_gqa"])
def test_each_layer_is_the_final_norm_and_unembedding_of_its_residual(family, backend):
    hf, tok = build(family)
    model = interp.load_model(hf, backend, tokenizer=tok)
    lens = logit_lens(model, PROMPTS, k=3, targets=["Paris"])
    for prompt in PROMPTS:
        naive, own = _naive(hf, tok, prompt, family)
        for layer, ref in enumerate(naive):
            got = lens[(lens.prompt == prompt) & (lens.layer == layer) & ~lens.target]
            assert list(got.token_id) == ref.topk(3).indices.tolist()
            torch.testing.assert_close(
                torch.tensor(got.logit.to_numpy(), dtype=torch.float32), ref.topk(3).values, atol=1e-4, rtol=1e-4
            )
            tgt = lens[(lens.prompt == prompt) & (lens.layer == layer) & lens.target].iloc[0]
            mat = tok.convert_tokens_to_ids("Paris")
            assert tgt["rank"] == int((ref > ref[mat]).sum()) + 1
            assert tgt.prob == pytest.approx(float(torch.softmax(ref, -1)[mat]), abs=1e-5)
        # the last layer is the model's own prediction
        top = lens[(lens.prompt == prompt) & (lens.layer == model.n_layers - 1) & ~lens.target]
        assert top.token_id.iloc[0] == int(own.argmax())
    assert set(lens.columns) >= {"prompt", "layer", "position", "token", "logit", "prob", "rank"}


def test_positions_layers_and_clear_errors():
    hf, tok = build("gpt2")
    model = interp.load_model(hf, tokenizer=tok)
    lens = logit_lens(model, PROMPTS[:1], layers=[0], positions="all", k=2)
    n = len(tok(PROMPTS[0])["input_ids"])
    assert sorted(set(lens.position)) == list(range(n)) and set(lens.layer) == {0} and len(lens) == 2 * n
    with pytest.raises(LogitLensError, match="outside"):
        logit_lens(model, PROMPTS, layers=[5])
    with pytest.raises(LogitLensError, match="tokens"):
        logit_lens(model, PROMPTS, targets=["the city"])
    with pytest.raises(LogitLensError, match="vocabulary"):
        logit_lens(model, PROMPTS, targets=["Vienna"])
    # an encoder with its masked-LM head: the lens reads through the head, and its last layer is the model's
    from transformers import BertConfig, BertForMaskedLM

    torch.manual_seed(0)
    cfg = BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                     max_position_embeddings=64, vocab_size=len(tok), pad_token_id=0)  # fmt: skip
    mlm = BertForMaskedLM(cfg).eval()
    own = mlm(tok(PROMPTS[0], return_tensors="pt")["input_ids"]).logits[0, -1]
    lens = logit_lens(interp.load_model(mlm, tokenizer=tok), PROMPTS[:1], k=2)
    assert lens[lens.layer == 1].token_id.tolist() == own.topk(2).indices.tolist()
    bert, btok = build("bert")  # an encoder with no language-model head
    with pytest.raises(LogitLensError, match="no head"):
        logit_lens(interp.load_model(bert, tokenizer=btok), PROMPTS)


def test_lens_figures_draw_from_the_saved_table(tmp_path):
    from interp.lens import lens_figure, target_rank_figure

    hf, tok = build("gpt2")
    model = interp.load_model(hf, tokenizer=tok)
    lens = logit_lens(model, PROMPTS, positions="all", targets=["Paris", "Berlin"], k=1)
    lens.to_csv(tmp_path / "lens.csv", index=False)
    saved = pd.read_csv(tmp_path / "lens.csv", keep_default_na=False)
    fig = lens_figure(saved, PROMPTS[1])
    heat = fig.data[0]
    n = len(tok(PROMPTS[1])["input_ids"])
    assert heat.z.shape == (model.n_layers, n)
    top = lens[(lens.prompt == PROMPTS[1]) & (lens.layer == 1) & (lens["rank"] == 1) & ~lens.target]
    assert list(heat.text[1]) == list(top.sort_values("position").token)
    ranks = target_rank_figure(saved)
    assert len(ranks.data) == 2 * len(tok(PROMPTS[0])["input_ids"])  # a line per target and position
    with pytest.raises(LogitLensError, match="not in the lens table"):
        lens_figure(saved, "another prompt")
