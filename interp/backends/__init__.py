"""Backends: one implementation of :class:`Backend` per interpretability library.

Each is imported only when first used, so ``import interp`` stays light.
"""
from __future__ import annotations

from .base import Backend, HookFn

BACKENDS = ("transformer_lens", "nnsight")


def backend_class(name: str) -> type[Backend]:
    if name == "transformer_lens":
        from .transformer_lens import TransformerLensBackend

        return TransformerLensBackend
    if name == "nnsight":
        from .nnsight import NNsightBackend

        return NNsightBackend
    raise ValueError(f"unknown backend {name!r}; choose one of {', '.join(BACKENDS)}")


__all__ = ["Backend", "HookFn", "BACKENDS", "backend_class"]
