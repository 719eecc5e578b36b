"""Sparse autoencoders: a dictionary of features for one site, read from sae-lens's own folder format.

A sparse autoencoder (SAE) rewrites an activation ``x`` (``[..., d_in]``) as a sparse, non-negative
code ``f`` over ``d_sae`` learned directions (the *features*, usually many more than ``d_in``) and
reads it back::

    x_in = x - b_dec              (when apply_b_dec_to_input; else x_in = x)
    pre  = x_in @ W_enc + b_enc                                        [..., d_sae]
    f    = ReLU(pre)                               "standard"
         = ReLU(pre) * (pre > threshold)           "jumprelu" (a learned threshold per feature)
         = ReLU of the k largest entries of pre, 0 elsewhere
                                                   "topk"
    x_hat = f @ W_dec + b_dec                                          [..., d_in]

and ``x - x_hat`` is its *error term*. A top-k SAE saved with ``rescale_acts_by_decoder_norm``
ranks ``pre * ||W_dec[j]||`` and decodes ``(f / ||W_dec||) @ W_dec``; an SAE on per-head attention
outputs (``reshape_activations: "hook_z"``) reads ``[..., head, d_head]`` flattened to
``head * d_head`` and writes its reconstruction back in that shape. These are the formulas of
sae-lens 6 (``StandardSAE``, ``TopKSAE``, ``JumpReLUSAE``), which ``tests/test_sae.py`` checks
against outputs that sae-lens itself computed.

**The format** (what ``SAE.save_model`` writes and ``SAE.load_from_disk`` reads, one folder per SAE,
also the layout of sae-lens-native releases on the HuggingFace hub)::

    cfg.json                  {"architecture": "jumprelu", "d_in": 2304, "d_sae": 16384,
                               "dtype": "float32", "apply_b_dec_to_input": false,
                               "normalize_activations": "none", "reshape_activations": "none",
                               "metadata": {"hook_name": "blocks.12.hook_resid_post", ...}, ...}
    sae_weights.safetensors   W_enc [d_in, d_sae], b_enc [d_sae], W_dec [d_sae, d_in], b_dec [d_in]
                              (+ threshold [d_sae] for jumprelu; the top-k's k is in cfg.json)
    sparsity.safetensors      optional: {"sparsity": log10 of each feature's firing rate}

Configs written before sae-lens 6 (``hook_point``, ``activation_fn_str``, no ``architecture``) are
renamed as sae-lens renames them (``handle_pre_6_0_config``: its defaults, and its ``metadata``
gathered from the top-level keys), and an all-ones ``scaling_factor`` that SAEs of that era saved
is dropped, as sae-lens drops it. Training architectures save as one of the three (sae-lens saves a
BatchTopK SAE as ``jumprelu``). What this reader refuses, with a message saying why and what to do,
before any weight is read (from ``cfg.json`` and the names in the weights file's header): other
architectures (``gated``, transcoders, matching pursuit: load them with sae-lens, see below),
per-input normalization (``layer_norm``, ``constant_norm_rescale``), a training checkpoint whose
activation scaling is not yet folded in, a ``dtype`` sae-lens does not know, and weights missing or
unexpected; then, once read, weights of the wrong shape and a ``scaling_factor`` other than ones. An
SAE on one head (``hook_head_index``) is read, and refused where it would be attached
(:func:`interp.sae_sites.attach_sae`).

**Why not sae-lens itself?** sae-lens 6 requires TransformerLens < 4 (it imports
``transformer_lens.HookedTransformer``, which TransformerLens 4 removed; sae-lens issue #738), and
this toolkit runs on TransformerLens 4, so ``import sae_lens`` fails here. Reading its format needs
only ``json`` and ``safetensors``; an SAE object from an environment where sae-lens does import (or
any SAE of your own with ``W_enc``, ``b_enc``, ``W_dec``, ``b_dec``) is taken by :func:`as_sae`.

>>> sae = load_sae("path/to/sae_folder")                 # or load_sae("org/repo", "folder")
>>> f = sae.encode(x)                                     # [..., d_sae]
>>> x_hat = sae.decode(f)                                 # [..., d_in]

Attaching an SAE to a model, so that its features are sites: :mod:`interp.sae_sites`.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import torch
from jaxtyping import Float
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from .models import SnapshotNotFound, hub_snapshot
from .results import write_json

Tensor = torch.Tensor

#: the architectures this reader computes (sae-lens 6's inference SAEs of those names)
ARCHITECTURES = ("standard", "topk", "jumprelu")
CFG_FILENAME = "cfg.json"
WEIGHTS_FILENAME = "sae_weights.safetensors"
SPARSITY_FILENAME = "sparsity.safetensors"
#: sae-lens 6's inference SAE applies no normalization for these (the trainer folds the scaling
#: into the weights before saving); the other modes normalize each input by its own statistics
_NO_RUNTIME_NORMALIZATION = ("none", "expected_average_only_in", "covariance_whitening")
#: what a folder holds when a training checkpoint's scaling is not folded into its weights
_UNFOLDED_SCALING = ("activation_scaler.json", "activation_whitening.safetensors")
#: the sae-lens release whose format :func:`save_sae` writes (and the tests check :func:`load_sae` against)
SAE_LENS_FORMAT = "6.54.12"
#: the dtypes sae-lens reads (its ``DTYPE_MAP``; ``"torch.float32"`` is read as ``"float32"``)
_DTYPES = {"float32": torch.float32, "float64": torch.float64, "float16": torch.float16, "bfloat16": torch.bfloat16}
#: sae-lens 6's pre-6 renames and the keys it gathers into ``metadata`` (``handle_pre_6_0_config``)
_PRE_6_RENAMES = {"hook_point": "hook_name", "hook_point_head_index": "hook_head_index"}
_PRE_6_RENAMES["activation_fn_str"] = "activation_fn"
_METADATA_KEYS = (
    "model_name", "hook_name", "model_class_name", "hook_head_index", "model_from_pretrained_kwargs",
    "prepend_bos", "exclude_special_tokens", "neuronpedia_id", "context_size", "seqpos_slice", "dataset_path",
    "sae_lens_version", "sae_lens_training_version", "hook_name_out", "hook_head_index_out", "hf_hook_name",
    "hf_hook_name_out",
)  # fmt: skip
#: a weight SAEs saved before sae-lens 6 may hold; all ones, it changes nothing and is dropped
_SCALING_FACTOR = "scaling_factor"


class SAEFormatError(ValueError):
    """An SAE folder, config or object that this reader cannot take (the message says what to do)."""


class SparseAutoencoder(torch.nn.Module):
    """An SAE's weights and its encode/decode (the module docstring gives the formulas).

    Build one with :func:`load_sae` (a sae-lens folder), :func:`as_sae` (an object or a dict of
    tensors) or directly from tensors. The weights (and the log sparsities) are buffers (an SAE
    here is read, not trained): ``.to(device)`` moves them.

    ``hook_name``: the site it reads, in TransformerLens' hook names (``blocks.1.hook_resid_post``),
    as its config says; ``config``: the config as sae-lens reads it (a pre-6 config renamed, its
    ``metadata`` gathered); ``log_sparsity``: the saved log10 firing rates, if the folder had them.
    """

    W_enc: Float[Tensor, "d_in d_sae"]
    b_enc: Float[Tensor, " d_sae"]
    W_dec: Float[Tensor, "d_sae d_in"]
    b_dec: Float[Tensor, " d_in"]

    def __init__(
        self,
        W_enc: Float[Tensor, "d_in d_sae"],
        b_enc: Float[Tensor, " d_sae"],
        W_dec: Float[Tensor, "d_sae d_in"],
        b_dec: Float[Tensor, " d_in"],
        *,
        architecture: str = "standard",
        threshold: Float[Tensor, " d_sae"] | None = None,
        k: int | None = None,
        apply_b_dec_to_input: bool = True,
        rescale_acts_by_decoder_norm: bool = False,
        reshape_activations: str = "none",
        hook_name: str | None = None,
        config: Mapping[str, Any] | None = None,
        log_sparsity: Float[Tensor, " d_sae"] | None = None,
    ):
        super().__init__()
        if architecture not in ARCHITECTURES:
            raise SAEFormatError(_unknown_architecture(architecture))
        tensors = {"W_enc": W_enc, "b_enc": b_enc, "W_dec": W_dec, "b_dec": b_dec}
        for name, t in tensors.items():
            if not isinstance(t, Tensor):
                raise SAEFormatError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if W_enc.dim() != 2:
            raise SAEFormatError(f"W_enc must be [d_in, d_sae], got shape {tuple(W_enc.shape)}")
        d_in, d_sae = W_enc.shape
        expected = {"b_enc": (d_sae,), "W_dec": (d_sae, d_in), "b_dec": (d_in,)}
        if architecture == "jumprelu":
            if threshold is None:
                raise SAEFormatError("a jumprelu SAE needs its threshold ([d_sae]); none was given")
            tensors["threshold"] = threshold
            expected["threshold"] = (d_sae,)
        elif threshold is not None:
            raise SAEFormatError(f"a threshold is a jumprelu SAE's weight; this SAE is {architecture!r}")
        for name, shape in expected.items():
            if tuple(tensors[name].shape) != shape:
                raise SAEFormatError(
                    f"{name} has shape {tuple(tensors[name].shape)}, expected {shape} for W_enc of shape "
                    f"{(d_in, d_sae)} ([d_in, d_sae]); W_dec is [d_sae, d_in] (transpose a [d_in, d_sae] decoder)"
                )
        if architecture == "topk":
            if not isinstance(k, int) or not 1 <= k <= d_sae:
                raise SAEFormatError(f"a topk SAE needs k, an int from 1 to d_sae={d_sae}; got {k!r}")
        elif k is not None:
            raise SAEFormatError(f"k is a topk SAE's setting; this SAE is {architecture!r}")
        if rescale_acts_by_decoder_norm and architecture != "topk":
            raise SAEFormatError("rescale_acts_by_decoder_norm is a topk SAE's setting")
        if reshape_activations not in ("none", "hook_z"):
            raise SAEFormatError(f"reshape_activations must be 'none' or 'hook_z', got {reshape_activations!r}")
        if log_sparsity is not None and tuple(log_sparsity.shape) != (d_sae,):
            raise SAEFormatError(f"the sparsity file holds shape {tuple(log_sparsity.shape)}, expected ({d_sae},)")
        dtype = W_enc.dtype
        for name, t in tensors.items():
            self.register_buffer(name, t.detach().to(dtype))
        if "threshold" not in tensors:
            self.register_buffer("threshold", None)
        # not a weight (not in the state dict, nor in save_sae's weights file), but moved with them
        sparsity = None if log_sparsity is None else log_sparsity.detach().to(W_enc.device)
        self.register_buffer("log_sparsity", sparsity, persistent=False)
        self.architecture = architecture
        self.k = k
        self.apply_b_dec_to_input = bool(apply_b_dec_to_input)
        self.rescale_acts_by_decoder_norm = bool(rescale_acts_by_decoder_norm)
        self.reshape_activations = reshape_activations
        self.hook_name = hook_name
        self.config = dict(config or {})
        #: d_head of a ``hook_z`` SAE's input, learned from its first input (as sae-lens does) or set
        #: when it is attached to a model; decode needs it to write ``[..., head, d_head]`` back
        self.d_head: int | None = None
        self._digest: tuple[tuple, str] | None = None

    @property
    def d_in(self) -> int:
        return int(self.W_enc.shape[0])

    @property
    def d_sae(self) -> int:
        return int(self.W_enc.shape[1])

    @property
    def has_pre_activation(self) -> bool:
        """Whether its code goes through pre-activations (:meth:`pre_activation`); not so for an SAE
        object of one's own, whose ``encode`` computes the features."""
        return True

    @property
    def dtype(self) -> torch.dtype:
        """The dtype it computes in (its weights'; its input is cast to it, as sae-lens does)."""
        return self.W_enc.dtype

    # the computation, in sae-lens's steps (its hook points sit between them) -------------------
    def encode(
        self, x: Float[Tensor, "*batch d_in"] | Float[Tensor, "*batch head d_head"]
    ) -> Float[Tensor, "*batch d_sae"]:
        """Feature activations of ``x`` (``[..., head, d_head]`` for a ``hook_z`` SAE), in the SAE's dtype."""
        return self.features(self.sae_input(x))

    def decode(
        self, f: Float[Tensor, "*batch d_sae"]
    ) -> Float[Tensor, "*batch d_in"] | Float[Tensor, "*batch head d_head"]:
        """The reconstruction ``f @ W_dec + b_dec`` (``[..., head, d_head]`` for a ``hook_z`` SAE)."""
        return self.site_shaped(self.reconstruct(f))

    def forward(
        self, x: Float[Tensor, "*batch d_in"] | Float[Tensor, "*batch head d_head"]
    ) -> Float[Tensor, "*batch d_in"] | Float[Tensor, "*batch head d_head"]:
        """The reconstruction of ``x``: ``decode(encode(x))``."""
        return self.decode(self.encode(x))

    def sae_input(
        self, x: Float[Tensor, "*batch d_in"] | Float[Tensor, "*batch head d_head"]
    ) -> Float[Tensor, "*batch d_in"]:
        """``x`` as the SAE reads it: in its dtype, a ``hook_z`` input flattened to ``head * d_head``
        (sae-lens's ``hook_sae_input``, before ``b_dec`` is subtracted)."""
        if self.reshape_activations == "hook_z":
            if x.dim() < 2 or x.shape[-2] * x.shape[-1] != self.d_in:
                raise ValueError(
                    f"this hook_z SAE reads [..., head, d_head] with head * d_head = d_in = {self.d_in}, "
                    f"got shape {tuple(x.shape)}"
                )
            self.d_head = int(x.shape[-1])
            return x.to(self.dtype).flatten(-2)
        if x.shape[-1] != self.d_in:
            raise ValueError(
                f"this SAE reads [..., d_in={self.d_in}] activations ({self.hook_name or 'its site'}), got shape "
                f"{tuple(x.shape)}"
            )
        return x.to(self.dtype)

    def pre_activation(self, sae_in: Float[Tensor, "*batch d_in"]) -> Float[Tensor, "*batch d_sae"]:
        """``(sae_in - b_dec) @ W_enc + b_enc`` (without ``- b_dec`` unless ``apply_b_dec_to_input``):
        sae-lens's ``hook_sae_acts_pre``."""
        sae_in = sae_in - self.b_dec if self.apply_b_dec_to_input else sae_in
        return sae_in @ self.W_enc + self.b_enc

    def activation(self, pre: Float[Tensor, "*batch d_sae"]) -> Float[Tensor, "*batch d_sae"]:
        """The features from the pre-activations (ReLU, JumpReLU or top-k: the module docstring)."""
        if self.architecture == "standard":
            return torch.relu(pre)
        if self.architecture == "jumprelu":
            return torch.relu(pre) * (pre > self.threshold).to(pre.dtype)
        if self.rescale_acts_by_decoder_norm:
            pre = pre * self.W_dec.norm(dim=-1)
        values, indices = torch.topk(pre, k=self.k, dim=-1, sorted=False)
        return torch.zeros_like(pre).scatter(-1, indices, values.relu())

    def features(self, sae_in: Float[Tensor, "*batch d_in"]) -> Float[Tensor, "*batch d_sae"]:
        """The features of an input as :meth:`sae_input` gives it."""
        return self.activation(self.pre_activation(sae_in))

    def reconstruct(self, f: Float[Tensor, "*batch d_sae"]) -> Float[Tensor, "*batch d_in"]:
        """``f @ W_dec + b_dec``, flat (sae-lens's ``hook_sae_recons``), in the SAE's dtype."""
        if f.shape[-1] != self.d_sae:
            raise ValueError(f"decode takes [..., d_sae={self.d_sae}] feature activations, got shape {tuple(f.shape)}")
        f = f.to(self.dtype)
        if self.rescale_acts_by_decoder_norm:
            f = f * (1 / self.W_dec.norm(dim=-1))  # as sae-lens computes it (bit for bit)
        return f @ self.W_dec + self.b_dec

    def site_shaped(self, out: Float[Tensor, "*batch d_in"]) -> Tensor:
        """A flat ``[..., d_in]`` output in the site's shape: ``[..., head, d_head]`` for a ``hook_z`` SAE."""
        if self.reshape_activations != "hook_z":
            return out
        if self.d_head is None:
            raise ValueError(
                "this hook_z SAE does not know d_head yet: encode an input [..., head, d_head] first, "
                "or set sae.d_head (attach_sae sets it from the model)"
            )
        return out.unflatten(-1, (self.d_in // self.d_head, self.d_head))

    # identity ------------------------------------------------------------------------------------
    def digest(self) -> str:
        """A short hash of the SAE's architecture, settings and weights (keys results computed on
        it): the weights' bytes as stored, hashed once and kept until a weight is replaced, moved
        or changed in place."""
        state = sorted(self.state_dict().items())
        settings = [self.architecture, self.k, self.apply_b_dec_to_input, self.rescale_acts_by_decoder_norm]
        settings.append(self.reshape_activations)
        key = (
            tuple(settings),
            tuple((n, t.data_ptr(), t._version, t.dtype, str(t.device), tuple(t.shape)) for n, t in state),
        )
        if self._digest is None or self._digest[0] != key:
            h = hashlib.sha256(json.dumps(settings).encode())
            for name, t in state:
                h.update(f"{name}:{tuple(t.shape)}:{t.dtype}".encode())
                h.update(t.detach().reshape(-1).contiguous().view(torch.uint8).cpu().numpy().data)
            self._digest = (key, h.hexdigest()[:16])
        return self._digest[1]

    def extra_repr(self) -> str:
        extra = f", k={self.k}" if self.k is not None else ""
        return f"{self.architecture!r}, d_in={self.d_in}, d_sae={self.d_sae}{extra}, hook_name={self.hook_name!r}"


class _OwnEncoder(SparseAutoencoder):
    """A user's SAE object that computes its own code: its ``encode`` (and ``decode``, if it has
    one) are called; its tensors give the sizes and the digest."""

    def __init__(self, obj, W_enc, b_enc, W_dec, b_dec, hook_name: str | None):
        super().__init__(W_enc, b_enc, W_dec, b_dec, apply_b_dec_to_input=False, hook_name=hook_name)
        self.architecture = f"own ({type(obj).__name__})"
        self.own = obj  # an nn.Module is registered as a submodule, so .to() moves it too

    @property
    def has_pre_activation(self) -> bool:
        return False

    def features(self, sae_in):
        return self.own.encode(sae_in)

    def pre_activation(self, sae_in):
        raise SAEFormatError(
            f"this SAE computes its code with its own encode ({self.architecture}), so its pre-activations "
            "(hook_sae_acts_pre) are not known; read its features (hook_sae_acts_post)"
        )

    def reconstruct(self, f):
        if hasattr(self.own, "decode"):
            return self.own.decode(f)
        return super().reconstruct(f)


def load_sae(
    spec: str | os.PathLike,
    folder: str | None = None,
    *,
    device: str | torch.device = "cpu",
    dtype: torch.dtype | None = None,
) -> SparseAutoencoder:
    """Read an SAE saved in sae-lens's format (see the module docstring).

    ``spec``: a folder holding ``cfg.json`` and ``sae_weights.safetensors`` (what sae-lens's
    ``SAE.save_model`` writes), or a HuggingFace repository that stores such folders, with
    ``folder`` the one to read (``load_sae("jbloom/GPT2-Small-SAEs-Reformatted",
    "blocks.8.hook_resid_pre")``): read from the local cache, downloaded where the hub is reachable.
    ``dtype``: of the weights (default: the config's).
    """
    path = _local_folder(spec, folder)
    cfg_path = path / CFG_FILENAME
    if not cfg_path.exists():
        raise SAEFormatError(
            f"{path} has no {CFG_FILENAME}: an SAE folder in sae-lens's format holds {CFG_FILENAME} and "
            f"{WEIGHTS_FILENAME} (what sae-lens's SAE.save_model writes). Point to that folder"
            + (" (give folder= for a folder inside it)" if any(path.glob(f"*/{CFG_FILENAME}")) else "")
        )
    try:
        cfg = json.loads(cfg_path.read_text())
    except json.JSONDecodeError as e:
        raise SAEFormatError(f"{cfg_path} is not valid JSON: {e}") from e
    settings = sae_settings(cfg)  # refuses what it cannot compute, before any weight is read
    if settings["normalize_activations"] != "none":
        unfolded = [name for name in _UNFOLDED_SCALING if (path / name).exists()]
        if unfolded:
            raise SAEFormatError(
                f"{path} is a training checkpoint whose activation scaling ({settings['normalize_activations']}, "
                f"in {', '.join(unfolded)}) is not folded into its weights, and sae-lens's load_from_disk would "
                "ignore it; load the SAE that training saves at its end (scaling folded), or fold it with "
                "sae-lens's fold_activation_norm_scaling_factor in an environment where sae-lens imports"
            )
    weights_path = path / WEIGHTS_FILENAME
    if not weights_path.exists():
        raise SAEFormatError(f"{path} has {CFG_FILENAME} but no {WEIGHTS_FILENAME}")
    with safe_open(str(weights_path), framework="pt", device=str(device)) as f:
        names = list(f.keys())
        _check_weight_names(settings["architecture"], names, str(weights_path))  # from the header alone
        weights = {name: f.get_tensor(name) for name in names}
    sparsity = None
    if (path / SPARSITY_FILENAME).exists():
        sparsity = load_file(str(path / SPARSITY_FILENAME), device=str(device)).get("sparsity")
    return from_config(cfg, weights, dtype=dtype, device=device, log_sparsity=sparsity)


def from_config(
    cfg: Mapping[str, Any],
    state_dict: Mapping[str, Tensor],
    hook_name: str | None = None,
    *,
    dtype: torch.dtype | None = None,
    device: str | torch.device | None = None,
    log_sparsity: Tensor | None = None,
) -> SparseAutoencoder:
    """An SAE from a sae-lens config dictionary and its weights (a sae-lens ``SAE``'s
    ``cfg.to_dict()`` and ``state_dict()``, or a folder's ``cfg.json`` and weights file): the one
    place an SAE is built from sae-lens's format, every check made here. ``hook_name``: where it
    reads, in place of the config's; ``dtype``: of the weights (default: the config's)."""
    settings = sae_settings(cfg)
    architecture = settings["architecture"]
    _check_weight_names(architecture, state_dict.keys(), "the weights")
    dtype = dtype or settings["dtype"]
    t = {n: torch.as_tensor(v).detach().to(device=device, dtype=dtype) for n, v in state_dict.items()}
    if _SCALING_FACTOR in t:  # as sae-lens's read_sae_components_from_disk (SAELens PR #95)
        scale = t.pop(_SCALING_FACTOR)
        if not torch.allclose(scale, torch.ones_like(scale)):
            raise SAEFormatError(
                f"the weights hold a {_SCALING_FACTOR} other than ones (a pre-6 fine-tuning scale, "
                f"min {scale.min().item():.4g}, max {scale.max().item():.4g}), which sae-lens 6 cannot load "
                "either and this reader does not compute; fold it into W_dec in an environment of your own, or use "
                "an SAE saved without it"
            )
    shape = (settings["d_in"], settings["d_sae"])
    if tuple(t["W_enc"].shape) != shape:
        raise SAEFormatError(
            f"W_enc has shape {tuple(t['W_enc'].shape)}, but the config says d_in={shape[0]}, d_sae={shape[1]} "
            "(W_enc is [d_in, d_sae])"
        )
    return SparseAutoencoder(
        t["W_enc"],
        t["b_enc"],
        t["W_dec"],
        t["b_dec"],
        architecture=architecture,
        threshold=t.get("threshold"),
        k=settings["k"],
        apply_b_dec_to_input=settings["apply_b_dec_to_input"],
        rescale_acts_by_decoder_norm=settings["rescale_acts_by_decoder_norm"],
        reshape_activations=settings["reshape_activations"],
        hook_name=hook_name or settings["hook_name"],
        config=settings["config"],
        log_sparsity=log_sparsity,
    )


def save_sae(sae: SparseAutoencoder, folder: str | os.PathLike) -> Path:
    """Write ``sae`` in sae-lens 6's format (``cfg.json``, ``sae_weights.safetensors`` and, if it has
    them, the log sparsities), which sae-lens's ``SAE.load_from_disk`` and :func:`load_sae` read
    (``tests/test_sae.py`` checks sae-lens's own outputs on folders this wrote). Its config keeps
    the ``metadata`` the SAE was read with (model name, dataset, training version, ...), with the
    hook name it reads and :data:`SAE_LENS_FORMAT` as the version of the format. Returns the folder."""
    if isinstance(sae, _OwnEncoder):
        raise SAEFormatError(
            f"this SAE computes its code with its own encode ({sae.architecture}), which sae-lens's format cannot "
            "hold; build a SparseAutoencoder of a standard, topk or jumprelu architecture from its tensors"
        )
    dtype = next((name for name, d in _DTYPES.items() if d == sae.dtype), None)
    if dtype is None:
        raise SAEFormatError(f"sae-lens's format holds weights of {', '.join(_DTYPES)}; this SAE's are {sae.dtype}")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    metadata = dict(sae.config.get("metadata") or {})
    metadata["sae_lens_version"] = SAE_LENS_FORMAT  # the format written (read back as sae-lens 6's)
    metadata.setdefault("sae_lens_training_version", SAE_LENS_FORMAT)  # sae-lens's default when unknown
    metadata["hook_name"] = sae.hook_name
    cfg: dict[str, Any] = {"d_in": sae.d_in, "d_sae": sae.d_sae, "dtype": dtype, "device": "cpu"}
    cfg |= {"apply_b_dec_to_input": sae.apply_b_dec_to_input, "normalize_activations": "none"}
    cfg |= {"reshape_activations": sae.reshape_activations, "metadata": metadata}
    if sae.architecture == "topk":
        cfg |= {"k": sae.k, "rescale_acts_by_decoder_norm": sae.rescale_acts_by_decoder_norm}
    cfg["architecture"] = sae.architecture
    weights = {name: t.detach().to("cpu").contiguous() for name, t in sae.state_dict().items()}
    save_file(weights, str(folder / WEIGHTS_FILENAME))
    write_json(cfg, folder / CFG_FILENAME)
    if sae.log_sparsity is not None:
        save_file({"sparsity": sae.log_sparsity.detach().to("cpu").contiguous()}, str(folder / SPARSITY_FILENAME))
    return folder


def sae_config(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """A ``cfg.json`` as sae-lens 6 reads it: a config older than sae-lens 6 (no ``sae_lens_version``
    of 6 or later, at the top or in ``metadata``) renamed and completed as sae-lens's
    ``handle_pre_6_0_config`` does it, with its ``metadata`` gathered from the top-level keys."""
    cfg = dict(cfg)
    version = cfg.get("sae_lens_version") or (cfg.get("metadata") or {}).get("sae_lens_version")
    if version and _major(version) >= 6:
        return cfg
    new = {_PRE_6_RENAMES.get(k, k): v for k, v in cfg.items()}  # a renamed key replaces one of that name
    new.setdefault("prepend_bos", True)
    new.setdefault("apply_b_dec_to_input", True)
    new.setdefault("finetuning_scaling_factor", False)
    new.setdefault("sae_lens_training_version", None)
    new.setdefault("activation_fn", "relu")
    new.setdefault("architecture", "standard")
    new.setdefault("reshape_activations", "hook_z" if "hook_z" in str(new.get("hook_name") or "") else "none")
    if new.get("activation_fn") == "topk" and (new.get("activation_fn_kwargs") or {}).get("k") is not None:
        new["architecture"], new["k"] = "topk", new["activation_fn_kwargs"]["k"]
    if isinstance(new.get("normalize_activations"), bool):
        new["normalize_activations"] = "expected_average_only_in" if new["normalize_activations"] else "none"
    if new.get("normalize_activations") is None:
        new["normalize_activations"] = "none"
    new.setdefault("device", "cpu")
    new["metadata"] = {k: v for k, v in new.items() if k in _METADATA_KEYS}
    return new


def sae_settings(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """What encode and decode need from an sae-lens ``cfg.json`` (read as :func:`sae_config` reads
    it; ``"config"``: that reading), or an :class:`SAEFormatError` that says what is missing or not
    supported."""
    cfg = sae_config(cfg)
    metadata = dict(cfg.get("metadata") or {})
    architecture = cfg.get("architecture")
    if architecture is None:
        raise SAEFormatError("the config names no architecture (sae-lens 6 writes 'architecture' in cfg.json)")
    if architecture not in ARCHITECTURES:
        raise SAEFormatError(_unknown_architecture(architecture))
    activation = cfg.get("activation_fn", "relu")
    if activation not in ("relu", "topk"):  # sae-lens 6 would compute ReLU in its place, silently
        raise SAEFormatError(
            f"this pre-6 sae-lens config uses activation_fn={activation!r}; this reader computes ReLU and top-k "
            "SAEs of that era"
        )
    missing = [key for key in ("d_in", "d_sae") if cfg.get(key) is None]
    if architecture == "topk" and cfg.get("k") is None:
        missing.append("k")
    if missing:
        raise SAEFormatError(
            f"the config of this {architecture} SAE lacks {missing} (sae-lens 6 writes them in cfg.json)"
        )
    normalize = cfg.get("normalize_activations") or "none"
    if normalize not in _NO_RUNTIME_NORMALIZATION:
        raise SAEFormatError(
            f"normalize_activations={normalize!r} normalizes every input by its own statistics and undoes it on the "
            "reconstruction, which this reader does not compute; use an SAE saved with 'none' (or with its "
            "scaling folded into the weights)"
        )
    return {
        "architecture": architecture,
        "d_in": int(cfg["d_in"]),
        "d_sae": int(cfg["d_sae"]),
        "k": int(cfg["k"]) if architecture == "topk" else None,
        "dtype": _dtype(cfg.get("dtype", "float32")),
        "apply_b_dec_to_input": bool(cfg.get("apply_b_dec_to_input", True)),
        "rescale_acts_by_decoder_norm": bool(cfg.get("rescale_acts_by_decoder_norm", False)),
        "reshape_activations": cfg.get("reshape_activations") or "none",
        "normalize_activations": normalize,
        "hook_name": metadata.get("hook_name"),
        "hook_head_index": metadata.get("hook_head_index"),
        "config": cfg,
    }


def as_sae(obj, hook_name: str | None = None) -> SparseAutoencoder:
    """An SAE from what a user holds:

    - a :class:`SparseAutoencoder` (returned as it is) or a folder in sae-lens's format (:func:`load_sae`);
    - a sae-lens ``SAE`` object, from an environment where sae-lens imports (anything with
      ``cfg.to_dict()`` and ``state_dict()``): read as :func:`load_sae` reads its saved folder;
    - a mapping of tensors ``{W_enc, b_enc, W_dec, b_dec}`` (+ ``threshold`` for a JumpReLU SAE): a
      ``standard`` (or ``jumprelu``) SAE that subtracts ``b_dec`` from its input, as sae-lens's
      default does; for other settings build :class:`SparseAutoencoder` from the tensors directly;
    - an SAE object of your own with tensors ``W_enc`` ``[d_in, d_sae]``, ``b_enc``, ``W_dec``
      ``[d_sae, d_in]``, ``b_dec`` and an ``encode`` method: its own ``encode`` (and ``decode``, if it
      has one; else ``f @ W_dec + b_dec``) compute the code.

    ``hook_name``: the site it reads (TransformerLens' hook names), where the object does not say.
    """
    if isinstance(obj, SparseAutoencoder):
        return obj
    if isinstance(obj, (str, os.PathLike)):
        return load_sae(obj)
    cfg = getattr(obj, "cfg", None)
    if callable(getattr(cfg, "to_dict", None)) and callable(getattr(obj, "state_dict", None)):
        return from_config(cfg.to_dict(), obj.state_dict(), hook_name=hook_name)
    if isinstance(obj, Mapping):
        architecture = "jumprelu" if "threshold" in obj else "standard"
        _check_weight_names(architecture, obj.keys(), "the dictionary")
        W_enc = torch.as_tensor(obj["W_enc"])
        if W_enc.dim() != 2:
            raise SAEFormatError(f"W_enc must be [d_in, d_sae], got shape {tuple(W_enc.shape)}")
        cfg = {"architecture": architecture, "d_in": W_enc.shape[0], "d_sae": W_enc.shape[1]}
        cfg |= {"dtype": str(W_enc.dtype), "apply_b_dec_to_input": True, "normalize_activations": "none"}
        cfg["metadata"] = {"hook_name": hook_name, "sae_lens_version": SAE_LENS_FORMAT}
        return from_config(cfg, obj, hook_name=hook_name)
    names = ("W_enc", "b_enc", "W_dec", "b_dec")
    has = [n for n in names if isinstance(getattr(obj, n, None), Tensor)]
    if len(has) == len(names) and callable(getattr(obj, "encode", None)):
        return _OwnEncoder(obj, *(getattr(obj, n).detach() for n in names), hook_name=hook_name)
    raise SAEFormatError(
        f"cannot read an SAE from a {type(obj).__name__}: pass a folder in sae-lens's format, a sae-lens SAE, "
        "a dict {W_enc, b_enc, W_dec, b_dec}, or an object with those tensors and an encode method"
        + (f" (this one has only {has})" if has else "")
    )


def _check_weight_names(architecture: str, names: Iterable[str], where: str) -> None:
    """Refuse weights that are not exactly an ``architecture`` SAE's (an all-ones ``scaling_factor``
    of a pre-6 SAE is let through, for :func:`from_config` to drop)."""
    names = set(names)
    wanted = ["W_enc", "b_enc", "W_dec", "b_dec"] + (["threshold"] if architecture == "jumprelu" else [])
    missing = [n for n in wanted if n not in names]
    unexpected = sorted(names - set(wanted) - {_SCALING_FACTOR})
    if missing or unexpected:
        raise SAEFormatError(
            f"{where} do not hold a {architecture} SAE's weights: "
            + "; ".join(
                ([f"missing {missing}"] if missing else []) + ([f"unexpected {unexpected}"] if unexpected else [])
            )
            + f". A {architecture} SAE saved by sae-lens 6 holds exactly {wanted}."
        )


def _dtype(name: str | torch.dtype) -> torch.dtype:
    """A config's ``dtype`` as sae-lens reads it (its ``str_to_dtype``), or a clear refusal."""
    if isinstance(name, torch.dtype):
        return name
    key = str(name).removeprefix("torch.")
    if key not in _DTYPES:
        raise SAEFormatError(
            f"dtype {name!r} is not one sae-lens reads ({', '.join(_DTYPES)}); correct cfg.json's dtype, or pass "
            "load_sae(..., dtype=) to read the weights in one of them"
        )
    return _DTYPES[key]


def _local_folder(spec: str | os.PathLike, folder: str | None) -> Path:
    """A local folder for ``spec`` (a folder, or a hub repository's ``folder``)."""
    path = Path(spec).expanduser()
    if path.exists():
        return path / folder if folder else path
    if str(spec).startswith((".", "/", "~")) or folder is None:
        raise SAEFormatError(
            f"no SAE folder at {path}"
            + (
                ""
                if folder
                else " (for an SAE on the HuggingFace hub, give its repository and folder: load_sae(repo, folder))"
            )
        )
    patterns = [f"{folder}/{CFG_FILENAME}", f"{folder}/{WEIGHTS_FILENAME}", f"{folder}/{SPARSITY_FILENAME}"]
    try:
        return hub_snapshot(str(spec), f"{folder}/{CFG_FILENAME}", patterns) / folder
    except SnapshotNotFound as missing:
        raise SAEFormatError(
            f"no SAE folder {folder!r} of the hub repository {spec!r} here: {'; '.join(missing.reasons)}. On a "
            f"machine with hub access run `hf download {spec} --include '{folder}/*' --local-dir ./sae`, copy that "
            f"folder here and pass its path: load_sae('./sae/{folder}')."
        ) from missing


def _major(version: str) -> int:
    try:
        return int(str(version).split(".")[0])
    except ValueError:
        return 0


def _unknown_architecture(architecture) -> str:
    return (
        f"SAE architecture {architecture!r} is not one this reader computes ({', '.join(ARCHITECTURES)}: the "
        "inference SAEs sae-lens 6 saves by default). Load it with sae-lens in an environment where it imports "
        "(TransformerLens < 4) and save activations or features there, or convert it to one of these"
    )
