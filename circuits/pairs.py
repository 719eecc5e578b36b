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

Answers are checked before any work, so that no patching number can be silently zero:

- an answer is tokenized whole (after a space, as it follows the prompt). A **multi-token answer**
  ("New York") is scored teacher-forced: its tokens but the last are appended to both prompts of
  the pair, and :func:`circuits.answer_logprob` sums the log-probabilities of all its tokens. The
  one-token metrics (``logit_diff``, ``answer_prob``) refuse such an answer rather than read its
  first token ("New" of both "New York" and "New Delhi");
- a word the tokenizer does not know (it maps to the unknown token, e.g. ``<unk>``) is refused,
  in a prompt or an answer, naming the word: every such word reads as the same token;
- an ``answer`` and ``wrong`` that tokenize identically are refused (their difference is 0).

Two helpers build length-matched pairs, checked token by token (the two prompts of a pair may
differ only inside the filler / subject): :func:`pairs_from_template` fills one template with
fillers (``"The {} is located in"``, ``["Eiffel Tower", "Colosseum", ...]``) and :func:`matched_pairs`
pairs any prompts that name their subject. Each clean prompt is paired with another of the same
token count and a different answer, whose answer becomes the ``wrong`` one.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch
from jaxtyping import Int

from interp.prompts import Prompt, as_prompts
from interp.tokens import Batch, Encoded, pad

Tensor = torch.Tensor


class PairLengthError(ValueError):
    """A clean prompt and its corrupted counterpart tokenize to different lengths."""


class UnknownTokenError(ValueError):
    """A word in a prompt or an answer maps to the tokenizer's unknown token."""


class AnswerError(ValueError):
    """An answer that cannot be scored: empty, or the same tokens as the wrong answer."""


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
    #: every answer's / wrong answer's tokens; an answer longer than one token is teacher-forced
    #: (its tokens but the last follow ``last`` in both prompts)
    answer_tokens: tuple[tuple[int, ...], ...] | None = None
    wrong_tokens: tuple[tuple[int, ...], ...] | None = None

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
            opt(self.answer_tokens),
            opt(self.wrong_tokens),
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

        rep_tokens = lambda t: None if t is None else t * k  # noqa: E731
        return Pairs(
            rep_batch(self.clean),
            rep_batch(self.corrupted),
            rep(self.answer),
            rep(self.wrong),
            rep(self.last),
            rep(self.clean_logits),
            rep_tokens(self.answer_tokens),
            rep_tokens(self.wrong_tokens),
        )

    def swapped(self) -> Pairs:
        """Clean and corrupted exchanged (answer and wrong too)."""
        return replace(
            self,
            clean=self.corrupted,
            corrupted=self.clean,
            answer=self.wrong,
            wrong=self.answer,
            answer_tokens=self.wrong_tokens,
            wrong_tokens=self.answer_tokens,
            clean_logits=None,
        )

    @property
    def multi_token(self) -> bool:
        """Whether any answer (or wrong answer) is longer than one token."""
        return any(len(t) > 1 for side in (self.answer_tokens, self.wrong_tokens) if side for t in side)


def _unknown_id(model) -> int | None:
    tok = model.tokenizer
    return None if tok is None else getattr(tok, "unk_token_id", None)


def _word_at(text: str, start: int, end: int) -> str:
    """The whitespace-delimited word around characters ``start:end`` of ``text``."""
    while start > 0 and not text[start - 1].isspace():
        start -= 1
    while end < len(text) and not text[end].isspace():
        end += 1
    return text[start:end].strip()


def _refuse_unknown(model, prompt: Prompt, enc: Encoded, where: str) -> None:
    unk = _unknown_id(model)
    if unk is None or prompt.text is None or unk not in enc.ids:
        return
    words = []
    for i, o in zip(enc.ids, enc.offsets):
        # a special token added by the tokenizer (no characters) or written out in the text
        # (GPT-2's unknown token is its <|endoftext|>) is not an unknown word
        if i == unk and o[1] > o[0] and prompt.text[o[0] : o[1]] != model.tokenizer.unk_token:
            w = _word_at(prompt.text, *o)
            if w and w not in words:
                words.append(w)
    if not words:
        return
    raise UnknownTokenError(
        f"{where} {prompt.text!r}: {', '.join(map(repr, words)) or 'a word'} "
        f"{'is' if len(words) == 1 else 'are'} not in the model's vocabulary and would be read as the unknown "
        f"token {model.tokenizer.unk_token!r}, the same token for every unknown word, so patching would compare "
        "nothing there. Use words the tokenizer knows (model.tokenizer.tokenize(text) shows how a text splits)."
    )


def _answer_tokens(model, answers, n: int, what: str) -> tuple[Tensor, tuple[tuple[int, ...], ...]] | None:
    """Per pair: the first token id and the whole tokenization of each answer (a word after a space,
    as it follows the prompt; or a token id)."""
    if answers is None:
        return None
    if isinstance(answers, Tensor):
        answers = answers.long().reshape(-1).tolist()
    answers = list(answers)
    if len(answers) != n:
        raise ValueError(f"{what}: got {len(answers)} for {n} pairs; give one per pair")
    unk = _unknown_id(model)
    whole = []
    for i, a in enumerate(answers):
        if isinstance(a, int):
            whole.append((a,))
            continue
        if not isinstance(a, str):
            raise TypeError(f"{what} {a!r} (pair {i}): give each answer as a word (str) or a token id (int)")
        if not a.strip():
            raise AnswerError(f"{what} of pair {i} is empty ({a!r}); give a word or a token id")
        toks = _answer_ids(model, a)
        if not toks:
            raise AnswerError(f"{what} {a!r} (pair {i}) tokenizes to nothing")
        if unk is not None and unk in toks:
            raise UnknownTokenError(
                f"{what} {a!r} (pair {i}) is not in the model's vocabulary: it tokenizes to "
                f"{model.tokenizer.convert_ids_to_tokens(list(toks))}, and the unknown token "
                f"{model.tokenizer.unk_token!r} stands for every unknown word. Use an answer the tokenizer knows."
            )
        whole.append(toks)
    return torch.tensor([t[0] for t in whole], dtype=torch.long), tuple(whole)


def _answer_ids(model, answer: str) -> tuple[int, ...]:
    """An answer's token ids as it follows a prompt (after a space)."""
    return tuple(model.tokenizer(" " + answer.lstrip(), add_special_tokens=False)["input_ids"])


def _as_encoded(model, prompts: list[Prompt], label: str) -> list[Encoded]:
    """The prompts tokenized, each word checked against the vocabulary (``label``: how an error
    names prompt ``{i}``)."""
    enc = model.encode(prompts)
    for i, (p, e) in enumerate(zip(prompts, enc)):
        _refuse_unknown(model, p, e, label.format(i=i))
    return enc


def make_pairs(
    model,
    clean: Sequence[str] | Int[Tensor, "n pos"],
    corrupted: Sequence[str] | Int[Tensor, "n pos"],
    answer: Sequence[str | int] | Tensor | None = None,
    wrong: Sequence[str | int] | Tensor | None = None,
) -> Pairs:
    """Tokenize and align clean/corrupted prompts (strings or ``[n, pos]`` token ids).

    ``answer``/``wrong``: per pair, a word or words (tokenized after a space) or a token id. The
    built-in metrics read them: ``logit_diff`` = logit of ``answer`` minus logit of ``wrong`` at
    the last token; ``answer_prob``; ``answer_logprob``, the teacher-forced sum of the answer's
    token log-probabilities, for answers of several tokens. A multi-token answer's tokens but its
    last are appended to both prompts of its pair (teacher forcing; ``Pairs.last`` stays the
    prompt's last token). A ``wrong`` of several tokens is kept in ``Pairs.wrong_tokens`` and
    refused by the one-token metrics.

    Refused before any work, with the offending word named: a word of a prompt or answer that
    maps to the unknown token, an answer that tokenizes to nothing, an ``answer`` and ``wrong``
    that tokenize identically, and a pair whose prompts have different token counts.
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
    cenc = _as_encoded(model, clean, "pair {i}'s clean prompt")
    xenc = _as_encoded(model, corrupted, "pair {i}'s corrupted prompt")
    ans = _answer_tokens(model, answer, n_clean, "answer")
    wrg = _answer_tokens(model, wrong, n_clean, "wrong")
    if ans is not None and wrg is not None:
        for i, (a, w) in enumerate(zip(ans[1], wrg[1])):
            if a == w:
                raise AnswerError(
                    f"pair {i}: answer and wrong tokenize identically "
                    f"({model.tokenizer.convert_ids_to_tokens(list(a))}), so their logit difference is 0 in "
                    "every run. Give each pair a wrong answer with other tokens."
                )
    for i, (a, b) in enumerate(zip(cenc, xenc)):
        if len(a) != len(b):
            show = lambda ids: model.tokenizer.convert_ids_to_tokens(ids)  # noqa: E731
            raise PairLengthError(
                f"pair {i}: the clean prompt has {len(a)} tokens {show(a.ids)} but the corrupted one has {len(b)} "
                f"{show(b.ids)}. Patching swaps activations position by position, so both must tokenize to the "
                "same length: choose a corrupted prompt (e.g. another subject) with the same token count."
            )
    last = torch.tensor([len(e) - 1 for e in cenc], dtype=torch.long)
    if ans is not None and any(len(t) > 1 for t in ans[1]):  # teacher forcing: the answer follows the prompt
        cont = [list(t[:-1]) for t in ans[1]]
        cenc = [Encoded(e.ids + c, e.offsets + [(0, 0)] * len(c)) for e, c in zip(cenc, cont)]
        xenc = [Encoded(e.ids + c, e.offsets + [(0, 0)] * len(c)) for e, c in zip(xenc, cont)]
    pad_id = model.pad_token_id
    return Pairs(
        pad(cenc, pad_id, "right"),
        pad(xenc, pad_id, "right"),
        None if ans is None else ans[0],
        None if wrg is None else wrg[0],
        last,
        None,
        None if ans is None else ans[1],
        None if wrg is None else wrg[1],
    )


def _differs_outside(model, a: Encoded, b: Encoded, spans: tuple[tuple[int, int], tuple[int, int]]) -> int | None:
    """The first token position at which ``a`` and ``b`` differ outside their fillers' characters."""
    for k, (x, y) in enumerate(zip(a.ids, b.ids)):
        if x == y:
            continue
        inside = all(o[0] < s[1] and o[1] > s[0] for o, s in ((a.offsets[k], spans[0]), (b.offsets[k], spans[1])))
        if not inside:
            return k
    return None


def matched_pairs(
    model,
    prompts: Sequence[str | Prompt],
    answers: Sequence[str],
    n: int | None = None,
    seed: int = 0,
) -> Pairs:
    """Clean/corrupted pairs from prompts that differ in one subject: each (shuffled) prompt is
    paired with another of the same token count and a different answer, checked token by token.

    ``prompts``: :class:`interp.Prompt` with ``subject=`` (the relation prompts of
    :mod:`interp.relations` are), or strings. Where both prompts name their subject, they must
    agree on every token outside it (a subject that changes the tokenization of the text around it
    is skipped); plain strings have no subject to check against, so only their lengths are matched.
    ``answer`` of a pair is the clean prompt's answer, ``wrong`` the corrupted one's. ``n``: at
    most this many pairs (default: one per prompt that has a partner). The same ``seed`` gives the
    same pairs.

    >>> pairs = matched_pairs(model, relation.prompts(), relation.answers, n=32)
    """
    prompts = as_prompts(prompts)
    answers = [str(a) for a in answers]
    if len(prompts) != len(answers):
        raise ValueError(f"got {len(prompts)} prompts but {len(answers)} answers; give one answer per prompt")
    # answers compared as the model reads them ("city" and " city" are one answer)
    tokens = {a: _answer_ids(model, a) for a in set(answers)}
    enc = _as_encoded(model, prompts, "prompt {i}")
    spans = []
    for p in prompts:
        s = p.text.find(p.subject) if p.text is not None and p.subject else -1
        spans.append(None if s < 0 else (s, s + len(p.subject)))
    by_len: dict[int, list[int]] = {}
    for i, e in enumerate(enc):
        by_len.setdefault(len(e), []).append(i)
    rng = random.Random(seed)
    order = list(range(len(prompts)))
    rng.shuffle(order)
    clean, corrupted, ans, wrong = [], [], [], []
    for i in order:
        others = [
            j
            for j in by_len[len(enc[i])]
            if tokens[answers[j]] != tokens[answers[i]]
            and (
                spans[i] is None
                or spans[j] is None
                or _differs_outside(model, enc[i], enc[j], (spans[i], spans[j])) is None
            )
        ]
        if not others:
            continue
        j = rng.choice(others)
        clean.append(prompts[i])
        corrupted.append(prompts[j])
        ans.append(answers[i])
        wrong.append(answers[j])
        if n is not None and len(clean) == n:
            break
    if not clean:
        raise ValueError(
            "no two prompts have the same token count, different answers and the same tokens outside their "
            "subjects; cannot build patching pairs (use subjects of equal token counts)"
        )
    return make_pairs(model, clean, corrupted, answer=ans, wrong=wrong)


def pairs_from_template(
    model,
    template: str,
    fillers: Sequence[str],
    answers: Sequence[str],
    n: int | None = None,
    seed: int = 0,
) -> Pairs:
    """Clean/corrupted pairs from one template with one ``{}`` and its fillers (and each filler's
    answer), length-matched and checked token by token (:func:`matched_pairs`).

    >>> pairs = pairs_from_template(model, "The {} is located in the city of",
    ...                             ["Eiffel Tower", "Colosseum", "Big Ben"], ["Paris", "Rome", "London"])
    """
    if template.count("{}") != 1:
        raise ValueError(f"the template must hold exactly one '{{}}' for the filler; got {template!r}")
    if len(fillers) != len(answers):
        raise ValueError(f"got {len(fillers)} fillers but {len(answers)} answers; give one answer per filler")
    prompts = [Prompt(template.format(f), subject=f) for f in fillers]
    return matched_pairs(model, prompts, answers, n=n, seed=seed)
