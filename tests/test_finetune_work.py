"""A fine-tune does only the work its result needs: the read-out at the positions that predict a
label, checks that stop at the first wrong label, AdamW in fewer kernels. Each against the plain
computation it replaces."""

from __future__ import annotations

import importlib

import pytest
import torch
from tiny_models import build

import interp
from lab.study.finetune import CHECK_CHUNKS, adamw, training_check

PROMPTS = ["Vorn Kallit lives in the city of", "the capital of France is", "Mira Tesh was born in"]


@pytest.mark.parametrize("family", ["gpt2", "llama_gqa"])
def test_logits_at_chosen_positions_are_those_of_the_whole_pass(model_dirs, backend, family):
    model = interp.load_model(model_dirs[family], backend=backend)
    batch = model.batch(model.encode(PROMPTS))
    with torch.no_grad():
        full = model.forward(batch)
        for positions in ([-1], [0, 3, 5], torch.tensor([5, 1])):
            kept = model.forward(batch, positions=positions)
            index = torch.as_tensor(positions) % full.shape[1]
            torch.testing.assert_close(kept, full[:, index], atol=1e-5, rtol=0)
        # a handle with a standing intervention reads out at the same positions after it
        steered = model.intervened(model.resid_site(0), lambda act, b: act * 0.5)
        torch.testing.assert_close(
            steered.forward(batch, positions=[2]), steered.forward(batch)[:, [2]], atol=1e-5, rtol=0
        )
    if backend == "nnsight":  # the head itself reads out at the positions, not a slice of every position's
        assert model.backend._keeps_logits
    for bad, said in (
        ([], "non-empty"),
        ([[0, 1]], "non-empty"),
        ([99], "outside the batch"),
        (torch.tensor([True, False]), "integer"),
        ([0.5], "integer"),
    ):
        with pytest.raises(ValueError, match=said):
            model.forward(batch, positions=bad)


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_the_fine_tuning_loss_is_huggingfaces_labels_loss(model_dirs, family):
    """The reference: HuggingFace's own ``labels=`` loss over the whole pass. Ours reads out only
    where a label token is predicted; per row and over the batch it is the same loss."""
    model = interp.load_model(model_dirs[family], backend="nnsight")
    labels = ["Paris", "France", "Rome"]
    examples = model.scoring.examples(PROMPTS, labels)
    index = torch.tensor([2, 0, 1])
    batch, y = examples.rows(index)
    with torch.no_grad():
        ref = model.hf_model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, labels=y).loss
        ours = model.scoring.loss(examples, index)
        sums, counts = model.scoring.target_losses(batch, y)
        logits = model.hf_model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
    torch.testing.assert_close(ours, ref, atol=1e-6, rtol=1e-6)
    shifted = torch.nn.functional.pad(y, (0, 1), value=-100)[:, 1:]
    per_row = torch.nn.functional.cross_entropy(logits.transpose(1, 2), shifted, ignore_index=-100, reduction="none")
    torch.testing.assert_close(sums, per_row.sum(1), atol=1e-5, rtol=1e-6)
    assert counts.tolist() == (shifted != -100).sum(1).tolist()


def test_rows_without_targets_add_nothing_and_a_batch_without_any_has_no_loss(model_dirs):
    """The grouped path fills a job's block with rows that have no targets; they must add zero
    loss over zero targets, and a batch with no target at all gives zero sums (its mean: NaN, a
    non-finite loss that stops the fine-tune) rather than an error."""
    model = interp.load_model(model_dirs["gpt2"], backend="nnsight")
    examples = model.scoring.examples(PROMPTS, ["Paris", "France", "Rome"])
    batch, y = examples.rows(torch.tensor([0, 1, 2]))
    none = torch.full_like(y, -100)
    with torch.no_grad():
        sums, counts = model.scoring.target_losses(batch, torch.cat([y[:2], none[2:]]))
        alone, alone_counts = model.scoring.target_losses(batch, y)
        empty_sums, empty_counts = model.scoring.target_losses(batch, none)
    torch.testing.assert_close(sums[:2], alone[:2], atol=1e-6, rtol=1e-6)
    assert sums[2] == 0 and counts[2] == 0 and counts[:2].tolist() == alone_counts[:2].tolist()
    assert empty_sums.tolist() == [0.0] * 3 and empty_counts.tolist() == [0] * 3
    assert torch.isnan(empty_sums.sum() / empty_counts.sum())


def test_a_diverged_fine_tune_reports_the_accuracy_of_the_weights_it_returns(model_dirs):
    from lab.study.finetune import FinetuneConfig, finetune

    model = interp.load_model(model_dirs["gpt2"], backend="nnsight")
    words = ["Paris", "France", "Rome"]
    config = FinetuneConfig(template="{}", lr=1e8, max_steps=50, check_every=5, batch_size=3)
    tuned, info = finetune(model, PROMPTS, words, words, "full", config, seed=0)
    assert info["nonfinite_loss_step"] is not None and info["steps"] == info["nonfinite_loss_step"]
    gold = torch.arange(3)
    reported = (info["train_accuracy"], info["train_kappa"])
    assert reported == pytest.approx(training_check(tuned, PROMPTS, words, gold, whole=True), nan_ok=True)


class _Counting:
    """A model handle whose logprobs answers from a fixed table and counts the prompts it read."""

    def __init__(self, answers: list[int], n_labels: int):
        self.answers, self.n_labels, self.read = answers, n_labels, 0

    def logprobs(self, prompts, labels):
        self.read += len(prompts)
        out = torch.zeros(len(prompts), self.n_labels)
        out[torch.arange(len(prompts)), torch.tensor([self.answers[int(p)] for p in prompts])] = 1.0
        return out


def test_a_check_stops_at_the_first_wrong_label_and_reads_the_whole_set_when_it_must():
    n, labels = 300, ["a", "b", "c"]
    gold = torch.arange(n) % 3
    prompts = [str(i) for i in range(n)]
    right = _Counting(gold.tolist(), 3)
    assert training_check(right, prompts, labels, gold, whole=False) == (1.0, 1.0)
    assert right.read == n  # every prompt read before it says "all right"
    wrong_early = gold.clone()
    wrong_early[5] = (gold[5] + 1) % 3
    early = _Counting(wrong_early.tolist(), 3)
    assert training_check(early, prompts, labels, gold, whole=False) is None
    assert early.read == CHECK_CHUNKS[0]  # the first chunk had a wrong label: nothing more read
    at_40 = gold.clone()
    at_40[40] = (gold[40] + 1) % 3
    second = _Counting(at_40.tolist(), 3)
    assert training_check(second, prompts, labels, gold, whole=False) is None
    assert second.read == CHECK_CHUNKS[0] + CHECK_CHUNKS[1]  # the chunks grow: 32, then 64
    late = _Counting([*gold[:-1].tolist(), (int(gold[-1]) + 1) % 3], 3)
    assert training_check(late, prompts, labels, gold, whole=False) is None and late.read == n
    whole = _Counting(wrong_early.tolist(), 3)
    accuracy, k = training_check(whole, prompts, labels, gold, whole=True)
    assert whole.read == n and accuracy == pytest.approx(1 - 1 / n) and 0 < k < 1


def test_early_checks_stop_training_where_whole_checks_do(model_dirs, monkeypatch):
    """The stopping rule is unchanged by chunked checks: a fine-tune stops at the same step, with
    the same reported accuracy, as one whose every check reads the whole set."""
    ft = importlib.import_module("lab.study.finetune")  # the module (lab.study.finetune is also a function's name)

    model = interp.load_model(model_dirs["gpt2"], backend="nnsight")
    words = ["Paris", "France", "Berlin", "Germany"]
    names, links = ("Vorn", "Kallit", "Mira", "Tesh", "Oba"), ("in", "of", "at", "by")
    prompts = [f"{a} {b} {c}" for a in names for b in links for c in ("is", "was")]  # 40: two chunks
    labels = [words[i % 4] for i in range(len(prompts))]
    config = ft.FinetuneConfig(template="{}", lr=3e-3, max_steps=200, check_every=5, batch_size=8)
    chunked = ft.finetune(model, prompts, labels, words, "full", config, seed=1)[1]
    check = ft.training_check
    monkeypatch.setattr(ft, "training_check", lambda tuned, p, l, g, whole: check(tuned, p, l, g, whole=True))
    whole = ft.finetune(model, prompts, labels, words, "full", config, seed=1)[1]
    assert chunked["train_accuracy"] == 1.0 and chunked["steps"] < config.max_steps  # it learned, and stopped
    assert {k: chunked[k] for k in ("steps", "train_accuracy", "train_kappa")} == {
        k: whole[k] for k in ("steps", "train_accuracy", "train_kappa")
    }


def test_a_fine_tunes_adamw_is_the_default_adamw_bit_for_bit():
    torch.manual_seed(0)
    hf, _ = build("gpt2")
    params = [p for p in hf.parameters()]
    twins = [torch.nn.Parameter(p.detach().clone()) for p in params]
    ours, plain = adamw(params, 1e-2, 0.01), torch.optim.AdamW(twins, lr=1e-2, weight_decay=0.01)
    assert ours.defaults["foreach"] is True and not plain.defaults["foreach"]
    for _ in range(20):
        for p, q in zip(params, twins):
            p.grad = torch.randn_like(p)
            q.grad = p.grad.clone()
        ours.step()
        plain.step()
    assert all(torch.equal(p, q) for p, q in zip(params, twins))
