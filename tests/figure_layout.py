"""Render plotly figures in headless Chromium and measure where their text lands.

Every figure is drawn by plotly.js at its own width and height (the size its static export
has: kaleido runs the same plotly.js in the same Chromium), all of them in one page and one
browser process. A script then collects the bounding box of every visible SVG text element
(titles, tick labels, legend entries, annotations, colour-bar labels, heatmap cell text) and
of the figure, and writes them into the page, which ``--dump-dom`` returns.

:func:`layout_problems` turns those boxes into findings: two text boxes that overlap by more
than ``tolerance`` pixels in both directions, or a text box that leaves the figure.
"""

from __future__ import annotations

import html
import json
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import plotly.graph_objects as go
from plotly.offline import get_plotlyjs

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")

_COLLECT = """
<script>
const divs = [...document.querySelectorAll('div.fig')];
Promise.allSettled(divs.map((d, i) => Plotly.newPlot(d, FIGS[i].data, FIGS[i].layout, {staticPlot: true})))
  .then(results => {
    const failed = results.map((r, i) => r.status === 'rejected' ? `figure ${i}: ${r.reason}` : null).filter(x => x);
    if (failed.length) { document.getElementById('boxes').textContent = 'ERROR ' + failed.join('; '); return; }
    const out = divs.map(d => {
      const f = d.getBoundingClientRect();
      const texts = [...d.querySelectorAll('svg text')].filter(t => {
        if (!t.textContent.trim()) return false;
        if (t.closest('.hoverlayer')) return false;
        const s = getComputedStyle(t);
        if (s.display === 'none' || s.visibility === 'hidden' || s.opacity === '0') return false;
        const b = t.getBoundingClientRect();
        return b.width > 0 && b.height > 0;
      }).map(t => {
        const b = t.getBoundingClientRect();
        // the text's own box (before rotation), mapped to the page: a rotated tick label's
        // corners, not the larger axis-aligned box around it
        const l = t.getBBox(), m = t.getScreenCTM();
        const corners = [[l.x, l.y], [l.x + l.width, l.y], [l.x + l.width, l.y + l.height], [l.x, l.y + l.height]]
          .map(([x, y]) => [m.a * x + m.c * y + m.e - f.left, m.b * x + m.d * y + m.f - f.top]);
        return {text: t.textContent, x0: b.left - f.left, y0: b.top - f.top, x1: b.right - f.left,
                y1: b.bottom - f.top, corners: corners};
      });
      return {width: f.width, height: f.height, texts: texts};
    });
    document.getElementById('boxes').textContent = JSON.stringify(out);
  })
  .catch(e => { document.getElementById('boxes').textContent = 'ERROR ' + e; });
</script>
"""


def headless(profile: Path) -> list[str]:
    """Chromium's command line for a headless run that touches no network and no user profile."""
    return [
        CHROMIUM,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        f"--user-data-dir={profile}",
    ]


def text_boxes(figures: list[go.Figure]) -> list[dict]:
    """For each figure: ``{"width", "height", "texts": [{"text", "x0", "y0", "x1", "y1"}]}``."""
    if CHROMIUM is None:
        raise RuntimeError("rendering figures needs Chromium: apt-get install -y chromium (README's test command does)")
    specs = [json.loads(f.to_json()) for f in figures]
    divs = "".join(
        f'<div class="fig" style="width:{s["layout"].get("width", 700)}px;height:{s["layout"].get("height", 500)}px">'
        "</div>"
        for s in specs
    )
    page = (
        "<html><head><meta charset='utf-8'><script>"
        + get_plotlyjs()
        + "</script></head><body style='margin:0'>"
        + divs
        + "<pre id='boxes'></pre><script>const FIGS = "
        + json.dumps(specs).replace("</", "<\\/")
        + ";</script>"
        + _COLLECT
        + "</body></html>"
    )
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "figures.html"
        path.write_text(page)
        try:
            proc = subprocess.run(
                [*headless(Path(tmp) / "profile"), "--virtual-time-budget=30000", "--dump-dom", path.as_uri()],
                capture_output=True,
                text=True,
                timeout=300,
            )
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"Chromium did not render {len(figures)} figures within 300 s") from None
    m = re.search(r"<pre id=\"boxes\">(.*?)</pre>", proc.stdout, re.S)
    if not m or not m.group(1) or m.group(1).startswith("ERROR"):
        raise RuntimeError(f"the figures did not render: {(m.group(1) if m else proc.stderr[-2000:])!r}")
    return json.loads(html.unescape(m.group(1)))


def fonts() -> str:
    """What fontconfig gives for Arial, the figures' font (a failure message says it: the text
    boxes are measured with it; Liberation Sans has Arial's metrics, DejaVu Sans is wider)."""
    try:
        return subprocess.run(["fc-match", "Arial"], capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return "unknown (no fc-match)"


def layout_problems(boxes: dict, tolerance: float = 1.0) -> list[str]:
    """Overlapping text boxes and text clipped by the figure's edge, described."""
    problems = []
    texts = boxes["texts"]
    for t in texts:
        if (
            t["x0"] < -tolerance
            or t["y0"] < -tolerance
            or t["x1"] > boxes["width"] + tolerance
            or (t["y1"] > boxes["height"] + tolerance)
        ):
            size = f"{boxes['width']:.0f}x{boxes['height']:.0f}"
            problems.append(f"{t['text']!r} is clipped by the figure's edge ({_box(t)} in {size})")
    for i, a in enumerate(texts):
        for b in texts[i + 1 :]:
            if _overlap(a["corners"], b["corners"]) > tolerance:
                problems.append(f"{a['text']!r} {_box(a)} overlaps {b['text']!r} {_box(b)}")
    return problems


def _overlap(p: list, q: list) -> float:
    """How deep two convex quadrilaterals overlap, in pixels: the smallest overlap of their
    projections over the four edge normals (separating-axis theorem; <= 0 when apart)."""
    depth = float("inf")
    for poly in (p, q):
        for (x0, y0), (x1, y1) in zip(poly, poly[1:] + poly[:1]):
            nx, ny = y0 - y1, x1 - x0
            norm = (nx * nx + ny * ny) ** 0.5 or 1.0
            pa = [(x * nx + y * ny) / norm for x, y in p]
            pb = [(x * nx + y * ny) / norm for x, y in q]
            depth = min(depth, min(max(pa), max(pb)) - max(min(pa), min(pb)))
    return depth


def _box(t: dict) -> str:
    return f"[{t['x0']:.0f},{t['y0']:.0f}]-[{t['x1']:.0f},{t['y1']:.0f}]"
