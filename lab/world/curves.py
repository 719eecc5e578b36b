"""Learning curves of world models: what a model of a given size knows after how many steps.

Before a world is shipped as the embedded default, its recipe must be shown to teach a small
model *computed* knowledge: facts recalled from a name made of shared tokens, and readable from
the layers rather than from one embedding row. :func:`learning_curves` pretrains each model size
on the world (:func:`lab.world.train.train_world_model`, resumable) and, every ``eval_every``
steps, measures on the partly trained weights, per relation:

- ``recall``: greedy next-token accuracy on the fact's query (:func:`lab.world.report.recall`),
  on a fixed sample of subjects;
- ``readability_kappa``: Cohen's kappa of a cross-validated linear probe at the subject's last
  token, at the best layer (:func:`probes.best_layer_readability`);
- ``embedding_kappa``: the same probe on the input embeddings at the same token (the
  embedding-row baseline of :mod:`probes.baselines`): what one token's row holds before any layer.

One row per (size, step, relation) goes to ``curves.csv`` as soon as it is measured (rewritten
atomically), so an interrupted run resumes without measuring a point twice. The summary a recipe
is chosen by (:func:`curve_summary`): per size and step, mean recall over the relations with the
most mentions, mean embedding kappa and mean readability above it.
"""

from __future__ import annotations

import json
import random
from collections.abc import Mapping
from dataclasses import asdict, replace
from pathlib import Path

import pandas as pd

import interp
from interp.results import write_json, write_table
from lab.stages import digest
from probes import ProbeSweep, best_layer_readability, readability_by_layer

from .relations import from_world
from .report import recall
from .spec import WorldSpec
from .tokenizer import build_tokenizer
from .train import TrainConfig, recipe, train_world_model, trained_on
from .world import World

CURVE_COLUMNS = ["size", "step", "relation", "mentions", "augment", "templates", "recall", "readability_kappa",
                 "readability_layer", "embedding_kappa"]  # fmt: skip


def measure(hf_model, tokenizer, world: World, subjects: list[str], folds: int = 3) -> pd.DataFrame:
    """Recall, best-layer readability kappa and embedding-row kappa per relation, for weights in training."""
    was_training = hf_model.training
    hf_model.eval()
    model = interp.load_model(hf_model, tokenizer=tokenizer)
    rec = recall(model, world, subjects=subjects).groupby("relation")["correct"].mean()
    keep = set(subjects)
    rels = []
    for r in from_world(world):
        idx = [i for i, s in enumerate(r.subjects) if s in keep]
        rels.append(
            replace(
                r,
                subjects=[r.subjects[i] for i in idx],
                answers=[r.answers[i] for i in idx],
                prompts_override=[r.prompts_override[i] for i in idx] if r.prompts_override else None,
            )
        )
    sweep = ProbeSweep(folds=folds, seeds=(0,), batch_size=256, baselines=True, baseline_seeds=())
    table = sweep.run(model, rels)
    best = best_layer_readability(readability_by_layer(table, sweep.readout_)).set_index("relation")
    emb = table.groupby("relation")["embedding_kappa"].first()
    hf_model.train(was_training)
    rows = []
    for r in world.spec.relations:
        rows.append(
            {
                "relation": r.name,
                "mentions": r.mentions,
                "augment": r.augment and r.bio,
                "templates": r.templates,
                "recall": float(rec[r.name]),
                "readability_kappa": float(best.loc[r.name, "kappa"]),
                "readability_layer": int(best.loc[r.name, "layer"]),
                "embedding_kappa": float(emb[r.name]),
            }
        )
    return pd.DataFrame(rows)


def learning_curves(
    spec: WorldSpec,
    sizes: Mapping[str, TrainConfig],
    out: str | Path,
    eval_every: int = 2000,
    n_subjects: int = 400,
    folds: int = 3,
    progress: bool | None = None,
) -> pd.DataFrame:
    """Pretrain each size on ``spec``'s world and measure it every ``eval_every`` steps (and at the
    end); returns (and keeps in ``out/curves.csv``) one row per size, step and relation. Each
    size's model is saved as ``out/<size>``; an interrupted run resumes (training from its saved
    state, measurements from the table)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "curves.csv"
    key = digest(
        {
            "spec": spec.to_json(),
            "sizes": {n: recipe(asdict(c)) for n, c in sizes.items()},
            "eval_every": eval_every,
            "n_subjects": n_subjects,
            "folds": folds,
        }
    )
    made = out / "curves.json"
    if path.exists() and made.exists() and json.loads(made.read_text()).get("key") != key:
        raise ValueError(
            f"{out} holds learning curves of another world, sizes or protocol; use a new folder, or delete it"
        )
    write_json({"key": key}, made)
    table = pd.read_csv(path) if path.exists() else pd.DataFrame(columns=CURVE_COLUMNS)
    world = World.generate(spec)
    subjects = sorted(random.Random(spec.seed).sample(world.subjects, min(n_subjects, len(world.subjects))))
    tokenizer = build_tokenizer(world.vocabulary())
    for name, config in sizes.items():
        done = set(table.loc[table["size"] == name, "step"])
        config = replace(config, save_every=eval_every)

        def on_save(step, hf_model, name=name, done=done):
            nonlocal table
            if step in done:
                return
            rows = measure(hf_model, tokenizer, world, subjects, folds).assign(size=name, step=step)
            table = pd.concat([table, rows[CURVE_COLUMNS]], ignore_index=True)
            write_table(table, path)

        if trained_on(out / name) == (spec, recipe(asdict(config))):
            final = out / name  # a finished size: its steps were measured as it trained
        else:
            final = train_world_model(spec, out / name, config, progress=progress, on_save=on_save)
        if config.steps not in done:
            hf = interp.load_model(final).module
            on_save(config.steps, hf)
    table = pd.read_csv(path)
    write_table(curve_summary(table), out / "summary.csv")
    return table


def curve_summary(table: pd.DataFrame, high_mentions: int | None = None) -> pd.DataFrame:
    """Per size and step: mean recall (all relations, and those with the most mentions), mean
    embedding-row kappa, mean readability kappa and readability above the embedding row."""
    high = high_mentions if high_mentions is not None else table.mentions.max()
    g = table.groupby(["size", "step"])
    out = pd.DataFrame(
        {
            "recall": g.recall.mean(),
            "recall_high_exposure": table[table.mentions >= high].groupby(["size", "step"]).recall.mean(),
            "recall_sd": g.recall.std(),
            "embedding_kappa": g.embedding_kappa.mean(),
            "readability_kappa": g.readability_kappa.mean(),
        }
    )
    out["readability_above_embedding"] = out.readability_kappa - out.embedding_kappa
    out["r_recall_readability"] = g.apply(lambda d: d.recall.corr(d.readability_kappa))
    return out.reset_index()


__all__ = ["learning_curves", "measure", "curve_summary", "CURVE_COLUMNS"]
