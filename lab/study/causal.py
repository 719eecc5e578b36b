"""Beyond the paper, a causal test: *cause* readability and watch generalization follow.

Two worlds share every fact (same seed: same subjects, answers and derived relations) and differ
only in how one set of relations is written: in world A the manipulated relations are written
with augmentation (shuffled biographies that repeat the subject's name, several paraphrase
templates), in world B without it (one template, each fact an isolated statement, the same
number of mentions). Both are pretrained with the same recipe and studied with the same
configuration. For each relation we report the change B - A in readability and in
generalization (kappa, and raw accuracy beside it).

**Untouched means untouched.** Every relation that is not manipulated is written identically
in both worlds, document for document (:meth:`~lab.world.World.relation_digests`, checked
here before any training: a mismatch is an error). The difference-in-differences sets the
manipulated relations' change against the untouched relations' change, which absorbs any
world-level difference (a different corpus order, other documents in the same batches), with a
bootstrap CI over relations (each group resampled separately). It is reported against all
untouched relations and against those also not *derived* from a manipulated relation (a derived
relation's facts are functions of a manipulated relation's facts, so the model may compute
them through it even though their writing is unchanged).

Stages (:mod:`lab.stages`, one runner in ``out``): pretrain each world (:data:`lab.study.worlds.WORLD`,
``world_<name>/``, keyed by the world's spec and the recipe; a shipped checkpoint of the same
world and recipe is copied), the study on each (``study_<name>/``, the study's own stages), and
the comparison (``causal.csv``, ``causal.json``), recomputed from the two studies' tables.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd

from interp.resampling import bootstrap_indices, monte_carlo_p, percentile_interval, permutations, resampled_means
from interp.results import write_json, write_table
from lab.stages import Runner
from lab.world import TrainConfig, World, WorldSpec, v3_spec

from .config import StudyConfig
from .run import run_study
from .worlds import shipped_checkpoint, world_task

__all__ = ["causal_test", "did_with_ci", "shipped_checkpoint", "without_augmentation", "writing_digests"]


def without_augmentation(spec: WorldSpec, names: Sequence[str]) -> WorldSpec:
    """``spec`` with the named relations written plainly: one template, no permutation augmentation,
    as isolated statements (``bio=False``: joining the fixed-order biography would rewrite the
    biography relations' documents too). Their mention counts are unchanged: under mixed training
    they keep their question-form statements (``qa=True``)."""
    unknown = set(names) - {r.name for r in spec.relations}
    if unknown:
        raise ValueError(f"unknown relations {sorted(unknown)}")
    rels = tuple(
        replace(r, augment=False, templates=1, bio=False, qa=r.mixed) if r.name in names else r for r in spec.relations
    )
    return replace(spec, relations=rels).validate()


def causal_test(
    out: str | Path,
    manipulated: Sequence[str] | None = None,
    spec: WorldSpec | None = None,
    train: TrainConfig = TrainConfig(),
    config: StudyConfig | None = None,
    progress: bool | None = None,
    retrain: bool = False,
) -> pd.DataFrame:
    """Pretrain both worlds (resuming finished ones), run the study on each, compare.

    A world whose spec and training recipe equal a shipped checkpoint's (world v3, the default spec here, and
    its plain twin, both shipped) is copied instead of pretrained, unless ``retrain``."""
    out = Path(out)
    spec = spec or v3_spec()
    manipulated = list(manipulated or [r.name for r in spec.relations if r.augment])
    if not manipulated:
        raise ValueError("no relation to manipulate: pass names of relations written with augmentation")
    config = config or StudyConfig(
        methods=("full",), label_seeds=(0,), finetune_seeds=(0,), other_categories=(), nonlinear_probes=()
    )
    worlds = {"augmented": spec, "plain": without_augmentation(spec, manipulated)}
    digests = {name: writing_digests(s) for name, s in worlds.items()}
    changed = sorted(
        r for r in digests["augmented"] if r not in manipulated and digests["augmented"][r] != digests["plain"][r]
    )
    if changed:
        raise ValueError(
            f"relations {changed} are not manipulated but are written differently in the two worlds; "
            "the causal test needs them untouched (manipulate them too, or change the world's writing)"
        )
    tables = {}
    runner = Runner(out, progress=progress)
    for name, s in worlds.items():
        ckpt = runner.run(world_task(out, f"world_{name}", s, train, retrain=retrain, progress=progress)).folder
        result = run_study(ckpt, out=out / f"study_{name}", config=config, progress=progress)
        tables[name] = result.table("relations").set_index("relation")
    a, b = tables["augmented"], tables["plain"]
    m = config.methods[0]
    derived = {r.name: r.derived_from for r in spec.relations}
    df = pd.DataFrame(
        {
            "relation": a.index,
            "manipulated": [r in manipulated for r in a.index],
            "derived_from_manipulated": [derived_from(r, manipulated, derived) for r in a.index],
            "writing_identical": [digests["augmented"][r] == digests["plain"][r] for r in a.index],
        }
    )
    for measure, (ra, ga) in {
        "kappa": ("readability_best_kappa", f"generalization_kappa_{m}"),
        "raw": ("readability_best", f"generalization_{m}"),
    }.items():
        suffix = "" if measure == "kappa" else "_raw"
        df[f"readability_augmented{suffix}"] = a[ra].values
        df[f"readability_plain{suffix}"] = b.loc[a.index, ra].values
        df[f"generalization_augmented{suffix}"] = a[ga].values
        df[f"generalization_plain{suffix}"] = b.loc[a.index, ga].values
        df[f"delta_readability{suffix}"] = df[f"readability_plain{suffix}"] - df[f"readability_augmented{suffix}"]
        df[f"delta_generalization{suffix}"] = (
            df[f"generalization_plain{suffix}"] - df[f"generalization_augmented{suffix}"]
        )
    groups = {"untouched": ~df.manipulated, "untouched, not derived": ~df.manipulated & ~df.derived_from_manipulated}
    summary = {
        "manipulated": manipulated,
        "method": m,
        "measure": "kappa (raw accuracy in *_raw)",
        "mean_delta": {"manipulated": _means(df[df.manipulated])} | {k: _means(df[v]) for k, v in groups.items()},
        "n": {"manipulated": int(df.manipulated.sum())} | {k: int(v.sum()) for k, v in groups.items()},
        "difference_in_differences": {},
    }
    for name, mask in groups.items():
        if df.manipulated.any() and mask.any():
            summary["difference_in_differences"][f"vs {name}"] = {
                col: did_with_ci(df.loc[df.manipulated, col].to_numpy(), df.loc[mask, col].to_numpy(), seed=0)
                for col in (
                    "delta_readability",
                    "delta_generalization",
                    "delta_readability_raw",
                    "delta_generalization_raw",
                )
            }
    write_table(df, out / "causal.csv")
    write_json(summary, out / "causal.json")
    return df


def did_with_ci(treated, control, n_boot: int = 5000, ci: float = 0.95, seed: int = 0, n_perm: int = 20000) -> dict:
    """Mean(treated) - mean(control), with a percentile bootstrap CI resampling relations within
    each group, and a two-sided permutation p-value (group labels shuffled across relations).
    Relations without a value (a fine-tune that failed in either world: :mod:`lab.study.failures`)
    are left out, and ``n_dropped`` says how many."""
    rng = np.random.default_rng(seed)
    treated, control = np.asarray(treated, float), np.asarray(control, float)
    dropped = int((~np.isfinite(treated)).sum() + (~np.isfinite(control)).sum())
    treated, control = treated[np.isfinite(treated)], control[np.isfinite(control)]
    extra = {"n_dropped": dropped} if dropped else {}
    est = float(np.mean(treated) - np.mean(control)) if len(treated) and len(control) else float("nan")
    if len(treated) < 2 or len(control) < 2:
        return {"estimate": est, "ci_low": float("nan"), "ci_high": float("nan"), "p_value": float("nan"), **extra}
    bt = resampled_means(treated, bootstrap_indices(rng, len(treated), n_boot))
    bc = resampled_means(control, bootstrap_indices(rng, len(control), n_boot))
    low, high = percentile_interval(bt - bc, ci)
    pooled = np.concatenate([treated, control])
    perms = permutations(rng, len(pooled), n_perm)
    nt = len(treated)
    p = monte_carlo_p(pooled[perms[:, :nt]].mean(1) - pooled[perms[:, nt:]].mean(1), est)
    return {"estimate": est, "ci_low": low, "ci_high": high, "p_value": p, **extra}


def _means(df: pd.DataFrame) -> dict:
    return {
        c: float(df[c].mean())
        for c in ("delta_readability", "delta_generalization", "delta_readability_raw", "delta_generalization_raw")
    }


def derived_from(name: str, manipulated: Sequence[str], derived: dict) -> bool:
    parent = derived.get(name)
    while parent is not None:
        if parent in manipulated:
            return True
        parent = derived.get(parent)
    return False


def writing_digests(spec: WorldSpec) -> dict[str, str]:
    """Every relation's writing digest (:meth:`~lab.world.World.relation_digests`) in the world of ``spec``."""
    return World.generate(spec).relation_digests()
