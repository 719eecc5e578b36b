"""Synthetic knowledge worlds, the small LM the project pretrains on one (the embedded default), and
the zoo of world models of other architecture families (:mod:`lab.world.zoo`)."""

from .checkpoint import default_checkpoint_dir, load_world, world_checkpoint_of
from .relations import from_world
from .spec import KNOBS, RelationSpec, WorldSpec, WorldSpecError, default_spec, v3_spec, v4_spec
from .tokenizer import build_tokenizer
from .train import TrainConfig, train_world_model
from .world import World
from .zoo import ZOO, ZooModel, zoo_model

__all__ = [
    "from_world",
    "KNOBS",
    "RelationSpec",
    "TrainConfig",
    "World",
    "ZOO",
    "ZooModel",
    "WorldSpec",
    "WorldSpecError",
    "build_tokenizer",
    "default_checkpoint_dir",
    "default_spec",
    "v3_spec",
    "load_world",
    "train_world_model",
    "v4_spec",
    "world_checkpoint_of",
    "zoo_model",
]
