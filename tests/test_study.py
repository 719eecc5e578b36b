"""The generalization study: design, statistics, end to end, resume."""

import json

import numpy as np
import pandas as pd
import pytest
import torch
from conftest import SMALL_STUDY as SMALL
from conftest import STUDY_RELATIONS as RELATIONS
from scipy import stats as sps

from interp.relations import Relation, RelationError
from lab.study import make_design, relabel, run_study, split
from lab.study.null import RELIABILITIES
from lab.study.stats import partial, pearson, spearman


def _relation(counts, name="r"):
    subjects, answers = [], []
    for a, n in counts.items():
        for i in range(n):
            subjects.append(f"{a}_s{i}")
            answers.append(a)
    return Relation(name, subjects, answers, "{} is")


# design -------------------------------------------------------------------------------------------
def test_split_never_leaks_and_covers_every_answer():
    rel = _relation({"A": 10, "B": 7, "C": 4})
    ft, ho, dropped = split(rel, n_finetune=3, seed=0)
    assert not set(ft) & set(ho) and dropped == []
    ft_answers = {rel.answers[i] for i in ft}
    assert {rel.answers[i] for i in ho} <= ft_answers
    assert all(sum(rel.answers[i] == a for i in ft) == 3 for a in "ABC")
    assert split(rel, 3, seed=0) == (ft, ho, dropped) and split(rel, 3, seed=1) != (ft, ho, dropped)


def test_relabelling_is_a_seeded_bijection():
    labels = tuple(f"l{i}" for i in range(10))
    m = relabel(["x", "y", "z", "x"], labels, seed=4)
    assert sorted(m) == ["x", "y", "z"] and len(set(m.values())) == 3 and set(m.values()) <= set(labels)
    assert relabel(["x", "y", "z"], labels, seed=4) == m
    d = make_design(_relation({"A": 5, "B": 5}), labels, 2, 0, 0)
    assert {d.inverse[d.mapping[a]] for a in "AB"} == {"A", "B"}


def test_design_errors_and_documented_drops():
    with pytest.raises(RelationError, match="fewer than 2 answers"):
        make_design(_relation({"A": 9}), ("a", "b"), 2, 0, 0)
    with pytest.raises(RelationError, match="has 2 labels but the relation has 3 answers"):
        make_design(_relation({"A": 4, "B": 4, "C": 4}), ("a", "b"), 2, 0, 0)
    d = make_design(_relation({"A": 4, "B": 4, "C": 2}), ("a", "b", "c"), 2, 0, 0)  # C cannot be split
    assert d.dropped_answers == ["C"] and "C" not in d.mapping
    with pytest.raises(RelationError, match="only 1 answer"):
        make_design(_relation({"A": 4, "B": 2}), ("a", "b"), 2, 0, 0)


# statistics ---------------------------------------------------------------------------------------
def test_statistics_agree_with_scipy():
    rng = np.random.default_rng(0)
    x = rng.normal(size=30)
    y = x + 0.8 * rng.normal(size=30)
    p = pearson(x, y, n_boot=500, n_perm=999)
    assert p["r"] == pytest.approx(sps.pearsonr(x, y).statistic)
    assert p["ci_low"] < p["r"] < p["ci_high"] and p["p_value"] < 0.01
    z = rng.normal(size=30)
    q = pearson(x, z, n_boot=200, n_perm=4999)
    assert q["p_value"] == pytest.approx(sps.pearsonr(x, z).pvalue, abs=0.05)
    assert spearman(x, y)["r"] == pytest.approx(sps.spearmanr(x, y).statistic)


def test_partial_correlation_removes_a_planted_confounder():
    rng = np.random.default_rng(1)
    z = rng.normal(size=200)
    e1, e2 = rng.normal(size=200), rng.normal(size=200)
    x, y = z + 0.3 * e1, z + 0.3 * e2
    assert sps.pearsonr(x, y).statistic > 0.8
    res = partial(x, y, pd.DataFrame({"z": z}))
    # what is left is the correlation of the independent noises, whatever it happens to be
    assert res["r"] == pytest.approx(sps.pearsonr(e1, e2).statistic, abs=0.02) and res["df"] == 197
    assert abs(res["r"]) < 0.3
    # with no confounding the partial equals the plain correlation
    w = rng.normal(size=200)
    assert partial(x, z, pd.DataFrame({"w": w}))["r"] == pytest.approx(sps.pearsonr(x, z).statistic, abs=0.02)


def test_a_control_taken_two_ways_with_leave_one_out(tmp_path):
    import statsmodels.api as sm

    from lab.cli import main
    from lab.study.findings import write_surface_control
    from lab.study.stats import control_two_ways

    # generalization depends on readability and on half of a surface baseline: subtracting the
    # whole baseline over-corrects, regressing it out does not, and the coefficient says so
    rng = np.random.default_rng(4)
    n = 40
    surface = rng.normal(size=n)
    readability = 0.6 * surface + rng.normal(size=n)
    y = readability + 0.5 * surface + 0.3 * rng.normal(size=n)
    table = pd.DataFrame({"relation": [f"r{i}" for i in range(n)], "x": readability, "z": surface, "y": y})
    s, loo = control_two_ways(table, "x", "z", "y", n_boot=200, n_perm=200)
    assert s["subtraction"]["r"] == pytest.approx(sps.pearsonr(readability - surface, y).statistic)
    assert s["partial"]["r"] == pytest.approx(partial(readability, y, table[["z"]])["r"])
    fit = sm.OLS(y, sm.add_constant(np.column_stack([readability, surface]))).fit()
    assert s["control_slope"] == pytest.approx(fit.params[2]) and s["control_slope_ci"][1] < 1
    assert s["partial"]["r"] > s["subtraction"]["r"]
    # leave-one-out rows: recomputed by hand for one relation
    i = 7
    keep = np.arange(n) != i
    row = loo.set_index("relation").loc["r7"]
    assert row.r_subtraction == pytest.approx(np.corrcoef(readability[keep] - surface[keep], y[keep])[0, 1])
    assert row.r_partial == pytest.approx(partial(readability[keep], y[keep], table[["z"]][keep])["r"])
    assert len(loo) == n and s["loo_partial"][0] == loo.r_partial.min()
    # the page, from a saved study's two files, and the command's check of its folders
    study = tmp_path / "study"
    study.mkdir()
    table.rename(columns={"x": "readability_best_kappa", "z": "random_kappa", "y": "generalization_kappa_full"}).to_csv(
        study / "relations.csv", index=False
    )
    (study / "summary.json").write_text(json.dumps({"methods": ["full"], "model": "toy"}))
    page = write_surface_control([study], tmp_path / "page.md").read_text()
    assert "## toy: 40 relations" in page and "reject the subtraction's assumption" in page
    assert f"{s['partial']['r']:.3f}" in page
    assert main(["study", "surface-control", str(tmp_path / "nothing"), "--out", str(tmp_path / "p.md")]) == 2
    # the subtraction assumes the control's coefficient is minus the predictor's: their sum, tested
    assert s["slope_sum"] == pytest.approx(fit.params[1] + fit.params[2]) and s["slope_sum_ci"][0] > 0
    x_res = readability - np.polyval(np.polyfit(surface, readability, 1), surface)
    assert s["semipartial_r"] == pytest.approx(np.corrcoef(x_res, y)[0, 1])


# scoring multi-token answers ---------------------------------------------------------------------
def test_multi_token_candidates_are_scored_by_their_full_sequence(model_dirs, backend):
    """``Model.logprobs`` (through either backend) equals a hand computation on the HF model."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import interp

    tok = AutoTokenizer.from_pretrained(model_dirs["gpt2"])
    hf = AutoModelForCausalLM.from_pretrained(model_dirs["gpt2"]).eval()
    prompts, cands = ["Mira lives in", "the capital of"], ["Paris France", "Tokyo", "Rome Italy it"]
    got = interp.load_model(model_dirs["gpt2"], backend=backend).logprobs(prompts, cands)
    for i, p in enumerate(prompts):
        for j, c in enumerate(cands):
            ids = tok(p + " " + c)["input_ids"]
            n = len(tok(p)["input_ids"])
            with torch.no_grad():
                logp = torch.log_softmax(hf(torch.tensor([ids])).logits[0], -1)
            ref = sum(logp[t - 1, ids[t]].item() for t in range(n, len(ids)))
            assert got[i, j].item() == pytest.approx(ref, abs=1e-4)


# end to end ---------------------------------------------------------------------------------------


@pytest.fixture
def finished(finished_study):
    return finished_study


def test_small_study_outputs_are_consistent(finished):
    from sklearn.metrics import cohen_kappa_score

    out, result = finished
    assert result.complete
    rel, ft, preds = result.table("relations"), result.table("finetunes"), result.table("predictions")
    stats, summary = result.table("stats"), result.summary
    assert sorted(rel.relation) == sorted(RELATIONS) and summary["n_relations"] == 4
    assert len(ft) == 4 * 4  # full, lora, label seed 1, colours
    assert (ft.status == "done").all() and ft.job.is_unique
    # the relation table's generalization is the mean of the main run's held-out predictions, and its kappa is sklearn's
    main = preds[(preds.method == "full") & (preds.category == "animals") & (preds.label_seed == 0)]
    for r in rel.itertuples():
        g = main[main.relation == r.relation]
        assert r.generalization_full == pytest.approx(g.correct.mean())
        assert r.generalization_kappa_full == pytest.approx(cohen_kappa_score(g.label, g.predicted_label))
        assert 0 <= r.readability_best <= 1 and r.readability_best_kappa >= r.readability_fixed_kappa - 1e-12
        assert (
            r.chance_uniform == pytest.approx(1 / r.n_answers)
            and r.chance_uniform <= r.chance + 1e-12 <= r.chance_majority + 2e-12
        )
    # the budget design: fine-tuning subjects per relation drawn from the budget, spread evenly
    # (at least two per answer: a relation with 16 answers gets 32)
    assert (rel.n_finetune_subjects >= 2 * 2).all()
    assert (rel.n_finetune_subjects <= np.maximum(16, 2 * rel.n_answers) + 4).all()
    # the headline is the kappa correlation; the raw one is secondary
    head = stats[
        (stats.method == "full")
        & (stats.predictor == "readability_best_kappa")
        & (stats.outcome == "generalization_kappa")
        & (stats.analysis == "pearson")
    ].iloc[0]
    assert head.r == pytest.approx(sps.pearsonr(rel.readability_best_kappa, rel.generalization_kappa_full).statistic)
    assert (
        summary["headline"]["pearson"]["r"] == pytest.approx(head.r)
        and summary["headline"]["measure"] == "Cohen's kappa"
    )
    assert summary["raw"]["pearson"]["r"] == pytest.approx(
        sps.pearsonr(rel.readability_best, rel.generalization_full).statistic
    )
    assert "ci_method" in stats and set(stats.analysis) >= {
        "pearson",
        "spearman",
        "partial:chance",
        "partial:n_answers",
    }
    # null calibration table: every statistic, raw and kappa
    null = result.table("null_calibration")
    assert set(null.outcome) == {"generalization", "generalization_kappa"} and (null.n_sim == 200).all()
    assert set(null.method) == {"full", "lora"}
    head_null = null[
        (null.method == "full") & (null.outcome == "generalization_kappa") & (null.analysis == "pearson")
    ].iloc[0]
    assert summary["null_calibration"]["headline_false_positive_rate"] == pytest.approx(
        head_null.false_positive_rate_monte_carlo
    )
    assert head_null.observed_r == pytest.approx(head.r) and summary["headline"]["pearson"][
        "p_monte_carlo"
    ] == pytest.approx(head_null.p_monte_carlo)
    assert head.p_monte_carlo == pytest.approx(head_null.p_monte_carlo)
    # error back-mapping: every wrong label maps back to a different original answer; rates are over wrong answers only
    wrong = preds[~preds.correct]
    assert (wrong.backmapped_answer != wrong.answer).all()
    bm = result.table("backmap")
    for b in bm.itertuples():
        errs = wrong[
            (wrong.method == b.method)
            & (wrong.relation == b.relation)
            & (wrong.category == "animals")
            & (wrong.label_seed == 0)
        ]
        assert b.n_errors == len(errs) and b.probe_rate == pytest.approx(
            errs.in_probe_topk.dropna().astype(float).mean()
        )
        assert b.model_expected_rate == pytest.approx(min(3, b.n_answers - 1) / (b.n_answers - 1))
        assert 0 <= b.probe_shuffled_rate <= 1
        assert b.informative == (b.n_answers - 1 > 3)
    assert summary["backmap"]["full"]["n_errors"] == int(bm[(bm.method == "full") & bm.informative].n_errors.sum())
    # fine-tuning sets smaller than a batch are trained full-batch: every seed gives the same model, and it is listed
    rob = result.table("robustness")
    seeds = rob[rob.varied == "fine-tuning seed"].iloc[0]
    assert sorted(str(seeds.seed_invariant_relations).split(", ")) == sorted(RELATIONS)
    page = (out / "report.html").read_text()
    assert "plotly" in page.lower() and "Cohen's kappa" in page and "Null calibration" in page and "<script" in page
    assert (out / "figures" / "scatter_full.html").exists() and (out / "figures" / "null_calibration.html").exists()


@pytest.mark.slow
def test_the_study_reports_its_covariates_rivals_and_the_recall_contrast(finished):
    out, result = finished
    rel, stats, null = result.table("relations"), result.table("stats"), pd.read_csv(out / "null_calibration.csv")
    # nonlinear probes on the same states and folds, each at its own best layer
    layers = pd.read_parquet(out / "readability_nonlinear.parquet")
    for r in rel.itertuples():
        g = layers[layers.relation == r.relation]
        assert r.readability_mlp_kappa == pytest.approx(g.mlp_kappa.max())
        assert r.readability_knn_kappa == pytest.approx(g.knn_kappa.max())
    full = stats[(stats.method == "full") & (stats.predictor == "readability_best_kappa")].set_index("analysis")
    assert {"partial:embedding_kappa", "partial:readability_mlp_kappa", "partial:pretrained_accuracy"} <= set(
        full.index
    )
    # Williams' test: r is the difference of the two correlations with generalization
    t = rel.dropna(subset=["generalization_kappa_full"])
    y = t.generalization_kappa_full
    for z in ("readability_mlp_kappa", "readability_knn_kappa"):
        diff = np.corrcoef(t.readability_best_kappa, y)[0, 1] - np.corrcoef(t[z], y)[0, 1]
        assert full.loc[f"williams:{z}", "r"] == pytest.approx(diff)
        assert full.loc[f"williams:{z}", "ci_low"] <= full.loc[f"williams:{z}", "ci_high"]
        assert np.isnan(full.loc[f"williams:{z}", "p_monte_carlo"])  # the no-generalization null cannot calibrate it
    # the contrast the other way round: recall with readability held fixed, calibrated on the null
    rec = stats[(stats.method == "full") & (stats.predictor == "pretrained_accuracy")].set_index("analysis")
    assert "partial:readability_best_kappa" in rec.index and "partial:pretrained_accuracy" not in rec.index
    assert len(null[(null.predictor == "pretrained_accuracy") & (null.analysis == "partial:readability_best_kappa")])
    # and against its fitted-outcome null (readability measured with error), per reliability
    fitted = pd.read_csv(out / "recall_null.csv")
    assert rel.pretrained_accuracy.nunique() > 1 and set(fitted.reliability) <= set(RELIABILITIES)
    assert 1.0 in set(fitted.reliability) and (fitted.reliability >= fitted.min_reliability).all()
    observed = fitted[fitted.method == "full"].observed_r.iloc[0]
    assert observed == pytest.approx(rec.loc["partial:readability_best_kappa", "r"])


def test_the_study_reports_readability_above_its_baselines(finished):
    """Each relation's baselines (input embeddings; random weights, mean over seeds, at its best
    layer) come from the saved long table; readability above them is the best-layer kappa minus
    them; the correlations with generalization are Pearson's, each with a Monte-Carlo p from the
    study's own null (the same simulated outcomes as the headline)."""
    out, result = finished
    rel, stats, summary, null = (
        result.table("relations"),
        result.table("stats"),
        result.summary,
        result.table("null_calibration"),
    )
    long = pd.read_csv(out / "readability_baselines.csv")
    assert set(long.baseline) == {"embedding", "random"} and set(long[long.baseline == "random"].seed) == {0, 1, 2}
    for r in rel.itertuples():
        emb = long[(long.relation == r.relation) & (long.baseline == "embedding")].kappa
        rnd = long[(long.relation == r.relation) & (long.baseline == "random") & (long.layer == r.best_layer)].kappa
        assert len(emb) == 1 and len(rnd) == 3
        assert r.embedding_kappa == pytest.approx(emb.iloc[0]) and r.random_kappa == pytest.approx(rnd.mean())
        assert r.baseline_kappa == pytest.approx(max(emb.iloc[0], rnd.mean()))
        assert r.readability_above_baseline == pytest.approx(r.readability_best_kappa - r.baseline_kappa)
        assert r.readability_above_surface == pytest.approx(r.readability_best_kappa - r.random_kappa)
        assert r.baseline_flagged == (r.baseline_kappa > 0.2) and r.surface_flagged == (r.random_kappa > 0.2)
    # random weights hold no knowledge: the world's invented names make nothing readable from them
    assert rel.random_kappa.abs().max() < 0.1
    for key, col in (("above_baseline", "readability_above_baseline"), ("above_surface", "readability_above_surface")):
        want = sps.pearsonr(rel[col], rel.generalization_kappa_full).statistic
        assert summary[key]["pearson"]["r"] == pytest.approx(want)
        row = stats[(stats.method == "full") & (stats.predictor == col) & (stats.analysis == "pearson")].iloc[0]
        nul = null[(null.method == "full") & (null.predictor == col) & (null.analysis == "pearson")].iloc[0]
        assert row.r == pytest.approx(want) and nul.observed_r == pytest.approx(want)
        assert summary[key]["pearson"]["p_monte_carlo"] == pytest.approx(nul.p_monte_carlo)
    assert summary["above_baseline"]["flagged_relations"] == sorted(rel.relation[rel.baseline_flagged])
    # the headline's null rows are the headline predictor's, not the baselines'
    head_null = null[
        (null.method == "full") & (null.predictor == "readability_best_kappa") & (null.analysis == "pearson")
    ]
    assert summary["headline"]["pearson"]["p_monte_carlo"] == pytest.approx(head_null.p_monte_carlo.iloc[0])


def test_baseline_settings_are_checked_before_any_work(tmp_path):
    from dataclasses import replace

    from lab.study import StudyConfigError

    for bad, match in ((dict(baseline_seeds=()), "baseline_seeds"), (dict(baseline_flag=2.0), "baseline_flag")):
        with pytest.raises(StudyConfigError, match=match):
            run_study("world", RELATIONS, out=tmp_path / "x", config=replace(SMALL, **bad), progress=False)
    assert not (tmp_path / "x").exists()


def test_same_seed_same_numbers_and_resume(finished, tmp_path):
    out, _ = finished
    partial_run = run_study("world", RELATIONS, out=tmp_path, config=SMALL, progress=False, max_jobs=5)
    assert not partial_run.complete and len(list((tmp_path / "runs").glob("*.json"))) == 5
    before = {p.name: p.stat().st_mtime_ns for p in (tmp_path / "runs").glob("*.json")}
    resumed = run_study("world", RELATIONS, out=tmp_path, config=SMALL, progress=False)
    assert resumed.complete
    assert all((tmp_path / "runs" / n).stat().st_mtime_ns == t for n, t in before.items())  # not redone
    for name in ("relations", "finetunes", "stats", "predictions"):
        pd.testing.assert_frame_equal(resumed.table(name), pd.read_csv(out / f"{name}.csv"))


def test_a_different_study_in_the_same_folder_is_refused(finished):
    out, _ = finished
    with pytest.raises(
        ValueError, match=r"holds a different study \(.*relations added \['month'\], removed \['diet'\]"
    ):
        run_study("world", RELATIONS[:3] + ["month"], out=out, config=SMALL, progress=False)


@pytest.mark.slow
def test_causal_test_end_to_end_on_a_tiny_world(tmp_path):
    from lab.study.causal import causal_test, without_augmentation
    from lab.world import RelationSpec, TrainConfig, WorldSpec

    spec = WorldSpec(
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
    plain = without_augmentation(spec, ["city", "sport"])
    assert [r.augment for r in plain.relations] == [False] * 4 and plain.relations[2:] == spec.relations[2:]
    from lab.world import World

    assert World.generate(plain).facts.equals(World.generate(spec).facts)  # same facts, different writing
    cfg = SMALL.__class__(
        n_finetune=3,
        methods=("full",),
        label_seeds=(0,),
        finetune_seeds=(0,),
        other_categories=(),
        n_null=200,
        folds=3,
        n_boot=50,
        n_perm=50,
        finetune=SMALL.finetune,
    )
    df = causal_test(
        tmp_path,
        ["city", "sport"],
        spec=spec,
        train=TrainConfig(steps=10, n_layers=1, d_model=32, batch_size=8),
        config=cfg,
        progress=False,
    )
    assert len(df) == 4 and df.manipulated.sum() == 2 and df.writing_identical.tolist() == [False, False, True, True]
    summary = json.loads((tmp_path / "causal.json").read_text())
    assert set(summary["mean_delta"]) == {"manipulated", "untouched", "untouched, not derived"}
    did = summary["difference_in_differences"]["vs untouched"]["delta_generalization"]
    assert did["estimate"] == pytest.approx(
        df[df.manipulated].delta_generalization.mean() - df[~df.manipulated].delta_generalization.mean()
    )
    assert did["ci_low"] <= did["estimate"] <= did["ci_high"]
    assert (tmp_path / "study_plain" / "report.html").exists() and (
        tmp_path / "study_augmented" / "report.html"
    ).exists()


def test_the_plain_world_rewrites_only_the_manipulated_relations():
    """Every relation not manipulated is written identically in the two worlds, document for
    document, and asked with the same queries (the causal test's untouched relations)."""
    from lab.study.causal import without_augmentation
    from lab.world import World, v3_spec

    spec = v3_spec(n_subjects=150)
    manipulated = [r.name for r in spec.relations if r.augment]
    a = World.generate(spec).relation_digests()
    b = World.generate(without_augmentation(spec, manipulated)).relation_digests()
    assert set(a) == set(b) == {r.name for r in spec.relations}
    for name in a:
        assert (a[name] == b[name]) == (name not in manipulated), name
    # the same number of mentions of every fact, mixed training's statements included
    wa, wb = World.generate(spec), World.generate(without_augmentation(spec, manipulated))
    assert spec.qa_fraction > 0
    assert all(wa.mentions(s, r.name) == wb.mentions(s, r.name) for s in wa.subjects for r in spec.relations)
    # a partial manipulation that would rewrite another relation's biographies is refused before any training
    from lab.study.causal import causal_test

    with pytest.raises(ValueError, match="not manipulated but are written differently"):
        causal_test("/nonexistent", ["city"], spec=spec)


def test_the_worlds_of_both_causal_designs_are_shipped():
    """`interp study causal` with the defaults pretrains nothing: the embedded world, its plain
    twin (two-world design) and the randomized world are shipped, each trained on exactly that
    world with exactly the default recipe."""
    from lab.study.causal import shipped_checkpoint, without_augmentation
    from lab.world import TrainConfig, v3_spec
    from lab.world.checkpoint import shipped_world_checkpoints
    from lab.world.spec import randomized_spec

    spec = v3_spec()
    plain = without_augmentation(spec, [r.name for r in spec.relations if r.augment])
    world, twin = shipped_checkpoint(spec, TrainConfig()), shipped_checkpoint(plain, TrainConfig())
    randomized = shipped_checkpoint(randomized_spec(), TrainConfig())
    assert world is not None and twin is not None and randomized is not None
    assert len({world, twin, randomized}) == 3
    from lab.world.zoo import ZOO

    zoo = {m.path for m in ZOO.values()} - {world}
    assert {world, twin, randomized} <= set(shipped_world_checkpoints())
    assert set(shipped_world_checkpoints()) - {world, twin, randomized} <= zoo
    assert shipped_checkpoint(spec, TrainConfig(steps=10)) is None
    for path in (world, twin, randomized):
        assert (path / "model.safetensors").stat().st_size < 25e6


@pytest.mark.slow
def test_null_and_findings_commands_rebuild_from_saved_tables(finished, tmp_path):
    import shutil

    from typer.testing import CliRunner

    from lab.cli import app

    out, _ = finished
    copy = tmp_path / "study"
    shutil.copytree(out, copy)
    res = CliRunner().invoke(app, ["study", "null", str(copy), "--n-sim", "300"])
    assert res.exit_code == 0, res.output
    null = pd.read_csv(copy / "null_calibration.csv")
    summary = json.loads((copy / "summary.json").read_text())
    assert (null.n_sim == 300).all() and summary["null_calibration"]["n_sim"] == 300
    assert "p_monte_carlo" in pd.read_csv(copy / "stats.csv")
    assert (pd.read_csv(copy / "recall_null.csv").n_sim == 300).all()
    res = CliRunner().invoke(
        app, ["study", "findings", "--study", str(copy), "--out", str(tmp_path / "docs" / "study.md")]
    )
    assert res.exit_code == 0, res.output
    page = (tmp_path / "docs" / "study.md").read_text()
    assert "Monte-Carlo p" in page and "### Null calibration" in page and "| continent |" in page
    assert "Recall against its fitted-outcome null" in page and "Caveat on the contrast" not in page


def test_pooling_over_seeds_carries_the_seed_to_seed_noise(tmp_path):
    from lab.cli import main
    from lab.study.pooled import pool_over_seeds, pooled_correlation

    rng = np.random.default_rng(0)
    R = 24
    base = rng.normal(size=R)
    gen = 0.6 * base + 0.8 * rng.normal(size=R)
    same = pooled_correlation(np.stack([base] * 3), np.stack([gen] * 3), n_boot=500)
    assert same["r_pooled"] == pytest.approx(np.corrcoef(base, gen)[0, 1]) and same["seed_sd"] == 0
    x = np.stack([base + 0.5 * rng.normal(size=R) for _ in range(3)])
    y = np.stack([gen + 0.5 * rng.normal(size=R) for _ in range(3)])
    noisy = pooled_correlation(x, y, n_boot=500)
    per_seed = [np.corrcoef(a, b)[0, 1] for a, b in zip(x, y)]
    assert noisy["r_pooled"] == pytest.approx(np.tanh(np.mean(np.arctanh(per_seed))))
    assert noisy["seed_sd"] == pytest.approx(np.std(per_seed, ddof=1))
    # coverage of the interval on studies with seed noise (measured 0.94 at 300 repetitions)
    hits = 0
    for t in range(60):
        b = rng.normal(size=R)
        g = 0.5 * b + np.sqrt(0.75) * rng.normal(size=R)
        xs = np.stack([b + 0.3 * rng.normal(size=R) for _ in range(3)])
        ys = np.stack([g + 0.3 * rng.normal(size=R) for _ in range(3)])
        res = pooled_correlation(xs, ys, n_boot=300, seed=t)
        hits += res["ci_low"] <= 0.5 / 1.09 <= res["ci_high"]
    assert hits / 60 >= 0.8
    with pytest.raises(ValueError, match="at least 2 seeds"):
        pooled_correlation(x[:1], y[:1])
    # from saved studies: only relations with an outcome in every seed are pooled
    folders = []
    for s in range(3):
        f = tmp_path / f"seed{s}"
        f.mkdir()
        rel = pd.DataFrame(
            {"relation": [f"r{i}" for i in range(R)], "readability_best_kappa": x[s], "generalization_kappa_full": y[s]}
        )
        if s == 1:
            rel.loc[3, "generalization_kappa_full"] = np.nan  # a failed fine-tune
        rel.to_csv(f / "relations.csv", index=False)
        summary = {
            "model": f"world-seed{s}",
            "headline": {"method": "full", "pearson": {"r": 0.5, "p_monte_carlo": 0.01}},
        }
        (f / "summary.json").write_text(json.dumps(summary))
        folders.append(f)
    pooled, seeds = pool_over_seeds(folders, n_boot=300)
    assert pooled["n_relations"] == R - 1 and len(seeds) == 3 and (seeds.p_monte_carlo == 0.01).all()
    assert main(["study", "pool", str(folders[0]), "--out", str(tmp_path / "p")]) == 2  # one folder: refused
    assert (
        main(["study", "pool", *map(str, folders), "--out", str(tmp_path / "p"), "--page", str(tmp_path / "p.md")]) == 0
    )
    assert json.loads((tmp_path / "p" / "pooled.json").read_text())["n_seeds"] == 3
    page = (tmp_path / "p.md").read_text()
    assert f"r = {pooled['r_pooled']:.3f}" in page and "| seed2 |" in page
    # the page's correlations inside each level of a design knob
    from lab.study.seeds_page import seeds_page

    knobs = pd.DataFrame({"relation": [f"r{i}" for i in range(R)], "lead": [i % 2 == 0 for i in range(R)]})
    page = seeds_page(folders, knobs)
    even = [i for i in range(0, R, 2)]  # relation 3, missing in one seed, is odd
    inside = pooled_correlation(x[:, even], y[:, even])
    assert f"| lead | True | {len(even)} |" in page and f"{inside['r_pooled']:.3f}" in page
    # the recall contrast's fitted-outcome null, where a study saved it
    assert "fitted-outcome null" not in page
    pd.DataFrame(
        {"method": "full", "reliability": [1.0, 0.8], "observed_r": 0.41, "mean_r": [-0.01, -0.2],
         "sd_r": 0.2, "p_monte_carlo": [0.04, 0.003], "false_positive_rate": [0.05, 0.19]}
    ).to_csv(folders[0] / "recall_null.csv", index=False)  # fmt: skip
    page = seeds_page(folders, knobs)
    assert "fitted-outcome null" in page and "null mean -0.200, p 0.003, t-test FPR 0.190" in page


def test_pooling_another_method_reads_each_seeds_own_test(tmp_path):
    """``method="lora"`` pools LoRA's outcome and takes each seed's r and Monte-Carlo p from its
    stats.csv (not the full fine-tune's headline); a method some study did not run is refused."""
    from lab.study.compare import CompareError
    from lab.study.pooled import pool_over_seeds, pooled_correlation
    from lab.study.seeds_page import seeds_page

    rng = np.random.default_rng(1)
    R, folders, xs, ys = 20, [], [], []
    for s in range(3):
        f = tmp_path / f"seed{s}"
        f.mkdir()
        x, y_full, y_lora = rng.normal(size=R), rng.normal(size=R), rng.normal(size=R)
        xs.append(x), ys.append(y_lora)
        pd.DataFrame(
            {"relation": [f"r{i}" for i in range(R)], "readability_best_kappa": x,
             "generalization_kappa_full": y_full, "generalization_kappa_lora": y_lora}
        ).to_csv(f / "relations.csv", index=False)  # fmt: skip
        summary = {"model": f"m{s}", "methods": ["full", "lora"], "headline": {"method": "full", "pearson": {"r": 0.1}}}
        (f / "summary.json").write_text(json.dumps(summary))
        pd.DataFrame(
            {"method": ["full", "lora"], "predictor": "readability_best_kappa", "outcome": "generalization_kappa",
             "analysis": "pearson", "r": [0.1, 0.2 + s], "ci_low": -0.5, "ci_high": 0.9, "p_value": 0.5,
             "p_monte_carlo": [0.5, 0.01 * (s + 1)]}
        ).to_csv(f / "stats.csv", index=False)  # fmt: skip
        folders.append(f)
    pooled, seeds = pool_over_seeds(folders, method="lora", n_boot=200)
    assert pooled["method"] == "lora" and pooled["outcome"] == "generalization_kappa_lora"
    assert pooled["r_pooled"] == pytest.approx(pooled_correlation(np.stack(xs), np.stack(ys), n_boot=200)["r_pooled"])
    assert seeds.p_monte_carlo.tolist() == pytest.approx([0.01, 0.02, 0.03])
    assert seeds.r_all_relations.tolist() == pytest.approx([0.2, 1.2, 2.2])
    full, _ = pool_over_seeds(folders, n_boot=200)
    assert full["method"] == "full" and full["r_pooled"] != pooled["r_pooled"]
    knobs = pd.DataFrame({"relation": [f"r{i}" for i in range(R)], "lead": [i % 2 == 0 for i in range(R)]})
    page = seeds_page(folders, knobs)
    assert "**lora, pooled over 3 seeds:** r = " + f"{pooled['r_pooled']:.3f}" in page
    assert "The same controls for lora" in page and "## Inside each level of the design: lora" in page
    even = list(range(0, R, 2))
    inside = pooled_correlation(np.stack(xs)[:, even], np.stack(ys)[:, even])
    lora_levels = page.split("## Inside each level of the design: lora")[1]
    assert f"| lead | True | {len(even)} |" in lora_levels and f"{inside['r_pooled']:.3f}" in lora_levels
    summary = json.loads((folders[2] / "summary.json").read_text())
    summary["methods"] = ["full"]
    (folders[2] / "summary.json").write_text(json.dumps(summary))
    with pytest.raises(CompareError, match="'lora' is not in every study"):
        pool_over_seeds(folders, method="lora")
    assert "lora, pooled" not in seeds_page(folders)
