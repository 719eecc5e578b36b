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

Everything is written to ``out_dir`` as it is computed: each stage's table and each fine-tune as
its own file (atomically), so a killed study restarts where it stopped and gives the same numbers.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from interp.models import Model, load_model
from interp.progress import progress_bar
from interp.relations import Relation, RelationError
from interp.results import write_json, write_table
from lab.executors import SerialExecutor, executor_for
from lab.world.vocab import LABELS
from probes import ProbeSweep
from probes.chance import chance_levels, expected_agreement, kappa
from probes.readability import best_layers, readability_by_layer

from .design import finetune_budget, make_design, per_answer
from .finetune import FinetuneConfig, finetune
from .summary import summarize
from .validate import validate_study


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
        return _digest(self.to_dict())

    def per_answer(self, relation: Relation) -> int:
        """Fine-tuning subjects per answer for ``relation`` (see :mod:`lab.study.design`)."""
        if self.n_finetune is not None:
            return self.n_finetune
        budget = finetune_budget(relation.name, *self.finetune_budget, seed=self.split_seed)
        counts = Counter(dict(zip(relation.subjects, relation.answers)).values())
        return per_answer(budget, len(counts), self.min_per_answer, cap=int(np.median(list(counts.values()))) // 2)


def _digest(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]


def relation_digest(r: Relation) -> str:
    """A hash of a relation's contents (subjects, answers, prompts), not just its name."""
    return _digest({"subjects": r.subjects, "answers": r.answers, "prompts": [p.text for p in r.prompts()]})


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

    def design(self, relation: Relation, category: str, label_seed: int):
        """The relation's relabelling and split; a label that is also one of the relation's answers
        (a colour relabelled with colours) is never used for it."""
        answers = {a.lower() for a in relation.answers}
        labels = tuple(w for w in self.labels[category] if w.lower() not in answers)
        return make_design(
            relation, labels, self.config.per_answer(relation), label_seed, self.config.split_seed, category
        )

    # stages ----------------------------------------------------------------------------------
    def _check_folder(self) -> None:
        """Refuse a folder that holds a different study: compared by content (model weights,
        each relation's subjects/answers/prompts, configuration), and say what differs."""
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / "runs").mkdir(exist_ok=True)
        meta = {
            "config": self.config.to_dict(),
            "model": self.model.name,
            "fingerprint": self.model.fingerprint(),
            "relations": {name: relation_digest(r) for name, r in sorted(self.relations.items())},
        }
        path = self.out / "study.json"
        if path.exists():
            old = json.loads(path.read_text())
            diffs = _differences(old, meta)
            if diffs:
                raise ValueError(
                    f"{self.out} holds a different study ({'; '.join(diffs)}); use a new output folder "
                    "(or delete this one) to start over"
                )
        else:
            write_json(meta, path)

    def _readability(self) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
        paths = [self.out / f for f in ("readability.csv", "readability_layers.csv", "probe_readout.csv")]
        if all(p.exists() for p in paths):
            ro = pd.read_csv(paths[2], dtype={"subject": str, "answer": str, "predicted": str}, keep_default_na=False)
            ro["top_answers"] = ro["top_answers"].map(json.loads)
            return pd.read_csv(paths[0]), pd.read_csv(paths[1]), ro
        # every answer ranked, so that k remain after the true answer and the answers the design
        # left out are removed (back-mapping)
        sweep = ProbeSweep(
            folds=self.config.folds,
            C=self.config.probe_C,
            top_k=self.config.top_k,
            readout_k=10_000,
            progress=self.progress,
        )
        table = sweep.run(self.model, self.relation_list, model_name=self.model.name)
        layers = readability_by_layer(table, sweep.readout_)
        best = best_layers(layers)
        ro = sweep.readout_
        ro = ro[ro.apply(lambda r: r["layer"] in (best[r["relation"]], self.fixed_layer), axis=1)].copy()
        ro["top_answers"] = ro["top_answers"].map(json.dumps)
        write_table(ro, paths[2])
        write_table(layers, paths[1])
        write_table(table, paths[0])
        ro["top_answers"] = ro["top_answers"].map(json.loads)
        return table, layers, ro

    def _pretrained(self) -> pd.DataFrame:
        path = self.out / "pretrained.csv"
        if path.exists():
            df = pd.read_csv(path, dtype={"subject": str, "answer": str, "model_answer": str}, keep_default_na=False)
            df["model_top_answers"] = df["model_top_answers"].map(json.loads)
            df["correct"] = df["correct"].map(
                lambda v: {"True": True, "False": False, "": np.nan}.get(v, v) if isinstance(v, str) else v
            )
            return df
        rows = []
        undefined = self.model.scoring.answers_undefined
        for r in progress_bar(
            list(self.relations.values()), desc="pretrained answers", unit="relations", progress=self.progress
        ):
            answers = r.answer_set
            freq = self._frequencies(r)
            if undefined:  # an encoder: no answer to read before fine-tuning (missing, not guessed)
                rows += [
                    {
                        "relation": r.name,
                        "subject": s,
                        "answer": a,
                        "model_answer": "",
                        "correct": None,
                        "model_top_answers": "null",
                        "subject_frequency": freq[i],
                    }
                    for i, (s, a) in enumerate(zip(r.subjects, r.answers))
                ]
                continue
            scores = self.model.logprobs([p.text for p in r.prompts()], answers)
            top = scores.argsort(-1, descending=True)  # every answer ranked (see _readability)
            for i, (s, a) in enumerate(zip(r.subjects, r.answers)):
                ranked = [answers[j] for j in top[i].tolist()]
                rows.append(
                    {
                        "relation": r.name,
                        "subject": s,
                        "answer": a,
                        "model_answer": ranked[0],
                        "correct": ranked[0] == a,
                        "model_top_answers": json.dumps(ranked),
                        "subject_frequency": freq[i],
                    }
                )
        df = pd.DataFrame(rows)
        write_table(df, path)
        df["model_top_answers"] = df["model_top_answers"].map(json.loads)
        return df

    def _frequencies(self, r: Relation) -> list[float]:
        if self.subject_frequency is not None:
            return [float(self.subject_frequency(r.name, s)) for s in r.subjects]
        # a proxy for real models, by model family (interp.scoring: a causal LM's mean log-probability
        # of the subject's tokens after its first; an encoder's word pieces per word)
        return [self.model.scoring.frequency(s) for s in r.subjects]

    def _run_job(self, job: Job, readout: pd.DataFrame, pretrained: pd.DataFrame, best_layer: int) -> dict:
        path = self.out / "runs" / f"{job.id}.json"
        if path.exists():
            return json.loads(path.read_text())
        r = self.relations[job.relation]
        base = {**asdict(job), "job": job.id}
        try:
            design = self.design(r, job.category, job.label_seed)
        except RelationError as err:
            if job.category == self.config.category:
                raise
            result = {
                **base,
                "status": "skipped",
                "reason": str(err),
            }  # documented: too few labels in a robustness category
            write_json(result, path)
            return result
        label_set = design.labels
        tmpl = self.config.finetune.template
        ft_prompts = [tmpl.format(r.subjects[i]) for i in design.finetune]
        ft_labels = [design.mapping[r.answers[i]] for i in design.finetune]
        tuned, info = finetune(
            self.model, ft_prompts, ft_labels, label_set, job.method, self.config.finetune, seed=job.finetune_seed
        )
        ho_prompts = [tmpl.format(r.subjects[i]) for i in design.heldout]
        scores = tuned.logprobs(ho_prompts, label_set)
        pred = [label_set[j] for j in scores.argmax(-1).tolist()]
        probe_top = {
            row.subject: row.top_answers
            for row in readout[(readout.relation == r.name) & (readout.layer == best_layer)].itertuples()
        }
        model_top = {
            row.subject: row.model_top_answers for row in pretrained[pretrained.relation == r.name].itertuples()
        }
        k, kept = self.config.top_k, set(design.mapping)
        preds, lists = [], []
        for i, p in zip(design.heldout, pred):
            s, a = r.subjects[i], r.answers[i]
            back = design.inverse[p]
            wrong = p != design.mapping[a]
            row = {
                "subject": s,
                "answer": a,
                "label": design.mapping[a],
                "predicted_label": p,
                "correct": not wrong,
                "backmapped_answer": back,
            }
            for who, ranking in (("probe", probe_top.get(s)), ("model", model_top.get(s))):
                # top-k among the design's wrong answers; no ranking (a subject the probe left out) is not a miss
                top = wrong_top(ranking, a, k, kept) if ranking is not None else None
                row[f"in_{who}_topk"] = (back in top) if (wrong and top is not None) else None
                row[f"{who}_slots"] = len(top) if top is not None else None
                if wrong:
                    lists.append((who, a, back, top))
            preds.append(row)
        truth = [q["label"] for q in preds]
        acc = float(np.mean([q["correct"] for q in preds]))
        levels = chance_levels(truth)
        result = {
            **base,
            "status": "done",
            "n_answers": len(label_set),
            "n_finetune_subjects": len(design.finetune),
            "n_heldout": len(design.heldout),
            "dropped_answers": design.dropped_answers,
            "mapping": design.mapping,
            "generalization": acc,
            "generalization_kappa": kappa(truth, pred),
            "chance_uniform": levels["uniform"],
            "chance_prior": levels["prior"],
            "chance_majority": levels["majority"],
            "chance_expected": expected_agreement(truth, pred),
            "full_batch": len(design.finetune) <= self.config.finetune.batch_size,
            **shuffled_backmap_rates(lists, seed=job.finetune_seed),
            **info,
            "predictions": preds,
        }
        write_json(result, path)
        del tuned
        return result

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
        ex = executor_for(executor)
        self._check_folder()
        write_json({"untrained_prompt_tokens": notes}, self.out / "warnings.json")
        readability, layers, readout = self._readability()
        pretrained = self._pretrained()
        best = best_layers(layers)
        jobs = self.jobs()
        todo = [j for j in jobs if not (self.out / "runs" / f"{j.id}.json").exists()]
        if max_jobs is not None:
            todo = todo[:max_jobs]
        if isinstance(ex, SerialExecutor):
            if ex.progress is None:
                ex.progress = self.progress
            ex.map(
                lambda job: self._run_job(job, readout, pretrained, best[job.relation]),
                todo,
                labels=[j.id for j in todo],
                desc="fine-tunes",
            )
        elif todo:
            if self.model.source is None:
                raise ValueError(
                    "a distributed study reloads the model in each worker: load it from a directory or "
                    "a name (interp.load_model(path)), not from an object in memory"
                )
            payloads = [
                RemoteJob(
                    self.model.source,
                    self.model.backend_name,
                    self.relations[j.relation],
                    self.out,
                    self.config,
                    self.labels,
                    j,
                    _rows_of(readout, j.relation, best[j.relation]),
                    pretrained[pretrained.relation == j.relation],
                    best[j.relation],
                )
                for j in todo
            ]
            ex.map(run_remote_job, payloads, labels=[j.id for j in todo], desc="fine-tunes")
        done = [j for j in jobs if (self.out / "runs" / f"{j.id}.json").exists()]
        if len(done) < len(jobs):
            return StudyResult(self.out, complete=False)
        results = [json.loads((self.out / "runs" / f"{j.id}.json").read_text()) for j in jobs]

        summarize(self, readability, layers, readout, pretrained, results, best, notes)
        return StudyResult(self.out, complete=True)


def shuffled_backmap_rates(lists: list, n_shuffles: int = 100, seed: int = 0) -> dict:
    """Expected back-mapping hit rates if the wrong labels' answers were shuffled among the
    relation's errors: a null that keeps how often each answer is back-mapped (the fine-tuned
    model's label preferences) and each list's popularity bias, but breaks the link to the subject.
    ``lists``: ``(who, true answer, back-mapped answer, top list or None)`` per error."""
    rng = np.random.default_rng(seed)
    out = {}
    for who in ("probe", "model"):
        rows = [(a, b, top) for w, a, b, top in lists if w == who and top is not None]
        if not rows:
            out[f"{who}_shuffled_rate"] = None
            continue
        backs = np.array([b for _, b, _ in rows], dtype=object)
        hits = []
        for _ in range(n_shuffles):
            perm = backs[rng.permutation(len(backs))]
            hits.append(np.mean([b in top for (_, _, top), b in zip(rows, perm)]))
        out[f"{who}_shuffled_rate"] = float(np.mean(hits))
    return out


def wrong_top(ranked: Sequence[str], answer: str, k: int, kept: set | None = None) -> list[str]:
    """The first ``k`` answers of a ranking with the true ``answer`` (and answers not in ``kept``)
    removed."""
    return [a for a in ranked if a != answer and (kept is None or a in kept)][:k]


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

    if os.environ.get("INTERP_CRASH_JOB") == rj.job.id:
        os._exit(1)
    key = (rj.source, rj.backend)
    if key not in _WORKER_MODELS:
        _WORKER_MODELS[key] = load_model(rj.source, backend=rj.backend)
    study = Study(_WORKER_MODELS[key], [rj.relation], rj.out, rj.config, labels=rj.labels, progress=False)
    return study._run_job(rj.job, rj.readout, rj.pretrained, rj.best_layer)
