"""The site vocabulary: where in a model an activation is read or written.

Every analyzer in this toolkit names activations with TransformerLens' hook names, whatever
backend runs the model, so a probe sweep written against ``blocks.3.hook_resid_post`` runs
unchanged on a ``TransformerBridge`` or on an nnsight-wrapped HuggingFace model::

    hook_embed                      token embeddings                 [batch, pos, d_model]
    hook_pos_embed                  learned positional embeddings    [batch, pos, d_model]
    blocks.{l}.hook_resid_pre       residual stream entering block l [batch, pos, d_model]
    blocks.{l}.attn.hook_in         what the q/k/v projections read (the first norm's output in
                                    pre-norm blocks; the residual itself in post-norm BERT)
                                                                     [batch, pos, d_model]
    blocks.{l}.attn.hook_q/k/v      per-head queries, keys, values   [batch, pos, head, d_head]
    blocks.{l}.attn.hook_z          per-head attention outputs (before W_O)
                                                                     [batch, pos, head, d_head]
    blocks.{l}.hook_attn_out        attention output (after W_O)     [batch, pos, d_model]
    blocks.{l}.hook_resid_mid       residual between attention and MLP (sequential blocks only)
    blocks.{l}.mlp.hook_in          what the MLP reads (the MLP's norm's output in pre-norm blocks)
                                                                     [batch, pos, d_model]
    blocks.{l}.hook_mlp_out         MLP output                       [batch, pos, d_model]
    blocks.{l}.hook_resid_post      residual stream leaving block l  [batch, pos, d_model]
    ln_final.hook_normalized        final norm output                [batch, pos, d_model]

This module only knows names; which module of which architecture computes each one lives in
:mod:`interp.architectures`.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass

GLOBAL_SITES_BEFORE = ("hook_embed", "hook_pos_embed")
GLOBAL_SITES_AFTER = ("ln_final.hook_normalized",)
BLOCK_SITES = (
    "hook_resid_pre",
    "attn.hook_in",
    "attn.hook_q",
    "attn.hook_k",
    "attn.hook_v",
    "attn.hook_z",
    "hook_attn_out",
    "hook_resid_mid",
    "mlp.hook_in",
    "hook_mlp_out",
    "hook_resid_post",
)
HEAD_SITES = frozenset({"attn.hook_q", "attn.hook_k", "attn.hook_v", "attn.hook_z"})

#: short kinds the analyzers take (``sites=["resid_pre", "z"]``) -> site kinds
SHORT_KINDS = {
    "embed": "hook_embed",
    "resid_pre": "hook_resid_pre",
    "attn_in": "attn.hook_in",
    "resid_mid": "hook_resid_mid",
    "mlp_in": "mlp.hook_in",
    "resid_post": "hook_resid_post",
    "attn_out": "hook_attn_out",
    "mlp_out": "hook_mlp_out",
    "z": "attn.hook_z",
    "q": "attn.hook_q",
    "k": "attn.hook_k",
    "v": "attn.hook_v",
}
#: short kinds of the per-head sites
HEAD_KINDS = ("z", "q", "k", "v")


def site_name(kind: str, layer: int | None = None) -> str:
    """The one place a site name is built: ``site_name("resid_post", 3)`` ->
    ``"blocks.3.hook_resid_post"``; ``kind`` is a short kind (:data:`SHORT_KINDS`) or a site
    kind (``"attn.hook_z"``); sites outside the blocks (``"embed"``, ``"hook_embed"``,
    ``"ln_final.hook_normalized"``) take no layer."""
    kind = SHORT_KINDS.get(kind, kind)
    if kind in GLOBAL_SITES_BEFORE or kind in GLOBAL_SITES_AFTER:
        return kind
    if layer is None:
        raise ValueError(f"the site kind {kind!r} lives in a block: give its layer")
    return f"blocks.{layer}.{kind}"


_BLOCK_RE = re.compile(r"^blocks\.(\d+)\.(.+)$")


class UnknownSiteError(KeyError):
    """A site name that the model does not have."""

    def __str__(self) -> str:  # KeyError quotes its message; keep it readable
        return str(self.args[0])


@dataclass(frozen=True, order=True)
class Site:
    """A parsed site name: ``kind`` at ``layer`` (``None`` for sites outside the blocks)."""

    layer: int | None
    kind: str

    @property
    def name(self) -> str:
        return self.kind if self.layer is None else site_name(self.kind, self.layer)

    @property
    def per_head(self) -> bool:
        return self.kind in HEAD_SITES

    @property
    def order(self) -> tuple[int, int]:
        """Execution order within a forward pass (embeddings, blocks in order, final norm)."""
        if self.layer is None:
            if self.kind in GLOBAL_SITES_BEFORE:
                return (-1, GLOBAL_SITES_BEFORE.index(self.kind))
            return (1 << 30, 0)
        return (self.layer, BLOCK_SITES.index(self.kind) if self.kind in BLOCK_SITES else 99)


def parse_site(name: str) -> Site:
    """Split a hook name into layer and kind: ``"blocks.3.attn.hook_z"`` -> ``Site(3, "attn.hook_z")``."""
    if not isinstance(name, str):
        raise TypeError(f"a site is a hook name string such as 'blocks.0.hook_resid_post', got {name!r}")
    m = _BLOCK_RE.match(name)
    if m:
        return Site(int(m.group(1)), m.group(2))
    return Site(None, name)


def is_standard(name: str) -> bool:
    """Whether ``name`` is in the site vocabulary above (not a backend's own hook name)."""
    site = parse_site(name)
    if site.layer is None:
        return site.kind in GLOBAL_SITES_BEFORE or site.kind in GLOBAL_SITES_AFTER
    return site.kind in BLOCK_SITES


def standard_sites(n_layers: int, kinds_available: set[str] | None = None) -> list[str]:
    """All standard site names of an ``n_layers`` model, in execution order."""
    names = [k for k in GLOBAL_SITES_BEFORE if kinds_available is None or k in kinds_available]
    for layer in range(n_layers):
        names += [site_name(k, layer) for k in BLOCK_SITES if kinds_available is None or k in kinds_available]
    names += [k for k in GLOBAL_SITES_AFTER if kinds_available is None or k in kinds_available]
    return names


def validate_sites(requested, valid: list[str]) -> list[str]:
    """Return ``requested`` as a list of names, each checked against ``valid``.

    An unknown name raises :class:`UnknownSiteError` that lists the nearest valid names.
    """
    if isinstance(requested, str):
        requested = [requested]
    requested = list(requested)
    if not requested:
        raise ValueError("no sites requested: pass at least one site name, e.g. 'blocks.0.hook_resid_post'")
    valid_set = set(valid)
    for name in requested:
        if name not in valid_set:
            near = difflib.get_close_matches(str(name), valid, n=5, cutoff=0.5)
            hint = f" Nearest valid names: {', '.join(near)}." if near else ""
            raise UnknownSiteError(
                f"unknown site {name!r} for this model.{hint} See `model.sites` for all {len(valid)} valid names."
            )
    return requested


def sort_by_execution(names: list[str]) -> list[str]:
    """Sites in the order a forward pass computes them (needed by nnsight's tracing)."""
    return sorted(names, key=lambda n: parse_site(n).order)
