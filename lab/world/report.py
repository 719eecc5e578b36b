"""What a world model knows: recall per relation, and how linearly readable each answer is.

- **recall**: greedy next-token accuracy on the held-in query of every fact
  (``World.query``: the prompt exactly as the corpus writes the fact);
- **readability**: 5-fold cross-validated accuracy of a multinomial logistic probe from the
  subject's last-token residual stream (``blocks.{l}.hook_resid_post``) to the answer, for every
  layer (:class:`probes.ProbeSweep`), at the relation's best layer as :mod:`probes.readability`
  defines it (the highest kappa), with its kappa, chance = 1 / #answers and selectivity against a
  shuffled-label control.
"""

from __future__ import annotations

import pandas as pd
import torch

from interp.models import Model
from probes import ProbeSweep, best_layer_readability, readability_by_layer

from .relations import from_world
from .world import World


def recall(model: Model, world: World, relations=None, subjects=None, batch_size: int = 128) -> pd.DataFrame:
    """Per (relation, subject): whether the model's top next token after the query is the answer."""
    subjects = list(subjects if subjects is not None else world.subjects)
    rows = []
    vocab = model.tokenizer.get_vocab()
    for rel in relations or [r.name for r in world.spec.relations]:
        prompts = [world.query(s, rel) for s in subjects]
        gold = torch.tensor([vocab[world.answer(s, rel)] for s in subjects])
        preds = []
        for i in range(0, len(prompts), batch_size):
            batch = model.batch(model.encode(prompts[i : i + batch_size]), padding_side="left")
            with torch.no_grad():
                logits = model.run(batch)
            preds.append(logits[:, -1].argmax(-1).cpu())
        hit = (torch.cat(preds) == gold).numpy()
        rows += [(rel, s, bool(h)) for s, h in zip(subjects, hit)]
    return pd.DataFrame(rows, columns=["relation", "subject", "correct"])


def readability(model: Model, world: World, folds: int = 5, seed: int = 0, C: float = 1.0) -> pd.DataFrame:
    """Per (relation, layer): :func:`probes.readability_by_layer` of a :class:`probes.ProbeSweep`
    at the subject's last token, plus ``chance`` = 1 / #answers."""
    sweep = ProbeSweep(folds=folds, seeds=(seed,), C=C, batch_size=256)
    table = sweep.run(model, from_world(world), model_name=model.name)
    layers = readability_by_layer(table, sweep.readout_)
    return layers.merge(table.groupby(["relation", "layer"], as_index=False)["chance"].mean(), on=["relation", "layer"])


def knowledge_report(model: Model, world: World) -> pd.DataFrame:
    """One row per relation: its writing knobs, recall, best-layer readability and chance."""
    rec = recall(model, world).groupby("relation")["correct"].mean()
    best = best_layer_readability(readability(model, world)).set_index("relation")
    rows = []
    for r in world.spec.relations:
        rows.append(
            {
                "relation": r.name,
                "n_answers": r.n_answers,
                "templates": r.templates,
                "mentions": r.mentions,
                "augment": r.augment,
                "bio": r.bio,
                "recall": rec[r.name],
                "readability": best.loc[r.name, "accuracy"],
                "readability_kappa": best.loc[r.name, "kappa"],
                "best_layer": int(best.loc[r.name, "layer"]),
                "chance": best.loc[r.name, "chance"],
                "selectivity": best.loc[r.name, "selectivity"],
            }
        )
    return pd.DataFrame(rows)
