"""SAE features as sites: attach a sparse autoencoder to a model handle, and its features can be
captured, patched, steered and probed like any activation.

:func:`attach_sae` returns a handle on the same weights whose sites include, for an SAE reading
``blocks.1.hook_resid_post``, six more, named as sae-lens names the hook points of an attached SAE
and reached in this order within a forward pass::

    blocks.1.hook_resid_post                       what the SAE reads, x (as the model computes it)
    blocks.1.hook_resid_post.hook_sae_input        x as the SAE reads it: in its dtype, flat  [batch, pos, d_in]
    blocks.1.hook_resid_post.hook_sae_acts_pre     the pre-activations                        [batch, pos, d_sae]
    blocks.1.hook_resid_post.hook_sae_acts_post    the features f = encode(x)                 [batch, pos, d_sae]
    blocks.1.hook_resid_post.hook_sae_recons       the reconstruction f @ W_dec + b_dec, flat [batch, pos, d_in]
    blocks.1.hook_resid_post.hook_sae_error        the error term x - decode(encode(x))       [batch, pos, ...site]
    blocks.1.hook_resid_post.hook_sae_output       what the rest of the model reads           [batch, pos, ...site]

As in sae-lens, the input and the reconstruction are flat (``d_in`` = head x d_head for an SAE on
``attn.hook_z``, whose error and output are ``[batch, pos, head, d_head]`` like the site) and in the
SAE's dtype; the error is in the wider of the model's and the SAE's dtype, the output in the
model's. A hook on the site itself runs first (it changes what the SAE reads). The SAE's hook name
is a TransformerLens hook name, which is this toolkit's site vocabulary (:mod:`interp.sites`), so
``blocks.1.hook_resid_post`` is the same activation on the nnsight and the TransformerLens backend;
pass ``site=`` where the SAE's config names none, or a name the model does not have.

**Reading** changes nothing: the model runs as before, and a hook at an SAE point is given a copy,
so nothing it does to it reaches the model unless it writes. **Writing** at a point (a hook that
returns a tensor, or changes the one it was given in place, as at any site) recomputes what follows
from there, and the activation becomes, for that pass::

    output = x + (decode(f') - decode(f)) + (error' - error)       (error_term=True, the default)
    output = decode(f')                                            (error_term=False)

with ``f`` the features of ``x`` and ``f'`` those after the writes (``error'`` the error term a hook
wrote): so writing back what was read changes nothing, bit for bit, and a patch on features changes
exactly what they contribute. The differences are taken in the SAE's dtype and added to ``x`` in
the wider dtype, cast back once: a bfloat16 model is not rounded twice. **Splicing**
(``splice=True``) routes every forward pass through the SAE. With the error term the output is then
the formula above with every hooked point's tensor (edited or not) flowing on: the values are the
model's, bit for bit, *and* the gradients reach whatever a hook holds, so attribution can score
features and the error term as nodes (Marks et al. 2024, *Sparse feature circuits*; the error is
part of the graph here, where sae-lens's ``use_error_term`` computes it without gradient). Without
the error term the model runs on the SAE's reconstruction, which measures what the SAE loses.

Unlike sae-lens's ``HookedSAETransformer.add_sae``, which always runs the model on the SAE (by
default without the error term), :func:`attach_sae` leaves the model as it was until a hook writes
(``splice=False``); ``splice=True, error_term=False`` is what ``add_sae(sae)`` does.

>>> sae = interp.load_sae("path/to/sae")                     # reads blocks.1.hook_resid_post
>>> model = interp.attach_sae(interp.load_model("world"), sae)
>>> acts = interp.capture(model, prompts, sites=[feature_site("blocks.1.hook_resid_post")])
>>> ablated = model.intervened(feature_site("blocks.1.hook_resid_post"), lambda f, batch: f * keep)

A handle may carry several SAEs (attach again, at another site); it computes with its SAEs in this
process (a worker process loads the model and the SAE again: load and attach there) and keys
stored results by model and SAEs together (:meth:`~interp.Model.fingerprint`). Attention patterns
(:meth:`~interp.Model.attention_pattern`) are read from the model itself, so they are refused where
an SAE changes the pass (spliced without its error term).
"""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cached_property

import torch

from .backends import Backend, HookFn, at_positions
from .models import Model
from .sae import SparseAutoencoder, _OwnEncoder, as_sae
from .sites import HEAD_SITES, UnknownSiteError, is_standard, parse_site, site_name

Tensor = torch.Tensor

#: the hook points an attached SAE adds at its site, in the order a forward pass reaches them
SAE_HOOKS = (
    "hook_sae_input",
    "hook_sae_acts_pre",
    "hook_sae_acts_post",
    "hook_sae_recons",
    "hook_sae_error",
    "hook_sae_output",
)


def feature_site(site: str, hook: str = "hook_sae_acts_post") -> str:
    """The one place an SAE site name is built: ``feature_site("blocks.1.hook_resid_post")`` ->
    ``"blocks.1.hook_resid_post.hook_sae_acts_post"`` (``hook``: one of :data:`SAE_HOOKS`)."""
    if hook not in SAE_HOOKS:
        raise ValueError(f"an attached SAE's hook points are {SAE_HOOKS}; got {hook!r}")
    return f"{site}.{hook}"


def split_sae_site(name: str) -> tuple[str, str] | None:
    """``(site, hook)`` of an SAE site name, or None for any other name."""
    site, _, hook = name.rpartition(".")
    return (site, hook) if site and hook in SAE_HOOKS else None


def sae_site_width(sae: SparseAutoencoder, hook: str) -> int:
    """How many values an SAE's hook point holds per token: ``d_sae`` for the pre-activations and
    the features, ``d_in`` for the others (the input, the reconstruction, the error, the output)."""
    return sae.d_sae if hook in ("hook_sae_acts_pre", "hook_sae_acts_post") else sae.d_in


@dataclass(frozen=True)
class AttachedSAE:
    """An SAE at a site of a handle, and how it joins the forward pass."""

    site: str
    sae: SparseAutoencoder
    splice: bool
    error_term: bool

    @property
    def changes_pass(self) -> bool:
        """Whether the model computes other values with this SAE attached and no hook at it: spliced
        without the error term (with it, a spliced pass is the model's, bit for bit)."""
        return self.splice and not self.error_term

    def hook(self, site_hook: HookFn | None, hooks: Mapping[str, HookFn]) -> HookFn:
        """The one hook at :attr:`site` that runs the caller's hook there (``site_hook``), then the
        SAE with the caller's ``hooks`` at its hook points (:data:`SAE_HOOKS` -> function)."""
        if "hook_sae_acts_pre" in hooks and isinstance(self.sae, _OwnEncoder):
            self.sae.pre_activation(None)  # refuses, saying why, before the pass

        def run(x: Tensor) -> Tensor | None:
            written = site_hook(x) if site_hook is not None else None
            x = x if written is None else written
            out = self.through(x, hooks)
            return written if out is None else out

        return run

    def through(self, x: Tensor, hooks: Mapping[str, HookFn]) -> Tensor | None:
        """The SAE's output for ``x`` with ``hooks`` at its hook points, or None where the model
        reads ``x`` unchanged (the module docstring gives the formula). Only what a hook reads, or
        what a write changes, is computed."""
        sae, splice = self.sae, self.splice
        if not hooks and not self.changes_pass:
            return None
        clean = _Clean(sae, x)
        points = [h for h in SAE_HOOKS if h in hooks]

        def untouched_after(point: str) -> bool:
            """Nothing written up to ``point``, nothing spliced, and no hook after it: x goes on as it is."""
            return not splice and all(SAE_HOOKS.index(h) <= SAE_HOOKS.index(point) for h in points)

        # each value is None while it is the clean one (nothing written before or at its point)
        sae_in = _flow(hooks, "hook_sae_input", splice, lambda: clean.sae_in, None, None)
        if sae.has_pre_activation:
            pre = _flow(hooks, "hook_sae_acts_pre", splice, lambda: clean.pre, sae_in, sae.pre_activation)
            features = _flow(hooks, "hook_sae_acts_post", splice, lambda: clean.features, pre, sae.activation)
        else:
            features = _flow(hooks, "hook_sae_acts_post", splice, lambda: clean.features, sae_in, sae.features)
        if features is None and untouched_after("hook_sae_acts_post"):
            return None
        recons = _flow(hooks, "hook_sae_recons", splice, lambda: clean.recons, features, sae.reconstruct)
        if recons is None and untouched_after("hook_sae_recons"):
            return None
        error = None
        if "hook_sae_error" in hooks:
            given, written = _hooked(hooks["hook_sae_error"], clean.error)
            if written and not self.error_term:
                raise ValueError(
                    f"a hook writes {feature_site(self.site, 'hook_sae_error')}, but the SAE at {self.site} was "
                    "attached with error_term=False, so its output has no error term to write; attach it with "
                    "error_term=True"
                )
            error = given if (written or splice) and self.error_term else None
        out = None
        if self.error_term and (recons is not None or error is not None):
            wide = clean.wide
            out = x.to(wide)  # x + (decode(f') - decode(f)) + (error' - error), rounded once
            if recons is not None:
                out = out + sae.site_shaped(recons - clean.recons).to(wide)
            if error is not None:
                out = out + (error.to(wide) - clean.error)
            out = out.to(x.dtype)
        elif not self.error_term and (recons is not None or splice):
            out = sae.site_shaped(clean.recons if recons is None else recons).to(x.dtype)
        if "hook_sae_output" in hooks:
            given, written = _hooked(hooks["hook_sae_output"], x if out is None else out)
            out = given if written or splice else out
        return out


class _Clean:
    """An SAE's values on the activation ``x`` as the model computed it (before any hook's write),
    each computed when first asked for."""

    def __init__(self, sae: SparseAutoencoder, x: Tensor):
        self.sae, self.x = sae, x
        #: the dtype the output is summed in: the wider of the model's and the SAE's
        self.wide = torch.promote_types(x.dtype, sae.dtype)

    @cached_property
    def sae_in(self) -> Tensor:
        return self.sae.sae_input(self.x)

    @cached_property
    def pre(self) -> Tensor:
        return self.sae.pre_activation(self.sae_in)

    @cached_property
    def features(self) -> Tensor:
        return self.sae.activation(self.pre) if self.sae.has_pre_activation else self.sae.features(self.sae_in)

    @cached_property
    def recons(self) -> Tensor:
        return self.sae.reconstruct(self.features)

    @cached_property
    def error(self) -> Tensor:
        return self.x.to(self.wide) - self.sae.site_shaped(self.recons).to(self.wide)


def _flow(
    hooks: Mapping[str, HookFn],
    point: str,
    splice: bool,
    clean: Callable[[], Tensor],
    before: Tensor | None,
    compute: Callable[[Tensor], Tensor] | None,
) -> Tensor | None:
    """What flows on from one hook point: None while it is the clean value. ``before``: what
    flowed from the point before (None: the clean value); ``compute``: this point's value from it.
    A hook's tensor flows on where it writes, or where the SAE is spliced (so that gradients reach it)."""
    current = None if before is None else compute(before)
    if point not in hooks:
        return current
    given, written = _hooked(hooks[point], clean() if current is None else current)
    return given if written or splice else current


def _hooked(fn: HookFn, act: Tensor) -> tuple[Tensor, bool]:
    """``(tensor, written)`` after a hook at an SAE point, which is given a copy of ``act`` (so the
    SAE's own values stay out of its reach): the hook's tensor where it returns one, else the copy,
    written where the hook changed it in place (as a hook that edits in place writes at any site)."""
    given = act.clone()
    version = _version(given)
    new = fn(given)
    if new is not None:
        return new, True
    if version is None:  # an inference tensor counts no versions: compare the values
        return given, not torch.equal(given, act)
    return given, _version(given) != version


def _version(t: Tensor) -> int | None:
    try:
        return t._version
    except RuntimeError:
        return None


class SAEBackend(Backend):
    """A model's backend with SAEs at some of its sites: hooks at SAE sites become one hook at the
    site the SAE reads (:meth:`AttachedSAE.hook`). Every method of :class:`~interp.backends.Backend`
    is defined here: those that run the model run it through :meth:`run` (and so through the
    SAEs) wherever an SAE changes the pass; the others are the wrapped backend's."""

    accepts_description = "nothing: attach an SAE to a handle with interp.attach_sae"

    def __init__(self, inner: Backend, attached: Mapping[str, AttachedSAE]):
        self.inner = inner
        self.attached = dict(attached)
        self._sae_sites = [feature_site(s, h) for s in self.attached for h in SAE_HOOKS]

    # loading: a handle with SAEs is made by attach_sae, never loaded ----------------------------
    @classmethod
    def accepts(cls, spec) -> bool:
        return False

    @classmethod
    def load(cls, spec, tokenizer=None, device=None, dtype=None):
        raise TypeError("an SAE backend is not loaded: load the model, then interp.attach_sae(model, sae)")

    @classmethod
    def load_directory(cls, path, tokenizer=None, device=None, dtype=None):
        raise TypeError("an SAE backend is not loaded: load the model, then interp.attach_sae(model, sae)")

    # what the wrapped backend says -------------------------------------------------------------
    @property
    def name(self) -> str:  # type: ignore[override]
        return self.inner.name

    @property
    def n_layers(self) -> int:  # type: ignore[override]
        return self.inner.n_layers

    @property
    def d_model(self) -> int:  # type: ignore[override]
        return self.inner.d_model

    @property
    def n_heads(self) -> int:  # type: ignore[override]
        return self.inner.n_heads

    @property
    def n_kv_heads(self) -> int:  # type: ignore[override]
        return getattr(self.inner, "n_kv_heads", self.inner.n_heads)

    @property
    def d_head(self) -> int:  # type: ignore[override]
        return self.inner.d_head

    @property
    def sites(self) -> list[str]:  # type: ignore[override]
        return self.inner.sites

    @property
    def module(self) -> torch.nn.Module:
        return self.inner.module

    @property
    def model_type(self) -> str | None:
        return self.inner.model_type

    @property
    def hf_model(self) -> torch.nn.Module | None:
        return self.inner.hf_model

    @property
    def source_module(self) -> torch.nn.Module | None:
        return self.inner.source_module

    @property
    def bridge(self):
        """The wrapped TransformerLens backend's ``TransformerBridge`` (an AttributeError on another)."""
        return self.inner.bridge  # type: ignore[attr-defined]

    def input_embeddings(self) -> Tensor:
        return self.inner.input_embeddings()

    def head_output_weights(self, layer: int) -> Tensor:
        return self.inner.head_output_weights(layer)

    def head_input_weights(self, layer: int, which: str) -> Tensor:
        return self.inner.head_input_weights(layer, which)

    def attention_norm(self, layer: int) -> Callable[[Tensor], Tensor]:
        return self.inner.attention_norm(layer)

    def mlp_norm(self, layer: int) -> Callable[[Tensor], Tensor]:
        return self.inner.mlp_norm(layer)

    def __getattr__(self, name: str):
        # reached only for names this class does not define: a backend's own attribute is not guessed at
        raise AttributeError(
            f"{type(self).__name__} has no attribute {name!r}: a model with SAEs offers the Backend interface "
            "(interp.backends.Backend); reach the wrapped backend's own attributes through .inner"
        )

    # the SAEs' sites ---------------------------------------------------------------------------
    @property
    def accepted_sites(self) -> list[str]:
        return list(self.inner.accepted_sites) + self._sae_sites

    def site_width(self, site: str) -> int | None:
        split = split_sae_site(site)
        if split is not None and split[0] in self.attached:
            return sae_site_width(self.attached[split[0]].sae, split[1])
        return self.inner.site_width(site)

    def unsendable(self) -> str | None:
        return (
            f"it carries SAEs (at {', '.join(self.attached)}), which a worker cannot load again from the model's "
            "source; send the model without them and, in the worker, load each SAE (interp.load_sae) and attach it "
            "there (interp.attach_sae)"
        )

    @property
    def changes_pass(self) -> bool:
        """Whether a pass without hooks computes other values than the model's (an SAE spliced
        without its error term)."""
        return any(a.changes_pass for a in self.attached.values())

    def _hooks(self, hooks: Mapping[str, HookFn] | None) -> dict[str, HookFn] | None:
        """The caller's hooks with those at SAE sites folded into one hook per SAE site."""
        plain, per_site = {}, {}
        for name, fn in (hooks or {}).items():
            split = split_sae_site(name)
            if split is not None and split[0] in self.attached:
                per_site.setdefault(split[0], {})[split[1]] = fn
            else:
                plain[name] = fn
        for site, attached in self.attached.items():
            if attached.changes_pass or site in per_site:
                plain[site] = attached.hook(plain.get(site), per_site.get(site, {}))
        return plain or None

    # running the model -------------------------------------------------------------------------
    def run(self, input_ids, attention_mask=None, position_ids=None, hooks=None, stop_early=False):
        return self.inner.run(input_ids, attention_mask, position_ids, self._hooks(hooks), stop_early)

    def forward(self, input_ids, attention_mask=None, position_ids=None, positions=None):
        if not self.changes_pass:
            return self.inner.forward(input_ids, attention_mask, position_ids, positions)
        return at_positions(self.run(input_ids, attention_mask, position_ids, None), positions)

    def final_hidden(self, input_ids, attention_mask=None, position_ids=None):
        if not self.changes_pass:
            return self.inner.final_hidden(input_ids, attention_mask, position_ids)
        last = site_name("resid_post", self.inner.n_layers - 1)
        site = feature_site(last, "hook_sae_output") if last in self.attached else last
        out = {}

        def keep(act):
            out["h"] = act

        self.run(input_ids, attention_mask, position_ids, {site: keep})
        return out["h"]

    def attention_pattern(self, input_ids, attention_mask, layer):
        if self.changes_pass:
            spliced = ", ".join(s for s, a in self.attached.items() if a.changes_pass)
            raise ValueError(
                "attention patterns are read from the model's own attention, which does not run through an SAE "
                f"spliced without its error term (at {spliced}); read them on the handle the SAE was attached to, "
                "or attach it with error_term=True"
            )
        return self.inner.attention_pattern(input_ids, attention_mask, layer)

    def trainable_copy(self, lora=None, freeze_embeddings: bool = False) -> SAEBackend:
        return SAEBackend(self.inner.trainable_copy(lora, freeze_embeddings), self.attached)


def attach_sae(
    model: Model,
    sae,
    *,
    site: str | None = None,
    splice: bool = False,
    error_term: bool = True,
) -> Model:
    """A handle on ``model``'s weights with ``sae`` at ``site`` (see the module docstring).

    ``sae``: a :class:`~interp.sae.SparseAutoencoder`, a folder in sae-lens's format, or anything
    :func:`~interp.sae.as_sae` takes. ``site``: where it reads (default: its config's hook name).
    ``splice``: route every forward pass through the SAE (sae-lens's ``add_sae`` always does;
    here, by default, only a hook's write does); ``error_term``: add its error term to its output
    wherever its output replaces the activation. The original handle is unchanged; attach to the
    returned handle again to add an SAE at another site.
    """
    if not isinstance(model, Model):
        raise TypeError(f"attach_sae takes a model handle (interp.load_model(...)), got {type(model).__name__}")
    if getattr(model.backend, "remote", False):
        raise ValueError("an SAE runs beside the model in this process; a remote (NDIF) model runs elsewhere")
    sae = as_sae(sae)
    head = sae.config.get("metadata", {}).get("hook_head_index")
    if head is not None:
        raise ValueError(
            f"this SAE reads one attention head (hook_head_index={head}) of {sae.hook_name}, which attach_sae does "
            "not attach (the toolkit's per-head sites hold every head); use an SAE on the whole site, or apply "
            "this one yourself to that head's slice, sae.encode(z[..., head, :])"
        )
    site = site or sae.hook_name
    if site is None:
        raise ValueError(
            "this SAE's config names no hook (metadata.hook_name): say where it reads, attach_sae(..., site=)"
        )
    base = model.backend.inner if isinstance(model.backend, SAEBackend) else model.backend
    attached = dict(model.backend.attached) if isinstance(model.backend, SAEBackend) else {}
    if split_sae_site(site) is not None:
        raise ValueError(f"{site!r} is an SAE's own hook point; attach an SAE to one of the model's sites")
    if site not in base.accepted_sites:
        hint = _TRANSFORMER_LENS_ONLY.get(parse_site(site).kind)
        raise UnknownSiteError(
            f"the SAE reads {site!r}, which this model has no site for"
            + (f" ({hint})" if hint else "")
            + f". Pass site= with one of model.sites (e.g. {model.resid_site(0)!r}) if it reads one of them."
        )
    if site in attached:
        raise ValueError(f"{model.name!r} already has an SAE at {site}; attach this one to the original handle")
    _check_width(model, site, sae)
    if sae.W_enc.device != model.device or sae.reshape_activations == "hook_z":
        sae = copy.deepcopy(sae).to(model.device)  # the caller's SAE stays where it is
    if sae.reshape_activations == "hook_z":
        sae.d_head = model.d_head
    attached[site] = AttachedSAE(site, sae, bool(splice), bool(error_term))
    handle = Model(SAEBackend(base, attached), model.tokenizer, model.name)
    handle._standing = model._standing  # interventions of the handle attached to are kept
    h = hashlib.sha256(model.fingerprint().encode())  # stored results are keyed by model and SAEs together
    for a in attached.values():
        h.update(f"{a.site}:{a.sae.digest()}:{a.splice}:{a.error_term}".encode())
    handle._fingerprint = h.hexdigest()[:16]
    return handle


def attached_saes(model: Model) -> dict[str, SparseAutoencoder]:
    """The SAEs of a handle, by the site each reads (empty for a handle without any)."""
    backend = model.backend
    return {s: a.sae for s, a in backend.attached.items()} if isinstance(backend, SAEBackend) else {}


def _check_width(model: Model, site: str, sae: SparseAutoencoder) -> None:
    """Refuse an SAE whose input does not fit the site, where the site's width is known."""
    kind = parse_site(site).kind
    if kind in HEAD_SITES:
        width = model.site_width(site)
        if sae.reshape_activations != "hook_z":
            raise ValueError(
                f"{site} is per head ([batch, pos, head, d_head]) and this SAE reads flat vectors; an SAE trained on "
                "it says reshape_activations='hook_z' in its config"
            )
        if width != sae.d_in:
            raise ValueError(f"{site} has {width} values (heads x {model.d_head}); the SAE reads {sae.d_in}")
        return
    if sae.reshape_activations == "hook_z":
        raise ValueError(f"this SAE reads per-head activations (reshape_activations='hook_z'); {site} is not per head")
    if is_standard(site) and sae.d_in != model.d_model:
        raise ValueError(f"{site} is d_model={model.d_model} wide; this SAE reads d_in={sae.d_in}")


#: TransformerLens HookedTransformer hook names with no exact site here, and why
_TRANSFORMER_LENS_ONLY: dict[str, str] = {
    "ln1.hook_normalized": "the nearest site is attn.hook_in, which includes the norm's weight and bias; a "
    "HookedTransformer with fold_ln=True leaves them out of ln1.hook_normalized",
    "ln2.hook_normalized": "the nearest site is mlp.hook_in, which includes the norm's weight and bias; a "
    "HookedTransformer with fold_ln=True leaves them out of ln2.hook_normalized",
    "mlp.hook_post": "the MLP's hidden activations are not one of this toolkit's sites",
}
