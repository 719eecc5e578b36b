"""Erasure and steering: the erased activations on both backends, the eraser's data, readability
after erasure, and the whole test on a tiny random LM (both backends) and on the world model."""

import importlib
import itertools
import json

import numpy as np
import pandas as pd
import pytest
import torch
from conftest import BACKENDS
from tiny_models import build

import interp
import lab.study.interventions as iv
import lab.study.interventions.arms as arms
from interp.prompts import Prompt
from interp.relations import Relation
from lab.study import FinetuneConfig, StudyConfig
from lab.study.interventions import InterventionConfig, Interventions, SubjectEnd, erasing, steering
from lab.study.run import real_model_config
from probes.erasure import fit_leace, random_subspace

# the module (the package's name `steering` is the hook function it exports)
steering_arm = importlib.import_module("lab.study.interventions.steering")

PLACES = "Paris Berlin Rome Madrid Tokyo Vorn Kallit Mira Tesh Oba Lunde Sarn Queth".split()
TEMPLATE = "{} is located in"


def _tiny(backend):
    hf, tok = build("gpt2")
    return interp.load_model(hf, backend=backend, tokenizer=tok)


def _subjects(n):
    return [" ".join(p) for p in itertools.permutations(PLACES, 2)][:n]


def _relations():
    answers = ["France", "Germany", "Italy", "Spain"]
    rels = []
    for k, name in enumerate(["r0", "r1", "r2", "r3"]):
        subj = _subjects(60)
        rels.append(
            Relation(
                name, subj, [answers[(i * (k + 1) + i // 7) % (2 + k % 3)] for i in range(len(subj))], "{} lives in"
            )
        )
    return rels


def test_eraser_math_against_the_package_and_a_random_control():
    rng = np.random.default_rng(0)
    y = rng.integers(0, 4, 300)
    x = torch.tensor(rng.normal(size=(300, 16)) + np.eye(4, 16)[y] * 3, dtype=torch.float32)
    e = fit_leace(x, y)
    assert e.rank == 3
    from concept_erasure import LeaceEraser

    ref = LeaceEraser.fit(x.double(), torch.nn.functional.one_hot(torch.as_tensor(y)).double())
    torch.testing.assert_close(e(x), ref(x.double()).float(), atol=1e-4, rtol=0)
    xe = e(x).double()
    cross = (xe - xe.mean(0)).T @ (torch.nn.functional.one_hot(torch.as_tensor(y)).double() - 0.25) / len(y)
    assert cross.abs().max() < 1e-6  # no linear information about the class left
    r = random_subspace(x, 3, seed=0)
    assert r.rank == 3 and torch.allclose(r(r(x)), r(x), atol=1e-4)  # a projection


def test_erased_and_steered_activations_are_identical_on_both_backends():
    prompts = [Prompt(TEMPLATE.format(s), s) for s in _subjects(12)]
    site = "blocks.0.hook_resid_post"
    got = {}
    for backend in BACKENDS:
        model = _tiny(backend)
        locate = SubjectEnd(model.tokenizer, prompts)
        before = interp.capture(model, prompts, sites=[site], positions="all", progress=False)[site]
        sub = interp.capture(model, prompts, sites=[site], positions="subject_last", progress=False)[site]
        eraser = fit_leace(sub, [i % 3 for i in range(len(prompts))])
        after = interp.capture(
            model.intervened(site, erasing(locate, eraser)), prompts, sites=[site], positions="all", progress=False
        )[site]
        last = [len(model.tokenizer(p.subject)["input_ids"]) - 1 for p in prompts]
        for i, pos in enumerate(last):  # erased at the subject's last token, untouched elsewhere
            torch.testing.assert_close(after[i, pos], eraser(before[i, pos]), atol=1e-5, rtol=0)
            other = [j for j in range(before.shape[1]) if j != pos]
            torch.testing.assert_close(after[i, other], before[i, other], atol=0, rtol=0)
        enc = model.tokenizer([p.text for p in prompts])
        keys = [locate.prefix(ids, m) for ids, m in zip(enc["input_ids"], enc["attention_mask"])]
        vec = {keys[0]: torch.ones(model.d_model)}
        steered = interp.capture(
            model.intervened(site, steering(locate, vec)), prompts, sites=[site], positions="all", progress=False
        )[site]
        torch.testing.assert_close(steered[0, last[0]], before[0, last[0]] + 1, atol=1e-5, rtol=0)
        torch.testing.assert_close(steered[1:], before[1:], atol=0, rtol=0)
        got[backend] = after
    torch.testing.assert_close(got["nnsight"], got["transformer_lens"], atol=1e-5, rtol=0)


def test_subject_end_refuses_a_template_it_cannot_find():
    model = _tiny("nnsight")
    with pytest.raises(ValueError, match="no words after the subject"):
        SubjectEnd(model.tokenizer, [Prompt("the Paris", "Paris")])
    with pytest.raises(ValueError, match="template differs"):
        SubjectEnd(model.tokenizer, [Prompt("Paris is located in", "Paris"), Prompt("Rome lives in", "Rome")])


def _tiny_study_config():
    return real_model_config(
        label_seeds=(0,),
        finetune_seeds=(0,),
        folds=3,
        n_boot=100,
        n_perm=100,
        n_null=100,
        finetune=FinetuneConfig(template=TEMPLATE, lr=3e-3, max_steps=20, check_every=10),
    )


def test_steering_controls_draw_from_their_stated_distributions():
    rng = np.random.default_rng(0)
    x = torch.as_tensor(rng.normal(size=(40, 6)), dtype=torch.float32)
    y = ["a"] * 10 + ["b"] * 14 + ["c"] * 16
    means = steering_arm.class_means(x, y)
    assert sorted(means) == ["a", "b", "c"] and torch.allclose(means["b"], x[10:24].mean(0))
    v = steering_arm.directions(means, [("a", "b"), ("c", "a")], 2.5)
    assert torch.allclose(v[0], (means["b"] - means["a"]) / (means["b"] - means["a"]).norm() * 2.5)
    assert all(abs(float(d.norm()) - 2.5) < 1e-5 for d in v)  # every control has the steering vector's norm
    # Cramér's V: 0 for independent labels, 1 when one determines the other
    assert steering_arm.cramers_v(list("aabb") * 5, list("abab") * 5) == pytest.approx(0.0)
    assert steering_arm.cramers_v(list("aabbcc"), list("xxyyzz")) == pytest.approx(1.0)
    # the other-relation control: the least associated relation on the same subjects, never the
    # relation itself or one that determines it
    subjects = [f"s{i}" for i in range(40)]
    own = Relation("own", subjects, [f"o{i % 4}" for i in range(40)], "{} is")
    derived = Relation("derived", subjects, [f"d{(i % 4) // 2}" for i in range(40)], "{} is")  # a function of own
    unrelated = Relation("unrelated", subjects, [f"u{(i // 4) % 2}" for i in range(40)], "{} is")
    sparse = Relation("sparse", subjects[:10], ["x", "y"] * 5, "{} is")  # covers too few subjects
    name, answers = steering_arm.control_relation(own, [own, derived, unrelated, sparse], subjects)
    assert name == "unrelated" and answers == dict(zip(subjects, unrelated.answers))
    assert steering_arm.control_relation(own, [own, sparse], subjects) == (None, {})


TINY_LABELS = {"animals": ("city", "country", "capital", "born", "part"), "vehicles": ("the", "a", "of", "on", "at")}


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
def test_interventions_end_to_end_on_a_tiny_random_lm(backend, tmp_path):
    model = _tiny(backend)
    cfg = InterventionConfig(n_random=2, n_boot=100)
    table = Interventions(
        model, _relations(), tmp_path, cfg, _tiny_study_config(), backend=backend, progress=False, labels=TINY_LABELS
    ).run()
    assert len(table) == 4 and (table["rank"] == table.n_answers - 1).all()
    arms = pd.read_csv(tmp_path / "arms.csv")
    kinds = {"none", "leace", "shuffled", "random"}
    kinds |= {f"{p}{k}" for p in ("bottleneck_", "alltoken_") for k in ("leace", "shuffled", "random")}
    assert set(arms.kind) == kinds and len(arms) == 4 * 13
    assert table.recall_none.between(0, 1).all()
    assert {
        "recall_bottleneck_leace",
        "bottleneck_excess_drop",
        "recall_alltoken_leace",
        "alltoken_excess_drop",
    } <= set(table)
    assert (table.alltoken_leftover_covariance < 1e-4).all() and (table.alltoken_sites == model.n_layers).all()
    assert (table.layer < model.n_layers - 1).all()  # never the last block, where nothing downstream reads the subject
    s = json.loads((tmp_path / "interventions.json").read_text())
    assert s["n_relations"] == 4 and "excess_drop_vs_readability" in s
    assert (tmp_path / "interventions.html").exists() and (tmp_path / "figures" / "interventions_erasure.html").exists()
    steer = pd.read_csv(tmp_path / "steering.csv") if (tmp_path / "steering.csv").stat().st_size > 1 else pd.DataFrame()
    if len(steer):
        assert steer.switched_random.between(0, 1).all() and (steer.answer != steer.target_answer).all()


@pytest.mark.slow
def test_interventions_with_only_the_all_token_arms(tmp_path):
    """A run without the layer and bottleneck arms (the real-model run's design) fine-tunes only
    the all-token arms and still reports (recall with the layer's eraser, steering)."""
    cfg = InterventionConfig(n_random=1, n_boot=50, bottleneck=False, layer=False)
    run = Interventions(
        _tiny("nnsight"), _relations()[:3], tmp_path, cfg, _tiny_study_config(), progress=False, labels=TINY_LABELS
    )
    table = run.run()
    arms = pd.read_csv(tmp_path / "arms.csv")
    assert set(arms.kind) == {"none", "alltoken_leace", "alltoken_shuffled", "alltoken_random"} and len(arms) == 3 * 4
    assert "excess_drop" not in table and "alltoken_excess_drop" in table
    text = iv.section(tmp_path)
    assert "At every subject token" in text and "most readable layer" not in text


WORLD_RELATIONS = ["continent", "hand", "season", "diet"]


@pytest.mark.slow
def test_world_erasure_is_at_chance_uses_only_finetuning_subjects_and_resumes(tmp_path, monkeypatch):
    seen, seen_input = [], []
    fit = arms.fit_erasers

    def spy(x, answers, n_random, seed, prefix=""):
        (seen_input if prefix else seen).append(x.clone())
        return fit(x, answers, n_random, seed, prefix)

    monkeypatch.setattr(arms, "fit_erasers", spy)
    drawn = []  # (means, pairs, norm) of every class-structured steering direction
    directions = steering_arm.directions

    def spy_directions(means, pairs, norm):
        drawn.append((means, list(pairs), norm))
        return directions(means, pairs, norm)

    monkeypatch.setattr(steering_arm, "directions", spy_directions)
    study_cfg = StudyConfig(
        finetune_budget=(60, 90),
        label_seeds=(0,),
        finetune_seeds=(0,),
        other_categories=(),
        nonlinear_probes=(),
        folds=3,
        n_boot=100,
        n_perm=100,
        n_null=100,
        finetune=FinetuneConfig(max_steps=60, check_every=10),
    )
    run = Interventions(
        "world-v3", WORLD_RELATIONS, tmp_path, InterventionConfig(n_random=2, n_boot=200), study_cfg, progress=False
    )
    table = run.run()
    # the eraser saw exactly the fine-tuning subjects' states, never a held-out one
    for x, name in zip(seen, WORLD_RELATIONS):
        r = run.study.relations[name]
        d = run.study.design(r, "animals", 0)
        layer = int(table.set_index("relation").loc[name, "layer"])
        ft = iv.states(
            run.model,
            [Prompt(study_cfg.finetune.template.format(r.subjects[i]), r.subjects[i]) for i in d.finetune],
            layer,
        )
        torch.testing.assert_close(x, ft, atol=1e-5, rtol=0)
        assert len(x) == len(d.finetune) < len(d.finetune) + len(d.heldout)
        # the bottleneck erasers saw the fine-tuning subjects' embedding rows of their last token (the
        # family name, a token of its own)
        rows = run.model.input_embeddings().detach()
        last = [run.model.tokenizer.tokenize(" " + r.subjects[i])[-1] for i in d.finetune]
        ids = run.model.tokenizer.convert_tokens_to_ids(last)
        torch.testing.assert_close(seen_input[WORLD_RELATIONS.index(name)], rows[ids].float(), atol=1e-5, rtol=0)
    # the bottleneck erasure leaves no linear information in the embedding rows it was fitted on
    assert (table.bottleneck_leftover_covariance < 1e-4).all()
    assert (table.bottleneck_probe_after_kappa < 0.1).all() and table.bottleneck_probe_before_kappa.max() > 0.3
    # and a fine-tune cannot put it back there: the embedding tables are frozen
    r = run.study.relations[WORLD_RELATIONS[0]]
    d = run.study.design(r, "animals", 0)
    tuned, _ = arms.finetune(
        run.model,
        [study_cfg.finetune.template.format(r.subjects[i]) for i in d.finetune],
        [d.mapping[r.answers[i]] for i in d.finetune],
        d.labels,
        "full",
        study_cfg.finetune,
        seed=0,
    )
    torch.testing.assert_close(tuned.input_embeddings(), run.model.input_embeddings())
    # recall of the original relation: erasing the answer lowers it, a random subspace of that rank barely does
    # (per relation it need not: a late layer's erasure can leave recall whole, e.g. continent at layer 2)
    assert table.recall_none.mean() > 0.5
    assert table.recall_leace.mean() < table.recall_random.mean() - 0.05
    assert table.recall_bottleneck_leace.mean() < table.recall_bottleneck_random.mean()
    # readability after erasure is at chance on the fitted states, while it was high before
    assert (table.layer < run.model.n_layers - 1).all()
    assert (table.leftover_covariance < 1e-4).all()
    # (a probe refitted with the eraser inside each fold: small samples scatter around 0, below it too)
    assert (table.probe_after_kappa < 0.1).all(), table[["relation", "probe_before_kappa", "probe_after_kappa"]]
    assert table.probe_before_kappa.max() > 0.3
    assert (table.transfer_after_kappa < table.transfer_before_kappa).all()
    # steering: this relation's class means, then shuffled answers' (same classes, wrong members),
    # then another relation's on the same states; all of one norm
    assert len(drawn) == 3 * len(WORLD_RELATIONS)
    for k, name in enumerate(WORLD_RELATIONS):
        (own, _, n0), (shuffled, _, n1), (other, pairs, n2) = drawn[3 * k : 3 * k + 3]
        row = table.set_index("relation").loc[name]
        assert own.keys() == shuffled.keys() and n0 == n1 == n2 == row.steer_norm
        assert not all(torch.allclose(own[a], shuffled[a]) for a in own)
        other_relation = run.study.relations[row.other_relation]
        assert row.other_relation != name and set(other) <= set(other_relation.answers)
        assert all(a in other and b in other and a != b for a, b in pairs)
    steer = pd.read_csv(tmp_path / "steering.csv")
    assert {"switched_shuffled", "switched_other", "other_relation"} <= set(steer)
    assert {"switch_excess_shuffled", "switch_excess_other"} <= set(table)
    # a second run reads every arm from disk: no fine-tune runs again, same tables
    for module in (arms, steering_arm):
        monkeypatch.setattr(module, "finetune", lambda *a, **k: pytest.fail("a finished arm was fine-tuned again"))
    again = Interventions(
        "world-v3", WORLD_RELATIONS, tmp_path, InterventionConfig(n_random=2, n_boot=200), study_cfg, progress=False
    ).run()
    pd.testing.assert_frame_equal(table, again)


def test_subject_tokens_finds_every_subject_token_in_any_batch():
    from interp.positions import SubjectTokens
    from interp.tokens import encode, subject_tokens

    model = _tiny("nnsight")
    tok = model.tokenizer
    prompts = [Prompt(TEMPLATE.format(s), s) for s in ["Paris", "Vorn Kallit", "Madrid Tesh Oba"]]
    locate = SubjectTokens(tok, prompts)
    want = [subject_tokens(e, p, i) for i, (p, e) in enumerate(zip(prompts, encode(tok, prompts)))]
    assert [len(w) for w in want] != [1, 1, 1]  # multi-token subjects are exercised
    for side in ("left", "right"):
        batch = model.batch(model.encode(prompts[::-1] + [p.text + " France" for p in prompts[:1]]), side)
        rows, pos, off = locate(batch)
        lead = [int((m == 0).sum()) if side == "left" else 0 for m in batch.attention_mask]
        for r, p in enumerate(prompts[::-1] + prompts[:1]):  # reordered, padded, extended by a candidate
            w = want[prompts.index(p)]
            got = sorted(int(q) - lead[r] for q in pos[rows == r])
            assert got == w and sorted(off[rows == r].tolist()) == list(range(len(w)))
            assert int(pos[(rows == r) & (off == 0)]) - lead[r] == w[-1]  # offset 0: the subject's last token
    with pytest.raises(ValueError, match="not one of the prompts"):
        locate(model.batch(model.encode([TEMPLATE.format("Rome")])))


def test_all_token_erasure_acts_at_every_subject_token_by_group_on_both_backends():
    from interp.positions import SubjectTokens

    prompts = [Prompt(TEMPLATE.format(s), s) for s in _subjects(12)]
    site = "blocks.0.hook_resid_post"
    got = {}
    for backend in BACKENDS:
        model = _tiny(backend)
        locate = SubjectTokens(model.tokenizer, prompts)
        x, off, idx = arms.token_states(model, [p.text for p in prompts], locate, site)
        y = [i % 3 for i in idx.tolist()]
        erasers = {
            g: fit_leace(x[off.clamp(max=1) == g], [v for v, o in zip(y, off) if min(int(o), 1) == g]) for g in (0, 1)
        }
        before = interp.capture(model, prompts, sites=[site], positions="all", progress=False)[site]
        after = interp.capture(
            model.intervened(site, arms.erasing_tokens(locate, erasers)),
            prompts,
            sites=[site],
            positions="all",
            progress=False,
        )[site]
        batch = model.batch(model.encode(prompts), "right")
        rows, pos, offs = locate(batch)
        touched = torch.zeros(before.shape[:2], dtype=torch.bool)
        for r, p, o in zip(rows.tolist(), pos.tolist(), offs.tolist()):
            torch.testing.assert_close(after[r, p], erasers[min(o, 1)](before[r, p]), atol=1e-5, rtol=0)
            touched[r, p] = True
        assert touched.sum() > len(prompts)  # earlier subject tokens too, not only the last
        torch.testing.assert_close(after[~touched], before[~touched], atol=0, rtol=0)
        got[backend] = after
    torch.testing.assert_close(got["nnsight"], got["transformer_lens"], atol=1e-5, rtol=0)


@pytest.mark.slow
def test_all_token_erasers_leave_no_linear_trace_at_any_site_of_the_world_model(tmp_path):
    """Fitted site after site on the fine-tuning subjects alone: at every site, with the earlier
    sites' erasers standing, each token group's states keep no cross-covariance with the answer;
    random controls have LEACE's rank at every site and group; recall falls under LEACE, not under
    random subspaces."""
    study_cfg = StudyConfig(
        finetune_budget=(60, 90),
        label_seeds=(0,),
        finetune_seeds=(0,),
        other_categories=(),
        folds=3,
        nonlinear_probes=(),
    )
    # world v3, where continent is read at the name (kappa 0.9): erasing it there must cost recall
    run = Interventions("world-v3", ["continent"], tmp_path, InterventionConfig(n_random=2), study_cfg, progress=False)
    r = run.study.relations["continent"]
    seen = []
    fit = arms.fit_token_erasers

    def spy(model, texts, answers, locate, n_random, seed):
        seen.append(list(texts))
        return fit(model, texts, answers, locate, n_random, seed)

    arms.fit_token_erasers = spy
    try:
        s = arms.setup(run.model, r, run.study.labels, study_cfg, run.config)
    finally:
        arms.fit_token_erasers = fit
    ctx = lambda i: run.model.scoring.context(study_cfg.finetune.template.format(r.subjects[i]))  # noqa: E731
    assert seen == [[ctx(i) for i in s.design.finetune]]  # the fine-tuning subjects, never a held-out one
    stack = s.erasers["alltoken_leace"]
    assert [site for site, _ in stack] == arms.token_sites(run.model) and len(stack) == run.model.n_layers
    texts = seen[0]
    model = run.model
    for site, erasers in stack:
        model = model.intervened(site, arms.erasing_tokens(s.tokens, erasers))
        x, off, idx = arms.token_states(model, texts, s.tokens, site)  # after this site's eraser
        for g in (0, 1):
            sel = off.clamp(max=1) == g
            assert sel.any() and _cross_covariance(x[sel], [s.answers_finetune[i] for i in idx[sel]]) < 1e-4
    for k in range(2):
        for (_, le), (_, ra) in zip(stack, s.erasers[f"alltoken_random{k}"]):
            assert {g: e.rank for g, e in le.items()} == {g: e.rank for g, e in ra.items()}
    assert s.row["alltoken_leftover_covariance"] < 1e-4
    recall = arms.erased_recall(run.model, s)
    assert recall["recall_alltoken_leace"] < recall["recall_alltoken_random"] - 0.1


def _cross_covariance(x, labels) -> float:
    """The largest absolute cross-covariance of states with their one-hot labels."""
    _, idx = np.unique(np.asarray(labels), return_inverse=True)
    z = torch.nn.functional.one_hot(torch.as_tensor(idx)).double()
    x = x.double()
    return float(((x - x.mean(0)).T @ (z - z.mean(0)) / len(x)).abs().max())
