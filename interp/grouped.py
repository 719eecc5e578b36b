"""Many trainable copies of one model as one module: ``G`` parameter sets, one forward pass.

A study trains hundreds of small fine-tunes of the same model (different relations, label maps or
seeds). Run one after another, each step of each fine-tune is a small forward and backward pass
whose cost on a GPU is mostly kernel launches, and on a CPU mostly per-operation overhead. A
:class:`Grouped` module runs ``G`` of them at once: a batch of ``G x B`` rows, where rows
``g*B .. (g+1)*B - 1`` belong to job ``g``, goes through the model once; every leaf module that
owns trainable parameters (a linear layer, GPT-2's ``Conv1D``, a norm, a LoRA adapter's matrices)
is replaced by a grouped leaf that holds the ``G`` copies stacked (``[G, ...]``) and applies copy
``g`` to job ``g``'s rows (``torch.func.vmap`` of ``torch.func.functional_call`` over the leaf: a
batched matmul). Everything between the leaves (attention, masks, activations) acts on rows one
at a time, so the rows of one job never meet another job's parameters or rows. A loss that is a
sum of per-job losses then gives each job's gradient in its own slice of the stacked parameters,
and an elementwise optimizer (AdamW) updates each slice exactly as that job's own optimizer would.

>>> group = Grouped(template, [copy.module for copy in copies])  # template: a spare copy to rewire
>>> opt = torch.optim.AdamW(group.parameters(), lr=1e-3)
>>> loss = sum(per_job_losses(template.forward(rows)))          # rows: G x B, job-major
>>> group.write(g, copies[g].module)                            # job g's parameters, into its copy
>>> opt = group.keep([0, 2], opt)                               # jobs 1, 3 stop; the group goes on

What a group cannot do: draw a job's dropout masks as that job alone would (one random stream
serves all rows), so :func:`dropout_in` reports the dropout a model trains with and callers refuse
to group such models rather than return fine-tunes that differ from the one-at-a-time ones.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence

import torch
from torch import nn
from torch.func import functional_call, vmap

Tensor = torch.Tensor


class GroupedLeaf(nn.Module):
    """``leaf`` applied with ``G`` stacked copies of its trainable parameters, copy ``g`` to the
    ``g``-th block of rows of its input (the frozen parameters and buffers are shared)."""

    def __init__(self, leaf: nn.Module, copies: Sequence[nn.Module]):
        super().__init__()
        self.leaf = leaf
        self.names = [n for n, p in leaf.named_parameters(recurse=False) if p.requires_grad]
        for n in self.names:
            leaf.get_parameter(n).requires_grad_(False)  # the shared leaf's own copy is never trained
        self.stacked = nn.ParameterList(
            nn.Parameter(torch.stack([c.get_parameter(n).detach() for c in copies]).clone()) for n in self.names
        )

    @property
    def groups(self) -> int:
        return self.stacked[0].shape[0]

    def __getattr__(self, name: str):
        """Anything else is the leaf's (code around a layer reads e.g. its ``weight.dtype``)."""
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self._modules["leaf"], name)

    def forward(self, x: Tensor, *args, **kwargs) -> Tensor:
        g = self.groups
        if x.shape[0] % g:
            raise ValueError(f"a grouped forward needs {g} equal blocks of rows; got {x.shape[0]} rows")
        fast = None if args or kwargs else self._direct(x)
        if fast is not None:
            return fast
        blocks = x.reshape(g, x.shape[0] // g, *x.shape[1:])

        def one(params, rows):
            return functional_call(self.leaf, dict(zip(self.names, params)), (rows, *args), kwargs)

        out = vmap(one)(tuple(self.stacked), blocks)
        return out.reshape(x.shape[0], *out.shape[2:])

    def _direct(self, x: Tensor) -> Tensor | None:
        """The common leaves as one batched matmul (or norm) over the group, without vmap's
        per-call tracing: a linear layer, GPT-2's Conv1D, a LayerNorm, each with every parameter
        trained (else None: the vmap path)."""
        leaf, p = self.leaf, dict(zip(self.names, self.stacked))
        rows = x.reshape(self.groups, -1, x.shape[-1])  # [G, rows of a job x positions, d_in]
        kind = type(leaf).__name__
        if isinstance(leaf, nn.Linear) and set(p) == ({"weight", "bias"} if leaf.bias is not None else {"weight"}):
            out = torch.bmm(rows, p["weight"].transpose(1, 2))
            out = out + p["bias"][:, None] if "bias" in p else out
        elif kind == "Conv1D" and set(p) == {"weight", "bias"}:  # HuggingFace's: x @ W + b, W stored [in, out]
            out = torch.baddbmm(p["bias"][:, None], rows, p["weight"])
        elif isinstance(leaf, nn.LayerNorm) and set(p) == {"weight", "bias"} and len(leaf.normalized_shape) == 1:
            out = nn.functional.layer_norm(rows, leaf.normalized_shape, None, None, leaf.eps)
            out = out * p["weight"][:, None] + p["bias"][:, None]
        else:
            return None
        return out.reshape(*x.shape[:-1], out.shape[-1])


def trainable_leaves(module: nn.Module) -> list[str]:
    """Names of the modules that own trainable parameters directly."""
    return [name for name, m in module.named_modules() if any(p.requires_grad for p in m.parameters(recurse=False))]


class Grouped:
    """``template`` (a module of the same architecture as every copy; rewired in place, its own
    trainable values unused) made to run ``copies``' trainable parameters as one group (see the
    module docstring). Every trainable parameter must sit in a leaf module (one without children),
    as it does in HuggingFace and peft models."""

    def __init__(self, template: nn.Module, copies: Sequence[nn.Module]):
        if not copies:
            raise ValueError("a group needs at least one copy")
        names = trainable_leaves(template)
        for c in copies:
            if trainable_leaves(c) != names:
                raise ValueError("every copy in a group must train the same parameters as the template")
        # every place a leaf hangs: a wrapper (TransformerLens' bridge) can reach one layer through
        # more than one parent module, and each of them must call the grouped leaf
        edges: dict[int, list[tuple[nn.Module, str]]] = {}
        for parent in template.modules():
            for attr, child in parent._modules.items():
                if child is not None:
                    edges.setdefault(id(child), []).append((parent, attr))
        self.leaves: dict[str, GroupedLeaf] = {}
        for name in names:
            leaf = template.get_submodule(name)
            if next(leaf.children(), None) is not None:
                raise ValueError(
                    f"{name} owns trainable parameters and has submodules; a group can only stack the "
                    "parameters of leaf modules"
                )
            grouped = GroupedLeaf(leaf, [c.get_submodule(name) for c in copies])
            for parent, attr in edges[id(leaf)]:
                setattr(parent, attr, grouped)
            self.leaves[name] = grouped
        if not self.leaves:
            raise ValueError("the model has no trainable parameters to group")
        self.template = template

    @property
    def size(self) -> int:
        return next(iter(self.leaves.values())).groups

    def parameters(self) -> list[nn.Parameter]:
        return [p for leaf in self.leaves.values() for p in leaf.stacked]

    @torch.no_grad()
    def write(self, g: int, module: nn.Module) -> None:
        """Job ``g``'s current parameters into ``module`` (one of the copies: same architecture)."""
        for name, leaf in self.leaves.items():
            target = module.get_submodule(name)
            for n, stacked in zip(leaf.names, leaf.stacked):
                target.get_parameter(n).copy_(stacked[g])

    @torch.no_grad()
    def keep(self, jobs: Sequence[int], optimizer: torch.optim.Optimizer | None = None) -> torch.optim.Optimizer | None:
        """Only ``jobs`` (indices into the current group, in order) go on: every stacked parameter
        is replaced by a new one holding their slices, and the optimizer by one of the same kind and
        settings over the new parameters whose per-element state (AdamW's momenta) is sliced the
        same way (a parameter's shape cannot change under autograd, hence new ones). Returns the new
        optimizer."""
        index = torch.as_tensor(list(jobs), dtype=torch.long)
        if not len(index):
            raise ValueError("keep at least one job (a finished group is simply no longer stepped)")
        moved = []
        for leaf in self.leaves.values():
            for i, old in enumerate(leaf.stacked):
                new = nn.Parameter(old.detach()[index.to(old.device)].clone())
                state = optimizer.state.get(old, {}) if optimizer is not None else {}
                moved.append(
                    (
                        new,
                        {
                            k: v[index.to(v.device)].clone() if torch.is_tensor(v) and v.shape == old.shape else v
                            for k, v in state.items()
                        },
                    )
                )
                leaf.stacked[i] = new
        if optimizer is None:
            return None
        accepted = inspect.signature(type(optimizer)).parameters
        settings = {k: v for k, v in optimizer.param_groups[0].items() if k != "params" and k in accepted}
        fresh = type(optimizer)(self.parameters(), **settings)
        for p, state in moved:
            if state:
                fresh.state[p] = state
        return fresh


def dropout_in(module: nn.Module) -> dict[str, float]:
    """The dropout probabilities above zero a module trains with: ``nn.Dropout`` layers, and the
    configuration's dropout fields (attention dropout is often applied inside the attention
    function, not by a module)."""
    found = {
        name: m.p for name, m in module.named_modules() if isinstance(m, nn.modules.dropout._DropoutNd) and m.p > 0
    }
    config = getattr(module, "config", None)
    if config is not None:
        for key, value in config.to_dict().items():
            if ("dropout" in key or "pdrop" in key) and "summary" not in key and isinstance(value, float) and value > 0:
                found[f"config.{key}"] = value
    return found
