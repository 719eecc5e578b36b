"""Every entry point that takes prompts accepts the same kinds, validated in one place
(`interp.prompts.as_prompts`): text, `Prompt`, token ids, and a tokenizer's output with its mask."""

import pytest
import torch

import interp
from circuits import make_pairs
from interp import PositionError

TEXTS = ["the city is Paris", "a country"]
SITE = "blocks.1.hook_resid_post"


def test_token_ids_and_masks_capture_what_text_does(model_dirs, backend):
    model = interp.load_model(model_dirs["gpt2"], backend=backend)
    ref = interp.capture(model, TEXTS, sites=[SITE], positions="last")[SITE]
    rows = [model.encode([t])[0].ids for t in TEXTS]
    width = max(map(len, rows))
    left = torch.full((2, width), model.pad_token_id)
    mask = torch.zeros(2, width, dtype=torch.long)
    for i, r in enumerate(rows):
        left[i, width - len(r) :] = torch.tensor(r)
        mask[i, width - len(r) :] = 1
    kinds = {
        "list of ids": rows,
        "1-D tensor": torch.tensor(rows[0]),
        "left-padded with mask": {"input_ids": left, "attention_mask": mask},
    }
    for name, inputs in kinds.items():
        got = interp.capture(model, inputs, sites=[SITE], positions="last")[SITE]
        n = len(got)
        torch.testing.assert_close(got, ref[:n], atol=1e-6, rtol=0, msg=lambda m: f"{name}: {m}")
    logits = model.run({"input_ids": left, "attention_mask": mask})
    assert logits.shape[:2] == left.shape


def test_patching_pairs_take_the_same_kinds(model_dirs):
    model = interp.load_model(model_dirs["gpt2"])
    enc = model.tokenizer(["the city is", "a country is"], return_tensors="pt")
    a = make_pairs(model, ["the city is"], ["a country is"])
    b = make_pairs(
        model, enc["input_ids"][:1], {"input_ids": enc["input_ids"][1:], "attention_mask": enc["attention_mask"][1:]}
    )
    assert torch.equal(a.clean.input_ids, b.clean.input_ids) and torch.equal(
        a.corrupted.input_ids, b.corrupted.input_ids
    )


def test_a_model_without_a_tokenizer_captures_token_ids():
    from tiny_models import word_tokenizer
    from transformer_lens.config import TransformerBridgeConfig

    tok = word_tokenizer()
    cfg = TransformerBridgeConfig(
        d_model=32, d_head=8, n_layers=2, n_ctx=32, n_heads=4, d_vocab=len(tok), d_mlp=64, act_fn="gelu", seed=0
    )
    model = interp.load_model(cfg, backend="transformer_lens", tokenizer=tok)
    ids = torch.tensor([[1, 2, 3], [4, 5, 6]])
    with_tok = interp.capture(model, ids, sites=[SITE], positions="all")[SITE]
    model.tokenizer = None  # a native bridge built without one
    torch.testing.assert_close(interp.capture(model, ids, sites=[SITE], positions="all")[SITE], with_tok)
    with pytest.raises(TypeError, match="text prompts need the model's tokenizer"):
        interp.capture(model, ["the city"], sites=[SITE])


def test_malformed_token_inputs_are_named(model_dirs):
    model = interp.load_model(model_dirs["gpt2"])
    with pytest.raises(PositionError, match="token ids, which have no text"):
        interp.capture(model, torch.tensor([[1, 2, 3]]), sites=[SITE], positions="subject_last")
    with pytest.raises(TypeError, match="token ids must be integers"):
        interp.capture(model, torch.rand(2, 3), sites=[SITE])
    with pytest.raises(ValueError, match=r"must be \[n, pos\]"):
        interp.capture(model, torch.ones(1, 2, 3, dtype=torch.long), sites=[SITE])
    with pytest.raises(ValueError, match="does not match input_ids"):
        interp.capture(
            model, {"input_ids": torch.ones(2, 3, dtype=torch.long), "attention_mask": torch.ones(2, 4)}, sites=[SITE]
        )
    with pytest.raises(ValueError, match="no tokens"):
        interp.capture(
            model, {"input_ids": torch.ones(1, 3, dtype=torch.long), "attention_mask": torch.zeros(1, 3)}, sites=[SITE]
        )
