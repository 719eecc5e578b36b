"""``interp probe`` and ``interp patch`` on your own model: a local model directory, your relation
file or pairs file; tidy tables, figures and a summary in a folder."""

from __future__ import annotations

import pandas as pd
import pytest

from interp.relations import Relation
from lab.cli import main
from lab.world import ZOO, from_world, load_world


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("own")
    # world v3 (whose names are words of its vocabulary, and which knows its continents at the name)
    r = from_world(load_world(ZOO["world-v3"].path), ["continent"])[0]
    Relation("continent", r.subjects[:120], r.answers[:120], "{} continent :").save(root / "continent.json")
    (root / "pairs.csv").write_text(
        "clean,corrupted,answer,wrong\n"
        "Dafeirk Suzegoux city :,Kruthem Bevubround city :,Stimes,Groufadro\n"
        "Krou Raishin city :,Pirk Stefemo city :,Drogreirk,Bradour\n"
    )
    return root


def test_interp_probe_writes_tables_and_a_figure(files, tmp_path, capsys):
    out = tmp_path / "probe"
    assert main(["probe", "--model", "world-v3", "--relations", str(files / "continent.json"), "--out", str(out)]) == 0
    table = pd.read_csv(out / "probes.csv")
    assert set(table.relation) == {"continent"} and table.layer.nunique() == 4 and table.fold.nunique() == 5
    best = pd.read_csv(out / "best_layers.csv")
    assert len(best) == 1 and best.kappa.iloc[0] > 0.3  # the world model knows its continents
    assert (out / "figures" / "probes.html").exists()
    assert "continent" in capsys.readouterr().out


def test_interp_patch_on_a_pairs_file_and_on_a_relation(files, tmp_path, capsys):
    out = tmp_path / "patch"
    assert main(["patch", "--model", "world-v3", "--pairs", str(files / "pairs.csv"), "--out", str(out)]) == 0
    table = pd.read_csv(out / "patching.csv")
    assert set(table.site) == {"resid_pre", "z"} and table.effect.notna().all()
    # at the first residual stream, the positions where both prompts have the same tokens change
    # nothing when patched; the name's tokens carry the difference
    first = table[(table.site == "resid_pre") & (table.layer == 0)].set_index("position")
    assert first.loc[[2, 3], "effect"].abs().max() < 1e-5 and first.loc[[0, 1], "normalized"].max() > 0.5
    assert (out / "figures" / "heads.html").exists() and (out / "figures" / "positions.html").exists()
    assert "largest effects" in capsys.readouterr().out
    out2 = tmp_path / "patch2"
    assert main(["patch", "--model", "world-v3", "--relation", str(files / "continent.json"), "--n", "8",
                 "--out", str(out2)]) == 0  # fmt: skip
    assert len(pd.read_csv(out2 / "pairs.csv")) == 8


@pytest.mark.parametrize(
    "args, says",
    [
        (["patch", "--model", "world"], "either --pairs"),
        (["patch", "--model", "world", "--pairs", "no.csv"], "no pairs file"),
        (["probe", "--model", "wrold", "--relations", "x.json"], "did you mean 'world'"),
        (["probe", "--model", "world", "--relations", "no.json"], "no relation file"),
        (["probe", "--model", "world", "--relations", "x.json", "--formats", "jpg"], "html, png, svg, pdf"),
    ],
)
def test_mistakes_are_refused_before_the_model_loads(args, says, files, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(files)
    (files / "x.json").write_text("{}")
    assert main(args + ["--out", str(tmp_path / "o")]) == 2
    assert says in capsys.readouterr().err
