"""lab: the application built on the toolkit.

The generalization study (:mod:`lab.study`), the synthetic knowledge world and its shipped model
(:mod:`lab.world`), experiments with known answers (:mod:`lab.experiments`: induction heads,
relation circuits, grokking, in-context learning), executors for distributed runs
(:mod:`lab.executors`), figure regeneration (:mod:`lab.figures`) and the ``interp`` command line
(:mod:`lab.cli`). It may import everything below it (``interp``, ``probes``, ``circuits``,
``jacobians``); nothing below imports it. Its built-in models reach
:func:`interp.load_model` through the ``interp.models`` entry points (``"world"``, the zoo's
``"world-llama"``, the v3 zoo's ``"world-v3"`` and its families, ``"induction"``), registered again
here for a checkout used without installing.
"""

from functools import partial

from interp.models import register_model

from .experiments.induction import checkpoint_dir as induction_checkpoint_dir
from .world.checkpoint import default_checkpoint_dir as world_checkpoint_dir
from .world.zoo import RENAMED, ZOO, renamed_dir

register_model("world", world_checkpoint_dir)
register_model("induction", induction_checkpoint_dir)
for _entry in ZOO.values():
    if _entry.name != "world":
        register_model(_entry.name, _entry.checkpoint_dir)
for _old in RENAMED:  # names from before world v4 became the default: the same checkpoints, with a warning
    register_model(_old, partial(renamed_dir, _old))

__all__ = ["induction_checkpoint_dir", "world_checkpoint_dir"]
