"""The TransformerLens backend: a ``TransformerBridge`` whose hook points already carry the
toolkit's site names, so sites map onto hook points one to one."""
from __future__ import annotations

from typing import Mapping, Optional

import torch

from ..architectures import bridge_hook_name
from ..sites import standard_sites
from .base import Backend, HookFn, Tensor, accepts_position_ids


class TransformerLensBackend(Backend):
    name = "transformer_lens"

    def __init__(self, bridge):
        self.bridge = bridge
        cfg = bridge.cfg
        self.n_layers = int(cfg.n_layers)
        self.d_model = int(cfg.d_model)
        self.n_heads = int(cfg.n_heads)
        self.d_head = int(cfg.d_head)
        hook_names = set(bridge.hook_dict)
        self.sites = [s for s in standard_sites(self.n_layers) if s in hook_names]
        self._accepted = sorted(hook_names)
        original = getattr(bridge, "original_model", None)
        self._model_type = getattr(getattr(original, "config", None), "model_type", None)
        self._pass_position_ids = original is not None and accepts_position_ids(original)

    @property
    def module(self) -> torch.nn.Module:
        return self.bridge

    @property
    def hf_model(self):
        return getattr(self.bridge, "original_model", None)

    @torch.no_grad()
    def attention_pattern(self, input_ids, attention_mask, layer: int):
        """The bridge reimplements attention; its ``hook_pattern`` holds the probabilities."""
        name = f"blocks.{layer}.attn.hook_pattern"
        _, cache = self.bridge.run_with_cache(input_ids, attention_mask=attention_mask, names_filter=lambda n: n == name)
        return cache[name]

    def hook_name(self, site: str) -> str:
        """The bridge hook point that computes ``site`` (the same name but for a few aliases)."""
        return bridge_hook_name(site, self._model_type)

    @property
    def accepted_sites(self) -> list[str]:
        return self._accepted

    def run(
        self,
        input_ids: Tensor,
        attention_mask: Optional[Tensor] = None,
        position_ids: Optional[Tensor] = None,
        hooks: Optional[Mapping[str, HookFn]] = None,
    ) -> Tensor:
        fwd_hooks = [(self.hook_name(name), _as_tl_hook(fn)) for name, fn in (hooks or {}).items()]
        kwargs = {}
        if attention_mask is not None:
            kwargs["attention_mask"] = attention_mask
        if position_ids is not None and self._pass_position_ids:
            kwargs["position_ids"] = position_ids
        return self.bridge.run_with_hooks(input_ids, fwd_hooks=fwd_hooks, **kwargs)


def _as_tl_hook(fn: HookFn):
    def hook(activation, hook):  # TransformerLens' hook signature
        return fn(activation)

    return hook
