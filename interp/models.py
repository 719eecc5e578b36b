"""Model handles: one object per model, whatever library runs it.

``load_model(spec, backend=...)`` accepts

- ``"world"``: the embedded default, a small LM the project pretrains on a synthetic world
  (see :mod:`interp.world`), shipped inside the package;
- ``"induction"``: a two-layer attention-only model with induction heads (see
  :mod:`circuits.induction`), shipped for the circuit tools;
- a local HuggingFace directory (``config.json`` + weights + tokenizer);
- a hub name (``"gpt2"``, ``"EleutherAI/pythia-70m"``) whose weights are in the local
  HuggingFace cache (or downloadable, on a machine with hub access);
- a ``TransformerBridge`` or a HuggingFace ``PreTrainedModel`` already in memory (pass
  ``tokenizer=`` with the latter);
- a ``TransformerBridgeConfig`` or dict (``backend="transformer_lens"`` only): a randomly
  initialized TransformerLens-native model, via ``TransformerBridge.boot_native``.

and returns a :class:`Model`: tokenizer, dimensions, the list of valid sites, and
:meth:`Model.run` (forward pass with read/write hooks at sites), the single primitive every
analyzer uses.
"""
from __future__ import annotations

import copy
import hashlib
import os
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

import torch

from .backends import BACKENDS, Backend, HookFn, backend_class
from .prompts import as_prompts
from .sites import validate_sites
from .tokens import Batch, Encoded, encode, pad


class ModelNotFoundError(FileNotFoundError):
    pass


class Model:
    """A loaded model behind one backend. Build it with :func:`load_model`."""

    def __init__(self, backend: Backend, tokenizer, name: str = "model"):
        self.backend = backend
        self.tokenizer = tokenizer
        self.name = name
        #: where the weights were loaded from (a directory), so workers can load it again; None in memory
        self.source: Optional[str] = None
        self._fingerprint: Optional[str] = None

    # dimensions and sites -------------------------------------------------------------------
    @property
    def n_layers(self) -> int:
        return self.backend.n_layers

    @property
    def d_model(self) -> int:
        return self.backend.d_model

    @property
    def n_heads(self) -> int:
        return self.backend.n_heads

    @property
    def d_head(self) -> int:
        return self.backend.d_head

    @property
    def sites(self) -> list[str]:
        return list(self.backend.sites)

    @property
    def backend_name(self) -> str:
        return self.backend.name

    @property
    def module(self) -> torch.nn.Module:
        return self.backend.module

    @property
    def device(self) -> torch.device:
        device = next(self.module.parameters()).device
        return torch.device("cpu") if device.type == "meta" else device  # remote models: inputs stay here

    @property
    def dtype(self) -> torch.dtype:
        return next(self.module.parameters()).dtype

    @property
    def pad_token_id(self) -> int:
        tok = self.tokenizer
        for candidate in (tok.pad_token_id, tok.eos_token_id, tok.unk_token_id):
            if candidate is not None:
                return int(candidate)
        return 0

    @property
    def hf_model(self) -> Optional[torch.nn.Module]:
        """The underlying HuggingFace model (both backends run one), e.g. to fine-tune a copy."""
        return self.backend.hf_model

    def head_output_weights(self, layer: int) -> torch.Tensor:
        """``W_O`` of every head at ``layer``: ``[n_heads, d_head, d_model]``."""
        return self.backend.head_output_weights(layer)

    def attention_pattern(self, inputs, layer: int, padding_side: Optional[str] = None) -> torch.Tensor:
        """Attention probabilities ``[batch, head, query, key]`` at ``layer`` (prompts or a Batch)."""
        batch = inputs if isinstance(inputs, Batch) else self.batch(self.encode(inputs), padding_side)
        dev = self.device
        return self.backend.attention_pattern(batch.input_ids.to(dev), batch.attention_mask.to(dev), layer)

    def resid_site(self, layer: int) -> str:
        return f"blocks.{layer}.hook_resid_post"

    def check_sites(self, sites) -> list[str]:
        """Validate site names (unknown names raise with the nearest valid ones)."""
        return validate_sites(sites, self.backend.accepted_sites)

    # tokenizing and running -----------------------------------------------------------------
    def encode(self, prompts) -> list[Encoded]:
        return encode(self.tokenizer, as_prompts(prompts))

    def batch(self, encoded: Sequence[Encoded], padding_side: Optional[str] = None) -> Batch:
        side = padding_side or getattr(self.tokenizer, "padding_side", None) or "right"
        return pad(encoded, self.pad_token_id, side)

    def run(self, inputs, hooks: Optional[Mapping[str, HookFn]] = None, padding_side: Optional[str] = None) -> torch.Tensor:
        """Forward pass with ``hooks`` (site -> function of the activation returning ``None`` to
        read or a tensor to write). ``inputs``: prompts, or a :class:`~interp.tokens.Batch`."""
        batch = inputs if isinstance(inputs, Batch) else self.batch(self.encode(inputs), padding_side)
        if hooks:
            self.check_sites(list(hooks))
        dev = self.device
        return self.backend.run(
            batch.input_ids.to(dev), batch.attention_mask.to(dev), batch.position_ids.to(dev), hooks
        )

    def read(self, inputs, sites, padding_side: Optional[str] = None) -> dict[str, torch.Tensor]:
        """Full activations ``[batch, pos, ...]`` at ``sites`` for one padded batch of prompts."""
        sites = self.check_sites(sites)
        out: dict[str, torch.Tensor] = {}

        def reader(name):
            def fn(act):
                out[name] = act.detach()

            return fn

        with torch.no_grad():
            self.run(inputs, {s: reader(s) for s in sites}, padding_side)
        return out

    # identity ------------------------------------------------------------------------------
    def fingerprint(self) -> str:
        """A short hash of architecture and weights (a strided sample of every parameter)."""
        if self._fingerprint is None:
            h = hashlib.sha256(type(self.module).__name__.encode())
            for name, p in sorted(self.module.state_dict().items()):
                flat = p.detach().reshape(-1)
                step = max(1, flat.numel() // 4096)
                h.update(f"{name}:{tuple(p.shape)}:{p.dtype}".encode())
                h.update(flat[::step].to(torch.float64).cpu().numpy().tobytes())
            self._fingerprint = h.hexdigest()[:16]
        return self._fingerprint

    def __repr__(self) -> str:
        return (
            f"Model({self.name!r}, backend={self.backend_name!r}, n_layers={self.n_layers}, "
            f"d_model={self.d_model}, n_heads={self.n_heads})"
        )


# loading ---------------------------------------------------------------------------------------
def load_model(
    spec: Any,
    backend: str = "transformer_lens",
    *,
    tokenizer=None,
    device: Optional[str | torch.device] = None,
    dtype: Optional[torch.dtype] = None,
    name: Optional[str] = None,
    remote: bool = False,
) -> Model:
    """Load a model behind ``backend`` (``"transformer_lens"`` or ``"nnsight"``); see module doc.

    ``remote=True`` (nnsight only): ``spec`` is a hub name of a model NDIF hosts; only its
    config and tokenizer are loaded here (weights stay on the meta device) and every forward pass
    (capture, patching, ...) runs remotely (set your key with ``nnsight.CONFIG.set_default_api_key``).
    """
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    if remote:
        return _load_remote(spec, backend, tokenizer, name)
    if isinstance(spec, Model):
        if spec.backend_name == backend:
            return spec
        hf = getattr(spec.backend, "hf_model", None)
        if hf is None:
            raise ValueError(f"this {spec.backend_name} model has no HuggingFace module to re-wrap")
        return load_model(hf, backend, tokenizer=tokenizer or spec.tokenizer, device=device, dtype=dtype, name=name or spec.name)

    from transformer_lens.model_bridge import TransformerBridge

    if isinstance(spec, TransformerBridge):
        tok = tokenizer or spec.tokenizer
        if backend == "transformer_lens":
            return _finish(backend_class(backend)(spec), tok, name or "bridge", device, dtype)
        return load_model(spec.original_model, backend, tokenizer=tok, device=device, dtype=dtype, name=name)

    if _is_config(spec):
        if backend != "transformer_lens":
            raise ValueError(
                "a TransformerBridgeConfig builds a TransformerLens-native model, which only the "
                "transformer_lens backend can run; pass backend='transformer_lens', or build a "
                "HuggingFace model (e.g. GPT2LMHeadModel(config)) for nnsight"
            )
        if tokenizer is None:
            raise ValueError("a model built from a config needs a tokenizer: load_model(config, tokenizer=...)")
        bridge = TransformerBridge.boot_native(spec, tokenizer=_tl_tokenizer(tokenizer), device=device, dtype=dtype)
        return _finish(backend_class(backend)(bridge), tokenizer, name or "native", None, None)

    if isinstance(spec, torch.nn.Module):
        if tokenizer is None:
            raise ValueError(f"a model passed as a module needs its tokenizer: load_model(module, tokenizer=...)")
        if backend == "transformer_lens":
            bridge = TransformerBridge.boot_transformers(
                getattr(spec.config, "_name_or_path", "") or "in-memory",
                hf_model=spec,
                tokenizer=_tl_tokenizer(tokenizer),
                device=device,
            )
            return _finish(backend_class(backend)(bridge), tokenizer, name or _name_of(spec), device, dtype)
        return _finish(backend_class(backend)(spec), tokenizer, name or _name_of(spec), device, dtype)

    if isinstance(spec, (str, os.PathLike)):
        path = resolve_path(spec)
        model = _load_directory(path, backend, tokenizer, device, dtype, name or str(spec))
        model.source = str(path)
        return model

    raise TypeError(
        f"cannot load a model from {type(spec).__name__}; pass 'world', a local directory, a hub "
        "name, a TransformerBridge, a HuggingFace model (with tokenizer=) or a TransformerBridgeConfig"
    )


def resolve_path(spec: str | os.PathLike) -> Path:
    """A local directory for ``spec``: ``"world"``, an existing path, or a cached hub snapshot."""
    if str(spec) == "world":
        from .world.checkpoint import default_checkpoint_dir

        return default_checkpoint_dir()
    if str(spec) == "induction":
        path = Path(__file__).resolve().parent / "checkpoints" / "induction"
        if not (path / "config.json").exists():
            raise ModelNotFoundError(f"the induction-head model is missing from {path}; rebuild it with "
                                     "`interp circuits train-induction --out interp/checkpoints/induction`")
        return path
    path = Path(spec).expanduser()
    if path.exists():
        if not (path / "config.json").exists():
            raise ModelNotFoundError(f"{path} exists but has no config.json; point to a HuggingFace model directory")
        return path
    if str(spec).startswith((".", "/", "~")):
        raise ModelNotFoundError(f"no model directory at {path}")
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(str(spec), local_files_only=True))
    except Exception:
        pass
    if os.environ.get("HF_HUB_OFFLINE", "0") not in ("1", "true", "True"):
        try:
            return Path(snapshot_download(str(spec)))
        except Exception:
            pass
    raise ModelNotFoundError(
        f"no local weights for {str(spec)!r}: it is not a directory, not in the HuggingFace cache, "
        "and the hub cannot be reached. On a machine with hub access run "
        f"`hf download {spec} --local-dir ./{Path(str(spec)).name}`, copy that folder here and pass "
        f"its path: load_model('./{Path(str(spec)).name}')."
    )


def _load_remote(spec, backend: str, tokenizer, name: Optional[str]) -> Model:
    """An nnsight handle whose traces run on NDIF: meta weights here, the real model there."""
    if backend != "nnsight":
        raise ValueError("remote=True needs backend='nnsight' (NDIF runs nnsight traces)")
    if not isinstance(spec, str) or Path(spec).expanduser().exists():
        raise ValueError(f"remote=True needs a hub name NDIF hosts (e.g. 'meta-llama/Llama-3.1-70B'), got {spec!r}")
    from nnsight import TransformersModel
    from transformers import AutoConfig, AutoTokenizer

    tok = tokenizer or AutoTokenizer.from_pretrained(spec)
    config = AutoConfig.from_pretrained(spec)
    task = "text-generation" if _is_causal(config) else None
    envoy = TransformersModel(spec, task=task, tokenizer=tok) if task else TransformersModel(spec, tokenizer=tok)
    model = Model(backend_class(backend)(envoy._module, envoy=envoy, remote=True), tok, name or spec)
    model.source = spec
    return model


def _load_directory(path: Path, backend: str, tokenizer, device, dtype, name: str) -> Model:
    import transformers
    from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, AutoTokenizer

    config = AutoConfig.from_pretrained(path)
    tok = tokenizer or AutoTokenizer.from_pretrained(path)
    if backend == "transformer_lens":
        from transformer_lens.model_bridge import TransformerBridge

        kwargs = {"device": device} if device is not None else {}
        bridge = TransformerBridge.boot_transformers(str(path), dtype=dtype or torch.float32, **kwargs)
        return Model(backend_class(backend)(bridge.eval()), tok, name)
    cls = None
    for arch in getattr(config, "architectures", None) or []:
        cls = getattr(transformers, arch, None)
        if cls is not None:
            break
    if cls is None:
        cls = AutoModelForCausalLM if _is_causal(config) else AutoModel
    hf = cls.from_pretrained(path, attn_implementation="eager", dtype=dtype or torch.float32)
    return _finish(backend_class(backend)(hf), tok, name, device, None)


def _finish(backend: Backend, tokenizer, name: str, device, dtype) -> Model:
    module = backend.module
    if device is not None:
        module.to(device)
    if dtype is not None:
        module.to(dtype)
    module.eval()
    return Model(backend, tokenizer, name)


def _is_causal(config) -> bool:
    from transformers import MODEL_FOR_CAUSAL_LM_MAPPING

    return type(config) in MODEL_FOR_CAUSAL_LM_MAPPING


def _is_config(spec) -> bool:
    if isinstance(spec, dict):
        return True
    try:
        from transformer_lens.config import TransformerBridgeConfig
    except ImportError:  # pragma: no cover
        return False
    return isinstance(spec, TransformerBridgeConfig)


def _tl_tokenizer(tokenizer):
    """A shallow copy TransformerBridge accepts for an in-memory tokenizer (it reads
    ``init_kwargs['name_or_path']`` to rebuild one with a BOS token; we tokenize ourselves)."""
    tok = copy.copy(tokenizer)
    tok.init_kwargs = dict(tokenizer.init_kwargs, name_or_path=tokenizer.name_or_path or "", add_bos_token=True)
    return tok


def _name_of(module) -> str:
    return getattr(getattr(module, "config", None), "_name_or_path", "") or type(module).__name__
