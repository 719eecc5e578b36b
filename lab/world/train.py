"""Pretrain a small decoder-only LM (GPT-2 architecture) on a world's corpus, on the CPU.

The corpus documents are shuffled anew each epoch (seeded) and packed into ``seq_len``-token
rows, each ending in ``<eos>``, and trained with next-token cross-entropy, AdamW and a warmup +
cosine schedule. Packing keeps documents whole (``pack="documents"``, the default): a row is
filled with whole documents and padded (padding is not trained on), so every sentence of a
biography is seen with the subject's name that opens it. ``pack="stream"`` concatenates
documents and cuts rows anywhere (no padding, but a biography cut in two teaches its second
half's facts without their subject). Same spec, same config, same seed: the same weights (on the
same machine and thread count). The result is a HuggingFace directory (``model.safetensors``,
``config.json``, tokenizer files) plus ``world_spec.json`` and ``train_log.csv``, loadable with
``interp.load_model(path)`` through either backend.
"""

from __future__ import annotations

import math
import random
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path

import pandas as pd
import torch

from interp.results import write_json, write_table, write_text
from interp.training import TrainingLoop, seed_torch
from lab.stages import WHERE

from .spec import WorldSpec
from .tokenizer import build_tokenizer
from .world import World


@dataclass(frozen=True)
class TrainConfig:
    n_layers: int = 4
    d_model: int = 128
    n_heads: int = 4
    seq_len: int = 64
    batch_size: int = 32
    steps: int = 11000
    lr: float = 3e-3
    warmup: int = 200
    weight_decay: float = 0.01
    seed: int = 0
    #: torch threads: how the step runs, not what it computes (not keyed; results equal in all but the last digits)
    threads: int = field(default=2, metadata=WHERE)
    pack: str = "documents"  # or "stream"


def build_model(config: TrainConfig, vocab_size: int, tokenizer):
    from transformers import GPT2Config, GPT2LMHeadModel

    seed_torch(config.seed)
    hf_config = GPT2Config(
        n_layer=config.n_layers,
        n_embd=config.d_model,
        n_head=config.n_heads,
        n_positions=config.seq_len,
        vocab_size=vocab_size,
        bos_token_id=tokenizer.eos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
    )
    return GPT2LMHeadModel(hf_config)


def _rows(docs: list[list[int]], eos: int, pad: int, seq_len: int, pack: str, rng: random.Random) -> torch.Tensor:
    """One epoch of training rows, ``[n_rows, seq_len]``, in a seeded random document order."""
    order = list(range(len(docs)))
    rng.shuffle(order)
    if pack == "stream":
        stream: list[int] = []
        for i in order:
            stream += docs[i] + [eos]
        n = len(stream) // seq_len
        return torch.tensor(stream[: n * seq_len]).reshape(n, seq_len)
    # first fit over a few open rows: whole documents, little padding (short statements fill gaps)
    rows, open_rows = [], []
    for i in order:
        doc = docs[i][: seq_len - 1] + [eos]
        fit = next((row for row in open_rows if len(row) + len(doc) <= seq_len), None)
        if fit is None:
            if len(open_rows) == 8:
                rows.append(open_rows.pop(0))
            fit = []
            open_rows.append(fit)
        fit += doc
    rows += open_rows
    return torch.tensor([row + [pad] * (seq_len - len(row)) for row in rows])


def train_world_model(
    spec: WorldSpec,
    out_dir: str | Path,
    config: TrainConfig = TrainConfig(),
    progress: bool | None = None,
) -> Path:
    """Generate the world, pretrain on its corpus, save a checkpoint directory; returns its path."""
    if config.pack not in ("documents", "stream"):
        raise ValueError(f"TrainConfig.pack must be 'documents' or 'stream', got {config.pack!r}")
    out = Path(out_dir)
    world = World.generate(spec)
    tokenizer = build_tokenizer(world.vocabulary())
    docs = [tokenizer(d, add_special_tokens=False)["input_ids"] for d in world.corpus()]
    model = build_model(config, len(tokenizer), tokenizer)
    model.train()
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": config.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=config.lr,
        betas=(0.9, 0.98),
    )

    def lr_at(step):
        if step < config.warmup:
            return config.lr * (step + 1) / config.warmup
        t = (step - config.warmup) / max(1, config.steps - config.warmup)
        return config.lr * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * t)))

    rng = random.Random(config.seed)

    def epoch_rows():
        return _rows(docs, tokenizer.eos_token_id, tokenizer.pad_token_id, config.seq_len, config.pack, rng)

    rows = epoch_rows()
    cursor, epoch = 0, 0
    loop = TrainingLoop(config.steps, desc="pretrain", threads=config.threads, progress=progress)
    for step in loop:
        if cursor + config.batch_size > len(rows):
            rows, cursor, epoch = epoch_rows(), 0, epoch + 1
        x = rows[cursor : cursor + config.batch_size]
        cursor += config.batch_size
        for g in opt.param_groups:
            g["lr"] = lr_at(step)
        labels = x.masked_fill(x == tokenizer.pad_token_id, -100)
        loss = model(input_ids=x, labels=labels).loss
        loop.optimize(loss, opt, clip=1.0, params=model.parameters())
        if loop.logging(step):
            loop.log(step, epoch=epoch, loss=round(loss.item(), 5), lr=lr_at(step))
    model.eval()
    log = loop.rows

    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    write_text(spec.to_json(), tmp / "world_spec.json")
    write_json(asdict(config), tmp / "train_config.json")
    write_table(pd.DataFrame(log), tmp / "train_log.csv")
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out
