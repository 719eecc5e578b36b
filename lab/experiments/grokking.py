"""Grokking on modular addition, with and without the GrokAlign regularizer.

The task (Power et al. 2022; Nanda et al. 2023): inputs ``a, b, =`` with ``a, b`` in ``0..p-1``,
label ``(a + b) mod p``; a fraction of the ``p^2`` pairs is the training set, the rest the test
set. A one-layer transformer (no layer norm, as in Nanda et al.) trained full-batch with AdamW and
strong weight decay first memorizes (train accuracy 1, test at chance) and much later
*generalizes* (test accuracy jumps): grokking. GrokAlign (Walker et al. 2025) adds
``lam * mean ||J_x||_F`` (:mod:`jacobians.regularizer`), with ``J_x`` the Jacobian of the
last-position logits with respect to the token embeddings, and reports grokking up to ~7x sooner.

:func:`train_modular` records train/test accuracy and the centroid alignment ``cos(J_x^T 1, x)``
on test inputs every ``eval_every`` steps, and the first step with test accuracy >= 95%.
Attention is computed explicitly (softmax of scores), which has the double backward the
regularizer needs.

The paper's setting (p = 113, 30% train, d_model 128, 4 heads, d_mlp 512) costs ~0.3-0.5 s a step
on a 2-core CPU; :data:`CPU_CONFIG` is a smaller model of the same shape that groks in about a
minute there (documented in README with what it measured).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import pandas as pd
import torch
from torch import nn

from interp.results import write_json, write_table
from interp.training import TrainingLoop, seed_torch
from jacobians.regularizer import GrokAlignRegularizer
from lab.executors import ProcessExecutor, SerialExecutor
from lab.stages import JSON, WHERE, Codec, Runner, Stage, Task


@dataclass(frozen=True)
class ModularConfig:
    p: int = 113
    train_fraction: float = 0.3
    d_model: int = 128
    n_heads: int = 4
    d_mlp: int = 512
    lr: float = 1e-3
    weight_decay: float = 1.0
    betas: tuple = (0.9, 0.98)
    steps: int = 20000
    eval_every: int = 50
    grokalign: float = 0.0  # lambda of the GrokAlign term (0: weight decay alone)
    seed: int = 0
    threads: int = field(default=2, metadata=WHERE)  # how it runs, not what: not keyed
    stop_at_grok: bool = True  # stop once test accuracy stays >= target for 3 evaluations
    target: float = 0.95


#: the paper's shape, scaled to a 2-core CPU
CPU_CONFIG = ModularConfig(
    p=41, train_fraction=0.5, d_model=64, n_heads=4, d_mlp=256, lr=3e-3, steps=5000, eval_every=100
)


class OneLayerTransformer(nn.Module):
    """Token + position embeddings, one attention block and one ReLU MLP (residual), unembedding."""

    def __init__(self, p: int, d_model: int, n_heads: int, d_mlp: int, n_ctx: int = 3):
        super().__init__()
        self.n_heads, self.d_head = n_heads, d_model // n_heads
        self.embed = nn.Embedding(p + 1, d_model)  # token p is "="
        self.pos = nn.Parameter(torch.randn(n_ctx, d_model) / d_model**0.5)
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=False)
        self.out = nn.Linear(d_model, d_model, bias=False)
        self.mlp = nn.Sequential(nn.Linear(d_model, d_mlp), nn.ReLU(), nn.Linear(d_mlp, d_model))
        self.unembed = nn.Linear(d_model, p, bias=False)

    def forward_from_embeddings(self, x: torch.Tensor) -> torch.Tensor:
        """Last-position logits from token embeddings ``x`` [batch, 3, d] (before positions)."""
        h = x + self.pos
        b, t, d = h.shape
        q, k, v = self.qkv(h).reshape(b, t, 3, self.n_heads, self.d_head).unbind(2)
        scores = torch.einsum("bqhd,bkhd->bhqk", q, k) / self.d_head**0.5
        scores = scores.masked_fill(torch.ones(t, t, dtype=torch.bool, device=h.device).triu(1), float("-inf"))
        z = torch.einsum("bhqk,bkhd->bqhd", scores.softmax(-1), v).reshape(b, t, d)
        h = h + self.out(z)
        h = h + self.mlp(h)
        return self.unembed(h[:, -1])

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.forward_from_embeddings(self.embed(tokens))


def modular_data(p: int, train_fraction: float, seed: int):
    a, b = torch.meshgrid(torch.arange(p), torch.arange(p), indexing="ij")
    tokens = torch.stack([a.flatten(), b.flatten(), torch.full((p * p,), p)], dim=1)
    labels = (a.flatten() + b.flatten()) % p
    perm = torch.randperm(p * p, generator=torch.Generator().manual_seed(seed))
    n_train = int(round(train_fraction * p * p))
    tr, te = perm[:n_train], perm[n_train:]
    return tokens[tr], labels[tr], tokens[te], labels[te]


def centroid_alignment_of(model: OneLayerTransformer, tokens: torch.Tensor) -> float:
    """Mean ``cos(J_x^T 1, x)`` over inputs, ``x`` = token embeddings (flattened over positions)."""
    x = model.embed(tokens).detach().requires_grad_(True)
    logits = model.forward_from_embeddings(x)
    (mu,) = torch.autograd.grad(logits.sum(), x)
    return torch.nn.functional.cosine_similarity(mu.flatten(1), x.detach().flatten(1), dim=-1).mean().item()


def train_modular(config: ModularConfig, progress: bool | None = None) -> tuple[pd.DataFrame, dict]:
    """Train once; returns the per-evaluation log and a summary (``grok_step``: first step with
    test accuracy >= ``target``, None if never)."""
    seed_torch(config.seed)
    xtr, ytr, xte, yte = modular_data(config.p, config.train_fraction, config.seed)
    model = OneLayerTransformer(config.p, config.d_model, config.n_heads, config.d_mlp)
    opt = torch.optim.AdamW(model.parameters(), lr=config.lr, weight_decay=config.weight_decay, betas=config.betas)
    reg = GrokAlignRegularizer(lam=config.grokalign) if config.grokalign > 0 else None
    gen = torch.Generator().manual_seed(config.seed + 1)
    grok_step, streak = None, 0
    loop = TrainingLoop(
        config.steps + 1,
        desc=f"modular p={config.p} lam={config.grokalign}",
        threads=config.threads,
        progress=progress,
        log_every=config.eval_every,
    )
    for step in loop:
        if step % config.eval_every == 0:
            with torch.no_grad():
                train_acc = (model(xtr).argmax(-1) == ytr).float().mean().item()
                test_acc = (model(xte).argmax(-1) == yte).float().mean().item()
            align = centroid_alignment_of(model, xte[:512])
            loop.log(step, train_accuracy=train_acc, test_accuracy=test_acc, centroid_alignment=align)
            if test_acc >= config.target:
                grok_step = step if grok_step is None else grok_step
                streak += 1
                if config.stop_at_grok and streak >= 3:
                    break
            else:
                grok_step, streak = None, 0
        if step == config.steps:
            break
        x = model.embed(xtr)
        logits = model.forward_from_embeddings(x)
        loss = nn.functional.cross_entropy(logits, ytr)
        if reg is not None:
            loss = loss + reg(logits, x, generator=gen)
        loop.optimize(loss, opt)
    rows = loop.rows
    log = pd.DataFrame(rows)
    summary = {
        **asdict(config),
        "grok_step": grok_step,
        "seconds": round(loop.seconds, 1),
        "final_test_accuracy": rows[-1]["test_accuracy"],
        "final_train_accuracy": rows[-1]["train_accuracy"],
    }
    return log, summary


@dataclass(frozen=True)
class GrokRun:
    """One training run as a stage's inputs (:mod:`lab.stages`)."""

    config: ModularConfig
    condition: str


def run_grokking(inputs: GrokRun) -> tuple[pd.DataFrame, dict]:
    log, summary = train_modular(inputs.config, progress=False)
    summary = {"condition": inputs.condition, **summary, "config": asdict(inputs.config)}
    return log.assign(condition=inputs.condition, seed=inputs.config.seed), summary


def _save_run(result: tuple[pd.DataFrame, dict], path: Path) -> None:
    log, summary = result
    write_table(log, path.with_suffix(".csv"))
    write_json(summary, path)  # last: its presence marks the run done


def _load_run(path: Path) -> tuple[None, dict]:
    return None, JSON.read(path)


#: one run, saved as ``runs/<condition>_seed<k>.json`` (its summary) and ``.csv`` (its log)
GROKKING = Stage("grokking run", run_grokking, Codec(_save_run, _load_run))


def grokking_experiment(
    out: str | Path,
    config: ModularConfig = CPU_CONFIG,
    lam: float = 1e-3,
    seeds=(0, 1, 2),
    workers: int = 1,
    progress: bool | None = None,
) -> pd.DataFrame:
    """Weight decay alone vs weight decay + GrokAlign over ``seeds``; each run saved as it finishes
    (``runs/<condition>_seed<k>.json`` + ``.csv``) and reloaded when rerun (a run saved with another
    configuration is refused). ``workers > 1`` runs that many trainings at once in separate
    processes (:class:`lab.executors.ProcessExecutor`, one torch thread each: these small models
    are bound by per-operation overhead, which threads do not share out). Returns the summary table."""
    out = Path(out)
    if workers > 1:
        config = replace(config, threads=1)
    tasks = [
        Task(GROKKING, GrokRun(replace(config, grokalign=lam_c, seed=seed), name), f"runs/{name}_seed{seed}.json")
        for name, lam_c in (("weight_decay", 0.0), ("grokalign", lam))
        for seed in seeds
    ]
    executor = ProcessExecutor(workers, progress=progress) if workers > 1 else SerialExecutor(progress=progress)
    # the slow runs first, so that workers finish together
    order = sorted(range(len(tasks)), key=lambda i: tasks[i].inputs.condition != "grokalign")
    Runner(out).map([tasks[i] for i in order], executor=executor, desc="grokking runs")
    rows = [summary for _, summary in Runner(out).map(tasks)]
    table = pd.DataFrame(rows)[
        ["condition", "seed", "grok_step", "seconds", "final_test_accuracy", "final_train_accuracy"]
    ]
    write_table(table, out / "grokking.csv")
    return table


def load_logs(out: str | Path) -> pd.DataFrame:
    return pd.concat([pd.read_csv(f) for f in sorted((Path(out) / "runs").glob("*.csv"))], ignore_index=True)
