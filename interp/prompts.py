"""Prompts as the toolkit takes them, validated in one place (:func:`as_prompts`) for every entry
point (capture, ``Model.run``/``read``/``forward``, patching pairs, Jacobians, probe sweeps):

- text: a string, ``Prompt(text, subject=...)``, a ``(text, subject)`` pair, a dict or a
  DataFrame with a ``prompt``/``text`` column (and optionally ``subject``);
- token ids: a ``[n, pos]`` (or ``[pos]``) integer tensor, a list of lists of ints, or a
  tokenizer's output (a dict/``BatchEncoding`` with ``input_ids`` and ``attention_mask``, left- or
  right-padded: the mask says which tokens are real). Token ids need no tokenizer; having no text,
  they support the positions ``"last"``, ``"all"`` and integers, not subject positions.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class Prompt:
    """A prompt and, optionally, the subject string it contains (located by characters, not guessed);
    or, with ``ids``, a prompt given as token ids (``text`` is then None).

    >>> Prompt("Paris is in the country of", subject="Paris")
    Prompt(text='Paris is in the country of', subject='Paris', ids=None)
    """

    text: str | None
    subject: str | None = None
    ids: tuple[int, ...] | None = None

    @property
    def label(self) -> str:
        """How error messages show this prompt."""
        return repr(self.text) if self.ids is None else f"token ids {list(self.ids)}"


def as_prompts(inputs: Any) -> list[Prompt]:
    """Normalize any input kind of the module docstring into a list of ``Prompt``."""
    if isinstance(inputs, (str, Prompt)):
        inputs = [inputs]
    token_rows = _token_rows(inputs)
    if token_rows is not None:
        if not token_rows:
            raise ValueError("empty input: no token ids given")
        for i, row in enumerate(token_rows):
            if not row:
                raise ValueError(f"prompt {i} has no tokens (its attention mask is all zeros)")
        return [Prompt(None, None, tuple(row)) for row in token_rows]
    if hasattr(inputs, "to_dict") and hasattr(inputs, "columns"):  # a pandas DataFrame
        inputs = inputs.to_dict(orient="records")
    if not isinstance(inputs, Iterable):
        raise TypeError(f"prompts must be strings, Prompt objects, pairs or a DataFrame; got {type(inputs).__name__}")
    prompts = [_one(item, i) for i, item in enumerate(inputs)]
    if not prompts:
        raise ValueError("empty input: pass at least one prompt (a string, a Prompt, or a DataFrame row)")
    return prompts


def _token_rows(inputs: Any) -> list[list[int]] | None:
    """Rows of real token ids if ``inputs`` is a token-id kind, else None."""
    mask = None
    if isinstance(inputs, Mapping) and "input_ids" in inputs:
        inputs, mask = inputs["input_ids"], inputs.get("attention_mask")
    elif not (
        isinstance(inputs, torch.Tensor)
        or (
            isinstance(inputs, (list, tuple))
            and inputs
            and isinstance(inputs[0], (list, tuple, torch.Tensor))
            and len(inputs[0]) > 0
            and _is_int(inputs[0][0])
        )
    ):
        return None
    if mask is None and isinstance(inputs, (list, tuple)) and not isinstance(inputs[0], torch.Tensor):
        rows = [list(r) for r in inputs]  # ragged lists of ids: one prompt each
        if not all(isinstance(x, int) for r in rows for x in r):
            raise TypeError("token ids must be integers")
        return rows
    ids = torch.as_tensor(inputs) if not isinstance(inputs, torch.Tensor) else inputs
    if ids.is_floating_point() or ids.is_complex() or ids.dtype == torch.bool:
        raise TypeError(f"token ids must be integers, got a {ids.dtype} tensor")
    if ids.dim() == 1:
        ids = ids[None]
    if ids.dim() != 2:
        raise ValueError(f"token ids must be [n, pos] (or [pos]), got shape {tuple(ids.shape)}")
    if mask is None:
        return ids.long().tolist()
    mask = torch.as_tensor(mask)
    if mask.shape != ids.shape:
        raise ValueError(f"attention_mask {tuple(mask.shape)} does not match input_ids {tuple(ids.shape)}")
    return [row[m.bool()].long().tolist() for row, m in zip(ids, mask.reshape(ids.shape))]


def _is_int(x) -> bool:
    return isinstance(x, int) or (isinstance(x, torch.Tensor) and x.dim() == 0 and not x.is_floating_point())


def _one(item: Any, index: int) -> Prompt:
    if isinstance(item, Prompt):
        prompt = item
        if prompt.ids is not None:
            return prompt
    elif isinstance(item, str):
        prompt = Prompt(item)
    elif isinstance(item, dict):
        text = item.get("prompt", item.get("text"))
        if text is None:
            raise ValueError(
                f"prompt {index}: a dict/DataFrame row needs a 'prompt' or 'text' key, got keys {sorted(item)}"
            )
        prompt = Prompt(text, item.get("subject"))
    elif isinstance(item, (tuple, list)) and len(item) == 2:
        prompt = Prompt(*item)
    else:
        raise TypeError(
            f"prompt {index}: cannot read {item!r} as a prompt; pass a string, Prompt(text, subject) or (text, subject)"
        )
    if not isinstance(prompt.text, str) or not prompt.text:
        raise ValueError(f"prompt {index} is empty; every prompt needs at least one token of text")
    return prompt
