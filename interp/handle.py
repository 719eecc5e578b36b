"""What scoring needs of a model handle: a narrow interface, so that :mod:`interp.scoring` does
not depend on :mod:`interp.models` (which builds a scoring for every handle).

:class:`interp.models.Model` satisfies it; so would any object with these members.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import torch

from .tokens import Batch


class LanguageModel(Protocol):
    """A forward pass, the final hidden state, the input embeddings, the tokenizer and batching."""

    name: str
    model_type: str
    tokenizer: Any
    pad_token_id: int
    device: torch.device

    def forward(self, inputs: Batch, positions: Sequence[int] | torch.Tensor | None = None) -> torch.Tensor:
        """Logits ``[batch, pos, vocab]`` (differentiable); with ``positions`` (sequence indices,
        the same for every row), ``[batch, len(positions), vocab]``: those positions only."""

    def final_hidden(self, inputs: Batch) -> torch.Tensor:
        """The last layer's states ``[batch, pos, d_model]``."""

    def input_embeddings(self) -> torch.Tensor:
        """The input embedding table ``[vocab, d_model]``."""
