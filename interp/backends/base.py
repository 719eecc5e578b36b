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
from collections.abc import Callable, Mapping
from typing import ClassVar

import torch
from jaxtyping import Float, Int

from ..architectures import arch_info, architecture_for
from ..sites import HEAD_SITES, is_standard, parse_site, site_name
from ..trainable import LoraSpec

Tensor = torch.Tensor
HookFn = Callable[[Tensor], Tensor | None]


class Backend(ABC):
    """Runs one model with hooks at named sites. Subclasses: one per interpretability library."""

    name: ClassVar[str]
    n_layers: int
    d_model: int
    n_heads: int
    #: key/value heads (fewer than ``n_heads`` under grouped-query attention)
    n_kv_heads: int
    d_head: int
    #: the standard site names (see :mod:`interp.sites`) this model provides, in execution order
    sites: list[str]

    # loading: each backend says which specs it accepts ------------------------------------------
    #: the kinds of in-memory object :meth:`load` accepts, in words (for error messages)
    accepts_description: ClassVar[str]

    @classmethod
    @abstractmethod
    def accepts(cls, spec) -> bool:
        """Whether :meth:`load` can build this backend from the in-memory object ``spec``."""

    @classmethod
    def owns(cls, spec) -> bool:
        """Whether ``spec`` is this backend's own kind of object (a ``TransformerBridge`` for
        TransformerLens), which :func:`interp.load_model` then loads here when no backend is named."""
        return False

    @classmethod
    @abstractmethod
    def load(cls, spec, tokenizer=None, device=None, dtype=None) -> tuple[Backend, object, str]:
        """``(backend, tokenizer, default name)`` for an in-memory object :meth:`accepts`."""

    @classmethod
    @abstractmethod
    def load_directory(cls, path, tokenizer=None, device=None, dtype=None) -> tuple[Backend, object]:
        """``(backend, tokenizer)`` for a local HuggingFace model directory."""

    @property
    @abstractmethod
    def module(self) -> torch.nn.Module:
        """The ``torch.nn.Module`` holding the weights (for ``.parameters()``, ``.to()``, training)."""

    @property
    def accepted_sites(self) -> list[str]:
        """Every name ``run`` accepts (a superset of :attr:`sites` for some backends)."""
        return self.sites

    def site_width(self, site: str) -> int | None:
        """How many values ``site`` holds per token (a per-head site: heads x ``d_head``); None for
        a name outside the site vocabulary (a bridge's own hook point), whose shape is not known."""
        if not is_standard(site):
            return None
        kind = parse_site(site).kind
        if kind in ("attn.hook_q", "attn.hook_z"):
            return self.n_heads * self.d_head
        if kind in HEAD_SITES:  # keys and values: one per key/value head
            return getattr(self, "n_kv_heads", self.n_heads) * self.d_head
        return self.d_model

    def unsendable(self) -> str | None:
        """Why a handle on this backend cannot travel to a worker process by reference (loaded
        again there from its source), or None where it can."""
        return None

    @abstractmethod
    def run(
        self,
        input_ids: Int[Tensor, "batch pos"],
        attention_mask: Int[Tensor, "batch pos"] | None = None,
        position_ids: Int[Tensor, "batch pos"] | None = None,
        hooks: Mapping[str, HookFn] | None = None,
        stop_early: bool = False,
    ) -> Float[Tensor, "batch pos vocab"] | None:
        """Forward pass with ``hooks`` attached; returns the logits (or, for a model with no
        head, the last hidden states). ``stop_early=True``: the caller only reads the hooked
        sites, so the pass stops right after the last of them (:meth:`last_site`) and returns None."""

    @staticmethod
    def last_site(hooks: Mapping[str, HookFn] | None) -> str | None:
        """The hooked site a forward pass reaches last (None for no hooks, or when one of them is
        not a standard site, whose place in the pass is unknown): with ``stop_early=True`` nothing
        after it runs, not even the unembedding."""
        if not hooks:
            return None
        if not all(is_standard(name) for name in hooks):
            return None  # a bridge's own hook name has no known place in the pass: run it all
        return max(hooks, key=lambda name: parse_site(name).order)

    def forward(
        self,
        input_ids: Int[Tensor, "batch pos"],
        attention_mask: Int[Tensor, "batch pos"] | None = None,
        position_ids: Int[Tensor, "batch pos"] | None = None,
        positions: Int[Tensor, " kept"] | None = None,
    ) -> Float[Tensor, "batch kept vocab"]:
        """The forward pass without hooks, differentiable (training runs through it). ``positions``
        (sequence indices, the same for every row): the logits at those positions only, in that
        order; None: at every position."""
        return at_positions(self.run(input_ids, attention_mask, position_ids, None), positions)

    def final_hidden(
        self,
        input_ids: Int[Tensor, "batch pos"],
        attention_mask: Int[Tensor, "batch pos"] | None = None,
        position_ids: Int[Tensor, "batch pos"] | None = None,
    ) -> Float[Tensor, "batch pos d_model"]:
        """The last block's residual output, differentiable: read at its site during a forward pass."""
        out = {}
        site = site_name("resid_post", self.n_layers - 1)

        def keep(act):
            out["h"] = act

        self.run(input_ids, attention_mask, position_ids, {site: keep})
        return out["h"]

    def input_embeddings(self) -> Float[Tensor, "vocab d_model"]:
        """The token embedding matrix (the parameter, not a copy)."""
        return self._require_hf("input_embeddings").get_input_embeddings().weight

    @abstractmethod
    def trainable_copy(self, lora: LoraSpec | None = None, freeze_embeddings: bool = False) -> Backend:
        """A backend of the same kind over a deep copy of the weights, trainable in full (the
        embedding tables frozen if asked) or through LoRA adapters (see :mod:`interp.trainable`)."""

    @property
    def model_type(self) -> str | None:
        """The HuggingFace ``model_type`` (``"gpt2"``, ``"llama"``, ...), when there is one."""
        return getattr(getattr(self.hf_model, "config", None), "model_type", None)

    @property
    def hf_model(self) -> torch.nn.Module | None:
        """The HuggingFace model holding the weights, when there is one."""
        return None

    @property
    def source_module(self) -> torch.nn.Module | None:
        """The HuggingFace model as the user gave it, never modified by this backend (what another
        backend wraps when the same handle is loaded again through it); None if there is none."""
        return self.hf_model

    def _require_hf(self, what: str) -> torch.nn.Module:
        if self.hf_model is None:
            raise TypeError(
                f"{what} needs the underlying HuggingFace model, which this {self.name} model does not have"
            )
        return self.hf_model

    @torch.no_grad()
    def head_output_weights(self, layer: int) -> Float[Tensor, "head d_head d_model"]:
        """``W_O`` of every head at ``layer``, read off the module that consumes ``z`` (GPT-2's
        ``c_proj``, Llama's ``o_proj``, ...): its weight (Linear or Conv1D; a view where the layout
        already matches), else the module applied to the identity."""
        w = self._linear_part("attn.hook_z", layer, self.n_heads * self.d_head)  # [head * d_head, d_model]
        return w.reshape(self.n_heads, self.d_head, -1).contiguous()

    @torch.no_grad()
    def head_input_weights(self, layer: int, which: str) -> Float[Tensor, "head d_model d_head"]:
        """``W_Q``, ``W_K`` or ``W_V`` (``which`` is ``"q"``, ``"k"`` or ``"v"``) of every head at
        ``layer`` (of every key/value head under grouped-query attention): the linear part of the
        map from ``attn.hook_in`` to the head's query, key or value, read off the projection
        module (GPT-2's fused ``c_attn``, Llama's ``q_proj``, ...) as :meth:`head_output_weights`
        reads it and split into heads as the site does; a copy of this slice only."""
        if which not in ("q", "k", "v"):
            raise ValueError(f"which must be 'q', 'k' or 'v', got {which!r}")
        hf = self._require_hf("head_input_weights")
        raw = self._linear_part(f"attn.hook_{which}", layer, self.d_model)  # [d_model, out]
        codec = architecture_for(hf.config).locations[f"attn.hook_{which}"].codec
        return codec.get(raw, arch_info(hf.config)).permute(1, 0, 2).contiguous()  # only this slice copied

    def attention_norm(self, layer: int) -> Callable[[Tensor], Tensor]:
        """The map from ``blocks.{layer}.hook_resid_pre`` to ``blocks.{layer}.attn.hook_in`` (the
        block's first norm; the identity in a post-norm block), callable outside a forward pass
        on any ``[..., d_model]`` tensor: the norm module's own ``forward``, called without its
        hooks (so no interpretability library sees it as a step of the model)."""
        return self._norm(architecture_for(self._require_hf("attention_norm").config).attn_norm, layer)

    def mlp_norm(self, layer: int) -> Callable[[Tensor], Tensor]:
        """The map from the residual the MLP reads (``hook_resid_mid`` in a sequential block,
        ``hook_resid_pre`` in a parallel one) to ``blocks.{layer}.mlp.hook_in``: the block's MLP
        norm, called as :meth:`attention_norm` is."""
        arch = architecture_for(self._require_hf("mlp_norm").config)
        if arch.mlp_norm is None:
            raise ValueError(
                f"a {arch.family} block is post-norm: its MLP reads LayerNorm(resid_pre + attn_out), which is "
                "not a function of one residual site, so there is no norm to apply to a patched residual "
                "(restrict edge patching's receivers to heads and the logits)"
            )
        return self._norm(arch.mlp_norm, layer)

    def _norm(self, path: str | None, layer: int) -> Callable[[Tensor], Tensor]:
        if path is None:
            return _identity
        return norm_function(_submodule(self.hf_model, path.format(l=layer)))

    def _linear_part(self, site_kind: str, layer: int, d_in: int) -> Float[Tensor, "d_in d_out"]:
        """The matrix of the linear module that reads (``attn.hook_z``) or writes (q/k/v) the site:
        a view of its weight for Linear and Conv1D (the callers copy the part they keep: at
        GPT-2-small shape the q/k/v matrices of every layer are 85 MB, 254 MB if each fused
        ``c_attn`` were copied whole), else ``module(I) - module(0)``."""
        hf = self._require_hf("reading weights")
        module = _submodule(hf, architecture_for(hf.config).locations[site_kind].module.format(l=layer))
        weight = getattr(module, "weight", None)
        if weight is not None and weight.device.type == "meta":  # offloaded: its hooks load it on a call
            weight = None
        if weight is not None and type(module) is torch.nn.Linear:  # y = x W^T + b, without a product
            return weight.detach().T
        if weight is not None and type(module).__name__ == "Conv1D" and weight.shape[0] == d_in:  # y = x W + b
            return weight.detach()
        p = next(module.parameters())
        eye = torch.eye(d_in, device=p.device, dtype=p.dtype)
        return module(eye) - module(torch.zeros(1, d_in, device=p.device, dtype=p.dtype))

    @torch.no_grad()
    def attention_pattern(
        self, input_ids: Tensor, attention_mask: Tensor | None, layer: int | list[int]
    ) -> Float[Tensor, "batch head query key"] | Float[Tensor, "layer batch head query key"]:
        """Attention probabilities at ``layer`` from the model's own (eager) attention; for a list
        of layers, all of them from one forward pass, stacked on a new first axis."""
        hf = self._require_hf("attention_pattern")
        before = getattr(hf.config, "_attn_implementation", None)
        if before != "eager":
            hf.set_attn_implementation("eager")
        try:
            out = hf(input_ids=input_ids, attention_mask=attention_mask, output_attentions=True)
        finally:
            if before not in (None, "eager"):
                hf.set_attn_implementation(before)
        return torch.stack([out.attentions[x] for x in layer]) if isinstance(layer, list) else out.attentions[layer]


def norm_function(module: torch.nn.Module) -> Callable[[Tensor], Tensor]:
    """A norm module's ``forward`` as a plain function, bypassing ``__call__`` and so its hooks. A
    TransformerBridge component (with hook points, whose sites such as ``hook_resid_mid`` an
    analyzer may be hooking) stands for the layer it wraps, so that layer is called."""
    module = getattr(module, "original_component", None) or module
    forward = type(module).forward
    return lambda x: forward(module, x)


def _submodule(hf: torch.nn.Module, path: str) -> torch.nn.Module:
    """A module by its path relative to the base model (as the architecture table writes it)."""
    prefix = getattr(hf, "base_model_prefix", "")
    base = prefix + "." if prefix and hasattr(hf, prefix) else ""
    return hf.get_submodule(base + path)


def _identity(x: Tensor) -> Tensor:
    return x


def forward_takes(hf_model: torch.nn.Module, argument: str) -> bool:
    """Whether ``hf_model.forward`` has a parameter named ``argument``."""
    try:
        return argument in inspect.signature(hf_model.forward).parameters
    except (TypeError, ValueError):
        return False


def at_positions(
    logits: Float[Tensor, "batch pos vocab"], positions: Tensor | None
) -> Float[Tensor, "batch kept vocab"]:
    """``logits`` at sequence ``positions`` (all of them for None)."""
    return logits if positions is None else logits[:, positions.to(logits.device)]


def logits_of(output) -> Tensor:
    if isinstance(output, Tensor):
        return output
    for attr in ("logits", "last_hidden_state"):
        value = getattr(output, attr, None)
        if value is not None:
            return value
    return output[0]
