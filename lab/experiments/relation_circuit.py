"""Circuits of a relation, before and after relabelling fine-tuning.

The generalization study fine-tunes a model to answer a relation with new labels ("Ana Bell is
associated with the word ``otter``" for every subject whose city was Paris) and asks whether
held-out subjects follow. This module asks *where* the answer lives in the model on each side of
that fine-tune:

- **before**: clean prompts state the fact as the pretraining corpus does; corrupted prompts use
  another subject (same token count) with a different answer; metric: logit difference between
  the two subjects' answers;
- **after**: the same pairs in the fine-tuning template, on the fine-tuned model, with each
  answer replaced by its label.

Activation patching of every head output and MLP output (all positions, clean into corrupted)
gives each component's share of the logit difference, normalized so 1 restores the clean run,
with per-pair bootstrap intervals and sign-flip p-values.

:func:`relation_faithfulness` tests whole circuits on each side: EAP-IG-inputs ranks every edge
of the model, and the top-k circuits are run with the rest patched (MIB's faithfulness curve,
CPR and CMD) against random circuits of the same sizes.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from circuits.activation_patching import ActivationPatching
from circuits.attribution import AttributionPatching
from circuits.faithfulness import Faithfulness
from circuits.pairs import Pairs, matched_pairs
from interp.prompts import Prompt
from lab.study.design import make_design
from lab.study.finetune import FinetuneConfig, finetune
from lab.world.vocab import LABELS


def relation_pairs(
    model, prompts: list[str], answers: list[str], n: int = 32, seed: int = 0, subjects: list[str] | None = None
) -> Pairs:
    """``n`` (clean, corrupted) pairs from one relation (:func:`circuits.matched_pairs`): two
    subjects with equal token counts and different answers; ``answer`` = the clean subject's
    answer, ``wrong`` = the corrupted one's."""
    if subjects is not None:
        prompts = [Prompt(p, subject=s) for p, s in zip(prompts, subjects)]
    return matched_pairs(model, prompts, answers, n=n, seed=seed)


def component_scores(model, pairs: Pairs, progress: bool | None = None) -> pd.DataFrame:
    """Every head (``z``) and MLP output patched at all positions, clean into corrupted."""
    sites = ["z", "mlp_out"] if any(s.endswith("hook_mlp_out") for s in model.sites) else ["z"]
    df = ActivationPatching(
        model, "logit_diff", sites=sites, by_position=False, statistics=True, progress=progress
    ).run(pairs)
    df["component"] = [f"L{r.layer}H{r.head}" if r.site == "z" else f"MLP{r.layer}" for r in df.itertuples()]
    return df


@dataclass
class Stage:
    """One side of the fine-tune: its model and its patching pairs."""

    name: str  # "before" | "after"
    model: object
    pairs: Pairs


def relation_stages(
    model,
    relation,
    n_pairs: int = 32,
    category: str = "animals",
    method: str = "full",
    n_finetune: int = 3,
    label_seed: int = 0,
    seed: int = 0,
    finetune_config=None,
) -> tuple[list[Stage], dict]:
    """The pretrained model on the relation's fact prompts, and the relabelled model on the
    fine-tuning template with the labels as answers; and the fine-tune's facts."""
    if category not in LABELS:
        raise ValueError(f"unknown label category {category!r}; choose from {sorted(LABELS)}")
    config = finetune_config or FinetuneConfig()
    prompts = [p.text for p in relation.prompts()]
    before = Stage("before", model, relation_pairs(model, prompts, relation.answers, n_pairs, seed))
    design = make_design(relation, tuple(LABELS[category]), n_finetune, label_seed, seed, category)
    tmpl = config.template
    ft_prompts = [tmpl.format(relation.subjects[i]) for i in design.finetune]
    ft_labels = [design.mapping[relation.answers[i]] for i in design.finetune]
    after_model, info = finetune(model, ft_prompts, ft_labels, design.labels, method, config, seed=seed)
    keep = [i for i in design.finetune + design.heldout]
    after_prompts = [tmpl.format(relation.subjects[i]) for i in keep]
    after_answers = [design.mapping[relation.answers[i]] for i in keep]
    after = Stage("after", after_model, relation_pairs(after_model, after_prompts, after_answers, n_pairs, seed))
    return [before, after], info


def relation_circuit(
    model,
    relation,
    n_pairs: int = 32,
    category: str = "animals",
    method: str = "full",
    n_finetune: int = 3,
    label_seed: int = 0,
    seed: int = 0,
    finetune_config=None,
    progress: bool | None = None,
    stages: tuple[list[Stage], dict] | None = None,
) -> pd.DataFrame:
    """Component scores for ``relation`` before and after relabelling fine-tuning.

    ``relation``: an :class:`interp.relations.Relation` (e.g. from ``from_world``). Returns a tidy
    DataFrame with ``stage`` in {"before", "after"}, one row per component, its ``score`` and
    ``normalized`` effect with the per-pair interval and p-value; ``attrs`` carry each stage's
    clean and corrupted logit differences and the fine-tune's facts. ``stages``: the output of
    :func:`relation_stages`, to reuse one fine-tune.
    """
    (before_stage, after_stage), info = stages or relation_stages(
        model, relation, n_pairs, category, method, n_finetune, label_seed, seed, finetune_config
    )
    before = component_scores(before_stage.model, before_stage.pairs, progress)
    after = component_scores(after_stage.model, after_stage.pairs, progress)
    out = pd.concat([before.assign(stage="before"), after.assign(stage="after")], ignore_index=True)
    out.attrs.update(
        relation=relation.name,
        method=method,
        category=category,
        finetune=info,
        before={k: before.attrs[k] for k in ("clean_score", "corrupted_score")},
        after={k: after.attrs[k] for k in ("clean_score", "corrupted_score")},
    )
    cols = [
        "stage",
        "component",
        "site",
        "layer",
        "head",
        "score",
        "normalized",
        "effect",
        "stderr",
        "ci_low",
        "ci_high",
        "p_value",
        "p_fdr",
    ]
    return out[cols].pipe(lambda d: _with_attrs(d, out.attrs))


def relation_faithfulness(
    stages: list[Stage], ig_steps: int = 5, n_random: int = 99, seed: int = 0, progress: bool | None = None
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Faithfulness curves (with ``stage``) and their CPR/CMD summary for EAP-IG-inputs' circuits
    on each stage, against ``n_random`` random circuits."""
    curves, summaries = [], []
    for st in stages:
        scores = AttributionPatching(st.model, "logit_diff", ig_steps=ig_steps, progress=progress).edges(st.pairs)
        fa = Faithfulness(st.model, "logit_diff", n_random=n_random, seed=seed, progress=progress)
        curve = fa.run(st.pairs, {"EAP-IG-inputs": scores})
        curves.append(curve.assign(stage=st.name))
        summaries.append(
            fa.summary_.assign(
                stage=st.name, full_score=curve.attrs["full_score"], empty_score=curve.attrs["empty_score"]
            )
        )
    curve = pd.concat(curves, ignore_index=True)
    curve.attrs.update({k: v for k, v in curves[0].attrs.items() if k not in ("full_score", "empty_score")})
    return curve, pd.concat(summaries, ignore_index=True)


def _with_attrs(df: pd.DataFrame, attrs: dict) -> pd.DataFrame:
    df.attrs.update(attrs)
    return df
