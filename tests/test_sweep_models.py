"""Probe sweeps captured from models: the world model (both backends) and MiniLM on LRE data."""

import pytest

import interp
from interp.relations import load_relations, lre_dir
from lab.world import from_world, load_world
from probes import ProbeSweep, plots


@pytest.fixture(scope="module")
def world_relations():
    return from_world(load_world(), ["city", "continent", "hand"])


@pytest.mark.slow
def test_world_sweep_agrees_across_backends(world_relations):
    tables = {}
    for b in ("transformer_lens", "nnsight"):
        model = interp.load_model("world", backend=b)
        tables[b] = ProbeSweep(folds=3).run(model, world_relations)
    a, b = tables["transformer_lens"], tables["nnsight"]
    assert len(a) == 3 * 4 * 3 and (a.model == "world").all()
    assert (a[["relation", "site", "fold"]].values == b[["relation", "site", "fold"]].values).all()
    assert (a.accuracy - b.accuracy).abs().max() <= 0.01


@pytest.mark.slow
def test_minilm_sweep_over_layers_on_lre_relations(minilm_dir):
    relations = load_relations(
        [lre_dir() / "factual" / "person_plays_pro_sport.json", lre_dir() / "linguistic" / "word_first_letter.json"]
    )
    model = interp.load_model(minilm_dir, backend="nnsight")
    sites = [f"blocks.{l}.hook_resid_post" for l in range(model.n_layers)]
    sweep = ProbeSweep(sites=sites, folds=3)
    df = sweep.run(model, relations, model_name="all-MiniLM-L6-v2")
    assert set(df.layer) == set(range(6)) and set(df.relation) == {r.name for r in relations}
    best = df.groupby(["relation", "layer"]).accuracy.mean().groupby("relation").max()
    chance = df.groupby("relation").chance.first()
    assert (best > chance + 0.05).all(), best  # both answers are readable above chance
    assert best["plays pro sport"] > chance["plays pro sport"] + 0.15
    assert (df.dropped_subjects >= 0).all() and len(sweep.readout_) > 0
    fig = plots.layer_relation_heatmap(df)
    assert fig.data[0].z.shape == (2, 6)
    fig = plots.accuracy_by_layer(df)
    assert len(fig.data) == 4


def test_sweep_from_an_activation_store_equals_sweep_from_the_model(tmp_path, world_relations):
    model = interp.load_model("world", backend="nnsight")
    rel = world_relations[1]  # continent
    sites = [model.resid_site(l) for l in range(model.n_layers)]
    store = interp.capture(
        model,
        rel.prompts(),
        sites=sites,
        positions="subject_last",
        batch_size=64,  # as the sweep does
        store=tmp_path / "s",
        shard_size=320,
    )
    from_store = ProbeSweep(folds=3).run({rel.name: interp.ActivationStore(tmp_path / "s")}, [rel], model_name="world")
    from_model = ProbeSweep(folds=3).run(model, [rel])
    assert store.complete
    assert (from_store.accuracy.values == from_model.accuracy.values).all()
