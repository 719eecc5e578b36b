"""The world-model ablation (``interp world ablate``) and the fine-tune's frozen embeddings."""

import json

import pytest
import torch

from lab.study import FinetuneConfig, StudyConfig, finetune
from lab.study.ablation import Variant, ablate, default_variants, variant_train, variant_world
from lab.world import RelationSpec, TrainConfig, WorldSpec, v3_spec

TINY = WorldSpec(
    seed=5,
    n_subjects=60,
    label_sentences=1,
    relations=(
        RelationSpec("city", "city", 4, templates=3, mentions=2, augment=True, bio=True),
        RelationSpec("sport", "sport", 3, bio=True),
        RelationSpec("month", "month", 4),
        RelationSpec("season", "season", 3),
    ),
)
CFG = StudyConfig(
    nonlinear_probes=(),
    n_finetune=3,
    methods=("full",),
    label_seeds=(0,),
    finetune_seeds=(0,),
    other_categories=(),
    n_null=200,
    folds=3,
    n_boot=50,
    n_perm=50,
    finetune=FinetuneConfig(max_steps=20, check_every=10),
)
TRAIN = TrainConfig(steps=10, n_layers=1, d_model=32, batch_size=8)


def test_every_default_variant_changes_one_thing():
    spec = v3_spec()
    variants = default_variants(spec)
    assert variants[0] == Variant("baseline", "the shipped recipe")
    assert len({v.name for v in variants}) == len(variants)
    for v in variants[1:]:
        changed = (
            (variant_world(spec, v) != spec)
            + (variant_train(TrainConfig(), v, 4000) != TrainConfig(steps=4000))
            + bool(v.study)
            + bool(v.finetune)
        )
        assert changed == 1, v.name
    full = next(v for v in variants if v.factor == "pretraining steps")
    assert variant_train(TrainConfig(), full, 4000) == TrainConfig()  # the recipe itself: the shipped checkpoint
    plain = variant_world(spec, next(v for v in variants if v.name == "no augmentation"))
    assert not any(r.augment for r in plain.relations)


def test_bad_variants_are_refused_before_any_training(tmp_path):
    with pytest.raises(ValueError, match="unknown world field.*'qa'"):
        ablate(tmp_path, [Variant("baseline", "-"), Variant("x", "-", world={"qa": 1})], spec=TINY)
    with pytest.raises(ValueError, match="first variant must be the baseline"):
        ablate(tmp_path, [Variant("x", "-", train={"d_model": 8})], spec=TINY)
    assert not (tmp_path / "variants").exists()


@pytest.mark.slow
def test_ablation_table_and_resume(tmp_path):
    variants = [
        Variant("baseline", "recipe"),
        Variant("mixed training", "qa", world={"qa_fraction": 0.5}),
        Variant("embeddings fine-tuned", "ft", finetune={"freeze_embeddings": False}),
    ]
    df = ablate(tmp_path, variants, spec=TINY, steps=10, train=TRAIN, config=CFG, progress=False)
    assert df.variant.tolist() == [v.name for v in variants]
    assert df.checkpoint.tolist() == ["own", "own", "baseline's"] and df.steps.tolist() == [10, 10, 10]
    assert ((df.recall >= 0) & (df.recall <= 1)).all() and df.readability.between(-1, 1).all()
    # the fine-tuning-only variant reuses the baseline's checkpoint and differs only in its study
    assert not (tmp_path / "variants" / "embeddings_fine_tuned" / "world").exists()
    cfg = json.loads((tmp_path / "variants" / "embeddings_fine_tuned" / "study" / "study.json").read_text())["config"]
    assert cfg["finetune"]["freeze_embeddings"] is False
    from lab.study.findings import ablation_section

    page = ablation_section(tmp_path)
    assert "--steps 10" in page and all(f"| {v.name} |" in page for v in variants)
    rel = (tmp_path / "ablation_relations.csv").read_text().splitlines()
    assert len(rel) == 1 + 3 * 4
    # a second call redoes nothing: same table, no checkpoint rewritten
    stamp = (tmp_path / "variants" / "mixed_training" / "world" / "model.safetensors").stat().st_mtime_ns
    again = ablate(tmp_path, variants, spec=TINY, steps=10, train=TRAIN, config=CFG, progress=False)
    assert again.equals(df)
    assert (tmp_path / "variants" / "mixed_training" / "world" / "model.safetensors").stat().st_mtime_ns == stamp
    # running only some variants keeps every finished row; other steps in the same folder are refused
    assert ablate(
        tmp_path, variants, spec=TINY, steps=10, train=TRAIN, config=CFG, progress=False, only=["mixed training"]
    ).equals(df)
    with pytest.raises(ValueError, match="holds an ablation with other steps"):
        ablate(tmp_path, variants, spec=TINY, steps=20, train=TRAIN, config=CFG, progress=False)
    with pytest.raises(ValueError, match="unknown variant"):
        ablate(tmp_path, variants, spec=TINY, steps=10, train=TRAIN, config=CFG, progress=False, only=["wide"])


@pytest.mark.parametrize("backend", ["nnsight", "transformer_lens"])
@pytest.mark.parametrize("freeze", [True, False])
def test_full_fine_tuning_leaves_embeddings_as_pretrained_by_default(model_dirs, freeze, backend):
    import interp

    m = interp.load_model(model_dirs["gpt2"], backend=backend)
    before = {id(p): p.detach().clone() for p in m.module.parameters()}
    emb = {id(mod.weight) for mod in m.module.modules() if isinstance(mod, torch.nn.Embedding)}
    tuned, info = finetune(
        m,
        ["the city is", "a country is"],
        ["Paris", "Rome"],
        ["Paris", "Rome"],
        "full",
        FinetuneConfig(max_steps=3, check_every=3, freeze_embeddings=freeze),
        seed=0,
    )
    assert tuned.backend_name == backend and tuned.module is not m.module
    pairs = list(zip(m.module.parameters(), tuned.module.parameters()))  # a deep copy: same order
    assert emb and len(pairs) == len(before)
    for orig, new in pairs:
        if id(orig) in emb:
            assert torch.equal(orig, new.detach()) == freeze
    assert not all(torch.equal(o, n.detach()) for o, n in pairs)  # the rest trained
    assert all(torch.equal(before[id(p)], p.detach()) for p in m.module.parameters())  # original untouched


def test_world_section_reads_a_saved_report(tmp_path):
    import pandas as pd

    from lab.study.findings import world_section

    df = pd.DataFrame(
        {
            "relation": ["a", "b", "c"],
            "n_answers": [4, 10, 2],
            "augment": [True, False, False],
            "recall": [0.9, 1.0, 0.95],
            "readability": [0.8, 0.2, 0.6],
            "chance": [0.25, 0.1, 0.5],
        }
    )
    df.to_csv(tmp_path / "report.csv", index=False)
    page = world_section(tmp_path / "report.csv")
    assert "Mean recall **0.950** (lowest a 0.900)" in page
    assert "the 1 augmented relations average 0.800 readability against 0.400 for the rest" in page
