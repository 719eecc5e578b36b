"""Check a study before any work: every configuration field, relation, template, label category
and layer, all at once.

A study spends minutes to hours fine-tuning; an input it cannot use must fail before the first
forward pass, with a message naming the field, the bad value and what would be valid, and
listing every problem rather than the first. :func:`validate_study` raises
:class:`StudyConfigError` (a ``ValueError``) with one line per problem, and returns warnings for
inputs that are usable but suspicious: a fine-tuning prompt or label made of tokens the model
was never trained on (the world model: absent from its corpus; any model: its unknown token).
"""

from __future__ import annotations

import string
import warnings

from interp.relations import RelationError
from interp.trainable import lora_targets
from probes.nonlinear import NONLINEAR

from .config import StudySpec

#: the fewest relations for which every statistic the study reports is defined (a partial
#: correlation with one covariate needs n - 3 >= 1 degrees of freedom)
MIN_RELATIONS = 4


class StudyConfigError(ValueError):
    """One or more inputs of a study are invalid; ``problems`` lists them."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("the study cannot run; fix these inputs first:\n" + "\n".join(f"  - {p}" for p in problems))


def template_problem(template: str) -> str | None:
    """Why a fine-tuning template is unusable (it must place the subject once, with ``{}``)."""
    try:
        fields = [f for _, f, _, _ in string.Formatter().parse(template) if f is not None]
    except ValueError as err:
        return (
            f"finetune.template {template!r} is not a valid format string ({err}); write '{{}}' where the subject goes"
        )
    if fields != [""]:
        return (
            f"finetune.template {template!r} must contain '{{}}' exactly once, where the subject goes "
            f"(found {len(fields)} replacement field(s)); e.g. '{{}} is associated with the word'"
        )
    return None


def _config_problems(spec: StudySpec) -> list[str]:
    c, labels, n_layers = spec.config, spec.labels, spec.model.n_layers
    out = []
    cats = ", ".join(sorted(labels))
    if c.category not in labels:
        out.append(f"category {c.category!r} is not a label category; valid: {cats}")
    bad = [x for x in c.other_categories if x not in labels]
    if bad:
        out.append(f"other_categories {bad} are not label categories; valid: {cats}")
    if c.category in c.other_categories or len(set(c.other_categories)) != len(c.other_categories):
        out.append(
            f"other_categories {tuple(c.other_categories)!r} must name each category once and not the main "
            f"category {c.category!r} (it is always run)"
        )
    for cat in [c.category, *c.other_categories]:
        words = labels.get(cat, ())
        if len(set(words)) != len(words):
            out.append(f"label category {cat!r} lists a label twice; relabelling needs distinct labels")
    if not c.methods or any(m not in ("full", "lora") for m in c.methods) or len(set(c.methods)) != len(c.methods):
        out.append(f"methods {tuple(c.methods)!r}: give one or both of 'full', 'lora', each once")
    for name in ("label_seeds", "finetune_seeds"):
        v = getattr(c, name)
        if not v or len(set(v)) != len(v):
            out.append(f"{name} {tuple(v)!r}: give at least one seed, each once")
    unknown = [n for n in c.nonlinear_probes if n not in NONLINEAR]
    if unknown:
        out.append(f"nonlinear_probes {list(unknown)}: the nonlinear probes are {', '.join(NONLINEAR)}")
    if c.baselines and (not c.baseline_seeds or len(set(c.baseline_seeds)) != len(c.baseline_seeds)):
        out.append(
            f"baseline_seeds {tuple(c.baseline_seeds)!r}: give at least one random-weight seed, each once "
            "(or baselines=False)"
        )
    if not 0 <= c.baseline_flag <= 1:
        out.append(f"baseline_flag={c.baseline_flag}: a kappa threshold between 0 and 1 (default 0.2)")
    if c.n_finetune is not None and c.n_finetune < 1:
        out.append(
            f"n_finetune={c.n_finetune}: fine-tuning subjects per answer must be at least 1 "
            "(or None for the budget design)"
        )
    lo, hi = c.finetune_budget
    if not 2 <= lo <= hi:
        out.append(
            f"finetune_budget={tuple(c.finetune_budget)}: need 2 <= low <= high fine-tuning subjects per relation"
        )
    if c.min_per_answer < 1:
        out.append(f"min_per_answer={c.min_per_answer}: must be at least 1")
    if c.folds < 2:
        out.append(f"folds={c.folds}: cross-validation needs at least 2 folds")
    if c.probe_C <= 0:
        out.append(f"probe_C={c.probe_C}: the inverse regularization strength must be positive")
    if c.fixed_layer is not None and not 0 <= c.fixed_layer < n_layers:
        out.append(
            f"fixed_layer={c.fixed_layer}: model {spec.model.name!r} has layers 0 to {n_layers - 1}; "
            f"choose one of them or None (the middle layer, {n_layers // 2})"
        )
    if c.top_k < 1:
        out.append(f"top_k={c.top_k}: must be at least 1")
    for name, least in (("n_boot", 50), ("n_perm", 19), ("n_null", 100)):
        if getattr(c, name) < least:
            out.append(f"{name}={getattr(c, name)}: use at least {least} for a usable estimate")
    f = c.finetune
    problem = template_problem(f.template)
    if problem:
        out.append(problem)
    for name in ("lr", "lora_lr"):  # None: resolved for the model (lab.study.finetune)
        if getattr(f, name) is not None and getattr(f, name) <= 0:
            out.append(f"finetune.{name}={getattr(f, name)}: the learning rate must be positive")
    for name in ("max_steps", "check_every", "batch_size", "lora_r", "lora_alpha"):
        if getattr(f, name) < 1:
            out.append(f"finetune.{name}={getattr(f, name)}: must be at least 1")
    if f.weight_decay < 0:
        out.append(f"finetune.weight_decay={f.weight_decay}: must be at least 0")
    if "lora" in c.methods:
        try:
            lora_targets(spec.model.model_type)
        except ValueError as err:
            out.append(str(err))
    return out


def _relation_problems(spec: StudySpec, min_relations: int = MIN_RELATIONS) -> list[str]:
    c, rels = spec.config, spec.relations
    out = []
    if len(rels) < min_relations:
        out.append(
            f"{len(rels)} relation(s) given; a study correlates across relations and its partial correlations "
            f"need at least {min_relations}: add relations"
        )
    names = [r.name for r in rels]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        out.append(f"relations {dup} are given more than once")
    if c.category not in spec.labels:
        return out
    for r in rels:
        if "/" in r.name or "__" in r.name or not r.name.strip():
            out.append(f"relation name {r.name!r} is used in file names: avoid '/', '__' and empty names")
        if len(r) == 0:
            out.append(f"relation {r.name!r} has no samples")
            continue
        counts: dict = {}
        seen: set = set()
        for subject, a in zip(r.subjects, r.answers):  # one sample per subject, its first (as the probe sweep)
            if subject not in seen:
                seen.add(subject)
                counts[a] = counts.get(a, 0) + 1
        if sum(n >= c.folds for n in counts.values()) < 2:
            out.append(
                f"relation {r.name!r}: fewer than 2 answers have at least folds={c.folds} subjects, so the probe "
                "cannot be cross-validated; lower folds or add subjects"
            )
        try:
            spec.design(r, c.category, c.label_seeds[0] if c.label_seeds else 0)
        except (RelationError, ValueError) as err:
            out.append(str(err))
    return out


def untrained_tokens(spec: StudySpec) -> list[str]:
    """Tokens of the fine-tuning template and of the labels that the model was never trained on."""
    tok, c, trained = spec.model.tokenizer, spec.config, spec.trained_tokens
    texts = [("template", c.finetune.template.replace("{}", "").strip())]
    for cat in sorted({c.category, *c.other_categories} & set(spec.labels)):
        texts += [(f"{cat} label", w) for w in spec.labels[cat]]
    unk = getattr(tok, "unk_token_id", None)
    out = []
    for where, text in texts:
        ids = tok(" " + text, add_special_tokens=False)["input_ids"]
        bad = [i for i in ids if (unk is not None and i == unk) or (trained is not None and i not in trained)]
        if bad:
            out.append(f"{where} ({text!r}): {len(bad)} unknown or untrained token(s) {tok.convert_ids_to_tokens(bad)}")
    return out


def validate_study(spec: StudySpec, min_relations: int = MIN_RELATIONS) -> list[str]:
    """Raise :class:`StudyConfigError` listing every invalid input; return (and warn about)
    tokens of prompts and labels that the model was never trained on. ``min_relations``: fewer is
    an error (a correlation across relations; an intervention on one relation needs 1)."""
    problems = _config_problems(spec) + _relation_problems(spec, min_relations)
    if problems:
        raise StudyConfigError(problems)
    notes = untrained_tokens(spec)
    if notes:
        warnings.warn(
            "fine-tuning prompts or labels use tokens the model was never trained on (their embeddings are "
            "untrained, so the study measures noise there): " + "; ".join(notes[:10]),
            stacklevel=3,
        )
    return notes
