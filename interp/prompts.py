"""Prompts as the toolkit takes them: text, optionally with the subject span it mentions."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Optional


@dataclass(frozen=True)
class Prompt:
    """A prompt and, optionally, the subject string it contains (located by characters, not guessed).

    >>> Prompt("Paris is in the country of", subject="Paris")
    Prompt(text='Paris is in the country of', subject='Paris')
    """

    text: str
    subject: Optional[str] = None


def as_prompts(inputs: Any) -> list[Prompt]:
    """Normalize strings, ``Prompt``s, ``(text, subject)`` pairs, dicts or a DataFrame with a
    ``prompt`` (or ``text``) column and an optional ``subject`` column into a list of ``Prompt``."""
    if isinstance(inputs, (str, Prompt)):
        inputs = [inputs]
    if hasattr(inputs, "to_dict") and hasattr(inputs, "columns"):  # a pandas DataFrame
        inputs = inputs.to_dict(orient="records")
    if not isinstance(inputs, Iterable):
        raise TypeError(f"prompts must be strings, Prompt objects, pairs or a DataFrame; got {type(inputs).__name__}")
    prompts = [_one(item, i) for i, item in enumerate(inputs)]
    if not prompts:
        raise ValueError("empty input: pass at least one prompt (a string, a Prompt, or a DataFrame row)")
    return prompts


def _one(item: Any, index: int) -> Prompt:
    if isinstance(item, Prompt):
        prompt = item
    elif isinstance(item, str):
        prompt = Prompt(item)
    elif isinstance(item, dict):
        text = item.get("prompt", item.get("text"))
        if text is None:
            raise ValueError(f"prompt {index}: a dict/DataFrame row needs a 'prompt' or 'text' key, got keys {sorted(item)}")
        prompt = Prompt(text, item.get("subject"))
    elif isinstance(item, (tuple, list)) and len(item) == 2:
        prompt = Prompt(*item)
    else:
        raise TypeError(f"prompt {index}: cannot read {item!r} as a prompt; pass a string, Prompt(text, subject) or (text, subject)")
    if not isinstance(prompt.text, str) or not prompt.text:
        raise ValueError(f"prompt {index} is empty; every prompt needs at least one token of text")
    return prompt
