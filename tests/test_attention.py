"""Attention patterns against the model's own eager attention (HF ``output_attentions``), on every
family and backend; a prompt's pattern is the same alone and in a padded batch; figures and the
circuitsvis view draw from the table."""

from __future__ import annotations

import sys

import numpy as np
import pandas as pd
import pytest
import torch
from tiny_models import build

import interp
from interp.attention import AttentionError, attention_figure, attention_patterns, attention_view

PROMPTS = ["Vorn Kallit lives in the city of", "Mira Tesh was born in", "the capital of France is Paris"]


@pytest.mark.parametrize("family", ["gpt2", "gpt_neox", "llama", "llama_gqa"])
def test_patterns_are_the_models_own_attention(family, backend):
    hf, tok = build(family)
    model = interp.load_model(hf, backend, tokenizer=tok)
    att = attention_patterns(model, PROMPTS)
    assert len(set(att.layer)) == model.n_layers and len(set(att["head"])) == model.n_heads
    hf.set_attn_implementation("eager")
    for prompt in PROMPTS:
        ids = tok(prompt, return_tensors="pt")["input_ids"]
        with torch.no_grad():
            ref = hf(ids, output_attentions=True).attentions  # alone: no padding at all
        n = ids.shape[1]
        for layer in range(model.n_layers):
            t = att[(att.prompt == prompt) & (att.layer == layer)].sort_values(
                ["head", "query_position", "key_position"]
            )
            got = torch.tensor(t.weight.to_numpy(), dtype=torch.float32).reshape(model.n_heads, n, n)
            torch.testing.assert_close(got, ref[layer][0].float(), atol=1e-5, rtol=1e-4)
        tokens = att[(att.prompt == prompt) & (att.layer == 0) & (att["head"] == 0) & (att.query_position == 0)]
        assert list(tokens.key_token) == [tok.decode([i]) for i in ids[0].tolist()]
    rows = att.groupby(["prompt", "layer", "head", "query_position"]).weight.sum()
    np.testing.assert_allclose(rows.to_numpy(), 1.0, atol=1e-5)  # each query's weights sum to 1
    assert (att[att.key_position > att.query_position].weight.abs() < 1e-7).all()  # causal


def test_layers_heads_and_clear_errors():
    hf, tok = build("gpt2")
    model = interp.load_model(hf, tokenizer=tok)
    att = attention_patterns(model, PROMPTS[:2], layers=[1], heads=[0], batch_size=1)
    assert set(att.layer) == {1} and set(att["head"]) == {0}
    with pytest.raises(AttentionError, match="layers \\[7\\] are outside"):
        attention_patterns(model, PROMPTS, layers=[7])
    with pytest.raises(AttentionError, match="heads \\[9\\] are outside"):
        attention_patterns(model, PROMPTS, heads=[9])
    with pytest.raises(AttentionError, match="not in the attention table"):
        attention_figure(att, prompt="another prompt")
    with pytest.raises(AttentionError, match="layer 0 is not in the attention table"):
        attention_figure(att, layer=0)
    # the same text twice is two prompts; heads in any order; every layer from one pass
    twice = attention_patterns(model, [PROMPTS[1], PROMPTS[1]], heads=[3, 1])
    assert set(twice.prompt_index) == {0, 1} and set(twice["head"]) == {1, 3}
    a, b = (twice[twice.prompt_index == i].drop(columns="prompt_index").reset_index(drop=True) for i in (0, 1))
    pd.testing.assert_frame_equal(a, b)
    assert len(attention_figure(twice, prompt=1, layer=1).data) == 2
    with pytest.raises(AttentionError, match="interventions"):
        attention_patterns(model.intervened("blocks.0.hook_resid_post", lambda x: x), PROMPTS)


def test_figure_and_circuitsvis_view(monkeypatch):
    hf, tok = build("llama_gqa")
    model = interp.load_model(hf, tokenizer=tok)
    att = attention_patterns(model, PROMPTS[:1], layers=[0])
    fig = attention_figure(att)
    n = len(tok(PROMPTS[0])["input_ids"])
    assert len(fig.data) == model.n_heads and fig.data[0].z.shape == (n, n)
    assert fig.data[0].x[1].endswith("Kallit")  # position and token on the axes
    two = attention_figure(att, heads=[1, 3], columns=1)
    assert [a.text for a in two.layout.annotations] == ["head 1", "head 3"]
    view = attention_view(att)
    html = view.local_src
    assert "Kallit" in html and "AttentionPatterns" in html
    monkeypatch.setitem(sys.modules, "circuitsvis", None)
    with pytest.raises(ImportError, match="pip install circuitsvis"):
        attention_view(att)
