"""What the pretrained model knows, before any fine-tune: two stages of the study.

- **Readability** (:data:`READABILITY`): a probe sweep from the subject's last-token state at
  every layer to the original answer (:class:`probes.ProbeSweep`: stratified k-fold, control
  task, Cohen's kappa), summarized per layer (:func:`probes.readability.readability_by_layer`);
  the cross-validated read-out (every answer ranked per subject, so that k remain after the
  true answer and the answers the design left out are removed for back-mapping) is kept at each
  relation's best layer and at the fixed layer.
- **Pretrained answers** (:data:`PRETRAINED`): the model's top answer among the relation's answers
  (full-sequence scores, :mod:`interp.scoring`) and its ranking of them, with each subject's
  frequency (computed only when the stage runs). An encoder has no answer before fine-tuning: missing, not guessed.

Each is saved as the CSVs users open (``readability.csv``, ``readability_layers.csv``,
``probe_readout.csv``, ``pretrained.csv``; a ranking there is a JSON list in one cell) and as a
parquet file that keeps the rankings as lists, which is what the study reads back.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from interp.models import Model
from interp.progress import progress_bar
from interp.relations import Relation
from interp.results import write_table
from lab.stages import DERIVED, Codec, Stage, parquet_codec
from probes import ProbeSweep
from probes.chance import kappa
from probes.readability import best_layers, readability_by_layer

_PARQUET = parquet_codec()


@dataclass(frozen=True)
class ReadabilityInputs:
    model: Model
    relations: tuple[Relation, ...]
    folds: int
    C: float
    top_k: int
    fixed_layer: int
    progress: bool | None = field(default=None, metadata=DERIVED)


@dataclass(frozen=True)
class Readability:
    """``table``: the sweep (relation x layer, ProbeSweep's columns); ``layers``: readability per
    relation and layer; ``readout``: ranked answers per subject at the best and fixed layers."""

    table: pd.DataFrame
    layers: pd.DataFrame
    readout: pd.DataFrame


def readability(inputs: ReadabilityInputs) -> Readability:
    sweep = ProbeSweep(
        folds=inputs.folds,
        C=inputs.C,
        top_k=inputs.top_k,
        readout_k=10_000,
        progress=inputs.progress,
    )
    model = inputs.model
    table = sweep.run(model, list(inputs.relations), model_name=model.name)
    layers = readability_by_layer(table, sweep.readout_)
    best = best_layers(layers)
    ro = sweep.readout_
    ro = ro[ro.apply(lambda r: r["layer"] in (best[r["relation"]], inputs.fixed_layer), axis=1)].copy()
    return Readability(table, layers, ro)


def _save_readability(result: Readability, path: Path) -> None:
    folder = path.parent
    write_table(_json_cells(result.readout, "top_answers"), folder / "probe_readout.csv")
    write_table(result.layers, folder / "readability_layers.csv")
    write_table(result.table, folder / "readability.csv")
    _PARQUET.write(result.readout, path)  # last: its presence means all were written


def _load_readability(path: Path) -> Readability:
    folder = path.parent
    return Readability(
        pd.read_csv(folder / "readability.csv"), pd.read_csv(folder / "readability_layers.csv"), _PARQUET.read(path)
    )


READABILITY = Stage("readability", readability, Codec(_save_readability, _load_readability))


@dataclass(frozen=True)
class NonlinearInputs:
    model: Model
    relations: tuple[Relation, ...]
    folds: int
    C: float
    probes: tuple[str, ...]
    progress: bool | None = field(default=None, metadata=DERIVED)


def nonlinear_readability(inputs: NonlinearInputs) -> pd.DataFrame:
    """Nonlinear decodability per relation and layer (:mod:`probes.nonlinear`), on the readability
    sweep's own states, subjects and folds (the same ``folds`` and split seed): one row per
    (relation, layer) with ``<probe>_kappa``, the kappa of the pooled cross-validated predictions.
    A stage of its own, so that a study folder made before it resumes by computing only this."""
    sweep = ProbeSweep(folds=inputs.folds, C=inputs.C, control=False, progress=inputs.progress, nonlinear=inputs.probes)
    sweep.run(inputs.model, list(inputs.relations), model_name=inputs.model.name)
    ro = sweep.readout_
    first = ro[ro.seed == ro.seed.min()]
    rows = []
    for (rel, layer), g in first.groupby(["relation", "layer"], sort=False):
        row = {"relation": rel, "layer": int(layer)}
        for probe in inputs.probes:
            row[f"{probe}_kappa"] = kappa(list(g.answer), list(g[f"{probe}_predicted"]))
        rows.append(row)
    return pd.DataFrame(rows)


NONLINEAR = Stage("nonlinear probes", nonlinear_readability, parquet_codec())


@dataclass(frozen=True)
class PretrainedInputs:
    model: Model
    relations: tuple[Relation, ...]
    #: ``(relation, subject) -> frequency`` (the world: exact mention counts); None: the proxy the
    #: model computes (:mod:`interp.scoring`). Called only when the stage runs (not on a resume), and
    #: not keyed: a function of the model and the relations, lest a last-digit difference refuse a resume
    subject_frequency: Callable[[str, str], float] | None = field(default=None, metadata=DERIVED)
    progress: bool | None = field(default=None, metadata=DERIVED)


def pretrained_answers(inputs: PretrainedInputs) -> pd.DataFrame:
    rows = []
    model = inputs.model
    undefined = model.scoring.answers_undefined
    for r in progress_bar(
        list(inputs.relations), desc="pretrained answers", unit="relations", progress=inputs.progress
    ):
        answers = r.answer_set
        freq = _frequencies(r, inputs.subject_frequency, model)
        if undefined:  # an encoder: no answer to read before fine-tuning (missing, not guessed)
            rows += [
                {
                    "relation": r.name,
                    "subject": s,
                    "answer": a,
                    "model_answer": "",
                    "correct": None,
                    "model_top_answers": None,
                    "subject_frequency": freq[i],
                }
                for i, (s, a) in enumerate(zip(r.subjects, r.answers))
            ]
            continue
        scores = model.logprobs([p.text for p in r.prompts()], answers)
        top = scores.argsort(-1, descending=True)  # every answer ranked (see the module docstring)
        for i, (s, a) in enumerate(zip(r.subjects, r.answers)):
            ranked = [answers[j] for j in top[i].tolist()]
            rows.append(
                {
                    "relation": r.name,
                    "subject": s,
                    "answer": a,
                    "model_answer": ranked[0],
                    "correct": ranked[0] == a,
                    "model_top_answers": ranked,
                    "subject_frequency": freq[i],
                }
            )
    return pd.DataFrame(rows)


def _frequencies(r: Relation, subject_frequency, model: Model) -> list[float]:
    if subject_frequency is not None:
        return [float(subject_frequency(r.name, s)) for s in r.subjects]
    # a proxy for real models, by model family (interp.scoring: a causal LM's mean log-probability
    # of the subject's tokens after its first; an encoder's word pieces per word)
    return [model.scoring.frequency(s) for s in r.subjects]


def _save_pretrained(df: pd.DataFrame, path: Path) -> None:
    write_table(_json_cells(df, "model_top_answers"), path.with_suffix(".csv"))
    _PARQUET.write(df, path)


PRETRAINED = Stage("pretrained answers", pretrained_answers, Codec(_save_pretrained, _PARQUET.read))


def _json_cells(df: pd.DataFrame, column: str) -> pd.DataFrame:
    """``df`` with the lists of ``column`` written as JSON text (one cell each) for the CSV."""
    out = df.copy()
    out[column] = out[column].map(json.dumps)
    return out
