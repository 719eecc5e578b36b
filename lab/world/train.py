"""Pretrain a small decoder-only LM on a world's corpus, on the CPU.

Three architecture families share one recipe (:data:`ARCHS`, ``TrainConfig.arch``): ``"gpt2"``
(learned positions, LayerNorm, GELU MLP, tied embeddings: the embedded ``world`` model),
``"llama"`` (RoPE, RMSNorm, SwiGLU MLP, grouped-query attention with ``n_kv_heads`` key/value
heads, tied embeddings as in the small Llamas) and ``"neox"`` (Pythia's GPT-NeoX: rotary on a
quarter of each head, attention and MLP in parallel from one residual, untied embeddings). Width,
depth, data, schedule and seed are the config's, whatever the family, so models of the zoo differ
in the architecture alone.

The corpus documents are shuffled anew each epoch (seeded) and packed into ``seq_len``-token
rows, each ending in ``<eos>``, and trained with next-token cross-entropy, AdamW and a warmup +
cosine schedule. Packing keeps documents whole (``pack="documents"``, the default): a row is
filled with whole documents and padded (padding is not trained on), so every sentence of a
biography is seen with the subject's name that opens it. ``pack="stream"`` concatenates
documents and cuts rows anywhere (no padding, but a biography cut in two teaches its second
half's facts without their subject). Same spec, same config, same seed: the same weights (on the
same machine and thread count). Training saves its state (weights, optimizer, data order, log)
every ``save_every`` steps beside the output directory (``<out>.partial``); the same call after
an interruption resumes from it and ends with the same weights as an uninterrupted run (with the
same thread count: a state is refused under another). The result is a HuggingFace directory
(``model.safetensors``, ``config.json``, tokenizer files) plus ``world_spec.json`` and ``train_log.csv``, loadable with
``interp.load_model(path)`` through either backend.
"""

from __future__ import annotations

import json
import math
import random
import shutil
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import pandas as pd
import torch

from interp.results import atomic_dir, write_json, write_table, write_text
from interp.training import TrainingLoop, seed_torch
from lab.stages import ADDED, WHERE, digest

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
    #: architecture family, a key of :data:`ARCHS`
    arch: str = field(default="gpt2", metadata=ADDED)
    #: key/value heads of grouped-query attention (llama only; None: as many as query heads)
    n_kv_heads: int | None = field(default=None, metadata=ADDED)
    #: steps between saved training states (how a run resumes, not what it computes)
    save_every: int = field(default=500, metadata=WHERE)


def _gpt2(config: TrainConfig, vocab_size: int, special: dict):
    from transformers import GPT2Config, GPT2LMHeadModel

    return GPT2LMHeadModel(
        GPT2Config(
            n_layer=config.n_layers,
            n_embd=config.d_model,
            n_head=config.n_heads,
            n_positions=config.seq_len,
            vocab_size=vocab_size,
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
            **special,
        )
    )


def _llama(config: TrainConfig, vocab_size: int, special: dict):
    from transformers import LlamaConfig, LlamaForCausalLM

    # SwiGLU's hidden width: 8/3 d_model (the parameter count of a 4 d_model GELU MLP), rounded to 32
    d_mlp = 32 * round(8 * config.d_model / 3 / 32)
    return LlamaForCausalLM(
        LlamaConfig(
            hidden_size=config.d_model,
            intermediate_size=d_mlp,
            num_hidden_layers=config.n_layers,
            num_attention_heads=config.n_heads,
            num_key_value_heads=config.n_kv_heads or config.n_heads,
            max_position_embeddings=config.seq_len,
            vocab_size=vocab_size,
            tie_word_embeddings=True,
            attention_dropout=0.0,
            **special,
        )
    )


def _neox(config: TrainConfig, vocab_size: int, special: dict):
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    return GPTNeoXForCausalLM(
        GPTNeoXConfig(
            hidden_size=config.d_model,
            intermediate_size=4 * config.d_model,
            num_hidden_layers=config.n_layers,
            num_attention_heads=config.n_heads,
            max_position_embeddings=config.seq_len,
            vocab_size=vocab_size,
            rotary_pct=0.25,
            use_parallel_residual=True,
            tie_word_embeddings=False,
            hidden_dropout=0.0,
            attention_dropout=0.0,
            **special,
        )
    )


#: ``TrainConfig.arch`` -> a builder of the randomly initialized HuggingFace model
ARCHS = {"gpt2": _gpt2, "llama": _llama, "neox": _neox}


def recipe(train: dict) -> dict:
    """What a saved ``train_config.json`` (or ``asdict(TrainConfig)``) trains with: fields it
    predates at their defaults, and how the run ran (threads, save interval) left out."""
    defaults = {f.name: f.default for f in fields(TrainConfig) if f.metadata.get("digest", True)}
    return {k: v for k, v in {**defaults, **train}.items() if k in defaults}


def trained_on(checkpoint: str | Path) -> tuple[WorldSpec, dict] | None:
    """The world spec and :func:`recipe` a finished checkpoint was trained with (None if none is there)."""
    root = Path(checkpoint)
    if not (root / "config.json").exists() or not (root / "train_config.json").exists():
        return None
    spec = WorldSpec.from_json((root / "world_spec.json").read_text())
    return spec, recipe(json.loads((root / "train_config.json").read_text()))


def check_config(config: TrainConfig) -> None:
    """Refuse a config that cannot train, before any work (what is wrong and what to pass)."""
    for name in ("n_layers", "d_model", "n_heads", "seq_len", "batch_size", "steps", "save_every"):
        if getattr(config, name) < 1:
            raise ValueError(f"TrainConfig.{name} must be at least 1, got {getattr(config, name)}")
    if config.n_kv_heads is not None and config.n_kv_heads < 1:
        raise ValueError(f"TrainConfig.n_kv_heads must be at least 1 (or None), got {config.n_kv_heads}")
    if config.pack not in ("documents", "stream"):
        raise ValueError(f"TrainConfig.pack must be 'documents' or 'stream', got {config.pack!r}")
    if config.arch not in ARCHS:
        raise ValueError(f"TrainConfig.arch must be one of {', '.join(ARCHS)}, got {config.arch!r}")
    if config.d_model % config.n_heads:
        raise ValueError(f"d_model {config.d_model} is not a multiple of n_heads {config.n_heads}")
    if config.n_kv_heads is not None:
        if config.arch != "llama":
            raise ValueError(f"n_kv_heads (grouped-query attention) is a llama option; arch is {config.arch!r}")
        if config.n_heads % config.n_kv_heads:
            raise ValueError(f"n_heads {config.n_heads} is not a multiple of n_kv_heads {config.n_kv_heads}")


def build_model(config: TrainConfig, vocab_size: int, tokenizer):
    """The randomly initialized model of ``config.arch`` (seeded by ``config.seed``)."""
    check_config(config)
    seed_torch(config.seed)
    special = {
        "bos_token_id": tokenizer.eos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
    }
    return ARCHS[config.arch](config, vocab_size, special)


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


#: the layout of a saved training state (part of its key: a state an older trainer wrote is refused)
STATE_FORMAT = 1


def _save_state(path: Path, state: dict) -> None:
    """Write ``state`` atomically (a crash mid-write leaves the previous state)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    torch.save(state, tmp)
    tmp.replace(path)


def train_world_model(
    spec: WorldSpec,
    out_dir: str | Path,
    config: TrainConfig = TrainConfig(),
    progress: bool | None = None,
    on_save=None,
) -> Path:
    """Generate the world, pretrain on its corpus, save a checkpoint directory; returns its path.

    Resumes from ``<out_dir>.partial`` when an interrupted run of the same spec and config left
    its state there (a state of another spec or config is refused, not overwritten).
    ``on_save(step, model)``: called after each saved training state (every ``config.save_every``
    steps), e.g. to measure the model as it learns (:mod:`lab.world.curves`); it must leave the
    weights as they are."""
    check_config(config)
    out = Path(out_dir)
    partial = out.with_name(out.name + ".partial") / "state.pt"
    key = digest({"spec": spec.to_json(), "config": config, "state_format": STATE_FORMAT})
    state = torch.load(partial, weights_only=True) if partial.exists() else None
    if state is not None and state["key"] != key:
        raise ValueError(
            f"{partial} holds an interrupted run of another world spec or training config (or of an older "
            "version of this trainer); delete it to start this one, or pass the spec and config it was made with"
        )
    if state is not None and state["threads"] != config.threads:
        raise ValueError(
            f"{partial} was trained with {state['threads']} threads; resume it with TrainConfig(threads="
            f"{state['threads']}) (another thread count changes the weights' last digits), or delete it"
        )
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

    start, log, elapsed = 0, [], 0.0
    epoch_rng = rng.getstate()  # the generator's state before this epoch's rows were drawn
    rows = epoch_rows()
    cursor, epoch = 0, 0
    if state is not None:
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        rng.setstate(state["epoch_rng"])
        epoch_rng = state["epoch_rng"]
        rows = epoch_rows()
        start, cursor, epoch, log, elapsed = (state[k] for k in ("step", "cursor", "epoch", "log", "seconds"))
        if on_save is not None:  # a run stopped while measuring its last saved step measures it now
            on_save(start, model)
    loop = TrainingLoop(
        config.steps, desc="pretrain", threads=config.threads, progress=progress, start=start, rows=log, elapsed=elapsed
    )
    for step in loop:
        if cursor + config.batch_size > len(rows):
            epoch_rng = rng.getstate()
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
        if (step + 1) % config.save_every == 0 and step + 1 < config.steps:
            _save_state(
                partial,
                {
                    "key": key,
                    "threads": config.threads,
                    "model": model.state_dict(),
                    "optimizer": opt.state_dict(),
                    "epoch_rng": epoch_rng,
                    "step": step + 1,
                    "cursor": cursor,
                    "epoch": epoch,
                    "log": loop.rows,
                    "seconds": loop.seconds,
                },
            )
            if on_save is not None:
                on_save(step + 1, model)
    model.eval()
    log = loop.rows

    with atomic_dir(out) as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        write_text(spec.to_json(), tmp / "world_spec.json")
        write_json(asdict(config), tmp / "train_config.json")
        write_table(pd.DataFrame(log), tmp / "train_log.csv")
    shutil.rmtree(partial.parent, ignore_errors=True)
    return out
