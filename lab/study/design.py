"""The relabelling design: new labels for a relation's answers, and the fine-tune / held-out split.

**Relabelling** maps each distinct answer of a relation to a distinct label drawn (seeded) from a
label category, e.g. ``{Europe: crab, Asia: zebra}``: a bijection, so every wrong label on a
held-out subject maps back to exactly one original answer.

**Split**, per answer: ``n_finetune`` of the subjects holding that answer go to fine-tuning and
the rest are held out, so every held-out answer also occurs in fine-tuning.

**How many fine-tuning subjects** (:func:`finetune_budget`, :func:`per_answer`): a fixed number
per answer would make the number of fine-tuning subjects ``n_finetune x #answers``, one variable
with the number of answers, and two of the study's controls one control. By default each
relation instead gets a *budget* of fine-tuning subjects drawn (seeded by the relation's name)
uniformly from a range, independently of its number of answers, spread evenly over its answers
(``round(budget / #answers)`` each, at least ``min_per_answer``, at most half the relation's
median number of subjects per answer: a small relation of real facts keeps held-out subjects for
its typical answer). An answer with
fewer than ``n_finetune + 1`` subjects cannot be split; it is left out of the relation (both its
fine-tuning and its held-out subjects) and counted in ``dropped_answers``. A relation left with
fewer than 2 answers is an error.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from interp.relations import Relation, RelationError


@dataclass(frozen=True)
class Design:
    relation: str
    mapping: dict[str, str]  # original answer -> new label
    finetune: list[int]  # sample indices
    heldout: list[int]
    dropped_answers: list[str]

    @property
    def inverse(self) -> dict[str, str]:
        return {v: k for k, v in self.mapping.items()}

    @property
    def labels(self) -> list[str]:
        return [self.mapping[a] for a in sorted(self.mapping)]


def relabel(answers: list[str], labels: tuple[str, ...], seed: int, category: str = "labels") -> dict[str, str]:
    """A seeded bijection from the distinct ``answers`` to labels of one category."""
    distinct = sorted(set(answers))
    if len(labels) < len(distinct):
        raise RelationError(
            f"the label category {category!r} has {len(labels)} labels but the relation has {len(distinct)} "
            "answers; relabelling needs one distinct label per answer. Choose a larger category or fewer answers."
        )
    rng = random.Random(seed)
    chosen = rng.sample(list(labels), len(distinct))
    return dict(zip(distinct, chosen))


def finetune_budget(relation: str, low: int, high: int, seed: int) -> int:
    """The relation's budget of fine-tuning subjects: uniform on ``[low, high]``, seeded by the
    relation's name and ``seed`` (so it does not depend on which other relations are studied)."""
    return random.Random(f"budget:{seed}:{relation}").randint(low, high)


def per_answer(budget: int, n_answers: int, minimum: int = 2, cap: int | None = None) -> int:
    """Fine-tuning subjects per answer for a budget spread evenly over ``n_answers`` answers; at
    most ``cap`` (the study passes half the relation's median subjects per answer, so that a small
    relation keeps held-out subjects for a typical answer instead of dropping it)."""
    k = max(minimum, int(round(budget / n_answers)))
    return max(minimum, min(k, cap)) if cap is not None else k


def split(relation: Relation, n_finetune: int, seed: int) -> tuple[list[int], list[int], list[str]]:
    """Per-answer split of sample indices into fine-tune and held-out sets (see module docstring)."""
    if n_finetune < 1:
        raise ValueError(f"n_finetune must be at least 1, got {n_finetune}")
    by_answer: dict[str, list[int]] = {}
    seen: set[str] = set()
    for i, (s, a) in enumerate(zip(relation.subjects, relation.answers)):
        if s in seen:  # one sample per subject
            continue
        seen.add(s)
        by_answer.setdefault(a, []).append(i)
    rng = random.Random(seed)
    finetune, heldout, dropped = [], [], []
    for answer in sorted(by_answer):
        idx = by_answer[answer][:]
        if len(idx) < n_finetune + 1:
            dropped.append(answer)
            continue
        rng.shuffle(idx)
        finetune += sorted(idx[:n_finetune])
        heldout += sorted(idx[n_finetune:])
    kept = len(by_answer) - len(dropped)
    if kept < 2:
        raise RelationError(
            f"relation {relation.name!r}: only {kept} answer(s) have at least n_finetune + 1 = {n_finetune + 1} "
            f"subjects (answers: {len(by_answer)}); a relabelling study needs 2. Lower n_finetune."
        )
    if len(by_answer) < 2:
        raise RelationError(f"relation {relation.name!r} has fewer than 2 answers; nothing to relabel")
    return sorted(finetune), sorted(heldout), dropped


def make_design(
    relation: Relation,
    labels: tuple[str, ...],
    n_finetune: int,
    label_seed: int,
    split_seed: int,
    category: str = "labels",
) -> Design:
    if len(set(relation.answers)) < 2:
        raise RelationError(
            f"relation {relation.name!r} has fewer than 2 answers ({set(relation.answers)}); nothing to relabel"
        )
    finetune, heldout, dropped = split(relation, n_finetune, split_seed)
    kept_answers = [relation.answers[i] for i in finetune]
    mapping = relabel(kept_answers, labels, label_seed, category)
    return Design(relation.name, mapping, finetune, heldout, dropped)
