"""The shipped world checkpoint and the world it was trained on."""

from __future__ import annotations

from pathlib import Path

from interp.models import ModelNotFoundError

from .spec import WorldSpec
from .world import World
from .zoo import RENAMED, ZOO

_CHECKPOINTS = Path(__file__).resolve().parent.parent / "checkpoints"
_DEFAULT = _CHECKPOINTS / "world"
#: the causal test's second world (world v3 with its augmented relations written plainly)
_PLAIN = _CHECKPOINTS / "world_plain"
#: the randomized causal test's world (:func:`lab.world.spec.randomized_spec`)
_RANDOMIZED = _CHECKPOINTS / "world_randomized"


def default_checkpoint_dir() -> Path:
    if not (_DEFAULT / "config.json").exists():
        raise ModelNotFoundError(
            f"the embedded world model is missing from {_DEFAULT}; rebuild it with `interp world train`"
        )
    return _DEFAULT


def load_world(path: str | Path | None = None) -> World:
    """The world a checkpoint directory was trained on (regenerated from its ``world_spec.json``)."""
    root = Path(path) if path is not None else default_checkpoint_dir()
    return World.generate(WorldSpec.from_json((root / "world_spec.json").read_text()))


def world_checkpoint_of(model) -> Path | None:
    """The world checkpoint directory ``model`` is: ``"world"`` or a zoo model's name
    (``"world-v3"``, :mod:`lab.world.zoo`), a directory with a ``world_spec.json``, or a model
    handle loaded from one (``interp.load_model("world")``); None for any other model."""
    if isinstance(model, str) and model == "world":
        return default_checkpoint_dir()
    if isinstance(model, str) and model in ZOO:
        return ZOO[model].checkpoint_dir()
    source = model if isinstance(model, (str, Path)) else getattr(model, "source", None)
    if isinstance(source, str) and source in RENAMED:
        return ZOO[RENAMED[source]].checkpoint_dir()
    if source is None or not isinstance(source, (str, Path)):
        return None
    root = Path(source)
    return root if (root / "world_spec.json").exists() else None


def shipped_world_checkpoints() -> list[Path]:
    """The world checkpoints shipped with the package: the embedded model, the causal test's
    plain world, the randomized world and the zoo (those present)."""
    zoo = [m.path for m in ZOO.values() if m.path != _DEFAULT]
    return [p for p in (_DEFAULT, _PLAIN, _RANDOMIZED, *zoo) if (p / "config.json").exists()]
