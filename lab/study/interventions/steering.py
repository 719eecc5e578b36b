"""Steering arm of the interventions: after the ``none`` fine-tune, add the pretrained class-mean
direction from a subject's answer ``a`` toward another answer ``b`` at the subject, and see
whether the fine-tuned model's label switches to ``label(b)``; random directions of the same
norm are the control.

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
    y = np.asarray(s.answers_finetune)
    means = {ans: s.x_finetune[torch.as_tensor(y == ans)].mean(0) for ans in answers}
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
    direction = {k: (means[b] - means[x]) / (means[b] - means[x]).norm() * norm for k, (_, x, b) in zip(keys, targets)}
    texts = [prompts[i].text for i, _, _ in targets]
    site = model.resid_site(s.layer)
    steered = tuned.intervened(site, steering(locate, direction)).logprobs(texts, design.labels).argmax(-1).tolist()
    switched_random, changed_random = np.zeros(len(targets)), np.zeros(len(targets))
    for _ in range(c.n_random):
        rand = {}
        for k in keys:
            v = torch.randn(s.x_finetune.shape[1], generator=gen)
            rand[k] = v / v.norm() * norm
        out = tuned.intervened(site, steering(locate, rand)).logprobs(texts, design.labels).argmax(-1).tolist()
        switched_random += [design.labels[o] == design.mapping[b] for o, (_, _, b) in zip(out, targets)]
        changed_random += [design.labels[o] != design.mapping[x] for o, (_, x, _) in zip(out, targets)]
    return [
        {
            "relation": r.name,
            "subject": r.subjects[i],
            "answer": x,
            "target_answer": b,
            "label": design.mapping[x],
            "target_label": design.mapping[b],
            "steered_label": design.labels[o],
            "switched": design.labels[o] == design.mapping[b],
            "changed": design.labels[o] != design.mapping[x],
            "switched_random": float(sw / c.n_random),
            "changed_random": float(ch / c.n_random),
            "norm": norm,
        }
        for (i, x, b), o, sw, ch in zip(targets, steered, switched_random, changed_random)
    ]


STEERING = Stage("steering", run_steering)

STEERING_COLUMNS = (
    "switch_rate",
    "switch_rate_random",
    "changed_rate",
    "changed_rate_random",
    "switch_excess",
    "switch_excess_ci_low",
    "switch_excess_ci_high",
    "steer_norm",
)


def steering_row(rows: list[dict], n_boot: int, seed: int) -> dict:
    """The relation's steering columns: switch and change rates against random directions, the
    switch excess with a bootstrap CI over steered subjects."""
    sr = pd.DataFrame(rows)
    if not len(sr):
        return {**{c: np.nan for c in STEERING_COLUMNS}, "n_steered": 0}
    switched, switched_random = sr.switched.to_numpy(float), sr.switched_random.to_numpy(float)
    idx = bootstrap_indices(np.random.default_rng(seed), len(sr), n_boot)
    lo, hi = percentile_interval(resampled_means(switched, idx) - resampled_means(switched_random, idx))
    return {
        "n_steered": len(sr),
        "switch_rate": float(sr.switched.mean()),
        "switch_rate_random": float(sr.switched_random.mean()),
        "changed_rate": float(sr.changed.mean()),
        "changed_rate_random": float(sr.changed_random.mean()),
        "switch_excess": float(sr.switched.mean() - sr.switched_random.mean()),
        "switch_excess_ci_low": lo,
        "switch_excess_ci_high": hi,
        "steer_norm": float(sr.norm.iloc[0]),
    }
