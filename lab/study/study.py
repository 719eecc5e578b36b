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

====================  ==========================================  ===================================
stage                 reads                                       writes
====================  ==========================================  ===================================
claim                 model fingerprint, relations, configuration ``study.json`` (or refuses the folder)
readability           model, relations                            ``readability*.csv``, ``probe_readout.*``
pretrained answers    model, relations, subject frequencies       ``pretrained.csv``, ``pretrained.parquet``
fine-tune (per job)   model, relation, configuration, job         ``runs/<job id>.json``
summary               every result above                          tables, ``summary.json``, report
====================  ==========================================  ===================================

Each result is written atomically as it is computed and reloaded instead of recomputed, so a
killed study restarts where it stopped and gives the same numbers; a deleted job file redoes just
that job.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from interp.models import Model
from interp.relations import Relation
from interp.results import write_json
from lab.stages import Runner, Task, digest
from lab.world.vocab import LABELS
from probes.readability import best_layers

from .design import Design, finetune_budget, per_answer
from .finetune import FinetuneConfig
from .jobs import FINETUNE, FinetuneJob, Job, design_for, shuffled_backmap_rates, wrong_top
from .readout import PRETRAINED, READABILITY, PretrainedInputs, Readability, ReadabilityInputs
from .summary import summarize
from .validate import validate_study

__all__ = ["Job", "Study", "StudyConfig", "StudyResult", "relation_digest", "shuffled_backmap_rates", "wrong_top"]


@dataclass(frozen=True)
class StudyConfig:
    """Hyperparameters of a study (checked by :func:`lab.study.validate.validate_study`).

    ``finetune_budget``: range of each relation's number of fine-tuning subjects (drawn per
    relation, independent of its answers); ``n_finetune``: instead, a fixed number per answer
    (then the number of fine-tuning subjects is ``n_finetune x #answers``, the same variable as
    the number of answers). The default range, 150-300 of a world relation's 1,000 subjects, gives
    5-10 per answer to a 30-answer relation; with 40-120 (the previous default) many answers had
    2-3, too few for even a linear probe on the same subjects to generalize (the ablation row
    "budget 40-120" measures it). ``n_null``: simulated null studies for the calibration table.
    """

    category: str = "animals"
    other_categories: tuple[str, ...] = ("colours", "fruits", "instruments")
    label_seeds: tuple[int, ...] = (0, 1, 2)
    finetune_seeds: tuple[int, ...] = (0, 1, 2)
    methods: tuple[str, ...] = ("full", "lora")
    n_finetune: int | None = None
    finetune_budget: tuple[int, int] = (150, 300)
    min_per_answer: int = 2
    split_seed: int = 0
    folds: int = 5
    probe_C: float = 1.0
    fixed_layer: int | None = None  # default: n_layers // 2
    top_k: int = 3
    n_boot: int = 2000
    n_perm: int = 2000
    n_null: int = 2000
    finetune: FinetuneConfig = field(default_factory=FinetuneConfig)

    def to_dict(self) -> dict:
        return json.loads(json.dumps(asdict(self)))

    def digest(self) -> str:
        return digest(self.to_dict())

    def per_answer(self, relation: Relation) -> int:
        """Fine-tuning subjects per answer for ``relation`` (see :mod:`lab.study.design`)."""
        if self.n_finetune is not None:
            return self.n_finetune
        budget = finetune_budget(relation.name, *self.finetune_budget, seed=self.split_seed)
        counts = Counter(dict(zip(relation.subjects, relation.answers)).values())
        return per_answer(budget, len(counts), self.min_per_answer, cap=int(np.median(list(counts.values()))) // 2)


def relation_digest(r: Relation) -> str:
    """A hash of a relation's contents (subjects, answers, prompts), not just its name."""
    return r.content_digest()


class Study:
    """A configured generalization study over ``relations`` on ``model``; :meth:`run` executes it.

    ``labels``: label categories (name -> words). ``subject_frequency``: a function
    ``(relation, subject) -> frequency``; default: the model's log-probability proxy.
    ``trained_tokens``: token ids the model was trained on (the world model: its corpus); a
    fine-tuning prompt or label using any other token is warned about before any work.
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
        self.model = model
        self.relations = {r.name: r for r in relations}
        self.relation_list = list(relations)
        self.out = Path(out_dir)
        self.config = config

        self.labels = {k: tuple(v) for k, v in (labels or LABELS).items()}
        self.subject_frequency = subject_frequency
        self.frequency_source = frequency_source if subject_frequency is not None else model.scoring.frequency_source
        self.progress = progress
        self.trained_tokens = trained_tokens

    @property
    def fixed_layer(self) -> int:
        return self.config.fixed_layer if self.config.fixed_layer is not None else self.model.n_layers // 2

    # jobs ------------------------------------------------------------------------------------
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
        """The relation's relabelling and split (:func:`lab.study.jobs.design_for`)."""
        return design_for(relation, self.labels, self.config, category, label_seed)

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
            "relations": {name: relation_digest(r) for name, r in sorted(self.relations.items())},
        }
        runner.claim("study.json", meta, _differences, "study")
        (self.out / "runs").mkdir(exist_ok=True)
        return runner

    def readability(self, runner: Runner) -> Readability:
        """The probe sweep on the pretrained model (computed once, then read back)."""
        c = self.config
        inputs = ReadabilityInputs(
            self.model, tuple(self.relation_list), c.folds, c.probe_C, c.top_k, self.fixed_layer, self.progress
        )
        return runner.run(Task(READABILITY, inputs, "probe_readout.parquet"))

    def pretrained(self, runner: Runner) -> pd.DataFrame:
        """The pretrained model's answers and each subject's frequency (computed once, then read back)."""
        frequencies = {r.name: tuple(self._frequencies(r)) for r in self.relation_list}
        inputs = PretrainedInputs(self.model, tuple(self.relation_list), frequencies, self.progress)
        return runner.run(Task(PRETRAINED, inputs, "pretrained.parquet"))

    def _frequencies(self, r: Relation) -> list[float]:
        if self.subject_frequency is not None:
            return [float(self.subject_frequency(r.name, s)) for s in r.subjects]
        # a proxy for real models, by model family (interp.scoring: a causal LM's mean log-probability
        # of the subject's tokens after its first; an encoder's word pieces per word)
        return [self.model.scoring.frequency(s) for s in r.subjects]

    def finetune_task(self, job: Job, readability: Readability, pretrained: pd.DataFrame, best_layer: int) -> Task:
        """The fine-tune ``job`` as a task (:mod:`lab.study.jobs`), saved as ``runs/<job id>.json``."""
        inputs = FinetuneJob(
            self.model,
            self.relations[job.relation],
            self.config,
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
        return validate_study(self)

    def run(self, max_jobs: int | None = None, executor=None) -> StudyResult:
        """Run (or resume) the study; ``max_jobs`` stops after that many new fine-tunes (for
        budgeting, and to test resumption). ``executor``: where the fine-tunes run
        (:mod:`lab.executors`: ``"serial"`` by default, ``"ray"`` or an Executor)."""
        notes = self.validate()
        runner = self.runner()
        write_json({"untrained_prompt_tokens": notes}, self.out / "warnings.json")
        read = self.readability(runner)
        pretrained = self.pretrained(runner)
        best = best_layers(read.layers)
        jobs = self.jobs()
        tasks = [self.finetune_task(j, read, pretrained, best[j.relation]) for j in jobs]
        results = runner.map(tasks, executor=executor, desc="fine-tunes", labels=[j.id for j in jobs], limit=max_jobs)
        if any(r is None for r in results):
            return StudyResult(self.out, complete=False)
        summarize(self, read.table, read.layers, read.readout, pretrained, results, best, notes)
        return StudyResult(self.out, complete=True)


def _differences(old: dict, new: dict) -> list[str]:
    out = []
    if old.get("fingerprint") != new["fingerprint"] or old.get("model") != new["model"]:
        out.append(
            f"model {old.get('model')!r} (weights {old.get('fingerprint')}) "
            f"vs {new['model']!r} (weights {new['fingerprint']})"
        )
    if old.get("config") != new["config"]:
        oc, nc = old.get("config") or {}, new["config"]
        keys = sorted(k for k in set(oc) | set(nc) if oc.get(k) != nc.get(k))
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
