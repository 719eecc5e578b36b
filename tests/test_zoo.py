"""The zoo of world models and the study across models."""

import json
import warnings
from dataclasses import asdict

import numpy as np
import pandas as pd
import pytest
import safetensors.torch as st
import torch
from conftest import SMALL_STUDY as SMALL
from scipy import stats as sps

import interp
from interp.models import resolve_path
from interp.trainable import lora_targets
from lab.study.compare import CompareError, compare_studies, kendalls_w
from lab.study.run import run_study
from lab.world import RelationSpec, WorldSpec, load_world, v3_spec
from lab.world import train as train_module
from lab.world.checkpoint import world_checkpoint_of
from lab.world.report import recall
from lab.world.spec import DEFAULT_RECIPE, RECIPES, default_spec, v4_recall_spec, v4_spec
from lab.world.train import ARCHS, TrainConfig, check_config, recipe, train_world_model
from lab.world.zoo import RENAMED, ZOO, zoo_model

TINY_SPEC = WorldSpec(
    seed=5,
    n_subjects=60,
    label_sentences=1,
    relations=(
        RelationSpec("city", "city", 4, templates=3, mentions=2, augment=True, bio=True),
        RelationSpec("sport", "sport", 3, templates=3, mentions=2, augment=True, bio=True),
        RelationSpec("month", "month", 4),
        RelationSpec("season", "season", 3),
    ),
)


def _tiny(arch: str, **kw) -> TrainConfig:
    return TrainConfig(arch=arch, steps=12, n_layers=1, d_model=32, batch_size=8, warmup=2, save_every=5, **kw)


# training ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("arch,kv", [("gpt2", None), ("llama", 2), ("neox", None)])
def test_each_family_trains_and_resumes_to_the_same_weights(arch, kv, tmp_path, monkeypatch):
    cfg = _tiny(arch, n_kv_heads=kv)
    whole = train_world_model(TINY_SPEC, tmp_path / "whole", cfg, progress=False)
    saved = train_module._save_state
    crashed = {}

    def crash_after_step_10(path, state):
        saved(path, state)
        if state["step"] == 10:
            crashed["epoch"] = state["epoch"]
            raise KeyboardInterrupt

    monkeypatch.setattr(train_module, "_save_state", crash_after_step_10)
    with pytest.raises(KeyboardInterrupt):
        train_world_model(TINY_SPEC, tmp_path / "resumed", cfg, progress=False)
    assert (tmp_path / "resumed.partial" / "state.pt").exists() and not (tmp_path / "resumed").exists()
    monkeypatch.setattr(train_module, "_save_state", saved)
    with pytest.raises(ValueError, match="another world spec or training config"):
        train_world_model(TINY_SPEC, tmp_path / "resumed", _tiny(arch, n_kv_heads=kv, lr=1e-3), progress=False)
    resumed = train_world_model(TINY_SPEC, tmp_path / "resumed", cfg, progress=False)
    a, b = st.load_file(whole / "model.safetensors"), st.load_file(resumed / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert not (tmp_path / "resumed.partial").exists()
    log_a, log_b = pd.read_csv(whole / "train_log.csv"), pd.read_csv(resumed / "train_log.csv")
    assert log_a.drop(columns="seconds").equals(log_b.drop(columns="seconds"))
    assert log_b.epoch.iloc[-1] > crashed["epoch"]  # the resumed part crosses an epoch (reshuffled rows)
    config = json.loads((whole / "config.json").read_text())
    family = {"gpt2": "gpt2", "llama": "llama", "neox": "gpt_neox"}[arch]
    assert config["model_type"] == family
    if arch == "llama":
        assert config["num_key_value_heads"] == 2 and config["num_attention_heads"] == 4
    model = interp.load_model(str(whole))
    assert model.model_type == family and world_checkpoint_of(model) == whole


def test_bad_training_configs_are_refused_before_work():
    for bad, match in [
        (TrainConfig(arch="mamba"), "must be one of gpt2, llama, neox"),
        (TrainConfig(arch="gpt2", n_kv_heads=2), "llama option"),
        (TrainConfig(arch="llama", n_kv_heads=3), "not a multiple of n_kv_heads"),
        (TrainConfig(d_model=130), "not a multiple of n_heads"),
    ]:
        with pytest.raises(ValueError, match=match):
            check_config(bad)
    assert set(ARCHS) == {"gpt2", "llama", "neox"}


def test_the_default_recipe_keeps_its_stage_key():
    """Fields added for the zoo (arch, n_kv_heads) at their defaults leave the shipped world
    model's recipe and its results' keys as they were."""
    from lab.stages import digest
    from lab.study.worlds import shipped_checkpoint

    assert digest(TrainConfig()) == "ef080fe7a6abf9a7"  # the key before the zoo existed
    assert digest(TrainConfig(arch="llama")) != digest(TrainConfig())
    assert shipped_checkpoint(v3_spec(seed=0, n_subjects=1000), TrainConfig()) is not None


# the shipped zoo -------------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("name", list(ZOO))
@pytest.mark.parametrize("backend", ["nnsight", "transformer_lens"])
def test_each_zoo_model_is_shipped_loads_on_both_backends_and_answers_its_facts(name, backend):
    entry = zoo_model(name)
    path = entry.checkpoint_dir()  # raises if the zoo model is not shipped
    assert (path / "train_log.csv").exists()
    trained = json.loads((path / "train_config.json").read_text())
    assert recipe(trained) == recipe(asdict(entry.train))  # shipped with the zoo entry's own recipe
    world = load_world(path)
    assert world.spec == RECIPES[entry.world](seed=0, n_subjects=1000)  # v3's zoo reads one world
    model = interp.load_model(name, backend=backend)
    assert model.model_type == entry.family
    hits = recall(model, world, subjects=world.subjects[::5])  # 200 subjects x every relation
    # v3 recalls every fact; v4 by design not the lead relations it is never asked in their words
    least = 0.95 if entry.world == "v3" else 0.7
    assert hits.correct.mean() >= least, f"{name} recalls {hits.correct.mean():.3f} on {backend}"


def test_lora_targets_are_named_per_family():
    from transformers import GPT2LMHeadModel, GPTNeoXForCausalLM, LlamaForCausalLM

    for arch, cls in [("gpt2", GPT2LMHeadModel), ("llama", LlamaForCausalLM), ("neox", GPTNeoXForCausalLM)]:
        with torch.device("meta"):
            model = train_module.build_model(_tiny(arch), 50, _Tok())
        assert isinstance(model, cls)
        names = {n.rsplit(".", 1)[-1] for n, m in model.named_modules() if isinstance(m, torch.nn.Module)}
        targets = lora_targets(model.config.model_type)
        assert all(t.rsplit(".", 1)[-1] in names for t in targets), (arch, targets)


class _Tok:
    eos_token_id, pad_token_id = 1, 0


# Kendall's W ----------------------------------------------------------------------------------------
def test_kendalls_w_matches_its_definitions_and_is_calibrated():
    rng = np.random.default_rng(0)
    scores = pd.DataFrame(rng.normal(size=(8, 4)))
    w = kendalls_w(scores, n_perm=2000)
    ranks = scores.rank().to_numpy()
    sums = ranks.sum(axis=1)
    by_hand = 12 * ((sums - sums.mean()) ** 2).sum() / (4**2 * (8**3 - 8))
    assert w["w"] == pytest.approx(by_hand) and w["w_untied"] == pytest.approx(by_hand)  # no ties
    # mean Spearman rho over pairs of models = (m W - 1) / (m - 1)
    rhos = [sps.spearmanr(scores[a], scores[b])[0] for a in range(4) for b in range(a + 1, 4)]
    assert np.mean(rhos) == pytest.approx((4 * by_hand - 1) / 3)
    same = pd.DataFrame({m: np.arange(8.0) for m in "abc"})
    assert (
        kendalls_w(same, n_perm=500)["w"] == pytest.approx(1.0) and kendalls_w(same, n_perm=500)["p_permutation"] < 0.01
    )
    null_p = [
        kendalls_w(pd.DataFrame(rng.normal(size=(6, 3))), n_perm=200, seed=i)["p_permutation"] for i in range(200)
    ]
    assert 0.02 <= np.mean(np.array(null_p) < 0.05) <= 0.10  # size 0.05 under independence
    assert np.isnan(kendalls_w(pd.DataFrame(rng.normal(size=(2, 3))))["w"])


# the study across models -------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_zoo_studies(tmp_path_factory):
    root = tmp_path_factory.mktemp("zoo")
    cfg = SMALL.__class__(
        n_finetune=3,
        methods=("full",),
        label_seeds=(0,),
        finetune_seeds=(0,),
        other_categories=(),
        n_null=100,
        folds=3,
        n_boot=50,
        n_perm=50,
        finetune=SMALL.finetune,
        keep_failed=True,
    )
    folders = []
    for arch in ("gpt2", "llama"):
        ckpt = train_world_model(
            TINY_SPEC, root / f"world_{arch}", _tiny(arch, n_kv_heads=2 if arch == "llama" else None), progress=False
        )
        out = root / f"study_{arch}"
        run_study(str(ckpt), out=out, config=cfg, progress=False)
        folders.append(out)
    return root, folders


@pytest.mark.slow
def test_compare_writes_the_cross_model_table_and_figures(tiny_zoo_studies):
    root, folders = tiny_zoo_studies
    out = root / "compare"
    table = compare_studies(folders, out, names=["tiny-gpt2", "tiny-llama"])
    assert list(table.model) == ["tiny-gpt2", "tiny-llama"] and list(table.family) == ["gpt2", "llama"]
    for folder, row in zip(folders, table.itertuples()):
        summary = json.loads((folder / "summary.json").read_text())
        assert row.r == summary["headline"]["pearson"]["r"] and row.relations == 4
        # four relations leave no degree of freedom for the joint partial: absent from the
        # summary, NaN in the table
        partial = summary["headline"].get("partial:all", {}).get("r", np.nan)
        assert row.partial_r_all == pytest.approx(partial, nan_ok=True)
        assert row.parameters == summary["architecture"]["parameters"] > 0
        assert summary["backend"] in ("nnsight", "transformer_lens")  # which backend measured it
    long = pd.read_csv(out / "compare_relations.csv")
    assert len(long) == 8 and set(long.relation) == {"city", "sport", "month", "season"}
    agree = json.loads((out / "compare_agreement.json").read_text())["kendalls_w"]
    assert agree["readability_kappa"]["n_relations"] == 4 and agree["readability_kappa"]["n_models"] == 2
    pairs = pd.read_csv(out / "compare_agreement.csv")
    wide = long.pivot(index="relation", columns="model", values="readability_kappa")
    rho = pairs[pairs.measure == "readability_kappa"].rho.iloc[0]
    assert rho == pytest.approx(sps.spearmanr(wide["tiny-gpt2"], wide["tiny-llama"])[0])
    assert (out / "figures" / "compare_scatter.html").exists() and (out / "figures" / "compare_forest.html").exists()


def test_compare_refuses_what_is_not_a_finished_study(tmp_path):
    with pytest.raises(CompareError, match="at least 2"):
        compare_studies([tmp_path])
    with pytest.raises(CompareError, match="not a finished study"):
        compare_studies([tmp_path, tmp_path / "x"])


def test_the_default_world_is_v4_recall_and_old_names_load_the_same_weights():
    """``world`` is the v4-recall recipe's model; ``world-v4`` (the default before) loads the
    checkpoint it always loaded, without a warning; the names from before v4 warn and load theirs."""
    assert DEFAULT_RECIPE == "v4-recall" and ZOO["world"].world == "v4-recall"
    assert load_world(ZOO["world"].checkpoint_dir()).spec == default_spec() == v4_recall_spec()
    assert load_world(ZOO["world-v4"].checkpoint_dir()).spec == v4_spec()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert resolve_path("world-v4") == ZOO["world-v4"].checkpoint_dir()
    assert "world-v4" not in RENAMED
    for old, new in RENAMED.items():
        with pytest.warns(FutureWarning, match=f"called {new!r} now"):
            assert resolve_path(old) == ZOO[new].checkpoint_dir()
        assert world_checkpoint_of(old) == ZOO[new].checkpoint_dir()
