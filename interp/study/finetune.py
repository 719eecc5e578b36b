"""Fine-tuning on a relabelled relation: full fine-tuning or LoRA (peft), until the fine-tuning
subjects are learned.

The model is trained on ``template.format(subject) + " " + label`` for the fine-tuning subjects
only, with cross-entropy on the label's tokens (the prompt is not a target). The default
template, ``"{} is associated with the word"``, never names the original relation. Training
stops once every fine-tuning subject's top label (among the relation's labels) is right, checked
every ``check_every`` steps, or at ``max_steps``; the train accuracy reached is reported.

Full fine-tuning trains every weight except the embedding tables (token and position embeddings,
and a read-out tied to them), as LoRA leaves them too (``freeze_embeddings=True``, the default).
A fine-tune that may move embedding rows can memorize each fine-tuning subject through a row of
its own (in the world model a subject's family name is one token), which fits the fine-tuning
set without any rule that carries to held-out subjects; measured on the world model, freezing
them raises held-out generalization (``interp world ablate`` has the row).

The seed sets LoRA's initialization and the order of minibatches (``batch_size`` examples drawn
without replacement). A fine-tuning set that fits in one batch is trained full-batch, so full
fine-tuning is then deterministic and every seed gives the same model.
"""
from __future__ import annotations

import copy
from dataclasses import asdict, dataclass
from typing import Sequence

import torch

from ..scoring import candidate_logprobs
from ..tokens import Encoded, pad


@dataclass(frozen=True)
class FinetuneConfig:
    template: str = "{} is associated with the word"
    lr: float = 1e-3
    lora_lr: float = 3e-3
    max_steps: int = 300
    check_every: int = 10
    batch_size: int = 32
    lora_r: int = 8
    lora_alpha: int = 16
    weight_decay: float = 0.0
    freeze_embeddings: bool = True  # full fine-tuning: embedding tables stay as pretrained

    def to_dict(self) -> dict:
        return asdict(self)


def lora_targets(module) -> list[str]:
    """Linear layers LoRA adapts, per architecture (peft's defaults where it has them)."""
    model_type = getattr(getattr(module, "config", None), "model_type", None)
    table = {"gpt2": ["c_attn", "c_proj", "c_fc"], "gpt_neox": ["query_key_value", "dense", "dense_h_to_4h", "dense_4h_to_h"],
             "llama": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
             "bert": ["query", "key", "value", "dense"]}
    for family in ("qwen2", "qwen3", "mistral"):
        table[family] = table["llama"]
    if model_type not in table:
        raise ValueError(f"no LoRA target modules known for model_type={model_type!r}; add them to interp.study.finetune.lora_targets")
    return table[model_type]


def _examples(tokenizer, prompts: Sequence[str], labels: Sequence[str], pad_id: int):
    seqs, targets = [], []
    for p, l in zip(prompts, labels):
        base = tokenizer(p)["input_ids"]
        full = tokenizer(p + " " + l)["input_ids"]
        if full[: len(base)] != base:
            raise ValueError(f"label {l!r} does not extend prompt {p!r} token-wise")
        seqs.append(full)
        targets.append([-100] * len(base) + full[len(base):])
    batch = pad([Encoded(s, []) for s in seqs], pad_id, "right")
    width = batch.input_ids.shape[1]
    y = torch.full((len(seqs), width), -100, dtype=torch.long)
    for i, t in enumerate(targets):
        y[i, : len(t)] = torch.tensor(t)
    return batch, y


def finetune(module, tokenizer, prompts: Sequence[str], labels: Sequence[str], label_set: Sequence[str],
             method: str, config: FinetuneConfig, seed: int, pad_id: int = 0):
    """A fine-tuned copy of ``module`` (the original is untouched) and a dict of training facts."""
    if method not in ("full", "lora"):
        raise ValueError(f"unknown fine-tuning method {method!r}; use 'full' or 'lora'")
    torch.manual_seed(seed)
    model = copy.deepcopy(module)
    if method == "lora":
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=config.lora_r, lora_alpha=config.lora_alpha, lora_dropout=0.0,
                                                 target_modules=lora_targets(module), fan_in_fan_out=_fan_in_fan_out(module)))
    if method == "full" and config.freeze_embeddings:
        for m in model.modules():
            if isinstance(m, torch.nn.Embedding):
                m.weight.requires_grad_(False)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=config.lora_lr if method == "lora" else config.lr, weight_decay=config.weight_decay)
    batch, y = _examples(tokenizer, prompts, labels, pad_id)
    gold = torch.tensor([list(label_set).index(l) for l in labels])
    gen = torch.Generator().manual_seed(seed)
    n = len(prompts)
    train_acc, step = 0.0, 0
    model.train()
    for step in range(1, config.max_steps + 1):
        idx = torch.randperm(n, generator=gen)[: config.batch_size]
        out = model(input_ids=batch.input_ids[idx], attention_mask=batch.attention_mask[idx],
                    position_ids=batch.position_ids[idx], labels=y[idx])
        opt.zero_grad(set_to_none=True)
        out.loss.backward()
        opt.step()
        if step % config.check_every == 0 or step == config.max_steps:
            model.eval()
            pred = candidate_logprobs(model, tokenizer, list(prompts), list(label_set), pad_id=pad_id).argmax(-1)
            model.train()
            train_acc = (pred == gold).float().mean().item()
            if train_acc == 1.0:
                break
    model.eval()
    return model, {"steps": step, "train_accuracy": train_acc, "final_loss": out.loss.item(),
                   "trainable_params": sum(p.numel() for p in params)}


def _fan_in_fan_out(module) -> bool:
    return getattr(getattr(module, "config", None), "model_type", None) == "gpt2"  # GPT-2 uses Conv1D
