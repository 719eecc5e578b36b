"""Progress in a log: with stderr redirected, long stages report through logging."""

import logging
import subprocess
import sys
from pathlib import Path

import pytest
from tqdm.auto import tqdm

from interp.progress import LogProgress, progress_bar

ROOT = Path(__file__).resolve().parents[1]


def test_a_log_gets_progress_lines_with_counts_elapsed_and_eta(caplog, monkeypatch):
    monkeypatch.setenv("INTERP_PROGRESS_INTERVAL", "0")
    monkeypatch.setattr(sys.stderr, "isatty", lambda: False, raising=False)
    caplog.set_level(logging.INFO, logger="interp.progress")
    bar = progress_bar(range(4), desc="fine-tunes", unit="jobs")
    assert isinstance(bar, LogProgress)
    assert list(bar) == [0, 1, 2, 3]
    lines = [r.getMessage() for r in caplog.records if r.name == "interp.progress"]
    assert lines[0].startswith("fine-tunes: 1/4 jobs (25%)") and "elapsed" in lines[0] and "ETA" in lines[0]
    assert lines[-1].startswith("fine-tunes: 4/4 jobs (100%)") and "ETA" not in lines[-1]


def test_progress_false_is_silent_and_true_is_a_bar(caplog, monkeypatch):
    monkeypatch.setattr(sys.stderr, "isatty", lambda: False, raising=False)
    caplog.set_level(logging.INFO, logger="interp.progress")
    assert list(progress_bar(range(3), desc="x", progress=False)) == [0, 1, 2]
    assert not caplog.records
    assert isinstance(progress_bar(range(3), desc="x", progress=True), tqdm)
    assert isinstance(progress_bar(range(3), desc="x", threshold=5), tqdm)  # too small for progress


@pytest.mark.slow
def test_the_command_line_logs_progress_when_its_output_is_a_file(tmp_path):
    """`interp world report > log 2>&1` used to print nothing for its whole run."""
    log = tmp_path / "run.log"
    code = "import sys; from lab.cli import app; sys.argv = ['interp', 'world', 'report']; app()"
    env = {"INTERP_PROGRESS_INTERVAL": "1", "PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1"}
    with open(log, "w") as f:
        subprocess.run(
            [sys.executable, "-c", code], stdout=f, stderr=subprocess.STDOUT, cwd=ROOT, env=env, timeout=600, check=True
        )
    text = log.read_text()
    assert "probes: 96/96 sites (100%)" in text, text[-2000:]
