"""The generalization study (Mehri & Schütze 2026): does knowledge that is linearly readable
before fine-tuning generalize after it?

For every relation:

1. **Readability**: a probe sweep on the *pretrained* model, from the subject's last-token state
   at every layer to the original answer (:class:`probes.ProbeSweep`, stratified k-fold, control
   task). Reported at the best layer (highest kappa) and at a fixed middle layer, raw and as
   Cohen's kappa of the cross-validated predictions (:mod:`probes.chance`: chance measured
   against the empirical answer distribution, so a probe that learns the prior scores 0).
2. **Pretrained accuracy** on the original relation: the model's top answer among the relation's
   answers (full-sequence scores, :mod:`interp.scoring`), and its own top-k answers per subject.
3. **Relabel and split** (:mod:`lab.study.design`): answers -> labels of a category; each
   relation's budget of fine-tuning subjects (drawn independently of its number of answers) is
   spread over its answers, the rest are held out.
4. **Fine-tune** on the new relation only (:mod:`lab.study.finetune`), full or LoRA.
5. **Generalization**: held-out accuracy of the new labels (top label among the relation's
   labels), raw and as Cohen's kappa.
6. **Statistics** across relations (:mod:`lab.study.stats`), headline on kappa: Pearson r with
   bootstrap CI and permutation p, Spearman, partial correlations controlling for the number of
   fine-tuning subjects, the number of answers, the chance level, pretrained accuracy and subject
   frequency (world: exact mention counts; real models: a proxy, the pretrained model's mean
   log-probability of the subject's tokens after the first), separately and jointly.
7. **Null calibration** (:mod:`lab.study.null`): the same statistics on simulated studies with
   no generalization beyond chance; their false-positive rates.
8. **Robustness**: the correlation for re-randomized label assignments, other fine-tuning seeds
   and other label categories; its spread; which relations a seed cannot change.
9. **Error back-mapping**: each wrong held-out label maps back to the (wrong) original answer it
   stands for; how often is that answer among the probe's top-k *wrong* answers for the subject
   (cross-validated read-out at the best layer), versus among the pretrained model's, each
   against a uniformly random wrong answer (:mod:`lab.study.backmap`)?

Every input is checked before the first forward pass (:mod:`lab.study.validate`).

The study is a composition of stages (:mod:`lab.stages`), run into ``out_dir`` by one runner:

=====================  ===========================================  ===============================================
stage                  reads                                        writes
=====================  ===========================================  ===============================================
claim                  model fingerprint, relations, configuration  ``study.json`` (or refuses the folder)
readability            model, relations                             ``readability*.csv``, ``probe_readout.*``
readability baselines  model, relations, baseline seeds             ``readability_baselines.*``
pretrained answers     model, relations                             ``pretrained.csv``, ``pretrained.parquet``
learning-rate check    model, first relation, configuration         ``lr_check_<method>.json`` (``lr_check=True``)
fine-tune (per job)    model, relation, configuration, job          ``runs/<job id>.json``
summary                the spec, every result above                 tables, ``summary.json``, report
=====================  ===========================================  ===============================================

Each result is written atomically as it is computed and reloaded instead of recomputed, so a
killed study restarts where it stopped and gives the same numbers; a deleted job file redoes just
that job.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import pandas as pd

from interp.models import Model
from interp.relations import Relation
from interp.results import write_json
from lab.stages import Runner, Task
from lab.world.vocab import LABELS
from probes.readability import best_layers

from .baselines import BASELINES, BaselineInputs
from .config import StudyConfig, StudySpec, summary_only_fields
from .design import Design
from .jobs import FINETUNE, FinetuneInputs, Job, shuffled_backmap_rates, wrong_top
from .lr_check import GRIDS, LR_CHECK, LrCheckInputs, with_checked_rates
from .readout import (
    NONLINEAR,
    PRETRAINED,
    READABILITY,
    NonlinearInputs,
    PretrainedInputs,
    Readability,
    ReadabilityInputs,
)
from .summary import write_summary
from .validate import validate_study

__all__ = [
    "Job",
    "Study",
    "StudyConfig",
    "StudyResult",
    "StudySpec",
    "relation_digest",
    "shuffled_backmap_rates",
    "wrong_top",
]


def relation_digest(r: Relation) -> str:
    """A hash of a relation's contents (subjects, answers, prompts), not just its name."""
    return r.content_digest()


class Study:
    """A configured generalization study over ``relations`` on ``model``; :meth:`run` executes it.

    ``labels``: label categories (name -> words). ``subject_frequency``: a function
    ``(relation, subject) -> frequency``; default: the model's log-probability proxy.
    ``trained_tokens``: token ids the model was trained on (the world model: its corpus); a
    fine-tuning prompt or label using any other token is warned about before any work.
    What the study is (model, relations, configuration, labels) is :attr:`spec`
    (:class:`lab.study.config.StudySpec`), which the checks and the summary read; its
    configuration has the learning rates resolved for the model
    (:meth:`~lab.study.finetune.FinetuneConfig.for_model`).
    """

    def __init__(
        self,
        model: Model,
        relations: Sequence[Relation],
        out_dir: str | Path,
        config: StudyConfig = StudyConfig(),
        labels: dict[str, Sequence[str]] | None = None,
        subject_frequency: Callable[[str, str], float] | None = None,
        frequency_source: str = "proxy",
        progress: bool | None = None,
        trained_tokens: set[int] | None = None,
    ):
        self.spec = StudySpec(
            model,
            tuple(relations),
            replace(config, finetune=config.finetune.for_model(model)),  # learning rates for this model
            {k: tuple(v) for k, v in (labels or LABELS).items()},
            frozenset(trained_tokens) if trained_tokens is not None else None,
            frequency_source if subject_frequency is not None else model.scoring.frequency_source,
        )
        self.out = Path(out_dir)
        self.subject_frequency = subject_frequency
        self.progress = progress

    # what the study is (its spec) ------------------------------------------------------------
    model = property(lambda self: self.spec.model)
    config = property(lambda self: self.spec.config)
    labels = property(lambda self: self.spec.labels)
    relation_list = property(lambda self: list(self.spec.relations))
    relations = property(lambda self: self.spec.by_name)
    fixed_layer = property(lambda self: self.spec.fixed_layer)

    def jobs(self) -> list[Job]:
        c = self.config
        main_l, main_f = c.label_seeds[0], c.finetune_seeds[0]
        specs = {(m, c.category, main_l, main_f) for m in c.methods}
        m0 = c.methods[0]
        specs |= {(m0, c.category, l, main_f) for l in c.label_seeds}
        specs |= {(m0, c.category, main_l, f) for f in c.finetune_seeds}
        specs |= {(m0, cat, main_l, main_f) for cat in c.other_categories}
        order = sorted(specs, key=lambda s: (s[0] != m0, s[1] != c.category, s[2], s[3], s[1], s[0]))
        return [Job(r, *s) for s in order for r in self.relations]

    def design(self, relation: Relation, category: str, label_seed: int) -> Design:
        """The relation's relabelling and split (:func:`lab.study.config.design_for`)."""
        return self.spec.design(relation, category, label_seed)

    # stages ----------------------------------------------------------------------------------
    def runner(self) -> Runner:
        """The study folder's runner, after refusing a folder that holds a different study
        (compared by content: model weights, each relation's subjects/answers/prompts,
        configuration; the error says what differs)."""
        runner = Runner(self.out, progress=self.progress)
        meta = {
            "config": self.config.to_dict(),
            "model": self.model.name,
            "fingerprint": self.model.fingerprint(),
            "relations": {r.name: relation_digest(r) for r in sorted(self.spec.relations, key=lambda r: r.name)},
        }
        runner.claim("study.json", meta, _differences, "study")
        (self.out / "runs").mkdir(exist_ok=True)
        return runner

    def readability(self, runner: Runner) -> Readability:
        """The probe sweep on the pretrained model (computed once, then read back)."""
        c = self.config
        inputs = ReadabilityInputs(
            self.model,
            self.spec.relations,
            c.folds,
            c.probe_C,
            c.top_k,
            self.fixed_layer,
            self.progress,
        )
        return runner.run(Task(READABILITY, inputs, "probe_readout.parquet"))

    def nonlinear(self, runner: Runner) -> pd.DataFrame | None:
        """Nonlinear decodability per relation and layer (:func:`lab.study.readout.nonlinear_readability`;
        computed once, then read back), or None when the configuration names no nonlinear probe."""
        c = self.config
        if not c.nonlinear_probes:
            return None
        inputs = NonlinearInputs(
            self.model, self.spec.relations, c.folds, c.probe_C, tuple(c.nonlinear_probes), self.progress
        )
        return runner.run(Task(NONLINEAR, inputs, "readability_nonlinear.parquet"))

    def baselines(self, runner: Runner) -> pd.DataFrame | None:
        """The readability baselines (:mod:`lab.study.baselines`; computed once, then read back),
        or None when the configuration turns them off."""
        c = self.config
        if not c.baselines:
            return None
        inputs = BaselineInputs(self.model, self.spec.relations, c.folds, c.probe_C, c.baseline_seeds, self.progress)
        return runner.run(Task(BASELINES, inputs, "readability_baselines.parquet"))

    def pretrained(self, runner: Runner) -> pd.DataFrame:
        """The pretrained model's answers and each subject's frequency (computed once, then read back)."""
        inputs = PretrainedInputs(self.model, self.spec.relations, self.subject_frequency, self.progress)
        return runner.run(Task(PRETRAINED, inputs, "pretrained.parquet"))

    def lr_check_task(self, method: str) -> Task:
        """The learning-rate check of ``method`` on the first relation (:mod:`lab.study.lr_check`),
        saved as ``lr_check_<method>.json``."""
        c = self.config
        inputs = LrCheckInputs(
            self.model, self.spec.relations[0], c, self.labels, method, GRIDS[method], c.min_train_kappa, self.progress
        )
        return Task(LR_CHECK, inputs, f"lr_check_{method}.json")

    def finetune_config(self, runner: Runner) -> tuple[StudyConfig, dict]:
        """The configuration every fine-tune of the study trains with, and the learning-rate
        checks it came from (empty without ``lr_check``): each method's rate from its check."""
        if not self.config.lr_check:
            return self.config, {}
        checks = {m: runner.run(self.lr_check_task(m)) for m in self.config.methods}
        return with_checked_rates(self.config, checks), checks

    def finetune_task(
        self,
        job: Job,
        readability: Readability,
        pretrained: pd.DataFrame,
        best_layer: int,
        config: StudyConfig | None = None,
    ) -> Task:
        """The fine-tune ``job`` as a task (:mod:`lab.study.jobs`), saved as ``runs/<job id>.json``;
        ``config``: the study's, unless the learning-rate check changed its rates."""
        inputs = FinetuneInputs(
            self.model,
            self.relations[job.relation],
            config or self.config,
            self.labels,
            job,
            _rows_of(readability.readout, job.relation, best_layer),
            pretrained[pretrained.relation == job.relation],
            best_layer,
        )
        return Task(FINETUNE, inputs, f"runs/{job.id}.json")

    # the whole study ---------------------------------------------------------------------------
    def validate(self) -> list[str]:
        """Check every input before any work (raises :class:`StudyConfigError` listing all
        problems); returns warnings (e.g. prompt tokens the model was never trained on)."""
        return validate_study(self.spec)

    def run(self, max_jobs: int | None = None, executor=None) -> StudyResult:
        """Run (or resume) the study; ``max_jobs`` stops after that many new fine-tunes (for
        budgeting, and to test resumption). ``executor``: where the fine-tunes run
        (:mod:`lab.executors`: ``"serial"`` by default, ``"ray"`` or an Executor)."""
        notes = self.validate()
        runner = self.runner()
        write_json({"untrained_prompt_tokens": notes}, self.out / "warnings.json")
        read = self.readability(runner)
        nonlinear = self.nonlinear(runner)
        if nonlinear is not None:  # beside the linear kappas, per relation and layer
            read = replace(read, layers=read.layers.merge(nonlinear, on=["relation", "layer"], how="left"))
        baselines = self.baselines(runner)
        pretrained = self.pretrained(runner)
        best = best_layers(read.layers)
        config, checks = self.finetune_config(runner)
        spec = replace(self.spec, config=config)
        jobs = self.jobs()
        tasks = [self.finetune_task(j, read, pretrained, best[j.relation], spec.config) for j in jobs]
        results = runner.map(tasks, executor=executor, desc="fine-tunes", labels=[j.id for j in jobs], limit=max_jobs)
        if any(r is None for r in results):
            return StudyResult(self.out, complete=False)
        write_summary(spec, self.out, read, pretrained, results, best, notes, lr_check=checks, baselines=baselines)
        return StudyResult(self.out, complete=True)


def _differences(old: dict, new: dict) -> list[str]:
    out = []
    if old.get("fingerprint") != new["fingerprint"] or old.get("model") != new["model"]:
        out.append(
            f"model {old.get('model')!r} (weights {old.get('fingerprint')}) "
            f"vs {new['model']!r} (weights {new['fingerprint']})"
        )
    oc, nc = old.get("config") or {}, new["config"]
    skip = summary_only_fields()  # the summary is recomputed with the new values; nothing is refitted
    keys = sorted(k for k in set(oc) | set(nc) if oc.get(k) != nc.get(k) and k not in skip)
    if keys:
        out.append("configuration: " + ", ".join(f"{k} {oc.get(k)!r} -> {nc.get(k)!r}" for k in keys))
    orel, nrel = old.get("relations") or {}, new["relations"]
    if isinstance(orel, list):  # a folder written before relation contents were hashed
        orel = {name: None for name in orel}
    if orel != nrel:
        added, removed = sorted(set(nrel) - set(orel)), sorted(set(orel) - set(nrel))
        changed = sorted(k for k in set(orel) & set(nrel) if orel[k] != nrel[k])
        parts = (
            ([f"added {added}"] if added else [])
            + ([f"removed {removed}"] if removed else [])
            + ([f"contents changed: {changed}"] if changed else [])
        )
        out.append("relations " + ", ".join(parts))
    return out


@dataclass
class StudyResult:
    out: Path
    complete: bool

    def table(self, name: str) -> pd.DataFrame:
        return pd.read_csv(self.out / f"{name}.csv")

    @property
    def summary(self) -> dict:
        return json.loads((self.out / "summary.json").read_text())


def _rows_of(readout: pd.DataFrame, relation: str, layer: int) -> pd.DataFrame:
    return readout[(readout.relation == relation) & (readout.layer == layer)]
