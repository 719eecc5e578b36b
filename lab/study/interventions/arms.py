"""Erasure arms of the interventions: fit the erasers on the fine-tuning subjects, fine-tune
once per arm with the eraser standing at the subject, score the held-out subjects.

Per relation (:func:`setup`, recomputed each run, cheap): the design (the study's relabelling
and split), the layer (the most readable one on the fine-tuning subjects, before the last), the
pretrained model's states there, and the erasers (:func:`fit_erasers`). Then one stage task per
arm (:data:`ARM`, saved as ``runs/<relation>__<arm>.json``): ``none``, ``leace``, ``shuffled``,
``random0..``. :func:`erasure_rows` turns the saved arms into the relation's row and its arm
rows, with the excess drop's bootstrap interval over held-out subjects and random draws.
"""

from __future__ import annotations

import random
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

import interp
from interp.models import Model
from interp.positions import SubjectEnd
from interp.prompts import Prompt
from interp.relations import Relation
from interp.resampling import percentile_interval
from lab.stages import DERIVED, JSON, Codec, Stage
from probes.chance import kappa
from probes.erasure import Eraser, erased_probe_kappa, fit_leace, leftover, random_subspace
from probes.readability import probe_kappa

from ..config import design_for
from ..design import Design
from ..finetune import finetune


def relation_seed(seed: int, relation: str) -> int:
    """A seed of its own for each relation (so the controls of different relations are independent draws)."""
    return zlib.crc32(f"{seed}:{relation}".encode()) % (2**31)


def erasing(locate: SubjectEnd, eraser: Eraser):
    """A standing intervention applying ``eraser`` at the subject's last token of every row."""

    def fn(act, batch):
        pos = locate(batch).to(act.device)
        rows = torch.arange(act.shape[0], device=act.device)
        out = act.clone()
        out[rows, pos] = eraser(act[rows, pos])
        return out

    return fn


def states(model: Model, prompts: Sequence[Prompt], layer: int | Sequence[int]) -> torch.Tensor:
    """Residual states after ``layer`` at each prompt's subject's last token, as the model reads
    the prompt when it answers (:meth:`interp.scoring.Scoring.context`: an encoder's masked slot
    included): ``[n, d_model]``, or ``[layer, n, d_model]`` for several layers."""
    many = not isinstance(layer, int)
    layers = list(layer) if many else [layer]
    sites = [model.resid_site(l) for l in layers]
    read = [Prompt(model.scoring.context(p.text), p.subject) for p in prompts]
    acts = interp.capture(model, read, sites=sites, positions="subject_last", progress=False)
    out = torch.stack([acts[s].float() for s in sites])
    return out if many else out[0]


def fit_erasers(x_finetune: torch.Tensor, answers: Sequence[str], n_random: int, seed: int) -> dict[str, Eraser]:
    """Erasers fitted on the fine-tuning subjects' states alone (the only states this function
    sees): ``leace`` (the answers), ``shuffled`` (LEACE of the answers shuffled among the subjects:
    the same number of classes, class sizes and whitened geometry, no link to the subject) and
    ``random0..`` (random subspaces of LEACE's rank). ``seed`` should differ between relations."""
    leace = fit_leace(x_finetune, answers)
    shuffled = list(answers)
    random.Random(seed).shuffle(shuffled)
    rank = leace.rank
    return {
        "leace": leace,
        "shuffled": fit_leace(x_finetune, shuffled),
        **{f"random{j}": random_subspace(x_finetune, rank, seed * 1000 + j) for j in range(n_random)},
    }


@dataclass(frozen=True)
class Setup:
    """What every arm of one relation shares (computed from the model, the relation and the
    configurations)."""

    relation: Relation
    design: Design
    prompts: dict[int, Prompt]
    locate: SubjectEnd
    layer: int
    x_finetune: torch.Tensor
    answers_finetune: list[str]
    erasers: dict[str, Eraser]
    row: dict

    @property
    def finetune_prompts(self) -> list[str]:
        return [self.prompts[i].text for i in self.design.finetune]

    @property
    def finetune_labels(self) -> list[str]:
        return [self.design.mapping[a] for a in self.answers_finetune]

    @property
    def heldout_prompts(self) -> list[str]:
        return [self.prompts[i].text for i in self.design.heldout]

    @property
    def truth(self) -> list[str]:
        return [self.design.mapping[self.relation.answers[i]] for i in self.design.heldout]


def setup(model: Model, r: Relation, labels: dict, study_config, config) -> Setup:
    """The relation's design, layer, states and erasers, and its erasure statistics (module
    docstring). ``study_config``: a StudyConfig; ``config``: an InterventionConfig."""
    c, sc = config, study_config
    seed = relation_seed(c.seed, r.name)
    design = design_for(r, labels, sc, sc.category, sc.label_seeds[0])
    tmpl = sc.finetune.template
    prompts = {i: Prompt(tmpl.format(r.subjects[i]), r.subjects[i]) for i in design.finetune + design.heldout}
    locate = SubjectEnd(model.tokenizer, [Prompt(model.scoring.context(p.text), p.subject) for p in prompts.values()])
    a_ft = [r.answers[i] for i in design.finetune]
    a_ho = [r.answers[i] for i in design.heldout]
    # the layer: the most readable one on the fine-tuning subjects (held-out subjects play no part), before
    # the last block, whose output at the subject reaches no other token
    candidates = list(range(model.n_layers - 1))
    x_all = states(model, [prompts[i] for i in design.finetune], candidates)
    by_layer = [probe_kappa(x.numpy(), a_ft, folds=c.folds, seed=c.seed) for x in x_all]
    layer = candidates[int(np.nanargmax(by_layer))] if np.isfinite(by_layer).any() else candidates[-1]
    x_ft = x_all[layer]
    x_ho = states(model, [prompts[i] for i in design.heldout], layer)
    erasers = fit_erasers(x_ft, a_ft, c.n_random, seed)
    leace = erasers["leace"]
    randoms = [a for a in erasers if a.startswith("random")]
    row = {
        "relation": r.name,
        "layer": layer,
        "n_answers": len(design.labels),
        "n_finetune": len(design.finetune),
        "n_heldout": len(design.heldout),
        "rank": leace.rank,
        "leftover_covariance": leftover(leace, x_ft, a_ft),
        "probe_before_kappa": by_layer[layer],
        "probe_after_kappa": erased_probe_kappa(x_ft.numpy(), a_ft, folds=c.folds, seed=c.seed),
        "transfer_before_kappa": probe_kappa(x_ft.numpy(), a_ft, x_ho.numpy(), a_ho),
        "transfer_after_kappa": probe_kappa(leace(x_ft).numpy(), a_ft, leace(x_ho).numpy(), a_ho),
        # how much each eraser moves the states (mean squared change / mean squared deviation from the
        # mean): LEACE removes the answer's directions, which may carry more variance than random ones
        "moved_leace": _moved(x_ft, leace),
        "moved_shuffled": _moved(x_ft, erasers["shuffled"]),
        "moved_random": float(np.mean([_moved(x_ft, erasers[k]) for k in randoms])),
    }
    return Setup(r, design, prompts, locate, layer, x_ft, a_ft, erasers, row)


# one arm: a stage ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class ArmInputs:
    """One fine-tune arm. Keyed by the model, the relation, both configurations, the arm and the
    layer; ``setup`` is computed from those."""

    model: Model
    relation: Relation
    labels: dict
    study_config: object  # StudyConfig
    config: object  # InterventionConfig
    arm: str
    layer: int
    setup: Setup = field(metadata=DERIVED)


@dataclass
class ArmResult:
    """The saved record (``layer``, ``predicted`` held-out labels, the fine-tune's log) and, when
    just computed, the fine-tuned model (the ``none`` arm's is steered)."""

    record: dict
    tuned: Model | None = None


def run_arm(a: ArmInputs) -> ArmResult:
    s, c, sc = a.setup, a.config, a.study_config
    site = a.model.resid_site(s.layer)
    model = a.model if a.arm == "none" else a.model.intervened(site, erasing(s.locate, s.erasers[a.arm]))
    tuned, info = finetune(
        model, s.finetune_prompts, s.finetune_labels, s.design.labels, c.method, sc.finetune, seed=sc.finetune_seeds[0]
    )
    scores = tuned.logprobs(s.heldout_prompts, s.design.labels)
    res = {"layer": s.layer, "predicted": [s.design.labels[j] for j in scores.argmax(-1).tolist()], **info}
    if a.arm != "none":  # is the answer still erased in the fine-tuned model? (its earlier blocks moved)
        res["probe_after_tuned_kappa"] = probe_kappa(
            states(tuned, [s.prompts[i] for i in s.design.finetune], s.layer).numpy(),
            s.answers_finetune,
            folds=c.folds,
            seed=c.seed,
        )
        return ArmResult(res)
    return ArmResult(res, tuned)


def _save_arm(result: ArmResult, path) -> None:
    JSON.write(result.record, path)


def _load_arm(path) -> ArmResult:
    return ArmResult(JSON.read(path))


ARM = Stage("erasure arm", run_arm, Codec(_save_arm, _load_arm))


def arm_path(relation: str, arm: str) -> str:
    return f"runs/{relation}__{arm}.json"


# the relation's erasure results ------------------------------------------------------------------
def erasure_rows(s: Setup, records: dict[str, dict], n_boot: int, seed: int) -> tuple[dict, list[dict]]:
    """The relation's row (its erasure statistics, generalization per arm, excess drops with a
    bootstrap CI) and one row per arm, from the arms' saved ``records``."""
    truth = s.truth
    randoms = [a for a in s.erasers if a.startswith("random")]
    arm_rows = [
        {
            "relation": s.relation.name,
            "arm": arm,
            "kind": arm.rstrip("0123456789"),
            "generalization_kappa": kappa(truth, res["predicted"]),
            "generalization": float(np.mean([p == t for p, t in zip(res["predicted"], truth)])),
            "probe_after_tuned_kappa": res.get("probe_after_tuned_kappa", np.nan),
            "train_accuracy": res["train_accuracy"],
            "steps": res["steps"],
        }
        for arm, res in records.items()
    ]
    preds = {arm: res["predicted"] for arm, res in records.items()}
    k = {arm: kappa(truth, preds[arm]) for arm in preds}
    k_random = float(np.mean([k[a] for a in randoms]))
    lo, hi = bootstrap_excess(truth, preds["leace"], [preds[a] for a in randoms], n_boot, seed)
    row = {
        **s.row,
        "probe_after_tuned_kappa": float(next(a["probe_after_tuned_kappa"] for a in arm_rows if a["arm"] == "leace")),
        "generalization_none": k["none"],
        "generalization_leace": k["leace"],
        "generalization_shuffled": k["shuffled"],
        "generalization_random": k_random,
        "generalization_random_sd": float(np.std([k[a] for a in randoms])),
        "drop_leace": k["none"] - k["leace"],
        "drop_random": k["none"] - k_random,
        "excess_drop": k_random - k["leace"],
        "excess_drop_ci_low": lo,
        "excess_drop_ci_high": hi,
        "excess_drop_shuffled": k["shuffled"] - k["leace"],
    }
    return row, arm_rows


def bootstrap_excess(truth, leace, randoms, n_boot: int, seed: int) -> tuple[float, float]:
    """95% bootstrap CI of ``mean_j kappa(random_j) - kappa(leace)``, resampling held-out subjects
    (paired across arms) and the random draws. It does not cover the spread between fine-tuning
    seeds of the LEACE arm; the test across relations (:func:`.report.relations_summary`) does.
    (Its statistic is a kappa, not a mean, so it resamples here rather than through
    :func:`interp.resampling.resampled_means`; the interval is :mod:`interp.resampling`'s.)"""
    rng = np.random.default_rng(seed)
    truth, leace = np.asarray(truth), np.asarray(leace)
    randoms = [np.asarray(x) for x in randoms]
    n, vals = len(truth), []
    for _ in range(n_boot):
        idx = rng.integers(0, n, n)
        draws = rng.integers(0, len(randoms), len(randoms))
        t = list(truth[idx])
        vals.append(np.mean([kappa(t, list(randoms[j][idx])) for j in draws]) - kappa(t, list(leace[idx])))
    return percentile_interval(vals)


def _moved(x: torch.Tensor, eraser: Eraser) -> float:
    return float(((eraser(x) - x) ** 2).sum(1).mean() / ((x - x.mean(0)) ** 2).sum(1).mean())
