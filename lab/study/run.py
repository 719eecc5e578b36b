"""``run_study``: one call from a model spec to a finished study folder (the main job)."""

from __future__ import annotations

import difflib
import tempfile
from collections.abc import Sequence
from dataclasses import fields, replace
from pathlib import Path

import pandas as pd

import interp
from interp.relations import Relation, load_relations, lre_dir
from interp.results import write_table
from lab.world import from_world, load_world, world_checkpoint_of

from .config import StudyConfig, design_for
from .finetune import FinetuneSpec
from .labels import REAL_LABELS
from .relations import QualifyRule, qualifying_relations
from .study import Study, StudyResult
from .validate import StudyConfigError


def run_study(
    model="world",
    relations: Sequence | None = None,
    out: str | Path = "results/study",
    config: StudyConfig | None = None,
    backend: str = interp.DEFAULT_BACKEND,
    progress: bool | None = None,
    max_jobs: int | None = None,
    executor=None,
    rule: QualifyRule = QualifyRule(),
    **overrides,
) -> StudyResult:
    """Run (or resume) the study.

    ``model``: ``"world"`` (or a world checkpoint directory, or a handle loaded from one) uses the
    world's relations, labels and exact subject frequencies. Any other model (``"minilm"``, a directory, a hub name) is
    studied on real facts: ``relations`` (Relation objects or paths to relation JSON files, LRE or
    project format), by default every shipped LRE relation; the ones that support the design
    (:mod:`lab.study.relations`, ``rule``) are kept, restricted to their qualifying answers, and
    ``qualification.csv`` says why each was kept or left out. Its labels are common English words
    (:data:`lab.study.labels.REAL_LABELS`) and its configuration :func:`real_model_config` unless
    ``config`` is given. ``overrides``: StudyConfig fields.
    ``executor``: where the fine-tunes run (``"serial"``, ``"processes"``, ``"grouped"``, ``"ray"``
    or an :class:`~lab.executors.Executor`); results are identical at equal thread counts, and
    within float rounding for ``"grouped"`` (:func:`lab.study.finetune.finetune_group`).
    """
    config = config or default_config(model)
    if overrides:
        unknown = sorted(set(overrides) - {f.name for f in fields(StudyConfig)})
        if unknown:
            raise StudyConfigError(
                [f"unknown StudyConfig field(s) {unknown}; valid: {', '.join(f.name for f in fields(StudyConfig))}"]
            )
        config = replace(config, **overrides)
    if relations is not None and len(relations) == 0:
        raise StudyConfigError(
            ["relations=[] names no relation; pass None for all of the world's relations, or name some"]
        )
    study, qualification = make_study(model, relations, out, config, backend, progress, rule)
    if qualification is not None:
        Path(out).mkdir(parents=True, exist_ok=True)
        write_table(qualification, Path(out) / "qualification.csv")
    return study.run(max_jobs=max_jobs, executor=executor)


def make_study(
    model,
    relations: Sequence | None,
    out: str | Path,
    config: StudyConfig,
    backend: str = interp.DEFAULT_BACKEND,
    progress: bool | None = None,
    rule: QualifyRule = QualifyRule(),
    labels: dict | None = None,
    min_relations: int = 4,
) -> tuple[Study, pd.DataFrame | None]:
    """The configured :class:`Study` for ``model`` and ``relations`` as :func:`run_study` resolves
    them (world relations and labels, or the qualifying real relations), and the qualification
    table (None for the world). ``labels``: label categories for a real model (default
    :data:`~lab.study.labels.REAL_LABELS`)."""
    handle = interp.load_model(model, backend=backend)
    frequency = trained = None
    source = "proxy: mean log-prob of subject tokens"
    checkpoint = world_checkpoint_of(model)
    if checkpoint is not None:  # "world", a world checkpoint directory, or a handle loaded from one
        world = load_world(checkpoint)
        rels = world_relations(world, relations)
        world_facts = {r.name for r in rels if r.properties.get("source") == "world"}
        study_labels = world.label_categories
        subjects = set(world.subjects)
        if all(r.name in world.relation and set(r.subjects) <= subjects for r in rels):
            # the subject's exposure to the relation; for a relation with other facts (shuffled
            # answers, a null control) it is still how often the corpus stated this subject's fact
            frequency = lambda rel, s: world.mentions(s, rel)  # noqa: E731
            source = "exact: corpus documents stating the fact (world)"
            if len(world_facts) < len(rels):
                source += "; relations with their own facts keep the exposure of the world's fact"
        words = sorted({w for doc in world.corpus() for w in doc.split()})
        trained = set(handle.tokenizer(" ".join(words), add_special_tokens=False)["input_ids"])
        qualification = None
    else:
        if relations:
            rels = [r for r in relations if isinstance(r, Relation)]
            paths = [r for r in relations if not isinstance(r, Relation)]
            rels += load_relations(paths) if paths else []
        else:  # real facts: every shipped LRE relation, the design decides which qualify
            rels = load_relations([lre_dir() / kind for kind in LRE_KINDS])
        rels, qualification = qualifying_relations(rels, config.per_answer, rule, config.split_seed)
        if len(rels) < min_relations:
            raise StudyConfigError(
                [
                    f"{len(rels)} relation(s) support the relabelling design (needs {min_relations}): "
                    f"{'; '.join(f'{r.relation}: {r.reason}' for r in qualification.itertuples() if not r.qualifies)}"
                ]
            )
        study_labels = labels or REAL_LABELS
    study = Study(
        handle,
        rels,
        out,
        config,
        labels=study_labels,
        subject_frequency=frequency,
        frequency_source=source,
        progress=progress,
        trained_tokens=trained,
    )
    return study, qualification


def main_finetune_specs(model, names: Sequence[str], seeds: Sequence[int], config: StudyConfig | None = None):
    """The study's main fine-tunes of ``names`` (main category, first label seed) on ``model``,
    one per relation with its own fine-tuning seed: ``(model, [FinetuneSpec], {relation: held-out
    prompts})``, for running fine-tunes outside a study (benchmarks, grouped-training checks)."""
    config = config or StudyConfig(label_seeds=(0,), finetune_seeds=(0,), other_categories=())
    study, _ = make_study(model, list(names), tempfile.mkdtemp(), config, "nnsight", False, min_relations=1)
    template = config.finetune.template
    specs, heldout = [], {}
    for name, seed in zip(names, seeds):
        r = study.relations[name]
        d = design_for(r, study.labels, config, config.category, 0)
        specs.append(
            FinetuneSpec(
                [template.format(r.subjects[i]) for i in d.finetune],
                [d.mapping[r.answers[i]] for i in d.finetune],
                d.labels,
                seed,
            )
        )
        heldout[name] = [template.format(r.subjects[i]) for i in d.heldout]
    return study.model, specs, heldout


def world_relations(world, relations: Sequence | None) -> list[Relation]:
    """The relations a study on a world model runs on, as given: a name is the world's relation of
    that name; a :class:`Relation` (or a relation file) is used with its own facts, unless they are
    exactly the world's (then it is the world's, with its properties). Never are a user's facts
    replaced by the world's."""
    valid = [r.name for r in world.spec.relations]
    if not relations:
        return from_world(world)
    names = [r for r in relations if isinstance(r, str) and Path(r).suffix != ".json" and not Path(r).exists()]
    unknown = [n for n in names if n not in valid]
    if unknown:
        raise StudyConfigError(
            [
                f"unknown relation {n!r}; nearest: {', '.join(difflib.get_close_matches(n, valid, 3, 0.4)) or '-'} "
                f"(the world's relations: {', '.join(valid)})"
                for n in unknown
            ]
        )
    out = []
    for r in relations:
        if isinstance(r, str) and r in names:
            out.append(from_world(world, [r])[0])
            continue
        given = [r] if isinstance(r, Relation) else load_relations([r])
        for g in given:
            if g.name in valid:
                (own,) = from_world(world, [g.name])
                same = (g.subjects, g.answers, [p.text for p in g.prompts()]) == (
                    own.subjects,
                    own.answers,
                    [p.text for p in own.prompts()],
                )
                out.append(own if same else g)
            else:
                out.append(g)
    return out


#: the LRE folders a study on a real model draws relations from (Hernandez et al. 2024)
LRE_KINDS = ("factual", "commonsense", "linguistic", "bias")


def real_model_config(**overrides) -> StudyConfig:
    """The study's configuration for a pretrained model on LRE relations: the same design,
    stopping rule and statistics as the world's, with the label categories of
    :data:`lab.study.labels.REAL_LABELS`, a fine-tuning budget for relations of tens to hundreds
    of subjects, a pretrained transformer's learning rates (resolved for the model,
    :data:`lab.study.finetune.PRETRAINED_RATES`: full 3e-4, since at the world's 1e-3 MiniLM's
    full fine-tunes diverged on 2 of 4 relations tried; LoRA 3e-3: at 5e-3 and 1e-2 every LoRA
    fine-tune diverged), and robustness over two label assignments, two fine-tuning seeds
    and one other label category (the world study has three, three and three; this keeps the
    MiniLM study within 20 minutes on 2 cores)."""
    return replace(
        StudyConfig(
            other_categories=("vehicles",),
            label_seeds=(0, 1),
            finetune_seeds=(0, 1),
            finetune_budget=(60, 150),
        ),
        **overrides,
    )


def default_config(model) -> StudyConfig:
    """The world study's configuration for the world model, :func:`real_model_config` for any other."""
    return StudyConfig() if is_world(model) else real_model_config()


def is_world(model) -> bool:
    return world_checkpoint_of(model) is not None
