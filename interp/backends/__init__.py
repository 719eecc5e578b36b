"""Backends: one implementation of :class:`Backend` per interpretability library.

Each imports its library when first used, so ``import interp`` stays light.
"""

from __future__ import annotations

from .base import Backend, HookFn, at_positions
from .nnsight import NNsightBackend
from .transformer_lens import TransformerLensBackend

BACKENDS = ("transformer_lens", "nnsight")
#: the backend every entry point uses unless told otherwise (it wraps the user's HuggingFace model
#: as it is; the study's published numbers were measured on it)
DEFAULT_BACKEND = "nnsight"


def backend_class(name: str) -> type[Backend]:
    if name == "transformer_lens":
        return TransformerLensBackend
    if name == "nnsight":
        return NNsightBackend
    raise ValueError(f"unknown backend {name!r}; choose one of {', '.join(BACKENDS)}")


__all__ = ["Backend", "HookFn", "at_positions", "BACKENDS", "DEFAULT_BACKEND", "backend_class"]
