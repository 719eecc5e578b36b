"""The generalization study: readability before fine-tuning vs generalization after it.

>>> from interp.study import run_study
>>> result = run_study("world", out="results/study")        # the main job, ~15 min on 2 cores
>>> result.summary["headline"]
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional, Sequence

from .design import Design, make_design, relabel, split
from .finetune import FinetuneConfig, finetune
from .study import Job, Study, StudyConfig, StudyResult


def run_study(model="world", relations: Optional[Sequence] = None, out: str | Path = "results/study",
              config: Optional[StudyConfig] = None, backend: str = "nnsight", progress: Optional[bool] = None,
              max_jobs: Optional[int] = None, executor=None, **overrides) -> StudyResult:
    """Run (or resume) the study.

    ``model``: ``"world"`` (or a world checkpoint directory) uses the world's relations, labels
    and exact subject frequencies; any other model spec needs ``relations`` (Relation objects or
    paths to relation JSON files, LRE or project format). ``overrides``: StudyConfig fields.
    ``executor``: where the fine-tunes run (``"serial"``, ``"ray"`` or an
    :class:`~interp.executors.Executor`); results are identical either way.
    """
    import interp
    from interp.relations import Relation, from_world, load_relations

    config = config or StudyConfig()
    if overrides:
        from dataclasses import replace

        config = replace(config, **overrides)
    handle = interp.load_model(model, backend=backend)
    labels = frequency = None
    source = "proxy: mean log-prob of subject tokens"
    if _is_world(model):
        from interp.world import load_world

        world = load_world(None if str(model) == "world" else model)
        names = [r if isinstance(r, str) else r.name for r in relations] if relations else None
        rels = from_world(world, names)
        labels = world.label_categories
        frequency = lambda rel, s: world.mentions(s, rel)  # noqa: E731
        source = "exact: corpus documents stating the fact (world)"
    else:
        if not relations:
            raise ValueError("a study on a model other than the world model needs relations (Relation objects or JSON paths)")
        rels = [r for r in relations if isinstance(r, Relation)]
        paths = [r for r in relations if not isinstance(r, Relation)]
        rels += load_relations(paths) if paths else []
    study = Study(handle, rels, out, config, labels=labels, subject_frequency=frequency, frequency_source=source, progress=progress)
    return study.run(max_jobs=max_jobs, executor=executor)


def _is_world(model) -> bool:
    if str(model) == "world":
        return True
    return isinstance(model, (str, Path)) and (Path(model) / "world_spec.json").exists()


__all__ = ["Design", "FinetuneConfig", "Job", "Study", "StudyConfig", "StudyResult", "finetune", "make_design",
           "relabel", "run_study", "split"]
