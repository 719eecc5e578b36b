"""The generalization study (Mehri & Schütze 2026): does knowledge that is linearly readable
before fine-tuning generalize after it?

For every relation:

1. **Readability**: a probe sweep on the *pretrained* model, from the subject's last-token state
   at every layer to the original answer (:class:`probes.ProbeSweep`, stratified k-fold, control
   task). Reported at the best layer and at a fixed middle layer, raw and chance-corrected
   (``(acc - chance) / (1 - chance)``, chance = 1 / #answers).
2. **Pretrained accuracy** on the original relation: the model's top answer among the relation's
   answers (full-sequence scores, :mod:`interp.scoring`), and its own top-k answers per subject.
3. **Relabel and split** (:mod:`interp.study.design`): answers -> labels of a category; per answer
   ``n_finetune`` subjects are fine-tuned on, the rest held out.
4. **Fine-tune** on the new relation only (:mod:`interp.study.finetune`), full or LoRA.
5. **Generalization**: held-out accuracy of the new labels (top label among the relation's
   labels), raw and chance-corrected.
6. **Statistics** across relations (:mod:`interp.study.stats`): Pearson r with bootstrap CI and
   permutation p, Spearman, partial correlations controlling for the number of fine-tuning
   subjects, the number of answers, pretrained accuracy and subject frequency (world: exact
   mention counts; real models: a proxy, the pretrained model's mean log-probability of the
   subject's tokens after the first), separately and jointly.
7. **Robustness**: the correlation for re-randomized label assignments, other fine-tuning seeds
   and other label categories; its spread.
8. **Error back-mapping**: each wrong held-out label maps back to the original answer it stands
   for; how often is that answer among the probe's top-k answers for the subject (cross-validated
   read-out at the best layer), versus among the pretrained model's own top-k?

Everything is written to ``out_dir`` as it is computed: each stage's table and each fine-tune as
its own file (atomically), so a killed study restarts where it stopped and gives the same numbers.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Optional, Sequence

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

from ..models import Model
from ..relations import Relation, RelationError
from ..scoring import candidate_logprobs
from ..store import atomic_write_bytes
from .design import make_design
from .finetune import FinetuneConfig, finetune


@dataclass(frozen=True)
class StudyConfig:
    category: str = "animals"
    other_categories: tuple[str, ...] = ("colours", "fruits", "instruments")
    label_seeds: tuple[int, ...] = (0, 1, 2)
    finetune_seeds: tuple[int, ...] = (0, 1, 2)
    methods: tuple[str, ...] = ("full", "lora")
    n_finetune: int = 5
    split_seed: int = 0
    folds: int = 5
    probe_C: float = 1.0
    fixed_layer: Optional[int] = None  # default: n_layers // 2
    top_k: int = 3
    n_boot: int = 2000
    n_perm: int = 2000
    finetune: FinetuneConfig = field(default_factory=FinetuneConfig)

    def to_dict(self) -> dict:
        return json.loads(json.dumps(asdict(self)))

    def digest(self) -> str:
        return hashlib.sha256(json.dumps(self.to_dict(), sort_keys=True).encode()).hexdigest()[:12]


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


def _write_csv(df: pd.DataFrame, path: Path) -> None:
    atomic_write_bytes(path, df.to_csv(index=False).encode())


def _write_json(obj, path: Path) -> None:
    atomic_write_bytes(path, json.dumps(obj, indent=1, default=_json_default).encode())


def _json_default(o):
    if isinstance(o, (np.integer,)):
        return int(o)
    if isinstance(o, (np.floating,)):
        return float(o)
    if isinstance(o, np.ndarray):
        return o.tolist()
    raise TypeError(type(o))


class Study:
    """A configured generalization study over ``relations`` on ``model``; :meth:`run` executes it.

    ``labels``: label categories (name -> words). ``subject_frequency``: a function
    ``(relation, subject) -> frequency``; default: the model's log-probability proxy.
    """

    def __init__(self, model: Model, relations: Sequence[Relation], out_dir: str | Path,
                 config: StudyConfig = StudyConfig(), labels: Optional[dict[str, Sequence[str]]] = None,
                 subject_frequency: Optional[Callable[[str, str], float]] = None, frequency_source: str = "proxy",
                 progress: Optional[bool] = None):
        if not relations:
            raise ValueError("a study needs at least one relation")
        self.model = model
        self.relations = {r.name: r for r in relations}
        self.out = Path(out_dir)
        self.config = config
        from ..world.vocab import LABELS

        self.labels = {k: tuple(v) for k, v in (labels or LABELS).items()}
        if config.category not in self.labels:
            raise ValueError(f"unknown label category {config.category!r}; have {', '.join(self.labels)}")
        self.subject_frequency = subject_frequency
        self.frequency_source = frequency_source if subject_frequency is not None else "proxy: mean log-prob of subject tokens"
        self.progress = progress
        module = model.hf_model
        if module is None:
            raise ValueError("the study fine-tunes a HuggingFace module; this model handle has none")
        self.module = module
        self.fixed_layer = config.fixed_layer if config.fixed_layer is not None else model.n_layers // 2

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

    # stages ----------------------------------------------------------------------------------
    def _check_folder(self) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / "runs").mkdir(exist_ok=True)
        meta = {"config": self.config.to_dict(), "model": self.model.name, "fingerprint": self.model.fingerprint(),
                "relations": sorted(self.relations)}
        path = self.out / "study.json"
        if path.exists():
            old = json.loads(path.read_text())
            if old != meta:
                raise ValueError(f"{self.out} holds a study with a different model, relations or configuration; "
                                 "use a new output folder (or delete this one) to start over")
        else:
            _write_json(meta, path)

    def _readability(self) -> tuple[pd.DataFrame, pd.DataFrame]:
        from probes import ProbeSweep

        path, ro_path = self.out / "readability.csv", self.out / "probe_readout.csv"
        if path.exists() and ro_path.exists():
            ro = pd.read_csv(ro_path)
            ro["top_answers"] = ro["top_answers"].map(json.loads)
            return pd.read_csv(path), ro
        sweep = ProbeSweep(folds=self.config.folds, C=self.config.probe_C, top_k=self.config.top_k, progress=self.progress)
        table = sweep.run(self.model, list(self.relations.values()), model_name=self.model.name)
        best = self._best_layers(table)
        ro = sweep.readout_
        ro = ro[ro.apply(lambda r: r["layer"] in (best[r["relation"]], self.fixed_layer), axis=1)].copy()
        ro["top_answers"] = ro["top_answers"].map(json.dumps)
        _write_csv(ro, ro_path)
        _write_csv(table, path)
        ro["top_answers"] = ro["top_answers"].map(json.loads)
        return table, ro

    @staticmethod
    def _best_layers(table: pd.DataFrame) -> dict[str, int]:
        mean = table.groupby(["relation", "layer"]).accuracy.mean()
        return {rel: int(mean[rel].idxmax()) for rel in table.relation.unique()}

    def _pretrained(self) -> pd.DataFrame:
        path = self.out / "pretrained.csv"
        if path.exists():
            df = pd.read_csv(path)
            df["model_top_answers"] = df["model_top_answers"].map(json.loads)
            return df
        rows = []
        for r in tqdm(self.relations.values(), desc="pretrained answers", disable=self._quiet()):
            answers = r.answer_set
            scores = candidate_logprobs(self.module, self.model.tokenizer, [p.text for p in r.prompts()], answers,
                                        pad_id=self.model.pad_token_id)
            k = min(self.config.top_k, len(answers))
            top = scores.topk(k, -1).indices
            freq = self._frequencies(r)
            for i, (s, a) in enumerate(zip(r.subjects, r.answers)):
                ranked = [answers[j] for j in top[i].tolist()]
                rows.append({"relation": r.name, "subject": s, "answer": a, "model_answer": ranked[0],
                             "correct": ranked[0] == a, "model_top_answers": json.dumps(ranked), "subject_frequency": freq[i]})
        df = pd.DataFrame(rows)
        _write_csv(df, path)
        df["model_top_answers"] = df["model_top_answers"].map(json.loads)
        return df

    def _frequencies(self, r: Relation) -> list[float]:
        if self.subject_frequency is not None:
            return [float(self.subject_frequency(r.name, s)) for s in r.subjects]
        # proxy for real models: mean log-probability of the subject's tokens after its first
        tok = self.model.tokenizer
        out = []
        with torch.no_grad():
            for s in r.subjects:
                ids = tok(s)["input_ids"]
                if len(ids) < 2:
                    out.append(0.0)
                    continue
                logits = self.module(input_ids=torch.tensor([ids]).to(self.model.device)).logits[0].float()
                logp = torch.log_softmax(logits[:-1], -1).gather(1, torch.tensor(ids[1:])[:, None].to(logits.device))
                out.append(float(logp.mean()))
        return out

    def _run_job(self, job: Job, readout: pd.DataFrame, pretrained: pd.DataFrame, best_layer: int) -> dict:
        path = self.out / "runs" / f"{job.id}.json"
        if path.exists():
            return json.loads(path.read_text())
        r = self.relations[job.relation]
        labels = self.labels[job.category]
        base = {**asdict(job), "job": job.id}
        try:
            design = make_design(r, labels, self.config.n_finetune, job.label_seed, self.config.split_seed, job.category)
        except RelationError as err:
            if job.category == self.config.category:
                raise
            result = {**base, "status": "skipped", "reason": str(err)}  # documented: too few labels in a robustness category
            _write_json(result, path)
            return result
        label_set = design.labels
        tmpl = self.config.finetune.template
        ft_prompts = [tmpl.format(r.subjects[i]) for i in design.finetune]
        ft_labels = [design.mapping[r.answers[i]] for i in design.finetune]
        tuned, info = finetune(self.module, self.model.tokenizer, ft_prompts, ft_labels, label_set, job.method,
                               self.config.finetune, seed=job.finetune_seed, pad_id=self.model.pad_token_id)
        ho_prompts = [tmpl.format(r.subjects[i]) for i in design.heldout]
        scores = candidate_logprobs(tuned, self.model.tokenizer, ho_prompts, label_set, pad_id=self.model.pad_token_id)
        pred = [label_set[j] for j in scores.argmax(-1).tolist()]
        probe_top = {row.subject: row.top_answers for row in readout[(readout.relation == r.name) & (readout.layer == best_layer)].itertuples()}
        model_top = {row.subject: row.model_top_answers for row in pretrained[pretrained.relation == r.name].itertuples()}
        preds = []
        for i, p in zip(design.heldout, pred):
            s, a = r.subjects[i], r.answers[i]
            back = design.inverse[p]
            wrong = p != design.mapping[a]
            preds.append({"subject": s, "answer": a, "label": design.mapping[a], "predicted_label": p, "correct": not wrong,
                          "backmapped_answer": back,
                          "in_probe_topk": (back in probe_top.get(s, [])) if wrong else None,
                          "in_model_topk": (back in model_top.get(s, [])) if wrong else None})
        acc = float(np.mean([q["correct"] for q in preds]))
        chance = 1.0 / len(label_set)
        result = {**base, "status": "done", "n_answers": len(label_set), "n_finetune_subjects": len(design.finetune),
                  "n_heldout": len(design.heldout), "dropped_answers": design.dropped_answers, "mapping": design.mapping,
                  "generalization": acc, "chance": chance, "generalization_cc": (acc - chance) / (1 - chance),
                  **info, "predictions": preds}
        _write_json(result, path)
        del tuned
        return result

    def _quiet(self):
        return None if self.progress is None else not self.progress

    # the whole study ---------------------------------------------------------------------------
    def run(self, max_jobs: Optional[int] = None, executor=None) -> "StudyResult":
        """Run (or resume) the study; ``max_jobs`` stops after that many new fine-tunes (for
        budgeting, and to test resumption). ``executor``: where the fine-tunes run
        (:mod:`interp.executors`: ``"serial"`` by default, ``"ray"`` or an Executor)."""
        from ..executors import SerialExecutor, executor_for

        self._check_folder()
        readability, readout = self._readability()
        pretrained = self._pretrained()
        best = self._best_layers(readability)
        jobs = self.jobs()
        todo = [j for j in jobs if not (self.out / "runs" / f"{j.id}.json").exists()]
        if max_jobs is not None:
            todo = todo[:max_jobs]
        ex = executor_for(executor)
        if isinstance(ex, SerialExecutor):
            if ex.progress is None:
                ex.progress = self.progress
            ex.map(lambda job: self._run_job(job, readout, pretrained, best[job.relation]), todo,
                   labels=[j.id for j in todo], desc="fine-tunes")
        elif todo:
            if self.model.source is None:
                raise ValueError("a distributed study reloads the model in each worker: load it from a directory or "
                                 "a name (interp.load_model(path)), not from an object in memory")
            payloads = [RemoteJob(self.model.source, self.model.backend_name, self.relations[j.relation], self.out,
                                  self.config, self.labels, j, _rows_of(readout, j.relation, best[j.relation]),
                                  pretrained[pretrained.relation == j.relation], best[j.relation]) for j in todo]
            ex.map(run_remote_job, payloads, labels=[j.id for j in todo], desc="fine-tunes")
        done = [j for j in jobs if (self.out / "runs" / f"{j.id}.json").exists()]
        if len(done) < len(jobs):
            return StudyResult(self.out, complete=False)
        results = [json.loads((self.out / "runs" / f"{j.id}.json").read_text()) for j in jobs]
        from .summary import summarize

        summarize(self, readability, readout, pretrained, results, best)
        return StudyResult(self.out, complete=True)


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


@dataclass
class RemoteJob:
    """Everything a worker needs to run one fine-tune of a study (picklable)."""

    source: str
    backend: str
    relation: Relation
    out: Path
    config: StudyConfig
    labels: dict
    job: Job
    readout: pd.DataFrame
    pretrained: pd.DataFrame
    best_layer: int


_WORKER_MODELS: dict = {}


def run_remote_job(rj: RemoteJob) -> dict:
    """Run one study job in a worker (the model is loaded once per worker process).

    ``INTERP_CRASH_JOB=<job id>`` in a worker's environment makes that job kill its worker
    process (fault injection for testing recovery)."""
    import os

    from ..models import load_model

    if os.environ.get("INTERP_CRASH_JOB") == rj.job.id:
        os._exit(1)
    key = (rj.source, rj.backend)
    if key not in _WORKER_MODELS:
        _WORKER_MODELS[key] = load_model(rj.source, backend=rj.backend)
    study = Study(_WORKER_MODELS[key], [rj.relation], rj.out, rj.config, labels=rj.labels, progress=False)
    return study._run_job(rj.job, rj.readout, rj.pretrained, rj.best_layer)
