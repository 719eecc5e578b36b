"""Tokenizing prompts, locating token positions from character spans, and padding batches.

Positions are resolved on each prompt *before* padding, from the tokenizer's character offsets,
then shifted by the padding: a prompt captured alone and inside a left- or right-padded batch
reads the same tokens. Position ids are derived from the attention mask, so left padding does
not shift learned or rotary position embeddings.

Position specs (``positions=``):

- ``"last"``: the last token of the prompt (including any special token the tokenizer appends);
- ``"subject_last"`` / ``"subject_first"``: the last / first token overlapping the subject string;
- ``"all"``: every token (results are padded to the longest prompt, with a mask);
- an ``int`` (negative counts from the end) or a list of ints: those token indices.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from .prompts import Prompt

PositionSpec = str | int | Sequence[int]
NAMED_POSITIONS = ("last", "subject_last", "subject_first", "all")


class PositionError(ValueError):
    pass


class SubjectNotFoundError(ValueError):
    pass


@dataclass(frozen=True)
class Encoded:
    """One tokenized prompt: token ids and each token's character span in the text."""

    ids: list[int]
    offsets: list[tuple[int, int]]

    def __len__(self) -> int:
        return len(self.ids)


def encode(tokenizer, prompts: Sequence[Prompt]) -> list[Encoded]:
    """Token ids and character offsets of every prompt; prompts given as token ids are taken as
    they are (no tokenizer needed for them)."""
    texts = [p.text for p in prompts if p.ids is None]
    done = iter([])
    if texts:
        if tokenizer is None:
            raise TypeError(
                "text prompts need the model's tokenizer, and this model has none: pass token ids "
                "(a [n, pos] tensor), or load the model with tokenizer=..."
            )
        if not getattr(tokenizer, "is_fast", False):
            raise TypeError(
                "the tokenizer must be a fast (Rust) HuggingFace tokenizer, which reports character "
                "offsets; load it with AutoTokenizer.from_pretrained(path, use_fast=True)"
            )
        out = tokenizer(texts, return_offsets_mapping=True, add_special_tokens=True)
        done = iter(
            [Encoded(list(ids), [tuple(o) for o in offs]) for ids, offs in zip(out["input_ids"], out["offset_mapping"])]
        )
    return [Encoded(list(p.ids), []) if p.ids is not None else next(done) for p in prompts]


def subject_tokens(enc: Encoded, prompt: Prompt, index: int) -> list[int]:
    """Indices of the tokens that overlap the (first occurrence of the) subject string."""
    if prompt.ids is not None:
        raise PositionError(
            f"prompt {index} is given as token ids, which have no text to find a subject in; use positions "
            "'last', 'all' or integers, or pass Prompt(text, subject=...)"
        )
    if prompt.subject is None:
        raise PositionError(
            f"prompt {index} ({prompt.text!r}) has no subject, but a subject position was asked for; "
            "pass Prompt(text, subject=...) or use positions='last'"
        )
    start = prompt.text.find(prompt.subject)
    if start < 0:
        raise SubjectNotFoundError(
            f"subject {prompt.subject!r} not found in prompt {index}: {prompt.text!r}. The subject "
            "must occur verbatim (same case and spacing) in the prompt text."
        )
    end = start + len(prompt.subject)
    toks = [i for i, (a, b) in enumerate(enc.offsets) if b > a and a < end and b > start]
    if not toks:
        raise SubjectNotFoundError(f"subject {prompt.subject!r} in prompt {index} covers no token")
    return toks


def resolve_positions(enc: Encoded, prompt: Prompt, spec: PositionSpec, index: int) -> list[int]:
    """Token indices (within the unpadded prompt) that ``spec`` selects."""
    n = len(enc)
    if isinstance(spec, str):
        if spec == "last":
            return [n - 1]
        if spec == "all":
            return list(range(n))
        if spec == "subject_last":
            return [subject_tokens(enc, prompt, index)[-1]]
        if spec == "subject_first":
            return [subject_tokens(enc, prompt, index)[0]]
        raise PositionError(
            f"unknown position {spec!r}; use one of {', '.join(NAMED_POSITIONS)}, an int or a list of ints"
        )
    wanted = [spec] if isinstance(spec, int) else list(spec)
    if not wanted:
        raise PositionError("empty list of positions")
    out = []
    for p in wanted:
        q = p + n if p < 0 else p
        if not 0 <= q < n:
            raise PositionError(
                f"position {p} is outside prompt {index} ({prompt.label}), which has {n} tokens "
                f"(valid: {-n} to {n - 1})"
            )
        out.append(q)
    return out


@dataclass
class Batch:
    input_ids: torch.Tensor  # [batch, pos]
    attention_mask: torch.Tensor  # [batch, pos]
    position_ids: torch.Tensor  # [batch, pos]
    shift: torch.Tensor  # [batch]: padded index = token index + shift

    def to(self, device) -> Batch:
        """The batch on ``device`` (``shift`` stays where it is)."""
        ids, mask, pos = (t.to(device) for t in (self.input_ids, self.attention_mask, self.position_ids))
        return Batch(ids, mask, pos, self.shift)


def pad(encoded: Sequence[Encoded], pad_id: int, side: str = "right") -> Batch:
    if side not in ("left", "right"):
        raise ValueError(f"padding_side must be 'left' or 'right', got {side!r}")
    width = max(len(e) for e in encoded)
    ids = torch.full((len(encoded), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(encoded), width), dtype=torch.long)
    shift = torch.zeros(len(encoded), dtype=torch.long)
    for row, e in enumerate(encoded):
        s = width - len(e) if side == "left" else 0
        ids[row, s : s + len(e)] = torch.tensor(e.ids)
        mask[row, s : s + len(e)] = 1
        shift[row] = s
    position_ids = (mask.cumsum(-1) - 1).clamp(min=0)
    return Batch(ids, mask, position_ids, shift)
