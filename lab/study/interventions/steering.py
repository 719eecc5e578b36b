"""Steering arm of the interventions: after the ``none`` fine-tune, add the pretrained class-mean
direction from a subject's answer ``a`` toward another answer ``b`` at the subject, and see
whether the fine-tuned model's label switches to ``label(b)``. Three controls, each a direction of
the same norm added at the same site to the same subjects:

- **random**: isotropic random directions (``n_random`` draws): rarely points anywhere in the
  state space, so a weak control;
- **shuffled**: class-mean directions of the answers shuffled among the fine-tuning subjects
  (a seeded permutation: same class sizes and the same states, so the same kind of geometry:
  differences of means of large groups of real states; but the wrong classes);
- **other relation**: class-mean directions of *another* relation's answers on the same
  fine-tuning subjects' states at the same site (the relation whose answers are least associated
  with this one's, by Cramér's V; from the steered subject's own class of that relation to
  another, drawn per subject): a readable, class-structured direction that is not this relation's.

If steering along this relation's direction switches labels more than each control does, the
fine-tune reads *this relation's* readable structure, not just any push along a class axis.

One stage task per relation (:data:`STEERING`, ``runs/<relation>__steering.json``: one row per
steered subject). It reads the ``none`` arm's held-out predictions (part of its key) and, when
that arm was fine-tuned in this run, its model; otherwise it fine-tunes it again (same seed) and
checks that the saved predictions are reproduced (the weights are not saved).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import torch

from interp.models import Model
from interp.positions import SubjectEnd
from interp.relations import Relation
from interp.resampling import bootstrap_indices, percentile_interval, resampled_means
from lab.stages import DERIVED, WHERE, Stage

from ..finetune import finetune
from .arms import Setup


def steering(locate: SubjectEnd, vectors: dict[tuple[int, ...], torch.Tensor]):
    """A standing intervention adding ``vectors[prompt prefix]`` at the subject's last token (rows
    whose prompt has no vector are left alone)."""

    def fn(act, batch):
        pos = locate(batch)
        ids, mask = batch.input_ids.tolist(), batch.attention_mask.tolist()
        add = torch.zeros(act.shape[0], act.shape[-1], dtype=act.dtype, device=act.device)
        for r, (row, mrow) in enumerate(zip(ids, mask)):
            v = vectors.get(locate.prefix(row, mrow))
            if v is not None:
                add[r] = v.to(act.device, act.dtype)
        out = act.clone()
        rows = torch.arange(act.shape[0], device=act.device)
        out[rows, pos.to(act.device)] = act[rows, pos.to(act.device)] + add
        return out

    return fn


def class_means(x: torch.Tensor, y) -> dict[str, torch.Tensor]:
    """The mean state of each class: ``{answer: [d]}`` for ``x`` ``[n, d]`` and labels ``y`` ``[n]``."""
    y = np.asarray(y, dtype=object)
    return {a: x[torch.as_tensor(y == a)].mean(0) for a in sorted(set(y.tolist()))}


def directions(means: dict, pairs, norm: float) -> list[torch.Tensor]:
    """``norm``-long unit directions from ``means[a]`` to ``means[b]`` for each ``(a, b)`` in ``pairs``."""
    out = []
    for a, b in pairs:
        v = means[b] - means[a]
        out.append(v / v.norm() * norm)
    return out


def cramers_v(a, b) -> float:
    """Cramér's V of two label sequences (0: independent, 1: one determines the other)."""
    table = pd.crosstab(pd.Series(list(a)), pd.Series(list(b))).to_numpy(float)
    if min(table.shape) < 2:
        return float("nan")
    expected = table.sum(1, keepdims=True) * table.sum(0, keepdims=True) / table.sum()
    chi2 = float(((table - expected) ** 2 / expected).sum())
    return float(np.sqrt(chi2 / table.sum() / (min(table.shape) - 1)))


def control_relation(relation: Relation, others, subjects: list[str], min_coverage: float = 0.9):
    """The relation among ``others`` (on the same subjects) whose answers on ``subjects`` are least
    associated with ``relation``'s (lowest Cramér's V; derived relations, e.g. city -> country,
    are strongly associated and so never chosen over an unrelated one), with at least 2 answers of
    2 or more subjects and ``min_coverage`` of ``subjects`` answered; ``(name, {subject: answer})``,
    or ``(None, {})`` when none qualifies (a real model's relations rarely share subjects)."""
    own = dict(zip(relation.subjects, relation.answers))
    best = (np.inf, None, {})
    for other in others:
        if other.name == relation.name:
            continue
        answer = dict(zip(other.subjects, other.answers))
        have = [s for s in subjects if s in answer]
        counts = pd.Series([answer[s] for s in have]).value_counts()
        if len(have) < min_coverage * len(subjects) or (counts >= 2).sum() < 2:
            continue
        v = cramers_v([own[s] for s in have], [answer[s] for s in have])
        if np.isfinite(v) and v < best[0]:
            best = (v, other.name, {s: answer[s] for s in subjects if s in answer})
    return best[1], best[2]


@dataclass(frozen=True)
class SteeringInputs:
    """Steering one relation. Keyed by the model, the relation, both configurations, the layer and
    the ``none`` arm's predictions; ``setup`` and ``tuned`` (the ``none`` fine-tune, when in hand)
    are computed from those."""

    model: Model
    relation: Relation
    labels: dict
    study_config: object  # StudyConfig
    config: object  # InterventionConfig
    layer: int
    predicted_none: tuple[str, ...]
    seed: int
    #: the other-relation control: its name and its answer for each subject (:func:`control_relation`)
    other_relation: str | None
    other_answers: dict
    none_path: str = field(default="", metadata=WHERE)  # named in an error only
    setup: Setup = field(default=None, metadata=DERIVED)
    tuned: Model | None = field(default=None, metadata=DERIVED)


def run_steering(a: SteeringInputs) -> list[dict]:
    s, c, sc, r, model = a.setup, a.config, a.study_config, a.relation, a.model
    design, prompts, locate, seed = s.design, s.prompts, s.locate, a.seed
    pred_none = list(a.predicted_none)
    tuned = a.tuned
    if tuned is None:
        tuned, _ = finetune(
            model,
            s.finetune_prompts,
            s.finetune_labels,
            design.labels,
            c.method,
            sc.finetune,
            seed=sc.finetune_seeds[0],
        )
        again = [design.labels[j] for j in tuned.logprobs(s.heldout_prompts, design.labels).argmax(-1).tolist()]
        if again != pred_none:
            raise RuntimeError(
                f"{r.name}: the fine-tune made again for steering does not reproduce the saved predictions "
                f"({sum(x != y for x, y in zip(again, pred_none))} differ; another machine or thread count?); "
                f"delete {a.none_path} to redo both"
            )
    answers = sorted(design.mapping)
    means = class_means(s.x_finetune, s.answers_finetune)
    dists = [float((means[x] - means[z]).norm()) for i, x in enumerate(answers) for z in answers[i + 1 :]]
    norm = c.steer_scale * float(np.median(dists))
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    targets = []
    for i, p in zip(design.heldout, pred_none):
        ans = r.answers[i]
        if p != design.mapping[ans]:
            continue  # only subjects the fine-tuned model labels right can switch away from label(a)
        targets.append((i, ans, rng.choice([x for x in answers if x != ans])))
    texts = [model.scoring.context(prompts[i].text) for i, _, _ in targets]
    enc = model.tokenizer(texts)
    keys = [locate.prefix(ids, m) for ids, m in zip(enc["input_ids"], enc["attention_mask"])]
    shared = {k for k in keys if keys.count(k) > 1}  # two subjects that tokenize alike cannot be steered apart
    targets = [t for t, k in zip(targets, keys) if k not in shared]
    keys = [k for k in keys if k not in shared]
    if not targets:
        return []
    texts = [prompts[i].text for i, _, _ in targets]
    site = model.resid_site(s.layer)

    def steer(vectors: list[torch.Tensor]) -> list[str]:
        fn = steering(locate, dict(zip(keys, vectors)))
        return [design.labels[o] for o in tuned.intervened(site, fn).logprobs(texts, design.labels).argmax(-1).tolist()]

    def outcome(labels_out: list[str]) -> tuple[np.ndarray, np.ndarray]:
        switched = np.array([o == design.mapping[b] for o, (_, _, b) in zip(labels_out, targets)], float)
        changed = np.array([o != design.mapping[x] for o, (_, x, _) in zip(labels_out, targets)], float)
        return switched, changed

    steered = steer(directions(means, [(x, b) for _, x, b in targets], norm))
    switched_random, changed_random = np.zeros(len(targets)), np.zeros(len(targets))
    for _ in range(c.n_random):
        rand = [torch.randn(s.x_finetune.shape[1], generator=gen) for _ in keys]
        sw, ch = outcome(steer([v / v.norm() * norm for v in rand]))
        switched_random += sw
        changed_random += ch
    # shuffled answers: the same states and class sizes, the wrong classes
    shuffled = np.random.default_rng(seed).permutation(np.asarray(s.answers_finetune, dtype=object))
    sw_shuffled, ch_shuffled = outcome(
        steer(directions(class_means(s.x_finetune, shuffled), [(x, b) for _, x, b in targets], norm))
    )
    # another relation's classes on the same states: from the subject's own class to another
    sw_other = ch_other = np.full(len(targets), np.nan)
    ft_subjects = [r.subjects[i] for i in design.finetune]
    if a.other_relation is not None and all(r.subjects[i] in a.other_answers for i, _, _ in targets):
        have = [j for j, subj in enumerate(ft_subjects) if subj in a.other_answers]
        other_means = class_means(s.x_finetune[have], [a.other_answers[ft_subjects[j]] for j in have])
        other_classes = sorted(other_means)
        pairs = []
        for i, _, _ in targets:
            own = a.other_answers[r.subjects[i]]
            start = own if own in other_means else rng.choice(other_classes)
            pairs.append((start, rng.choice([z for z in other_classes if z != start])))
        sw_other, ch_other = outcome(steer(directions(other_means, pairs, norm)))
    return [
        {
            "relation": r.name,
            "subject": r.subjects[i],
            "answer": x,
            "target_answer": b,
            "label": design.mapping[x],
            "target_label": design.mapping[b],
            "steered_label": o,
            "switched": o == design.mapping[b],
            "changed": o != design.mapping[x],
            "switched_random": float(sw / c.n_random),
            "changed_random": float(ch / c.n_random),
            "switched_shuffled": bool(ssh),
            "changed_shuffled": bool(csh),
            "switched_other": float(sot),
            "changed_other": float(cot),
            "other_relation": a.other_relation,
            "norm": norm,
        }
        for (i, x, b), o, sw, ch, ssh, csh, sot, cot in zip(
            targets, steered, switched_random, changed_random, sw_shuffled, ch_shuffled, sw_other, ch_other
        )
    ]


STEERING = Stage("steering", run_steering)

#: the steering controls: (name, the per-subject switch column of ``steering.csv``)
CONTROLS = (("random", "switched_random"), ("shuffled", "switched_shuffled"), ("other", "switched_other"))

STEERING_COLUMNS = (
    "switch_rate",
    "changed_rate",
    "changed_rate_random",
    *(f"switch_rate_{k}" for k, _ in CONTROLS),
    *(
        f"switch_excess{'' if k == 'random' else '_' + k}{end}"
        for k, _ in CONTROLS
        for end in ("", "_ci_low", "_ci_high")
    ),
    "other_relation",
    "steer_norm",
)


def steering_row(rows: list[dict], n_boot: int, seed: int) -> dict:
    """The relation's steering columns: the switch rate against each control (random directions,
    shuffled-answer and other-relation class means), each excess with a bootstrap CI over steered
    subjects (``switch_excess`` is the excess over random directions)."""
    sr = pd.DataFrame(rows)
    if not len(sr):
        return {**{c: np.nan for c in STEERING_COLUMNS}, "n_steered": 0}
    switched = sr.switched.to_numpy(float)
    idx = bootstrap_indices(np.random.default_rng(seed), len(sr), n_boot)
    out = {
        "n_steered": len(sr),
        "switch_rate": float(switched.mean()),
        "changed_rate": float(sr.changed.mean()),
        "changed_rate_random": float(sr.changed_random.mean()),
    }
    for name, col in CONTROLS:
        stem = "switch_excess" if name == "random" else f"switch_excess_{name}"
        control = sr[col].to_numpy(float) if col in sr else np.full(len(sr), np.nan)
        if np.isnan(control).any():  # no other relation on these subjects
            out.update(
                {f"switch_rate_{name}": np.nan, stem: np.nan, f"{stem}_ci_low": np.nan, f"{stem}_ci_high": np.nan}
            )
            continue
        lo, hi = percentile_interval(resampled_means(switched, idx) - resampled_means(control, idx))
        out.update(
            {
                f"switch_rate_{name}": float(control.mean()),
                stem: float(switched.mean() - control.mean()),
                f"{stem}_ci_low": lo,
                f"{stem}_ci_high": hi,
            }
        )
    out["other_relation"] = sr.other_relation.iloc[0] if "other_relation" in sr else None
    out["steer_norm"] = float(sr.norm.iloc[0])
    return out
