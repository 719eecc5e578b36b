"""How ``tests/data/sae_lens/`` was written: by sae-lens's own code (sae-lens 6.54.12), not by this
toolkit.

sae-lens 6 requires TransformerLens < 4 and does not import beside this project's TransformerLens 4
(sae-lens issue #738), so it runs in an environment of its own::

    python3 -m venv /tmp/sae-venv
    /tmp/sae-venv/bin/pip install torch==2.13.0 sae-lens==6.54.12    # torch pinned: the CPU wheel
    /tmp/sae-venv/bin/python tests/data/make_sae_fixtures.py tests/data/sae_lens

For each of the three architectures sae-lens 6 saves by default (``standard``: ReLU, ``topk``,
``jumprelu``) it builds a small SAE with sae-lens's own classes, sized for the shipped world model
(``d_in`` 128 = its ``d_model``, or 4 heads x 32 for ``attn.hook_z``; ``d_sae`` 256), gives every
parameter seeded random values (a fresh SAE has zero biases and thresholds, which would hide a
mistake in how they are applied), and writes

- ``<name>/``: the folder ``SAE.save_model`` writes (``cfg.json`` + ``sae_weights.safetensors``), which
  ``SAE.load_from_disk`` reads; the standard SAE's folder also holds the ``sparsity.safetensors``
  (``{"sparsity": log10 feature density}``) that sae-lens's trainer saves beside a checkpoint;
- ``<name>.reference.safetensors``: a fixed random input ``x`` and sae-lens's own outputs on it, from
  the SAE loaded back with ``SAE.load_from_disk``: ``features = sae.encode(x)``,
  ``reconstruction = sae.decode(features)``, ``output = sae(x)``.

The three SAEs also cover the options that change the arithmetic: ``apply_b_dec_to_input`` on and
off, the top-k SAE's ``rescale_acts_by_decoder_norm``, and the ``hook_z`` reshape (an SAE on
per-head attention outputs, ``[..., head, d_head]``).

**Folders this toolkit writes, read by sae-lens.** Each folder is also read with this toolkit's
``load_sae`` and written again with its ``save_sae``, by this project's own Python (``--project-python``,
default ``.venv/bin/python``; sae-lens and this toolkit cannot share an environment), and sae-lens's
``SAE.load_from_disk`` reads that folder back: ``<name>.reference.safetensors`` also holds its
``saved_features``, ``saved_reconstruction`` and ``saved_output`` on the same ``x``, with the config
sae-lens read (``saved_cfg``) and the SHA-256 of the two files it read (``saved_sha256``) in its
metadata, so that the suite can check that ``save_sae`` still writes those bytes.

**Edge cases** (``edge_cases.reference.safetensors``): two tiny SAEs with hand-chosen weights, where
an activation written slightly wrong gives other numbers: a JumpReLU SAE with negative thresholds
(a pre-activation above its threshold but negative must still be 0: the ReLU) and a feature whose
pre-activation equals its threshold exactly (``W_enc`` column 0, ``b_enc == threshold``: 0, the
comparison is ``>``), and a top-k SAE with fewer than ``k`` positive pre-activations (the rest of the
top ``k`` must be 0). It holds each SAE's weights (``<name>.W_enc``, ...), its config (metadata
``<name>.cfg``), an input ``<name>.x`` and sae-lens's ``encode`` of it (``<name>.features``).
"""

import argparse
import hashlib
import json
import subprocess
import tempfile
from pathlib import Path

import sae_lens
import torch
from sae_lens import SAE
from sae_lens.saes import (
    JumpReLUSAE,
    JumpReLUSAEConfig,
    StandardSAE,
    StandardSAEConfig,
    TopKSAE,
    TopKSAEConfig,
)
from sae_lens.saes.sae import SAEMetadata
from safetensors.torch import save_file

ROOT = Path(__file__).resolve().parents[2]
parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
parser.add_argument("out", nargs="?", default=str(ROOT / "tests" / "data" / "sae_lens"))
parser.add_argument("--project-python", default=str(ROOT / ".venv" / "bin" / "python"))
args = parser.parse_args()
OUT = Path(args.out)
D_SAE = 256
#: run by this project's Python: each folder read with load_sae and written again with save_sae
RESAVE = """
import sys
from interp.sae import load_sae, save_sae
source, target = sys.argv[1], sys.argv[2]
for name in sys.argv[3:]:
    save_sae(load_sae(f"{source}/{name}"), f"{target}/{name}")
"""


def metadata(hook_name: str) -> SAEMetadata:
    return SAEMetadata(model_name="world", hook_name=hook_name, hook_head_index=None, prepend_bos=False)


SAES = {
    # name: (SAE class, its config, the shape of one input row)
    "standard": (
        StandardSAE,
        StandardSAEConfig(
            d_in=128, d_sae=D_SAE, apply_b_dec_to_input=True, metadata=metadata("blocks.1.hook_resid_post")
        ),
        (128,),
    ),
    "topk": (
        TopKSAE,
        TopKSAEConfig(
            d_in=128,
            d_sae=D_SAE,
            k=16,
            rescale_acts_by_decoder_norm=True,
            apply_b_dec_to_input=False,
            metadata=metadata("blocks.2.hook_resid_pre"),
        ),
        (128,),
    ),
    "jumprelu": (
        JumpReLUSAE,
        JumpReLUSAEConfig(
            d_in=128,
            d_sae=D_SAE,
            apply_b_dec_to_input=True,
            reshape_activations="hook_z",
            metadata=metadata("blocks.2.attn.hook_z"),
        ),
        (4, 32),
    ),
}

inputs = {}
for i, (name, (cls, cfg, row)) in enumerate(SAES.items()):
    torch.manual_seed(100 + i)
    sae = cls(cfg)
    with torch.no_grad():
        for pname, p in sae.named_parameters():
            if pname == "threshold":
                p.copy_(torch.rand_like(p) * 0.5)  # JumpReLU thresholds in [0, 0.5)
            elif pname.startswith("b_"):
                p.copy_(torch.randn_like(p) * 0.1)
            else:  # W_enc, W_dec: untied, with uneven decoder row norms (they matter to the top-k rescale)
                p.copy_(torch.randn_like(p) * 0.1 * (0.5 + torch.rand(p.shape[0], 1)))
    folder = OUT / name
    sae.save_model(folder)
    if name == "standard":
        save_file({"sparsity": torch.log10(torch.rand(D_SAE) * 0.1 + 1e-6)}, folder / "sparsity.safetensors")
    torch.manual_seed(200 + i)
    inputs[name] = torch.randn(6, 5, *row)  # [batch, pos, ...row]


def outputs(folder: Path, x: torch.Tensor) -> tuple[SAE, dict[str, torch.Tensor]]:
    """What a user of sae-lens gets from the folder, and its encode, decode and forward on ``x``."""
    loaded = SAE.load_from_disk(folder)
    with torch.no_grad():
        features = loaded.encode(x)
        return loaded, {"features": features, "reconstruction": loaded.decode(features), "output": loaded(x)}


with tempfile.TemporaryDirectory() as saved:
    subprocess.run([args.project_python, "-c", RESAVE, str(OUT), saved, *SAES], check=True, cwd=ROOT)
    for name in SAES:
        loaded, ref = outputs(OUT / name, inputs[name])
        again, ref_saved = outputs(Path(saved) / name, inputs[name])
        files = ("cfg.json", "sae_weights.safetensors")
        digests = {f: hashlib.sha256((Path(saved) / name / f).read_bytes()).hexdigest() for f in files}
        save_file(
            {"x": inputs[name]} | ref | {f"saved_{k}": v for k, v in ref_saved.items()},
            OUT / f"{name}.reference.safetensors",
            metadata={
                "sae_lens_version": sae_lens.__version__,
                "torch_version": torch.__version__,
                "saved_cfg": json.dumps(again.cfg.to_dict(), default=str),
                "saved_class": type(again).__name__,
                "saved_sha256": json.dumps(digests),
            },
        )
        print(name, type(loaded).__name__, "active per row:", (ref["features"] > 0).sum(-1).float().mean().item())

# edge cases: tiny SAEs with hand-chosen weights (see the docstring) ------------------------------
EDGE = {
    # name: (SAE class, config, {parameter: values}, input rows)
    "jumprelu_edge": (
        JumpReLUSAE,
        JumpReLUSAEConfig(d_in=2, d_sae=5, apply_b_dec_to_input=False, metadata=metadata("blocks.0.hook_resid_post")),
        {
            "W_enc": [[1.0, 0.0, 0.0, -1.0, 1.0], [0.0, 1.0, 0.0, 0.0, 0.0]],
            "b_enc": [0.0, 0.0, 0.3, 0.0, 0.5],
            "threshold": [-0.5, 0.2, 0.3, -1.0, 0.1],  # negative thresholds; feature 2: b_enc == threshold
            "W_dec": [[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [-1.0, 0.0], [0.5, 0.5]],
            "b_dec": [0.0, 0.0],
        },
        [[-0.2, 0.5], [0.4, 0.2], [-0.7, -0.1]],
    ),
    "topk_edge": (
        TopKSAE,
        TopKSAEConfig(d_in=2, d_sae=5, k=3, apply_b_dec_to_input=False, metadata=metadata("blocks.0.hook_resid_post")),
        {
            "W_enc": [[1.0, -1.0, 0.5, -0.5, 0.0], [0.0, 0.0, 0.0, 0.0, 1.0]],
            "b_enc": [0.0, 0.0, 0.0, 0.0, -1.0],
            "W_dec": [[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [-1.0, 0.0], [0.5, 0.5]],
            "b_dec": [0.0, 0.0],
        },
        [[0.8, 0.3], [-0.6, 0.0], [-0.1, -0.2]],  # each row: fewer than k=3 positive pre-activations
    ),
}
edge, edge_cfgs = {}, {}
for name, (cls, cfg, weights, rows) in EDGE.items():
    sae = cls(cfg)
    with torch.no_grad():
        for pname, p in sae.named_parameters():
            p.copy_(torch.tensor(weights[pname]))
    x = torch.tensor(rows)
    with torch.no_grad():
        features = sae.encode(x)
    edge |= {f"{name}.{k}": v.detach().clone() for k, v in sae.state_dict().items()}
    edge |= {f"{name}.x": x, f"{name}.features": features}
    edge_cfgs[f"{name}.cfg"] = json.dumps(sae.cfg.to_dict(), default=str)
    print(name, features.tolist())
save_file(
    edge,
    OUT / "edge_cases.reference.safetensors",
    metadata={"sae_lens_version": sae_lens.__version__, "torch_version": torch.__version__} | edge_cfgs,
)
for written in OUT.glob("*.safetensors"):
    written.chmod(0o644)  # readable like the folders sae-lens writes
