"""One figure style for papers, and static export.

``style(fig, size="one-column")`` applies the toolkit's look: readable fonts, a colour-blind-safe
palette (Okabe & Ito), white background, and the figure sizes of one- and two-column layouts.
``export(fig, path_without_suffix, formats=("html", "png", "svg", "pdf"))`` writes each format;
static formats go through kaleido, which drives a Chromium (Debian's ``chromium`` package is
found without configuration; ``BROWSER_PATH`` overrides). Without one, the static formats are
skipped with one clear warning per process (how to enable them; ``interp figures DIR`` adds them
later), and the HTML is still written. HTML figures share one ``plotly.min.js`` per folder
(plotly's ``include_plotlyjs="directory"``: 4.8 MB once, not in every file); they open offline.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterable
from pathlib import Path

import plotly.graph_objects as go

from .results import atomic_path

PALETTE = ["#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442", "#000000"]
#: width x height in pixels at 100 dpi-equivalent (3.5 in and 7.2 in columns)
SIZES = {"one-column": (350 * 2, 260 * 2), "two-column": (720 * 2, 360 * 2)}


def style(fig: go.Figure, size: str = "one-column") -> go.Figure:
    if size not in SIZES:
        raise ValueError(f"unknown figure size {size!r}; choose one of {', '.join(SIZES)}")
    width, height = SIZES[size]
    fig.update_layout(
        template="simple_white",
        font=dict(family="Arial, Helvetica, sans-serif", size=18),
        colorway=PALETTE,
        width=width,
        height=height,
        margin=dict(l=70, r=30, t=60, b=60),
    )
    return fig


class ExportError(RuntimeError):
    """Static export failed; ``hung``: kaleido did not finish in time (else: no browser, or it failed)."""

    def __init__(self, message: str, hung: bool = False):
        super().__init__(message)
        self.hung = hung


#: what to do when no Chromium is available, said once per process
STATIC_HELP = (
    "static figures (PNG, SVG, PDF) were skipped: kaleido needs a Chrome/Chromium. Install one (Debian: "
    "`apt-get install -y chromium`) or set BROWSER_PATH to its binary, then run `interp figures DIR` on the "
    "results folder to add them; the HTML figures were written"
)
_warned_static = False


def warn_static_skipped() -> None:
    """Log :data:`STATIC_HELP` as a warning, once per process."""
    global _warned_static
    if not _warned_static:
        _warned_static = True
        logging.getLogger("interp").warning(STATIC_HELP)


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


def export(
    fig: go.Figure,
    stem: str | Path,
    formats: Iterable[str] = ("html", "png", "svg", "pdf"),
    missing_browser: str = "warn",
) -> list[Path]:
    """Write ``fig`` as ``stem.<format>`` for each format; returns the paths written.

    Static formats are rendered by kaleido in a child process, all formats of the figure in one
    browser session, with a time limit (:data:`EXPORT_TIMEOUT`): kaleido 1.x can very rarely hang
    for ever (plotly/Kaleido#441), so a hung export is killed and tried once more, then reported
    as an :class:`ExportError` rather than hanging the caller. When static export fails for want
    of a browser, ``missing_browser="warn"`` (default) skips it with :func:`warn_static_skipped`;
    ``"raise"`` raises the :class:`ExportError`."""
    stem = Path(stem)
    stem.parent.mkdir(parents=True, exist_ok=True)
    formats = list(formats)
    unknown = [f for f in formats if f not in ("html", "png", "svg", "pdf")]
    if unknown:
        raise ValueError(f"unknown export format {unknown[0]!r}; use html, png, svg or pdf")
    if "html" in formats:
        with atomic_path(stem.with_suffix(".html")) as tmp:
            fig.write_html(tmp, include_plotlyjs="directory", full_html=True)
    static = [(f, stem.with_suffix("." + f)) for f in formats if f != "html"]
    if static:
        try:
            _export_static(fig, static)
        except ExportError as err:
            if missing_browser == "raise" or err.hung:
                raise
            warn_static_skipped()
            return [stem.with_suffix(".html")] if "html" in formats else []
    return [stem.with_suffix("." + f) for f in formats]


def _export_static(fig: go.Figure, targets: list[tuple[str, Path]]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        spec = Path(tmp) / "figure.json"
        spec.write_text(json.dumps({"fig": fig.to_json(), "targets": [(f, str(p)) for f, p in targets]}))
        err, hung = "", False
        for _attempt in range(2):
            # its own process group, so that a hung export's browser is killed with it
            proc = subprocess.Popen(
                [sys.executable, "-c", _EXPORT_CHILD, str(spec)],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                start_new_session=True,
            )
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
    hint = (
        ""
        if hung
        else (
            " kaleido needs Chromium: on Debian `apt-get install -y chromium`, or set BROWSER_PATH to a "
            "Chrome/Chromium binary."
        )
    )
    raise ExportError(f"static export to {names} failed ({err}).{hint}", hung=hung)
