"""Linear relational embeddings (Hernandez et al. 2024): is a relation a linear map in the model?

For a relation ("X plays the sport of ..."), let ``s`` be the hidden state after layer ``l`` at
the subject's last token and ``o`` the last block's output at the prompt's last token (before
the final norm). If the model decodes the relation linearly, ``o ~ W s + b`` near the data. The
LRE estimates ``W`` and ``b`` from a first-order Taylor expansion at a few examples:

    W_i = do/ds (at example i),  b_i = o_i - W_i s_i,  W, b = means over the examples

(each prompt prefixed with the other training pairs as in-context examples), and uses the
operator ``z = beta * W s + b``, decoded by the model's own final norm and unembedding (the
final residual stream is replaced by ``z``). Optional low rank keeps the top singular directions
of ``W``. Two tests of the approximation:

- **faithfulness**: on held-out subjects the model answers correctly, does the LRE's top token
  equal the model's answer (recall@1)?
- **causality**: edit the subject state by ``ds = pinv_rank(W) (z' - z) / beta``, where ``z'`` is
  the LRE's output for another subject with a different answer; does the model now give that
  subject's answer?
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

import pandas as pd
import torch
from jaxtyping import Float

from interp.prompts import Prompt
from interp.sites import site_name

from .jacobian import coordinates_per_pass, forward_with_input, jacobian_of, positions_tensor

Tensor = torch.Tensor


@dataclass
class LRE:
    """A fitted operator ``z = beta * W s + b`` (``W`` optionally truncated to ``rank``)."""

    W: Float[Tensor, "d_out d_in"]
    b: Float[Tensor, " d_out"]
    layer: int
    beta: float = 1.0
    rank: int | None = None

    @property
    def weight(self) -> Tensor:
        if self.rank is None:
            return self.W
        u, s, vh = torch.linalg.svd(self.W)
        return u[:, : self.rank] @ torch.diag(s[: self.rank]) @ vh[: self.rank]

    def __call__(self, s: Float[Tensor, "n d_in"]) -> Float[Tensor, "n d_out"]:
        return self.beta * s @ self.weight.T + self.b

    def inverse_edit(self, dz: Float[Tensor, "n d_out"], rank: int | None = None) -> Tensor:
        """``ds`` with ``beta * W ds = dz`` in the least-squares sense (rank-limited pseudo-inverse)."""
        u, s, vh = torch.linalg.svd(self.W)
        k = rank or len(s)
        pinv = vh[:k].T @ torch.diag(1.0 / s[:k]) @ u[:, :k].T
        return dz @ pinv.T / self.beta


def estimate_affine(fn, xs: Float[Tensor, "n d_in"]) -> tuple[Tensor, Tensor]:
    """Mean first-order expansion of ``fn`` at the points ``xs``: ``(W, b)`` with
    ``W = mean_i J(x_i)``, ``b = mean_i (fn(x_i) - J(x_i) x_i)``; ``fn`` maps ``[n, d_in] -> [n, d_out]``
    row by row."""
    x = xs.detach().clone().requires_grad_(True)
    y = fn(x)
    J = jacobian_of(y, x)
    b = y.detach() - torch.einsum("noi,ni->no", J, x.detach())
    return J.mean(0), b.mean(0)


class LinearRelationalEmbedding:
    """Fit and evaluate LREs of relations on one model (configured once).

    Parameters
    ----------
    model : interp.Model
    layer : the subject layer ``l`` (``s`` = ``blocks.{l}.hook_resid_post`` at the subject's last token)
    beta : scaling of ``W s``
    rank : keep this many singular directions of ``W`` in the operator (None: all)
    n_train : examples the LRE is estimated from
    icl : prefix each prompt with the training pairs as in-context examples
    causality_rank : rank of the pseudo-inverse used for edits (None: full)
    """

    def __init__(
        self,
        model,
        layer: int,
        beta: float = 1.0,
        rank: int | None = None,
        n_train: int = 5,
        icl: bool = True,
        causality_rank: int | None = None,
        batch_size: int = 16,
    ):
        self.model, self.layer, self.beta, self.rank = model, layer, beta, rank
        self.n_train, self.icl, self.causality_rank, self.batch_size = n_train, icl, causality_rank, batch_size

    def _validate(self) -> None:
        """Check the configuration against the model; the sites read end in ``_``."""
        n = self.model.n_layers
        if not 0 <= self.layer < n - 1:
            raise ValueError(
                f"layer must be in 0..{n - 2} (the output is the last block, layer {n - 1}); got {self.layer}"
            )
        self.s_site_ = site_name("resid_post", self.layer)
        self.o_site_ = site_name("resid_post", n - 1)

    # prompts ------------------------------------------------------------------------------------
    def _prompts(self, relation, idx: Sequence[int], context: Sequence[int]) -> list[Prompt]:
        base = relation.prompts()
        out = []
        for i in idx:
            prefix = " ".join(f"{base[j].text} {relation.answers[j]} ." for j in context if j != i) if self.icl else ""
            text = f"{prefix} {base[i].text}".strip()
            out.append(Prompt(text, relation.subjects[i]))
        return out

    def _first_token(self, answer: str) -> int:
        ids = self.model.tokenizer(" " + answer, add_special_tokens=False)["input_ids"]
        return ids[0]

    def _states(self, prompts: list[Prompt]):
        """Batches of (batch, subject positions, last positions, s [n, d], o [n, d])."""
        for i in range(0, len(prompts), self.batch_size):
            chunk = prompts[i : i + self.batch_size]
            batch = self.model.batch(self.model.encode(chunk), "right")
            spos = positions_tensor(self.model, chunk, batch, "subject_last")
            lpos = positions_tensor(self.model, chunk, batch, "last")
            yield batch, spos, lpos

    # fitting ------------------------------------------------------------------------------------
    def fit(self, relation, train: Sequence[int]) -> LinearRelationalEmbedding:
        """Estimate the LRE from the subjects ``train`` of ``relation``: the fitted operator is
        ``lre_`` (an :class:`LRE`); returns ``self``."""
        self._validate()
        prompts = self._prompts(relation, train, train)
        Ws, bs = [], []
        for batch, spos, lpos in self._states(prompts):
            chunk = coordinates_per_pass(self.model, batch, self.s_site_, self.o_site_)
            s, o = forward_with_input(self.model, batch, self.s_site_, self.o_site_, spos, lpos)
            J = jacobian_of(o, s, chunk=chunk)
            Ws.append(J.detach())
            bs.append((o - torch.einsum("noi,ni->no", J, s)).detach())
        W = torch.cat(Ws).mean(0)
        b = torch.cat(bs).mean(0)
        self.lre_ = LRE(W.double(), b.double(), self.layer, self.beta, self.rank)
        return self

    # evaluation ---------------------------------------------------------------------------------
    @torch.no_grad()
    def _decode(self, batch, lpos: Tensor, z: Tensor) -> Tensor:
        """Logits at the last position with the final residual there replaced by ``z``."""
        rows = torch.arange(len(lpos))

        def put(act):
            new = act.clone()
            new[rows, lpos] = z.to(act.dtype)
            return new

        logits = self.model.run(batch, {self.o_site_: put})
        return logits[rows, lpos]

    def evaluate(
        self, relation, train: Sequence[int], test: Sequence[int], lre: LRE | None = None, seed: int = 0
    ) -> pd.DataFrame:
        """One row per test subject: model's and LRE's top tokens, faithfulness and causality."""
        self._validate()
        lre = lre or self.fit(relation, train).lre_
        prompts = self._prompts(relation, test, train)
        rows = []
        s_all, z_all, meta = [], [], []
        for batch, spos, lpos in self._states(prompts):
            with torch.no_grad():
                acts = {}

                def keep(name):
                    def fn(act):
                        acts[name] = act

                    return fn

                logits = self.model.run(batch, {self.s_site_: keep(self.s_site_), self.o_site_: keep(self.o_site_)})
            r = torch.arange(len(lpos))
            s = acts[self.s_site_][r, spos].double()
            z = lre(s)
            model_top = logits[r, lpos].argmax(-1)
            lre_top = self._decode(batch, lpos, z).argmax(-1)
            s_all.append(s)
            z_all.append(z)
            meta += list(zip(model_top.tolist(), lre_top.tolist()))
        s_all, z_all = torch.cat(s_all), torch.cat(z_all)
        rng = random.Random(seed)
        answers = [relation.answers[i] for i in test]
        for k, i in enumerate(test):
            gold = self._first_token(relation.answers[i])
            rows.append(
                {
                    "subject": relation.subjects[i],
                    "answer": relation.answers[i],
                    "model_correct": meta[k][0] == gold,
                    "lre_correct": meta[k][1] == gold,
                    "faithful": meta[k][1] == meta[k][0],
                }
            )
        # causality: move each subject's state towards another test subject with a different answer
        targets = []
        for k in range(len(test)):
            others = [j for j in range(len(test)) if answers[j] != answers[k] and rows[j]["model_correct"]]
            targets.append(rng.choice(others) if others else None)
        flipped = self._edit_and_check(prompts, s_all, z_all, targets, answers, lre)
        for k, f in enumerate(flipped):
            rows[k]["edit_target"] = None if targets[k] is None else answers[targets[k]]
            rows[k]["causal"] = f
        return pd.DataFrame(rows)

    def _edit_and_check(self, prompts, s_all, z_all, targets, answers, lre: LRE) -> list[bool | None]:
        out: list[bool | None] = []
        pos = 0
        for batch, spos, lpos in self._states(prompts):
            n = len(lpos)
            idx = list(range(pos, pos + n))
            pos += n
            tgt = [targets[k] for k in idx]
            dz = torch.stack(
                [(z_all[t] - z_all[k]) if t is not None else torch.zeros_like(z_all[k]) for k, t in zip(idx, tgt)]
            )
            ds = lre.inverse_edit(dz, self.causality_rank)
            r = torch.arange(n)

            def edit(act):
                new = act.clone()
                new[r, spos] = (act[r, spos].double() + ds).to(act.dtype)
                return new

            with torch.no_grad():
                logits = self.model.run(batch, {self.s_site_: edit})
            top = logits[r, lpos].argmax(-1).tolist()
            for _k, t, tok in zip(idx, tgt, top):
                out.append(None if t is None else tok == self._first_token(answers[t]))
        return out

    def summary(self, table: pd.DataFrame) -> dict:
        correct = table[table.model_correct]
        causal = table[table.causal.notna()]
        return {
            "n_test": len(table),
            "model_accuracy": float(table.model_correct.mean()),
            "faithfulness": float(correct.lre_correct.mean()) if len(correct) else float("nan"),
            "agreement": float(table.faithful.mean()),
            "causality": float(causal.causal.astype(bool).mean()) if len(causal) else float("nan"),
        }

    def run(self, relation, n_test: int = 50, seed: int = 0) -> dict:
        """Fit on ``n_train`` random subjects, evaluate on up to ``n_test`` others; the summary."""
        rng = random.Random(seed)
        idx = list(range(len(relation)))
        rng.shuffle(idx)
        train, test = idx[: self.n_train], idx[self.n_train : self.n_train + n_test]
        return {
            "relation": relation.name,
            "layer": self.layer,
            "beta": self.beta,
            **self.summary(self.evaluate(relation, train, test, seed=seed)),
        }
