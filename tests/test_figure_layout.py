"""Every figure the project exports renders clean in a real browser: no two text elements overlap,
and no text is clipped by the figure's edge (headless Chromium, see ``figure_layout.py``).

The figures are drawn from realistic tables: the saved results under ``docs/data`` (the
17-relation MiniLM study, the 24-relation world studies, the model comparison, the erasure
experiments), tables of the analyzers' own output on the shipped model, and synthetic tables of
real shapes (GPT-2 small's 12 x 12 heads, long relation names) where an analyzer would take
minutes; the study's own figures come from a finished study.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
from figure_layout import CHROMIUM, _overlap, fonts, layout_problems, text_boxes

from interp.plots import SIZES

DATA = Path(__file__).resolve().parents[1] / "docs" / "data"
LONG_RELATIONS = [
    "star constellation name",
    "landmark on continent",
    "person native language",
    "company hq",
    "fruit inside color",
    "product by company",
    "country capital city",
    "person occupation",
    "work of art by artist",
    "superhero archnemesis",
    "task done by tool",
    "pokemon evolution",
]


def _circuit_tables(rng) -> dict[str, pd.DataFrame]:
    heads = pd.DataFrame(
        [
            {
                "layer": l,
                "head": h,
                "score": (z := rng.normal()),
                "ci_low": z - 1,
                "ci_high": z + 1,
                "p_value": rng.uniform(),
            }
            for l in range(12)
            for h in range(12)
        ]
    )
    tokens = ["When", " Mary", " and", " John", " went", " to", " the", " store", ",", " John", " gave", " a"]
    positions = pd.DataFrame(
        [
            {"site": "resid_pre", "layer": l, "position": p, "score": rng.normal()}
            for l in range(12)
            for p in range(len(tokens))
        ]
    )
    edges = []
    for i in range(30):
        s_layer = int(rng.integers(0, 11))
        r_layer = int(rng.integers(s_layer + 1, 12))
        s_head, r_head = int(rng.integers(0, 12)), int(rng.integers(0, 12))
        edges.append(
            {
                "sender": f"L{s_layer}H{s_head}",
                "receiver": f"L{r_layer}H{r_head}.{'qkv'[i % 3]}",
                "sender_layer": s_layer,
                "sender_head": s_head,
                "receiver_layer": r_layer,
                "receiver_head": r_head,
                "score": rng.normal(),
            }
        )
    edges.append(
        {"sender": "embed", "receiver": "logits", "sender_layer": -1, "sender_head": None, "receiver_layer": 12,
         "receiver_head": None, "score": 2.0}
    )  # fmt: skip
    sizes = [0, 2, 4, 5, 9, 23, 46]
    curve = [
        {"method": m, "n_items": k, "faithfulness": min(1.0, k / 9)} for m in ("EAP", "EAP-IG-inputs") for k in sizes
    ]
    curve += [
        {"method": "random", "draw": d, "n_items": k, "faithfulness": float(rng.uniform())}
        for d in range(9)
        for k in sizes
    ]
    curve = pd.DataFrame(curve)
    curve.attrs["n_items"] = 46
    summary = pd.DataFrame(
        {
            "method": ["EAP", "EAP-IG-inputs"],
            "cpr": [0.904, 0.904],
            "cmd": [0.096, 0.096],
            "random_cpr_mean": [0.312, 0.312],
            "random_cpr_sd": [0.112, 0.112],
            "random_cmd_mean": [0.688, 0.688],
        }
    )
    return {"heads": heads, "positions": positions, "tokens": tokens, "edges": pd.DataFrame(edges), "curve": curve,
            "summary": summary}  # fmt: skip


def library_figures() -> dict:
    """The analyzers' figures (interp, probes, circuits, jacobians), each at its sizes."""
    import torch

    import interp
    from circuits import TokenAttribution, circuit_graph, faithfulness_plot, head_heatmap, position_heatmap
    from circuits.token_attribution import token_figure
    from interp.attention import attention_figure, attention_patterns
    from interp.lens import lens_figure, target_rank_figure
    from jacobians.dynamics import trajectory_plot
    from probes.plots import accuracy_by_layer, layer_relation_heatmap

    rng = np.random.default_rng(0)
    torch.manual_seed(0)
    model = interp.load_model("world")
    prompts = ["Vorn Kallit city :", "Ada Berg has the team", "the apple is one of the"]
    figs = {}
    lens = interp.logit_lens(model, prompts, positions="all", targets=[":"])
    figs["lens"] = lens_figure(lens)
    figs["target_rank"] = target_rank_figure(lens)
    scores = TokenAttribution(model, method="gradient_x_input").run(prompts)
    for size in SIZES:
        figs[f"tokens_{size}"] = token_figure(scores, size=size)
    att = attention_patterns(model, prompts[:1])
    figs["attention"] = attention_figure(att, layer=1)
    figs["attention_one_column"] = attention_figure(att, layer=1, heads=[0, 1], columns=2, size="one-column")
    c = _circuit_tables(rng)
    figs["head_heatmap"] = head_heatmap(c["heads"], significance="mark")
    figs["position_heatmap"] = position_heatmap(c["positions"], tokens=c["tokens"])
    figs["circuit_graph"] = circuit_graph(c["edges"])
    for size in SIZES:
        figs[f"faithfulness_{size}"] = faithfulness_plot(
            c["curve"], c["summary"], "Faithfulness of circuits (edges)", size
        )
    sweep = pd.DataFrame(
        [
            {"relation": r, "layer": l, "fold": f, "accuracy": float(rng.uniform()), "chance": 0.1}
            for r in LONG_RELATIONS
            for l in range(13)
            for f in range(3)
        ]
    )
    figs["probe_heatmap"] = layer_relation_heatmap(sweep)
    figs["probe_by_layer"] = accuracy_by_layer(sweep, relations=LONG_RELATIONS[:4])
    steps = np.arange(0, 5000, 100)
    dyn = pd.concat(
        [pd.DataFrame({"step": steps, "measure": m, "value": rng.uniform(size=len(steps))})
         for m in ("train_accuracy", "test_accuracy", "centroid_alignment", "jacobian_rank")]
    )  # fmt: skip
    figs["dynamics"] = trajectory_plot(dyn, title="Training dynamics (weight decay, seed 0)")
    return figs


def saved_result_figures() -> dict:
    """Figures drawn from results saved in docs/data (the same code the CLI's ``figures`` runs)."""
    from lab.study import figures as study_figures
    from lab.study.compare import compare_figures
    from lab.study.interventions.report import figures as intervention_figures
    from lab.study.randomized import effects_figure

    figs = {}
    compare = compare_figures(
        pd.read_csv(DATA / "compare" / "compare.csv"), pd.read_csv(DATA / "compare" / "compare_relations.csv")
    )
    figs.update({f"compare_{k}": v for k, v in compare.items()})
    for name in ("interventions", "interventions-minilm"):
        figs.update({f"{name}_{k}": v for k, v in intervention_figures(DATA / name).items()})
    for model in ("minilm", "world"):
        rel = pd.read_csv(DATA / "studies" / model / "relations.csv")
        stats = pd.DataFrame(
            [{"method": "full", "predictor": "readability_best_kappa", "outcome": "generalization_kappa",
              "analysis": "pearson", "r": 0.88, "ci_low": 0.75, "ci_high": 0.95, "p_value": 0.0005,
              "p_monte_carlo": 0.0005, "n": len(rel)}]
        )  # fmt: skip
        figs[f"study_scatter_{model}"] = study_figures.scatter(rel, stats, "full")
    rng = np.random.default_rng(1)
    names = LONG_RELATIONS[:9] + ["city", "sport", "month"]
    d = pd.DataFrame(
        {
            "relation": names,
            "group": ["manipulated"] * 6 + ["control"] * 4 + ["derived"] * 2,
            "delta_readability": rng.normal(0.1, 0.1, len(names)),
            "delta_generalization": rng.normal(0.05, 0.1, len(names)),
        }
    )
    for what in ("readability", "generalization"):
        d[f"delta_{what}_ci_low"] = d[f"delta_{what}"] - 0.08
        d[f"delta_{what}_ci_high"] = d[f"delta_{what}"] + 0.08
    figs["randomized_effects"] = effects_figure(d, {"cross_sectional_slope": {"estimate": 0.6}})
    return figs


def _check(figs: dict) -> None:
    boxes = text_boxes(list(figs.values()))
    found = {name: layout_problems(b) for name, b in zip(figs, boxes)}
    assert all(b["texts"] for b in boxes), [n for n, b in zip(figs, boxes) if not b["texts"]]
    bad = {name: p for name, p in found.items() if p}
    assert not bad, f"Arial is {fonts()}: " + json.dumps(bad, indent=1)


def test_the_checker_finds_overlap_and_clipping():
    import plotly.graph_objects as go

    fig = go.Figure(go.Scatter(x=[0, 1], y=[0, 1]))
    fig.update_layout(width=400, height=300, xaxis_title="a long axis title")
    fig.add_annotation(text="printed over the axis title", xref="paper", yref="paper", x=0.5, y=-0.22, showarrow=False)
    fig.update_layout(title="a title far too long for a figure of four hundred pixels runs off its right edge")
    (boxes,) = text_boxes([fig])
    problems = layout_problems(boxes)
    assert any("overlaps" in p and "printed over" in p for p in problems), problems
    assert any("clipped" in p and "far too long" in p for p in problems), problems
    clean = go.Figure(go.Scatter(x=[0, 1], y=[0, 1]))
    clean.update_layout(width=400, height=300, xaxis_title="x", title="a title")
    assert layout_problems(text_boxes([clean])[0]) == []


def test_every_analyzer_figure_renders_clean():
    assert CHROMIUM is not None, "this test needs Chromium: apt-get install -y chromium (README's test command does)"
    _check(library_figures())


def test_every_saved_result_figure_renders_clean():
    _check(saved_result_figures())


def test_the_study_report_figures_render_clean(finished_study):
    from lab.study.figures import build_all

    out, _ = finished_study
    _check(build_all(out))


def test_the_overlap_of_rotated_boxes():
    """Two tick labels turned by -60 degrees, side by side: their axis-aligned boxes overlap, they
    do not; shifted onto each other, they do."""
    import math

    def label(x0, length=60.0, height=12.0, angle=-60.0):
        a = math.radians(angle)
        c, s = math.cos(a), math.sin(a)
        return [
            (x0 + u * c - v * s, 100 + u * s + v * c) for u, v in ((0, 0), (length, 0), (length, height), (0, height))
        ]

    near = [label(0), label(16)]
    xs = [[p[0] for p in q] for q in near]
    assert min(max(xs[0]), max(xs[1])) - max(min(xs[0]), min(xs[1])) > 10  # the axis-aligned boxes overlap
    assert _overlap(*near) <= 0  # the labels do not
    assert _overlap(label(0), label(5)) > 1
    assert _overlap([(0, 0), (10, 0), (10, 10), (0, 10)], [(20, 0), (30, 0), (30, 10), (20, 10)]) < 0
