"""Attention patterns: which earlier tokens each head reads from, as a table and as figures.

A head's pattern ``A[q, k] = softmax(q_q . k_k / sqrt(d_head))`` (causal and padding masks
applied) says how much of position ``k``'s value enters position ``q``'s output. The
probabilities are the model's own, read from its eager attention (``Model.attention_pattern``),
on every family and both backends; padding is removed, so a prompt's pattern is the same alone
and in a batch (tested).

:func:`attention_patterns` returns one row per (prompt, layer, head, query position, key
position) of the real tokens: ``prompt_index`` (its place in the inputs: the same text twice is
two prompts), ``prompt``, ``layer``, ``head``, ``query_position``, ``key_position``,
``query_token``, ``key_token``, ``weight``. Every requested layer comes from one forward pass
per batch. Everything below draws from that
table, so a saved CSV redraws it:

- :func:`attention_figure`: a static grid of heads (query x key heatmaps, tokens on the axes), for
  papers and for wherever no notebook runs (plotly; exported by :func:`interp.plots.export`);
- :func:`attention_view`: the interactive view of circuitsvis (Cooney & Nanda) in a notebook:
  hover a token to see where each head looks. It inlines its JavaScript, so it works offline and
  keeps its interactivity in JupyterLab and VS Code (``pip install -e ".[notebook]"``).

>>> att = attention_patterns(model, ["When Mary and John went, John gave it to"], layers=[0, 1])
>>> attention_figure(att, layer=1)          # every head of layer 1, one prompt
>>> attention_view(att, layer=1)            # in Jupyter: circuitsvis's interactive heads
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from .models import Model, load_model
from .plots import SIZES, fit_title, style
from .prompts import as_prompts
from .tokens import encode

ATTENTION_COLUMNS = [
    "prompt_index",
    "prompt",
    "layer",
    "head",
    "query_position",
    "key_position",
    "query_token",
    "key_token",
    "weight",
]


class AttentionError(ValueError):
    pass


def attention_patterns(
    model, inputs, layers: Sequence[int] | None = None, heads: Sequence[int] | None = None, batch_size: int = 16
) -> pd.DataFrame:
    """The attention probabilities of ``inputs`` (prompts) at ``layers`` and ``heads`` (default:
    all), one row per (prompt, layer, head, query, key) of the real (unpadded) tokens."""
    if not isinstance(model, Model):
        model = load_model(model)
    L, H = model.n_layers, model.n_heads
    layers = list(range(L)) if layers is None else [int(x) for x in layers]
    heads = list(range(H)) if heads is None else [int(x) for x in heads]
    bad = [x for x in layers if not 0 <= x < L]
    if bad:
        raise AttentionError(f"layers {bad} are outside the model's 0 to {L - 1}")
    bad = [x for x in heads if not 0 <= x < H]
    if bad:
        raise AttentionError(f"heads {bad} are outside the model's 0 to {H - 1}")
    if batch_size < 1:
        raise AttentionError(f"batch_size must be at least 1, got {batch_size}")
    if model._standing:
        raise AttentionError(
            "this handle carries interventions (Model.intervened), which the model's own attention does not "
            "apply: read attention from the handle without them, or patch and read through model.run"
        )
    prompts = as_prompts(inputs)
    encoded = encode(model.tokenizer, prompts)
    frames = []
    for start in range(0, len(prompts), batch_size):
        chunk = list(range(start, min(len(prompts), start + batch_size)))
        batch = model.batch([encoded[i] for i in chunk], "right")
        patterns = model.attention_pattern(batch, layers).float().cpu().numpy()  # [layer, batch, head, q, k]
        for layer, pattern in zip(layers, patterns):
            for row, i in enumerate(chunk):
                n = len(encoded[i])
                tokens = _tokens(model, encoded[i].ids)
                w = pattern[row][heads][:, :n, :n]  # [head, q, k]
                h, q, k = np.meshgrid(heads, np.arange(n), np.arange(n), indexing="ij")
                frames.append(
                    pd.DataFrame(
                        {
                            "prompt_index": i,
                            "prompt": prompts[i].text if prompts[i].text is not None else f"prompt {i}",
                            "layer": layer,
                            "head": h.ravel(),
                            "query_position": q.ravel(),
                            "key_position": k.ravel(),
                            "query_token": np.asarray(tokens, dtype=object)[q.ravel()],
                            "key_token": np.asarray(tokens, dtype=object)[k.ravel()],
                            "weight": w.ravel(),
                        }
                    )
                )
    return pd.concat(frames, ignore_index=True)[ATTENTION_COLUMNS]


def _tokens(model, ids: Sequence[int]) -> list[str]:
    tok = model.tokenizer
    return [tok.decode([i]) for i in ids] if tok is not None else [str(i) for i in ids]


def _select(att: pd.DataFrame, prompt: str | int | None, layer: int | None) -> tuple[pd.DataFrame, str, int]:
    """One prompt's rows at one layer: ``prompt`` is its text (the first prompt with it) or its
    ``prompt_index``; None: the table's first."""
    if att.empty:
        raise AttentionError("the attention table is empty")
    prompts = list(dict.fromkeys(att.prompt))
    if prompt is None:
        index = att.prompt_index.iloc[0]
    elif isinstance(prompt, int):
        if prompt not in set(att.prompt_index):
            raise AttentionError(f"prompt index {prompt} is not in the attention table")
        index = prompt
    elif prompt in prompts:
        index = att.prompt_index[att.prompt == prompt].iloc[0]
    else:
        raise AttentionError(f"prompt {prompt!r} is not in the attention table; it has {prompts}")
    t = att[att.prompt_index == index]
    prompt = t.prompt.iloc[0]
    layers = sorted(set(t.layer))
    layer = layers[0] if layer is None else layer
    if layer not in layers:
        raise AttentionError(f"layer {layer} is not in the attention table; it has layers {layers}")
    return t[t.layer == layer], prompt, layer


def _prompt_tokens(t: pd.DataFrame) -> list[str]:
    """One prompt's tokens, in order (from its key positions, 0 to n - 1)."""
    return t.drop_duplicates("key_position").sort_values("key_position").key_token.tolist()


def _labels(t: pd.DataFrame) -> list[str]:
    """Axis labels ``"3 John"``: position and token, so that repeated tokens stay distinct."""
    return [f"{p} {s.strip() or repr(s)}" for p, s in enumerate(_prompt_tokens(t))]


def _pattern(t: pd.DataFrame, head: int) -> np.ndarray:
    g = t[t["head"] == head]
    return g.pivot(index="query_position", columns="key_position", values="weight").sort_index().to_numpy()


def attention_figure(
    att: pd.DataFrame,
    prompt: str | int | None = None,
    layer: int | None = None,
    heads: Sequence[int] | None = None,
    columns: int = 4,
    size: str = "two-column",
) -> go.Figure:
    """One prompt's attention at one layer (defaults: the table's first; a prompt by its text or its
    ``prompt_index``): a query (rows) x key
    (columns) heatmap per head, ``columns`` heads a row, on one 0-1 scale with one colour bar.
    Tokens label the axes of the first column and the last row; a longer prompt drops them (the
    hover still names every cell)."""
    t, prompt, layer = _select(att, prompt, layer)
    heads = sorted(set(t["head"])) if heads is None else list(heads)
    missing = [h for h in heads if h not in set(t["head"])]
    if missing or not heads:
        raise AttentionError(f"heads {missing or heads} are not in the attention table for layer {layer}")
    cols = max(1, min(columns, len(heads)))
    rows = -(-len(heads) // cols)
    labels = _labels(t)
    fig = make_subplots(
        rows=rows,
        cols=cols,
        subplot_titles=[f"head {h}" for h in heads],
        horizontal_spacing=0.04 if len(labels) > 12 else 0.08,
        vertical_spacing=0.12 / max(1, rows - 1) if rows > 1 else 0.0,
    )
    show_ticks = len(labels) <= 16
    for i, h in enumerate(heads):
        r, c = i // cols + 1, i % cols + 1
        fig.add_trace(
            go.Heatmap(
                z=_pattern(t, h),
                x=labels,
                y=labels,
                zmin=0,
                zmax=1,
                colorscale="Blues",
                showscale=i == 0,
                colorbar={"title": "weight", "len": 0.9},
                hovertemplate=f"head {h}<br>query %{{y}}<br>key %{{x}}<br>weight %{{z:.3f}}<extra></extra>",
            ),
            row=r,
            col=c,
        )
        fig.update_yaxes(autorange="reversed", showticklabels=show_ticks and c == 1, row=r, col=c)
        fig.update_xaxes(showticklabels=show_ticks and r == rows, tickangle=-60, row=r, col=c)
    fig.update_layout(title=f"Attention, layer {layer}: {prompt[:60]!r}")
    style(fig, size)
    fig.update_layout(
        height=max(SIZES[size][1], 260 * rows + 160),
        font={"size": 14},
        margin={"l": 130 if show_ticks else 40, "b": 130 if show_ticks else 40, "t": 80},
    )
    fig.update_annotations(font_size=14)
    return fit_title(fig)  # after the height is final


def attention_view(att: pd.DataFrame, prompt: str | int | None = None, layer: int | None = None):
    """circuitsvis's interactive attention view of one prompt at one layer (every head in the
    table, in order): displays in a notebook cell; ``str(view)`` is its HTML."""
    try:
        import circuitsvis as cv
    except ImportError:
        raise ImportError(
            "attention_view draws with circuitsvis: pip install circuitsvis (it comes with the notebook "
            'extra, pip install -e ".[notebook]"); attention_figure draws a static grid without it'
        ) from None
    t, _, _ = _select(att, prompt, None if layer is None else layer)
    heads = sorted(set(t["head"]))
    tokens = _prompt_tokens(t)
    pattern = np.stack([_pattern(t, h) for h in heads])  # [head, q, k]
    return cv.attention.attention_patterns(tokens=tokens, attention=pattern)


__all__ = ["attention_patterns", "attention_figure", "attention_view", "AttentionError", "ATTENTION_COLUMNS"]
