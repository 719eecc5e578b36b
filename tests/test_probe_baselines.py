"""Probe baselines: input embeddings and random-weight models, with the sweep's own probe."""

import numpy as np
import pytest
import torch

import interp
from interp.relations import Relation
from probes import ProbeSweep
from probes.baselines import embedding_states, random_weights
from probes.readability import probe_kappa

NAMES = "Vorn Kallit Mira Tesh Oba Lunde Sarn Queth".split()
COUNTRY = {"Paris": "France", "Berlin": "Germany", "Rome": "Italy", "Madrid": "Spain", "Tokyo": "Japan"}


def _relations():
    subjects = [f"{n} {c}" for n in NAMES for c in COUNTRY]
    # the answer is a token of the subject (its last one): readable from the string alone
    surface = Relation("surface", subjects, [COUNTRY[s.split()[1]] for s in subjects], "{} lives in")
    # the answer depends on the first token only: the last token's embedding cannot hold it
    hidden = Relation("hidden", subjects, ["even" if NAMES.index(s.split()[0]) % 2 else "odd" for s in subjects],
                      "{} lives in")  # fmt: skip
    return [surface, hidden]


@pytest.fixture(scope="module")
def model(model_dirs):
    return interp.load_model(str(model_dirs["gpt2"]))


@pytest.fixture(scope="module")
def swept(model):
    sweep = ProbeSweep(folds=4, baselines=True, baseline_seeds=(0, 1))
    return sweep, sweep.run(model, _relations())


def test_a_planted_surface_relation_reads_high_on_the_embedding_and_near_zero_above_it(swept):
    sweep, table = swept
    surface = table[table.relation == "surface"]
    assert surface.embedding_kappa.min() > 0.95  # the city token's embedding names the country
    assert (surface.kappa_above_baseline.abs() < 0.05).all()
    hidden = table[table.relation == "hidden"]
    # the last token says nothing of the first (cross-validation on uninformative states reads
    # below chance: each held-out fold is short of the classes its training folds hold more of)
    assert hidden.embedding_kappa.max() < 0.1
    assert {"kappa", "embedding_kappa", "random_kappa", "baseline_kappa", "kappa_above_baseline"} <= set(table)
    assert np.allclose(table.baseline_kappa, table[["embedding_kappa", "random_kappa"]].max(axis=1))
    assert np.allclose(table.kappa_above_baseline, table.kappa - table.baseline_kappa)
    long = sweep.baselines_
    assert set(long.baseline) == {"embedding", "random"} and set(long[long.baseline == "random"].seed) == {0, 1}
    assert len(long[long.baseline == "random"]) == 2 * 2 * 2  # 2 seeds x 2 relations x 2 layers


def test_the_embedding_baseline_equals_a_hand_built_scikit_learn_probe(model, swept):
    _, table = swept
    rels = _relations()
    states = embedding_states(model, rels, "subject_last")
    for rel in rels:
        x = states[rel.name]["hook_embed"].numpy()
        ref = probe_kappa(x, rel.answers, folds=4, seed=0)  # StandardScaler + LogisticRegression, same folds
        got = table[table.relation == rel.name].embedding_kappa.iloc[0]
        assert got == pytest.approx(ref, abs=0.03), rel.name


def test_random_weights_are_seeded_fresh_and_of_the_same_architecture(model):
    a, b, c = random_weights(model, 0), random_weights(model, 0), random_weights(model, 1)
    pa, pb, pc, pm = (dict(m.hf_model.named_parameters()) for m in (a, b, c, model))
    assert pa.keys() == pm.keys() and type(a.hf_model) is type(model.hf_model)
    assert all(torch.equal(pa[k], pb[k]) for k in pa)
    assert not all(torch.equal(pa[k], pc[k]) for k in pa if pa[k].dim() > 1)
    # (the tiny test model is itself HuggingFace's initialization under seed 0; seed 1 is not it)
    assert not torch.equal(pc["transformer.h.0.mlp.c_fc.weight"], pm["transformer.h.0.mlp.c_fc.weight"])
    assert a.tokenizer is model.tokenizer and a.backend_name == model.backend_name


def test_baselines_refuse_what_they_cannot_rebuild(model):
    rels = _relations()
    stored = {r.name: {"x": torch.zeros(len(r), 4)} for r in rels}
    with pytest.raises(ValueError, match="needs a model"):
        ProbeSweep(folds=4, baselines=True).run(stored, rels)
    with pytest.raises(ValueError, match="keep readout=True"):
        ProbeSweep(folds=4, baselines=True, readout=False).run(model, rels)
