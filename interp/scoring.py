"""Scoring candidate answers: which of a fixed set of continuations does a model prefer?

``candidate_logprobs(model, prompts, candidates)`` (or ``model.logprobs(prompts, candidates)``)
returns ``[n_prompts,
n_candidates]`` log-probabilities of each candidate *as a whole token sequence* following the
prompt (the sum of its tokens' log-probabilities, teacher-forced). Multi-token answers ("New
York", "United States") are therefore scored by their full sequence, never by a first token
that several answers may share. When every candidate is a single token, one forward pass per
batch of prompts suffices; otherwise each (prompt, candidate) pair is scored.

Candidates are appended after a space (``prompt + " " + candidate``); the candidate's tokens
are those that follow the prompt's own tokens.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import torch
from jaxtyping import Float

from .tokens import Encoded, pad

if TYPE_CHECKING:  # the handle calls this module; the type is only named here
    from .models import Model


def candidate_token_ids(tokenizer, prompts: Sequence[str], candidates: Sequence[str]) -> list[list[list[int]]]:
    """Token ids of every candidate after every prompt: ``[prompt][candidate] -> ids``."""
    out = []
    for p in prompts:
        base = tokenizer(p)["input_ids"]
        row = []
        for c in candidates:
            full = tokenizer(p + " " + c)["input_ids"]
            if full[: len(base)] != base or len(full) == len(base):
                raise ValueError(f"cannot score candidate {c!r} after prompt {p!r}: its tokens do not extend the prompt's")
            row.append(full[len(base):])
        out.append(row)
    return out


@torch.no_grad()
def candidate_logprobs(model: "Model", prompts: Sequence[str], candidates: Sequence[str], batch_size: int = 128
                       ) -> Float[torch.Tensor, "prompt candidate"]:
    """Log-probability of each candidate continuation of each prompt (see module docstring),
    computed through the model handle's backend."""
    tokenizer, pad_id = model.tokenizer, model.pad_token_id
    enc = [tokenizer(p)["input_ids"] for p in prompts]
    single = [tokenizer(" " + c, add_special_tokens=False)["input_ids"] for c in candidates]
    if all(len(s) == 1 for s in single) and _single_token_consistent(tokenizer, prompts[:3], candidates, single):
        ids = torch.tensor([s[0] for s in single])
        rows = []
        for i in range(0, len(enc), batch_size):
            batch = _pad(enc[i : i + batch_size], pad_id, "left")
            logp = torch.log_softmax(model.forward(batch)[:, -1].float(), -1)
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


def _single_token_consistent(tokenizer, prompts, candidates, single) -> bool:
    for p in prompts:
        base = tokenizer(p)["input_ids"]
        for c, s in zip(candidates[:5], single[:5]):
            if tokenizer(p + " " + c)["input_ids"] != base + s:
                return False
    return True


def _pad(seqs, pad_id, side):
    return pad([Encoded(list(x), []) for x in seqs], pad_id, side)
