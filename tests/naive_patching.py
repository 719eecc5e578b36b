"""Plain, unbatched reference implementations the batched analyzers are tested against."""

from __future__ import annotations

import torch


def _site(kind, layer=None):
    names = {
        "z": "attn.hook_z",
        "mlp_out": "hook_mlp_out",
        "embed": "hook_embed",
        "q": "attn.hook_q",
        "k": "attn.hook_k",
        "v": "attn.hook_v",
        "resid_post": "hook_resid_post",
    }
    return names[kind] if kind == "embed" else f"blocks.{layer}.{names[kind]}"


@torch.no_grad()
def naive_path_patch(model, pairs, metric, sender, receiver, mlps="frozen"):
    """One sender, one receiver, one pass per step, every hook written out (clean run, sender corrupted)."""
    clean, corr = pairs.clean, pairs.corrupted
    names = (
        [_site("z", l) for l in range(model.n_layers)]
        + [_site("mlp_out", l) for l in range(model.n_layers)]
        + [_site("embed")]
    )
    clean_cache = model.read(clean, names)
    corr_cache = model.read(corr, names)
    if receiver.kind == "head":
        rsite = _site(receiver.input, receiver.layer)
    elif receiver.kind == "mlp":
        rsite = _site("mlp_out", receiver.layer)
    else:
        rsite = _site("resid_post", model.n_layers - 1)
    recorded = {}
    hooks = {}
    for layer in range(model.n_layers):

        def z_hook(act, layer=layer):
            new = clean_cache[_site("z", layer)].clone()
            if sender.kind == "head" and sender.layer == layer:
                new[:, :, sender.head] = corr_cache[_site("z", layer)][:, :, sender.head]
            return new

        def mlp_hook(act, layer=layer):
            name = _site("mlp_out", layer)
            if name == rsite:
                recorded["value"] = act.clone()
            if sender.kind == "mlp" and sender.layer == layer:
                return corr_cache[name].clone()
            return clean_cache[name].clone() if mlps == "frozen" else act

        hooks[_site("z", layer)] = z_hook
        hooks[_site("mlp_out", layer)] = mlp_hook
    if sender.kind == "embed":
        hooks[_site("embed")] = lambda act: corr_cache[_site("embed")].clone()
    if rsite not in hooks:

        def rec(act):
            recorded["value"] = act.clone()

        hooks[rsite] = rec
    model.run(clean, hooks)
    value = recorded["value"]

    def patch(act):
        new = act.clone()
        if receiver.kind == "head":
            new[:, :, receiver.head] = value[:, :, receiver.head]
        else:
            new = value.clone()
        return new

    logits = model.run(clean, {rsite: patch})
    return float(metric.reduce(logits, pairs).mean())
