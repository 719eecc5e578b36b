"""The study on an encoder: masked-slot scoring with a tied read-out, LoRA targets, LRE
qualification, missing covariates, and the whole pipeline on a tiny random BERT (resumable)."""

from collections import Counter

import pandas as pd
import pytest
import torch
from conftest import BACKENDS

import interp
from interp.prompts import Prompt
from interp.relations import Relation, load_relations, lre_dir
from interp.trainable import LoraSpec
from lab.study import FinetuneConfig, run_study
from lab.study.finetune import finetune
from lab.study.interventions import InterventionConfig, Interventions, SubjectEnd
from lab.study.relations import QualifyRule, qualifying_relations, restrict
from lab.study.run import real_model_config

PROMPTS = ["Nokia is associated with the word", "the piano is associated with the word"]
CANDIDATES = ["cat", "walrus", "zebra", "hippopotamus"]  # 1, 2, 1 and 3+ word pieces


@pytest.fixture(scope="module")
def tiny_bert_dir(tmp_path_factory, minilm_dir):
    """A 2-layer random BertModel (no LM head) with MiniLM's WordPiece tokenizer (it has [MASK])."""
    from transformers import AutoTokenizer, BertConfig, BertModel

    torch.manual_seed(0)
    tok = AutoTokenizer.from_pretrained(minilm_dir)
    model = BertModel(
        BertConfig(
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=64,
            max_position_embeddings=64,
            vocab_size=tok.vocab_size,
        )
    )
    path = tmp_path_factory.mktemp("tiny_bert")
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


def _hand_scores(hf, tok, prompt, word):
    """log p(word) at a masked slot, computed directly on the HuggingFace model: one mask per piece,
    each piece's log-softmax of h_mask @ E.T over the vocabulary, summed."""
    pieces = tok(word, add_special_tokens=False)["input_ids"]
    enc = tok(prompt + " " + " ".join(["[MASK]"] * len(pieces)), return_tensors="pt")
    where = (enc["input_ids"][0] == tok.mask_token_id).nonzero()[:, 0]
    with torch.no_grad():
        h = hf(**enc).last_hidden_state[0, where]
        logp = torch.log_softmax(h @ hf.get_input_embeddings().weight.T, -1)
    return float(sum(logp[i, p] for i, p in enumerate(pieces)))


@pytest.mark.parametrize("backend", BACKENDS)
def test_masked_scoring_equals_a_hand_computation(tiny_bert_dir, backend):
    from transformers import AutoTokenizer, BertModel

    model = interp.load_model(tiny_bert_dir, backend=backend)
    assert model.scoring.kind == "masked" and model.scoring.answers_undefined
    tok = AutoTokenizer.from_pretrained(tiny_bert_dir)
    assert [len(tok(c, add_special_tokens=False)["input_ids"]) for c in CANDIDATES][:2] == [1, 2]
    hf = BertModel.from_pretrained(tiny_bert_dir).eval()
    got = model.logprobs(PROMPTS, CANDIDATES)
    want = torch.tensor([[_hand_scores(hf, tok, p, c) for c in CANDIDATES] for p in PROMPTS])
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
    # the training loss is the cross-entropy of the same read-out, averaged over target pieces
    ex = model.scoring.examples(PROMPTS, ["cat", "walrus"])
    loss = model.scoring.loss(ex, torch.arange(2))
    assert abs(loss.item() - (-(want[0, 0] + want[1, 1]) / 3).item()) < 1e-5  # 1 + 2 pieces
    with pytest.raises(TypeError, match="causal LM"):
        model.token_logprobs("Nokia")


def test_both_backends_fine_tune_an_encoder_alike(tiny_bert_dir):
    """A full fine-tune through the masked slot gives the same scores on both backends."""
    cfg = FinetuneConfig(lr=3e-3, max_steps=10, check_every=5)
    scores = []
    for backend in BACKENDS:
        model = interp.load_model(tiny_bert_dir, backend=backend)
        tuned, info = finetune(model, PROMPTS, ["cat", "zebra"], ["cat", "zebra"], "full", cfg, seed=0)
        scores.append(tuned.logprobs(PROMPTS, ["cat", "zebra"]))
    torch.testing.assert_close(scores[0], scores[1], atol=1e-4, rtol=0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_lora_adapts_every_encoder_block_but_not_the_pooler(tiny_bert_dir, backend):
    model = interp.load_model(tiny_bert_dir, backend=backend)
    copy = model.trainable_copy(lora=LoraSpec(r=4, alpha=8))
    names = [n for n, p in copy.module.named_parameters() if p.requires_grad]
    assert names and all("lora_" in n for n in names)
    assert not any("pooler" in n or "mlm" in n or "cls." in n for n in names)
    per_block = Counter(n.split("layer.")[1].split(".")[0] for n in names)
    assert per_block == {"0": 12, "1": 12}  # q, k, v, attention out, intermediate, output: A and B each
    for kind in ("query", "key", "value", "attention", "intermediate", "output"):
        assert any(f".{kind}" in n for n in names)


def test_qualification_rule_keeps_answers_with_enough_subjects():
    subjects = [f"s{i}" for i in range(30)]
    answers = ["a"] * 12 + ["b"] * 10 + ["c"] * 5 + ["d"] * 3
    r = Relation("toy", subjects + ["s0"], answers + ["b"], "{} is")  # s0 listed twice: its first answer counts
    small = restrict(r, QualifyRule(min_subjects=6))
    assert sorted(set(small.answers)) == ["a", "b"] and len(small) == 22
    assert len(restrict(r, QualifyRule(min_subjects=6, max_answers=1)).subjects) == 12
    kept, table = qualifying_relations([r], lambda rel: 4, QualifyRule(min_subjects=6, min_heldout=5))
    assert [k.name for k in kept] == ["toy"] and table.iloc[0].qualifies and table.iloc[0].n_heldout == 14
    kept, table = qualifying_relations([r], lambda rel: 4, QualifyRule(min_subjects=11))
    assert not kept and "1 answer(s) with at least 11 subjects" in table.iloc[0].reason
    kept, table = qualifying_relations([r], lambda rel: 4, QualifyRule(min_subjects=6, min_heldout=50))
    assert not kept and "held-out subjects" in table.iloc[0].reason


def test_which_shipped_lre_relations_qualify():
    """The default rule on the shipped LRE relations: the relations MiniLM's study uses."""
    rels = load_relations([lre_dir() / k for k in ("factual", "commonsense", "linguistic", "bias")])
    kept, table = qualifying_relations(rels, real_model_config().per_answer)
    assert len(table) == 47 and table.reason[~table.qualifies].str.len().gt(0).all()
    assert len(kept) == table.qualifies.sum() >= 10
    for r in kept:
        counts = Counter(r.answers)
        assert 2 <= len(counts) <= 20 and min(counts.values()) >= 6 and len(set(r.subjects)) == len(r.subjects)


SMALL_RELATIONS = ["word sentiment", "occupation age", "univ degree gender", "object superclass"]


def _encoder_config():
    # a tiny random encoder does not learn its fine-tuning sets in 20 steps: those fine-tunes are
    # failed jobs (lab.study.failures), kept here so that the statistics' plumbing is exercised
    return real_model_config(
        keep_failed=True,
        label_seeds=(0,),
        finetune_seeds=(0,),
        folds=3,
        n_boot=100,
        n_perm=100,
        n_null=100,
        finetune=FinetuneConfig(lr=3e-3, lora_lr=3e-3, max_steps=20, check_every=10),
    )


def _relations():
    by_name = {r.name: r for r in load_relations([lre_dir() / k for k in ("commonsense", "bias")])}
    return [by_name[n] for n in SMALL_RELATIONS]


@pytest.mark.slow
def test_encoder_study_end_to_end_and_resumable(tiny_bert_dir, tmp_path):
    cfg = _encoder_config()
    partial = run_study(str(tiny_bert_dir), _relations(), out=tmp_path / "a", config=cfg, progress=False, max_jobs=4)
    assert not partial.complete
    done = run_study(str(tiny_bert_dir), _relations(), out=tmp_path / "a", config=cfg, progress=False)
    assert done.complete
    fresh = run_study(str(tiny_bert_dir), _relations(), out=tmp_path / "b", config=cfg, progress=False)
    for name in ("relations", "finetunes", "predictions"):
        pd.testing.assert_frame_equal(done.table(name), fresh.table(name))

    s = done.summary
    assert s["scoring"] == "masked" and s["n_relations"] == 4
    assert s["failed_jobs"]["n_failed"] > 0 and not s["failed_jobs"]["excluded_from_statistics"]
    assert "encoder" in s["covariates"]["missing"]["pretrained_accuracy"]
    assert "word pieces" in s["frequency_covariate"]
    rel = done.table("relations")
    assert rel.pretrained_accuracy.isna().all() and (rel.subject_frequency <= -1).all()
    stats = done.table("stats")
    assert not stats.analysis.str.contains("pretrained_accuracy").any()  # left out of the partials, not zero-filled
    assert stats.analysis.str.contains("partial:subject_frequency").any()
    q = pd.read_csv(tmp_path / "a" / "qualification.csv")
    assert q.qualifies.all() and set(q.relation) == set(SMALL_RELATIONS)
    jobs = done.table("finetunes")
    assert set(jobs.method) == {"full", "lora"} and set(jobs.category) == {"animals", "vehicles"}
    # the back-mapping into the pretrained model's answers is missing (no answers), not counted as misses
    preds = done.table("predictions")
    assert preds.in_model_topk.isna().all()
    assert "is missing" in (tmp_path / "a" / "report.html").read_text()


def test_minilm_is_a_registered_name():
    model = interp.load_model("minilm")
    assert model.model_type == "bert" and model.n_layers == 6 and model.scoring.kind == "masked"
    assert "minilm" in interp.registered_models()


@pytest.mark.slow
def test_interventions_run_on_an_encoder(tiny_bert_dir, tmp_path):
    """Erasure and steering through the masked slot: states read with the slot, subject found
    before '[MASK] [SEP]', every arm fine-tuned and scored."""
    model = interp.load_model(str(tiny_bert_dir))
    run = Interventions(
        model, _relations()[:2], tmp_path, InterventionConfig(n_random=1, n_boot=50), _encoder_config(), progress=False
    )
    table = run.run()
    assert len(table) == 2 and (table.layer < model.n_layers - 1).all()
    assert (table.leftover_covariance < 1e-4).all()
    p = Prompt(model.scoring.context("happy is associated with the word"), "happy")
    assert p.text.endswith("[MASK]")
    enc = model.tokenizer(p.text)["input_ids"]
    assert SubjectEnd(model.tokenizer, [p]).position(enc) == 1  # [CLS] happy is ...
