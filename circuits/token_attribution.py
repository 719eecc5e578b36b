"""Token attribution: how much each token of a prompt moves a metric of the model's prediction.

For a prompt of tokens with input embeddings ``e_t`` (``hook_embed``: the token embedding rows,
before any positional embedding) and a scalar metric ``m`` of the logits (by default the
log-probability of a target token at the last position; the target defaults to the model's own
top prediction), :class:`TokenAttribution` scores every token ``t``:

- ``"integrated_gradients"`` (Sundararajan et al. 2017): ``(e_t - b_t) . mean_j dm/de_t`` at the
  points ``b + a_j (e - b)`` with midpoints ``a_j = (j + 1/2) / steps`` on the straight path from
  a baseline ``b`` (``"zeros"``: the zero vector; ``"pad"``: the pad token's embedding) to the
  input. The scores sum to ``m(e) - m(b)`` as ``steps`` grows (*completeness*); the gap left at
  the chosen ``steps`` is reported per prompt as ``completeness_error``, measured, not assumed.
  Mind the baseline: a model that normalizes the token embeddings before anything else and adds
  no positional embedding (Llama; GPT-NeoX's rotary models) gives ``m(a e) = m(e)`` for every
  ``a > 0``, so from the zero vector the whole change sits at the path's start; the midpoint rule
  cannot resolve it and ``completeness_error`` says so (measured on a tiny Llama: 9% of the change
  at 32 steps, 41% at 512). Use ``baseline="pad"`` where the pad row is not zero, or another
  reference input;
- ``"gradient_x_input"``: ``e_t . dm/de_t`` (one backward pass);
- ``"occlusion"``: ``m(e) - m(e with e_t replaced by b_t)``: exact, one token at a time, every
  occluded copy of every prompt batched.

Prompts are left-padded in batches (so the last position is every prompt's last token) with
their attention masks and position ids; scores at padding never appear, and a batch gives each
prompt the scores it gets alone (tested). Everything goes through the model handle, so it runs on
both backends and every family the handle maps.

``run`` returns a tidy DataFrame: ``prompt``, ``position``, ``token``, ``score``, with
``method``, ``target`` (the attributed token, when the default metric is used), ``metric`` (its
value on the prompt) and, for integrated gradients, ``baseline_metric`` and ``completeness_error``.

:func:`token_figure` draws the table (saved or fresh): the tokens written as text, one row per
prompt, each coloured by its score on a diverging scale centred at 0, with a colour bar.

>>> attr = TokenAttribution(model, method="integrated_gradients", steps=64)
>>> scores = attr.run(["The Eiffel Tower is in the city of"], targets=[" Paris"])
>>> token_figure(scores)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import torch

from interp.models import Model, load_model
from interp.plots import style
from interp.prompts import as_prompts
from interp.tokens import encode

Tensor = torch.Tensor
METHODS = ("integrated_gradients", "gradient_x_input", "occlusion")
BASELINES = ("zeros", "pad")
EMBED = "hook_embed"


class TokenAttributionError(ValueError):
    pass


class TokenAttribution:
    """Configured once, applied to prompts with :meth:`run` (module docstring).

    ``metric``: ``None`` (log-probability of the target at the last position) or a function of
    the logits ``[batch, pos, vocab]`` (left-padded: position -1 is every prompt's last token)
    returning one value per prompt ``[batch]``; it must be differentiable for the gradient
    methods. ``steps``: integrated gradients' path points. ``batch_size``: rows per forward pass
    (prompts, path points or occluded copies)."""

    def __init__(
        self,
        model,
        metric: Callable[[Tensor], Tensor] | None = None,
        method: str = "integrated_gradients",
        steps: int = 128,
        baseline: str = "zeros",
        batch_size: int = 16,
    ):
        if method not in METHODS:
            raise TokenAttributionError(f"method must be one of {', '.join(METHODS)}, got {method!r}")
        if baseline not in BASELINES:
            raise TokenAttributionError(f"baseline must be one of {', '.join(BASELINES)}, got {baseline!r}")
        if steps < 1 or batch_size < 1:
            raise TokenAttributionError(f"steps and batch_size must be at least 1 (got {steps}, {batch_size})")
        self.model = model if isinstance(model, Model) else load_model(model)
        if EMBED not in self.model.sites:
            raise TokenAttributionError(f"{self.model.name} has no {EMBED} site to attribute to")
        self.metric = metric
        self.method = method
        self.steps = steps
        self.baseline = baseline
        self.batch_size = batch_size

    # ------------------------------------------------------------------------------------------
    def run(self, inputs, targets: Sequence[str] | None = None) -> pd.DataFrame:
        """Scores of every token of every prompt in ``inputs``; ``targets``: one token per prompt
        (a string of one token) for the default metric, or None for the model's own prediction."""
        model = self.model
        prompts = as_prompts(inputs)
        if targets is not None and self.metric is not None:
            raise TokenAttributionError("targets are for the default metric; a custom metric names its own")
        if targets is not None and len(targets) != len(prompts):
            raise TokenAttributionError(f"{len(targets)} targets for {len(prompts)} prompts: give one per prompt")
        encoded = encode(model.tokenizer, prompts)
        target_ids = [self._token_id(t) for t in targets] if targets is not None else None
        rows = []
        for start in range(0, len(prompts), self.batch_size):
            idx = list(range(start, min(len(prompts), start + self.batch_size)))
            batch = model.batch([encoded[i] for i in idx], "left")
            emb = model.read(batch, [EMBED])[EMBED].detach()
            tgt = None
            if self.metric is None:
                if target_ids is not None:
                    tgt = torch.tensor([target_ids[i] for i in idx])
                else:
                    with torch.no_grad():
                        tgt = model.run(batch)[:, -1].argmax(-1).cpu()
            base = self._baseline(emb)
            scores, extra = getattr(self, f"_{self.method}")(batch, emb, base, tgt)
            for row, i in enumerate(idx):
                n = len(encoded[i])
                pad = batch.input_ids.shape[1] - n
                ids = batch.input_ids[row, pad:].tolist()
                for t in range(n):
                    rows.append(
                        {
                            "prompt": prompts[i].text,
                            "position": t,
                            "token": model.tokenizer.decode([ids[t]]),
                            "score": float(scores[row, pad + t]),
                            "method": self.method,
                            "target": None if tgt is None else model.tokenizer.decode([int(tgt[row])]),
                            **{k: float(v[row]) for k, v in extra.items()},
                        }
                    )
        return pd.DataFrame(rows)

    # ------------------------------------------------------------------------------------------
    def _token_id(self, target: str) -> int:
        tok = self.model.tokenizer
        ids = tok(target, add_special_tokens=False)["input_ids"]
        if len(ids) != 1:
            raise TokenAttributionError(
                f"target {target!r} is {len(ids)} tokens; give one token (mind a leading space), or a metric"
            )
        if tok.unk_token_id is not None and ids[0] == tok.unk_token_id and target != tok.unk_token:
            raise TokenAttributionError(f"target {target!r} is not in the model's vocabulary")
        return ids[0]

    def _baseline(self, emb: Tensor) -> Tensor:
        if self.baseline == "zeros":
            return torch.zeros_like(emb)
        row = self.model.input_embeddings()[self.model.pad_token_id].detach().to(emb.device, emb.dtype)
        return row.expand_as(emb).clone()

    def _values(self, batch, x: Tensor, tgt: Tensor | None, repeat: int) -> Tensor:
        """The metric of each row of a batch repeated ``repeat`` times, with ``x`` as its embeddings."""
        rep = _repeat(batch, repeat)
        logits = self.model.run(rep, {EMBED: lambda act: x.to(act.dtype)})
        if self.metric is None:
            lp = torch.log_softmax(logits[:, -1].float(), -1)
            t = tgt.repeat(repeat).to(lp.device)
            return lp[torch.arange(len(t), device=lp.device), t]
        out = self.metric(logits)
        if not isinstance(out, Tensor) or out.shape != (logits.shape[0],):
            raise TokenAttributionError(
                f"the metric must return one value per prompt, a tensor of shape [{logits.shape[0]}]; "
                f"got {getattr(out, 'shape', type(out).__name__)}"
            )
        return out.float()

    def _gradient(self, batch, x: Tensor, tgt, repeat: int) -> tuple[Tensor, Tensor]:
        with torch.enable_grad():
            x = x.detach().requires_grad_(True)
            value = self._values(batch, x, tgt, repeat)
            if not value.requires_grad:
                raise TokenAttributionError("the metric is not differentiable (argmax, .item() or detach?)")
            (grad,) = torch.autograd.grad(value.sum(), x)
        return grad, value.detach()

    def _gradient_x_input(self, batch, emb, base, tgt):
        grad, value = self._gradient(batch, emb, tgt, 1)
        return (grad * emb).sum(-1), {"metric": value}

    def _integrated_gradients(self, batch, emb, base, tgt):
        B = emb.shape[0]
        alphas = [(j + 0.5) / self.steps for j in range(self.steps)]
        per = max(1, self.batch_size // B)  # path points per pass
        total = torch.zeros_like(emb)
        for k in range(0, len(alphas), per):
            a = torch.tensor(alphas[k : k + per], dtype=emb.dtype, device=emb.device)
            x = (base[None] + a[:, None, None, None] * (emb - base)[None]).reshape(-1, *emb.shape[1:])
            grad, _ = self._gradient(batch, x, tgt, len(a))
            total += grad.reshape(len(a), *emb.shape).sum(0)
        scores = ((emb - base) * total / self.steps).sum(-1)
        with torch.no_grad():
            full = self._values(batch, emb, tgt, 1)
            empty = self._values(batch, base, tgt, 1)
        mask = batch.attention_mask.to(scores.device).bool()
        gap = (scores * mask).sum(-1) - (full - empty)
        return scores, {"metric": full, "baseline_metric": empty, "completeness_error": gap}

    @torch.no_grad()
    def _occlusion(self, batch, emb, base, tgt):
        """Copy ``j`` of the batch occludes every prompt's ``j``-th token (left padding puts it at
        ``pad + j``), so ``max length`` copies cover every token; copies run ``batch_size`` rows a pass."""
        B, T, _ = emb.shape
        full = self._values(batch, emb, tgt, 1)
        scores = torch.zeros(B, T, dtype=torch.float32, device=emb.device)
        lengths = batch.attention_mask.sum(1).tolist()
        pads = [T - n for n in lengths]
        per = max(1, self.batch_size // B)
        for k in range(0, max(lengths), per):
            js = range(k, min(max(lengths), k + per))
            x = emb.repeat(len(js), 1, 1)
            cells = [(c, b, pads[b] + j) for c, j in enumerate(js) for b in range(B) if j < lengths[b]]
            for c, b, t in cells:
                x[c * B + b, t] = base[b, t]
            values = self._values(batch, x, tgt, len(js)).reshape(len(js), B)
            for c, b, t in cells:
                scores[b, t] = full[b] - values[c, b]
        return scores, {"metric": full}


def token_figure(scores: pd.DataFrame, size: str = "two-column") -> go.Figure:
    """Token attribution over the text: a row per prompt (in the table's order), a cell per token
    with the token written in it, coloured by ``score`` on a red-blue scale centred at 0 (the same
    range for every row: the largest absolute score), with a colour bar."""
    if scores.empty:
        raise TokenAttributionError("the attribution table is empty")
    prompts = list(dict.fromkeys(scores.prompt))
    width = int(scores.position.max()) + 1
    z = np.full((len(prompts), width), np.nan)
    text = np.full((len(prompts), width), "", dtype=object)
    for i, p in enumerate(prompts):
        g = scores[scores.prompt == p]
        z[i, g.position.to_numpy(int)] = g.score.to_numpy(float)
        text[i, g.position.to_numpy(int)] = g.token.to_numpy()
    bound = float(np.nanmax(np.abs(z))) or 1.0
    method = scores.method.iloc[0] if "method" in scores else "score"
    fig = go.Figure(
        go.Heatmap(
            z=z,
            text=text,
            texttemplate="%{text}",
            x=list(range(width)),
            y=[p if len(p) <= 40 else p[:37] + "..." for p in prompts],
            zmid=0,
            zmin=-bound,
            zmax=bound,
            colorscale="RdBu",
            colorbar={"title": "attribution"},
            hovertemplate="%{y}<br>position %{x}: %{text}<br>score %{z:.4f}<extra></extra>",
        )
    )
    fig.update_yaxes(autorange="reversed")
    fig.update_layout(title=f"Token attribution ({method.replace('_', ' ')})", xaxis_title="position")
    return style(fig, size)


def _repeat(batch, n: int):
    """``batch`` stacked ``n`` times along the batch axis (the same prompts, same padding)."""
    if n == 1:
        return batch
    return type(batch)(
        **{f: (v.repeat(n, *([1] * (v.dim() - 1))) if isinstance(v, Tensor) else v) for f, v in vars(batch).items()}
    )


__all__ = ["TokenAttribution", "TokenAttributionError", "METHODS", "token_figure"]
