"""One figure style for papers, and static export.

``style(fig, size="one-column")`` applies the toolkit's look: readable fonts, a colour-blind-safe
palette (Okabe & Ito), white background, and the figure sizes of one- and two-column layouts.
``export(fig, path_without_suffix, formats=("html", "png", "svg", "pdf"))`` writes each format;
static formats go through kaleido, which drives a Chromium (Debian's ``chromium`` package is
found without configuration; ``BROWSER_PATH`` overrides). HTML files are self-contained.
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterable

import plotly.graph_objects as go

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


def export(fig: go.Figure, stem: str | Path, formats: Iterable[str] = ("html", "png", "svg", "pdf")) -> list[Path]:
    """Write ``fig`` as ``stem.<format>`` for each format; returns the paths written."""
    stem = Path(stem)
    stem.parent.mkdir(parents=True, exist_ok=True)
    written = []
    for fmt in formats:
        path = stem.with_suffix("." + fmt)
        if fmt == "html":
            fig.write_html(path, include_plotlyjs=True, full_html=True)
        elif fmt in ("png", "svg", "pdf"):
            try:
                fig.write_image(path, format=fmt)
            except Exception as err:  # kaleido without a browser, or a browser that failed
                raise ExportError(
                    f"static export to {path.name} failed ({type(err).__name__}: {err}). kaleido needs Chromium: "
                    "on Debian `apt-get install -y chromium`, or set BROWSER_PATH to a Chrome/Chromium binary."
                ) from err
        else:
            raise ValueError(f"unknown export format {fmt!r}; use html, png, svg or pdf")
        written.append(path)
    return written
