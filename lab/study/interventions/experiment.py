"""The interventions as one experiment: per relation, set up -> erasure arms -> steering, then
the summary across relations (the protocol: :mod:`lab.study.interventions`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import pandas as pd

import interp
from interp.progress import progress_bar
from interp.results import write_json, write_table
from lab.stages import Task
from probes.readability import best_layers

from ..config import StudyConfig
from ..run import default_config, make_study
from ..validate import validate_study
from . import arms
from .arms import ARM, ArmInputs, arm_path, erased_recall, erasure_rows, relation_seed
from .report import relations_summary, write_report
from .steering import STEERING, SteeringInputs, control_relation, steering_row


@dataclass(frozen=True)
class InterventionConfig:
    """``method``: the fine-tuning method of every arm; ``n_random``: random-subspace erasures and
    random steering directions per relation; ``steer_scale``: the steering vector's norm in units
    of the median distance between class means; ``n_boot``: bootstrap resamples of each CI;
    ``bottleneck``: add the bottleneck arms (the same erasers at the input embeddings,
    :mod:`.arms`); ``all_tokens``: add the all-token arms (erasers at every subject token of every
    site a later token reads, :mod:`.arms`); ``layer``: the arms at the most readable layer (the
    layer and its erasers are still found: steering acts there, recall is measured with them)."""

    method: str = "full"
    n_random: int = 3
    steer_scale: float = 1.0
    n_boot: int = 2000
    folds: int = 5
    seed: int = 0
    bottleneck: bool = True
    all_tokens: bool = True
    layer: bool = True

    def to_dict(self) -> dict:
        return asdict(self)


class Interventions:
    """Erasure and steering on ``model`` over the relations a study of it would use (see
    :mod:`lab.study.interventions`). ``study_config``: the study's design and fine-tuning settings
    (default: the study's own for this model); ``relations`` (and ``labels`` for a real model): as
    :func:`lab.study.run_study` takes them."""

    def __init__(
        self,
        model="world",
        relations: Sequence | None = None,
        out: str | Path = "results/interventions",
        config: InterventionConfig = InterventionConfig(),
        study_config: StudyConfig | None = None,
        backend: str = interp.DEFAULT_BACKEND,
        progress: bool | None = None,
        labels: dict | None = None,
    ):
        self.out = Path(out)
        self.config = config
        self.progress = progress
        self.study, self.qualification = make_study(
            model,
            relations,
            self.out,
            # the best layer is chosen by linear readability; the nonlinear probes would only add time
            study_config or replace(default_config(model), nonlinear_probes=()),
            backend,
            progress,
            labels=labels,
            min_relations=1,
        )
        self.model = self.study.model

    def run(self) -> pd.DataFrame:
        """Run (or resume) both interventions on every relation; returns the per-relation table."""
        if self.config.method not in ("full", "lora"):
            raise ValueError(f"unknown fine-tuning method {self.config.method!r}; use 'full' or 'lora'")
        if self.model.n_layers < 2:
            raise ValueError(
                "an intervention at the subject must act before the last block (whose output at the subject "
                "reaches no other token): the model needs at least 2 layers"
            )
        validate_study(self.study.spec, min_relations=1)  # one relation can be intervened on; correlations need 3
        runner = self.study.runner()  # the same model, relations and study configuration, or refuse
        runner.claim("interventions_config.json", self.config.to_dict(), _differences, "interventions run")
        if self.qualification is not None:
            write_table(self.qualification, self.out / "qualification.csv")
        layers = self.study.readability(runner).layers
        sc, _ = self.study.finetune_config(runner)  # the study's rates (its learning-rate checks, if any)
        best = best_layers(layers)
        kap = layers.set_index(["relation", "layer"]).kappa
        rows, arm_rows, steer_rows = [], [], []
        relations = list(self.study.relations.values())
        for r in progress_bar(relations, desc="interventions", unit="relations", progress=self.progress):
            row, a, s = self.relation(runner, r, sc)
            row["readability_kappa"] = float(kap[(r.name, best[r.name])])
            rows.append(row)
            arm_rows += a
            steer_rows += s
        table = pd.DataFrame(rows)
        summary = relations_summary(table, self.config, self.model.name, self.study.config.finetune.template)
        write_table(table, self.out / "interventions.csv")
        write_table(pd.DataFrame(arm_rows), self.out / "arms.csv")
        write_table(pd.DataFrame(steer_rows), self.out / "steering.csv")
        write_json(summary, self.out / "interventions.json")
        write_report(self.out)
        return table

    def relation(self, runner, r, sc: StudyConfig | None = None) -> tuple[dict, list[dict], list[dict]]:
        """One relation: its setup, every erasure arm and the steering (each a saved stage task);
        its row, arm rows and steering rows. ``sc``: the study configuration its fine-tunes use."""
        c, sc, labels = self.config, sc or self.study.config, self.study.labels
        seed = relation_seed(c.seed, r.name)
        s = arms.setup(self.model, r, labels, sc, c)
        records, tuned_none = {}, None
        arms_run = [a for a in s.erasers if c.layer or a.startswith((arms.BOTTLENECK, arms.ALL_TOKENS))]
        for arm in ["none", *arms_run]:
            inputs = ArmInputs(self.model, r, labels, sc, c, arm, s.layer, s)
            result = runner.run(Task(ARM, inputs, arm_path(r.name, arm)))
            records[arm] = result.record
            if arm == "none":
                tuned_none = result.tuned  # None when reloaded: steering fine-tunes it again
        row, arm_rows = erasure_rows(s, records, c.n_boot, seed)
        row |= erased_recall(self.model, s)
        predicted = tuple(records["none"]["predicted"])
        none_path = str(self.out / arm_path(r.name, "none"))
        subjects = [r.subjects[i] for i in s.design.finetune + s.design.heldout]
        other, other_answers = control_relation(r, self.study.relations.values(), subjects)
        inputs = SteeringInputs(
            self.model, r, labels, sc, c, s.layer, predicted, seed, other, other_answers, none_path, s, tuned_none
        )
        steer_rows = runner.run(Task(STEERING, inputs, f"runs/{r.name}__steering.json"))
        row.update(steering_row(steer_rows, c.n_boot, seed))
        return row, arm_rows, steer_rows


def _differences(old: dict, new: dict) -> list[str]:
    return [f"{k} {old.get(k)!r} -> {new.get(k)!r}" for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k)]
