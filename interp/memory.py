"""Memory estimates made before any work, so that an analyzer that cannot fit refuses at once,
saying what to restrict, instead of failing (or swapping) an hour in.

Each analyzer adds up what it will hold at its peak (per batch of pairs, of prompts or of probes),
in the model's precision:

- a forward pass with a graph (attribution): the activations a backward pass keeps, about
  ``34 d + 5 h p`` bytes per token and layer in 16-bit precision (Korthikanti et al. 2022, for
  ``d`` the width, ``h`` heads and ``p`` positions), so half that many values, plus the logits
  three times (logits, log-softmax, gradient);
- a forward pass without one (patching): a few residual-sized tensors per token plus the logits
  twice (the logits and what the metric computes from them);
- the analyzer's own tensors: for EAP the receivers' input gradients and the senders' writes
  (``[R | S, n, pos, d]``), for edge patching the senders' writes and differences and the patched
  receivers' inputs, for activation, path and node patching the cached activations of both runs,
  for a Jacobian one backward pass's buffers per output coordinate vmapped at once (which sets
  how many are), for a probe sweep the solver's working set (``probes.logistic.solver_bytes``),
  for a capture the rows it returns (every prompt, or one shard of a store), held twice.

The estimate is compared with the memory the model's device can still give (on a GPU what
``torch.cuda.mem_get_info`` reports free plus what PyTorch holds reserved but unused; on Linux
``MemAvailable``, which counts reclaimable page cache). Measured at GPT-2-small shape the EAP
estimate (1.4 GB) is about 1.7x the resident-memory growth (0.8 GB), so a refusal means the run would not have fit
with a margin; ``interp.memory.enabled = False`` turns the check off.
"""

from __future__ import annotations

import torch

#: set to False to run whatever the estimate says
enabled = True


def available_bytes(device) -> int | None:
    """Memory ``device`` can still give now, or None where it cannot be read (then nothing is
    refused)."""
    device = torch.device(device)
    if device.type == "cuda":
        free = torch.cuda.mem_get_info(device)[0]
        return int(free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device))
    if device.type != "cpu":
        return None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:  # not Linux
        pass
    return None


def element_bytes(model) -> int:
    return next(model.module.parameters()).element_size()


def vocab_size(model) -> int:
    try:
        return int(model.input_embeddings().shape[0])
    except (TypeError, AttributeError):  # no HuggingFace model to read it from (TransformerLens-native)
        return int(model.backend.bridge.cfg.d_vocab)


def forward_bytes(model, rows: int, n_pos: int, graph: bool) -> int:
    """Peak activation memory of one forward pass of ``rows`` sequences of ``n_pos`` tokens
    (``graph=True``: kept for a backward pass)."""
    per_token = (34 * model.d_model + 5 * model.n_heads * n_pos) // 2 if graph else 8 * model.d_model
    layers = model.n_layers if graph else 1
    logits = (3 if graph else 2) * vocab_size(model)
    return rows * n_pos * (layers * per_token + logits) * element_bytes(model)


def activation_bytes(model, rows: int, n_pos: int, sites: int = 1) -> int:
    """``sites`` cached residual-sized activations of ``rows`` sequences."""
    return sites * rows * n_pos * model.d_model * element_bytes(model)


def check_fits(need: int, where, what: str, advice: str) -> None:
    """Refuse (``MemoryError``) when ``need`` bytes exceed the memory free on ``where`` (a device,
    or a model: its device)."""
    if not enabled:
        return
    device = getattr(where, "device", where)
    free = available_bytes(device)
    if free is not None and need > free:
        raise MemoryError(
            f"{what} would need about {need / 1024**3:.1f} GiB at its peak, and {free / 1024**3:.1f} GiB is "
            f"free on {device}: {advice} (or set interp.memory.enabled = False to run anyway)"
        )
