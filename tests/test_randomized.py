"""The randomized causal test: a world whose writing is assigned per subject, equal exposure per
arm, the vectorized kappa, the randomization p-value's calibration and the experiment end to end."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest

from lab.world import RelationSpec, World, WorldSpec, build_tokenizer, v3_spec
from lab.world.arms import stratified_halves
from lab.world.spec import WorldSpecError, randomized_spec


def _arm_exposure(world: World) -> tuple[Counter, Counter, Counter]:
    """Per arm: mentions of the randomized facts, tokens and documents that state them."""
    tok = build_tokenizer(world.vocabulary())
    names = set(world.spec.randomized)
    mentions, tokens, docs = Counter(), Counter(), Counter()
    by_length = sorted(world.subjects, key=len, reverse=True)
    for text, rels in world.documents():
        if not rels or not set(rels) <= names or len(rels) < 2:
            continue  # question-form statements are the same for both arms (stratified), counted below
        arms = set()
        for sentence in [x.strip() + " ." for x in text.split(" .") if x.strip()]:
            subject = next(s for s in by_length if sentence.startswith(s + " "))
            arm = world.arm[subject]
            arms.add(arm)
            mentions[arm] += 1
            tokens[arm] += len(tok(sentence, add_special_tokens=False)["input_ids"])
        assert len(arms) == 1, "a document mixes the arms"
        docs[arms.pop()] += 1
    return mentions, tokens, docs


def test_randomized_world_gives_both_arms_the_same_exposure():
    world = World.generate(randomized_spec())
    assert (
        Counter(world.arm.values()) == {"augmented": 499, "plain": 501}
        or abs(Counter(world.arm.values())["augmented"] - 500) <= 6
    )
    mentions, tokens, docs = _arm_exposure(world)
    for count in (mentions, tokens, docs):
        a, p = count["augmented"], count["plain"]
        assert abs(a - p) / max(a, p) < 0.01, count
    # every subject's facts are mentioned as often as in the default world, in both arms
    default = World.generate(v3_spec())
    for s in world.subjects[:200]:
        for r in world.spec.randomized:
            assert world.mentions(s, r) == default.mentions(s, r)


def test_arms_are_balanced_within_strata_and_other_relations_untouched():
    world = World.generate(randomized_spec())
    by = Counter((world.stratum(s), world.arm[s]) for s in world.subjects)
    for stratum in {world.stratum(s) for s in world.subjects}:
        assert abs(by[(stratum, "augmented")] - by[(stratum, "plain")]) <= 1
    mine, default = world.relation_digests(), World.generate(v3_spec()).relation_digests()
    for r in world.relation:
        assert (mine[r] == default[r]) == (r not in world.spec.randomized), r
    # augmented arm: a subject's randomized facts together, in varied templates; plain: one each, canonical
    aug = next(s for s in world.subjects if world.arm[s] == "augmented")
    plain = next(s for s in world.subjects if world.arm[s] == "plain")
    texts = [t for t, rels in world.documents() if set(rels) <= set(world.spec.randomized) and len(rels) > 1]
    aug_docs = [t for t in texts if t.startswith(aug + " ")]
    assert aug_docs and all(t.count(aug + " ") == len(world.spec.randomized) for t in aug_docs)
    plain_docs = [t for t in texts if plain + " " in t]
    assert plain_docs and all(t.count(plain + " ") == 1 for t in plain_docs)


def test_randomized_spec_checks_and_round_trips():
    spec = randomized_spec()
    assert WorldSpec.from_json(spec.to_json()) == spec
    with pytest.raises(WorldSpecError, match="not written in augmented biographies"):
        replace(v3_spec(), randomized=("month",)).validate()
    with pytest.raises(WorldSpecError, match="not relations of the world"):
        replace(v3_spec(), randomized=("nope",)).validate()


def test_stratified_halves_splits_every_stratum_and_is_uniform():
    strata = [0] * 5 + [1] * 4 + [2] * 1
    draws = stratified_halves(strata, np.random.default_rng(0), 4000)
    s = np.array(strata)
    for k, size in ((0, 5), (1, 4), (2, 1)):
        counts = draws[:, s == k].sum(1)
        assert set(counts) <= {size // 2, size // 2 + size % 2}
    # each unit is augmented half the time
    assert np.allclose(draws.mean(0), 0.5, atol=0.04)


def test_arm_kappas_equal_cohens_kappa_on_each_subset():
    from lab.study.randomized import arm_kappas
    from probes.chance import kappa

    rng = np.random.default_rng(1)
    truth = rng.integers(0, 4, 60)
    pred = np.where(rng.random(60) < 0.5, truth, rng.integers(0, 4, 60))
    masks = rng.random((7, 60)) < 0.5
    got = arm_kappas(truth, pred, masks)
    want = [kappa(list(truth[m]), list(pred[m])) for m in masks]
    np.testing.assert_allclose(got, want, atol=1e-12)


def _null_heldouts(rng, n_subjects, relations, effect=0.0, augmented=None):
    """Held-out predictions of a simulated world: right with probability 0.5 (+ effect/2 in the
    augmented arm), else a random wrong label of 4."""
    from lab.study.randomized import HeldOut

    out = []
    for r in relations:
        subjects = np.sort(rng.choice(n_subjects, n_subjects * 3 // 4, replace=False))
        truth = rng.integers(0, 4, len(subjects))
        acc = np.full(len(subjects), 0.5)
        if augmented is not None:
            acc += effect / 2 * np.where(augmented[subjects], 1, -1)
        right = rng.random(len(subjects)) < acc
        pred = np.where(right, truth, (truth + rng.integers(1, 4, len(subjects))) % 4)
        out.append(HeldOut(r, "both", 0, subjects, truth, pred))
    return out


@pytest.mark.slow
def test_randomization_p_is_calibrated_on_a_world_with_no_effect():
    """200 simulated worlds in which the arm changes nothing: the p-values are uniform (5% of them
    below 0.05, within binomial error; a KS test does not reject)."""
    from scipy import stats

    from lab.study.randomized import randomization_test

    rng = np.random.default_rng(0)
    n, rels = 120, ["a", "b", "c"]
    strata = [i % 3 for i in range(n)]
    ps = []
    for _ in range(200):
        arms = stratified_halves(strata, rng)
        heldouts = _null_heldouts(rng, n, rels)
        result = randomization_test(
            heldouts, {"m": rels[:2], "c": rels[2:]}, strata, arms, 199, int(rng.integers(1 << 30))
        )
        ps.append(result["m"]["p_value"])
    ps = np.array(ps)
    assert 0.01 <= (ps < 0.05).mean() <= 0.10
    assert stats.kstest(ps, "uniform").pvalue > 0.01
    # and it has power against a planted effect
    arms = stratified_halves(strata, rng)
    planted = _null_heldouts(rng, n, rels, effect=0.5, augmented=arms)
    assert randomization_test(planted, {"all": rels}, strata, arms, 499, 0)["all"]["p_value"] < 0.01
    # T is defined on fine-tunes from both arms: a one-arm fine-tune with a huge effect never enters it
    from lab.study.randomized import HeldOut

    one_arm = [HeldOut(h.relation, "augmented", h.seed, h.subjects, h.truth, h.truth) for h in planted]
    base = randomization_test(heldouts, {"all": rels}, strata, arms, 99, 0)["all"]
    assert randomization_test(heldouts + one_arm, {"all": rels}, strata, arms, 99, 0)["all"] == base


def test_power_grows_with_the_effect():
    from lab.study.randomized import power_analysis, smallest_detectable

    cells = pd.DataFrame(
        [{"relation": r, "arm": a, "n_heldout": 300, "n_labels": 8} for r in "abcd" for a in ("augmented", "plain")]
    )
    power = power_analysis(cells, 0.3, [0.0, 0.05, 0.1, 0.2], n_sims=400, seed=0)
    assert 0.02 <= power.power.iloc[0] <= 0.09  # the test's size: 0.05
    assert power.power.is_monotonic_increasing and power.power.iloc[-1] > 0.95
    assert 0.0 < smallest_detectable(power) <= 0.2


TINY = WorldSpec(
    seed=3,
    n_subjects=80,
    label_sentences=1,
    relations=(
        RelationSpec("city", "city", 4, templates=3, mentions=2, augment=True, bio=True),
        RelationSpec("sport", "sport", 3, templates=3, mentions=2, augment=True, bio=True),
        RelationSpec("month", "month", 4),
        RelationSpec("season", "season", 3),
    ),
    randomized=("city", "sport"),
)


def test_randomized_causal_test_end_to_end_and_resumes(tmp_path, monkeypatch):
    from lab.study import randomized
    from lab.study.finetune import FinetuneConfig
    from lab.study.randomized import CausalConfig, randomized_causal_test
    from lab.world import TrainConfig

    config = CausalConfig(
        study=randomized.StudyConfig(
            methods=("full",), other_categories=(), n_finetune=2, folds=3, finetune=FinetuneConfig(max_steps=20)
        ),
        seeds=(0,),
        n_redraws=99,
        n_boot=50,
        power_sims=50,
    )
    train = TrainConfig(steps=10, n_layers=1, d_model=32, batch_size=8)
    df = randomized_causal_test(tmp_path, spec=TINY, train=train, config=config, progress=False)
    assert set(df.relation) == {"city", "sport", "month", "season"}
    assert list(df.group) == ["manipulated", "manipulated", "control", "control"]
    summary = json.loads((tmp_path / "randomized.json").read_text())
    assert summary["decision"] in ("supports", "refutes", "open")
    assert 0 < summary["primary_mean_delta_generalization"]["p_value"] <= 1
    assert summary["primary_mean_delta_generalization"]["n_redraws"] == 99
    runs = sorted(p.name for p in (tmp_path / "runs").glob("*.json"))
    assert len(runs) == 4 + 2 * 2  # both arms for every relation, one arm for each manipulated one
    arms = pd.read_csv(tmp_path / "randomized_arms.csv")
    assert set(arms.source) == {"both", "augmented", "plain"}
    assert (tmp_path / "power.csv").exists()
    assert (tmp_path / "figures" / "randomized_effects.html").exists()
    for what in ("readability", "generalization"):  # per-relation CIs hold their estimates
        d, low, high = df[f"delta_{what}"], df[f"delta_{what}_ci_low"], df[f"delta_{what}_ci_high"]
        ok = d.notna() & low.notna()
        assert ok.any() and ((low[ok] <= d[ok] + 1e-9) & (d[ok] <= high[ok] + 1e-9)).all(), what

    def refuse(*a, **k):
        raise AssertionError("a finished fine-tune was recomputed")

    monkeypatch.setattr(randomized, "finetune", refuse)
    again = randomized_causal_test(tmp_path, spec=TINY, train=train, config=config, progress=False)
    pd.testing.assert_frame_equal(df, again)


def test_the_decision_rule():
    from lab.study.randomized import decide

    ci = lambda e, lo, hi, p=None: {"estimate": e, "ci_low": lo, "ci_high": hi, "p_value": p}  # noqa: E731
    stage, slope = ci(0.1, 0.05, 0.15), ci(0.8, 0.6, 1.0)
    assert decide(stage, ci(0.08, 0.02, 0.1, 0.001), ci(0.0, -0.02, 0.02), ci(0.8, 0.2, 1.2), slope) == "supports"
    # a control effect leaves it open, however small the primary p
    assert decide(stage, ci(0.08, 0.02, 0.1, 0.001), ci(0.03, 0.01, 0.05), ci(0.8, 0.2, 1.2), slope) == "open"
    # first stage, no effect, beta's CI below the slope: refutes
    assert decide(stage, ci(0.0, -0.02, 0.02, 0.6), ci(0.0, -0.02, 0.02), ci(0.0, -0.3, 0.3), slope) == "refutes"
    # no first stage: open
    assert (
        decide(ci(0.0, -0.05, 0.05), ci(0.0, -0.02, 0.02, 0.6), ci(0.0, -0.02, 0.02), ci(0.0, -0.3, 0.3), slope)
        == "open"
    )
