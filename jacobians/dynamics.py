"""Analyzers over training: run any measure on checkpoints and plot it against accuracy.

Grokking and knowledge acquisition happen *during* training; to see whether linear readability,
Jacobian alignment or LRE faithfulness precede or follow generalization, evaluate them on
checkpoints. :func:`track` takes ``(step, checkpoint)`` pairs (model handles, directories, or
anything your analyzers accept) and a dict of analyzers (``name -> fn(checkpoint) -> float or
dict of floats``) and returns a tidy DataFrame ``step, measure, value``; :func:`trajectory_plot`
draws every measure against the step, with train/test accuracy (if tracked) on the same axes.

    >>> df = track(checkpoints, {"train_accuracy": acc_on(train), "test_accuracy": acc_on(test),
    ...                          "centroid_alignment":
    ...                              lambda m: centroid_alignment(m, prompts).centroid_alignment.mean()})
    >>> trajectory_plot(df)
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

import pandas as pd
import plotly.graph_objects as go

from interp.plots import PALETTE, style
from interp.progress import progress_bar


def track(
    checkpoints: Iterable[tuple[int, object]], analyzers: Mapping[str, Callable], progress: bool | None = None
) -> pd.DataFrame:
    """Run every analyzer on every checkpoint; one row per (step, measure)."""
    if not analyzers:
        raise ValueError("no analyzers given: pass a dict name -> function(checkpoint)")
    rows = []
    items = list(checkpoints)
    for step, ckpt in progress_bar(items, desc="checkpoints", unit="checkpoints", progress=progress):
        for name, fn in analyzers.items():
            value = fn(ckpt)
            if isinstance(value, Mapping):
                rows += [{"step": step, "measure": f"{name}.{k}", "value": float(v)} for k, v in value.items()]
            else:
                rows.append({"step": step, "measure": name, "value": float(value)})
    return pd.DataFrame(rows)


def trajectory_plot(
    df: pd.DataFrame, measures: list[str] | None = None, title: str = "training dynamics", size: str = "two-column"
) -> go.Figure:
    """Each measure against the step (accuracies dashed)."""
    for col in ("step", "measure", "value"):
        if col not in df.columns:
            raise ValueError(f"trajectory_plot needs columns step, measure, value; got {list(df.columns)}")
    measures = measures or list(dict.fromkeys(df.measure))
    fig = go.Figure()
    for i, m in enumerate(measures):
        part = df[df.measure == m].sort_values("step")
        dash = "dash" if "accuracy" in m else "solid"
        fig.add_trace(
            go.Scatter(
                x=part.step,
                y=part.value,
                name=m,
                mode="lines",
                line=dict(color=PALETTE[i % len(PALETTE)], dash=dash, width=2.5),
            )
        )
    fig.update_layout(title=title, xaxis_title="training step", yaxis_title="value")
    return style(fig, size)


def from_log(log: pd.DataFrame, step: str = "step") -> pd.DataFrame:
    """A wide training log (one column per measure) as the tidy table :func:`trajectory_plot` reads."""
    value_cols = [c for c in log.columns if c not in (step, "seconds", "condition", "seed")]
    return log.melt(id_vars=[step], value_vars=value_cols, var_name="measure", value_name="value")
