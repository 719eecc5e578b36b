"""Trainable copies of a model: full fine-tuning or LoRA, behind the same handle.

``model.trainable_copy()`` returns a new :class:`~interp.models.Model` on the same backend whose
weights are a deep copy of the original (which is never modified): every parameter trains, except
the embedding tables when ``freeze_embeddings=True`` (token and position embeddings, and a
read-out tied to them). On the TransformerLens backend the copy is a deep copy of the bridge.
``model.trainable_copy(lora=LoraSpec(r=8, alpha=16))`` instead freezes
every original weight and adds low-rank adapters (Hu et al. 2021, via ``peft``) to the linear
layers :func:`lora_targets` names for the architecture. The adapters go on the layers the backend
runs: on nnsight the HuggingFace layers themselves; on TransformerLens the same layers, except that
the bridge runs a fused q/k/v layer (GPT-2's ``c_attn``) as three projections, which then get an
adapter each (three rank-r adapters where HuggingFace has one), so LoRA fine-tunes of fused-q/k/v
models differ between backends; full fine-tunes agree (tested). The copy runs, reads and writes sites
like any handle, so a fine-tune is trained and evaluated through the backend, and its forward
pass is differentiable (:meth:`~interp.models.Model.forward`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .architectures import ARCHITECTURES, MODEL_TYPES

#: HuggingFace ``model_type`` -> the linear layers LoRA adapts, from the architecture table
#: (:attr:`interp.architectures.Architecture.lora`, one entry per family)
LORA_TARGETS: dict[str, list[str]] = {t: list(ARCHITECTURES[a].lora) for t, a in MODEL_TYPES.items()}


@dataclass(frozen=True)
class LoraSpec:
    """Low-rank adapters: rank ``r``, scale ``alpha / r``; ``targets``: module names (default:
    :data:`LORA_TARGETS` for the architecture)."""

    r: int = 8
    alpha: int = 16
    targets: tuple[str, ...] | None = None


def lora_targets(model_type: str | None) -> list[str]:
    """The linear layers LoRA adapts for ``model_type`` (raises with the known ones)."""
    if model_type not in LORA_TARGETS:
        raise ValueError(
            f"no LoRA target modules known for model_type={model_type!r} (known: "
            f"{', '.join(sorted(LORA_TARGETS))}); pass LoraSpec(targets=[...]) or add them to "
            "interp.trainable.LORA_TARGETS"
        )
    return LORA_TARGETS[model_type]


def add_lora(module: torch.nn.Module, spec: LoraSpec, model_type: str | None) -> torch.nn.Module:
    """Adapters injected in place into ``module`` (whose own weights are then frozen)."""
    from peft import LoraConfig, inject_adapter_in_model  # imported when first used: peft is slow to import

    targets = list(spec.targets) if spec.targets else lora_targets(model_type)
    config = LoraConfig(
        r=spec.r, lora_alpha=spec.alpha, lora_dropout=0.0, target_modules=targets, fan_in_fan_out=model_type == "gpt2"
    )  # GPT-2's Conv1D stores W transposed
    module = inject_adapter_in_model(config, module)
    for name, p in module.named_parameters():
        p.requires_grad_("lora_" in name)
    return module


def freeze_embeddings(module: torch.nn.Module) -> None:
    """Freeze every ``nn.Embedding`` table (and so a read-out tied to one)."""
    for m in module.modules():
        if isinstance(m, torch.nn.Embedding):
            m.weight.requires_grad_(False)
