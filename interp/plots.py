"""One figure style for papers, and static export.

``style(fig, size="one-column")`` applies the toolkit's look: readable fonts, a colour-blind-safe
palette (Okabe & Ito), white background, and the figure sizes of one- and two-column layouts.
``place_labels(fig)`` moves each point label of a labelled scatter (``mode="markers+text"``) to
a side of its marker where it covers no other label or marker, and leaves to the hover the labels
that fit nowhere (a test renders every figure in Chromium and finds no overlapping text).
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
import math
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
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
    for trace in fig.data:  # a colour bar's title beside it: on top, it lands on the top tick label
        bar = getattr(trace, "colorbar", None)
        if bar is not None and bar.title.text and bar.title.side is None:
            bar.title.side = "right"
    title = fig.layout.title.text
    if title:
        fig.update_layout(title_text=wrap_title(title, width))
        fit_title(fig)
    return fig


def fit_title(fig: go.Figure) -> go.Figure:
    """Pin the title 12 px below the figure's top and make the top margin as tall as the title and
    subtitle (a title of several lines centred in a fixed margin runs into the plot). The place is
    a fraction of the figure's height: call it again after changing the height. The heights
    are plotly's, measured in Chromium: a one-line title at 18 px fonts spans 28 px and sits 6 px
    above its anchor; with more lines it sits 23 px above and each line adds 32 px."""
    lines = (fig.layout.title.text or "").count("<br>") + 1
    height = 28 if lines == 1 else 17 + 32 * (lines - 1)
    subtitle = fig.layout.title.subtitle.text
    if subtitle:
        height += 9 + 16 * (subtitle.count("<br>") + 1)
    anchor = 12 + (6 if lines == 1 else 23)
    fig.update_layout(
        title=dict(y=1 - anchor / (fig.layout.height or 450), yref="container", yanchor="top"),
        margin=dict(t=max(fig.layout.margin.t or 0, 12 + height + 24)),
    )
    return fig


def wrap_title(title: str, width: int, font_size: int = 22) -> str:
    """``title`` with its first line broken (at spaces) to fit ``width`` pixels at plotly's title
    size; what follows a ``<br>`` is left as it is."""
    head, sep, rest = title.partition("<br>")
    if "<" in head:  # markup (a <span>, a <sup>): its tags are not text to measure or break
        return title
    per_line = max(20, int((width - 80) / (CHAR_WIDTH * font_size)))
    return "<br>".join(textwrap.wrap(head, per_line, break_long_words=False) or [head]) + sep + rest


#: where a point's label may go, in the order tried: (plotly textposition, x side, y side); a side
#: is -1 (left of / above the marker), 0 (centred on it) or +1 (right of / below it)
LABEL_POSITIONS = (
    ("top center", 0, -1),
    ("bottom center", 0, 1),
    ("middle right", 1, 0),
    ("middle left", -1, 0),
    ("top right", 1, -1),
    ("top left", -1, -1),
    ("bottom right", 1, 1),
    ("bottom left", -1, 1),
)
#: a label's size estimate per character and per line, in units of its font size (Arial measures
#: 0.45-0.5 per character in Chromium; the margin keeps an estimate from passing a real overlap)
CHAR_WIDTH, LINE_HEIGHT = 0.56, 1.3


def place_labels(fig: go.Figure, font_size: float | None = None) -> go.Figure:
    """Give every labelled point of ``fig``'s labelled scatters a side of its marker where its label
    overlaps no other label and no marker and stays inside the plot area. A label that fits
    nowhere is left out of the drawing: its hover still names the point (the labels move to
    ``hovertext``), the names left out are logged as a warning and listed in
    ``fig.layout.meta["hidden_labels"]`` (a static export has no hover: say so in its caption).
    Call after :func:`style` (the placement needs the figure's final size).

    Axis ranges are fixed to the data's (with a margin; a reversed axis stays reversed), so pixel
    positions are known before the figure is drawn. Figures it cannot place exactly are returned
    as they are: subplots, log axes, and axes of categories or dates."""
    traces = [t for t in fig.data if t.type == "scatter" and t.mode and "text" in t.mode and t.text is not None]
    if not traces or any(t.xaxis not in (None, "x") or t.yaxis not in (None, "y") for t in fig.data):
        return fig
    axes = {"x": fig.layout.xaxis, "y": fig.layout.yaxis}
    if any(a.type not in (None, "-", "linear") for a in axes.values()) or not all(
        _numeric(getattr(t, k)) for t in fig.data for k in axes
    ):
        return fig
    span, flipped = {}, {}
    for k, axis in axes.items():
        lo, hi = sorted(axis.range) if axis.range else _data_range(fig, k)
        flipped[k] = axis.autorange == "reversed" or (axis.range is not None and axis.range[0] > axis.range[1])
        span[k] = (lo, hi)
        axis.update(range=[hi, lo] if flipped[k] else [lo, hi], autorange=False)
    m = fig.layout.margin
    width, height = fig.layout.width or 700, fig.layout.height or 450
    left, top = m.l if m.l is not None else 80, m.t if m.t is not None else 100
    pw = width - left - (m.r if m.r is not None else 80)
    ph = height - top - (m.b if m.b is not None else 80)

    def frac(v, k):  # 0 at the left (x) or top (y) edge of the plot area, 1 at the other
        lo, hi = span[k]
        f = (v - lo) / (hi - lo)
        return 1 - f if flipped[k] != (k == "y") else f

    def px(x, y):
        return left + frac(x, "x") * pw, top + frac(y, "y") * ph

    markers = []
    for t in fig.data:
        if t.type == "scatter" and t.mode and "markers" in t.mode and t.x is not None and t.y is not None:
            r = (t.marker.size if isinstance(t.marker.size, (int, float)) else 6) / 2
            markers += [(*px(x, y), r) for x, y in zip(t.x, t.y) if _finite(x, y)]
    taken = [(x - r, y - r, x + r, y + r) for x, y, r in markers]
    area = (left, top, left + pw, top + ph)
    hidden = []
    for t in traces:
        size = font_size or (t.textfont.size if t.textfont and t.textfont.size else None) or fig.layout.font.size or 12
        r = (t.marker.size if isinstance(t.marker.size, (int, float)) else 6) / 2 if "markers" in t.mode else 0
        positions, shown = [], []
        for x, y, label in zip(t.x, t.y, t.text):
            pos = None
            if _finite(x, y) and label:
                cx, cy = px(x, y)
                w, h = CHAR_WIDTH * size * len(str(label)), LINE_HEIGHT * size
                for name, sx, sy in LABEL_POSITIONS:
                    bx = cx - w / 2 if sx == 0 else (cx + r + 2 if sx > 0 else cx - r - 2 - w)
                    by = cy - h / 2 if sy == 0 else (cy + r + 1 if sy > 0 else cy - r - 1 - h)
                    box = (bx, by, bx + w, by + h)
                    own = (cx - r, cy - r, cx + r, cy + r)
                    if _inside(box, area) and not any(_hit(box, o) for o in taken if o != own):
                        pos = name
                        taken.append(box)
                        break
                if pos is None:
                    hidden.append(str(label))
            positions.append(pos or "top center")
            shown.append(label if pos else "")
        hover = t.hovertext if t.hovertext is not None else list(t.text)
        template = t.hovertemplate.replace("%{text}", "%{hovertext}") if t.hovertemplate else None
        t.update(text=shown, textposition=positions, hovertext=hover, hovertemplate=template)
    if hidden:
        logging.getLogger("interp").warning(
            "%d point label(s) left out of %r for want of room (in the hover only): %s",
            len(hidden),
            (fig.layout.title.text or "a figure").split("<br>")[0],
            ", ".join(hidden),
        )
    fig.update_layout(meta={**(fig.layout.meta if isinstance(fig.layout.meta, dict) else {}), "hidden_labels": hidden})
    return fig


def _numeric(values) -> bool:
    """Whether ``values`` (a trace's x or y) are numbers (or missing): not categories or dates."""
    if values is None:
        return True
    for v in values:
        if v is None or isinstance(v, (bool, int, float)) or (hasattr(v, "dtype") and v.dtype.kind in "iuf"):
            continue
        try:
            float(v)
        except (TypeError, ValueError):
            return False
        if isinstance(v, str):
            return False
    return True


def _finite(x, y) -> bool:
    try:
        return math.isfinite(float(x)) and math.isfinite(float(y))
    except (TypeError, ValueError):
        return False


def _hit(a, b) -> bool:
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


def _inside(a, area) -> bool:
    return a[0] >= area[0] and a[1] >= area[1] and a[2] <= area[2] and a[3] <= area[3]


def _data_range(fig: go.Figure, axis: str) -> tuple[float, float]:
    """The span of every trace's values on ``axis`` (error bars included), widened by 8% a side."""
    values = []
    for t in fig.data:
        v = getattr(t, axis, None)
        if v is None:
            continue
        err = getattr(t, f"error_{axis}", None)
        plus = err.array if err is not None and err.array is not None else [0.0] * len(v)
        minus = err.arrayminus if err is not None and err.arrayminus is not None else plus
        for a, up, down in zip(v, plus, minus):
            if _finite(a, 0):
                values += [float(a)] + [float(a) + s * float(e) for s, e in ((1, up), (-1, down)) if _finite(e, 0)]
    for shape in fig.layout.shapes or ():  # add_hline / add_vline at a data value
        ref = shape.yref if axis == "y" else shape.xref
        if ref == axis:
            values += [float(shape[f"{axis}0"]), float(shape[f"{axis}1"])]
    lo, hi = (min(values), max(values)) if values else (0.0, 1.0)
    pad = 0.08 * ((hi - lo) or 1.0)
    return lo - pad, hi + pad


def add_caption(fig: go.Figure, text: str, below: int = 75, font_size: int = 12) -> go.Figure:
    """A caption (``<br>`` between lines) under the plot area, ``below`` pixels from its bottom edge
    (past the tick labels and the axis title: about 75 for one row of tick labels, 100 for a log
    axis's two), with the bottom margin grown to hold it. Call after :func:`style`: the offset is in
    pixels, so the caption keeps its place at any figure height (an offset in fractions of the plot's
    height does not, and once printed a caption over the axis title)."""
    lines = text.count("<br>") + 1
    fig.add_annotation(
        text=text,
        xref="paper",
        yref="paper",
        x=0,
        y=0,
        yshift=-below,
        xanchor="left",
        yanchor="top",
        showarrow=False,
        align="left",
        font=dict(size=font_size),
    )
    fig.update_layout(margin=dict(b=max(fig.layout.margin.b or 0, below + round(1.4 * font_size * lines) + 10)))
    return fig


def add_subtitle(fig: go.Figure, text: str, font_size: int = 13) -> go.Figure:
    """``text`` as plotly's subtitle under the title, wrapped to the figure's width (call after
    :func:`style`), with the top margin grown to hold it: for a note whose place below the plot
    would depend on how long the tick labels are."""
    width = (fig.layout.width or 700) - 100
    lines = textwrap.wrap(text, max(20, int(width / (CHAR_WIDTH * font_size))))
    fig.update_layout(title_subtitle=dict(text="<br>".join(lines), font=dict(size=font_size)))
    return fit_title(fig)


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
