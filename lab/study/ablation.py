"""What makes a world model's knowledge *active*? Train variants, one factor at a time, and
measure each with the study's own measures.

A fact is *active* (Mehri & Schütze 2026) when it supports generalization beyond its own recall:
after a relabelling fine-tune on some subjects, held-out subjects that share an original answer
get the right new label. A world model can recall nearly every fact and still generalize from
almost none of them. This module asks which ingredient of the recipe decides it.

Each :class:`Variant` changes one factor of the shipped recipe:

- **world** (:class:`~lab.world.WorldSpec`): mixed training (``qa_fraction``: biography facts
  also as question-form statements for part of the subjects, Allen-Zhu & Li 2023, Physics of
  Language Models 3.1), augmentation (every relation written plainly), the relabelling template's
  words in pretraining (``template_words``), subjects with a family-name token of their own vs
  names built from a shared pool of tokens (``subject_tokens``);
- **model and training** (:class:`~lab.world.TrainConfig`): width, depth, pretraining steps
  (the recipe's full steps: the shipped checkpoint, measured without retraining when the world
  is the shipped one);
- **fine-tuning** (:class:`~lab.study.StudyConfig`, no pretraining: on the full recipe's
  checkpoint when it is shipped, to compare with the recipe's own row, else on the baseline's):
  whether the embedding tables train, the fine-tuning learning rate, the budget of fine-tuning
  subjects, LoRA instead of full fine-tuning.

Every world variant is pretrained with the same number of steps (``steps``, fewer than the
shipped checkpoint's by default, so that the table is affordable; the baseline row is trained
the same way, so rows compare like with like) and measured by a reduced study (one label
assignment, one seed, one category, full fine-tuning unless the variant says otherwise):

- ``recall``: greedy accuracy on every fact's corpus query (:func:`lab.world.report.recall`);
- ``readability``: the study's best-layer probe kappa, mean over relations (and its range);
- ``generalization``: held-out kappa after relabelling fine-tunes, mean over relations, and how
  many relations reach 0.5;
- ``r``: the study's headline correlation between the two across relations.

``out/variants/<name>/`` holds each variant's checkpoint and study; ``out/ablation.csv`` (one row
per variant) and ``out/ablation_relations.csv`` (one row per variant and relation) are rewritten
after each variant, atomically. A killed run resumes with the first unfinished variant.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path

import pandas as pd

from interp.models import load_model
from interp.progress import progress_bar
from interp.results import write_table
from lab.stages import DERIVED, WHERE, Runner, Stage, Task
from lab.world import TrainConfig, World, WorldSpec, v3_spec
from lab.world.report import recall

from .causal import without_augmentation
from .config import StudyConfig
from .finetune import WORLD_RATES, FinetuneConfig
from .run import run_study
from .worlds import shipped_checkpoint, weights_digest, world_task


@dataclass(frozen=True)
class Variant:
    """One row of the ablation: a name, the factor it changes and the overrides that change it.

    ``world``: :class:`WorldSpec` fields, or ``{"augment": False}`` (every relation written
    plainly); ``train``: :class:`TrainConfig` fields; ``study``: :class:`StudyConfig` fields;
    ``finetune``: :class:`FinetuneConfig` fields. A variant with only ``study``/``finetune``
    overrides reuses the baseline checkpoint."""

    name: str
    factor: str
    world: dict = field(default_factory=dict)
    train: dict = field(default_factory=dict)
    study: dict = field(default_factory=dict)
    finetune: dict = field(default_factory=dict)

    @property
    def pretrains(self) -> bool:
        return bool(self.world or self.train)


def default_variants(spec: WorldSpec | None = None) -> list[Variant]:
    """The factors the world model's recipe is made of, each switched the other way."""
    spec = spec or v3_spec()
    qa = spec.qa_fraction
    base = TrainConfig()
    return [  # cheapest first
        Variant("baseline", "the shipped recipe"),
        Variant(f"{base.steps} steps", "pretraining steps", train={"steps": "recipe"}),
        Variant(
            "embeddings fine-tuned",
            "which parameters fine-tune (embeddings, and the read-out tied to them)",
            finetune={"freeze_embeddings": False},
        ),
        Variant("fine-tune lr x0.3", "fine-tuning learning rate", finetune={"lr": WORLD_RATES[0] * 0.3}),
        Variant("budget 40-120", "fine-tuning subjects", study={"finetune_budget": (40, 120)}),
        Variant("LoRA", "LoRA instead of full fine-tuning", study={"methods": ("lora",)}),
        Variant(
            "no mixed training" if qa else "mixed training",
            "question-form statements in pretraining",
            world={"qa_fraction": 0.0 if qa else 0.5},
        ),
        Variant("no augmentation", "augmentation and paraphrase", world={"augment": False}),
        Variant(
            "template words absent", "relabelling template's words in pretraining", world={"template_words": False}
        ),
        Variant("shared subject tokens", "subjects built from shared tokens", world={"subject_tokens": "shared"}),
        Variant(f"depth {base.n_layers // 2}", "depth", train={"n_layers": base.n_layers // 2}),
        Variant(f"width {base.d_model * 2}", "width", train={"d_model": base.d_model * 2}),
    ]


def ablation_study_config(**overrides) -> StudyConfig:
    """The reduced study each variant is measured with."""
    base = StudyConfig(
        methods=("full",),
        label_seeds=(0,),
        finetune_seeds=(0,),
        other_categories=(),
        n_null=200,
        n_boot=500,
        n_perm=500,
        nonlinear_probes=(),  # a row reports linear readability; the nonlinear probes would only add time
    )
    return replace(base, **overrides)


def variant_world(spec: WorldSpec, v: Variant) -> WorldSpec:
    world = dict(v.world)
    if world.pop("augment", True) is False:
        spec = without_augmentation(spec, [r.name for r in spec.relations if r.augment])
    _check(world, WorldSpec, v.name, "world")
    return replace(spec, **world).validate()


def variant_train(train: TrainConfig, v: Variant, steps: int) -> TrainConfig:
    t = dict(v.train)
    _check(t, TrainConfig, v.name, "train")
    if t.get("steps") == "recipe":  # the recipe's own steps (the shipped checkpoint, when it is this world)
        t["steps"] = train.steps
    elif isinstance(t.get("steps"), float):  # a fraction of the ablation's steps
        t["steps"] = int(round(t["steps"] * steps))
    return replace(train, **{"steps": steps, **t})


def _check(overrides: dict, cls, name: str, what: str) -> None:
    unknown = sorted(set(overrides) - {f.name for f in fields(cls)})
    if unknown:
        raise ValueError(
            f"variant {name!r}: unknown {what} field(s) {unknown}; valid: {', '.join(f.name for f in fields(cls))}"
        )


def ablate(
    out: str | Path,
    variants: Sequence[Variant] | None = None,
    spec: WorldSpec | None = None,
    steps: int = 1500,
    train: TrainConfig = TrainConfig(),
    config: StudyConfig | None = None,
    progress: bool | None = None,
    only: Sequence[str] | None = None,
) -> pd.DataFrame:
    """Train and measure every variant (resuming finished ones); returns the one-row-per-variant table.
    ``config``: the reduced study (default :func:`ablation_study_config`), which variants override.
    ``only``: run just these variants (and the baseline) now; the tables keep every finished row.
    A folder holding an ablation with other steps, world, recipe or study is refused."""
    out = Path(out)
    spec = spec or v3_spec()
    variants = list(variants or default_variants(spec))
    names = [v.name for v in variants]
    if len(set(names)) != len(names):
        raise ValueError(f"variant names must be distinct: {names}")
    if not variants[0].name == "baseline" or variants[0].pretrains:
        raise ValueError(
            "the first variant must be the baseline (no overrides): study-only variants reuse its checkpoint"
        )
    plans = [(v, variant_world(spec, v), variant_train(train, v, steps)) for v in variants]  # validate all first
    for v in variants:
        _check(v.study, StudyConfig, v.name, "study")
        _check(v.finetune, FinetuneConfig, v.name, "finetune")
    unknown = sorted(set(only or ()) - set(names))
    if unknown:
        raise ValueError(f"unknown variant(s) {unknown}; the variants: {', '.join(names)}")
    plan = json.loads(
        json.dumps(
            {
                "steps": steps,
                "train": asdict(train),
                "spec": json.loads(spec.to_json()),
                "study": (config or ablation_study_config()).to_dict(),
            }
        )
    )
    runner = Runner(out, progress=progress)
    runner.claim("ablation_plan.json", plan, _differences, "ablation", refusal=PLAN_REFUSAL)
    # fine-tuning-only rows fine-tune the full recipe's model when it is shipped, else the baseline's
    recipe = shipped_checkpoint(spec, train)
    rows, per_relation = [], []
    for v, s, t in progress_bar(plans, desc="variants", unit="variants", progress=progress):
        vc = replace(config or ablation_study_config(), **v.study)
        vc = replace(vc, finetune=replace(vc.finetune, **v.finetune))
        measured = weights_digest(shipped_checkpoint(s, t) if v.pretrains else recipe)
        inputs = VariantInputs(v, s, t, vc, train.steps, recipe, out, measured, progress)
        task = Task(VARIANT, inputs, f"variants/{_slug(v.name)}/row.json")
        if only is not None and v.name != "baseline" and v.name not in only and not runner.done(task):
            continue
        saved = runner.run(task)
        rows.append(saved["row"])
        per_relation += saved["relations"]
        write_table(pd.DataFrame(rows), out / "ablation.csv")
        write_table(pd.DataFrame(per_relation), out / "ablation_relations.csv")
    return pd.DataFrame(rows)


PLAN_REFUSAL = "{folder} holds an ablation with other {differences}; use a new folder (or delete this one)"


def _differences(old: dict, new: dict) -> list[str]:
    return [k for k in new if old.get(k) != new[k]]


@dataclass(frozen=True)
class VariantInputs:
    """One variant's row: its world, recipe and study configuration (keyed); where the
    checkpoints are (not keyed)."""

    variant: Variant
    spec: WorldSpec
    train: TrainConfig
    config: StudyConfig
    recipe_steps: int
    recipe: Path | None = field(metadata=WHERE)
    out: Path = field(metadata=WHERE)
    #: the weights of the shipped checkpoint the variant measures instead of pretraining (None:
    #: it pretrains): keyed, so that a resumed ablation never mixes rows from other checkpoints
    measured_weights: str | None = None
    progress: bool | None = field(default=None, metadata=DERIVED)


def measure_variant(inputs: VariantInputs) -> dict:
    """Pretrain the variant's world (or reuse the shipped or the baseline's model), run the
    reduced study on it and measure recall, readability and generalization."""
    v, s, t, vc, out = inputs.variant, inputs.spec, inputs.train, inputs.config, inputs.out
    recipe, progress = inputs.recipe, inputs.progress
    folder = out / "variants" / _slug(v.name)
    # a variant that pretrains has its own world; the others fine-tune the recipe's (shipped) model, else the baseline's
    shipped = shipped_checkpoint(s, t) if v.pretrains else recipe
    minutes = None
    if shipped is not None:  # this world with this recipe is shipped: measure it, do not retrain
        ckpt = shipped
    else:
        name = f"variants/{_slug(v.name)}/world" if v.pretrains else "variants/baseline/world"
        world = Runner(out, progress=progress).run(world_task(out, name, s, t, retrain=True, progress=progress))
        ckpt, minutes = world.folder, world.minutes
    result = run_study(ckpt, out=folder / "study", config=vc, progress=progress)
    rel = result.table("relations")
    model = load_model(ckpt)
    rec = recall(model, World.generate(s)).groupby("relation")["correct"].mean()
    m = vc.methods[0]
    gen, read = rel[f"generalization_kappa_{m}"], rel["readability_best_kappa"]
    pearson = result.summary.get("headline", {}).get("pearson", {})
    kind = "shipped" if shipped is not None else "own" if v.pretrains or v.name == "baseline" else "baseline's"
    steps_used = t.steps if v.pretrains or v.name == "baseline" or recipe is None else inputs.recipe_steps
    row = {
        "variant": v.name,
        "factor": v.factor,
        "checkpoint": kind,
        "steps": steps_used,
        "pretrain_minutes": minutes,
        "recall": float(rec.mean()),
        "readability": float(read.mean()),
        "readability_min": float(read.min()),
        "readability_max": float(read.max()),
        "generalization": float(gen.mean()),
        "generalization_max": float(gen.max()),
        "relations_ge_0.5": int((gen >= 0.5).sum()),
        "relations_le_0.05": int((gen <= 0.05).sum()),
        "r": pearson.get("r"),
        "r_p_monte_carlo": pearson.get("p_monte_carlo"),
        "method": m,
        # fine-tunes that did not learn (lab.study.failures): generalization above is over the others
        "failed_finetunes": (result.summary.get("failed_jobs") or {}).get("n_failed", 0),
    }
    rel_rows = [
        {
            "variant": v.name,
            "relation": x.relation,
            "recall": float(rec.get(x.relation, float("nan"))),
            "readability": x.readability_best_kappa,
            "generalization": getattr(x, f"generalization_kappa_{m}"),
        }
        for x in rel.itertuples()
    ]
    return {"row": row, "relations": rel_rows}


VARIANT = Stage("ablation variant", measure_variant)


def _slug(name: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in name.lower()).strip("_")
