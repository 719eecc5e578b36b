"""One fine-tune of the study, as a stage (:mod:`lab.stages`): design -> fine-tune -> evaluate ->
back-map.

A job is one relation x method x label category x label seed x fine-tuning seed. It

1. relabels the relation's answers with the category's labels and splits its subjects
   (:func:`lab.study.config.design_for`, :mod:`lab.study.design`);
2. fine-tunes a copy of the pretrained model on the fine-tuning subjects (:mod:`lab.study.finetune`);
3. scores the held-out subjects' labels (top label among the relation's labels): generalization,
   raw and as Cohen's kappa, beside the chance levels of the held-out labels (:mod:`probes.chance`);
4. maps each wrong held-out label back to the original answer it stands for, and asks whether that
   answer is among the probe's (or the pretrained model's) top-k wrong answers for the subject,
   against a shuffled null (:func:`shuffled_backmap_rates`).

Its result is a JSON-able dict, saved by the runner as ``runs/<job id>.json``. A label category
with too few labels for a relation (a robustness category) gives ``status: skipped`` with the
reason; in the study's own category that is an error.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

import numpy as np
import pandas as pd

from interp.models import Model
from interp.relations import Relation, RelationError
from lab.stages import DERIVED, Stage
from probes.chance import chance_levels, expected_agreement, kappa

from .config import StudyConfig, design_for
from .finetune import FinetuneSpec, finetune, finetune_group, group_refusal, group_size


@dataclass(frozen=True)
class Job:
    relation: str
    method: str
    category: str
    label_seed: int
    finetune_seed: int

    @property
    def id(self) -> str:
        return f"{self.relation}__{self.method}__{self.category}__l{self.label_seed}__f{self.finetune_seed}"


@dataclass(frozen=True)
class FinetuneInputs:
    """Everything one fine-tune reads. ``readout`` (the probe's ranked answers per subject at
    ``best_layer``) and ``pretrained`` (the pretrained model's) are computed from the model, the
    relation and the configuration, so they are not part of the job's key."""

    model: Model
    relation: Relation
    config: StudyConfig
    labels: dict
    job: Job
    readout: pd.DataFrame = field(metadata=DERIVED)
    pretrained: pd.DataFrame = field(metadata=DERIVED)
    best_layer: int = field(default=0, metadata=DERIVED)


def run_finetune_job(j: FinetuneInputs) -> dict:
    """Design, fine-tune, evaluate and back-map one job (see the module docstring)."""
    design = _design(j)
    if isinstance(design, dict):
        return design
    return _evaluate(j, design, *_finetune_alone(j, design))


def _finetune_alone(j: FinetuneInputs, design) -> tuple[Model, dict]:
    return finetune(
        j.model, *_training_set(j, design), design.labels, j.job.method, j.config.finetune, seed=j.job.finetune_seed
    )


def run_finetune_group(items: list[FinetuneInputs]) -> list[dict]:
    """:func:`run_finetune_job` of every item, the fine-tunes of each method trained as groups
    (:func:`lab.study.finetune.finetune_group`, sized to memory); the same results up to float
    rounding. Fine-tunes that cannot train as a group (:func:`~lab.study.finetune.group_refusal`:
    a model with dropout, the TransformerLens backend) train one at a time, with a warning that
    says why, so that ``executor="grouped"`` runs any study."""
    designs = [_design(j) for j in items]
    out: list[dict | None] = [d if isinstance(d, dict) else None for d in designs]
    todo = [i for i, d in enumerate(designs) if not isinstance(d, dict)]
    for method in dict.fromkeys(items[i].job.method for i in todo):
        idx = [i for i in todo if items[i].job.method == method]
        first = items[idx[0]]
        why = group_refusal(first.model, method, first.config.finetune.for_model(first.model))
        if why is not None:  # the study still runs: these fine-tunes one at a time, as serially
            warnings.warn(f"{method} fine-tunes run one at a time, not as a group: {why}", RuntimeWarning, stacklevel=2)
            for i in idx:
                out[i] = _evaluate(items[i], designs[i], *_finetune_alone(items[i], designs[i]))
            continue
        size = group_size(first.model, method, first.config.finetune, len(idx))
        for start in range(0, len(idx), size):
            part = idx[start : start + size]
            specs = [
                FinetuneSpec(*_training_set(items[i], designs[i]), designs[i].labels, items[i].job.finetune_seed)
                for i in part
            ]
            for i, (tuned, info) in zip(part, finetune_group(first.model, specs, method, first.config.finetune)):
                out[i] = _evaluate(items[i], designs[i], tuned, info)
    return out


def _design(j: FinetuneInputs):
    """The job's design, or its ``skipped`` result (too few labels in a robustness category)."""
    job, config = j.job, j.config
    try:
        return design_for(j.relation, j.labels, config, job.category, job.label_seed)
    except RelationError as err:
        if job.category == config.category:
            raise
        return {**asdict(job), "job": job.id, "status": "skipped", "reason": str(err)}


def _training_set(j: FinetuneInputs, design) -> tuple[list[str], list[str]]:
    r, tmpl = j.relation, j.config.finetune.template
    return [tmpl.format(r.subjects[i]) for i in design.finetune], [
        design.mapping[r.answers[i]] for i in design.finetune
    ]


def _evaluate(j: FinetuneInputs, design, tuned, info: dict) -> dict:
    """Score the held-out subjects with the fine-tuned model and back-map its errors."""
    job, r, config = j.job, j.relation, j.config
    base = {**asdict(job), "job": job.id}
    label_set = design.labels
    ho_prompts = [config.finetune.template.format(r.subjects[i]) for i in design.heldout]
    scores = tuned.logprobs(ho_prompts, label_set)
    pred = [label_set[i] for i in scores.argmax(-1).tolist()]
    del tuned
    probe_top = {row.subject: row.top_answers for row in j.readout.itertuples()}
    model_top = {row.subject: row.model_top_answers for row in j.pretrained.itertuples()}
    k, kept = config.top_k, set(design.mapping)
    preds, lists = [], []
    for i, p in zip(design.heldout, pred):
        s, a = r.subjects[i], r.answers[i]
        back = design.inverse[p]
        wrong = p != design.mapping[a]
        row = {
            "subject": s,
            "answer": a,
            "label": design.mapping[a],
            "predicted_label": p,
            "correct": not wrong,
            "backmapped_answer": back,
        }
        for who, ranking in (("probe", probe_top.get(s)), ("model", model_top.get(s))):
            # top-k among the design's wrong answers; no ranking (a subject the probe left out) is not a miss
            top = wrong_top(ranking, a, k, kept) if ranking is not None else None
            row[f"in_{who}_topk"] = (back in top) if (wrong and top is not None) else None
            row[f"{who}_slots"] = len(top) if top is not None else None
            if wrong:
                lists.append((who, a, back, top))
        preds.append(row)
    truth = [q["label"] for q in preds]
    levels = chance_levels(truth)
    return {
        **base,
        "status": "done",
        "n_answers": len(label_set),
        "n_finetune_subjects": len(design.finetune),
        "n_heldout": len(design.heldout),
        "dropped_answers": design.dropped_answers,
        "mapping": design.mapping,
        "generalization": float(np.mean([q["correct"] for q in preds])),
        "generalization_kappa": kappa(truth, pred),
        "chance_uniform": levels["uniform"],
        "chance_prior": levels["prior"],
        "chance_majority": levels["majority"],
        "chance_expected": expected_agreement(truth, pred),
        # the outcome (no generalization), not a failure: flagged, never excluded (lab.study.failures)
        "heldout_one_label": len(set(pred)) == 1 and len(set(truth)) > 1,
        "full_batch": len(design.finetune) <= config.finetune.batch_size,
        **shuffled_backmap_rates(lists, seed=job.finetune_seed),
        **info,
        "predictions": preds,
    }


FINETUNE = Stage("fine-tune", run_finetune_job, group=run_finetune_group)


def shuffled_backmap_rates(lists: list, n_shuffles: int = 100, seed: int = 0) -> dict:
    """Expected back-mapping hit rates if the wrong labels' answers were shuffled among the
    relation's errors: a null that keeps how often each answer is back-mapped (the fine-tuned
    model's label preferences) and each list's popularity bias, but breaks the link to the subject.
    ``lists``: ``(who, true answer, back-mapped answer, top list or None)`` per error."""
    rng = np.random.default_rng(seed)
    out = {}
    for who in ("probe", "model"):
        rows = [(a, b, top) for w, a, b, top in lists if w == who and top is not None]
        if not rows:
            out[f"{who}_shuffled_rate"] = None
            continue
        backs = np.array([b for _, b, _ in rows], dtype=object)
        hits = []
        for _ in range(n_shuffles):
            perm = backs[rng.permutation(len(backs))]
            hits.append(np.mean([b in top for (_, _, top), b in zip(rows, perm)]))
        out[f"{who}_shuffled_rate"] = float(np.mean(hits))
    return out


def wrong_top(ranked: Sequence[str], answer: str, k: int, kept: set | None = None) -> list[str]:
    """The first ``k`` answers of a ranking with the true ``answer`` (and answers not in ``kept``)
    removed."""
    return [a for a in ranked if a != answer and (kept is None or a in kept)][:k]
