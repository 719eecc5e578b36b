"""``run_study``: one call from a model spec to a finished study folder (the main job)."""
from __future__ import annotations

import difflib
from dataclasses import fields, replace
from pathlib import Path
from typing import Optional, Sequence

import interp
from interp.relations import Relation, load_relations
from lab.world import from_world, load_world

from .study import Study, StudyConfig, StudyResult
from .validate import StudyConfigError


def run_study(model="world", relations: Optional[Sequence] = None, out: str | Path = "results/study",
              config: Optional[StudyConfig] = None, backend: str = interp.DEFAULT_BACKEND, progress: Optional[bool] = None,
              max_jobs: Optional[int] = None, executor=None, **overrides) -> StudyResult:
    """Run (or resume) the study.

    ``model``: ``"world"`` (or a world checkpoint directory) uses the world's relations, labels
    and exact subject frequencies; any other model spec needs ``relations`` (Relation objects or
    paths to relation JSON files, LRE or project format). ``overrides``: StudyConfig fields.
    ``executor``: where the fine-tunes run (``"serial"``, ``"ray"`` or an
    :class:`~lab.executors.Executor`); results are identical either way.
    """
    config = config or StudyConfig()
    if overrides:
        unknown = sorted(set(overrides) - {f.name for f in fields(StudyConfig)})
        if unknown:
            raise StudyConfigError([f"unknown StudyConfig field(s) {unknown}; valid: {', '.join(f.name for f in fields(StudyConfig))}"])
        config = replace(config, **overrides)
    if relations is not None and len(relations) == 0:
        raise StudyConfigError(["relations=[] names no relation; pass None for all of the world's relations, or name some"])
    handle = interp.load_model(model, backend=backend)
    labels = frequency = trained = None
    source = "proxy: mean log-prob of subject tokens"
    if _is_world(model):
        world = load_world(None if str(model) == "world" else model)
        names = [r if isinstance(r, str) else r.name for r in relations] if relations else None
        valid = [r.name for r in world.spec.relations]
        unknown = [n for n in names or [] if n not in valid]
        if unknown:
            raise StudyConfigError([f"unknown relation {n!r}; nearest: {', '.join(difflib.get_close_matches(n, valid, 3, 0.4)) or '-'} "
                                    f"(the world's relations: {', '.join(valid)})" for n in unknown])
        rels = from_world(world, names)
        labels = world.label_categories
        frequency = lambda rel, s: world.mentions(s, rel)  # noqa: E731
        source = "exact: corpus documents stating the fact (world)"
        words = sorted({w for doc in world.corpus() for w in doc.split()})
        trained = set(handle.tokenizer(" ".join(words), add_special_tokens=False)["input_ids"])
    else:
        if not relations:
            raise ValueError("a study on a model other than the world model needs relations (Relation objects or JSON paths)")
        rels = [r for r in relations if isinstance(r, Relation)]
        paths = [r for r in relations if not isinstance(r, Relation)]
        rels += load_relations(paths) if paths else []
    study = Study(handle, rels, out, config, labels=labels, subject_frequency=frequency, frequency_source=source,
                  progress=progress, trained_tokens=trained)
    return study.run(max_jobs=max_jobs, executor=executor)


def _is_world(model) -> bool:
    if str(model) == "world":
        return True
    return isinstance(model, (str, Path)) and (Path(model) / "world_spec.json").exists()
