"""Fine-tunes that did not learn are failed jobs, not measurements (lab.study.failures); learning
rates resolve per model; the learning-rate check keeps the largest rate that learns; a world
handle is the world."""

from __future__ import annotations

import json
import math
import shutil
from dataclasses import replace

import pandas as pd
import pytest
from conftest import SMALL_STUDY, STUDY_RELATIONS

from lab.study.failures import failure_reason


def _record(**kw):
    base = {"status": "done", "steps": 40, "train_accuracy": 1.0, "train_kappa": 1.0, "first_loss": 2.0}
    return {**base, "final_loss": 0.1, "nonfinite_loss_step": None, "lr": 1e-3, **kw}


def test_failure_reasons_look_at_training_only():
    assert failure_reason(_record(), 0.2) is None
    assert "NaN or infinite at step 3" in failure_reason(_record(nonfinite_loss_step=3, final_loss=math.nan), 0.2)
    chance = failure_reason(_record(train_accuracy=0.25, train_kappa=0.0, final_loss=1.4), 0.2)
    assert chance.startswith("did not learn: training accuracy 0.25 is kappa 0.00")
    rose = failure_reason(_record(train_accuracy=0.3, train_kappa=0.05, final_loss=9.0), 0.2)
    assert rose.startswith("diverged: the loss rose from 2 to 9") and "did not learn" in rose
    assert "did not learn" in failure_reason(_record(train_kappa=math.nan), 0.2)  # undefined is not learned
    # learned its set, then one label for every held-out subject: the outcome, not a failure
    assert failure_reason(_record(heldout_one_label=True, generalization_kappa=0.0), 0.2) is None
    assert failure_reason({"status": "done", "steps": 10}, 0.2) is None  # an older record without the facts


@pytest.mark.slow
def test_a_diverging_rate_and_a_non_learning_finetune_are_caught():
    import interp
    from lab.study import finetune
    from lab.study.finetune import FinetuneConfig
    from lab.world import from_world, load_world

    model, world = interp.load_model("world"), load_world()
    (season,) = from_world(world, ["season"])
    pair = list(world.label_categories["animals"][:2])
    prompts = [f"{s} is associated with the word" for s in season.subjects[:12]]
    config = FinetuneConfig(max_steps=20, check_every=10)
    # an arbitrary split, learnable only by memorizing; of it and its mirror image, the one the
    # unchanged model fits worse (its kappas on the two are opposite), so that a fine-tune that does
    # not move cannot pass by the pretrained model's chance agreement with the split
    splits = [[pair[(i + k) % 2] for i in range(12)] for k in (0, 1)]
    stuck_runs = [finetune(model, prompts, s, pair, "full", replace(config, lr=1e-12), seed=0)[1] for s in splits]
    worse = min(range(2), key=lambda k: stuck_runs[k]["train_kappa"])
    labels, stuck = splits[worse], stuck_runs[worse]
    _, diverged = finetune(model, prompts, labels, pair, "full", replace(config, lr=1e4), seed=0)
    _, learned = finetune(model, prompts, labels, pair, "full", replace(config, max_steps=100), seed=0)
    assert failure_reason(diverged, 0.2) is not None
    assert failure_reason(stuck, 0.2).startswith("did not learn")
    assert failure_reason(learned, 0.2) is None and learned["lr"] == 1e-3  # the world's rate, resolved


def _planted(finished_study, tmp_path):
    """A copy of the small study with one full and one LoRA fine-tune planted as failures."""
    out = tmp_path / "study"
    shutil.copytree(finished_study[0], out)
    plants = {
        "continent__full__animals__l0__f0": {"train_accuracy": 0.25, "train_kappa": 0.0, "final_loss": 1.4},
        "hand__lora__animals__l0__f0": {"nonfinite_loss_step": 3, "final_loss": float("nan")},
    }
    for job, facts in plants.items():
        path = out / "runs" / f"{job}.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), **facts}))
    return out, plants


def test_failed_finetunes_are_excluded_and_reported(finished_study, tmp_path):
    from lab.study.run import make_study

    out, plants = _planted(finished_study, tmp_path)
    study, _ = make_study("world", STUDY_RELATIONS, out, SMALL_STUDY, progress=False)
    assert study.run().complete  # every stage reloaded; the summary classifies the records
    ft = pd.read_csv(out / "finetunes.csv").set_index("job")
    assert sorted(ft.index[ft.status == "failed"]) == sorted(plants)
    assert ft.loc["continent__full__animals__l0__f0", "reason"].startswith("did not learn")
    assert "NaN or infinite at step 3" in ft.loc["hand__lora__animals__l0__f0", "reason"]
    summary = json.loads((out / "summary.json").read_text())
    failed = summary["failed_jobs"]
    assert failed["n_failed"] == 2 and failed["n_finetunes"] == 16 and failed["excluded_from_statistics"]
    # 2 of 16 (12.5%) is above the 10% the study allows before it warns first, naming a cause
    assert failed["warning"].startswith("2 of 16 fine-tunes failed") and "learning rate" in failed["warning"]
    stats = pd.read_csv(out / "stats.csv")
    pear = stats[(stats.analysis == "pearson") & (stats.predictor == "readability_best_kappa")].set_index("method")
    assert pear.loc["full", "n"] == 3 and pear.loc["lora", "n"] == 3  # each method without its failed relation
    rel = pd.read_csv(out / "relations.csv").set_index("relation")
    assert math.isnan(rel.loc["continent", "generalization_kappa_full"])
    assert not math.isnan(rel.loc["continent", "generalization_kappa_lora"])
    assert rel.loc["continent", "n_answers"] > 0  # the design of a failed fine-tune is still reported
    preds = pd.read_csv(out / "predictions.csv")
    assert not set(plants) & set(preds.job)
    assert summary["headline"]["with_failed_kept"]["failed_relations"] == ["continent"]
    assert summary["headline"]["with_failed_kept"]["n"] == 4
    null = pd.read_csv(out / "null_calibration.csv")
    assert set(null.method) == {"full", "lora"}  # each method simulated on its own 3 relations
    page = (out / "report.html").read_text()
    assert "Failed fine-tunes (2 of 16, left out)" in page and "NaN or infinite at step 3" in page
    assert page.index("2 of 16 fine-tunes failed") < page.index("Pearson r between")  # said first


def test_failed_finetunes_can_be_kept_without_refitting(finished_study, tmp_path):
    """keep_failed (like the resampling counts) is read by the summary alone: the same folder
    accepts it, nothing is refitted, and the failed fine-tunes are counted."""
    from lab.study.run import make_study

    out, plants = _planted(finished_study, tmp_path)
    before = {p.name: p.stat().st_mtime_ns for p in (out / "runs").glob("*.json")}
    keep = replace(SMALL_STUDY, keep_failed=True, n_null=150)
    study, _ = make_study("world", STUDY_RELATIONS, out, keep, progress=False)
    assert study.run().complete
    assert {p.name: p.stat().st_mtime_ns for p in (out / "runs").glob("*.json")} == before  # nothing refitted
    ft = pd.read_csv(out / "finetunes.csv")
    assert (ft.status == "failed").sum() == 2  # still marked
    stats = pd.read_csv(out / "stats.csv")
    pear = stats[(stats.analysis == "pearson") & (stats.predictor == "readability_best_kappa")]
    assert (pear.n == 4).all()  # but counted
    summary = json.loads((out / "summary.json").read_text())
    assert not summary["failed_jobs"]["excluded_from_statistics"] and summary["null_calibration"]["n_sim"] == 150


def test_a_study_whose_every_finetune_failed_still_reports(finished_study, tmp_path):
    from lab.study.run import make_study

    out = tmp_path / "study"
    shutil.copytree(finished_study[0], out)
    for path in (out / "runs").glob("*.json"):
        path.write_text(json.dumps({**json.loads(path.read_text()), "train_kappa": 0.0, "train_accuracy": 0.3}))
    study, _ = make_study("world", STUDY_RELATIONS, out, SMALL_STUDY, progress=False)
    assert study.run().complete
    summary = json.loads((out / "summary.json").read_text())
    assert summary["failed_jobs"]["n_failed"] == 16 and summary["failed_jobs"]["warning"].startswith("16 of 16")
    assert math.isnan(summary["headline"]["pearson"]["r"])  # undefined, not a number from failed fine-tunes
    assert summary["headline"]["with_failed_kept"]["n"] == 4  # what they would have said
    assert "16 of 16 fine-tunes failed" in (out / "report.html").read_text()


def test_learning_rates_resolve_per_model_unless_set(model_dirs):
    import interp
    from lab.study.finetune import PRETRAINED_RATES, WORLD_RATES, FinetuneConfig

    world = interp.load_model("world")
    gpt2 = interp.load_model(model_dirs["gpt2"])
    f = FinetuneConfig()
    assert (f.for_model(world).lr, f.for_model(world).lora_lr) == WORLD_RATES
    assert (f.for_model("world").lr, f.for_model(gpt2).lr, f.for_model(gpt2).lora_lr) == (1e-3, *PRETRAINED_RATES)
    assert FinetuneConfig(lr=5e-5).for_model(world).lr == 5e-5  # a rate the user sets is kept


def test_a_world_handle_is_the_world(tmp_path):
    import interp
    from lab.study.run import default_config, make_study

    handle = interp.load_model("world")
    study, qualification = make_study(handle, STUDY_RELATIONS, tmp_path, SMALL_STUDY, progress=False)
    assert qualification is None and study.spec.frequency_source.startswith("exact")  # the world's path
    assert "animals" in study.labels and study.config.finetune.lr == 1e-3
    assert default_config(handle) == default_config("world")


@pytest.mark.slow
def test_the_learning_rate_check_keeps_the_largest_rate_that_learns():
    import interp
    from lab.study.lr_check import LrCheckInputs, check_learning_rate, with_checked_rates
    from lab.study.run import make_study

    study, _ = make_study("world", STUDY_RELATIONS, "unused", SMALL_STUDY, progress=False)
    model, relation, grid = interp.load_model("world"), study.spec.relations[0], (1e4, 1e-3, 1e-4)
    inputs = LrCheckInputs(model, relation, study.config, study.labels, "full", grid, min_train_kappa=0.2)
    check = check_learning_rate(inputs)
    assert [t["lr"] for t in check["tried"]] == [1e4, 1e-3]  # largest first, stopped at the first that learned
    assert not check["tried"][0]["learned"] and check["tried"][0]["reason"]
    assert check["chosen"] == 1e-3 and check["tried"][1]["learned"]
    assert with_checked_rates(study.config, {"full": check}).finetune.lr == 1e-3
    assert with_checked_rates(study.config, {"full": {"chosen": None}}).finetune.lr == study.config.finetune.lr
