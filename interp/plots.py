"""One figure style for papers, and static export.

``style(fig, size="one-column")`` applies the toolkit's look: readable fonts, a colour-blind-safe
palette (Okabe & Ito), white background, and the figure sizes of one- and two-column layouts.
``export(fig, path_without_suffix, formats=("html", "png", "svg", "pdf"))`` writes each format;
static formats go through kaleido, which drives a Chromium (Debian's ``chromium`` package is
found without configuration; ``BROWSER_PATH`` overrides). HTML files are self-contained.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Iterable

import plotly.graph_objects as go

from .results import atomic_path

PALETTE = ["#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442", "#000000"]
#: width x height in pixels at 100 dpi-equivalent (3.5 in and 7.2 in columns)
SIZES = {"one-column": (350 * 2, 260 * 2), "two-column": (720 * 2, 360 * 2)}


def style(fig: go.Figure, size: str = "one-column") -> go.Figure:
    if size not in SIZES:
        raise ValueError(f"unknown figure size {size!r}; choose one of {', '.join(SIZES)}")
    width, height = SIZES[size]
    fig.update_layout(template="simple_white", font=dict(family="Arial, Helvetica, sans-serif", size=18),
                      colorway=PALETTE, width=width, height=height, margin=dict(l=70, r=30, t=60, b=60))
    return fig


class ExportError(RuntimeError):
    pass


#: seconds one figure's static export may take before the exporting process is killed and retried
EXPORT_TIMEOUT = 120

_EXPORT_CHILD = """
import json, sys
import kaleido
import plotly.io as pio
spec = json.load(open(sys.argv[1]))
fig = pio.from_json(spec["fig"], skip_invalid=True)
kaleido.write_fig_from_object_sync([{"fig": fig, "path": p, "opts": {"format": f}} for f, p in spec["targets"]])
"""


def export(fig: go.Figure, stem: str | Path, formats: Iterable[str] = ("html", "png", "svg", "pdf")) -> list[Path]:
    """Write ``fig`` as ``stem.<format>`` for each format; returns the paths written.

    Static formats are rendered by kaleido in a child process, all formats of the figure in one
    browser session, with a time limit (:data:`EXPORT_TIMEOUT`): kaleido 1.x can very rarely hang
    for ever (plotly/Kaleido#441), so a hung export is killed and tried once more, then reported
    as an :class:`ExportError` rather than hanging the caller."""
    stem = Path(stem)
    stem.parent.mkdir(parents=True, exist_ok=True)
    formats = list(formats)
    unknown = [f for f in formats if f not in ("html", "png", "svg", "pdf")]
    if unknown:
        raise ValueError(f"unknown export format {unknown[0]!r}; use html, png, svg or pdf")
    if "html" in formats:
        with atomic_path(stem.with_suffix(".html")) as tmp:
            fig.write_html(tmp, include_plotlyjs=True, full_html=True)
    static = [(f, stem.with_suffix("." + f)) for f in formats if f != "html"]
    if static:
        _export_static(fig, static)
    return [stem.with_suffix("." + f) for f in formats]


def _export_static(fig: go.Figure, targets: list[tuple[str, Path]]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        spec = Path(tmp) / "figure.json"
        spec.write_text(json.dumps({"fig": fig.to_json(), "targets": [(f, str(p)) for f, p in targets]}))
        err, hung = "", False
        for _attempt in range(2):
            # its own process group, so that a hung export's browser is killed with it
            proc = subprocess.Popen([sys.executable, "-c", _EXPORT_CHILD, str(spec)], stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True, start_new_session=True)
            try:
                _, stderr = proc.communicate(timeout=EXPORT_TIMEOUT)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.communicate()
                err, hung = f"kaleido did not finish within {EXPORT_TIMEOUT} s, twice", True
                continue
            if proc.returncode == 0 and all(p.exists() for _, p in targets):
                return
            err, hung = (stderr.strip().splitlines() or ["no output"])[-1], False
            break
    names = ", ".join(p.name for _, p in targets)
    hint = "" if hung else (" kaleido needs Chromium: on Debian `apt-get install -y chromium`, or set BROWSER_PATH to a "
                            "Chrome/Chromium binary.")
    raise ExportError(f"static export to {names} failed ({err}).{hint}")
