"""Probe baselines: how readable is an answer from representations that hold no learned computation?

A probe can read an answer from the subject's *string*: its word pieces (a word's first letter,
a star's name that contains its constellation), not from what the model computed. Readability
is then a property of the tokens, and a correlation with generalization says nothing about
the model's knowledge. Two baselines measure it, with the sweep's own probe, folds, seeds and
kappa (Hewitt & Liang 2019 and Zhang & Bowman 2018 use both kinds of control representation):

- **embedding**: the model's static input embeddings at the same token positions
  (``hook_embed``, plus ``hook_pos_embed`` where the model has learned positions): what the
  tokens at the read-out position carry before any layer mixes them. One row per relation.
  Caveat: these are the *trained* embeddings, so a subject whose name is one token of its own
  (the world model's family names) can hold learned facts in its embedding row; the baseline is
  then an upper bound on surface form, not a measure of it;
- **random**: the same architecture, tokenizer and positions with freshly initialized weights
  (the library's own initialization, seeded; several seeds, no training), at every layer the
  sweep probes: what the architecture's mixing of the tokens makes readable with no knowledge.

:func:`probe_baselines` returns the long table (relation, baseline, seed, site, layer, kappa);
:func:`with_baselines` adds to every row of a sweep ``kappa`` (this site's pooled
cross-validated kappa), ``embedding_kappa``, ``random_kappa`` (mean over seeds, same site),
``baseline_kappa`` (the larger of the two) and ``kappa_above_baseline``. ``ProbeSweep(baselines=True)``
does both.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import pandas as pd
import torch

from interp.capture import capture
from interp.models import Model, load_model
from interp.relations import Relation

from .chance import kappa

#: the input-embedding sites a baseline sums, those the model has
EMBEDDING_SITES = ("hook_embed", "hook_pos_embed")


def random_weights(model: Model, seed: int) -> Model:
    """``model``'s architecture with freshly initialized weights (the HuggingFace class's own
    initialization, seeded), its tokenizer, backend, dtype and device."""
    hf = model.backend.source_module if model.backend.source_module is not None else model.hf_model
    if hf is None or not hasattr(hf, "config"):
        raise ValueError(
            "a random-weight baseline rebuilds the model from its HuggingFace class and config; this "
            f"{model.backend_name} model has none (load it from a HuggingFace model or directory)"
        )
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        fresh = type(hf)(hf.config)
    fresh = fresh.to(dtype=model.dtype, device=model.device).eval()
    return load_model(
        fresh, model.backend_name, tokenizer=model.tokenizer, name=f"{model.name} (random weights, seed {seed})"
    )


def embedding_states(
    model: Model, relations: Sequence[Relation], positions, batch_size: int = 64
) -> dict[str, dict[str, torch.Tensor]]:
    """Per relation, the summed input embeddings at ``positions`` of every sample's prompt:
    ``{relation: {"hook_embed": [n_samples, d_model]}}``, the stored-activation form a sweep reads."""
    sites = [s for s in EMBEDDING_SITES if s in model.sites]
    out = {}
    for rel in relations:
        acts = capture(model, rel.prompts(), sites=sites, positions=positions, batch_size=batch_size, progress=False)
        out[rel.name] = {"hook_embed": sum(acts[s] for s in sites)}
    return out


def pooled_kappa(readout: pd.DataFrame) -> pd.DataFrame:
    """Kappa of the pooled cross-validated predictions per (relation, site), first split seed
    (as :func:`probes.readability_by_layer` defines readability)."""
    first = readout[readout.seed == readout.seed.min()]
    rows = [
        {"relation": rel, "site": site, "kappa": kappa(list(g.answer), list(g.predicted))}
        for (rel, site), g in first.groupby(["relation", "site"], sort=False)
    ]
    return pd.DataFrame(rows, columns=["relation", "site", "kappa"])


def probe_baselines(
    run: Callable[[object, Sequence[Relation], str], tuple[pd.DataFrame, pd.DataFrame]],
    model: Model,
    relations: Sequence[Relation],
    positions,
    seeds: Sequence[int] = (0, 1, 2),
    batch_size: int = 64,
) -> pd.DataFrame:
    """The baselines' long table: one row per (relation, baseline, seed, site). ``run(source,
    relations, name)`` is the sweep itself (same probe, folds and seeds), returning its table and
    read-out."""
    parts = []
    _, readout = run(embedding_states(model, relations, positions, batch_size), relations, f"{model.name} (embeddings)")
    parts.append(pooled_kappa(readout).assign(baseline="embedding", seed=np.nan))
    for seed in seeds:
        _, readout = run(random_weights(model, seed), relations, f"{model.name} (random weights)")
        parts.append(pooled_kappa(readout).assign(baseline="random", seed=seed))
    table = pd.concat(parts, ignore_index=True)
    return table[["relation", "baseline", "seed", "site", "kappa"]]


def with_baselines(table: pd.DataFrame, readout: pd.DataFrame, baselines: pd.DataFrame) -> pd.DataFrame:
    """``table`` (a sweep's rows) with ``kappa``, ``embedding_kappa``, ``random_kappa``,
    ``baseline_kappa`` (the larger) and ``kappa_above_baseline`` on every row."""
    own = pooled_kappa(readout)
    emb = baselines[baselines.baseline == "embedding"].groupby("relation").kappa.first().rename("embedding_kappa")
    rnd = (
        baselines[baselines.baseline == "random"]
        .groupby(["relation", "site"])
        .kappa.mean()
        .rename("random_kappa")
        .reset_index()
    )
    out = table.merge(own, on=["relation", "site"], how="left")
    out = out.merge(emb.reset_index(), on="relation", how="left").merge(rnd, on=["relation", "site"], how="left")
    out["baseline_kappa"] = out[["embedding_kappa", "random_kappa"]].max(axis=1)
    out["kappa_above_baseline"] = out.kappa - out.baseline_kappa
    return out
