"""Where each site lives in each HuggingFace architecture: the one table the nnsight backend reads.

A site (see :mod:`interp.sites`) is located by a module path, whether it is that module's input
or output, and a *codec* that turns the raw tensor into the site's canonical shape and back
(e.g. GPT-2's fused ``c_attn`` output ``[batch, pos, 3 * d_model]`` -> queries
``[batch, pos, head, d_head]``). Paths are relative to the base model (``model.transformer`` for
``GPT2LMHeadModel``, ``model.model`` for ``LlamaForCausalLM``), so a bare base model and one with
an LM head share a table.

Adding an architecture is adding one entry to :data:`ARCHITECTURES` (and its ``model_type`` to
:data:`MODEL_TYPES`); nothing else in the toolkit changes. The TransformerLens backend does not
use this table: ``TransformerBridge`` already exposes these names.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

import torch

from .sites import parse_site, site_name

Tensor = torch.Tensor


@dataclass(frozen=True)
class Codec:
    """Converts a module's raw input/output to a site tensor (``get``) and writes it back (``put``)."""

    get: Callable[[object, ArchInfo], Tensor]
    put: Callable[[object, Tensor, ArchInfo], object]


@dataclass(frozen=True)
class ArchInfo:
    n_heads: int
    n_kv_heads: int
    d_head: int


def _identity() -> Codec:
    return Codec(get=lambda raw, a: raw, put=lambda raw, new, a: new)


def _first_of_tuple() -> Codec:
    def get(raw, a):
        return raw[0] if isinstance(raw, tuple) else raw

    def put(raw, new, a):
        return (new, *raw[1:]) if isinstance(raw, tuple) else new

    return Codec(get, put)


def _heads(kv: bool = False) -> Codec:
    """``[b, p, h * d_head]`` <-> ``[b, p, h, d_head]``."""

    def get(raw, a):
        h = a.n_kv_heads if kv else a.n_heads
        return raw.reshape(*raw.shape[:-1], h, a.d_head)

    def put(raw, new, a):
        return new.reshape(raw.shape)

    return Codec(get, put)


def _fused_split(index: int) -> Codec:
    """GPT-2 ``c_attn``: ``[b, p, 3 * d]`` split into q | k | v blocks, each into heads."""

    def get(raw, a):
        d = a.n_heads * a.d_head
        part = raw[..., index * d : (index + 1) * d]
        return part.reshape(*raw.shape[:-1], a.n_heads, a.d_head)

    def put(raw, new, a):
        d = a.n_heads * a.d_head
        parts = list(raw.split(d, dim=-1))
        parts[index] = new.reshape(*raw.shape[:-1], d)
        return torch.cat(parts, dim=-1)

    return Codec(get, put)


def _fused_interleaved(index: int) -> Codec:
    """GPT-NeoX ``query_key_value``: ``[b, p, h * 3 * d_head]`` with q, k, v interleaved per head."""

    def get(raw, a):
        per_head = raw.reshape(*raw.shape[:-1], a.n_heads, 3 * a.d_head)
        return per_head[..., index * a.d_head : (index + 1) * a.d_head]

    def put(raw, new, a):
        per_head = list(raw.reshape(*raw.shape[:-1], a.n_heads, 3 * a.d_head).split(a.d_head, dim=-1))
        per_head[index] = new
        return torch.cat(per_head, dim=-1).reshape(raw.shape)

    return Codec(get, put)


@dataclass(frozen=True)
class Location:
    """Module path (``{l}`` = layer), ``"input"`` or ``"output"``, and the codec to the site's shape."""

    module: str
    io: str
    codec: Codec = field(default_factory=_identity)


@dataclass(frozen=True)
class Architecture:
    family: str
    locations: dict[str, Location]
    layers: str  # path of the block list, relative to the base model
    n_layers_attr: str = "num_hidden_layers"
    #: the norm whose output the attention's q/k/v projections read (``{l}`` = layer); None in a
    #: post-norm block (BERT), whose attention reads the residual stream itself
    attn_norm: str | None = None
    #: the norm whose output the MLP reads (from ``hook_resid_mid`` in a sequential block, from
    #: ``hook_resid_pre`` in a parallel one); None in a post-norm block (BERT), whose MLP reads the
    #: normalized sum of the attention sublayer, which no residual site precedes
    mlp_norm: str | None = None
    #: the linear layers LoRA adapts (module-name suffixes, as peft's ``target_modules``): every
    #: block's attention and MLP projections, named as this family names them
    lora: tuple[str, ...] = ()

    def location(self, site: str) -> Location:
        return self.locations[parse_site(site).kind]


def _decoder(layers, embed, final_norm, attn, qkv, z_module, mlp, resid_mid=None, pos_embed=None):
    loc = {
        "hook_embed": Location(embed, "output"),
        "hook_resid_pre": Location(f"{layers}.{{l}}", "input"),
        "attn.hook_z": Location(f"{layers}.{{l}}.{z_module}", "input", _heads()),
        "hook_attn_out": Location(f"{layers}.{{l}}.{attn}", "output", _first_of_tuple()),
        "hook_mlp_out": Location(f"{layers}.{{l}}.{mlp}", "output", _first_of_tuple()),
        "hook_resid_post": Location(f"{layers}.{{l}}", "output", _first_of_tuple()),
        "ln_final.hook_normalized": Location(final_norm, "output"),
    }
    loc.update(qkv)
    loc["attn.hook_in"] = Location(qkv["attn.hook_q"].module, "input")  # what the q projection reads
    loc["mlp.hook_in"] = Location(f"{layers}.{{l}}.{mlp}", "input")
    if resid_mid is not None:
        loc["hook_resid_mid"] = Location(f"{layers}.{{l}}.{resid_mid}", "input")
    if pos_embed is not None:
        loc["hook_pos_embed"] = Location(pos_embed, "output")
    return loc


ARCHITECTURES: dict[str, Architecture] = {
    "gpt2": Architecture(
        "gpt2",
        _decoder(
            "h",
            "wte",
            "ln_f",
            "attn",
            {f"attn.hook_{c}": Location("h.{l}.attn.c_attn", "output", _fused_split(i)) for i, c in enumerate("qkv")},
            "attn.c_proj",
            "mlp",
            resid_mid="ln_2",
            pos_embed="wpe",
        ),
        layers="h",
        attn_norm="h.{l}.ln_1",
        mlp_norm="h.{l}.ln_2",
        lora=("c_attn", "c_proj", "c_fc"),
    ),
    "gpt_neox": Architecture(
        "gpt_neox",
        _decoder(
            "layers",
            "embed_in",
            "final_layer_norm",
            "attention",
            {
                f"attn.hook_{c}": Location("layers.{l}.attention.query_key_value", "output", _fused_interleaved(i))
                for i, c in enumerate("qkv")
            },
            "attention.dense",
            "mlp",
        ),
        layers="layers",
        attn_norm="layers.{l}.input_layernorm",
        mlp_norm="layers.{l}.post_attention_layernorm",
        lora=("query_key_value", "dense", "dense_h_to_4h", "dense_4h_to_h"),
    ),
    "llama": Architecture(
        "llama",
        _decoder(
            "layers",
            "embed_tokens",
            "norm",
            "self_attn",
            {
                "attn.hook_q": Location("layers.{l}.self_attn.q_proj", "output", _heads()),
                "attn.hook_k": Location("layers.{l}.self_attn.k_proj", "output", _heads(kv=True)),
                "attn.hook_v": Location("layers.{l}.self_attn.v_proj", "output", _heads(kv=True)),
            },
            "self_attn.o_proj",
            "mlp",
            resid_mid="post_attention_layernorm",
        ),
        layers="layers",
        attn_norm="layers.{l}.input_layernorm",
        mlp_norm="layers.{l}.post_attention_layernorm",
        lora=("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"),
    ),
    "bert": Architecture(
        "bert",
        {
            "hook_embed": Location("embeddings.word_embeddings", "output"),
            "hook_resid_pre": Location("encoder.layer.{l}", "input"),
            "attn.hook_in": Location("encoder.layer.{l}.attention.self.query", "input"),
            "attn.hook_q": Location("encoder.layer.{l}.attention.self.query", "output", _heads()),
            "attn.hook_k": Location("encoder.layer.{l}.attention.self.key", "output", _heads()),
            "attn.hook_v": Location("encoder.layer.{l}.attention.self.value", "output", _heads()),
            "attn.hook_z": Location("encoder.layer.{l}.attention.output.dense", "input", _heads()),
            "hook_attn_out": Location("encoder.layer.{l}.attention.output.dense", "output"),
            "mlp.hook_in": Location("encoder.layer.{l}.intermediate", "input"),
            "hook_mlp_out": Location("encoder.layer.{l}.output.dense", "output"),
            "hook_resid_post": Location("encoder.layer.{l}", "output", _first_of_tuple()),
        },
        layers="encoder.layer",
        # every block's attention and MLP layers, not the pooler (its `dense` is unused by a read-out at a token)
        lora=("query", "key", "value", "attention.output.dense", "intermediate.dense", "output.dense"),
    ),
}

#: HuggingFace ``config.model_type`` -> entry of :data:`ARCHITECTURES`.
MODEL_TYPES: dict[str, str] = {
    "gpt2": "gpt2",
    "gpt_neox": "gpt_neox",
    "llama": "llama",
    "mistral": "llama",
    "qwen2": "llama",
    "qwen3": "llama",
    "bert": "bert",
}


class UnsupportedArchitectureError(ValueError):
    pass


def architecture_for(config) -> Architecture:
    """The table entry for a HuggingFace config, or an error that says how to add one."""
    model_type = getattr(config, "model_type", None)
    if model_type not in MODEL_TYPES:
        raise UnsupportedArchitectureError(
            f"no site mapping for architecture model_type={model_type!r} (known: "
            f"{', '.join(sorted(MODEL_TYPES))}). Add one in interp/architectures.py: an "
            "Architecture entry in ARCHITECTURES giving, for each site kind, the module path "
            "(relative to the base model, '{l}' for the layer), 'input' or 'output', and a codec; "
            f"then map MODEL_TYPES[{model_type!r}] to it. Or use backend='transformer_lens', "
            "whose TransformerBridge supports many architectures out of the box."
        )
    arch = ARCHITECTURES[MODEL_TYPES[model_type]]
    if arch.family == "gpt_neox" and not getattr(config, "use_parallel_residual", True):
        locs = dict(arch.locations)
        locs["hook_resid_mid"] = Location("layers.{l}.post_attention_layernorm", "input")
        arch = replace(arch, locations=locs)
    return arch


def arch_info(config) -> ArchInfo:
    n_heads = getattr(config, "num_attention_heads", None) or config.n_head
    d_model = getattr(config, "hidden_size", None) or config.n_embd
    d_head = getattr(config, "head_dim", None) or d_model // n_heads
    n_kv = getattr(config, "num_key_value_heads", None) or n_heads
    return ArchInfo(n_heads=n_heads, n_kv_heads=n_kv, d_head=d_head)


#: Where TransformerBridge's hook of the same name means something else for an architecture, the
#: bridge hook that matches the site's definition above (``model_type -> {site kind: bridge kind}``).
#: BERT's bridge ``hook_embed`` is the whole embedding block (word + position + type, normalized),
#: its ``hook_attn_out`` is after the residual add and LayerNorm, and its ``mlp.hook_in`` is the
#: whole layer's input; the sites are the word embeddings, the attention output projection and
#: the MLP's first linear layer's input, as for every other architecture.
BRIDGE_ALIASES: dict[str, dict[str, str]] = {
    "bert": {"hook_embed": "embed.hook_out", "hook_attn_out": "attn.o.hook_out", "mlp.hook_in": "mlp.in.hook_in"},
}


def bridge_hook_name(site: str, model_type: str | None) -> str:
    """The TransformerBridge hook that computes ``site`` for this architecture."""
    aliases = BRIDGE_ALIASES.get(model_type or "", {})
    parsed = parse_site(site)
    if parsed.kind not in aliases:
        return site
    kind = aliases[parsed.kind]
    return kind if parsed.layer is None else site_name(kind, parsed.layer)
