"""The TransformerLens backend: a ``TransformerBridge`` whose hook points already carry the
toolkit's site names, so sites map onto hook points one to one."""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping

import torch

from ..architectures import bridge_hook_name
from ..sites import site_name, standard_sites
from ..trainable import LoraSpec, add_lora, lora_targets
from ..trainable import freeze_embeddings as freeze_embedding_tables
from .base import Backend, HookFn, Tensor, forward_takes, norm_function
from .hf import name_of, place, tokenizer_of


class TransformerLensBackend(Backend):
    name = "transformer_lens"
    accepts_description = (
        "a TransformerBridge, a HuggingFace model (with tokenizer=), or a TransformerBridgeConfig "
        "or dict (a randomly initialized TransformerLens-native model, with tokenizer=)"
    )

    @classmethod
    def accepts(cls, spec) -> bool:
        from transformer_lens.config import TransformerBridgeConfig

        return isinstance(spec, (TransformerBridgeConfig, dict, torch.nn.Module))

    @classmethod
    def owns(cls, spec) -> bool:
        if not type(spec).__module__.startswith("transformer_lens"):
            return False  # not ours, and no need to import TransformerLens to know it
        from transformer_lens.model_bridge import TransformerBridge

        return isinstance(spec, TransformerBridge)

    @classmethod
    def load(cls, spec, tokenizer=None, device=None, dtype=None):
        from transformer_lens.config import TransformerBridgeConfig
        from transformer_lens.model_bridge import TransformerBridge

        if isinstance(spec, TransformerBridge):
            return cls(place(spec, device, dtype)), tokenizer or spec.tokenizer, "bridge"
        if tokenizer is None:
            what = (
                "a model built from a config"
                if isinstance(spec, (TransformerBridgeConfig, dict))
                else "a model passed as a module"
            )
            raise ValueError(f"{what} needs its tokenizer: load_model(..., tokenizer=...)")
        if isinstance(spec, (TransformerBridgeConfig, dict)):
            bridge = TransformerBridge.boot_native(spec, tokenizer=_tl_tokenizer(tokenizer), device=device, dtype=dtype)
            return cls(bridge.eval()), tokenizer, "native"
        # the bridge rewrites the modules it wraps (its q/k/v, hook points): it wraps a copy, so the
        # user's model (and any nnsight handle on it) is never changed behind their back
        bridge = TransformerBridge.boot_transformers(
            getattr(spec.config, "_name_or_path", "") or "in-memory",
            hf_model=copy.deepcopy(spec),
            tokenizer=_tl_tokenizer(tokenizer),
            device=device,
        )
        backend = cls(place(bridge, device, dtype))
        backend._source_module = spec
        return backend, tokenizer, name_of(spec)

    @classmethod
    def load_directory(cls, path, tokenizer=None, device=None, dtype=None):
        from transformer_lens.model_bridge import TransformerBridge

        kwargs = {"device": device} if device is not None else {}
        bridge = TransformerBridge.boot_transformers(str(path), dtype=dtype or torch.float32, **kwargs)
        return cls(bridge.eval()), tokenizer_of(path, tokenizer)

    def __init__(self, bridge):
        self.bridge = bridge
        cfg = bridge.cfg
        self.n_layers = int(cfg.n_layers)
        self.d_model = int(cfg.d_model)
        self.n_heads = int(cfg.n_heads)
        self.n_kv_heads = int(getattr(cfg, "n_key_value_heads", None) or cfg.n_heads)
        self.d_head = int(cfg.d_head)
        hook_names = set(bridge.hook_dict)
        if getattr(cfg, "positional_embedding_type", "standard") != "standard":
            # a rotary (or ALiBi) model: the bridge lists hook_pos_embed, but no learned
            # positions are ever added, so it never fires
            hook_names.discard("hook_pos_embed")
        self.sites = [s for s in standard_sites(self.n_layers) if s in hook_names]
        self._accepted = sorted(hook_names)
        original = getattr(bridge, "original_model", None)
        self._model_type = getattr(getattr(original, "config", None), "model_type", None)
        self._pass_position_ids = original is not None and forward_takes(original, "position_ids")

    @property
    def module(self) -> torch.nn.Module:
        return self.bridge

    @property
    def hf_model(self):
        return getattr(self.bridge, "original_model", None)

    @property
    def model_type(self) -> str | None:
        return self._model_type

    @property
    def source_module(self):
        """The user's HuggingFace model this bridge was booted from (a copy of it runs here); None
        for a bridge from a directory (reload it from there) or a native one."""
        return getattr(self, "_source_module", None)

    def trainable_copy(self, lora: LoraSpec | None = None, freeze_embeddings: bool = False) -> TransformerLensBackend:
        bridge = copy.deepcopy(self.bridge, memo=_detached_caches(self.bridge))
        if lora is not None:
            add_lora(bridge, LoraSpec(lora.r, lora.alpha, tuple(self._lora_names(bridge, lora))), self._model_type)
        elif freeze_embeddings:
            freeze_embedding_tables(bridge)
        return TransformerLensBackend(bridge)

    def _lora_names(self, bridge, lora: LoraSpec) -> list[str]:
        """The bridge's names for the layers LoRA adapts: the HuggingFace layers named by the
        targets (``c_attn``, ``q_proj``, ...), as the bridge runs them. The bridge wraps each
        original layer in a component whose ``_original_component`` is the layer itself; a fused
        q/k/v layer (GPT-2's ``c_attn``) it runs as three projections ``attn.q/k/v``, which are
        then adapted separately (three rank-r adapters where HuggingFace has one)."""
        original = getattr(bridge, "original_model", None)
        if original is None or self._model_type is None:
            raise ValueError(
                "LoRA on a TransformerLens-native model (no HuggingFace layers to adapt) is not supported; "
                "fine-tune it in full (lora=None)"
            )
        wanted = set(lora.targets or lora_targets(self._model_type))
        layers = set()
        for name, module in original.named_modules(remove_duplicate=False):
            if any(name == t or name.endswith("." + t) for t in wanted):  # peft's rule: a target is a name suffix
                layer = getattr(module, "_original_component", module)
                if _is_linear(layer):
                    layers.add(id(layer))
        ran = _modules_run(bridge)
        names = []
        for name, module in bridge.named_modules():
            if id(module) in layers and id(module) in ran:
                names.append(name)
            elif id(module) in ran and _is_linear(module) and _SPLIT_QKV.search(name):
                names.append(name)
        if not names:
            raise ValueError(f"no layers named {sorted(wanted)} run in this bridge; pass LoraSpec(targets=[...])")
        return names

    @torch.no_grad()
    def head_output_weights(self, layer: int):
        """``W_O`` of every head at ``layer``: from the HuggingFace layer when the bridge wraps one
        (as the nnsight backend reads it), else from the bridge's own attention (a native model)."""
        if getattr(self.hf_model, "config", None) is not None:  # a native bridge's original_model has none
            return super().head_output_weights(layer)
        return self.bridge.blocks[layer].attn.W_O.detach().reshape(self.n_heads, self.d_head, -1)

    @torch.no_grad()
    def head_input_weights(self, layer: int, which: str):
        """``W_Q``, ``W_K`` or ``W_V`` as the bridge runs them (it splits a fused q/k/v layer into
        three projections, so after fine-tuning a bridge copy these, not the HuggingFace layer's,
        are the weights in use): ``[head, d_model, d_head]``."""
        if which not in ("q", "k", "v"):
            raise ValueError(f"which must be 'q', 'k' or 'v', got {which!r}")
        return getattr(self.bridge.blocks[layer].attn, "W_" + which.upper()).detach()

    def attention_norm(self, layer: int):
        """As the nnsight backend reads it (the HuggingFace layer the bridge runs), or the bridge's
        own ``ln1`` for a native model."""
        if getattr(self.hf_model, "config", None) is not None:
            return super().attention_norm(layer)
        return norm_function(self.bridge.blocks[layer].ln1)

    def mlp_norm(self, layer: int):
        """As the nnsight backend reads it, or the bridge's own ``ln2`` for a native model."""
        if getattr(self.hf_model, "config", None) is not None:
            return super().mlp_norm(layer)
        return norm_function(self.bridge.blocks[layer].ln2)

    @torch.no_grad()
    def attention_pattern(self, input_ids, attention_mask, layer: int | list[int]):
        """The bridge reimplements attention; its ``hook_pattern`` holds the probabilities (a list
        of layers: all from one forward pass, stacked on a new first axis)."""
        names = [site_name("attn.hook_pattern", x) for x in (layer if isinstance(layer, list) else [layer])]
        _, cache = self.bridge.run_with_cache(
            input_ids, attention_mask=attention_mask, names_filter=lambda n: n in names
        )
        return torch.stack([cache[n] for n in names]) if isinstance(layer, list) else cache[names[0]]

    def hook_name(self, site: str) -> str:
        """The bridge hook point that computes ``site`` (the same name but for a few aliases)."""
        return bridge_hook_name(site, self._model_type)

    @property
    def accepted_sites(self) -> list[str]:
        return self._accepted

    def run(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        position_ids: Tensor | None = None,
        hooks: Mapping[str, HookFn] | None = None,
        stop_early: bool = False,
    ) -> Tensor | None:
        fwd_hooks = [(self.hook_name(name), _as_tl_hook(fn)) for name, fn in (hooks or {}).items()]
        kwargs = {}
        if attention_mask is not None:
            kwargs["attention_mask"] = attention_mask
        if position_ids is not None and self._pass_position_ids:
            kwargs["position_ids"] = position_ids
        last = self.last_site(hooks) if stop_early else None
        if last is None:
            return self.bridge.run_with_hooks(input_ids, fwd_hooks=fwd_hooks, **kwargs)
        # everything asked for has been read once the last hooked site has run: a hook after the
        # caller's own there ends the pass (rather than run_with_hooks' stop_at_layer, which not
        # every bridge honours, and which would still run the last block's remainder and the head)
        try:
            self.bridge.run_with_hooks(input_ids, fwd_hooks=fwd_hooks + [(self.hook_name(last), _stop)], **kwargs)
        except _Stopped:
            pass
        return None


class _Stopped(Exception):
    """Raised by :func:`_stop` to end a forward pass early; caught in ``run``."""


def _stop(activation, hook):
    raise _Stopped


def _as_tl_hook(fn: HookFn):
    def hook(activation, hook):  # TransformerLens' hook signature
        return fn(activation)

    return hook


def _is_linear(module) -> bool:
    """A linear layer LoRA can adapt: ``nn.Linear`` or GPT-2's ``Conv1D``."""
    return isinstance(module, torch.nn.Linear) or type(module).__name__ == "Conv1D"


_SPLIT_QKV = re.compile(r"attn\.[qkv]\._original_component$")


def _detached_caches(bridge) -> dict[int, Tensor]:
    """A deepcopy memo standing in detached copies for the tensors a bridge caches from its last
    forward pass (e.g. attention patterns), which deepcopy refuses while they are in a graph."""
    memo = {}
    for module in bridge.modules():
        for value in vars(module).values():
            if isinstance(value, Tensor) and not value.is_leaf:
                memo[id(value)] = value.detach()
    return memo


@torch.no_grad()
def _modules_run(bridge) -> set[int]:
    """Ids of the linear layers a forward pass of ``bridge`` calls."""
    ran: set[int] = set()
    handles = [m.register_forward_hook(lambda mod, i, o: ran.add(id(mod))) for m in bridge.modules() if _is_linear(m)]
    try:
        bridge(torch.zeros(1, 2, dtype=torch.long, device=next(bridge.parameters()).device))
    finally:
        for h in handles:
            h.remove()
    return ran


def _tl_tokenizer(tokenizer):
    """A shallow copy TransformerBridge accepts for an in-memory tokenizer (it reads
    ``init_kwargs['name_or_path']`` to rebuild one with a BOS token; we tokenize ourselves)."""
    tok = copy.copy(tokenizer)
    tok.init_kwargs = dict(tokenizer.init_kwargs, name_or_path=tokenizer.name_or_path or "", add_bos_token=True)
    return tok
