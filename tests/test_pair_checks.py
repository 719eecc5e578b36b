"""Pairs that cannot be silently wrong (circuits.pairs): multi-token answers scored teacher-forced
or refused by the one-token metrics, unknown words and identical answers refused before any work,
and the template / matched-pair helpers checked token by token."""

from __future__ import annotations

import pytest
import torch

import interp
from circuits import (
    ActivationPatching,
    AnswerError,
    MetricError,
    PairLengthError,
    UnknownTokenError,
    make_pairs,
    matched_pairs,
    pairs_from_template,
)
from circuits.metrics import AnswerLogprob
from lab.world import ZOO, from_world, load_world


# world v3's names and answers ("Rex Dulel") are words of its own vocabulary
@pytest.fixture(scope="module")
def world():
    return interp.load_model("world-v3")


@pytest.fixture(scope="module")
def city():
    return from_world(load_world(ZOO["world-v3"].path), ["city"])[0]


@pytest.fixture(scope="module")
def same(world, city):
    """Four prompts of the relation with the same token count, and their answers."""
    ps = city.prompts()
    enc = world.encode(ps)
    length = len(enc[0])
    idx = [i for i, e in enumerate(enc) if len(e) == length][:4]
    return [ps[i].text for i in idx], [city.answers[i] for i in idx]


def test_answers_sharing_their_first_token_are_refused_by_logit_diff(world, same):
    """'Rex Dulel' vs 'Rex Muzum' (as 'New York' vs 'New Delhi'): the first tokens agree, so a one-token
    logit difference would be 0 everywhere. It is refused before any forward pass."""
    (p, _) = same
    pairs = make_pairs(world, p[:1], p[1:2], answer=["Rex Dulel"], wrong=["Rex Muzum"])
    assert pairs.answer.tolist() == pairs.wrong.tolist()  # what the old first-token pairs held
    assert pairs.multi_token
    calls = []
    world_run = world.run
    world.run = lambda *a, **k: calls.append(1) or world_run(*a, **k)
    try:
        with pytest.raises(MetricError, match="answer_logprob"):
            ActivationPatching(world, "logit_diff", sites=["resid_pre"]).run(pairs)
        with pytest.raises(MetricError, match="one token"):
            ActivationPatching(world, "answer_prob", sites=["resid_pre"]).run(pairs)
    finally:
        world.run = world_run
    assert not calls  # refused before any work


def test_a_multi_token_answer_is_scored_teacher_forced(world, same):
    """answer_logprob = the sum of the answer's token log-probabilities given the prompt and the
    answer's earlier tokens, against a naive loop over full forward passes of prompt + answer."""
    (p, a) = same
    clean, corrupted = [p[0], p[2]], [p[1], p[3]]
    answers = ["Rex Dulel", a[2]]  # two tokens, one token
    pairs = make_pairs(world, clean, corrupted, answer=answers)
    with torch.no_grad():
        scores = AnswerLogprob()(world.run(pairs.clean), pairs)
    for i, (prompt, ans) in enumerate(zip(clean, answers)):
        p_ids = world.tokenizer(prompt)["input_ids"]
        a_ids = world.tokenizer(" " + ans, add_special_tokens=False)["input_ids"]
        with torch.no_grad():
            logp = torch.log_softmax(world.run(torch.tensor([p_ids + a_ids])).float(), -1)[0]
        naive = sum(logp[len(p_ids) - 1 + j, t] for j, t in enumerate(a_ids))
        torch.testing.assert_close(scores[i], naive, atol=1e-4, rtol=1e-5)  # padding: other matmul shapes
    # the corrupted prompts carry the same continuation, so the pair stays length-matched
    assert pairs.clean.input_ids.shape == pairs.corrupted.input_ids.shape
    table = ActivationPatching(world, "answer_logprob", sites=["resid_pre"], by_position=False).run(pairs)
    assert table.score.notna().all()


def test_unknown_words_are_refused_naming_them(world, same):
    (p, a) = same
    with pytest.raises(UnknownTokenError, match="'Vorn', 'Kallit'"):
        make_pairs(world, ["Vorn Kallit city :"], p[1:2], answer=a[:1], wrong=["Muzum"])
    with pytest.raises(UnknownTokenError, match="Paris"):
        make_pairs(world, p[:1], p[1:2], answer=["Paris"], wrong=["Muzum"])
    with pytest.raises(TypeError, match="Ellipsis"):  # README's old placeholder answer=[...]
        make_pairs(world, p[:1], p[1:2], answer=[...], wrong=["Muzum"])


def test_answer_and_wrong_that_tokenize_identically_are_refused(world, same):
    (p, _) = same
    with pytest.raises(AnswerError, match="tokenize identically"):
        make_pairs(world, p[:1], p[1:2], answer=["Muzum"], wrong=[" Muzum"])


def test_pairs_from_a_template_are_length_matched_and_differ_only_in_the_filler(world, city):
    names = [p.subject for p in city.prompts()[:40]]
    pairs = pairs_from_template(world, "{} city :", names, city.answers[:40], n=10, seed=3)
    assert len(pairs) == 10
    for i in range(len(pairs)):
        a, b = pairs.clean.input_ids[i], pairs.corrupted.input_ids[i]
        assert pairs.answer[i] != pairs.wrong[i]
        differ = (a != b).nonzero().flatten().tolist()
        assert differ and max(differ) < int(pairs.last[i]) - 1  # only name tokens; "city :" agrees
    again = pairs_from_template(world, "{} city :", names, city.answers[:40], n=10, seed=3)
    assert torch.equal(again.clean.input_ids, pairs.clean.input_ids)
    with pytest.raises(ValueError, match="exactly one"):
        pairs_from_template(world, "{} city {}", names, city.answers[:40])
    with pytest.raises(PairLengthError):
        make_pairs(world, [city.prompts()[0].text], ["Rex city :"], answer=["Muzum"], wrong=["Dulel"])


def test_a_filler_that_changes_the_tokens_around_it_is_not_paired(world):
    """Token by token: two prompts of equal length whose difference leaks outside the filler."""
    tok = world.tokenizer
    assert len(tok.tokenize("Rex city :")) == len(tok.tokenize("Rex : :"))
    from circuits.pairs import _differs_outside
    from interp.prompts import Prompt

    a, b = world.encode([Prompt("Rex city :", subject="Rex"), Prompt("Dulel : :", subject="Dulel")])
    assert _differs_outside(world, a, b, ((0, 3), (0, 5))) == 1
    assert _differs_outside(world, a, a, ((0, 3), (0, 3))) is None


def test_matched_pairs_refuses_prompts_with_no_partner(world, city):
    ps = city.prompts()
    with pytest.raises(ValueError, match="cannot build patching pairs"):
        matched_pairs(world, ps[:1], city.answers[:1])


def test_a_samples_own_prompt_overrides_the_template_for_that_sample_only(tmp_path):
    """Before: one sample's ``prompt`` without the others' was silently ignored."""
    import json

    from interp.relations import RelationError, load_relations

    d = {
        "name": "home city",
        "template": "{} city :",
        "samples": [
            {"subject": "Thibroum Rex Dulel", "answer": "Muzum"},
            {"subject": "Dafeirk Suzegoux", "answer": "Stimes", "prompt": "Dafeirk Suzegoux lives in"},
        ],
    }
    (tmp_path / "r.json").write_text(json.dumps(d))
    (rel,) = load_relations(tmp_path / "r.json")
    assert [p.text for p in rel.prompts()] == ["Thibroum Rex Dulel city :", "Dafeirk Suzegoux lives in"]
    d["samples"][1]["prompt"] = "somebody lives in"
    (tmp_path / "r.json").write_text(json.dumps(d))
    with pytest.raises(RelationError, match="does not contain its subject"):
        load_relations(tmp_path / "r.json")


def test_a_special_token_written_out_is_not_an_unknown_word():
    """GPT-2's unknown token is its <|endoftext|>: written in a prompt, it is that token, not a typo;
    a word the vocabulary lacks still is one."""
    from types import SimpleNamespace

    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from circuits.pairs import _refuse_unknown
    from interp.prompts import Prompt
    from interp.tokens import encode

    tk = Tokenizer(models.WordLevel({"<|endoftext|>": 0, "the": 1, "city": 2}, unk_token="<|endoftext|>"))
    tk.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="<|endoftext|>", eos_token="<|endoftext|>")
    model = SimpleNamespace(tokenizer=tok)
    ok = Prompt("<|endoftext|> the city")
    _refuse_unknown(model, ok, encode(tok, [ok])[0], "prompt")
    bad = Prompt("<|endoftext|> the town")
    with pytest.raises(UnknownTokenError, match="'town'"):
        _refuse_unknown(model, bad, encode(tok, [bad])[0], "prompt")


def test_an_empty_answer_is_refused(world, same):
    (p, a) = same
    with pytest.raises(AnswerError, match="empty"):
        make_pairs(world, p[:1], p[1:2], answer=a[:1], wrong=[" "])


def test_matched_pairs_compares_answers_as_the_model_reads_them(world, same):
    (p, a) = same
    with pytest.raises(ValueError, match="cannot build patching pairs"):
        matched_pairs(world, p[:2], [a[0], " " + a[0]])  # one answer, written two ways


def test_a_users_metric_refuses_multi_token_answers_unless_told(world, same):
    from circuits import as_metric

    (p, _) = same
    pairs = make_pairs(world, p[:1], p[1:2], answer=["Rex Dulel"], wrong=["Rex Muzum"])
    fn = lambda logits, pairs: logits[:, -1, 0]  # noqa: E731
    with pytest.raises(MetricError, match="answer_tokens"):
        ActivationPatching(world, fn, sites=["resid_pre"]).run(pairs)
    table = ActivationPatching(world, as_metric(fn, multi_token=True), sites=["resid_pre"], by_position=False).run(
        pairs
    )
    assert len(table) == world.n_layers
