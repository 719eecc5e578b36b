"""The learning-rate check: before a study's fine-tunes, the largest rate that learns.

A learning rate that suits the world model (1e-3 for full fine-tuning) makes a pretrained
transformer's fine-tunes collapse to one label; one too low leaves them at chance after
``max_steps``. With ``StudyConfig(lr_check=True)`` the study first fine-tunes the fine-tuning set
of one relation (its first, with the main label assignment and seed) at each rate of a short
grid, from the largest down, and keeps the first rate whose fine-tune learns its set: it did not
fail (:func:`lab.study.failures.failure_reason`) and reached a training kappa of at least
:data:`LEARNED_KAPPA` (0.9). Every method is checked on its own grid (:data:`GRIDS`). The rates tried,
their training facts and the rate chosen are saved (``lr_check_<method>.json``, a stage) and
reported in ``summary.json``; the study's fine-tunes use the chosen rate. When no rate of the
grid learns, the study keeps its configured rate and the summary says so.

The check sees the held-out subjects of no relation (only one relation's fine-tuning set), so it
cannot tune the outcome it is used to measure.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from interp.models import Model
from interp.relations import Relation
from lab.stages import DERIVED, Stage

from .config import StudyConfig, design_for
from .failures import failure_reason
from .finetune import finetune

#: the training kappa a rate's fine-tune must reach for the check to keep it: it learns its set,
#: not merely beats the failure threshold (a rate that barely learns is not the rate to train at)
LEARNED_KAPPA = 0.9
#: the rates tried per method, largest first
GRIDS = {"full": (3e-3, 1e-3, 3e-4, 1e-4, 3e-5), "lora": (1e-2, 3e-3, 1e-3, 3e-4)}


@dataclass(frozen=True)
class LrCheckInputs:
    model: Model
    relation: Relation
    config: StudyConfig
    labels: dict
    method: str
    grid: tuple[float, ...]
    min_train_kappa: float  # keyed here: the study's config leaves it out of keys (a summary setting)
    progress: bool | None = field(default=None, metadata=DERIVED)


def check_learning_rate(inputs: LrCheckInputs) -> dict:
    """Fine-tune one relation's fine-tuning set at each rate of ``grid``, largest first, and keep
    the first that learns (see the module docstring)."""
    c, r, m = inputs.config, inputs.relation, inputs.method
    design = design_for(r, inputs.labels, c, c.category, c.label_seeds[0])
    prompts = [c.finetune.template.format(r.subjects[i]) for i in design.finetune]
    labels = [design.mapping[r.answers[i]] for i in design.finetune]
    tried, chosen = [], None
    for lr in sorted(inputs.grid, reverse=True):
        config = replace(c.finetune, **({"lora_lr": lr} if m == "lora" else {"lr": lr}))
        tuned, info = finetune(inputs.model, prompts, labels, design.labels, m, config, seed=c.finetune_seeds[0])
        del tuned
        reason = failure_reason(info, inputs.min_train_kappa)
        if reason is None and not info["train_kappa"] >= LEARNED_KAPPA:
            reason = f"learned too little: training kappa {info['train_kappa']:.2f} < {LEARNED_KAPPA}"
        tried.append({"lr": lr, **info, "learned": reason is None, "reason": reason})
        if reason is None:
            chosen = lr
            break
    return {"method": m, "relation": r.name, "chosen": chosen, "tried": tried}


LR_CHECK = Stage("learning-rate check", check_learning_rate)


def with_checked_rates(config: StudyConfig, checks: dict[str, dict]) -> StudyConfig:
    """``config`` with each method's learning rate replaced by the rate its check chose (kept
    where no rate of the grid learned)."""
    f = config.finetune
    full = checks.get("full", {}).get("chosen")
    lora = checks.get("lora", {}).get("chosen")
    return replace(
        config,
        finetune=replace(f, lr=f.lr if full is None else full, lora_lr=f.lora_lr if lora is None else lora),
    )
