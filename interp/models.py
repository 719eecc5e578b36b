"""Model handles: one object per model, whatever library runs it.

``load_model(spec, backend=...)`` accepts

- a registered name (:func:`register_model`): the application registers ``"world"``, the
  embedded default (a small LM the project pretrains on a synthetic world, :mod:`lab.world`),
  and ``"induction"``, a two-layer model with induction heads for the circuit tools;
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

import difflib
import hashlib
import os
from collections.abc import Callable, Mapping, Sequence
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import torch
from jaxtyping import Float

from .backends import BACKENDS, DEFAULT_BACKEND, Backend, HookFn, at_positions, backend_class
from .prompts import as_prompts
from .scoring import Scoring, scoring_for
from .sites import site_name, validate_sites
from .tokens import Batch, Encoded, encode, pad
from .trainable import LoraSpec


class ModelNotFoundError(FileNotFoundError):
    pass


class Model:
    """A loaded model behind one backend. Build it with :func:`load_model`."""

    def __init__(self, backend: Backend, tokenizer, name: str = "model"):
        self.backend = backend
        self.tokenizer = tokenizer
        self.name = name
        #: where the weights were loaded from (a directory), so workers can load it again; None in memory
        self.source: str | None = None
        #: how :attr:`source` was loaded (dtype, device, a tokenizer given in place of the saved one),
        #: so that a worker loads it the same way
        self.load_options: dict[str, Any] = {}
        self._fingerprint: str | None = None
        self._scoring: Scoring | None = None
        #: interventions every forward pass of this handle applies: ``(site, fn(act, batch))``
        self._standing: tuple[tuple[str, Callable], ...] = ()

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
    def n_kv_heads(self) -> int:
        """Key/value heads: ``n_heads``, or fewer under grouped-query attention (each shared by
        ``n_heads // n_kv_heads`` query heads; the ``k`` and ``v`` sites have this many heads)."""
        return getattr(self.backend, "n_kv_heads", self.backend.n_heads)

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
        if tok is None:
            return 0
        for candidate in (tok.pad_token_id, tok.eos_token_id, tok.unk_token_id):
            if candidate is not None:
                return int(candidate)
        return 0

    @property
    def model_type(self) -> str | None:
        """The HuggingFace ``model_type`` (``"gpt2"``, ``"llama"``, ``"bert"``...), when there is one."""
        return self.backend.model_type

    @property
    def hf_model(self) -> torch.nn.Module | None:
        """The underlying HuggingFace model, when there is one (analyzers never need it: they go
        through the handle). On a TransformerLens handle it is the module the bridge wraps, whose
        fused q/k/v weights the bridge runs as separate projections: read a trained TransformerLens
        copy's weights through :attr:`module`, not here."""
        return self.backend.hf_model

    def head_output_weights(self, layer: int) -> torch.Tensor:
        """``W_O`` of every head at ``layer``: ``[n_heads, d_head, d_model]`` (a view of the
        model's weight where it is already laid out so: read it, do not write to it)."""
        return self.backend.head_output_weights(layer)

    def head_input_weights(self, layer: int, which: str) -> torch.Tensor:
        """``W_Q`` / ``W_K`` / ``W_V`` (``which`` = ``"q"``, ``"k"``, ``"v"``) of every head at
        ``layer``: ``[n_heads (n_kv_heads for k, v), d_model, d_head]``, so that the site equals
        ``attn.hook_in @ W + b`` head by head."""
        return self.backend.head_input_weights(layer, which)

    def attention_norm(self, layer: int) -> Callable[[torch.Tensor], torch.Tensor]:
        """The function from ``blocks.{layer}.hook_resid_pre`` to ``blocks.{layer}.attn.hook_in``
        (the block's first norm), to apply to residual streams of one's own: with
        :meth:`head_input_weights`, a head's query on any input of its own (edge patching)."""
        return self.backend.attention_norm(layer)

    def mlp_norm(self, layer: int) -> Callable[[torch.Tensor], torch.Tensor]:
        """The function from the residual stream the MLP reads (``blocks.{layer}.hook_resid_mid``
        in a sequential block, ``hook_resid_pre`` in a parallel one) to ``blocks.{layer}.mlp.hook_in``
        (the MLP's norm): an MLP's input on a residual stream of one's own (edge patching)."""
        return self.backend.mlp_norm(layer)

    def attention_pattern(self, inputs, layer: int | list[int], padding_side: str | None = None) -> torch.Tensor:
        """Attention probabilities ``[batch, head, query, key]`` at ``layer`` (prompts or a Batch);
        for a list of layers ``[layer, batch, head, query, key]``, from one forward pass."""
        batch = self._on_device(inputs, padding_side)
        return self.backend.attention_pattern(batch.input_ids, batch.attention_mask, layer)

    def resid_site(self, layer: int) -> str:
        return site_name("resid_post", layer)

    def site_width(self, site: str) -> int | None:
        """How many values ``site`` holds per token (``d_model``; heads x ``d_head`` for a per-head
        site; an attached SAE's features: ``d_sae``), or None where the backend does not know."""
        return self.backend.site_width(site)

    def check_sites(self, sites) -> list[str]:
        """Validate site names (unknown names raise with the nearest valid ones)."""
        return validate_sites(sites, self.backend.accepted_sites)

    # tokenizing and running -----------------------------------------------------------------
    def encode(self, prompts) -> list[Encoded]:
        return encode(self.tokenizer, as_prompts(prompts))

    def _on_device(self, inputs, padding_side: str | None) -> Batch:
        """``inputs`` (any kind :func:`~interp.prompts.as_prompts` takes, or a Batch) as a padded
        batch on the model's device."""
        batch = inputs if isinstance(inputs, Batch) else self.batch(self.encode(inputs), padding_side)
        return batch.to(self.device)

    def batch(self, encoded: Sequence[Encoded], padding_side: str | None = None) -> Batch:
        side = padding_side or getattr(self.tokenizer, "padding_side", None) or "right"
        return pad(encoded, self.pad_token_id, side)

    def run(
        self,
        inputs,
        hooks: Mapping[str, HookFn] | None = None,
        padding_side: str | None = None,
        stop_early: bool = False,
    ) -> torch.Tensor | None:
        """Forward pass with ``hooks`` (site -> function of the activation returning ``None`` to
        read or a tensor to write). ``inputs``: prompts, or a :class:`~interp.tokens.Batch`.
        ``stop_early=True`` (for callers that only read the hooked sites, such as
        :func:`~interp.capture`): the pass stops right after the last hooked site (no later block,
        no unembedding) and returns None."""
        batch = self._on_device(inputs, padding_side)
        if hooks:
            self.check_sites(list(hooks))
        hooks = self._with_standing(batch, hooks)
        return self.backend.run(
            batch.input_ids, batch.attention_mask, batch.position_ids, hooks, stop_early=stop_early and bool(hooks)
        )

    def forward(
        self, inputs, padding_side: str | None = None, positions: Sequence[int] | torch.Tensor | None = None
    ) -> Float[torch.Tensor, "batch kept vocab"]:
        """Logits of a forward pass (with this handle's standing interventions, if any; no other
        hooks), differentiable (fine-tuning trains through it). ``inputs``: prompts, or a
        :class:`~interp.tokens.Batch`. ``positions`` (sequence indices, the same for every row):
        the logits at those positions only, in that order (a HuggingFace head that takes
        ``logits_to_keep`` then reads out nowhere else, which saves the read-out's work at every
        other position); None: at every position. A negative index counts from the end of the
        padded batch (``-1`` is every prompt's last token only when the batch is left-padded)."""
        batch = self._on_device(inputs, padding_side)
        if positions is not None:
            positions = _sequence_indices(positions, batch.input_ids.shape[1])
        if self._standing:
            logits = self.backend.run(
                batch.input_ids, batch.attention_mask, batch.position_ids, self._with_standing(batch, None)
            )
            return at_positions(logits, positions)
        return self.backend.forward(batch.input_ids, batch.attention_mask, batch.position_ids, positions)

    def intervened(self, site: str, fn: Callable[[torch.Tensor, Batch], torch.Tensor | None]) -> Model:
        """A handle on the same weights whose every forward pass (``forward``, ``run``,
        ``logprobs``, ``final_hidden``, captures, and a :meth:`trainable_copy`'s training) first
        applies ``fn(activation, batch)`` at ``site``; ``fn`` returns the new activation, or None to
        leave it. ``batch`` (a :class:`~interp.tokens.Batch` on the model's device) tells ``fn``
        which tokens it sees, e.g. to act at one position per prompt. Erasure and steering run
        through this (:mod:`lab.study.interventions`); the original handle is unchanged."""
        (site,) = self.check_sites([site])
        model = Model(self.backend, self.tokenizer, self.name)
        model.source, model._standing = self.source, self._standing + ((site, fn),)
        model.load_options = self.load_options
        return model

    def _with_standing(self, batch: Batch, hooks: Mapping[str, HookFn] | None) -> dict[str, HookFn] | None:
        """``hooks`` with the standing interventions applied first at their sites."""
        if not self._standing:
            return dict(hooks) if hooks else hooks
        merged: dict[str, HookFn] = dict(hooks or {})
        for site, fn in reversed(self._standing):
            merged[site] = _compose(fn, merged.get(site), batch)
        return merged

    @property
    def scoring(self) -> Scoring:
        """How this model answers (:mod:`interp.scoring`): a continuation for causal LMs, a masked
        slot read out through the input embeddings for encoders."""
        if self._scoring is None:
            self._scoring = scoring_for(self)
        return self._scoring

    def logprobs(
        self, prompts: Sequence[str], candidates: Sequence[str], batch_size: int = 128
    ) -> Float[torch.Tensor, "prompt candidate"]:
        """Log-probability of each candidate after each prompt: as a whole token sequence
        continuing it (causal LMs) or in a masked slot after it (encoders); see :mod:`interp.scoring`."""
        return self.scoring.logprobs(prompts, candidates, batch_size)

    def final_hidden(self, inputs, padding_side: str | None = None) -> Float[torch.Tensor, "batch pos d_model"]:
        """The last block's residual output (before any head), differentiable."""
        batch = self._on_device(inputs, padding_side)
        if not self._standing:
            return self.backend.final_hidden(batch.input_ids, batch.attention_mask, batch.position_ids)
        out = {}  # read at the same site as Backend.final_hidden, after this handle's interventions

        def keep(act):
            out["h"] = act

        self.run(batch, {self.resid_site(self.n_layers - 1): keep})
        return out["h"]

    def input_embeddings(self) -> Float[torch.Tensor, "vocab d_model"]:
        """The token embedding matrix (the parameter itself: it trains if the model does)."""
        return self.backend.input_embeddings()

    @torch.no_grad()
    def token_logprobs(self, text: str) -> Float[torch.Tensor, " n_tokens_minus_1"]:
        """``log p(token_i | tokens before it)`` for every token of ``text`` after its first
        (causal LMs only; :meth:`interp.scoring.Scoring.token_logprobs`)."""
        return self.scoring.token_logprobs(text)

    def trainable_copy(self, lora: LoraSpec | None = None, freeze_embeddings: bool = False) -> Model:
        """A handle on a deep copy of the weights that trains: in full (embedding tables frozen if
        asked) or through LoRA adapters (``lora=LoraSpec(r, alpha)``); see :mod:`interp.trainable`.
        The original model is never modified."""
        model = Model(self.backend.trainable_copy(lora, freeze_embeddings), self.tokenizer, self.name)
        model._standing = self._standing  # a copy of an intervened handle trains under the same interventions
        return model

    def train(self, mode: bool = True) -> Model:
        self.module.train(mode)
        return self

    def eval(self) -> Model:
        return self.train(False)

    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        return [p for p in self.module.parameters() if p.requires_grad]

    def read(self, inputs, sites, padding_side: str | None = None) -> dict[str, torch.Tensor]:
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

    def content_digest(self) -> str:
        """What identifies the model's content (:meth:`fingerprint`), for keying saved results."""
        return self.fingerprint()

    def __reduce__(self):
        """A handle travels to a worker process by reference: the worker loads it again from
        :attr:`source` with the same :attr:`load_options` and name (once per process) and checks
        that the weights' fingerprint matches. A model only in memory, or one with standing
        interventions, cannot be sent."""
        why = self.backend.unsendable()
        if why is not None:
            raise TypeError(f"model {self.name!r} cannot be sent to a worker process: {why}")
        if self.source is None or self._standing:
            raise TypeError(
                f"model {self.name!r} cannot be sent to a worker process: a worker loads the model again, so load "
                "it from a directory or a name (interp.load_model(path)), not from an object in memory"
                + (" (and send it without standing interventions)" if self._standing else "")
            )
        return _reload, (self.source, self.backend_name, self.name, self.fingerprint(), self.load_options)

    def __repr__(self) -> str:
        return (
            f"Model({self.name!r}, backend={self.backend_name!r}, n_layers={self.n_layers}, "
            f"d_model={self.d_model}, n_heads={self.n_heads})"
        )


# loading ---------------------------------------------------------------------------------------
_RELOADED: dict[tuple, Model] = {}


def _sequence_indices(positions: Sequence[int] | torch.Tensor, width: int) -> torch.Tensor:
    """``positions`` (for :meth:`Model.forward`) as non-negative indices into ``width`` positions,
    or a ValueError that says what is wrong with them."""
    index = torch.as_tensor(positions)
    if index.dim() != 1 or not len(index):
        raise ValueError(f"positions must be a non-empty list of sequence indices, got shape {tuple(index.shape)}")
    if index.is_floating_point() or index.dtype == torch.bool:
        raise ValueError(f"positions must be integer sequence indices, got {index.dtype}")
    index = index.long()
    if int(index.min()) < -width or int(index.max()) >= width:
        raise ValueError(f"positions {index.tolist()} fall outside the batch's {width} positions")
    return index % width


def _reload(source: str, backend: str, name: str, fingerprint: str, options: dict | None = None) -> Model:
    """A model sent by reference (:meth:`Model.__reduce__`), loaded once per process."""
    options = options or {}
    key = (source, backend, name, fingerprint, *((k, _option_key(v)) for k, v in sorted(options.items())))
    if key not in _RELOADED:
        model = load_model(source, backend=backend, name=name, **options)
        if model.fingerprint() != fingerprint:
            raise RuntimeError(
                f"{source} holds other weights (fingerprint {model.fingerprint()}) than the model that was sent "
                f"({fingerprint}): it changed on disk, or the sent model was modified after loading"
            )
        _RELOADED[key] = model
    return _RELOADED[key]


def _option_key(value) -> Any:
    """A hashable stand-in for a load option (a tokenizer by its class, name and vocabulary size)."""
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    if isinstance(value, (torch.dtype, torch.device)):
        return str(value)
    return (type(value).__name__, getattr(value, "name_or_path", ""), len(value) if hasattr(value, "__len__") else None)


def load_model(
    spec: Any,
    backend: str | None = None,
    *,
    tokenizer=None,
    device: str | torch.device | None = None,
    dtype: torch.dtype | None = None,
    name: str | None = None,
    remote: bool = False,
) -> Model:
    """Load a model behind ``backend`` (``"nnsight"`` or ``"transformer_lens"``); see the module
    docstring for what ``spec`` may be. Each backend says which in-memory objects it accepts;
    names and directories are resolved here and read by the backend. With no ``backend``: the
    backend whose own object ``spec`` is (a ``TransformerBridge`` -> ``"transformer_lens"``, a
    handle -> its backend), otherwise :data:`DEFAULT_BACKEND` (see :func:`default_backend_for`).

    ``remote=True`` (nnsight only): ``spec`` is a hub name of a model NDIF hosts; only its
    config and tokenizer are loaded here (weights stay on the meta device) and every forward pass
    (capture, patching, ...) runs remotely (set your key with ``nnsight.CONFIG.set_default_api_key``).
    """
    backend = backend or default_backend_for(spec)
    cls = backend_class(backend)
    if remote:
        if backend != "nnsight":
            raise ValueError("remote=True needs backend='nnsight' (NDIF runs nnsight traces)")
        loaded, tok = cls.load_remote(spec, tokenizer)
        model = Model(loaded, tok, name or spec)
        model.source = spec
        return model
    if isinstance(spec, Model):
        if spec.backend_name == backend:
            return spec
        kwargs = dict(tokenizer=tokenizer or spec.tokenizer, device=device, dtype=dtype, name=name or spec.name)
        if spec.source is not None and Path(spec.source).exists():
            return load_model(spec.source, backend, **kwargs)  # the weights as saved, not as a backend rewrote them
        original = spec.backend.source_module
        if original is None:
            raise ValueError(
                f"this {spec.backend_name} model has no HuggingFace module or directory to load through "
                f"the {backend} backend"
            )
        return load_model(original, backend, **kwargs)
    if isinstance(spec, (str, os.PathLike)):
        path = resolve_path(spec)
        loaded, tok = cls.load_directory(path, tokenizer, device, dtype)
        model = Model(loaded, tok, name or str(spec))
        model.source = str(path)
        given = {"tokenizer": tokenizer, "device": device, "dtype": dtype}
        model.load_options = {k: v for k, v in given.items() if v is not None}
        return model
    if cls.accepts(spec):
        loaded, tok, default_name = cls.load(spec, tokenizer, device, dtype)
        return Model(loaded, tok, name or default_name)
    others = [b for b in BACKENDS if b != backend and backend_class(b).accepts(spec)]
    if others:
        raise ValueError(
            f"the {backend} backend cannot load a {type(spec).__name__}: only the {others[0]} backend "
            f"can; pass backend={others[0]!r}"
        )
    raise TypeError(
        f"no backend can load a {type(spec).__name__}. Pass a registered name "
        f"({', '.join(registered_models()) or 'none'}), a local directory, a hub name, or "
        f"{cls.accepts_description}"
    )


def default_backend_for(spec: Any) -> str:
    """The backend :func:`load_model` uses for ``spec`` when none is named: a handle's own, the
    backend that owns the object (``Backend.owns``), else :data:`DEFAULT_BACKEND`."""
    if isinstance(spec, Model):
        return spec.backend_name
    for name in BACKENDS:
        if backend_class(name).owns(spec):
            return name
    return DEFAULT_BACKEND


#: model names -> a function returning the model's local directory. The foundation knows no
#: names of its own: the application registers its built-in models ("world", "induction") through
#: the ``interp.models`` entry-point group, and users add theirs with :func:`register_model`.
_REGISTRY: dict[str, Callable[[], Path]] = {}


def register_model(name: str, resolver: Callable[[], str | os.PathLike]) -> None:
    """Make ``load_model(name)`` load the directory ``resolver()`` returns."""
    _REGISTRY[name] = lambda: Path(resolver())


def registered_models() -> list[str]:
    """Every name :func:`register_model` or an installed ``interp.models`` entry point provides."""
    return sorted(set(_REGISTRY) | {ep.name for ep in entry_points(group="interp.models")})


def _registered(name: str) -> Callable[[], Path] | None:
    if name not in _REGISTRY:
        for ep in entry_points(group="interp.models"):
            if ep.name == name:
                register_model(name, ep.load())
    return _REGISTRY.get(name)


def resolve_path(spec: str | os.PathLike) -> Path:
    """A local directory for ``spec``: a registered name, an existing path, or a cached hub snapshot."""
    resolver = _registered(str(spec))
    if resolver is not None:
        return resolver()
    path = Path(spec).expanduser()
    if path.exists():
        if not (path / "config.json").exists():
            raise ModelNotFoundError(f"{path} exists but has no config.json; point to a HuggingFace model directory")
        return path
    if str(spec).startswith((".", "/", "~")):
        raise ModelNotFoundError(f"no model directory at {path}")
    try:
        return hub_snapshot(str(spec), "config.json")
    except SnapshotNotFound as missing:
        causes = missing.causes()
    near = difflib.get_close_matches(str(spec), registered_models(), n=3, cutoff=0.6)
    if near:
        raise ModelNotFoundError(
            f"no model named {str(spec)!r}: did you mean {' or '.join(map(repr, near))}? Registered names: "
            f"{', '.join(registered_models())}; or give a model directory or a hub name."
        )
    raise ModelNotFoundError(
        f"no local weights for {str(spec)!r}: it is not a directory, not in the HuggingFace cache, "
        "and the hub cannot be reached. On a machine with hub access run "
        f"`hf download {spec} --local-dir ./{Path(str(spec)).name}`, copy that folder here and pass "
        f"its path: load_model('./{Path(str(spec)).name}')." + (f" ({causes})" if causes else "")
    )


class SnapshotNotFound(FileNotFoundError):
    """:func:`hub_snapshot` found no snapshot holding the file asked for; ``reasons`` says why, one
    line per place looked in."""

    def __init__(self, repo: str, required: str, reasons: list[str]):
        self.repo, self.required, self.reasons = repo, required, reasons
        super().__init__(f"no snapshot of {repo!r} holding {required}: " + "; ".join(reasons))

    def causes(self) -> str:
        """The reasons worth showing a user (not the expected "not in the local cache")."""
        return "; ".join(r for r in self.reasons if not r.endswith(_NOT_CACHED))


_NOT_CACHED = "not in the local HuggingFace cache"


def hub_offline() -> bool:
    """Whether ``HF_HUB_OFFLINE`` forbids reaching the HuggingFace hub."""
    return os.environ.get("HF_HUB_OFFLINE", "0") in ("1", "true", "True")


def hub_snapshot(repo: str, required: str, allow_patterns: Sequence[str] | None = None) -> Path:
    """The local folder of a snapshot of the HuggingFace hub repository ``repo`` that holds the file
    ``required`` (a path inside the repository): the one in the local cache, else one downloaded
    where the hub can be reached (``HF_HUB_OFFLINE`` unset). ``allow_patterns``: the files to fetch
    (default: all). A cached snapshot without ``required`` (an earlier download of other files) is
    not returned. Raises :class:`SnapshotNotFound`, whose ``reasons`` say what each place answered."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    patterns = list(allow_patterns) if allow_patterns is not None else None
    places = [("the local HuggingFace cache", True)] + ([] if hub_offline() else [("the hub", False)])
    reasons = []
    for place, local in places:
        try:
            root = Path(snapshot_download(repo, allow_patterns=patterns, local_files_only=local))
        except LocalEntryNotFoundError:
            reasons.append(f"{repo}: {_NOT_CACHED}")
            continue
        except Exception as err:  # no network, no such repository, no access: said, not hidden
            reasons.append(f"{place} answered {type(err).__name__}: {err}")
            continue
        if (root / required).exists():
            return root
        reasons.append(f"the snapshot of {repo} in {place} has no {required}")
    if hub_offline():
        reasons.append("the hub is not asked: HF_HUB_OFFLINE is set")
    raise SnapshotNotFound(repo, required, reasons)


def _compose(standing: Callable, user: HookFn | None, batch: Batch) -> HookFn:
    """A hook applying ``standing(act, batch)`` and then ``user`` (a reader or writer) to its result."""

    def hook(act):
        new = standing(act, batch)
        act = act if new is None else new
        if user is None:
            return new
        written = user(act)
        return written if written is not None else new

    return hook
