"""Which relations of real facts support the relabelling design, and in what form.

A relation supports the study when, after fine-tuning on some of an answer's subjects, other
subjects with that answer remain to test on, for at least two answers. The rule
(:class:`QualifyRule`), applied to each relation's distinct subjects (a subject listed twice keeps
its first answer):

1. an answer needs ``min_subjects`` subjects (default 6: at 5 folds every answer then appears in
   every probe fold, and the design can fine-tune on some and hold out others);
2. at most ``max_answers`` answers are kept, the most frequent (ties by name): a label category
   needs a word per answer (:data:`lab.study.labels.REAL_LABELS`);
3. at least ``min_answers`` answers remain;
4. the study's design (:mod:`lab.study.design`: its per-relation budget, spread over the kept
   answers, ``k`` fine-tuning subjects per answer) can split every kept answer: an answer with
   ``k`` or fewer subjects is left out and ``k`` recomputed, until every kept answer has at least
   ``k + 1`` subjects; then at least ``min_answers`` answers and ``min_heldout`` held-out
   subjects must remain.

Relations are restricted to the kept answers, so the probe (readability) and the fine-tune
(generalization) see the same subjects and the same answers.
:func:`qualifying_relations` returns them and a table of every relation with the reason it was
kept or left out, which the study writes as ``qualification.csv``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import pandas as pd

from interp.relations import Relation, RelationError

from .design import split


@dataclass(frozen=True)
class QualifyRule:
    min_subjects: int = 6
    min_answers: int = 2
    max_answers: int = 20
    min_heldout: int = 20


def restrict(relation: Relation, rule: QualifyRule, min_subjects: int | None = None) -> Relation:
    """``relation`` on its distinct subjects and its qualifying answers (rules 1-2; an answer needs
    ``min_subjects`` subjects, default ``rule.min_subjects``)."""
    first: dict[str, str] = {}
    for s, a in zip(relation.subjects, relation.answers):
        first.setdefault(s, a)
    counts = Counter(first.values())
    need = rule.min_subjects if min_subjects is None else min_subjects
    ranked = sorted((a for a, n in counts.items() if n >= need), key=lambda a: (-counts[a], a))
    kept = set(ranked[: rule.max_answers])
    subjects = [s for s, a in first.items() if a in kept]
    return Relation(
        relation.name,
        subjects,
        [first[s] for s in subjects],
        relation.template,
        properties={**relation.properties, "restricted_from": len(relation)},
    )


def qualifying_relations(
    relations: Sequence[Relation],
    per_answer: Callable[[Relation], int],
    rule: QualifyRule = QualifyRule(),
    split_seed: int = 0,
) -> tuple[list[Relation], pd.DataFrame]:
    """The relations that support the design (restricted to their kept answers), and one row per
    relation saying why it was kept or not. ``per_answer``: the study's fine-tuning subjects per
    answer for a relation (:meth:`lab.study.StudyConfig.per_answer`)."""
    kept, rows = [], []
    for r in relations:
        if r.prompts_override is not None:
            rows.append(
                {"relation": r.name, "qualifies": False, "reason": "per-sample prompts (no template to relabel)"}
            )
            continue
        first = dict(zip(reversed(r.subjects), reversed(r.answers)))
        counts = Counter(first.values())
        row = {
            "relation": r.name,
            "n_samples": len(r),
            "n_subjects": len(first),
            "n_answers": len(counts),
            f"answers_with_{rule.min_subjects}_subjects": sum(n >= rule.min_subjects for n in counts.values()),
        }
        small = restrict(r, rule)
        n_kept = len(set(small.answers))
        row["answers_kept"] = n_kept
        if n_kept < rule.min_answers:
            rows.append(
                {
                    **row,
                    "qualifies": False,
                    "reason": f"{n_kept} answer(s) with at least {rule.min_subjects} subjects "
                    f"(needs {rule.min_answers})",
                }
            )
            continue
        k = per_answer(small)
        while True:  # rule 4: every kept answer can be split at the design's k
            smaller = restrict(r, rule, max(rule.min_subjects, k + 1))
            if len(smaller) == len(small) or len(set(smaller.answers)) < rule.min_answers:
                break
            small, k = smaller, per_answer(smaller)
        row["answers_kept"] = len(set(small.answers))
        try:
            finetune, heldout, dropped = split(small, k, split_seed)
        except RelationError as err:
            rows.append({**row, "qualifies": False, "reason": f"design fails: {err}"})
            continue
        row.update(
            {
                "per_answer": k,
                "n_finetune_subjects": len(finetune),
                "n_heldout": len(heldout),
                "dropped_answers": len(dropped),
            }
        )
        if len(heldout) < rule.min_heldout:
            rows.append(
                {**row, "qualifies": False, "reason": f"{len(heldout)} held-out subjects (needs {rule.min_heldout})"}
            )
            continue
        kept.append(small)
        rows.append({**row, "qualifies": True, "reason": ""})
    return kept, pd.DataFrame(rows)
