"""Chance levels and chance-corrected accuracy (Cohen's kappa).

Relations differ in how many answers they have and in how unevenly their subjects are spread
over them, and both readability (probe accuracy) and generalization (held-out accuracy after
relabelling) rise as answers get fewer or more lopsided, whether or not the model knows
anything. A correlation of raw accuracies across relations is then partly a correlation of
chance levels with themselves: the study would find one in a model with no generalization at
all (:mod:`lab.study.null` simulates exactly that).

Three chance levels, all measured on the *evaluated* subjects (their empirical answer shares
``p_a``), are reported side by side:

- ``uniform`` = 1 / #answers: a uniform guess (ignores imbalance; too low for skewed relations);
- ``prior`` = sum_a p_a^2: a guess drawn from the answer distribution itself;
- ``majority`` = max_a p_a: always naming the most common answer, which any probe can learn.

The study's normalized score is **Cohen's kappa**, ``(p_o - p_e) / (1 - p_e)`` with ``p_o`` the
accuracy and ``p_e = sum_a p_a q_a``, where ``q_a`` is how often ``a`` was *predicted*. Why kappa
rather than ``(acc - c) / (1 - c)`` with one of the fixed levels above: ``p_e`` is the expected
accuracy of a predictor that makes the same predictions in the same proportions *independently
of the subject*, so kappa is 0 in expectation for every subject-blind strategy, the uniform
guess, the prior-matched guess and the constant majority answer alike, and 1 for perfect
predictions. A fixed level can be beaten by a subject-blind predictor (the majority answer beats
1/n; a uniform guess falls below the majority share). Kappa is undefined (NaN) when ``p_e = 1``.
It equals :func:`sklearn.metrics.cohen_kappa_score` (tested).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import numpy as np


def answer_shares(answers: Sequence) -> dict:
    """Empirical share of each answer, ``{answer: p_a}``."""
    counts = Counter(answers)
    n = sum(counts.values())
    return {a: c / n for a, c in counts.items()}


def chance_levels(answers: Sequence) -> dict[str, float]:
    """``uniform`` (1/#answers), ``prior`` (sum p_a^2) and ``majority`` (max p_a) chance levels."""
    if len(answers) == 0:
        raise ValueError("chance levels need at least one evaluated subject")
    p = np.array(list(answer_shares(answers).values()))
    return {"uniform": 1.0 / len(p), "prior": float((p**2).sum()), "majority": float(p.max())}


def expected_agreement(true: Sequence, pred: Sequence) -> float:
    """``p_e = sum_a p_true(a) p_pred(a)``: the accuracy of the same predictions made blind."""
    pt, pp = answer_shares(true), answer_shares(pred)
    return float(sum(v * pp.get(a, 0.0) for a, v in pt.items()))


def kappa(true: Sequence, pred: Sequence) -> float:
    """Cohen's kappa of ``pred`` against ``true`` (see the module docstring); NaN if undefined."""
    if len(true) != len(pred):
        raise ValueError(f"kappa needs as many predictions as answers, got {len(pred)} and {len(true)}")
    if len(true) == 0:
        raise ValueError("kappa needs at least one prediction")
    p_o = float(np.mean([t == p for t, p in zip(true, pred)]))
    p_e = expected_agreement(true, pred)
    return float("nan") if p_e >= 1 - 1e-12 else (p_o - p_e) / (1 - p_e)


def kappa_from_counts(correct: np.ndarray, p_e: np.ndarray) -> np.ndarray:
    """Kappa from accuracies and expected agreements (any broadcastable shapes)."""
    return (correct - p_e) / (1 - p_e)
