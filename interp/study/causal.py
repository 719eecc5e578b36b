"""Beyond the paper, a causal test: *cause* readability and watch generalization follow.

Two worlds share every fact (same seed: same subjects, answers and derived relations) and differ
only in how one set of relations is written: in world A the manipulated relations are written
with augmentation (shuffled biographies that repeat the subject's name, several paraphrase
templates), in world B without it (one template, fixed-order biographies). Both are pretrained
with the same recipe and studied with the same configuration. For each relation we report the
change B - A in readability and in generalization; the manipulated relations' changes are set
against the untouched relations' changes, which absorb any world-level difference.
"""
from __future__ import annotations

import json
import shutil
from dataclasses import asdict, replace
from pathlib import Path
from typing import Optional, Sequence

import pandas as pd

from ..store import atomic_write_bytes
from ..world import TrainConfig, WorldSpec, default_checkpoint_dir, default_spec, train_world_model
from .study import StudyConfig


def without_augmentation(spec: WorldSpec, names: Sequence[str]) -> WorldSpec:
    """``spec`` with the named relations written plainly: one template, no permutation augmentation."""
    unknown = set(names) - {r.name for r in spec.relations}
    if unknown:
        raise ValueError(f"unknown relations {sorted(unknown)}")
    rels = tuple(replace(r, augment=False, templates=1) if r.name in names else r for r in spec.relations)
    return replace(spec, relations=rels).validate()


def causal_test(out: str | Path, manipulated: Optional[Sequence[str]] = None, spec: Optional[WorldSpec] = None,
                train: TrainConfig = TrainConfig(), config: Optional[StudyConfig] = None, progress: Optional[bool] = None) -> pd.DataFrame:
    """Pretrain both worlds (resuming finished ones), run the study on each, compare."""
    from . import run_study

    out = Path(out)
    spec = spec or default_spec()
    manipulated = list(manipulated or [r.name for r in spec.relations if r.augment])
    if not manipulated:
        raise ValueError("no relation to manipulate: pass names of relations written with augmentation")
    config = config or StudyConfig(methods=("full",), label_seeds=(0,), finetune_seeds=(0,), other_categories=())
    worlds = {"augmented": spec, "plain": without_augmentation(spec, manipulated)}
    tables = {}
    for name, s in worlds.items():
        ckpt = out / f"world_{name}"
        if not (ckpt / "model.safetensors").exists():
            if _is_shipped(s, train):  # the embedded model is this world with this recipe: reuse it
                shutil.copytree(default_checkpoint_dir(), ckpt)
            else:
                train_world_model(s, ckpt, train, progress=progress)
        result = run_study(ckpt, out=out / f"study_{name}", config=config, progress=progress)
        tables[name] = result.table("relations").set_index("relation")
    a, b = tables["augmented"], tables["plain"]
    m = config.methods[0]
    df = pd.DataFrame({
        "relation": a.index, "manipulated": [r in manipulated for r in a.index],
        "readability_augmented": a.readability_best.values, "readability_plain": b.loc[a.index].readability_best.values,
        "generalization_augmented": a[f"generalization_{m}"].values, "generalization_plain": b.loc[a.index, f"generalization_{m}"].values,
    })
    df["delta_readability"] = df.readability_plain - df.readability_augmented
    df["delta_generalization"] = df.generalization_plain - df.generalization_augmented
    g = df.groupby("manipulated")[["delta_readability", "delta_generalization"]].mean()
    summary = {"manipulated": manipulated, "method": m,
               "mean_delta": {("manipulated" if k else "untouched"): v for k, v in g.to_dict(orient="index").items()}}
    if True in g.index and False in g.index:
        summary["difference_in_differences"] = {c: float(g.loc[True, c] - g.loc[False, c]) for c in g.columns}
    atomic_write_bytes(out / "causal.csv", df.to_csv(index=False).encode())
    atomic_write_bytes(out / "causal.json", json.dumps(summary, indent=1).encode())
    return df


def _is_shipped(spec: WorldSpec, train: TrainConfig) -> bool:
    try:
        root = default_checkpoint_dir()
    except FileNotFoundError:
        return False
    same_spec = WorldSpec.from_json((root / "world_spec.json").read_text()) == spec
    return same_spec and json.loads((root / "train_config.json").read_text()) == asdict(train)
