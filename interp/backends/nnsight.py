"""The nnsight backend: any HuggingFace model wrapped with ``nnsight.NNsight``.

Sites are located through :mod:`interp.architectures`; within one trace they are visited in
execution order (nnsight 0.8 requires it), and several sites computed by the same module (GPT-2's
fused q/k/v) share one read and one write.
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Mapping
from pathlib import Path

import torch

from ..architectures import arch_info, architecture_for
from ..sites import parse_site, sort_by_execution, standard_sites
from ..trainable import LoraSpec, add_lora
from ..trainable import freeze_embeddings as freeze_embedding_tables
from .base import Backend, HookFn, Tensor, forward_takes, logits_of
from .hf import hf_from_directory, is_causal, name_of, place, tokenizer_of

_SERVED = frozenset({"output", "input", "inputs", "source"})


class NNsightBackend(Backend):
    name = "nnsight"
    accepts_description = "a HuggingFace model (with tokenizer=)"

    @classmethod
    def accepts(cls, spec) -> bool:
        return isinstance(spec, torch.nn.Module)

    @classmethod
    def load(cls, spec, tokenizer=None, device=None, dtype=None):
        if hasattr(spec, "original_model") and hasattr(spec, "hook_dict"):  # a TransformerBridge
            raise ValueError(
                "a TransformerBridge has rewritten the HuggingFace model it wraps (its q/k/v and hook "
                "points), so nnsight cannot hook that model reliably; load the HuggingFace model itself or "
                "its directory with backend='nnsight' (a handle from interp.load_model(..., "
                "backend='transformer_lens') can be passed: it remembers its source)"
            )
        if tokenizer is None:
            raise ValueError("a model passed as a module needs its tokenizer: load_model(module, tokenizer=...)")
        return cls(place(spec, device, dtype)), tokenizer, name_of(spec)

    @classmethod
    def load_directory(cls, path, tokenizer=None, device=None, dtype=None):
        return cls(place(hf_from_directory(path, dtype), device)), tokenizer_of(path, tokenizer)

    @classmethod
    def load_remote(cls, spec: str, tokenizer=None):
        """A handle whose traces run on NDIF: meta weights here, the real model there."""
        if not isinstance(spec, str) or Path(spec).expanduser().exists():
            raise ValueError(f"remote=True needs a hub name NDIF hosts (e.g. 'meta-llama/Llama-3.1-70B'), got {spec!r}")
        from nnsight import TransformersModel
        from transformers import AutoConfig

        tok = tokenizer_of(spec, tokenizer)
        config = AutoConfig.from_pretrained(spec)
        kwargs = {"task": "text-generation"} if is_causal(config) else {}
        envoy = TransformersModel(spec, tokenizer=tok, **kwargs)
        return cls(envoy._module, envoy=envoy, remote=True), tok

    def __init__(self, hf_model: torch.nn.Module, envoy=None, remote: bool = False):
        """``envoy``: an nnsight model wrapping ``hf_model`` (default: ``NNsight(hf_model)``);
        ``remote=True`` runs every trace on NDIF (the envoy must be remotable, e.g. a
        ``nnsight.TransformersModel`` built from a hub name)."""
        from nnsight import NNsight  # imported when first used (libraries load in the backend that needs them)

        self._hf_model = hf_model
        self.remote = remote
        config = hf_model.config
        self.arch = architecture_for(config)
        self.info = arch_info(config)
        prefix = getattr(hf_model, "base_model_prefix", "")
        self._base = prefix + "." if prefix and hasattr(hf_model, prefix) else ""
        self.n_layers = len(hf_model.get_submodule(self._base + self.arch.layers))
        self.n_heads = self.info.n_heads
        self.n_kv_heads = self.info.n_kv_heads
        self.d_head = self.info.d_head
        self.d_model = getattr(config, "hidden_size", None) or config.n_embd
        self.sites = standard_sites(self.n_layers, set(self.arch.locations))
        self._pass_position_ids = forward_takes(hf_model, "position_ids")
        self._keeps_logits = forward_takes(hf_model, "logits_to_keep")
        with warnings.catch_warnings():  # BERT's `.output` submodules: handled in _envoy_at
            warnings.filterwarnings("ignore", message=".*which nnsight already serves.*")
            self.envoy = envoy if envoy is not None else NNsight(hf_model)

    @property
    def hf_model(self) -> torch.nn.Module:
        return self._hf_model

    @property
    def module(self) -> torch.nn.Module:
        return self.hf_model

    def trainable_copy(self, lora: LoraSpec | None = None, freeze_embeddings: bool = False) -> NNsightBackend:
        if self.remote:
            raise ValueError("a remote (NDIF) model cannot be fine-tuned here; load its weights locally")
        hf = copy.deepcopy(self._hf_model)
        if lora is not None:
            add_lora(hf, lora, self.model_type)
        elif freeze_embeddings:
            freeze_embedding_tables(hf)
        return NNsightBackend(hf)

    def final_hidden(self, input_ids, attention_mask=None, position_ids=None):
        """The base model's ``last_hidden_state`` (no trace needed: nothing else is read)."""
        if self.remote:
            return super().final_hidden(input_ids, attention_mask, position_ids)
        kwargs = self._inputs(input_ids, attention_mask, position_ids)
        base = self._hf_model.get_submodule(self._base[:-1]) if self._base else self._hf_model
        return base(**kwargs).last_hidden_state

    def _envoy_at(self, path: str):
        envoy = self.envoy
        for part in path.split("."):
            if part.isdigit():
                envoy = envoy[int(part)]
            elif part in _SERVED:  # a submodule named like an nnsight attribute is served as E_<name>
                envoy = getattr(envoy, "E_" + part)
            else:
                envoy = getattr(envoy, part)
        return envoy

    def _groups(self, hooks: Mapping[str, HookFn]):
        """Hooks grouped by (module path, input/output), in execution order."""
        groups: dict[tuple[str, str], list] = {}
        for name in sort_by_execution(list(hooks)):
            site = parse_site(name)
            loc = self.arch.location(name)
            path = self._base + loc.module.format(l=site.layer)
            groups.setdefault((path, loc.io), []).append((loc.codec, hooks[name]))
        return groups

    def _inputs(self, input_ids, attention_mask=None, position_ids=None) -> dict:
        """The HuggingFace model's keyword arguments for a batch."""
        kwargs = {"input_ids": input_ids}
        if attention_mask is not None:
            kwargs["attention_mask"] = attention_mask
        if position_ids is not None and self._pass_position_ids:
            kwargs["position_ids"] = position_ids
        return kwargs

    def forward(self, input_ids, attention_mask=None, position_ids=None, positions=None):
        """The plain module's forward; ``positions`` passed on as HuggingFace's ``logits_to_keep``
        where the model takes it (its head then reads out at those positions only, rather than at
        every position and sliced after). A model that takes the argument but returns another
        number of positions (an older head that reads it as a count) is run whole and sliced."""
        if positions is not None and not self.remote and self._keeps_logits:
            kept = positions.to(input_ids.device)
            logits = logits_of(
                self._hf_model(**self._inputs(input_ids, attention_mask, position_ids), logits_to_keep=kept)
            )
            if logits.shape[1] == len(positions):
                return logits
        return super().forward(input_ids, attention_mask, position_ids, positions)

    def run(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        position_ids: Tensor | None = None,
        hooks: Mapping[str, HookFn] | None = None,
        stop_early: bool = False,
    ) -> Tensor | None:
        kwargs = self._inputs(input_ids, attention_mask, position_ids)
        if not hooks and not self.remote:  # nothing to read or write: the plain module, no trace
            return logits_of(self._hf_model(**kwargs))
        groups = self._groups(hooks or {})
        info = self.info
        if self.remote:
            kwargs["remote"] = True
        stop = stop_early and not self.remote and bool(hooks)
        with self.envoy.trace(**kwargs) as tracer:
            for (path, io), items in groups.items():
                envoy = self._envoy_at(path)
                raw = envoy.output if io == "output" else envoy.input
                changed = False
                for codec, fn in items:
                    new = fn(codec.get(raw, info))
                    if new is not None:
                        raw = codec.put(raw, new, info)
                        changed = True
                if changed:
                    if io == "output":
                        envoy.output = raw
                    else:
                        envoy.input = raw
            if stop:  # the last site has been read: the model runs no further
                tracer.stop()
            else:
                output = self.envoy.output.save()
        return None if stop else logits_of(output)
