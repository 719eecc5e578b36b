"""Scoring labels: which of a fixed set of words does a model prefer after a prompt, and the loss
that teaches it one. The only place that knows how a model family answers; the handle picks the
objective (:attr:`interp.models.Model.scoring`) and everything above it (the study's pretrained
answers, fine-tuning, held-out evaluation) calls the same three methods on any model.

**Continuation** (causal LMs: GPT-2, Pythia, Llama, the world model). ``logprobs(prompts,
candidates)`` is the log-probability of each candidate *as a whole token sequence* following the
prompt (the sum of its tokens' log-probabilities, teacher-forced), so multi-token answers ("New
York", "United States") are scored by their full sequence, never by a first token that several
answers share. Candidates are appended after a space (``prompt + " " + candidate``); the
candidate's tokens are those that follow the prompt's own tokens. When every candidate is a
single token, one forward pass per batch of prompts suffices; otherwise each (prompt, candidate)
pair is scored. The loss is the causal-LM cross-entropy of the label's tokens (the prompt is not a
target), HuggingFace's ``labels=`` loss (equal to it up to float rounding: tested). The head reads
out only at the positions that predict a label token (``Model.forward(positions=...)``), not at
every position of the batch, and ``logprobs`` reads out at each prompt's last position only: the
same numbers up to float rounding (a product of another shape), less work.

**Masked slot** (encoders: BERT, RoBERTa, MiniLM). The prompt is followed by a slot of ``k`` mask
tokens (``prompt + " [MASK] ... [MASK]"``) for a label of ``k`` word pieces, and piece ``i`` is
scored at mask ``i``::

    log p(piece_i) = log_softmax(h_i @ E.T)[piece_i]

where ``h_i`` is the final hidden state at the mask (the last block's residual output) and ``E``
the model's own input-embedding matrix: a read-out *tied* to the input embeddings, so fine-tuning
adds no parameters (a new head would be a probe trained on the fine-tuning labels, and its
accuracy would not be the model's). A ``k``-piece label scores the sum over its pieces, each
predicted with all ``k`` slots masked (the pieces independently, as in BERT's pretraining, not by
the chain rule); labels of different lengths are compared through slots of their own lengths, and
a longer label pays for each piece, as a multi-token continuation does in a causal LM. The loss
is the cross-entropy of every target piece over the whole vocabulary, averaged over pieces. The
model's own MLM head, if it has one, is not used (all-MiniLM-L6-v2 has none; TransformerLens
gives a headless BERT a *random* one): the tied read-out is the same on every backend and every
encoder. Before fine-tuning the read-out was never trained to answer a question, so the
pretrained model's own answers are undefined (:attr:`Scoring.answers_undefined` says why).

**Subject frequency proxy** (:meth:`Scoring.frequency`), for models whose training corpus is not
known: a causal LM's mean log-probability of a text's tokens after its first (frequent names are
predictable); an encoder's negative number of word pieces per word (WordPiece and BPE
vocabularies keep frequent strings whole and split rare ones, so a subject cut into many pieces
is a rare one). Both are proxies; the world model has exact counts instead.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from jaxtyping import Float, Int

from .handle import LanguageModel
from .tokens import Batch, Encoded, pad

Tensor = torch.Tensor

#: HuggingFace ``model_type`` values of encoders (scored through a masked slot)
ENCODER_TYPES = frozenset(
    {"bert", "roberta", "distilbert", "electra", "albert", "xlm-roberta", "camembert", "mpnet", "deberta", "deberta-v2"}
)  # post-LN encoders: the last block's output is the final hidden state


@dataclass
class LabelExamples:
    """Fine-tuning examples tokenized once: a padded batch and its targets (``-100``: not a target)."""

    batch: Batch
    targets: Int[Tensor, "n pos"]

    def __len__(self) -> int:
        return len(self.targets)

    def rows(self, index: Tensor) -> tuple[Batch, Tensor]:
        b = self.batch
        return Batch(b.input_ids[index], b.attention_mask[index], b.position_ids[index], b.shift[index]), self.targets[
            index
        ]


class Scoring(ABC):
    """How one model scores candidate words after a prompt (see the module docstring)."""

    #: ``"continuation"`` or ``"masked"``
    kind: str
    #: what :meth:`frequency` measures, for reports
    frequency_source: str

    def __init__(self, model: LanguageModel):
        self.model = model

    @property
    def answers_undefined(self) -> str | None:
        """Why the pretrained model's own answers cannot be read through this scoring, or None."""
        return None

    def context(self, prompt: str) -> str:
        """The text the model reads when it answers ``prompt`` (for an encoder, with its masked
        slot): where states that an intervention acts on should be read."""
        return prompt

    @abstractmethod
    def logprobs(
        self, prompts: Sequence[str], candidates: Sequence[str], batch_size: int = 128
    ) -> Float[Tensor, "prompt candidate"]:
        """Log-probability of each candidate after each prompt (no gradient)."""

    @abstractmethod
    def examples(self, prompts: Sequence[str], labels: Sequence[str]) -> LabelExamples:
        """``prompts`` with their ``labels`` as training examples (tokenized once)."""

    @abstractmethod
    def loss(self, examples: LabelExamples, index: Tensor) -> Float[Tensor, ""]:
        """Mean cross-entropy of the labels of ``examples[index]`` (differentiable)."""

    @abstractmethod
    def target_losses(self, batch: Batch, targets: Int[Tensor, "n pos"]) -> tuple[Tensor, Tensor]:
        """Per row of ``batch``: the summed cross-entropy of its targets (``-100``: none) and their
        number; :meth:`loss` is their ratio over a batch. Rows never mix, so a batch may hold several
        jobs' rows (:mod:`interp.grouped`) and each job's loss is read from its own rows."""

    @abstractmethod
    def frequency(self, text: str) -> float:
        """A proxy of how frequent ``text`` is in the model's training data (higher: more frequent)."""

    def token_logprobs(self, text: str) -> Float[Tensor, " n_tokens_minus_1"]:
        """``log p(token_i | tokens before it)`` for every token of ``text`` after its first
        (causal LMs only)."""
        raise TypeError(
            f"token log-probabilities need a causal LM; {self.model.name} is a {self.model.model_type} encoder "
            "(use model.scoring.frequency for a frequency proxy)"
        )


def scoring_for(model: LanguageModel) -> Scoring:
    """The objective for ``model``: masked slot for encoders, continuation otherwise."""
    return MaskedSlot(model) if model.model_type in ENCODER_TYPES else Continuation(model)


# causal LMs -------------------------------------------------------------------------------------
class Continuation(Scoring):
    kind = "continuation"
    frequency_source = "proxy: mean log-prob of subject tokens"

    @torch.no_grad()
    def logprobs(self, prompts, candidates, batch_size=128):
        model = self.model
        tokenizer, pad_id = model.tokenizer, model.pad_token_id
        enc = _ids(tokenizer, prompts)
        single = _ids(tokenizer, [" " + c for c in candidates], add_special_tokens=False)
        if all(len(s) == 1 for s in single) and _single_token_consistent(tokenizer, prompts[:3], candidates, single):
            ids = torch.tensor([s[0] for s in single])
            rows = []
            for i in range(0, len(enc), batch_size):
                batch = _pad(enc[i : i + batch_size], pad_id, "left")
                logp = torch.log_softmax(model.forward(batch, positions=[-1])[:, 0].float(), -1)
                rows.append(logp[:, ids.to(logp.device)].cpu())
            return torch.cat(rows)
        cand = candidate_token_ids(tokenizer, prompts, candidates)
        seqs, spans = [], []
        for p_ids, row in zip(enc, cand):
            for c_ids in row:
                seqs.append(p_ids + c_ids)
                spans.append((len(p_ids), len(c_ids)))
        scores = []
        for i in range(0, len(seqs), batch_size):
            chunk = seqs[i : i + batch_size]
            batch = _pad(chunk, pad_id, "right")
            logp = torch.log_softmax(model.forward(batch).float(), -1).cpu()
            for r, (start, n) in enumerate(spans[i : i + batch_size]):
                tgt = torch.tensor(chunk[r][start : start + n])
                scores.append(logp[r, start - 1 : start - 1 + n].gather(1, tgt[:, None]).sum().item())
        return torch.tensor(scores).reshape(len(prompts), len(candidates))

    def examples(self, prompts, labels):
        tokenizer = self.model.tokenizer
        seqs, targets = [], []
        for p, l in zip(prompts, labels):
            base = tokenizer(p)["input_ids"]
            full = tokenizer(p + " " + l)["input_ids"]
            if full[: len(base)] != base:
                raise ValueError(f"label {l!r} does not extend prompt {p!r} token-wise")
            seqs.append(full)
            targets.append([-100] * len(base) + full[len(base) :])
        return _examples(seqs, targets, self.model.pad_token_id)

    def loss(self, examples, index):
        sums, counts = self.target_losses(*examples.rows(index))
        return sums.sum() / counts.sum()

    def target_losses(self, batch, targets):
        y = torch.nn.functional.pad(targets, (0, 1), value=-100)[..., 1:]  # position t predicts token t + 1
        read = (y != -100).any(0).nonzero()[:, 0]  # the positions some row predicts a target from
        if not len(read):  # no targets at all: zero loss over zero targets (a mean of them is NaN)
            zeros = torch.zeros(len(targets), device=self.model.device)
            return zeros, zeros.long()
        logits = self.model.forward(batch, positions=read).float()  # the read-out there only
        y = y[:, read].to(logits.device)
        ce = torch.nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten(), ignore_index=-100, reduction="none")
        return ce.view(y.shape).sum(1), (y != -100).sum(1)

    @torch.no_grad()
    def frequency(self, text):
        lp = self.token_logprobs(text)
        return float(lp.mean()) if len(lp) else 0.0

    def token_logprobs(self, text):
        ids = self.model.tokenizer(text)["input_ids"]
        if len(ids) < 2:
            return torch.zeros(0)
        logits = self.model.forward(pad([Encoded(ids, [])], self.model.pad_token_id))[0].float()
        return (
            torch.log_softmax(logits[:-1], -1)
            .gather(1, torch.tensor(ids[1:], device=logits.device)[:, None])[:, 0]
            .cpu()
        )


def candidate_token_ids(tokenizer, prompts: Sequence[str], candidates: Sequence[str]) -> list[list[list[int]]]:
    """Token ids of every candidate after every prompt: ``[prompt][candidate] -> ids``."""
    out = []
    for p, base in zip(prompts, _ids(tokenizer, prompts)):
        row = []
        for c, full in zip(candidates, _ids(tokenizer, [p + " " + c for c in candidates])):
            if full[: len(base)] != base or len(full) == len(base):
                raise ValueError(
                    f"cannot score candidate {c!r} after prompt {p!r}: its tokens do not extend the prompt's"
                )
            row.append(full[len(base) :])
        out.append(row)
    return out


def candidate_logprobs(
    model: LanguageModel, prompts: Sequence[str], candidates: Sequence[str], batch_size: int = 128
) -> Float[Tensor, "prompt candidate"]:
    """``model.scoring.logprobs(...)``: each candidate's log-probability after each prompt."""
    return model.scoring.logprobs(prompts, candidates, batch_size)


# encoders ---------------------------------------------------------------------------------------
class MaskedSlot(Scoring):
    kind = "masked"
    frequency_source = (
        "proxy: minus word pieces per word of the subject (tokenizer vocabularies keep frequent strings whole)"
    )

    def __init__(self, model: LanguageModel):
        super().__init__(model)
        tok = model.tokenizer
        if tok is None or tok.mask_token_id is None:
            raise ValueError(
                f"{model.name}: an encoder ({model.model_type}) is scored at a masked slot, and its tokenizer "
                "has no mask token; load the model with the tokenizer it was trained with"
            )
        self.mask_token, self.mask_id = tok.mask_token, tok.mask_token_id

    @property
    def answers_undefined(self) -> str | None:
        return (
            f"{self.model.model_type} is an encoder scored through a read-out tied to its input embeddings, which "
            "only fine-tuning trains to answer; the pretrained model has no answer to read (no LM head is used)"
        )

    def context(self, prompt: str) -> str:
        """The prompt with a one-piece slot (every label of :data:`lab.study.labels.REAL_LABELS` is one piece)."""
        return prompt + " " + self.mask_token

    def pieces(self, word: str) -> list[int]:
        ids = self.model.tokenizer(word, add_special_tokens=False)["input_ids"]
        if not ids:
            raise ValueError(f"{word!r} has no word pieces in {self.model.name}'s vocabulary")
        return ids

    def slotted(self, prompt: str, k: int) -> tuple[list[int], list[int]]:
        """Token ids of ``prompt`` followed by ``k`` masks, and the masks' positions."""
        ids = self.model.tokenizer(prompt + " " + " ".join([self.mask_token] * k))["input_ids"]
        where = [i for i, t in enumerate(ids) if t == self.mask_id]
        if len(where) != k:
            raise ValueError(f"prompt {prompt!r} already contains a mask token; the slot is added after the prompt")
        return ids, where

    def vocab_logits(self, batch: Batch, positions: Int[Tensor, "n 2"]) -> Float[Tensor, "n vocab"]:
        """Tied read-out at ``positions`` (rows of ``(example, token)``): ``h @ E.T``."""
        h = self.model.final_hidden(batch)
        E = self.model.input_embeddings()
        return h[positions[:, 0], positions[:, 1]].float() @ E.float().T

    @torch.no_grad()
    def logprobs(self, prompts, candidates, batch_size=128):
        pieces = [self.pieces(c) for c in candidates]
        out = torch.zeros(len(prompts), len(candidates))
        for k in sorted({len(p) for p in pieces}):
            cols = [j for j, p in enumerate(pieces) if len(p) == k]
            target = torch.tensor([pieces[j] for j in cols])  # [cand, k]
            for i in range(0, len(prompts), batch_size):
                slots = [self.slotted(p, k) for p in prompts[i : i + batch_size]]
                batch = _pad([ids for ids, _ in slots], self.model.pad_token_id, "right")
                pos = torch.tensor([(r, w) for r, (_, where) in enumerate(slots) for w in where])
                logp = torch.log_softmax(self.vocab_logits(self._on_device(batch), pos), -1).cpu()
                logp = logp.reshape(len(slots), k, -1)  # [prompt, slot, vocab]
                scores = logp.gather(2, target.T[None].expand(len(slots), k, len(cols))).sum(1)  # [prompt, cand]
                out[i : i + len(slots), cols] = scores
        return out

    def examples(self, prompts, labels):
        seqs, targets = [], []
        for p, l in zip(prompts, labels):
            pieces = self.pieces(l)
            ids, where = self.slotted(p, len(pieces))
            y = [-100] * len(ids)
            for w, t in zip(where, pieces):
                y[w] = t
            seqs.append(ids)
            targets.append(y)
        return _examples(seqs, targets, self.model.pad_token_id)

    def loss(self, examples, index):
        batch, y = examples.rows(index)
        pos = (y != -100).nonzero()
        logits = self.vocab_logits(self._on_device(batch), pos)
        return torch.nn.functional.cross_entropy(logits, y[pos[:, 0], pos[:, 1]].to(logits.device))

    def target_losses(self, batch, targets):
        pos = (targets != -100).nonzero()
        logits = self.vocab_logits(self._on_device(batch), pos)
        ce = torch.nn.functional.cross_entropy(
            logits, targets[pos[:, 0], pos[:, 1]].to(logits.device), reduction="none"
        )
        sums = torch.zeros(len(targets), device=ce.device, dtype=ce.dtype).index_add(0, pos[:, 0].to(ce.device), ce)
        return sums, (targets != -100).sum(1).to(ce.device)

    def frequency(self, text):
        words = text.split()
        return -len(self.model.tokenizer(text, add_special_tokens=False)["input_ids"]) / max(1, len(words))

    def _on_device(self, batch: Batch) -> Batch:
        return batch.to(self.model.device)


# helpers -----------------------------------------------------------------------------------------
def _examples(seqs: list[list[int]], targets: list[list[int]], pad_id: int) -> LabelExamples:
    batch = pad([Encoded(s, []) for s in seqs], pad_id, "right")
    y = torch.full(batch.input_ids.shape, -100, dtype=torch.long)
    for i, t in enumerate(targets):
        y[i, : len(t)] = torch.tensor(t)
    return LabelExamples(batch, y)


def _single_token_consistent(tokenizer, prompts, candidates, single) -> bool:
    for p, base in zip(prompts, _ids(tokenizer, prompts)):
        full = _ids(tokenizer, [p + " " + c for c in candidates[:5]])
        if any(f != base + s for f, s in zip(full, single[:5])):
            return False
    return True


def _ids(tokenizer, texts: Sequence[str], **kwargs) -> list[list[int]]:
    """Each text's token ids, tokenized in one call (a fast tokenizer encodes the batch at once;
    the ids are those of one call per text)."""
    return tokenizer(list(texts), **kwargs)["input_ids"] if len(texts) else []


def _pad(seqs, pad_id, side):
    return pad([Encoded(list(x), []) for x in seqs], pad_id, side)
