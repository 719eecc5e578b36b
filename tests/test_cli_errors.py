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
