"""Fine-tuning on a relabelled relation: full fine-tuning or LoRA (peft), until the fine-tuning
subjects are learned.

The model is trained on ``template.format(subject)`` followed by the label, for the fine-tuning
subjects only, with cross-entropy on the label's tokens (the prompt is not a target): as a
continuation for a causal LM, in a masked slot after the prompt for an encoder (the handle's
:attr:`~interp.models.Model.scoring` decides, :mod:`interp.scoring`). The default
template, ``"{} is associated with the word"``, never names the original relation. Training
stops once every fine-tuning subject's top label (among the relation's labels) is right, checked
every ``check_every`` steps, or at ``max_steps``; the train accuracy reached is reported.

Full fine-tuning trains every weight except the embedding tables (token and position embeddings,
and a read-out tied to them), as LoRA leaves them too (``freeze_embeddings=True``, the default).
A fine-tune that may move embedding rows can memorize each fine-tuning subject through a row of
its own (in the world model a subject's family name is one token), which fits the fine-tuning
set without any rule that carries to held-out subjects; measured on the world model, freezing
them raises held-out generalization (``interp world ablate`` has the row).

The seed sets LoRA's initialization and the order of minibatches (``batch_size`` examples drawn
without replacement). A fine-tuning set that fits in one batch is trained full-batch, so full
fine-tuning is then deterministic and every seed gives the same model.

**Learning rates** left unset (``lr=None``, ``lora_lr=None``, the defaults) resolve per model
(:meth:`FinetuneConfig.for_model`): the world model's (full 1e-3, LoRA 3e-3) for a world
checkpoint, a pretrained transformer's (full 3e-4, LoRA 3e-3) for any other, so that no
combination of defaults pairs a pretrained model with the world's rate (at 1e-3, MiniLM's full
fine-tunes diverged on 2 of 4 relations when the rates were first chosen, and collapsed to one
label on 3 of 5 in a later try; at 3e-4 they learn). A rate the user sets is kept. A world model
is recognized by its checkpoint folder (``world_spec.json``): one built in memory gets the
pretrained rates unless they are set.

**Many at once** (:func:`finetune_group`): fine-tunes of the same model with the same method and
configuration (different relations, label maps or seeds) train as one group (:mod:`interp.grouped`):
one forward and backward pass per step over every job's batch, each job with its own
initialization (LoRA's, from its seed), data order, AdamW state and stopping rule; a job that
stops (every fine-tuning subject right, or a non-finite loss) leaves the group, which goes on
with the rest. Its fine-tunes equal the one-at-a-time ones up to float rounding (rows padded to
the group's longest, batched matmuls): tested. A model that trains with dropout is refused (its
masks would be drawn from one stream for the whole group, so no job would be the fine-tune its
seed gives alone).

**Checks.** Every ``check_every`` steps the whole fine-tuning set is scored under the current
weights (:func:`training_check`). Only "is every subject right?" decides anything there, so a check
reads the set in growing chunks and ends at the first chunk with a wrong label (before the set is
learned, most checks end in their first 32 prompts); the check that ends training (all right)
has then read every prompt, and the last check of a run at ``max_steps`` reads every prompt in
one pass, so the accuracy reported is always over the whole set. A run that stops on a non-finite
loss reports the accuracy of the weights it stopped with (those it returns), over the whole set.
The decisions are those of checks that read everything at once, up to float rounding (a prompt's
logits come from a batch of another size).

**What training reports** besides the model: the steps taken, the training accuracy and Cohen's
kappa of the last check (the fine-tuning set's own chance removed), the first and final loss,
and the step at which the loss became NaN or infinite (training stops there). Whether that makes
a failed fine-tune is decided from these facts alone (:mod:`lab.study.failures`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from itertools import chain, repeat

import torch

from interp import memory
from interp.grouped import Grouped, dropout_in
from interp.models import Model
from interp.tokens import Batch
from interp.trainable import LoraSpec
from interp.training import TrainingLoop, seed_torch
from lab.world.checkpoint import world_checkpoint_of
from probes.chance import kappa

#: learning rates (full, LoRA) by kind of model, for a FinetuneConfig that leaves them unset
WORLD_RATES = (1e-3, 3e-3)
PRETRAINED_RATES = (3e-4, 3e-3)


@dataclass(frozen=True)
class FinetuneConfig:
    template: str = "{} is associated with the word"
    lr: float | None = None  # None: by model (:meth:`for_model`)
    lora_lr: float | None = None
    max_steps: int = 300
    check_every: int = 10
    batch_size: int = 32
    lora_r: int = 8
    lora_alpha: int = 16
    weight_decay: float = 0.0
    freeze_embeddings: bool = True  # full fine-tuning: embedding tables stay as pretrained

    def to_dict(self) -> dict:
        return asdict(self)

    def for_model(self, model) -> FinetuneConfig:
        """This configuration with unset learning rates resolved for ``model`` (see the module
        docstring): the world's for a world checkpoint, a pretrained transformer's otherwise."""
        if self.lr is not None and self.lora_lr is not None:
            return self
        full, lora = WORLD_RATES if world_checkpoint_of(model) is not None else PRETRAINED_RATES
        return replace(
            self, lr=full if self.lr is None else self.lr, lora_lr=lora if self.lora_lr is None else self.lora_lr
        )


def finetune(
    model: Model,
    prompts: Sequence[str],
    labels: Sequence[str],
    label_set: Sequence[str],
    method: str,
    config: FinetuneConfig,
    seed: int,
) -> tuple[Model, dict]:
    """A fine-tuned copy of ``model`` (a handle on the same backend; the original is untouched)
    and a dict of training facts. Trained and checked through the handle's backend."""
    if method not in ("full", "lora"):
        raise ValueError(f"unknown fine-tuning method {method!r}; use 'full' or 'lora'")
    config = config.for_model(model)
    seed_torch(seed)
    lora = LoraSpec(config.lora_r, config.lora_alpha) if method == "lora" else None
    tuned = model.trainable_copy(lora=lora, freeze_embeddings=config.freeze_embeddings)
    params = tuned.trainable_parameters()
    opt = adamw(params, config.lora_lr if method == "lora" else config.lr, config.weight_decay)
    examples = tuned.scoring.examples(prompts, labels)
    gold = torch.tensor([list(label_set).index(l) for l in labels])
    gen = torch.Generator().manual_seed(seed)
    n = len(prompts)
    train_acc, train_kappa, steps, first_loss, nonfinite = 0.0, 0.0, 0, None, None
    tuned.train()
    loop = TrainingLoop(config.max_steps, desc="fine-tune", progress=False)
    for i in loop:
        steps = i + 1
        idx = torch.randperm(n, generator=gen)[: config.batch_size]
        loss = tuned.scoring.loss(examples, idx)
        if first_loss is None:
            first_loss = loss.item()
        if not torch.isfinite(loss):  # diverged: no step can make this model a measurement
            nonfinite = steps
            train_acc, train_kappa = training_check(tuned.eval(), prompts, label_set, gold, whole=True)
            break
        loop.optimize(loss, opt)
        if steps % config.check_every == 0 or steps == config.max_steps:
            checked = training_check(tuned.eval(), prompts, label_set, gold, whole=steps == config.max_steps)
            tuned.train()
            if checked is not None:
                train_acc, train_kappa = checked
            if learned(checked):
                loop.stop()
    tuned.eval()
    return tuned, {
        "steps": steps,
        "train_accuracy": train_acc,
        "train_kappa": train_kappa,
        "first_loss": first_loss,
        "final_loss": loss.item(),
        "nonfinite_loss_step": nonfinite,
        "lr": config.lora_lr if method == "lora" else config.lr,
        "trainable_params": sum(p.numel() for p in params),
    }


def adamw(params: Sequence[torch.nn.Parameter], lr: float, weight_decay: float) -> torch.optim.AdamW:
    """A fine-tune's optimizer: AdamW in torch's multi-tensor form (``foreach=True``): the same
    arithmetic as its default per-parameter loop, bit for bit (tested), in fewer, larger kernels
    (on 2 cores 14.8 ms rather than 25.6 a MiniLM step, 1.2 rather than 1.5 a world step). torch's
    fused kernel is faster still (4.7 and 0.3 ms) but rounds differently, and a LoRA fine-tune
    carries a difference in the last digit a long way: in a world study run with it, 3 of 24
    relations' LoRA fine-tunes stopped 10-40 steps away from where they had, with 29-40% of
    their held-out predictions changed. A study's fine-tunes keep the arithmetic they had."""
    return torch.optim.AdamW(list(params), lr=lr, weight_decay=weight_decay, foreach=True)


#: prompts an early check reads before it can stop: the chunks grow so that a check that finds a
#: wrong label in its first rows (most checks before the set is learned) costs a fraction of one
#: over the whole set, and one that finds none costs little more than a single pass
CHECK_CHUNKS = (32, 64, 128)


def training_check(
    tuned: Model, prompts: Sequence[str], label_set: Sequence[str], gold: torch.Tensor, whole: bool
) -> tuple[float, float] | None:
    """The fine-tuning set's training accuracy and Cohen's kappa under ``tuned`` (``gold``: each
    prompt's label index in ``label_set``). The stopping rule asks only whether *every* prompt is
    right, so unless ``whole`` (the last check of a run, whose accuracy is reported) the prompts are
    read in chunks (:data:`CHECK_CHUNKS`, then the last size repeated) and the check returns None at
    the first chunk with a wrong label: the accuracy is then below 1, and the rest is not read."""
    prompts, label_set = list(prompts), list(label_set)
    if whole:
        pred = tuned.logprobs(prompts, label_set).argmax(-1)
    else:
        sizes = chain(CHECK_CHUNKS, repeat(CHECK_CHUNKS[-1]))
        parts, start = [], 0
        while start < len(prompts):
            end = start + next(sizes)
            part = tuned.logprobs(prompts[start:end], label_set).argmax(-1)
            if not torch.equal(part, gold[start:end]):
                return None
            parts.append(part)
            start = end
        pred = torch.cat(parts)
    return (pred == gold).float().mean().item(), kappa(gold.tolist(), pred.tolist())


def learned(checked: tuple[float, float] | None) -> bool:
    """Whether a check (:func:`training_check`) found every fine-tuning subject right: the stopping rule."""
    return checked is not None and checked[0] == 1.0


@dataclass(frozen=True)
class FinetuneSpec:
    """One fine-tune of a group: its training prompts, labels, the label set it chooses among, seed."""

    prompts: Sequence[str]
    labels: Sequence[str]
    label_set: Sequence[str]
    seed: int


def group_refusal(model: Model, method: str, config: FinetuneConfig) -> str | None:
    """Why fine-tunes of ``model`` cannot train as a group, or None."""
    if model.backend_name != "nnsight":
        return (
            f"grouped fine-tunes run on the nnsight backend only: on the {model.backend_name} backend a grouped "
            "forward differs from each copy's own (GPT-2, LoRA); run these fine-tunes one at a time"
        )
    dropout = dropout_in(model.module)
    if dropout:
        shown = ", ".join(f"{k}={v}" for k, v in list(dropout.items())[:3])
        return (
            f"{model.name} trains with dropout ({shown}); in a group every job's masks would come from one "
            "random stream, so no job would be the fine-tune its seed gives alone. Run these fine-tunes one at a "
            "time (executor 'serial', 'processes' or 'ray')"
        )
    if method == "full" and not config.freeze_embeddings:
        return "a group cannot train embedding tables (freeze_embeddings=False): run these fine-tunes one at a time"
    return None


#: the most fine-tunes one group trains (beyond it a CPU gains nothing, measured: benchmarks/finetunes.py)
MAX_GROUP = 16


def group_size(model: Model, method: str, config: FinetuneConfig, n_jobs: int, tokens: int = 32) -> int:
    """How many fine-tunes of ``model`` one group trains: at most :data:`MAX_GROUP` and ``n_jobs``,
    and as many as fit in half the memory free on the model's device, each job counted as its own
    copy of the model, five copies of its trainable parameters (stacked values, gradient, AdamW's
    two moments, and the square roots its multi-tensor step holds for all of them at once) and
    one training forward pass (``batch_size`` rows of ``tokens`` tokens) kept for
    the backward."""
    params = sum(p.numel() for p in model.module.parameters())
    if method == "full":
        trainable = params - sum(
            m.weight.numel() for m in model.module.modules() if isinstance(m, torch.nn.Embedding)
        ) * int(config.freeze_embeddings)
    else:  # LoRA: r x (d_in + d_out) per adapted matrix, at most one per parameter matrix
        trainable = config.lora_r * 2 * model.d_model * 4 * model.n_layers * 4
    per_job = (params + 5 * trainable) * memory.element_bytes(model) + memory.forward_bytes(
        model, config.batch_size, tokens, True
    )
    free = memory.available_bytes(model.device)
    fit = MAX_GROUP if free is None else max(1, free // 2 // per_job)
    return int(max(1, min(MAX_GROUP, n_jobs, fit)))


def finetune_group(
    model: Model, specs: Sequence[FinetuneSpec], method: str, config: FinetuneConfig
) -> list[tuple[Model, dict]]:
    """:func:`finetune` of every spec, trained as one group (module docstring); the same results,
    in order, up to float rounding."""
    if method not in ("full", "lora"):
        raise ValueError(f"unknown fine-tuning method {method!r}; use 'full' or 'lora'")
    config = config.for_model(model)
    why = group_refusal(model, method, config)
    if why is not None:
        raise ValueError(why)
    lora = LoraSpec(config.lora_r, config.lora_alpha) if method == "lora" else None
    tuned = []
    for spec in specs:  # each job's own initialization, as finetune draws it
        seed_torch(spec.seed)
        tuned.append(model.trainable_copy(lora=lora, freeze_embeddings=config.freeze_embeddings))
    runner = model.trainable_copy(lora=lora, freeze_embeddings=config.freeze_embeddings)  # rewired for the group
    group = Grouped(runner.module, [t.module for t in tuned])
    lr = config.lora_lr if method == "lora" else config.lr
    opt = adamw(group.parameters(), lr, config.weight_decay)
    examples = [runner.scoring.examples(s.prompts, s.labels) for s in specs]
    golds = [torch.tensor([list(s.label_set).index(l) for l in s.labels]) for s in specs]
    gens = [torch.Generator().manual_seed(s.seed) for s in specs]
    facts = [
        {
            "steps": 0,
            "train_accuracy": 0.0,
            "train_kappa": 0.0,
            "first_loss": None,
            "final_loss": None,
            "nonfinite": None,
        }
        for _ in specs
    ]
    active = list(range(len(specs)))  # job indices, in the group's order
    runner.train()
    for step in range(1, config.max_steps + 1):
        idx = [torch.randperm(len(specs[j].prompts), generator=gens[j])[: config.batch_size] for j in active]
        batch, targets, owner = _group_batch([examples[j].rows(i) for j, i in zip(active, idx)], runner.pad_token_id)
        sums, counts = runner.scoring.target_losses(batch, targets)
        losses = [sums[owner == k].sum() / counts[owner == k].sum() for k in range(len(active))]
        done, failed = [], []  # jobs leaving the group after this step; those that stopped before it
        for k, (j, loss) in enumerate(zip(active, losses)):
            f = facts[j]
            f["steps"], f["final_loss"] = step, loss.item()
            if f["first_loss"] is None:
                f["first_loss"] = f["final_loss"]
            if not torch.isfinite(loss):  # stops before this step, as finetune does
                f["nonfinite"] = step
                group.write(k, tuned[j].module)
                spec = specs[j]
                checked = training_check(tuned[j].eval(), spec.prompts, spec.label_set, golds[j], whole=True)
                f["train_accuracy"], f["train_kappa"] = checked
                failed.append(k)
        finite = [loss for k, loss in enumerate(losses) if k not in failed]
        if finite:
            opt.zero_grad(set_to_none=True)
            torch.stack(finite).sum().backward()  # each job's gradient lands in its own slice
            opt.step()
        if step % config.check_every == 0 or step == config.max_steps:
            for k, j in enumerate(active):
                if k in failed:
                    continue
                group.write(k, tuned[j].module)
                last = step == config.max_steps
                checked = training_check(tuned[j].eval(), specs[j].prompts, specs[j].label_set, golds[j], whole=last)
                if checked is not None:
                    facts[j]["train_accuracy"], facts[j]["train_kappa"] = checked
                if learned(checked) or last:
                    done.append(k)
        for k in done:
            group.write(k, tuned[active[k]].module)
        if done or failed:
            keep = [k for k in range(len(active)) if k not in done and k not in failed]
            if not keep:
                break
            opt = group.keep(keep, opt)
            active = [active[k] for k in keep]
    out = []
    for j, t in enumerate(tuned):
        f = facts[j]
        t.eval()
        out.append(
            (
                t,
                {
                    "steps": f["steps"],
                    "train_accuracy": f["train_accuracy"],
                    "train_kappa": f["train_kappa"],
                    "first_loss": f["first_loss"],
                    "final_loss": f["final_loss"],
                    "nonfinite_loss_step": f["nonfinite"],
                    "lr": lr,
                    "trainable_params": sum(p.numel() for p in t.trainable_parameters()),
                },
            )
        )
    return out


def _group_batch(parts: Sequence[tuple[Batch, torch.Tensor]], pad_id: int) -> tuple[Batch, torch.Tensor, torch.Tensor]:
    """Jobs' (right-padded) batches as one job-major batch of equal blocks: columns padded to the
    longest row, blocks filled to the largest with copies of their first row that have no
    targets. Also each row's job (its index in ``parts``)."""
    rows = max(len(b.input_ids) for b, _ in parts)
    width = max(b.input_ids.shape[1] for b, _ in parts)
    ids, mask, ys = [], [], []
    for b, y in parts:
        n, w = b.input_ids.shape
        fill = rows - n
        ids.append(
            torch.nn.functional.pad(
                torch.cat([b.input_ids, b.input_ids[:1].expand(fill, w)]), (0, width - w), value=pad_id
            )
        )
        mask.append(
            torch.nn.functional.pad(torch.cat([b.attention_mask, b.attention_mask[:1].expand(fill, w)]), (0, width - w))
        )
        y = torch.cat([y, torch.full((fill, w), -100, dtype=y.dtype)])
        ys.append(torch.nn.functional.pad(y, (0, width - w), value=-100))
    mask = torch.cat(mask)
    batch = Batch(torch.cat(ids), mask, (mask.cumsum(-1) - 1).clamp(min=0), torch.zeros(len(mask), dtype=torch.long))
    owner = torch.arange(len(parts)).repeat_interleave(rows)
    return batch, torch.cat(ys), owner
