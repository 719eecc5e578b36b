"""Reading HuggingFace model directories (shared by the backends)."""

from __future__ import annotations

from pathlib import Path

import torch

# transformers is imported in the functions that need it: it is slow to import and a handle on an
# in-memory model never needs these


def is_causal(config) -> bool:
    from transformers import MODEL_FOR_CAUSAL_LM_MAPPING

    return type(config) in MODEL_FOR_CAUSAL_LM_MAPPING


def tokenizer_of(path: str | Path, tokenizer=None):
    from transformers import AutoTokenizer

    return tokenizer if tokenizer is not None else AutoTokenizer.from_pretrained(path)


def hf_from_directory(path: str | Path, dtype: torch.dtype | None = None) -> torch.nn.Module:
    """The model class its ``config.json`` names (else the causal-LM or base auto class), eager
    attention (so attention patterns can be read), float32 unless ``dtype`` says otherwise."""
    import transformers
    from transformers import AutoConfig, AutoModel, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(path)
    cls = None
    for arch in getattr(config, "architectures", None) or []:
        cls = getattr(transformers, arch, None)
        if cls is not None:
            break
    if cls is None:
        cls = AutoModelForCausalLM if is_causal(config) else AutoModel
    return cls.from_pretrained(path, attn_implementation="eager", dtype=dtype or torch.float32)


def place(module: torch.nn.Module, device=None, dtype=None) -> torch.nn.Module:
    """``module`` moved to ``device`` / ``dtype`` (when given), in eval mode."""
    if device is not None:
        module.to(device)
    if dtype is not None:
        module.to(dtype)
    return module.eval()


def name_of(module) -> str:
    return getattr(getattr(module, "config", None), "_name_or_path", "") or type(module).__name__
