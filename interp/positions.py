"""Finding a position inside any batch a forward pass sees.

:mod:`interp.tokens` resolves positions on prompts *before* they are batched. An intervention
that stands on a model (:meth:`interp.models.Model.intervened`) meets batches it did not build:
padded, reordered, extended with candidate answers by scoring. It must find its position from
the tokens alone. :class:`SubjectEnd` does that for the subject's last token of prompts that put
the subject before fixed template words (``"{} is associated with the word"``): it is the token
just before the template's own tokens.

>>> locate = SubjectEnd(model.tokenizer, prompts)     # checked on every prompt
>>> locate(batch)                                      # [batch] positions, padding included
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .prompts import Prompt
from .tokens import Batch, encode, resolve_positions


class SubjectEnd:
    """The subject's last token in prompts that put the subject before fixed template words,
    found in any batch by its content: the token before the template's own tokens. Works for
    padded, reordered or candidate-extended batches alike (a forward pass never says which prompt
    a row came from). The template's tokens are read off ``prompts[0]`` as the tokenizer splits it
    in context (so SentencePiece word-start pieces are right), and every prompt is checked against
    the tokenizer's character offsets."""

    def __init__(self, tokenizer, prompts: Sequence[Prompt]):
        if not prompts:
            raise ValueError("SubjectEnd needs the prompts it will locate subjects in")
        first = prompts[0]
        enc = tokenizer(first.text, return_offsets_mapping=True)
        end = first.text.index(first.subject) + len(first.subject)
        self.suffix = [t for t, (a, b) in zip(enc["input_ids"], enc["offset_mapping"]) if a >= end and b > a]
        if not self.suffix:
            raise ValueError(
                f"{first.text!r} has no words after the subject {first.subject!r}; the subject's end cannot be found"
            )
        for i, p in enumerate(prompts):
            ids = tokenizer(p.text)["input_ids"]
            want = resolve_positions(encode(tokenizer, [p])[0], p, "subject_last", i)[0]
            try:
                got = self.position(ids)
            except ValueError:
                got = None
            if got != want:
                raise ValueError(
                    f"in {p.text!r} the subject's last token is not followed by the template's tokens "
                    f"{self.suffix} (the tokenizer merges across the boundary, or the template differs)"
                )

    def position(self, ids: Sequence[int]) -> int:
        n, m = len(ids), len(self.suffix)
        for i in range(n - m, 0, -1):
            if list(ids[i : i + m]) == self.suffix:
                return i - 1
        raise ValueError(f"the template's tokens {self.suffix} do not occur in a prompt of this batch: {list(ids)}")

    def __call__(self, batch: Batch) -> torch.Tensor:
        """Position of the subject's last token in every row of ``batch`` (padding included)."""
        ids, mask = batch.input_ids.tolist(), batch.attention_mask.tolist()
        return torch.tensor(
            [self.position([t for t, m in zip(row, mrow) if m]) + _lead(mrow) for row, mrow in zip(ids, mask)]
        )

    def prefix(self, row: Sequence[int], mask: Sequence[int]) -> tuple[int, ...]:
        """The row's tokens up to and including the subject's last token: a key for the prompt."""
        toks = [t for t, m in zip(row, mask) if m]
        return tuple(toks[: self.position(toks) + 1])


def _lead(mask_row: Sequence[int]) -> int:
    """Left padding before the first real token."""
    for i, m in enumerate(mask_row):
        if m:
            return i
    return 0
