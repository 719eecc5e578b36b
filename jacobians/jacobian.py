"""Per-example Jacobians between any two sites of a model, batched with ``torch.func.vmap``.

For an input site ``x`` (the token embeddings, or any hidden state) at one position and an output
``y`` (the logits, or any later site) at one position, the Jacobian ``J = dy/dx`` of each example
is a ``[d_out, d_in]`` matrix. Examples in a batch do not interact, so one forward pass over the
batch and one *vmapped* backward pass, with a one-hot cotangent per output coordinate, give
every example's full Jacobian at once (``torch.autograd.grad(..., is_grads_batched=True)``, which
runs ``torch.func.vmap`` over the vector-Jacobian product). ``method="loop"`` does the same with
one backward pass per output coordinate, the reference the benchmark compares against. Each
vmapped coordinate holds its own backward buffers, so the coordinates go in as many passes as the
free memory needs (:mod:`interp.memory`; the logits of a large vocabulary take several).

The input is replaced by a fresh leaf tensor at its site, so any site works on either backend;
the output must come after the input in the forward pass (else: :class:`JacobianError`).

    >>> J = jacobian(model, prompts, wrt="hook_embed", of="logits")      # [batch, vocab, d_model]
    >>> J = jacobian(model, prompts, wrt="blocks.1.hook_resid_post", of="blocks.3.hook_resid_post",
    ...              wrt_position="subject_last", of_position="last")      # [batch, d_model, d_model]
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from jaxtyping import Float

from interp import memory
from interp.prompts import as_prompts
from interp.sites import parse_site
from interp.tokens import Batch, resolve_positions

Tensor = torch.Tensor


class JacobianError(ValueError):
    """An impossible Jacobian: output before input, no dependence, bad shapes."""


def check_order(model, wrt: str, of: str) -> None:
    model.check_sites([wrt] + ([] if of == "logits" else [of]))
    if of != "logits" and parse_site(of).order <= parse_site(wrt).order:
        raise JacobianError(
            f"the output site {of!r} is computed before (or at) the input site {wrt!r}, so it cannot depend on "
            "it; choose an output later in the forward pass (a later layer, or 'logits')"
        )


def positions_tensor(model, prompts, batch: Batch, spec) -> Tensor:
    """Padded index of one position per prompt (``"last"``, ``"subject_last"``, ``"subject_first"`` or an int)."""
    enc = model.encode(prompts)
    out = []
    for row, (e, p) in enumerate(zip(enc, prompts)):
        ix = resolve_positions(e, p, spec, row)
        if len(ix) != 1:
            raise JacobianError(f"position {spec!r} must name one token per prompt; prompt {row} gives {len(ix)}")
        out.append(ix[0] + int(batch.shift[row]))
    return torch.tensor(out)


def batches(model, prompts, batch_size: int, wrt_position, of_position):
    """``(chunk, batch, input positions, output positions)`` for each batch of prompts."""
    prompts = as_prompts(prompts)
    for i in range(0, len(prompts), batch_size):
        chunk = prompts[i : i + batch_size]
        batch = model.batch(model.encode(chunk), "right")
        wrt_ix = positions_tensor(model, chunk, batch, wrt_position)
        yield chunk, batch, wrt_ix, positions_tensor(model, chunk, batch, of_position)


def forward_with_input(
    model, batch: Batch, wrt: str, of: str, wrt_pos: Tensor, of_pos: Tensor, x: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """Run with the input site's value at ``wrt_pos`` taken from leaf ``x`` (default: its own value,
    detached); returns ``(x [batch, d_in], y [batch, d_out])`` connected by autograd."""
    rows = torch.arange(len(wrt_pos))
    holder: dict[str, Tensor] = {}

    def put(act):
        leaf = act[rows, wrt_pos].detach().clone().requires_grad_(True) if x is None else x
        holder["x"] = leaf
        new = act.detach().clone() if x is None else act.clone()
        new[rows, wrt_pos] = leaf.to(new.dtype)
        return new

    hooks = {wrt: put}
    if of != "logits":

        def keep(act):
            holder["y"] = act

        hooks[of] = keep
    with torch.enable_grad():
        logits = model.run(batch, hooks)
        y = logits if of == "logits" else holder["y"]
        y = y[rows, of_pos.to(y.device)]
    if y.dim() > 2:
        y = y.flatten(1)
    return holder["x"], y


def jacobian(
    model,
    prompts,
    wrt: str = "hook_embed",
    of: str = "logits",
    wrt_position="last",
    of_position="last",
    batch_size: int = 16,
    method: str = "vmap",
) -> Float[Tensor, "batch d_out d_in"]:
    """Per-example Jacobian ``d of[of_position] / d wrt[wrt_position]`` for each prompt."""
    if method not in ("vmap", "loop"):
        raise ValueError(f"method must be 'vmap' or 'loop', got {method!r}")
    check_order(model, wrt, of)
    out = []
    for _, batch, wpos, opos in batches(model, prompts, batch_size, wrt_position, of_position):
        chunk = coordinates_per_pass(model, batch, wrt, of) if method == "vmap" else None
        x, y = forward_with_input(model, batch, wrt, of, wpos, opos)
        out.append(jacobian_of(y, x, method, chunk=chunk).detach())
    return torch.cat(out)


def coordinates_per_pass(model, batch: Batch, wrt: str, of: str) -> int | None:
    """How many output coordinates one vmapped backward pass of ``batch`` can take, called before
    its forward pass: each holds its own backward buffers (a few residual-sized gradients and the
    attention patterns' per token and, with ``of="logits"``, the logits' gradient at every
    position) beside the graph and the result.
    Half the free memory goes to them (``None``: no limit known). Refuses (``MemoryError``) when
    the graph and a single coordinate do not fit."""
    rows, n_pos = batch.input_ids.shape
    size = memory.element_bytes(model)
    d_out = memory.vocab_size(model) if of == "logits" else model.d_model * model.n_heads  # at most
    # held throughout: the graph and the result, [rows, d_out, d_in]
    fixed = memory.forward_bytes(model, rows, n_pos, graph=True) + rows * d_out * model.d_model * size
    # a few residual-sized gradients per token, the attention patterns', and the logits' if read
    per = memory.activation_bytes(model, rows, n_pos, sites=8) + rows * model.n_heads * n_pos * n_pos * size
    if of == "logits":
        per += rows * n_pos * memory.vocab_size(model) * size
    memory.check_fits(
        fixed + per,
        model,
        f"a Jacobian of {wrt} -> {of} on batches of {rows} prompts x {n_pos} positions",
        "use a smaller batch_size or shorter prompts",
    )
    free = memory.available_bytes(model.device) if memory.enabled else None
    return None if free is None else int(max(1, (free // 2 - fixed) // per))


def jacobian_of(
    y: Float[Tensor, "batch d_out"],
    x: Float[Tensor, "batch d_in"],
    method: str = "vmap",
    create_graph: bool = False,
    chunk: int | None = None,
) -> Float[Tensor, "batch d_out d_in"]:
    """Per-example Jacobians of ``y`` w.r.t. ``x`` (rows of the batch independent). ``chunk``:
    output coordinates per vmapped backward pass (default: all in one)."""
    d_out = y.shape[1]
    if not y.requires_grad:
        raise JacobianError(
            "the output does not depend on the input through differentiable operations "
            "(is the input site upstream of the output? was something detached?)"
        )
    eye = torch.eye(d_out, dtype=y.dtype, device=y.device)
    if method == "vmap":

        def vmapped(cot_rows: Tensor) -> Tensor:  # [k, d_out] one-hot rows -> [batch, k, d_in]
            (g,) = torch.autograd.grad(
                y,
                x,
                grad_outputs=cot_rows[:, None, :].expand(-1, y.shape[0], d_out),
                is_grads_batched=True,
                retain_graph=True,
                create_graph=create_graph,
                allow_unused=True,
            )
            if g is None:
                raise JacobianError("the output does not depend on the input")
            return g.movedim(0, 1)

        step = d_out if chunk is None else max(1, chunk)
        starts = range(0, d_out, step)
        if step >= d_out:
            return vmapped(eye)
        if create_graph:  # differentiable pieces, joined
            return torch.cat([vmapped(eye[s : s + step]) for s in starts], 1)
        out = None  # filled in place: the result is held once, not twice
        for s in starts:
            piece = vmapped(eye[s : s + step])
            if out is None:
                out = piece.new_empty(piece.shape[0], d_out, *piece.shape[2:])
            out[:, s : s + step] = piece
        return out
    rows = []
    for c in range(d_out):
        (g,) = torch.autograd.grad(
            y, x, grad_outputs=eye[c].expand_as(y), retain_graph=True, create_graph=create_graph, allow_unused=True
        )
        if g is None:
            raise JacobianError("the output does not depend on the input")
        rows.append(g)
    return torch.stack(rows, dim=1)


def vjp(
    model,
    prompts,
    cotangent: Tensor | None = None,
    wrt: str = "hook_embed",
    of: str = "logits",
    wrt_position="last",
    of_position="last",
    batch_size: int = 32,
) -> tuple[Tensor, Tensor]:
    """``(x, J^T v)`` per example with one backward pass; ``v`` defaults to all ones (the
    GrokAlign centroid ``mu_x = J_x^T 1``)."""
    check_order(model, wrt, of)
    xs, gs, i = [], [], 0
    for chunk, batch, wpos, opos in batches(model, prompts, batch_size, wrt_position, of_position):
        x, y = forward_with_input(model, batch, wrt, of, wpos, opos)
        v = torch.ones_like(y) if cotangent is None else cotangent[i : i + len(chunk)].to(y)
        i += len(chunk)
        if v.shape != y.shape:
            raise JacobianError(f"cotangent shape {tuple(v.shape)} does not match the output {tuple(y.shape)}")
        (g,) = torch.autograd.grad(y, x, grad_outputs=v, allow_unused=True)
        if g is None:
            raise JacobianError("the output does not depend on the input")
        xs.append(x.detach())
        gs.append(g.detach())
    return torch.cat(xs), torch.cat(gs)


__all__: Sequence[str] = [
    "JacobianError",
    "coordinates_per_pass",
    "jacobian",
    "jacobian_of",
    "vjp",
    "forward_with_input",
]
