"""Erasure arms of the interventions: fit the erasers on the fine-tuning subjects, fine-tune
once per arm with the eraser standing at the subject, score the held-out subjects.

Per relation (:func:`setup`, recomputed each run, cheap): the design (the study's relabelling
and split), the layer (the most readable one on the fine-tuning subjects, before the last), the
pretrained model's states there, and the erasers (:func:`fit_erasers`). Then one stage task per
arm (:data:`ARM`, saved as ``runs/<relation>__<arm>.json``): ``none``, ``leace``, ``shuffled``,
``random0..``. :func:`erasure_rows` turns the saved arms into the relation's row and its arm
rows, with the excess drop's bootstrap interval over held-out subjects and random draws.

**The bottleneck arms** (``bottleneck_leace``, ``bottleneck_shuffled``, ``bottleneck_random0..``;
``InterventionConfig(bottleneck=True)``) erase at the input instead: the same erasers fitted on
the fine-tuning subjects' *input embeddings* at the subject's last token (``hook_embed``) and
applied there. In the world model that token is the subject's family name, a token of its own
whose embedding row is frozen during fine-tuning, so no block can re-encode from it what the input
no longer holds (the layer arms act after block ``layer``, where attention has already read the
subject's other tokens and the unerased embedding). What the model can still use: the subject's
other tokens (first names, shared among subjects).

**Recall after erasure** (:func:`erased_recall`): each eraser standing on the *pretrained* model,
the accuracy of the original relation on the held-out subjects (the argmax among the relation's
answers). Read beside generalization, it tells "the fine-tune needs the erased direction" from
"the erasure broke the model": a LEACE arm should remove recall, a random subspace should not.
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


#: the input site the bottleneck arms erase at (the token embeddings)
BOTTLENECK_SITE = "hook_embed"
#: the prefix of the bottleneck arms' names
BOTTLENECK = "bottleneck_"


def states(model: Model, prompts: Sequence[Prompt], layer: int | str | Sequence[int | str]) -> torch.Tensor:
    """Residual states after ``layer`` (or at a named site, e.g. :data:`BOTTLENECK_SITE`) at each
    prompt's subject's last token, as the model reads the prompt when it answers
    (:meth:`interp.scoring.Scoring.context`: an encoder's masked slot included): ``[n, d_model]``,
    or ``[layer, n, d_model]`` for several layers."""
    many = not isinstance(layer, int | str)
    layers = list(layer) if many else [layer]
    sites = [l if isinstance(l, str) else model.resid_site(l) for l in layers]
    read = [Prompt(model.scoring.context(p.text), p.subject) for p in prompts]
    acts = interp.capture(model, read, sites=sites, positions="subject_last", progress=False)
    out = torch.stack([acts[s].float() for s in sites])
    return out if many else out[0]


def fit_erasers(
    x_finetune: torch.Tensor, answers: Sequence[str], n_random: int, seed: int, prefix: str = ""
) -> dict[str, Eraser]:
    """Erasers fitted on the fine-tuning subjects' states alone (the only states this function
    sees): ``leace`` (the answers), ``shuffled`` (LEACE of the answers shuffled among the subjects:
    the same number of classes, class sizes and whitened geometry, no link to the subject) and
    ``random0..`` (random subspaces of LEACE's rank), each name after ``prefix``. ``seed`` should
    differ between relations."""
    leace = fit_leace(x_finetune, answers)
    shuffled = list(answers)
    random.Random(seed).shuffle(shuffled)
    rank = leace.rank
    return {
        f"{prefix}leace": leace,
        f"{prefix}shuffled": fit_leace(x_finetune, shuffled),
        **{f"{prefix}random{j}": random_subspace(x_finetune, rank, seed * 1000 + j) for j in range(n_random)},
    }


def _kinds(erasers) -> list[str]:
    return list(dict.fromkeys(a.rstrip("0123456789") for a in erasers))


def arm_site(model: Model, arm: str, layer: int) -> str:
    """Where an arm's eraser stands: the input embeddings for a bottleneck arm, else the residual
    stream after ``layer``."""
    return BOTTLENECK_SITE if arm.startswith(BOTTLENECK) else model.resid_site(layer)


def erased_recall(model: Model, s: Setup) -> dict[str, float]:
    """Recall of the original relation on the held-out subjects with each eraser standing on the
    pretrained model (and none): the accuracy of the argmax among the relation's answers, keyed
    ``recall_<arm>`` (random draws averaged into ``recall_random`` / ``recall_bottleneck_random``)."""
    r = s.relation
    prompts = [Prompt(r.template.format(r.subjects[i]), r.subjects[i]) for i in s.design.heldout]
    truth = [r.answers[i] for i in s.design.heldout]
    candidates = sorted(set(r.answers))
    try:
        locate = SubjectEnd(model.tokenizer, [Prompt(model.scoring.context(p.text), p.subject) for p in prompts])
    except ValueError:  # the relation's own template splits oddly at the subject: recall is not measured
        return {f"recall_{k}": float("nan") for k in ("none", *_kinds(s.erasers))}
    texts = [p.text for p in prompts]

    def accuracy(m: Model) -> float:
        pred = m.logprobs(texts, candidates).argmax(-1).tolist()
        return float(np.mean([candidates[j] == t for j, t in zip(pred, truth)]))

    out = {"recall_none": accuracy(model)}
    draws: dict[str, list[float]] = {}
    for arm, eraser in s.erasers.items():
        acc = accuracy(model.intervened(arm_site(model, arm, s.layer), erasing(locate, eraser)))
        kind = arm.rstrip("0123456789")
        if kind != arm:
            draws.setdefault(kind, []).append(acc)
        else:
            out[f"recall_{arm}"] = acc
    out.update({f"recall_{kind}": float(np.mean(v)) for kind, v in draws.items()})
    return out


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
    bottleneck = {}
    if c.bottleneck:
        e_ft = states(model, [prompts[i] for i in design.finetune], BOTTLENECK_SITE)
        e_ho = states(model, [prompts[i] for i in design.heldout], BOTTLENECK_SITE)
        erasers |= fit_erasers(e_ft, a_ft, c.n_random, seed, prefix=BOTTLENECK)
        b = erasers[f"{BOTTLENECK}leace"]
        bottleneck = {
            "bottleneck_rank": b.rank,
            "bottleneck_leftover_covariance": leftover(b, e_ft, a_ft),
            "bottleneck_probe_before_kappa": probe_kappa(e_ft.numpy(), a_ft, folds=c.folds, seed=c.seed),
            "bottleneck_probe_after_kappa": erased_probe_kappa(e_ft.numpy(), a_ft, folds=c.folds, seed=c.seed),
            "bottleneck_transfer_before_kappa": probe_kappa(e_ft.numpy(), a_ft, e_ho.numpy(), a_ho),
            "bottleneck_transfer_after_kappa": probe_kappa(b(e_ft).numpy(), a_ft, b(e_ho).numpy(), a_ho),
            "moved_bottleneck_leace": _moved(e_ft, b),
        }
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
        **bottleneck,
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
    site = arm_site(a.model, a.arm, s.layer)
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
    tuned_probe = {a["arm"]: a["probe_after_tuned_kappa"] for a in arm_rows}
    row = {**s.row, "generalization_none": k["none"]}
    # the layer arms (no prefix: the columns' historical names) and the bottleneck arms
    for prefix in ("", BOTTLENECK):
        if f"{prefix}leace" not in k:
            continue
        randoms = [a for a in s.erasers if a.startswith(f"{prefix}random")]
        k_random = float(np.mean([k[a] for a in randoms]))
        k_leace = k[f"{prefix}leace"]
        lo, hi = bootstrap_excess(truth, preds[f"{prefix}leace"], [preds[a] for a in randoms], n_boot, seed)
        row |= {
            f"{prefix}probe_after_tuned_kappa": float(tuned_probe[f"{prefix}leace"]),
            f"generalization_{prefix}leace": k_leace,
            f"generalization_{prefix}shuffled": k[f"{prefix}shuffled"],
            f"generalization_{prefix}random": k_random,
            f"generalization_{prefix}random_sd": float(np.std([k[a] for a in randoms])),
            f"drop_{prefix}leace": k["none"] - k_leace,
            f"drop_{prefix}random": k["none"] - k_random,
            f"{prefix}excess_drop": k_random - k_leace,
            f"{prefix}excess_drop_ci_low": lo,
            f"{prefix}excess_drop_ci_high": hi,
            f"{prefix}excess_drop_shuffled": k[f"{prefix}shuffled"] - k_leace,
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
