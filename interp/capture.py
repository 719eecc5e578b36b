"""Capture: run batched forward passes and keep only the requested sites at the requested tokens.

>>> model = interp.load_model("world")
>>> acts = interp.capture(model, prompts, sites=["blocks.2.hook_resid_post"], positions="subject_last")
>>> acts["blocks.2.hook_resid_post"].shape        # [n_prompts, d_model]

Each hook gathers ``activation[row, token]`` for its batch as the forward pass goes, so the
memory held is one small tensor per site, never a full cache; and the pass stops right after the
last requested site (``Model.run(stop_early=True)``), so capturing layer ``l`` of ``L`` costs
about ``(l + 1) / L`` of a forward pass, and even the last layer skips the unembedding. With ``store=path`` the results
stream to an :class:`~interp.store.ActivationStore` shard by shard; a capture that is
interrupted and called again with the same arguments resumes at the first missing shard.

Returned shapes: ``[n, ...site]`` for a single position per prompt (``"last"``,
``"subject_last"``, an ``int``), ``[n, k, ...site]`` for a list of ``k`` ints, and
``[n, max_len, ...site]`` for ``"all"`` (zero-padded at the end; ``Activations.mask`` marks real
tokens). ``...site`` is ``d_model`` or ``head, d_head``.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path

import torch

from . import memory
from .models import Model, load_model
from .progress import progress_bar
from .prompts import Prompt, as_prompts
from .store import ActivationStore
from .tokens import PositionSpec, encode, resolve_positions


class Activations(dict):
    """``site -> tensor`` with the prompts and positions they came from (and a mask for ``"all"``)."""

    def __init__(self, data, prompts: list[Prompt], positions: PositionSpec, mask: torch.Tensor | None = None):
        super().__init__(data)
        self.prompts = prompts
        self.positions = positions
        self.mask = mask


def capture(
    model,
    inputs,
    sites: str | Sequence[str],
    positions: PositionSpec = "last",
    *,
    batch_size: int = 32,
    dtype: torch.dtype | None = None,
    device: str | torch.device = "cpu",
    padding_side: str | None = None,
    store: str | Path | ActivationStore | None = None,
    shard_size: int = 1024,
    progress: bool | None = None,
):
    """Activations of ``model`` at ``sites`` and ``positions`` for every prompt in ``inputs``.

    ``dtype``/``device``: of the returned tensors (default: the model's dtype, on the CPU); the
    forward pass runs wherever the model is. ``progress``: a progress bar (default: when
    attached to a terminal). Returns :class:`Activations`, or the store when ``store`` is given.
    """
    if not isinstance(model, Model):
        model = load_model(model)
    sites = model.check_sites(sites)
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}")
    prompts = as_prompts(inputs)
    encoded = encode(model.tokenizer, prompts)
    token_positions = [resolve_positions(e, p, positions, i) for i, (e, p) in enumerate(zip(encoded, prompts))]
    dtype = dtype or model.dtype
    job = _Job(model, sites, encoded, token_positions, positions, batch_size, dtype, torch.device(device), padding_side)
    job.check_memory(len(prompts) if store is None else min(shard_size, len(prompts)))

    if store is None:
        bar = progress_bar(total=len(prompts), desc="capture", unit="prompts", progress=progress, threshold=batch_size)
        data, mask = job.rows(0, len(prompts), bar)
        bar.close()
        return Activations(data, prompts, positions, mask)

    if getattr(model, "_standing", ()):
        raise ValueError(
            "a capture to a store is keyed by the model's weights, and this handle also intervenes on every "
            "forward pass (model.intervened): its activations would be confused with the plain model's; "
            "capture it in memory (no store=)"
        )
    if not isinstance(store, ActivationStore):
        store = ActivationStore(store)
    key = {
        "model": model.fingerprint(),
        "data": data_hash(prompts, positions),
        "sites": list(sites),
        "dtype": str(dtype).replace("torch.", ""),
    }
    store.prepare(key, n_rows=len(prompts), shard_size=shard_size)
    todo = store.missing_shards()
    bar = progress_bar(total=len(prompts), desc="capture", unit="prompts", progress=progress, threshold=batch_size)
    bar.update(len(prompts) - sum(store.shard_rows(i) for i in todo))
    for i in todo:
        start, stop = store.shard_range(i)
        data, mask = job.rows(start, stop, bar)
        if mask is not None:
            data["__mask__"] = mask
        store.write_shard(i, data)
    bar.close()
    return store


def data_hash(prompts: Sequence[Prompt], positions: PositionSpec) -> str:
    rows = [[p.text, p.subject] if p.ids is None else list(p.ids) for p in prompts]
    payload = json.dumps({"prompts": rows, "positions": positions}, sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


class _Job:
    """Everything needed to capture any contiguous range of prompts (one shard, or all)."""

    def __init__(self, model, sites, encoded, token_positions, spec, batch_size, dtype, device, padding_side):
        self.model, self.sites, self.encoded = model, sites, encoded
        self.token_positions, self.spec = token_positions, spec
        self.batch_size, self.dtype, self.device, self.padding_side = batch_size, dtype, device, padding_side
        self.all_tokens = spec == "all"
        self.width = max(len(p) for p in token_positions)

    def check_memory(self, n_rows: int) -> None:
        """Refuse before any pass when one batch's forward, or the ``n_rows`` captured rows (every
        prompt, or one shard of a store), would not fit: the rows are held twice at their peak (the
        batches' pieces and their concatenation; three times with every token's mask applied), each
        site as wide as :meth:`~interp.Model.site_width` says (``d_model`` where it does not know)."""
        model, n_sites = self.model, len(self.sites)
        per_token = sum(model.site_width(s) or model.d_model for s in self.sites)  # values, all sites
        longest = max((len(e) for e in self.encoded), default=1)
        k = self.width if self.all_tokens else max((len(p) for p in self.token_positions), default=1)
        element = torch.empty((), dtype=self.dtype).element_size()
        held = (3 if self.all_tokens else 2) * n_rows * k * per_token * element
        forward = memory.forward_bytes(model, min(self.batch_size, len(self.encoded)), longest, graph=False)
        what = f"capturing {n_sites} sites at {k} positions of {n_rows} prompts"
        advice = (
            f"use fewer prompts or write them to a store in shards (store=..., shard_size=..., now "
            f"{n_rows} rows at once), fewer sites, fewer positions, a smaller dtype, or a smaller batch_size "
            f"(now {self.batch_size} prompts per pass)"
        )
        if torch.device(self.device) == torch.device(model.device):
            memory.check_fits(held + forward, model, what, advice)
        else:
            memory.check_fits(forward, model, what, advice)
            memory.check_fits(held, self.device, what, advice)

    def rows(self, start: int, stop: int, bar) -> tuple[dict[str, torch.Tensor], torch.Tensor | None]:
        chunks: dict[str, list[torch.Tensor]] = {s: [] for s in self.sites}
        for b0 in range(start, stop, self.batch_size):
            b1 = min(b0 + self.batch_size, stop)
            batch = self.model.batch(self.encoded[b0:b1], self.padding_side)
            rows, cols = self._index(batch.shift, b0, b1)
            rows_d, cols_d = rows.to(self.model.device), cols.to(self.model.device)

            def gather(name):
                def fn(act):
                    picked = act[rows_d, cols_d]  # [n_rows * k, ...site]
                    chunks[name].append(picked.detach().to(device=self.device, dtype=self.dtype))

                return fn

            with torch.no_grad():
                self.model.run(batch, {s: gather(s) for s in self.sites}, stop_early=True)
            bar.update(b1 - b0)
        n = stop - start
        k = self.width if self.all_tokens else len(self.token_positions[start])
        data = {}
        for s, parts in chunks.items():
            flat = torch.cat(parts)
            data[s] = flat.reshape(n, k, *flat.shape[1:])
        mask = None
        if self.all_tokens:
            lengths = torch.tensor([len(p) for p in self.token_positions[start:stop]])
            mask = torch.arange(k)[None, :] < lengths[:, None]
            for s in data:
                data[s] = data[s] * mask.reshape(n, k, *[1] * (data[s].dim() - 2)).to(data[s].dtype)
        elif _single(self.spec):
            data = {s: t[:, 0] for s, t in data.items()}
        return data, mask

    def _index(self, shift: torch.Tensor, b0: int, b1: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Flat (row, padded column) indices of every wanted token in batch ``b0:b1``."""
        rows, cols = [], []
        for r, i in enumerate(range(b0, b1)):
            pos = self.token_positions[i]
            if self.all_tokens:  # pad to the widest prompt by repeating the last token (masked later)
                pos = pos + [pos[-1]] * (self.width - len(pos))
            rows += [r] * len(pos)
            cols += [p + int(shift[r]) for p in pos]
        return torch.tensor(rows), torch.tensor(cols)


def _single(spec: PositionSpec) -> bool:
    return isinstance(spec, int) or (isinstance(spec, str) and spec != "all")
