"""Weights the analyzers need beyond activations: each head's output projection ``W_O``.

A head's write into the residual stream is ``z_h @ W_O[h]``. ``W_O`` is read off the module that
consumes ``z`` (GPT-2's ``attn.c_proj``, Llama's ``o_proj``, ...) by applying it to the identity,
so it works for ``Linear`` and GPT-2's ``Conv1D`` alike, and for both backends (the
``TransformerBridge`` runs the same HuggingFace modules).
"""
from __future__ import annotations

import torch
from jaxtyping import Float

from interp.architectures import architecture_for

Tensor = torch.Tensor


def hf_model_of(model) -> torch.nn.Module:
    hf = getattr(model.backend, "hf_model", None)
    if hf is None:
        raise TypeError(f"{model.backend_name} model has no underlying HuggingFace model to read weights from")
    return hf


@torch.no_grad()
def head_output_weights(model, layer: int) -> Float[Tensor, "head d_head d_model"]:
    """``W_O`` of every head at ``layer``: ``[n_heads, d_head, d_model]``."""
    hf = hf_model_of(model)
    arch = architecture_for(hf.config)
    prefix = getattr(hf, "base_model_prefix", "")
    base = prefix + "." if prefix and hasattr(hf, prefix) else ""
    loc = arch.locations["attn.hook_z"]
    module = hf.get_submodule(base + loc.module.format(l=layer))
    p = next(module.parameters())
    d_in = model.n_heads * model.d_head
    eye = torch.eye(d_in, device=p.device, dtype=p.dtype)
    w = module(eye) - module(torch.zeros(1, d_in, device=p.device, dtype=p.dtype))
    return w.reshape(model.n_heads, model.d_head, -1)
