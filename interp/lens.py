"""The logit lens: what each layer's residual stream would predict if the model stopped there.

nostalgebraist's logit lens (2020) reads an intermediate residual stream ``h_l`` with the model's
own read-out, ``unembed(final_norm(h_l))``: a layer-by-layer view of when the answer appears.
Here it is computed through the model handle alone, on every family and both backends: the
residual at ``blocks.{l}.hook_resid_post`` is captured, then written in place of the last
block's output (``blocks.{L-1}.hook_resid_post``) in a second forward pass, so that what follows
(the final norm and the unembedding, or an encoder's masked-LM head) is exactly the model's own.
At the last layer the replacement is the identity: the lens there *is* the model's logits
(tested on every family). The tuned lens (Belrose et al. 2023) adds a trained affine map per
layer; this is the plain lens.

:func:`logit_lens` returns one row per (prompt, layer, position, token): the ``k`` most likely
tokens, and every ``targets`` token, with ``logit``, ``prob`` (softmax over the vocabulary) and
``rank`` (1 = the top token). Cost: one forward pass per layer (plus one to capture).

Figures, built from that table (so a saved CSV redraws them): :func:`lens_figure`, layer x
position with each cell's top token written in it and coloured by its probability;
:func:`target_rank_figure`, each target token's rank by layer (log scale), a line per position.

>>> lens = logit_lens(model, ["The Eiffel Tower is in"], targets=[" Paris"])
>>> lens[lens.target].pivot(index="layer", columns="position", values="rank")
>>> lens_figure(lens)                 # one prompt's grid; target_rank_figure(lens) for the targets
"""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd
import plotly.graph_objects as go
import torch

from .models import Model, load_model
from .plots import PALETTE, style
from .prompts import as_prompts
from .tokens import PositionSpec, encode, resolve_positions

LENS_COLUMNS = ["prompt", "layer", "position", "token", "token_id", "logit", "prob", "rank", "target"]


class LogitLensError(ValueError):
    pass


def _target_ids(model: Model, targets: Sequence[str] | None) -> list[int]:
    ids = []
    for t in targets or ():
        enc = model.tokenizer(t, add_special_tokens=False)["input_ids"]
        if len(enc) != 1:
            raise LogitLensError(
                f"target {t!r} is {len(enc)} tokens ({model.tokenizer.convert_ids_to_tokens(enc)}); the lens ranks "
                "single tokens: give the first token of a longer answer (mind a leading space)"
            )
        unk = model.tokenizer.unk_token_id
        if unk is not None and enc[0] == unk and t != model.tokenizer.unk_token:
            raise LogitLensError(f"target {t!r} is not in the model's vocabulary (it encodes as the unknown token)")
        ids.append(enc[0])
    return ids


@torch.no_grad()
def logit_lens(
    model,
    inputs,
    layers: Sequence[int] | None = None,
    positions: PositionSpec = "last",
    targets: Sequence[str] | None = None,
    k: int = 5,
    batch_size: int = 16,
) -> pd.DataFrame:
    """The logit lens of ``inputs`` (prompts) at ``layers`` (default: every layer) and
    ``positions`` (``"last"``, ``"all"``, ``"subject_last"``, an int or a list): the top ``k``
    tokens and every ``targets`` token (single tokens) per (prompt, layer, position)."""
    if not isinstance(model, Model):
        model = load_model(model)
    L = model.n_layers
    layers = list(range(L)) if layers is None else [int(x) for x in layers]
    bad = [x for x in layers if not 0 <= x < L]
    if bad:
        raise LogitLensError(f"layers {bad} are outside the model's 0 to {L - 1}")
    if k < 0 or batch_size < 1:
        raise LogitLensError(f"k must be at least 0 and batch_size at least 1 (got k={k}, batch_size={batch_size})")
    target_ids = _target_ids(model, targets)
    prompts = as_prompts(inputs)
    encoded = encode(model.tokenizer, prompts)
    where = [resolve_positions(e, p, positions, i) for i, (e, p) in enumerate(zip(encoded, prompts))]
    last = model.resid_site(L - 1)
    sites = [model.resid_site(x) for x in layers]
    vocab = len(model.tokenizer)
    rows: list[dict] = []
    for start in range(0, len(prompts), batch_size):
        chunk = list(range(start, min(len(prompts), start + batch_size)))
        batch = model.batch([encoded[i] for i in chunk], "right")
        resid = model.read(batch, sites)
        for layer, site in zip(layers, sites):
            h = resid[site]
            logits = model.run(batch, {last: lambda act, h=h: h.to(act.dtype)})
            if logits is None or logits.shape[-1] < vocab:
                raise LogitLensError(
                    f"{model.name} has no head that maps its residual stream to tokens (an encoder loaded without "
                    "its masked-LM head, e.g. a sentence-transformer): load it with its language-model head "
                    "(AutoModelForMaskedLM or AutoModelForCausalLM)"
                )
            logp = torch.log_softmax(logits.float(), -1)
            for row, i in enumerate(chunk):
                for pos in where[i]:
                    lg, lp = logits[row, pos].float(), logp[row, pos]
                    ranks = None
                    top = lg.topk(min(k, lg.shape[-1])).indices.tolist() if k else []
                    for rank0, tid in enumerate(top):
                        rows.append(_row(model, prompts[i].text, layer, pos, tid, lg, lp, rank0 + 1, False))
                    for tid in target_ids:
                        ranks = ranks if ranks is not None else lg.argsort(descending=True).argsort()
                        rows.append(_row(model, prompts[i].text, layer, pos, tid, lg, lp, int(ranks[tid]) + 1, True))
    return pd.DataFrame(rows, columns=LENS_COLUMNS)


def _row(model, prompt, layer, pos, tid, lg, lp, rank, target) -> dict:
    return {
        "prompt": prompt,
        "layer": layer,
        "position": pos,
        "token": model.tokenizer.decode([tid]),
        "token_id": tid,
        "logit": float(lg[tid]),
        "prob": float(lp[tid].exp()),
        "rank": rank,
        "target": target,
    }


def _one_prompt(lens: pd.DataFrame, prompt: str | None) -> pd.DataFrame:
    prompts = list(dict.fromkeys(lens.prompt))
    if not prompts:
        raise LogitLensError("the lens table is empty")
    if prompt is None:
        prompt = prompts[0]
    if prompt not in prompts:
        raise LogitLensError(f"prompt {prompt!r} is not in the lens table; it has {prompts}")
    return lens[lens.prompt == prompt]


def lens_figure(lens: pd.DataFrame, prompt: str | None = None, size: str = "two-column") -> go.Figure:
    """Layer (rows) x position (columns) of one prompt (default: the first): each cell's top token
    written in it, coloured by its probability (0 to 1), from :func:`logit_lens`'s table."""
    t = _one_prompt(lens, prompt)
    top = t[(~t.target) & (t["rank"] == 1)]
    grid = top.pivot(index="layer", columns="position", values="prob").sort_index()
    text = top.pivot(index="layer", columns="position", values="token").reindex_like(grid)
    positions = list(grid.columns)
    fig = go.Figure(
        go.Heatmap(
            z=grid.to_numpy(),
            x=[str(p) for p in positions],
            y=[str(layer) for layer in grid.index],
            text=text.to_numpy(),
            texttemplate="%{text}",
            zmin=0,
            zmax=1,
            colorscale="Blues",
            colorbar={"title": "p(top token)"},
            hovertemplate="layer %{y}, position %{x}<br>top token %{text}: p = %{z:.3f}<extra></extra>",
        )
    )
    fig.update_layout(
        title=f"Logit lens: {t.prompt.iloc[0][:60]!r}",
        xaxis_title="position (token index)",
        yaxis_title="layer (residual after the block)",
    )
    return style(fig, size)


def target_rank_figure(lens: pd.DataFrame, prompt: str | None = None, size: str = "one-column") -> go.Figure:
    """Each target token's rank (1 = the top token; log scale) by layer, one line per target and
    position, for one prompt (default: the first)."""
    t = _one_prompt(lens, prompt)
    t = t[t.target]
    if t.empty:
        raise LogitLensError("the lens table has no target rows: run logit_lens(..., targets=[...])")
    fig = go.Figure()
    for i, ((token, pos), g) in enumerate(t.groupby(["token", "position"], sort=False)):
        g = g.sort_values("layer")
        fig.add_trace(
            go.Scatter(
                x=g.layer,
                y=g["rank"],
                mode="lines+markers",
                name=f"{token!r} at {pos}",
                line={"color": PALETTE[i % len(PALETTE)]},
            )
        )
    # ticks at 1, 2, 5, 10, 20, 50, ...: plotly labels every integer on a log axis spanning about a
    # decade, and at a figure's height those labels overlap
    top = max(int(t["rank"].max()), 1)
    ticks = [m * 10**e for e in range(len(str(top)) + 1) for m in (1, 2, 5) if m * 10**e <= 2 * top]
    fig.update_yaxes(
        type="log",
        autorange="reversed",
        title="rank of the target (1 = top)",
        tickvals=ticks,
        ticktext=[str(v) for v in ticks],
    )
    fig.update_xaxes(title="layer", dtick=1)
    fig.update_layout(title="Target token's rank by layer")
    return style(fig, size)


__all__ = ["logit_lens", "lens_figure", "target_rank_figure", "LogitLensError", "LENS_COLUMNS"]
