"""Finding a position inside any batch a forward pass sees.

:mod:`interp.tokens` resolves positions on prompts *before* they are batched. An intervention
that stands on a model (:meth:`interp.models.Model.intervened`) meets batches it did not build:
padded, reordered, extended with candidate answers by scoring. It must find its position from
the tokens alone. :class:`SubjectEnd` does that for the subject's last token of prompts that put
the subject before fixed template words (``"{} is associated with the word"``): it is the token
just before the template's own tokens.

>>> locate = SubjectEnd(model.tokenizer, prompts)     # checked on every prompt
>>> locate(batch)                                      # [batch] positions, padding included

:class:`SubjectTokens` finds *every* token of the subject the same way: the subject's last token
as above, and as many tokens before it as the subject has in the prompt the row came from
(recognized by its tokens up to the subject's end).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .prompts import Prompt
from .tokens import Batch, encode, resolve_positions, subject_tokens


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


class SubjectTokens:
    """Every token of the subject in any batch of the given prompts (padded, reordered, extended
    with candidate answers): ``locate(batch)`` returns ``(rows, positions, offsets)``, one entry per
    subject token, where ``offsets`` counts back from the subject's last token (0 = last). A row is
    recognized by its tokens up to the subject's end (:meth:`SubjectEnd.prefix`), so the locator
    knows only the prompts it was built for, and says so for any other."""

    def __init__(self, tokenizer, prompts: Sequence[Prompt]):
        self.end = SubjectEnd(tokenizer, prompts)
        self.lengths: dict[tuple[int, ...], int] = {}
        for i, (p, enc) in enumerate(zip(prompts, encode(tokenizer, prompts))):
            toks = subject_tokens(enc, p, i)
            ids = tokenizer(p.text)["input_ids"]
            key = tuple(ids[: self.end.position(ids) + 1])
            if self.lengths.setdefault(key, len(toks)) != len(toks):
                raise ValueError(f"{p.text!r} begins like another prompt but its subject has other tokens")

    def __call__(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        rows, positions, offsets = [], [], []
        for r, (row, mrow) in enumerate(zip(batch.input_ids.tolist(), batch.attention_mask.tolist())):
            toks = [t for t, m in zip(row, mrow) if m]
            end = self.end.position(toks)
            n = self.lengths.get(tuple(toks[: end + 1]))
            if n is None:
                raise ValueError(
                    f"a row of this batch ({toks}) is not one of the prompts this SubjectTokens was built "
                    "for; build it with every prompt it will meet"
                )
            lead = _lead(mrow)
            for k in range(n):
                rows.append(r)
                positions.append(lead + end - k)
                offsets.append(k)
        return torch.tensor(rows), torch.tensor(positions), torch.tensor(offsets)


def _lead(mask_row: Sequence[int]) -> int:
    """Left padding before the first real token."""
    for i, m in enumerate(mask_row):
        if m:
            return i
    return 0
