"""Patching metrics: what a patched run is scored by.

A metric maps the logits of a batch of pairs ``[n, pos, vocab]`` to one number per pair
(``[n]``) or one number for the batch (a scalar); per-pair values are averaged over all pairs.
Built-ins read the pair's last real token:

- :func:`logit_diff`: ``logit[answer] - logit[wrong]`` (Wang et al. 2022);
- :func:`answer_prob`: ``p(answer)``;
- :func:`kl_to_clean`: ``KL(p_clean || p_patched)`` at the last token, 0 on the clean run.

Any function ``fn(logits)`` or ``fn(logits, pairs)`` is a metric too (wrap it with
:func:`as_metric` to have its output checked); it must be differentiable for attribution
patching.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

import torch
from jaxtyping import Float

from .pairs import Pairs

Tensor = torch.Tensor


class MetricError(ValueError):
    """A metric that did not return a scalar or one value per pair."""


class Metric:
    """A metric ``(logits, pairs) -> [n]`` or scalar. Subclass or wrap a function with :func:`as_metric`."""

    name = "metric"
    #: set on metrics that compare to the clean run's logits (filled in by the analyzers)
    needs_clean_logits = False

    def __call__(self, logits: Float[Tensor, "n pos vocab"], pairs: Pairs) -> Tensor:
        raise NotImplementedError

    def reduce(self, logits: Tensor, pairs: Pairs) -> Tensor:
        """Per-pair values ``[n]`` (a scalar metric is broadcast), validated."""
        out = self(logits, pairs)
        if not isinstance(out, Tensor):
            try:
                out = torch.as_tensor(out, dtype=logits.dtype)
            except Exception as exc:
                raise MetricError(
                    f"metric {self.name!r} returned {type(out).__name__}; it must return a tensor"
                ) from exc
        n = len(pairs)
        if out.dim() == 0:
            return out.expand(n)
        if out.dim() == 1 and out.shape[0] == n:
            return out
        raise MetricError(
            f"metric {self.name!r} returned shape {tuple(out.shape)} for {n} pairs; it must return a scalar or one "
            f"value per pair (shape [{n}]), e.g. reduce over positions and the vocabulary"
        )


def _at_last(logits: Tensor, pairs: Pairs) -> Float[Tensor, "n vocab"]:
    idx = pairs.last.to(logits.device)
    return logits[torch.arange(len(idx), device=logits.device), idx]


def _need(pairs: Pairs, field: str, metric: str) -> Tensor:
    value = getattr(pairs, field)
    if value is None:
        raise ValueError(f"the {metric} metric needs {field} tokens: make_pairs(..., {field}=[...])")
    return value


class LogitDiff(Metric):
    name = "logit_diff"

    def __call__(self, logits, pairs):
        last = _at_last(logits, pairs).float()
        a = _need(pairs, "answer", self.name).to(last.device)
        w = _need(pairs, "wrong", self.name).to(last.device)
        rows = torch.arange(len(a), device=last.device)
        return last[rows, a] - last[rows, w]


class AnswerProb(Metric):
    name = "answer_prob"

    def __call__(self, logits, pairs):
        p = torch.softmax(_at_last(logits, pairs).float(), -1)
        a = _need(pairs, "answer", self.name).to(p.device)
        return p[torch.arange(len(a), device=p.device), a]


class KLToClean(Metric):
    name = "kl_to_clean"
    needs_clean_logits = True

    def __call__(self, logits, pairs):
        ref = pairs.clean_logits
        if ref is None:
            raise ValueError(
                "kl_to_clean needs the clean run's last-token logits in pairs.clean_logits; "
                "analyzers fill them in, or use circuits.with_clean_logits(model, pairs)"
            )
        logp = torch.log_softmax(_at_last(logits, pairs).float(), -1)
        ref_logp = torch.log_softmax(ref.to(logp.device).float(), -1)
        return (ref_logp.exp() * (ref_logp - logp)).sum(-1)


class FunctionMetric(Metric):
    def __init__(self, fn: Callable, name: str | None = None):
        self.fn = fn
        self.name = name or getattr(fn, "__name__", "metric")
        try:
            params = [
                p
                for p in inspect.signature(fn).parameters.values()
                if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
            ]
            self._with_pairs = len(params) >= 2
        except (TypeError, ValueError):
            self._with_pairs = False

    def __call__(self, logits, pairs):
        return self.fn(logits, pairs) if self._with_pairs else self.fn(logits)


def logit_diff() -> Metric:
    return LogitDiff()


def answer_prob() -> Metric:
    return AnswerProb()


def kl_to_clean() -> Metric:
    return KLToClean()


BUILTIN = {"logit_diff": LogitDiff, "answer_prob": AnswerProb, "kl_to_clean": KLToClean}


def as_metric(metric) -> Metric:
    """A :class:`Metric` from a built-in name, a Metric, or a function of ``logits`` (and ``pairs``)."""
    if isinstance(metric, Metric):
        return metric
    if isinstance(metric, str):
        if metric not in BUILTIN:
            import difflib

            near = difflib.get_close_matches(metric, list(BUILTIN), n=3, cutoff=0.3)
            raise ValueError(
                f"unknown metric {metric!r}; built-ins are {sorted(BUILTIN)}"
                + (f" (did you mean {near[0]!r}?)" if near else "")
            )
        return BUILTIN[metric]()
    if callable(metric):
        return FunctionMetric(metric)
    raise TypeError(
        f"a metric must be a name {sorted(BUILTIN)}, a Metric or a function of logits; got {type(metric).__name__}"
    )
