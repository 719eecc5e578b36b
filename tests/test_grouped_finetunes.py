"""Fine-tunes trained as one group (interp.grouped, lab.study.finetune.finetune_group): the grouped
forward against each copy's own, the optimizer state carried when jobs leave, the group's
fine-tunes against the one-at-a-time ones, and a study on the grouped executor against serial."""

from __future__ import annotations

import copy

import pandas as pd
import pytest
import torch
from tiny_models import build

import interp
from interp.grouped import Grouped, dropout_in
from interp.trainable import LoraSpec
from lab.study import FinetuneConfig
from lab.study.finetune import FinetuneSpec, finetune, finetune_group, group_size
from lab.study.run import main_finetune_specs

#: how far two fine-tunes that differ only in float rounding end apart (final loss, absolute).
#: Measured by benchmarks/float_noise.py (base weights scaled by 1 + 2**-23 N(0, 1), which is what
#: another CPU's reduction order does to them; 90 steps, the 3 fine-tunes of the group test below):
#: full 6.3e-7, LoRA 3.4e-4 (its `diet` job; 5.9e-4 of its loss); grouped vs alone here 2.9e-5 and
#: 1.4e-4 on another AMD EPYC (issue 59), where the old bound of 1e-4 failed. The bound is 6x the
#: largest measured noise; held-out predictions agreed in full (>= 99.9% is asserted).
LOSS_NOISE = 2e-3


def _copies(module, n, seed=0):
    """``n`` copies of ``module`` with their trainable parameters moved apart (each its own job)."""
    out = []
    for k in range(n):
        c = copy.deepcopy(module)
        gen = torch.Generator().manual_seed(seed + k)
        with torch.no_grad():
            for p in c.parameters():
                if p.requires_grad:
                    p.add_(0.05 * torch.randn(p.shape, generator=gen))
        out.append(c)
    return out


@pytest.mark.parametrize("family", ["gpt2", "llama", "gpt_neox", "bert"])
@pytest.mark.parametrize("lora", [False, True])
def test_a_grouped_forward_equals_each_copys_own(family, lora):
    """Rows g*B..(g+1)*B-1 through the group give what copy g gives them alone: linear layers,
    GPT-2's Conv1D, LayerNorm (direct batched matmuls), RMSNorm (the vmap path), LoRA adapters."""
    hf, tok = build(family)
    model = interp.load_model(hf, tokenizer=tok)
    lora_spec = LoraSpec(r=4, alpha=8) if lora else None
    base = model.trainable_copy(lora=lora_spec, freeze_embeddings=True).eval()
    copies = _copies(base.module, 3)
    runner = model.trainable_copy(lora=lora_spec, freeze_embeddings=True).eval()
    group = Grouped(runner.module, copies)
    assert group.size == 3
    prompts = ["Paris is located in", "the city of Rome", "Vorn lives in Kallit"]
    ids = [runner.encode(prompts) for _ in copies]
    batch = runner.batch([e for part in ids for e in part], "right")
    with torch.no_grad():
        together = runner.forward(batch)
        for g, c in enumerate(copies):
            handle = model.trainable_copy(lora=lora_spec, freeze_embeddings=True).eval()
            handle.module.load_state_dict(c.state_dict())
            rows = slice(3 * g, 3 * g + 3)
            alone = handle.forward(runner.batch(ids[g], "right"))
            mask = batch.attention_mask[rows].bool()
            torch.testing.assert_close(together[rows][mask], alone[mask], atol=2e-5, rtol=1e-4)


def test_jobs_leave_a_group_with_their_optimizer_state():
    """After keep([0, 2]), a step of the group equals a step of the two jobs' own AdamW (state
    carried from the steps they took in the group)."""
    torch.manual_seed(0)
    leaf = torch.nn.Linear(4, 3)
    copies = [torch.nn.Sequential(copy.deepcopy(leaf)) for _ in range(3)]
    wrapper = torch.nn.Sequential(copy.deepcopy(leaf))
    group = Grouped(wrapper, copies)
    opt = torch.optim.AdamW(group.parameters(), lr=0.1)
    own = [copy.deepcopy(leaf) for _ in range(3)]
    own_opt = [torch.optim.AdamW(m.parameters(), lr=0.1) for m in own]
    xs = [torch.randn(3, 5, 4) for _ in range(3)]
    for step in range(3):
        live = [0, 1, 2] if step < 2 else [0, 2]
        if step == 2:
            opt = group.keep([0, 2], opt)
        out = wrapper(torch.cat([xs[j] for j in live]))
        opt.zero_grad()
        out.pow(2).sum().backward()
        opt.step()
        for j in live:
            own_opt[j].zero_grad()
            own[j](xs[j]).pow(2).sum().backward()
            own_opt[j].step()
    targets = [torch.nn.Linear(4, 3) for _ in range(2)]
    for k, j in enumerate([0, 2]):
        group.write(k, torch.nn.Sequential(targets[k]))
        torch.testing.assert_close(targets[k].weight, own[j].weight, atol=1e-6, rtol=1e-5)


def test_a_model_with_dropout_is_refused_before_any_work():
    hf, tok = build("gpt2")
    model = interp.load_model(hf, tokenizer=tok)
    assert dropout_in(model.module)  # GPT-2's configuration trains with dropout 0.1
    spec = FinetuneSpec(["Paris is located in"], ["France"], ["France", "Italy"], 0)
    with pytest.raises(ValueError, match="dropout"):
        finetune_group(model, [spec], "full", FinetuneConfig(lr=1e-3))
    assert not dropout_in(interp.load_model("world").module)


@pytest.mark.slow
@pytest.mark.parametrize("method", ["full", "lora"])
def test_a_group_of_world_fine_tunes_equals_the_one_at_a_time_ones(method):
    """Three jobs (different relations, seeds; the first has 12 fine-tuning subjects, learns them
    in 10 steps and leaves while the others train on, so the group shrinks as it goes): the same
    steps and training accuracy, losses within float noise (LOSS_NOISE), held-out predictions
    identical (the stated tolerance: 99.9%)."""
    from dataclasses import replace

    names = ["continent", "hand", "diet"]
    model, specs, heldout = main_finetune_specs("world", names, [0, 1, 2])
    specs[0] = replace(specs[0], prompts=specs[0].prompts[:12], labels=specs[0].labels[:12])
    config = FinetuneConfig(max_steps=90, check_every=10)
    grouped = finetune_group(model, specs, method, config)
    steps = set()
    for spec, name, (tuned_g, info_g) in zip(specs, names, grouped):
        tuned, info = finetune(model, spec.prompts, spec.labels, spec.label_set, method, config, spec.seed)
        assert info_g["steps"] == info["steps"] and info_g["train_accuracy"] == info["train_accuracy"]
        assert abs(info_g["final_loss"] - info["final_loss"]) < LOSS_NOISE
        assert info_g["trainable_params"] == info["trainable_params"] and info_g["lr"] == info["lr"]
        a = tuned.logprobs(heldout[name], list(spec.label_set))
        b = tuned_g.logprobs(heldout[name], list(spec.label_set))
        assert (a.argmax(-1) == b.argmax(-1)).float().mean() >= 0.999
        steps.add(info["steps"])
    assert len(steps) > 1  # jobs left the group at different steps


def test_a_diverging_job_stops_alone_in_its_group():
    """A learning rate that diverges: every job stops at the step its loss becomes non-finite, as
    one at a time, with its parameters as they were before that step."""
    model, specs, _ = main_finetune_specs("world", ["continent", "hand"], [0, 1])
    config = FinetuneConfig(lr=1e6, max_steps=30, check_every=10)
    grouped = finetune_group(model, specs, "full", config)
    for spec, (tuned_g, info_g) in zip(specs, grouped):
        _, info = finetune(model, spec.prompts, spec.labels, spec.label_set, "full", config, spec.seed)
        assert info["nonfinite_loss_step"] is not None
        assert info_g["nonfinite_loss_step"] == info["nonfinite_loss_step"] and info_g["steps"] == info["steps"]
        assert all(torch.isfinite(p).all() for p in tuned_g.trainable_parameters())


def test_group_size_is_bounded_by_jobs_and_memory(monkeypatch):
    import interp.memory

    model = interp.load_model("world")
    config = FinetuneConfig()
    assert group_size(model, "full", config, 5) == 5
    assert group_size(model, "full", config, 100) == 16
    monkeypatch.setattr(interp.memory, "available_bytes", lambda device: 60 * 10**6)
    assert group_size(model, "full", config, 100) < 16  # a job needs its own copy, moments and activations


@pytest.mark.slow
def test_a_study_on_the_grouped_executor_equals_serial(tmp_path):
    """Full and LoRA fine-tunes in groups: predictions identical, losses within float noise, every
    statistic within 0.005 of the serial study (the issue's tolerances)."""
    from dataclasses import replace

    from test_distributed import RELATIONS as names
    from test_distributed import _config

    from lab.executors import GroupedExecutor, SerialExecutor
    from lab.study import run_study

    config = replace(_config(), methods=("full", "lora"))  # the executor tests' small study, LoRA too
    tables = {}
    for name, ex in (
        ("serial", SerialExecutor(threads=1)),
        ("grouped", GroupedExecutor(size=3, inner=SerialExecutor(threads=1))),
    ):
        result = run_study("world", names, out=tmp_path / name, config=config, progress=False, executor=ex)
        assert result.complete
        tables[name] = {t: pd.read_csv(tmp_path / name / f"{t}.csv") for t in ("predictions", "finetunes", "stats")}
    a, b = tables["serial"], tables["grouped"]
    assert (a["predictions"].predicted_label == b["predictions"].predicted_label).mean() >= 0.999
    assert (a["finetunes"].final_loss - b["finetunes"].final_loss).abs().max() < LOSS_NOISE
    assert (a["finetunes"].steps == b["finetunes"].steps).all()
    numeric = a["stats"].select_dtypes("number").columns
    assert (a["stats"][numeric] - b["stats"][numeric]).abs().max().max() <= 0.005
