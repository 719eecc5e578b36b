"""The command line on ordinary mistakes: every input checked before any work, one paragraph on
stderr, exit code 2, no traceback (``--debug`` shows it)."""

from __future__ import annotations

import time

import pytest

import interp
from lab.cli import main


@pytest.mark.parametrize(
    "args, says",
    [
        (["study", "--out", "{file}"], "is a file"),
        (["study", "--model", "wrold"], "did you mean 'world'"),
        (["study", "--backend", "tl"], "choose one of transformer_lens, nnsight"),
        (["study", "--executor", "foo"], "choose one of serial, processes, grouped, ray"),
        (["study", "--methods", "full,lroa"], "full and lora"),
        (["study", "--relations", "contnent"], "did you mean 'continent'"),
        (["study", "--model", "minilm", "--relations", "no/such.json"], "no relation file"),
        (["circuits", "relation", "nosuch"], "the world has no relation 'nosuch'"),
        (["circuits", "induction", "--out", "{file}"], "is a file"),
        (["circuits", "relation", "continent", "--method", "full,lora"], "is not one of full, lora"),
        (["circuits", "relation", "continent", "--model", "minilm"], "is not a world model"),
    ],
)
def test_an_ordinary_mistake_is_one_paragraph_before_any_work(args, says, tmp_path, capsys):
    file = tmp_path / "a_file.txt"
    file.write_text("x")
    args = [a.format(file=file) for a in args]
    if "--out" not in args and args[0] == "study":
        args += ["--out", str(tmp_path / "out")]
    start = time.perf_counter()
    assert main(args) == 2
    err = capsys.readouterr().err
    assert says in err and "Traceback" not in err and "--debug" in err
    assert len(err.strip().splitlines()) <= 3
    if args[0] == "study":
        assert time.perf_counter() - start < 30  # checked before capture, probes or fine-tunes
        assert not (tmp_path / "out").exists()


def test_debug_shows_the_traceback(tmp_path):
    with pytest.raises(ValueError, match="not a backend"):
        main(["study", "--backend", "tl", "--out", str(tmp_path / "o"), "--debug"])


def test_usage_errors_keep_clicks_message(capsys):
    assert main(["study", "--no-such-option"]) == 2
    assert "No such option" in capsys.readouterr().err


def test_load_model_suggests_registered_names():
    with pytest.raises(interp.models.ModelNotFoundError, match="did you mean 'world'"):
        interp.load_model("wrold")


def test_an_error_raised_inside_another_library_is_reported_as_a_possible_bug(monkeypatch, capsys):
    import numpy as np

    import lab.cli

    def broken(*args, **kwargs):
        np.linalg.cholesky(-np.eye(2))  # raises numpy's LinAlgError, a ValueError, in numpy's code

    monkeypatch.setattr(lab.cli, "readability", broken)
    monkeypatch.setattr(lab.cli.interp, "load_model", lambda *a, **k: None)
    monkeypatch.setattr(
        lab.cli,
        "load_world",
        lambda *a, **k: type("W", (), {"subjects": [], "spec": type("S", (), {"relations": []})})(),
    )
    assert main(["demo", "--out", "/tmp/interp-demo-test"]) == 1
    err = capsys.readouterr().err
    assert "LinAlgError raised in" in err and "may be a bug" in err and "Traceback" not in err


def test_a_world_study_takes_relation_files(tmp_path, monkeypatch, capsys):
    """Relation files on the world model reach the study (were refused as unknown names)."""
    import lab.cli

    seen = {}

    def fake_run_study(model, relations, **kwargs):
        seen["relations"] = relations
        raise lab.cli.StudyConfigError(["stop here"])

    monkeypatch.setattr(lab.cli, "run_study", fake_run_study)
    f = tmp_path / "mine.json"
    f.write_text("{}")
    assert main(["study", "--relations", str(f), "--relations", "continent", "--out", str(tmp_path / "o")]) == 2
    assert seen["relations"] == [str(f), "continent"]


def test_world_train_with_a_zoo_name_and_no_out_checks_the_name(capsys):
    assert main(["world", "train", "--zoo", "wrld"]) == 2  # was a TypeError traceback (check of --out None)
    err = capsys.readouterr().err
    assert "no zoo model 'wrld'" in err and "Traceback" not in err


def test_predictors_run_on_the_model_the_study_ran_on(tmp_path, capsys):
    """``interp study predictors`` takes the model from the study's summary and refuses a study whose
    weights are not that model's now (a v3 study saved as 'world' before v4 became 'world')."""
    import json

    folder = tmp_path / "study"
    folder.mkdir()
    (folder / "summary.json").write_text(json.dumps({"model": "world"}))
    (folder / "study.json").write_text(json.dumps({"model": "world", "fingerprint": "7bd6dd3f98266e6b"}))
    assert main(["study", "predictors", str(folder)]) == 2
    assert "ran on other weights" in capsys.readouterr().err
    (folder / "summary.json").write_text(json.dumps({"model": "minilm"}))
    assert main(["study", "predictors", str(folder)]) == 2
    assert "not a world model" in capsys.readouterr().err
