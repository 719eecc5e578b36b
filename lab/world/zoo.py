"""The zoo: world models of several architecture families, pretrained on the same world.

Every zoo model but ``world-v4`` reads the same corpus (the default world, seed 0: same facts, same
documents, same tokenizer) with the same recipe (steps, schedule, batch, width, heads, seed); what differs is the
architecture family (:data:`lab.world.train.ARCHS`) or, for ``world-deep``, the depth (8 blocks
instead of 4). So a study's rows compare across models: the relations, labels, fine-tuning
subjects and design are identical. What differs with the family besides the block: parameters
(GPT-2 0.998M with tied embeddings; Llama 0.935M, tied, 2 key/value heads for 4 query heads; NeoX
1.186M, untied as in Pythia; the 8-block GPT-2 1.79M), and each model is one pretraining run (one
seed), so a difference between two models mixes the architecture with pretraining-run noise.

Each is registered as a model name (``interp.load_model("world-llama")``) and retrained with
``interp world train --zoo NAME`` (resumable). ``world`` is the embedded default. ``world-v4`` is
the same GPT-2 recipe (12,000 steps) on world v4 (:func:`lab.world.spec.v4_spec`), where no subject
owns a token.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from interp.models import ModelNotFoundError

from .train import TrainConfig

CHECKPOINTS = Path(__file__).resolve().parent.parent / "checkpoints"


@dataclass(frozen=True)
class ZooModel:
    """A zoo entry: its registered name, family, checkpoint folder and training config."""

    name: str
    family: str
    folder: str
    train: TrainConfig
    #: the world recipe it is pretrained on (a key of ``lab.cli.WORLD_SPECS``)
    world: str = "v3"

    @property
    def path(self) -> Path:
        return CHECKPOINTS / self.folder

    def checkpoint_dir(self) -> Path:
        """The shipped checkpoint directory (raises with the command that trains it if absent)."""
        if not (self.path / "config.json").exists():
            raise ModelNotFoundError(
                f"the zoo model {self.name!r} is missing from {self.path}; train it with "
                f"`interp world train --zoo {self.name}`"
            )
        return self.path


ZOO: dict[str, ZooModel] = {
    m.name: m
    for m in (
        ZooModel("world", "gpt2", "world", TrainConfig()),
        ZooModel("world-llama", "llama", "world_llama", TrainConfig(arch="llama", n_kv_heads=2)),
        ZooModel("world-neox", "gpt_neox", "world_neox", TrainConfig(arch="neox")),
        ZooModel("world-deep", "gpt2", "world_deep", TrainConfig(n_layers=8)),
        # world v4 (issue 52): shared-token names, lead sentences; 12,000 steps (docs/world.md)
        ZooModel("world-v4", "gpt2", "world_v4", TrainConfig(steps=12000), world="v4"),
    )
}


def zoo_model(name: str) -> ZooModel:
    """The zoo entry called ``name`` (an error lists the zoo otherwise)."""
    if name not in ZOO:
        raise ValueError(f"no zoo model {name!r}; the zoo has {', '.join(ZOO)}")
    return ZOO[name]


# the registered names' directory functions (entry points of the ``interp.models`` group) -------
def world_llama_dir() -> Path:
    return ZOO["world-llama"].checkpoint_dir()


def world_neox_dir() -> Path:
    return ZOO["world-neox"].checkpoint_dir()


def world_deep_dir() -> Path:
    return ZOO["world-deep"].checkpoint_dir()


def world_v4_dir() -> Path:
    return ZOO["world-v4"].checkpoint_dir()
