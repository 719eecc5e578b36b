"""The study's HTML report renders in headless Chromium: figures drawn, no script errors."""

import subprocess

import numpy as np
from figure_layout import CHROMIUM, headless


def test_report_renders_with_figures(finished_study, tmp_path):
    assert CHROMIUM is not None, "this test needs Chromium: apt-get install -y chromium (README's test command does)"
    out, _ = finished_study
    shot = tmp_path / "report.png"
    proc = subprocess.run(
        [
            *headless(tmp_path / "profile"),
            "--enable-logging=stderr",
            "--v=0",
            "--window-size=1400,3000",
            "--virtual-time-budget=15000",
            f"--screenshot={shot}",
            (out / "report.html").as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert shot.exists() and shot.stat().st_size > 10_000, proc.stderr[-2000:]
    console = [l for l in proc.stderr.splitlines() if "CONSOLE" in l or "Uncaught" in l]
    assert not [l for l in console if "rror" in l], console
    from PIL import Image

    img = np.asarray(Image.open(shot).convert("L"), dtype=float)
    # not a blank page: plotly draws axes, markers and text in the first screen
    assert img.std() > 10 and (img < 128).mean() > 0.005
