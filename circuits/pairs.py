"""Clean / corrupted prompt pairs: the data every patching method runs on.

Patching compares two runs that differ in one detail ("The Eiffel Tower is in" vs "The
Colosseum is in"): the *clean* run produces the behaviour under study, the *corrupted* run does
not. Activations are swapped between the two runs position by position, so each pair's clean
and corrupted prompts must have the same number of tokens; a pair that does not raises
:class:`PairLengthError` naming the pair and both tokenizations (write the corrupted prompt so it
tokenizes to the same length, e.g. a subject of the same token count).

Different pairs may have different lengths: pairs are right-padded, and metrics read each
pair's last real token (``Pairs.last``). Per-position results use absolute positions, so
positions past a short pair's end patch padding and leave that pair unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch
from jaxtyping import Int

from interp.prompts import as_prompts
from interp.tokens import Batch, pad

Tensor = torch.Tensor


class PairLengthError(ValueError):
    """A clean prompt and its corrupted counterpart tokenize to different lengths."""


@dataclass(frozen=True)
class Pairs:
    """``N`` aligned clean/corrupted inputs, with optional answer and wrong-answer token ids."""

    clean: Batch
    corrupted: Batch
    answer: Int[Tensor, " n"] | None = None  # the clean run's answer token
    wrong: Int[Tensor, " n"] | None = None  # the corrupted run's answer token (logit difference)
    last: Int[Tensor, " n"] | None = None  # index of each pair's last real token
    #: the clean run's logits at ``last`` (filled in by the analyzers for :func:`kl_to_clean`)
    clean_logits: Tensor | None = None

    def __post_init__(self):
        if self.last is None:
            object.__setattr__(self, "last", self.clean.attention_mask.sum(-1) - 1)

    def __len__(self) -> int:
        return int(self.clean.input_ids.shape[0])

    @property
    def n_pos(self) -> int:
        return int(self.clean.input_ids.shape[1])

    def __getitem__(self, index: slice) -> Pairs:
        def cut(b: Batch) -> Batch:
            return Batch(b.input_ids[index], b.attention_mask[index], b.position_ids[index], b.shift[index])

        opt = lambda t: None if t is None else t[index]  # noqa: E731
        return Pairs(
            cut(self.clean),
            cut(self.corrupted),
            opt(self.answer),
            opt(self.wrong),
            self.last[index],
            opt(self.clean_logits),
        )

    def batches(self, size: int):
        for i in range(0, len(self), size):
            yield self[i : i + size]

    def tile(self, k: int) -> Pairs:
        """The pairs repeated ``k`` times (rows ordered copy-major: ``[copy, pair]``)."""

        def rep(t):
            return None if t is None else t.repeat(k, *([1] * (t.dim() - 1)))

        def rep_batch(b: Batch) -> Batch:
            return Batch(rep(b.input_ids), rep(b.attention_mask), rep(b.position_ids), rep(b.shift))

        return Pairs(
            rep_batch(self.clean),
            rep_batch(self.corrupted),
            rep(self.answer),
            rep(self.wrong),
            rep(self.last),
            rep(self.clean_logits),
        )

    def swapped(self) -> Pairs:
        """Clean and corrupted exchanged (answer and wrong too)."""
        return replace(
            self, clean=self.corrupted, corrupted=self.clean, answer=self.wrong, wrong=self.answer, clean_logits=None
        )


def _token_ids(model, answers, n: int, what: str) -> Tensor | None:
    if answers is None:
        return None
    if isinstance(answers, Tensor):
        ids = answers.long().reshape(-1)
    else:
        answers = list(answers)
        ids = []
        for a in answers:
            if isinstance(a, int):
                ids.append(a)
                continue
            toks = model.tokenizer(" " + str(a).lstrip(), add_special_tokens=False)["input_ids"]
            if not toks:
                raise ValueError(f"{what} {a!r} tokenizes to nothing")
            ids.append(toks[0])
        ids = torch.tensor(ids, dtype=torch.long)
    if len(ids) != n:
        raise ValueError(f"{what}: got {len(ids)} for {n} pairs; give one per pair")
    return ids


def _as_batch(model, prompts, what: str) -> tuple[Batch, list[list[int]]]:
    """Any input kind :func:`interp.prompts.as_prompts` takes (text or token ids), right-padded."""
    enc = model.encode(prompts)
    return pad(enc, model.pad_token_id, "right"), [e.ids for e in enc]


def make_pairs(
    model,
    clean: Sequence[str] | Int[Tensor, "n pos"],
    corrupted: Sequence[str] | Int[Tensor, "n pos"],
    answer: Sequence[str | int] | Tensor | None = None,
    wrong: Sequence[str | int] | Tensor | None = None,
) -> Pairs:
    """Tokenize and align clean/corrupted prompts (strings or ``[n, pos]`` token ids).

    ``answer``/``wrong``: per pair, a word (its first token after a space) or a token id; the
    built-in metrics read them (logit difference = answer minus wrong at the last token).
    """
    if isinstance(clean, str) or isinstance(corrupted, str):
        raise TypeError("clean and corrupted must be sequences of prompts (wrap a single prompt in a list)")
    clean, corrupted = as_prompts(clean), as_prompts(corrupted)  # any input kind, validated in one place
    n_clean, n_corr = len(clean), len(corrupted)
    if n_clean != n_corr:
        raise ValueError(
            f"got {n_clean} clean prompts but {n_corr} corrupted ones; "
            "patching needs one corrupted prompt per clean prompt"
        )
    if n_clean == 0:
        raise ValueError("no prompt pairs given")
    cb, cids = _as_batch(model, clean, "clean")
    xb, xids = _as_batch(model, corrupted, "corrupted")
    for i, (a, b) in enumerate(zip(cids, xids)):
        if len(a) != len(b):
            show = lambda ids: model.tokenizer.convert_ids_to_tokens(ids)  # noqa: E731
            raise PairLengthError(
                f"pair {i}: the clean prompt has {len(a)} tokens {show(a)} but the corrupted one has {len(b)} "
                f"{show(b)}. Patching swaps activations position by position, so both must tokenize to the "
                "same length: choose a corrupted prompt (e.g. another subject) with the same token count."
            )
    return Pairs(cb, xb, _token_ids(model, answer, n_clean, "answer"), _token_ids(model, wrong, n_clean, "wrong"))
