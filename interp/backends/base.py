"""The ``Backend`` interface: one way to run a model and read or write its sites.

A backend owns a model and answers two questions: what are its dimensions and sites, and what
are its logits when hook functions are attached at some sites. A hook function receives the
site's activation in canonical shape (``[batch, pos, d_model]``, or ``[batch, pos, head, d_head]``
for per-head sites) and returns ``None`` to leave it unchanged (a *read*) or a tensor of the same
shape to replace it (a *write*). Capture, patching and Jacobians are all built on this single
primitive, so they run unchanged on every backend.
"""
from __future__ import annotations

import inspect
from abc import ABC, abstractmethod
from typing import Callable, ClassVar, Mapping, Optional

import torch
from jaxtyping import Float, Int

Tensor = torch.Tensor
HookFn = Callable[[Tensor], Optional[Tensor]]


class Backend(ABC):
    """Runs one model with hooks at named sites. Subclasses: one per interpretability library."""

    name: ClassVar[str]
    n_layers: int
    d_model: int
    n_heads: int
    d_head: int
    #: the standard site names (see :mod:`interp.sites`) this model provides, in execution order
    sites: list[str]

    @property
    @abstractmethod
    def module(self) -> torch.nn.Module:
        """The ``torch.nn.Module`` holding the weights (for ``.parameters()``, ``.to()``, training)."""

    @property
    def accepted_sites(self) -> list[str]:
        """Every name ``run`` accepts (a superset of :attr:`sites` for some backends)."""
        return self.sites

    @abstractmethod
    def run(
        self,
        input_ids: Int[Tensor, "batch pos"],
        attention_mask: Optional[Int[Tensor, "batch pos"]] = None,
        position_ids: Optional[Int[Tensor, "batch pos"]] = None,
        hooks: Optional[Mapping[str, HookFn]] = None,
    ) -> Float[Tensor, "batch pos vocab"]:
        """Forward pass with ``hooks`` attached; returns the logits (or, for a model with no
        head, the last hidden states)."""


def accepts_position_ids(hf_model: torch.nn.Module) -> bool:
    try:
        return "position_ids" in inspect.signature(hf_model.forward).parameters
    except (TypeError, ValueError):
        return False


def logits_of(output) -> Tensor:
    if isinstance(output, Tensor):
        return output
    for attr in ("logits", "last_hidden_state"):
        value = getattr(output, attr, None)
        if value is not None:
            return value
    return output[0]
