"""Paper figures: static exports have the requested size; every figure regenerates from saved data."""

from __future__ import annotations

import re

import pandas as pd
import plotly.graph_objects as go
import pytest

from interp.plots import SIZES, export, style


def _pdf_size(path) -> tuple[float, float]:
    data = path.read_bytes()
    m = re.search(rb"/MediaBox\s*\[\s*([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s*\]", data)
    assert m, "no MediaBox in the PDF"
    x0, y0, x1, y1 = map(float, m.groups())
    return x1 - x0, y1 - y0


@pytest.mark.slow
@pytest.mark.parametrize("size", list(SIZES))
def test_static_exports_have_the_requested_size(tmp_path, size):
    from PIL import Image

    fig = style(go.Figure(go.Scatter(x=[0, 1, 2], y=[1, 3, 2], name="a")), size)
    width, height = SIZES[size]
    paths = {p.suffix: p for p in export(fig, tmp_path / "fig", ("png", "svg", "pdf", "html"))}
    for p in paths.values():
        assert p.stat().st_size > 1000, p
    with Image.open(paths[".png"]) as img:
        assert img.size == (width, height)
    svg = paths[".svg"].read_text()
    assert re.search(rf'width="{width}(\.0+)?(px)?"', svg) and re.search(rf'height="{height}(\.0+)?(px)?"', svg)
    w, h = _pdf_size(paths[".pdf"])
    assert w / h == pytest.approx(width / height, rel=0.01)  # same aspect; PDF units are points
    assert "plotly" in paths[".html"].read_text()[:5000].lower()


@pytest.mark.parametrize(
    "formats", ["html", pytest.param("html,png", marks=pytest.mark.slow)]
)  # static export starts Chromium: the fast tier checks the HTML only
def test_regenerate_every_figure_of_a_results_folder(tmp_path, formats):
    from typer.testing import CliRunner

    from interp.results import save_table
    from lab.cli import app

    root = tmp_path / "results"
    pp = pd.DataFrame(
        {
            "sender": ["L0H0", "embed"],
            "receiver": ["L1H0.k", "L1H1.v"],
            "sender_layer": [0, -1],
            "sender_head": [0, None],
            "receiver_layer": [1, 1],
            "receiver_head": [0, 1],
            "receiver_input": ["k", "v"],
            "score": [-1.0, -0.5],
            "normalized": [0.4, 0.2],
        }
    )
    pp.attrs["target_score"] = 0.0
    save_table(pp, root / "circuits", "path_patching")
    runs = root / "grok" / "runs"
    runs.mkdir(parents=True)
    pd.DataFrame(
        {
            "step": [0, 100],
            "train_accuracy": [0.1, 1.0],
            "test_accuracy": [0.05, 0.9],
            "centroid_alignment": [0.1, -0.2],
            "seconds": [0, 1],
            "condition": "weight_decay",
            "seed": 0,
        }
    ).to_csv(runs / "weight_decay_seed0.csv", index=False)
    pd.DataFrame({"condition": ["weight_decay"], "seed": [0], "grok_step": [100]}).to_csv(
        root / "grok" / "grokking.csv"
    )
    result = CliRunner().invoke(app, ["figures", str(root), "--formats", formats])
    assert result.exit_code == 0, result.output
    for fmt, least in (("html", 1000), ("png", 5000)):
        if fmt in formats:
            assert (root / "circuits" / "figures" / f"circuit_path_patching.{fmt}").stat().st_size > least
            assert (root / "grok" / "figures" / f"dynamics_weight_decay_seed0.{fmt}").stat().st_size > least
    empty = tmp_path / "empty"
    empty.mkdir()
    result = CliRunner().invoke(app, ["figures", str(empty)])
    assert result.exit_code != 0 and "no saved results" in str(result.exception)


def test_html_figures_share_one_copy_of_plotly_js(tmp_path):
    figs = [go.Figure(go.Scatter(x=[0, 1], y=[i, 2])) for i in range(2)]
    paths = [export(f, tmp_path / f"fig{i}", ("html",))[0] for i, f in enumerate(figs)]
    assert [p.name for p in tmp_path.glob("*.js")] == ["plotly.min.js"]
    for p in paths:
        text = p.read_text()
        assert 'src="plotly.min.js"' in text and len(text) < 100_000  # not 4.8 MB of plotly.js each


def test_without_a_browser_static_export_is_skipped_with_one_clear_warning(tmp_path, monkeypatch, caplog):
    import logging

    import interp.plots as plots

    monkeypatch.setenv("BROWSER_PATH", str(tmp_path / "no-such-browser"))
    monkeypatch.setattr(plots, "_warned_static", False)
    caplog.set_level(logging.WARNING, logger="interp")
    fig = go.Figure(go.Scatter(x=[0, 1], y=[1, 2]))
    for name in ("a", "b"):
        assert export(fig, tmp_path / name, ("html", "png")) == [tmp_path / f"{name}.html"]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "apt-get install -y chromium" in warnings[0] and "interp figures DIR" in warnings[0]
    assert not (tmp_path / "a.png").exists()
    with pytest.raises(plots.ExportError):
        export(fig, tmp_path / "c", ("png",), missing_browser="raise")


def test_head_heatmap_says_what_it_averages_or_plots_one_position():
    """Per-position rows (ActivationPatching's default) are never averaged silently."""
    import pandas as pd

    from circuits import head_heatmap

    rows = [
        {"site": "z", "layer": l, "head": h, "position": p, "score": float(10 * l + h + p)}
        for l in range(2)
        for h in range(2)
        for p in range(3)
    ]
    df = pd.DataFrame(rows)
    fig = head_heatmap(df)
    assert "mean over 3 positions" in fig.layout.title.text
    one = head_heatmap(df, position=2)
    assert "position 2" in one.layout.title.text and "mean" not in one.layout.title.text
    assert one.data[0].z[1][1] == 10 + 1 + 2  # L1 H1 at position 2, not the mean
    single = head_heatmap(df[df.position == 0])
    assert "mean" not in single.layout.title.text
