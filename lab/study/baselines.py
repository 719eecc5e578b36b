"""Readability above baseline: how much of a relation's readability is not in the tokens alone.

A probe can read an answer from the subject's *string* (its word pieces: a word's first letter,
a star's name that holds its constellation) as well as from what the model learned. The study
measures, per relation, the readability of the same answers with the same probe, folds and
kappa (:mod:`probes.baselines`) from two representations that hold no computation of the
pretrained model:

- ``embedding_kappa``: the model's static input embeddings at the read-out token (one value per
  relation). On the world model a subject's family name is a token of its own, so its
  *trained* embedding row can hold the subject's facts: this baseline is then an upper bound on
  surface form, and subtracting it also removes knowledge stored in the embedding table;
- ``random_kappa``: the same architecture with freshly initialized weights (mean over
  ``baseline_seeds``), at the relation's best layer: what mixing the prompt's tokens makes
  readable with no knowledge at all.

``baseline_kappa`` is the larger of the two and ``readability_above_baseline`` the best-layer
readability kappa minus it; ``readability_above_surface`` subtracts the random-weight baseline
alone. The two answer different questions. The random-weight model keeps the tokens' identity
and the architecture's mixing and nothing learned: what it reads is **surface form**. The
embedding row is learned: what it reads is knowledge the token table holds (on the world model,
the family-name rows hold the facts, measured: embedding kappa 0.96 for ``continent`` against
0.02 with random weights), so "above baseline" there also subtracts knowledge, and is a
conservative lower bound on what the layers add. ``baseline_flagged`` and ``surface_flagged``
mark a relation whose baseline (surface) kappa exceeds ``StudyConfig.baseline_flag`` (0.2 by
default, "fair" agreement on Landis & Koch's scale). The summary reports the headline
correlation with readability above each beside the kappa headline (``summary["above_baseline"]``),
each with its own Monte-Carlo p under the study's simulated null (:mod:`lab.study.null`).

The stage writes ``readability_baselines.csv`` (long: relation, baseline, seed, site, layer,
kappa) and keeps a parquet copy that the study reads back.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from interp.models import Model
from interp.relations import Relation
from interp.results import write_table
from lab.stages import DERIVED, Codec, Stage, parquet_codec
from probes import ProbeSweep

_PARQUET = parquet_codec()

#: the columns :func:`baseline_columns` adds to the study's relation table
COLUMNS = (
    "embedding_kappa",
    "random_kappa",
    "baseline_kappa",
    "readability_above_baseline",
    "readability_above_surface",
    "baseline_flagged",
    "surface_flagged",
)


@dataclass(frozen=True)
class BaselineInputs:
    model: Model
    relations: tuple[Relation, ...]
    folds: int
    C: float
    seeds: tuple[int, ...]
    progress: bool | None = field(default=None, metadata=DERIVED)


def readability_baselines(inputs: BaselineInputs) -> pd.DataFrame:
    """The baselines' long table for the study's relations, with the readability sweep's probe,
    folds and C (:meth:`probes.ProbeSweep.baseline_table`), and the layer of each site (NaN for
    the embedding baseline)."""
    sweep = ProbeSweep(folds=inputs.folds, C=inputs.C, baseline_seeds=inputs.seeds, progress=inputs.progress)
    table = sweep.baseline_table(inputs.model, list(inputs.relations))
    layer_of = {inputs.model.resid_site(layer): layer for layer in range(inputs.model.n_layers)}
    return table.assign(layer=table.site.map(layer_of))


def _save(table: pd.DataFrame, path: Path) -> None:
    write_table(table, path.parent / "readability_baselines.csv")
    _PARQUET.write(table, path)  # last: its presence means both were written


BASELINES = Stage("readability baselines", readability_baselines, Codec(_save, _PARQUET.read))


def baseline_columns(
    baselines: pd.DataFrame, best: dict[str, int], readability_kappa: dict[str, float], flag: float
) -> pd.DataFrame:
    """One row per relation (``best``'s order): :data:`COLUMNS`, the random baseline read at the
    relation's best layer."""
    emb = baselines[baselines.baseline == "embedding"].groupby("relation").kappa.first()
    rnd = baselines[baselines.baseline == "random"].groupby(["relation", "layer"]).kappa.mean()
    rows = []
    for name, layer in best.items():
        e = float(emb.get(name, np.nan))
        r = float(rnd.get((name, layer), np.nan))
        b = float(np.nanmax([e, r])) if not (np.isnan(e) and np.isnan(r)) else np.nan
        rows.append(
            {
                "relation": name,
                "embedding_kappa": e,
                "random_kappa": r,
                "baseline_kappa": b,
                "readability_above_baseline": readability_kappa[name] - b,
                "readability_above_surface": readability_kappa[name] - r,
                "baseline_flagged": bool(b > flag),
                "surface_flagged": bool(r > flag),
            }
        )
    return pd.DataFrame(rows, columns=["relation", *COLUMNS])
