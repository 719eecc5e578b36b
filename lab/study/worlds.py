"""Pretrained world models as a stage: the checkpoint an experiment needs, trained once.

The causal test and the ablation each need world models pretrained on given worlds with given
recipes. :data:`WORLD` is that step: its inputs are the world's spec and the training recipe,
its result the checkpoint folder (``model.safetensors`` and the rest, written by
:func:`lab.world.train_world_model`). A world whose spec and recipe equal a shipped checkpoint's
is copied from it instead of pretrained (:func:`shipped_checkpoint`), unless ``retrain``.
"""

from __future__ import annotations

import hashlib
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from interp.results import atomic_dir
from lab.stages import DERIVED, WHERE, Codec, Stage, Task
from lab.world import TrainConfig, WorldSpec, train_world_model
from lab.world.checkpoint import shipped_world_checkpoints
from lab.world.train import recipe, trained_on


def shipped_checkpoint(spec: WorldSpec, train: TrainConfig) -> Path | None:
    """The shipped checkpoint trained on exactly this world with exactly this recipe (the thread
    count aside: how it ran, not what), if any."""
    wanted = (spec, recipe(asdict(train)))
    return next((root for root in shipped_world_checkpoints() if trained_on(root) == wanted), None)


def weights_digest(checkpoint: Path | None) -> str | None:
    """A SHA-256 of a checkpoint's ``model.safetensors`` (None for none): keys a step that reads it."""
    if checkpoint is None:
        return None
    return hashlib.sha256((Path(checkpoint) / "model.safetensors").read_bytes()).hexdigest()[:16]


@dataclass(frozen=True)
class WorldInputs:
    """A world and a recipe; ``retrain``: pretrain even when the checkpoint is shipped (keyed: a
    copied and a retrained model are different results)."""

    spec: WorldSpec
    train: TrainConfig
    folder: Path = field(metadata=WHERE)
    retrain: bool = False
    progress: bool | None = field(default=None, metadata=DERIVED)


@dataclass(frozen=True)
class Checkpoint:
    """A world model's folder; ``minutes``: how long pretraining took in this run (None when it
    was copied, or trained in an earlier run)."""

    folder: Path
    minutes: float | None = None
    shipped: bool = False


def pretrain(inputs: WorldInputs) -> Checkpoint:
    shipped = None if inputs.retrain else shipped_checkpoint(inputs.spec, inputs.train)
    if shipped is not None:  # a shipped model is this world with this recipe: copy it (whole, or not at all)
        folder = Path(inputs.folder)
        with atomic_dir(folder, ".copying") as tmp:
            shutil.copytree(shipped, tmp, dirs_exist_ok=True)
        return Checkpoint(folder, shipped=True)
    start = time.time()
    train_world_model(inputs.spec, inputs.folder, inputs.train, progress=inputs.progress)
    return Checkpoint(inputs.folder, (time.time() - start) / 60)


def _written_by_the_step(result: Checkpoint, path: Path) -> None:
    pass


def _checkpoint_at(path: Path) -> Checkpoint:
    return Checkpoint(path.parent)


#: the checkpoint is written by the step itself; its ``model.safetensors`` marks it done
WORLD = Stage("pretrain world", pretrain, Codec(_written_by_the_step, _checkpoint_at))


def world_task(out: Path, name: str, spec: WorldSpec, train: TrainConfig, **kw) -> Task:
    """Pretraining (or copying) the world of ``spec`` into ``out / name``."""
    return Task(WORLD, WorldInputs(spec, train, Path(out) / name, **kw), f"{name}/model.safetensors")
