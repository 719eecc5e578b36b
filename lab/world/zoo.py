"""The zoo: world models of several architecture families, pretrained on the same world.

Three worlds. **World v4 with recall moved apart from readability** (the default,
:func:`lab.world.spec.v4_recall_spec`: no subject owns a token): ``world`` (GPT-2, 4 blocks,
d_model 128, 12,000 steps; the embedded default) and ``world-llama`` (the same recipe with the
Llama block). **World v4** (:func:`lab.world.spec.v4_spec`, the same relations without the
question-form statements that move recall): ``world-v4`` (the default before) and
``world-v4-llama`` (``world-llama`` until the default moved). **World v3**
(:func:`lab.world.spec.v3_spec`, every subject owns a family-name token; kept with its saved
studies): ``world-v3``, ``world-v3-llama``, ``world-v3-neox`` and ``world-v3-deep``.

Within a zoo every model reads the same corpus (same facts, same documents, same tokenizer) with
the same recipe (steps, schedule, batch, width, heads, seed); what differs is the architecture
family (:data:`lab.world.train.ARCHS`) or, for ``world-v3-deep``, the depth (8 blocks instead of
4). So a study's rows compare across models: the relations, labels, fine-tuning subjects and
design are identical. What differs with the family besides the block: parameters (both v4 worlds:
GPT-2 0.887M and Llama 0.824M, both with tied embeddings; world v3, at its larger vocabulary:
GPT-2 0.998M, Llama 0.935M, NeoX 1.186M untied as in Pythia, the 8-block GPT-2 1.79M; Llama
has 2 key/value heads for 4 query heads), and each model is one pretraining run (one seed), so a
difference between two models mixes the architecture with pretraining-run noise.

Each is registered as a model name (``interp.load_model("world-llama")``) and retrained with
``interp world train --zoo NAME`` (resumable). The names of before v4 (:data:`RENAMED`:
``world-neox``, ``world-deep``) still load the same checkpoints, with a warning; ``world-v4`` loads
the weights it always loaded (the default of before), now under its own entry.
"""

from __future__ import annotations

import warnings
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
    #: the world recipe it is pretrained on (a key of :data:`lab.world.spec.RECIPES`)
    world: str = "v4-recall"

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
        # world v4 with recall moved apart (issue 52): the embedded default; 12,000 steps (docs/world.md)
        ZooModel("world", "gpt2", "world", TrainConfig(steps=12000)),
        ZooModel("world-llama", "llama", "world_llama", TrainConfig(arch="llama", n_kv_heads=2, steps=12000)),
        # world v4: shared-token names, lead sentences; the default before
        ZooModel("world-v4", "gpt2", "world_v4", TrainConfig(steps=12000), world="v4"),
        ZooModel(
            "world-v4-llama",
            "llama",
            "world_v4_llama",
            TrainConfig(arch="llama", n_kv_heads=2, steps=12000),
            world="v4",
        ),
        # world v3, the default before v4: every subject owns a name token
        ZooModel("world-v3", "gpt2", "world_v3", TrainConfig(), world="v3"),
        ZooModel("world-v3-llama", "llama", "world_v3_llama", TrainConfig(arch="llama", n_kv_heads=2), world="v3"),
        ZooModel("world-v3-neox", "gpt_neox", "world_v3_neox", TrainConfig(arch="neox"), world="v3"),
        ZooModel("world-v3-deep", "gpt2", "world_v3_deep", TrainConfig(n_layers=8), world="v3"),
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


def world_v4_dir() -> Path:
    return ZOO["world-v4"].checkpoint_dir()


def world_v4_llama_dir() -> Path:
    return ZOO["world-v4-llama"].checkpoint_dir()


def world_v3_dir() -> Path:
    return ZOO["world-v3"].checkpoint_dir()


def world_v3_llama_dir() -> Path:
    return ZOO["world-v3-llama"].checkpoint_dir()


def world_v3_neox_dir() -> Path:
    return ZOO["world-v3-neox"].checkpoint_dir()


def world_v3_deep_dir() -> Path:
    return ZOO["world-v3-deep"].checkpoint_dir()


#: names the zoo had before world v4 became the default, and the same checkpoints' names now
RENAMED = {"world-neox": "world-v3-neox", "world-deep": "world-v3-deep"}


def renamed_dir(old: str) -> Path:
    """The checkpoint an old zoo name still loads (the same weights), with a warning naming it now."""
    new = RENAMED[old]
    message = f"the zoo model {old!r} is called {new!r} now (same weights); load it by that name"
    warnings.warn(message, FutureWarning, stacklevel=2)
    return ZOO[new].checkpoint_dir()


def world_neox_dir() -> Path:
    return renamed_dir("world-neox")


def world_deep_dir() -> Path:
    return renamed_dir("world-deep")
