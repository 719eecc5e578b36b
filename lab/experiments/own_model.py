"""Probe and patch your own model from the command line (``interp probe``, ``interp patch``).

Both take a model spec (a local HuggingFace directory, a hub name in the local cache, or a
registered name such as ``world``), check every input before loading it, and write tidy tables,
a figure and a summary to a folder:

- :func:`probe_own_model`: a :class:`probes.ProbeSweep` over your relation JSON files (the format:
  ``docs/probes.md``) at every layer: ``probes.csv`` (relation x layer x fold), ``readability.csv``
  (relation x layer: pooled Cohen's kappa, chance levels, selectivity), ``best_layers.csv`` and
  ``figures/probes`` (relations x layers, chance-corrected accuracy);
- :func:`patch_own_model`: :class:`circuits.ActivationPatching` of the residual stream by layer and
  position and of every head, on pairs from a pairs file (CSV or JSON rows with ``clean``,
  ``corrupted``, ``answer``, ``wrong``) or built from a relation file (:func:`circuits.matched_pairs`):
  ``pairs.csv`` (what was patched), ``patching.csv`` and ``figures/positions`` / ``figures/heads``.
  Every pair is checked first (:func:`circuits.make_pairs`): token counts, unknown words, answers
  that tokenize alike; a multi-token answer switches the metric to ``answer_logprob``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from circuits import ActivationPatching, head_heatmap, make_pairs, matched_pairs, position_heatmap
from circuits.pairs import Pairs
from interp.plots import export
from interp.relations import load_relations
from interp.results import save_table, write_table
from probes import ProbeSweep, best_layer_readability, readability_by_layer
from probes import plots as probe_plots

PAIR_COLUMNS = ("clean", "corrupted", "answer", "wrong")


def read_pairs_file(path: str | Path) -> pd.DataFrame:
    """Rows of ``clean, corrupted, answer, wrong`` from a CSV or a JSON list of objects."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no pairs file at {path}; give a CSV or JSON file with columns {PAIR_COLUMNS}")
    if path.suffix == ".json":
        try:
            rows = pd.DataFrame(json.loads(path.read_text()))
        except (json.JSONDecodeError, ValueError) as err:
            raise ValueError(
                f"{path}: not a JSON list of {{clean, corrupted, answer, wrong}} objects ({err})"
            ) from None
    else:
        rows = pd.read_csv(path, dtype=str, keep_default_na=False)
    missing = [c for c in PAIR_COLUMNS if c not in rows.columns]
    if missing:
        raise ValueError(f"{path}: missing column(s) {missing}; a pairs file has the columns {', '.join(PAIR_COLUMNS)}")
    if rows.empty:
        raise ValueError(f"{path}: no pairs")
    return rows[list(PAIR_COLUMNS)].astype(str)


def probe_own_model(model, relations, out: str | Path, folds: int = 5, formats=("html", "png")) -> pd.DataFrame:
    """Sweep linear probes over every layer for ``relations`` (files, folders or Relation objects);
    writes the tables and the figure to ``out`` and returns the best layer of each relation."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    if isinstance(relations, (str, Path)) or (relations and isinstance(relations[0], (str, Path))):
        relations = load_relations(relations)
    sweep = ProbeSweep(folds=folds)
    table = sweep.run(model, relations)
    layers = readability_by_layer(table, sweep.readout_)
    best = best_layer_readability(layers)
    save_table(table, out, "probes")
    write_table(layers, out / "readability.csv")
    write_table(best, out / "best_layers.csv")
    export(probe_plots.layer_relation_heatmap(table, chance_corrected=True), out / "figures" / "probes", formats)
    return best


def own_pairs(model, pairs_file=None, relation=None, n: int = 32, seed: int = 0) -> tuple[Pairs, pd.DataFrame]:
    """Checked pairs from a pairs file, or built from one relation file; and the rows they came from."""
    if (pairs_file is None) == (relation is None):
        raise ValueError("give either a pairs file (--pairs) or one relation file (--relation) to build pairs from")
    if pairs_file is not None:
        rows = read_pairs_file(pairs_file)
        pairs = make_pairs(model, list(rows.clean), list(rows.corrupted), list(rows.answer), list(rows.wrong))
        return pairs, rows
    rels = load_relations(relation)
    if len(rels) != 1:
        raise ValueError(f"--relation {relation}: holds {len(rels)} relations; give one relation file")
    (rel,) = rels
    pairs = matched_pairs(model, rel.prompts(), rel.answers, n=n, seed=seed)
    tok = model.tokenizer
    rows = pd.DataFrame(
        {
            "clean": tok.batch_decode([r[m.bool()] for r, m in zip(pairs.clean.input_ids, pairs.clean.attention_mask)]),
            "corrupted": tok.batch_decode(
                [r[m.bool()] for r, m in zip(pairs.corrupted.input_ids, pairs.corrupted.attention_mask)]
            ),
            "answer": [tok.decode(list(t)).strip() for t in pairs.answer_tokens],
            "wrong": [tok.decode(list(t)).strip() for t in pairs.wrong_tokens],
        }
    )
    return pairs, rows


def patch_own_model(
    model, out: str | Path, pairs_file=None, relation=None, n: int = 32, formats=("html", "png")
) -> pd.DataFrame:
    """Activation patching (clean into corrupted, with per-pair intervals) of the residual stream at
    every layer and position and of every head; writes tables and figures to ``out``."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    pairs, rows = own_pairs(model, pairs_file, relation, n)
    metric = "answer_logprob" if pairs.multi_token else "logit_diff"
    positions = ActivationPatching(model, metric, sites=["resid_pre"], by_position=True, statistics=True).run(pairs)
    heads = ActivationPatching(model, metric, sites=["z"], by_position=False, statistics=True).run(pairs)
    table = pd.concat([positions, heads], ignore_index=True)
    table.attrs = {**positions.attrs, "metric": metric}
    write_table(rows, out / "pairs.csv")
    save_table(table, out, "patching")
    export(position_heatmap(positions, significance="mark"), out / "figures" / "positions", formats)
    export(head_heatmap(heads, significance="mark"), out / "figures" / "heads", formats)
    return table


__all__ = ["probe_own_model", "patch_own_model", "own_pairs", "read_pairs_file", "PAIR_COLUMNS"]
