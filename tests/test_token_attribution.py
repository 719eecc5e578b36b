"""Token attribution against naive loops and the path integral, on every decoder family and both backends."""

from __future__ import annotations

import pytest
import torch
from tiny_models import build

import interp
from circuits.token_attribution import TokenAttribution, TokenAttributionError

PROMPTS = ["Vorn Kallit lives in the city of", "Mira Tesh was born in"]


def _metric_with(model, prompt, target, hook=None):
    """log p(target | prompt) at the last token, one prompt, one forward (optionally hooked)."""
    logits = model.run([prompt], {"hook_embed": hook} if hook else None)
    return torch.log_softmax(logits[0, -1].float(), -1)[target]


@pytest.mark.parametrize("family", ["gpt2", "gpt_neox", "llama_gqa"])
def test_occlusion_is_a_loop_of_single_occlusions_and_gradient_x_input_is_autograd(family, backend):
    hf, tok = build(family)
    model = interp.load_model(hf, backend, tokenizer=tok)
    occ = TokenAttribution(model, method="occlusion", batch_size=4).run(PROMPTS, targets=["Paris", "Berlin"])
    gxi = TokenAttribution(model, method="gradient_x_input").run(PROMPTS, targets=["Paris", "Berlin"])
    for prompt, target in zip(PROMPTS, ["Paris", "Berlin"]):
        t = tok.convert_tokens_to_ids(target)
        full = _metric_with(model, prompt, t)
        n = len(tok(prompt)["input_ids"])
        got = occ[occ.prompt == prompt].sort_values("position")
        assert len(got) == n
        for pos in range(n):

            def zero(act, pos=pos):
                act = act.clone()
                act[0, pos] = 0
                return act

            ref = float((full - _metric_with(model, prompt, t, zero)).detach())
            assert got.score.iloc[pos] == pytest.approx(ref, abs=1e-4)
        # gradient x input by autograd on the embeddings of this prompt alone
        with torch.enable_grad():
            emb = model.read([prompt], ["hook_embed"])["hook_embed"].detach().requires_grad_(True)
            value = _metric_with(model, prompt, t, lambda act: emb)
            (grad,) = torch.autograd.grad(value, emb)
        ref = (grad * emb).sum(-1)[0]
        g = gxi[gxi.prompt == prompt].sort_values("position").score
        torch.testing.assert_close(torch.tensor(g.to_numpy(), dtype=torch.float32), ref.detach(), atol=1e-4, rtol=1e-3)


@pytest.mark.parametrize(("family", "baseline"), [("gpt2", "zeros"), ("gpt_neox", "pad")])
def test_integrated_gradients_converge_to_the_path_integral_and_complete(family, baseline):
    hf, tok = build(family)
    model = interp.load_model(hf, tokenizer=tok)
    errors, gaps = [], []
    ref = TokenAttribution(model, steps=512, baseline=baseline, batch_size=64).run(PROMPTS[:1], targets=["Paris"])
    for steps in (2, 8, 32):
        ig = TokenAttribution(model, steps=steps, baseline=baseline, batch_size=64).run(PROMPTS[:1], targets=["Paris"])
        errors.append(float((ig.score - ref.score).abs().max()))
        gaps.append(abs(float(ig.completeness_error.iloc[0])))
    assert errors[0] > errors[1] > errors[2] and errors[2] < 0.01 * ref.score.abs().max()
    assert gaps[0] > gaps[2] and abs(ref.completeness_error.iloc[0]) < 1e-4
    # scores sum to m(input) - m(baseline) up to that measured gap
    total = ref.metric.iloc[0] - ref.baseline_metric.iloc[0] + ref.completeness_error.iloc[0]
    assert ref.score.sum() == pytest.approx(total, abs=1e-5)


def test_a_degenerate_baseline_shows_in_the_completeness_error():
    """Llama normalizes the token embeddings before anything else and adds no positional
    embedding, so m(a e) is the same for every a > 0: from a zero baseline the whole change sits
    at the path's start, which the midpoint rule cannot resolve. The gap is reported, not hidden."""
    hf, tok = build("llama")
    model = interp.load_model(hf, tokenizer=tok)
    ig = TokenAttribution(model, steps=32, batch_size=64).run(PROMPTS[:1], targets=["Paris"])
    change = abs(ig.metric.iloc[0] - ig.baseline_metric.iloc[0])
    assert abs(ig.completeness_error.iloc[0]) > 0.05 * change


def test_a_batch_gives_each_prompt_its_own_scores_and_errors_are_clear():
    hf, tok = build("gpt2")
    model = interp.load_model(hf, tokenizer=tok)
    both = TokenAttribution(model, steps=8).run(PROMPTS)  # the model's own predictions as targets
    for p in PROMPTS:
        alone = TokenAttribution(model, steps=8).run([p])
        mine = both[both.prompt == p].reset_index(drop=True)
        assert list(mine.token) == list(alone.token) and mine.target.iloc[0] == alone.target.iloc[0]
        assert (mine.score - alone.score).abs().max() < 1e-4
    custom = TokenAttribution(model, metric=lambda logits: logits[:, -1].logsumexp(-1), method="occlusion")
    assert custom.run(PROMPTS).score.notna().all()
    with pytest.raises(TokenAttributionError, match="method"):
        TokenAttribution(model, method="saliency")
    with pytest.raises(TokenAttributionError, match="one per prompt"):
        TokenAttribution(model).run(PROMPTS, targets=["Paris"])
    with pytest.raises(TokenAttributionError, match="vocabulary"):
        TokenAttribution(model).run(PROMPTS[:1], targets=["Vienna"])
    with pytest.raises(TokenAttributionError, match="one value per prompt"):
        TokenAttribution(model, metric=lambda logits: logits.sum(), method="occlusion").run(PROMPTS)


def test_token_figure_draws_the_saved_table(tmp_path):
    import pandas as pd

    from circuits.token_attribution import token_figure

    hf, tok = build("gpt2")
    model = interp.load_model(hf, tokenizer=tok)
    scores = TokenAttribution(model, method="gradient_x_input").run(PROMPTS)
    scores.to_csv(tmp_path / "t.csv", index=False)
    fig = token_figure(pd.read_csv(tmp_path / "t.csv"))
    heat = fig.data[0]
    assert heat.z.shape == (2, int(scores.position.max()) + 1) and heat.zmid == 0
    assert heat.zmax == pytest.approx(scores.score.abs().max()) and heat.zmin == -heat.zmax
    first = scores[scores.prompt == PROMPTS[0]].sort_values("position")
    assert list(heat.text[0][: len(first)]) == list(first.token)
    assert list(heat.text[1][len(tok(PROMPTS[1])["input_ids"]) :]) == [""] * (
        heat.z.shape[1] - len(tok(PROMPTS[1])["input_ids"])
    )
