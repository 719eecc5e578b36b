"""Patching metrics: what a patched run is scored by.

A metric maps the logits of a batch of pairs ``[n, pos, vocab]`` to one number per pair
(``[n]``) or one number for the batch (a scalar); per-pair values are averaged over all pairs.
Built-ins read the pair's last real token:

- :func:`logit_diff`: ``logit[answer] - logit[wrong]`` (Wang et al. 2022);
- :func:`answer_prob`: ``p(answer)``;
- :func:`kl_to_clean`: ``KL(p_clean || p_patched)`` at the last token, 0 on the clean run;
- :func:`answer_logprob`: ``sum_j log p(answer_j | prompt, answer_<j)``, the answer's tokens
  teacher-forced (:func:`circuits.make_pairs` appends a multi-token answer to both prompts).

``logit_diff`` and ``answer_prob`` read one token: given a pair whose answer is several tokens
they raise :class:`MetricError` before any work (reading only the first token would score "New
York" and "New Delhi" alike).

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

    def check(self, pairs: Pairs) -> None:
        """Raise before any work if this metric cannot score ``pairs`` (the analyzers call it)."""

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


def _one_token(pairs: Pairs, metric: str, fields: tuple[str, ...]) -> None:
    for field in fields:
        for i, toks in enumerate(getattr(pairs, f"{field}_tokens") or ()):
            if len(toks) > 1:
                raise MetricError(
                    f"the {metric} metric reads one token, but pair {i}'s {field} is {len(toks)} tokens {list(toks)}; "
                    'reading its first token would score answers that share it ("New York", "New Delhi") '
                    "alike. Use metric='answer_logprob' (the teacher-forced sum of the answer's token "
                    "log-probabilities), or answers of one token each."
                )


class LogitDiff(Metric):
    name = "logit_diff"

    def check(self, pairs):
        _one_token(pairs, self.name, ("answer", "wrong"))

    def __call__(self, logits, pairs):
        last = _at_last(logits, pairs).float()
        a = _need(pairs, "answer", self.name).to(last.device)
        w = _need(pairs, "wrong", self.name).to(last.device)
        rows = torch.arange(len(a), device=last.device)
        return last[rows, a] - last[rows, w]


class AnswerProb(Metric):
    name = "answer_prob"

    def check(self, pairs):
        _one_token(pairs, self.name, ("answer",))

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


class AnswerLogprob(Metric):
    """The answer's log-probability, teacher-forced: the sum over its tokens of ``log p(token_j)``
    at position ``last + j`` (a one-token answer: ``log p(answer)`` at ``last``)."""

    name = "answer_logprob"

    def check(self, pairs):
        _need(pairs, "answer", self.name)
        ids = pairs.clean.input_ids
        for i, toks in enumerate(self._tokens(pairs)):
            start = int(pairs.last[i]) + 1
            forced = ids[i, start : start + len(toks) - 1].tolist()
            if forced != list(toks[:-1]):
                raise MetricError(
                    f"answer_logprob: pair {i}'s answer tokens {list(toks)} do not follow its prompt (found "
                    f"{forced} after it); build the pairs with make_pairs(..., answer=...), which appends them"
                )

    @staticmethod
    def _tokens(pairs: Pairs) -> tuple[tuple[int, ...], ...]:
        if pairs.answer_tokens is not None:
            return pairs.answer_tokens
        return tuple((int(a),) for a in pairs.answer)

    def __call__(self, logits, pairs):
        toks = self._tokens(pairs)
        width = max(len(t) for t in toks)
        n = len(toks)
        ids = torch.zeros(n, width, dtype=torch.long)
        keep = torch.zeros(n, width, dtype=torch.bool)
        for i, t in enumerate(toks):
            ids[i, : len(t)] = torch.tensor(t)
            keep[i, : len(t)] = True
        pos = pairs.last.reshape(-1, 1) + torch.arange(width).reshape(1, -1)
        pos = pos.clamp(max=logits.shape[1] - 1).to(logits.device)
        rows = torch.arange(n, device=logits.device).reshape(-1, 1)
        logp = torch.log_softmax(logits[rows, pos].float(), -1)  # [n, width, vocab]
        picked = logp.gather(-1, ids.to(logits.device).unsqueeze(-1)).squeeze(-1)
        return (picked * keep.to(logits.device)).sum(-1)


class FunctionMetric(Metric):
    """A user's function as a metric. Pairs with a multi-token answer are refused unless
    ``multi_token=True`` says the function reads ``pairs.answer_tokens`` (``pairs.answer`` holds
    only each answer's first token)."""

    def __init__(self, fn: Callable, name: str | None = None, multi_token: bool = False):
        self.fn = fn
        self.name = name or getattr(fn, "__name__", "metric")
        self.multi_token = multi_token
        try:
            params = [
                p
                for p in inspect.signature(fn).parameters.values()
                if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
            ]
            self._with_pairs = len(params) >= 2
        except (TypeError, ValueError):
            self._with_pairs = False

    def check(self, pairs):
        if pairs.multi_token and not self.multi_token:
            raise MetricError(
                f"metric {self.name!r}: these pairs have multi-token answers, and pairs.answer holds only their "
                "first tokens; read pairs.answer_tokens and wrap the function as as_metric(fn, multi_token=True), "
                "or use metric='answer_logprob'"
            )

    def __call__(self, logits, pairs):
        return self.fn(logits, pairs) if self._with_pairs else self.fn(logits)


def logit_diff() -> Metric:
    return LogitDiff()


def answer_prob() -> Metric:
    return AnswerProb()


def kl_to_clean() -> Metric:
    return KLToClean()


def answer_logprob() -> Metric:
    return AnswerLogprob()


BUILTIN = {
    "logit_diff": LogitDiff,
    "answer_prob": AnswerProb,
    "kl_to_clean": KLToClean,
    "answer_logprob": AnswerLogprob,
}


def as_metric(metric, multi_token: bool = False) -> Metric:
    """A :class:`Metric` from a built-in name, a Metric, or a function of ``logits`` (and ``pairs``;
    ``multi_token=True``: the function reads ``pairs.answer_tokens``, see :class:`FunctionMetric`)."""
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
        return FunctionMetric(metric, multi_token=multi_token)
    raise TypeError(
        f"a metric must be a name {sorted(BUILTIN)}, a Metric or a function of logits; got {type(metric).__name__}"
    )
