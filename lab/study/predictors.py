"""Further predictors of fine-tuning generalization: probe quality beyond accuracy, LRE
faithfulness and Jacobian alignment.

The study's headline predictor is probe readability (is the answer linearly decodable at the
subject?). Two other notions of "linear before fine-tuning" come from :mod:`jacobians`:

- **LRE faithfulness / causality** (Hernandez et al. 2024): is the map from the subject's state
  at layer ``l`` to the final state a linear operator that predicts (and can edit) the answer?
- **Jacobian alignment** (GrokAlign): how far the last-position logits' Jacobian with respect to
  the subject's last token embedding is aligned with that embedding, measured by the centroid
  alignment ``cos(J^T 1, x)`` (one vector-Jacobian product per prompt; the full per-row measures
  need the whole ``vocab x d_model`` Jacobian per prompt, minutes per relation on a CPU).

**Probe quality** (Hewitt & Liang 2019; Voita & Titov 2020), at each relation's best layer:
selectivity (accuracy minus a control task's), macro AUROC, balanced accuracy and the online-code
compression (:func:`probe_quality`, :mod:`probes.mdl`): does a measure that charges the probe for
capacity or data predict generalization better than accuracy? Each predictor's correlation is
compared with readability's on the same relations (``r_minus_readability``, a paired bootstrap
interval over relations, and Williams' t test for correlations that share the outcome), since
two predictors measured on the same relations are correlated and their intervals overlap
whether or not they differ.

:func:`relation_predictors` measures the Jacobian ones per relation; :func:`compare_predictors` correlates
every predictor with a finished study's generalization, side by side with readability, and
writes ``predictors.csv`` and ``predictor_correlations.csv`` into the study folder.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from interp.models import Model
from interp.progress import progress_bar
from interp.relations import Relation
from interp.results import write_table
from jacobians import LinearRelationalEmbedding, centroid_alignment
from lab.stages import DERIVED, Runner, Stage, Task, table_codec
from probes import ProbeSweep

from .stats import correlation_difference, pearson, spearman


def relation_predictors(
    model,
    relations,
    layer: int | None = None,
    beta: float = 1.0,
    n_test: int = 40,
    n_alignment: int = 64,
    seed: int = 0,
    progress: bool | None = None,
) -> pd.DataFrame:
    """One row per relation: ``lre_faithfulness``, ``lre_causality``, ``centroid_alignment``
    (subject-last token embedding -> last-position logits)."""
    layer = model.n_layers // 2 - 1 if layer is None else layer
    lre = LinearRelationalEmbedding(model, layer, beta=beta, icl=False)
    rows = []
    for r in progress_bar(relations, desc="jacobian predictors", unit="relations", progress=progress):
        res = lre.run(r, n_test=n_test, seed=seed)
        rng = np.random.default_rng(seed)
        pick = rng.choice(len(r), size=min(n_alignment, len(r)), replace=False)
        prompts = [r.prompts()[i] for i in sorted(pick)]
        align = centroid_alignment(model, prompts, wrt="hook_embed", of="logits", wrt_position="subject_last")
        rows.append(
            {
                "relation": r.name,
                "lre_layer": layer,
                "lre_beta": beta,
                "lre_faithfulness": res["faithfulness"],
                "lre_causality": res["causality"],
                "lre_agreement": res["agreement"],
                "centroid_alignment": float(align.centroid_alignment.mean()),
            }
        )
    return pd.DataFrame(rows)


READABILITY = "readability_best_kappa"
PREDICTORS = [
    READABILITY,
    "readability_best",
    "selectivity_best",
    "auroc_best",
    "balanced_accuracy_best",
    "compression_best",
    "lre_faithfulness",
    "lre_causality",
    "centroid_alignment",
]


def probe_quality(
    model, relations, best_layer: dict[str, int], folds: int = 5, C: float = 1.0, progress: bool | None = None
) -> pd.DataFrame:
    """Probe quality beyond accuracy at each relation's best layer (the study's): macro AUROC and
    balanced accuracy (fold means) and the online-code compression (:mod:`probes.mdl`)."""
    table = ProbeSweep(folds=folds, C=C, mdl=True, readout=False, control=False, progress=progress).run(
        model, relations
    )
    table = table[table.layer == table.relation.map(best_layer)]
    return (
        table.groupby("relation")[["auroc", "balanced_accuracy", "compression"]]
        .mean()
        .add_suffix("_best")
        .reset_index()
    )


@dataclass(frozen=True)
class PredictorInputs:
    model: Model
    relations: tuple[Relation, ...]
    layer: int | None
    beta: float
    best_layers: dict[str, int]
    folds: int
    probe_C: float
    progress: bool | None = field(default=None, metadata=DERIVED)


def measure_predictors(i: PredictorInputs) -> pd.DataFrame:
    """The Jacobian predictors and the probe-quality predictors of every relation."""
    preds = relation_predictors(i.model, list(i.relations), i.layer, i.beta, progress=i.progress)
    quality = probe_quality(i.model, list(i.relations), i.best_layers, i.folds, i.probe_C, i.progress)
    return preds.merge(quality, on="relation")


#: measured once per study folder (``predictors.csv``), reloaded after
PREDICTOR_STAGE = Stage("predictors", measure_predictors, table_codec())


def compare_predictors(
    study_dir: str | Path,
    model=None,
    relations=None,
    layer: int | None = None,
    beta: float = 1.0,
    outcomes: Sequence[str] = ("generalization_kappa_full", "generalization_kappa_lora"),
    n_boot: int = 1000,
    n_perm: int = 1000,
    progress: bool | None = None,
) -> pd.DataFrame:
    """Correlate each predictor with each outcome across a finished study's relations."""
    study_dir = Path(study_dir)
    table = pd.read_csv(study_dir / "relations.csv")
    cached = study_dir / "predictors.csv"
    if model is None:  # the predictors a previous call measured
        try:
            preds = pd.read_csv(cached)
        except FileNotFoundError:
            raise ValueError(
                f"{cached} does not exist yet: pass the study's model and relations to measure the predictors"
            ) from None
    else:
        if relations is None:
            raise ValueError("pass the study's relations with its model to measure the predictors")
        wanted = set(table.relation)
        config = json.loads((study_dir / "summary.json").read_text())["config"]
        inputs = PredictorInputs(
            model,
            tuple(r for r in relations if r.name in wanted),
            layer,
            beta,
            dict(zip(table.relation, (int(b) for b in table.best_layer))),
            config["folds"],
            config["probe_C"],
            progress,
        )
        preds = Runner(study_dir).run(Task(PREDICTOR_STAGE, inputs, "predictors.csv"))
    merged_all = table.merge(preds, on="relation")
    rows = []
    for outcome in outcomes:
        if outcome not in merged_all:
            continue
        merged = merged_all[merged_all[outcome].notna()]  # a relation whose fine-tune failed has no outcome
        for p in PREDICTORS:
            if p not in merged:
                continue
            pr = pearson(merged[p], merged[outcome], n_boot=n_boot, n_perm=n_perm)
            sp = spearman(merged[p], merged[outcome])
            vs = (
                correlation_difference(merged[p], merged[READABILITY], merged[outcome], n_boot=n_boot)
                if p != READABILITY and READABILITY in merged
                else {
                    "diff": 0.0 if p == READABILITY else np.nan,
                    "ci_low": np.nan,
                    "ci_high": np.nan,
                    "p_williams": np.nan,
                }
            )
            rows.append(
                {
                    "outcome": outcome,
                    "predictor": p,
                    "pearson_r": pr["r"],
                    "ci_low": pr["ci_low"],
                    "ci_high": pr["ci_high"],
                    "p_value": pr["p_value"],
                    "spearman_r": sp["r"],
                    "n": pr["n"],
                    "r_minus_readability": vs["diff"],
                    "diff_ci_low": vs["ci_low"],
                    "diff_ci_high": vs["ci_high"],
                    "p_diff_williams": vs["p_williams"],
                }
            )
    out = pd.DataFrame(rows)
    write_table(out, study_dir / "predictor_correlations.csv")
    return out
