"""The causal test with power: randomize how each *subject's* facts are written, in one pretraining run.

**Design.** The randomized world (:func:`lab.world.spec.randomized_spec`) writes nine relations
per subject: a stratified coin (:mod:`lab.world.arms`; strata: frequency multiplier, question-form
statements, name length) puts half the subjects in the *augmented* arm (their facts of those
relations together in shuffled biographies, each sentence repeating the name, four paraphrase
templates) and half in the *plain* arm (each fact a statement in the canonical wording, grouped
with other subjects' statements). Mentions, sentences, documents and tokens per arm are equal
(tested within 1%), and every other relation is written exactly as in the default world. One
model is pretrained on it, so the arms share the run, its epochs and its noise: what differs
between two subjects of a relation is the coin.

**Measurements**, per relation and arm: readability (the study's probe, cross-validated within
the arm's subjects, kappa at the best layer), recall of the corpus query, and held-out
generalization kappa after a relabelling fine-tune. Fine-tuning sets are drawn per answer, half
from each arm (``source="both"``, the primary factor), and, for the manipulated relations, from
one arm only (``"augmented"``, ``"plain"``: the second factor); every subject not fine-tuned is
held out and scored in its arm. Each seed draws its own labels, fine-tuning set and minibatches.

**Estimators, fixed before the run** (docs/protocol.md, "pre-registered"):

- per relation, Δρ_r = readability(augmented) - readability(plain) and Δg_r = generalization
  kappa(augmented held-out) - (plain held-out), fine-tuned on both arms, averaged over seeds;
- **primary**: T = mean Δg_r over the manipulated relations (fine-tunes drawn from both arms
  only), with a randomization p-value: the arms are redrawn within their strata
  (:func:`lab.world.arms.stratified_halves`, the design's own mechanism; one draw relabels a
  subject in every relation at once, so subjects stay clustered across relations) and T is
  recomputed from the saved held-out predictions; two-sided, ``(1 + #{|T*| >= |T|}) / (n + 1)``.
  It tests the sharp null that the writing arm
  changes no subject's held-out prediction, given the fine-tuned models. It is not exact: the
  fine-tuning subjects were drawn per (answer, arm), so given the fine-tuning set the held-out
  arms' sizes are fixed, while the redraws let them vary (by about ±7 of ~720 held-out subjects
  per relation: a small, slightly conservative approximation);
- **secondary**: β = ΣΔg / ΣΔρ over the manipulated relations (the effect of readability on
  generalization, an instrumental-variable estimate with the coin as instrument), with a
  bootstrap CI over relations, beside the cross-sectional slope of generalization on readability
  across all relations of the same model (pooled arms);
- **negative control**: the same T and p on the relations outside the set and not derived from
  it (written identically for both arms): expected 0. A non-zero control says the coin acts
  through the subject (its name's embedding, trained on other documents) rather than through one
  relation's writing.

**Decision rule.** *Supports* causation: the first stage holds (mean Δρ > 0, bootstrap CI above
0), T > 0 with p < 0.05, and the control's CI covers 0. *Refutes* an effect of the size the
cross-sectional slope predicts: the first stage holds, p >= 0.05 and β's CI lies below the
cross-sectional slope. *Open* otherwise: no first stage (writing did not move readability within
one run, e.g. spillover between subjects), a control effect, or a CI that covers both.

**Power** (:func:`power_analysis`), computed from the design before any fine-tune: per relation
and arm the held-out sizes the split gives and the number of labels; each held-out prediction is
right with the probability a generalization kappa of ``base_kappa`` implies, plus or minus half
the effect, and T's null distribution comes from the same simulation at zero effect. The smallest
effect detected with 80% power is reported beside the effect the cross-sectional slope predicts.

Stages (:mod:`lab.stages`, one runner in ``out``): the world model (``world_randomized/``, the
shipped checkpoint copied), readability and recall per arm (``arms_readability.parquet``), the
fine-tunes (``runs/*.json``), and the analysis (``randomized.csv``, ``randomized_arms.csv``,
``randomized.json``, ``power.csv``), recomputed from the saved results.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import plotly.graph_objects as go

import interp
from interp.models import Model
from interp.plots import export, place_labels
from interp.relations import Relation
from interp.resampling import bootstrap_indices, monte_carlo_p, percentile_interval
from interp.results import write_json, write_table
from lab.stages import DERIVED, Codec, Runner, Stage, Task, parquet_codec
from lab.world import TrainConfig, World, from_world
from lab.world.arms import ARMS, stratified_halves
from lab.world.report import recall
from lab.world.spec import WorldSpec, randomized_spec
from lab.world.vocab import LABELS
from probes import ProbeSweep
from probes.chance import kappa
from probes.readability import readability_by_layer

from .causal import derived_from
from .config import SUMMARY_ONLY, StudyConfig
from .design import relabel
from .failures import failure_reason
from .finetune import finetune
from .worlds import world_task

SOURCES = ("both",) + ARMS


@dataclass(frozen=True)
class CausalConfig:
    """The randomized test's settings. ``study``: the category, fine-tuning budget, probe folds
    and fine-tuning recipe (a :class:`StudyConfig`); ``seeds``: each seed draws labels, the
    fine-tuning set and minibatches; ``one_arm``: also fine-tune the manipulated relations on one
    arm only (the second factor). ``n_redraws``, ``n_boot``, ``power_sims``: resampling counts
    (read by the analysis alone)."""

    study: StudyConfig = field(default_factory=lambda: StudyConfig(methods=("full",), other_categories=()))
    seeds: tuple[int, ...] = (0, 1)
    one_arm: bool = True
    base_kappa: float = 0.33  # the world study's mean generalization kappa on world v3 (docs/study_v3.md), for power
    n_redraws: int = field(default=10_000, metadata=SUMMARY_ONLY)
    n_boot: int = field(default=5_000, metadata=SUMMARY_ONLY)
    power_sims: int = field(default=1_000, metadata=SUMMARY_ONLY)


# ----------------------------------------------------------------------------------------------
# readability and recall per arm
@dataclass(frozen=True)
class ArmKnowledgeInputs:
    model: Model
    spec: WorldSpec
    folds: int
    C: float
    progress: bool | None = field(default=None, metadata=DERIVED)


@dataclass(frozen=True)
class ArmKnowledge:
    """``layers``: one row per (relation, arm, layer): the probe's kappa and accuracy
    cross-validated within the arm's subjects (arm ``"all"``: every subject) and the arm's recall
    of the corpus query; ``readout``: every subject's cross-validated prediction (relation, arm,
    layer, subject, answer, predicted), for per-relation CIs."""

    layers: pd.DataFrame
    readout: pd.DataFrame


def arm_knowledge(inputs: ArmKnowledgeInputs) -> ArmKnowledge:
    """Readability and recall per relation and arm (:class:`ArmKnowledge`)."""
    world = World.generate(inputs.spec)
    arms = {"all": set(world.subjects)} | {a: {s for s in world.subjects if world.arm[s] == a} for a in ARMS}
    relations = [_subset(r, arms[a], f"{r.name}|{a}") for r in from_world(world) for a in ("all",) + ARMS]
    sweep = ProbeSweep(folds=inputs.folds, C=inputs.C, batch_size=256, progress=inputs.progress)
    table = sweep.run(inputs.model, relations, model_name=inputs.model.name)
    layers = readability_by_layer(table, sweep.readout_)
    layers[["relation", "arm"]] = layers.relation.str.split("|", expand=True)
    hits = recall(inputs.model, world)
    hits["arm"] = hits.subject.map(world.arm)
    rec = pd.concat([hits.assign(arm="all"), hits]).groupby(["relation", "arm"]).correct.mean().rename("recall")
    ro = sweep.readout_[sweep.readout_.seed == sweep.readout_.seed.min()]
    ro = ro[["relation", "layer", "subject", "answer", "predicted"]].copy()
    ro[["relation", "arm"]] = ro.relation.str.split("|", expand=True)
    return ArmKnowledge(
        layers.merge(rec.reset_index(), on=["relation", "arm"])[
            ["relation", "arm", "layer", "kappa", "accuracy", "recall"]
        ],
        ro[["relation", "arm", "layer", "subject", "answer", "predicted"]].reset_index(drop=True),
    )


def _subset(r: Relation, subjects: set[str], name: str) -> Relation:
    keep = [i for i, s in enumerate(r.subjects) if s in subjects]
    prompts = [r.prompts_override[i] for i in keep] if r.prompts_override is not None else None
    return Relation(
        name, [r.subjects[i] for i in keep], [r.answers[i] for i in keep], r.template, prompts, r.properties
    )


_PARQUET = parquet_codec()


def _save_knowledge(k: ArmKnowledge, path: Path) -> None:
    _PARQUET.write(k.readout, path.with_name("arms_readout.parquet"))
    _PARQUET.write(k.layers, path)  # last: its presence means both were written


def _load_knowledge(path: Path) -> ArmKnowledge:
    return ArmKnowledge(_PARQUET.read(path), _PARQUET.read(path.with_name("arms_readout.parquet")))


ARM_KNOWLEDGE = Stage("readability and recall per arm", arm_knowledge, Codec(_save_knowledge, _load_knowledge))


# ----------------------------------------------------------------------------------------------
# fine-tunes
@dataclass(frozen=True)
class ArmJob:
    relation: str
    source: str  # "both", "augmented" or "plain": the arms the fine-tuning subjects come from
    seed: int

    @property
    def id(self) -> str:
        return f"{self.relation}__{self.source}__s{self.seed}"


@dataclass(frozen=True)
class ArmFinetuneInputs:
    model: Model
    relation: Relation
    arms: tuple[str, ...]  # each subject's arm, in the relation's order
    labels: tuple[str, ...]
    config: StudyConfig
    job: ArmJob


def arm_split(
    relation: Relation, arms: Sequence[str], per_answer: int, source: str, seed: int
) -> tuple[list[int], list[int], list[str]]:
    """Fine-tuning and held-out sample indices: per answer, ``per_answer`` subjects from the
    source arm (``"both"``: ``ceil(per_answer / 2)`` from each arm), the rest held out. An answer
    that cannot give every arm a held-out subject is left out (returned third)."""
    rng = random.Random(f"arm-split:{seed}:{relation.name}:{source}")
    by: dict[tuple[str, str], list[int]] = {}
    for i, (a, arm) in enumerate(zip(relation.answers, arms)):
        by.setdefault((a, arm), []).append(i)
    take = {arm: 0 for arm in ARMS}
    if source == "both":
        take = {arm: math.ceil(per_answer / 2) for arm in ARMS}
    else:
        take[source] = per_answer
    finetune_idx, heldout, dropped = [], [], []
    for answer in sorted(set(relation.answers)):
        groups = {arm: list(by.get((answer, arm), [])) for arm in ARMS}
        if any(len(groups[arm]) < take[arm] + 1 for arm in ARMS):
            dropped.append(answer)
            continue
        for arm in ARMS:
            rng.shuffle(groups[arm])
            finetune_idx += groups[arm][: take[arm]]
            heldout += groups[arm][take[arm] :]
    return sorted(finetune_idx), sorted(heldout), dropped


def run_arm_job(j: ArmFinetuneInputs) -> dict:
    """Split, relabel, fine-tune and score one job's held-out subjects by arm."""
    job, r, config = j.job, j.relation, j.config
    base = {**asdict(job), "job": job.id}
    ft, ho, dropped = arm_split(r, j.arms, config.per_answer(r), job.source, job.seed)
    if len({r.answers[i] for i in ft}) < 2:
        return {**base, "status": "skipped", "reason": f"fewer than 2 answers can be split by arm (dropped {dropped})"}
    answers = {a.lower() for a in r.answers}
    words = tuple(w for w in j.labels if w.lower() not in answers)
    mapping = relabel([r.answers[i] for i in ft], words, job.seed, config.category)
    label_set = [mapping[a] for a in sorted(mapping)]
    tmpl = config.finetune.template
    tuned, info = finetune(
        j.model,
        [tmpl.format(r.subjects[i]) for i in ft],
        [mapping[r.answers[i]] for i in ft],
        label_set,
        "full",
        config.finetune,
        seed=job.seed,
    )
    scores = tuned.logprobs([tmpl.format(r.subjects[i]) for i in ho], label_set)
    pred = [label_set[i] for i in scores.argmax(-1).tolist()]
    del tuned
    rows = [[r.subjects[i], j.arms[i], mapping[r.answers[i]], p] for i, p in zip(ho, pred)]
    out = {**base, "n_finetune_subjects": len(ft), "dropped_answers": dropped, "mapping": mapping, **info}
    for arm in ARMS:
        sub = [x for x in rows if x[1] == arm]
        out[f"n_heldout_{arm}"] = len(sub)
        out[f"generalization_kappa_{arm}"] = kappa([x[2] for x in sub], [x[3] for x in sub])
    reason = failure_reason(out, config.min_train_kappa)
    return {**out, "status": "failed" if reason else "done", "reason": reason, "predictions": rows}


ARM_FINETUNE = Stage("fine-tune by arm", run_arm_job)


# ----------------------------------------------------------------------------------------------
# the analysis
def arm_kappas(truth: np.ndarray, pred: np.ndarray, masks: np.ndarray) -> np.ndarray:
    """Cohen's kappa of ``pred`` against ``truth`` (label indices, ``[n]``) on each subset of
    ``masks`` (``[draws, n]`` bool, or counts: a bootstrap resample's multiplicities), vectorized:
    ``[draws]`` (NaN where undefined)."""
    n_labels = int(max(truth.max(initial=0), pred.max(initial=0))) + 1
    y, p = np.eye(n_labels)[truth], np.eye(n_labels)[pred]
    m = masks.astype(float)
    n = m.sum(1)
    with np.errstate(invalid="ignore", divide="ignore"):
        po = (m @ (truth == pred).astype(float)) / n
        pe = ((m @ y) * (m @ p)).sum(1) / n**2
        out = (po - pe) / (1 - pe)
    out[~np.isfinite(out)] = np.nan
    return out


@dataclass(frozen=True)
class HeldOut:
    """One fine-tune's held-out predictions as arrays: subject indices (into the world's
    subjects), true and predicted label indices."""

    relation: str
    source: str
    seed: int
    subjects: np.ndarray
    truth: np.ndarray
    pred: np.ndarray

    @classmethod
    def of(cls, record: dict, index: dict[str, int]) -> HeldOut:
        labels = sorted({x[2] for x in record["predictions"]} | {x[3] for x in record["predictions"]})
        code = {w: i for i, w in enumerate(labels)}
        rows = record["predictions"]
        return cls(
            record["relation"],
            record["source"],
            record["seed"],
            np.array([index[x[0]] for x in rows], int),
            np.array([code[x[2]] for x in rows], int),
            np.array([code[x[3]] for x in rows], int),
        )

    def delta(self, augmented: np.ndarray) -> np.ndarray:
        """kappa(augmented held-out) - kappa(plain held-out) under each row of ``augmented``
        (``[draws, n_subjects]`` bool over the world's subjects): ``[draws]``."""
        a = augmented[:, self.subjects]
        return arm_kappas(self.truth, self.pred, a) - arm_kappas(self.truth, self.pred, ~a)


def mean_delta(heldouts: Sequence[HeldOut], relations: Sequence[str], augmented: np.ndarray) -> np.ndarray:
    """T: the mean over ``relations`` of each relation's Δg (mean over its seeds), per draw."""
    per_relation = []
    for name in relations:
        ds = [h.delta(augmented) for h in heldouts if h.relation == name]
        if ds:
            per_relation.append(np.nanmean(np.stack(ds), 0))
    if not per_relation:
        return np.full(len(augmented), np.nan)
    return np.nanmean(np.stack(per_relation), 0)


def randomization_test(
    heldouts: Sequence[HeldOut],
    groups: dict[str, Sequence[str]],
    strata: Sequence,
    observed_arms: np.ndarray,
    n: int,
    seed: int,
) -> dict[str, dict]:
    """T for each group of relations and its two-sided randomization p-value, from the same ``n``
    stratified redraws for every group; also ``"<a> - <b>"`` for the first two groups (the
    manipulated relations' T beyond the controls'). T is defined on the fine-tunes drawn from
    both arms: one-arm fine-tunes (the second factor) never enter it."""
    heldouts = [h for h in heldouts if h.source == "both"]
    draws = stratified_halves(strata, np.random.default_rng(seed), n)
    obs = {g: float(mean_delta(heldouts, rels, observed_arms[None])[0]) for g, rels in groups.items()}
    null = {
        g: np.concatenate([mean_delta(heldouts, rels, draws[i : i + 500]) for i in range(0, n, 500)])
        for g, rels in groups.items()
    }
    names = list(groups)
    if len(names) >= 2:
        key = f"{names[0]} - {names[1]}"
        obs[key], null[key] = obs[names[0]] - obs[names[1]], null[names[0]] - null[names[1]]
    out = {}
    for g, t in obs.items():
        z = null[g][np.isfinite(null[g])]
        out[g] = {"estimate": t, "p_value": monte_carlo_p(z, t), "n_redraws": int(len(z)), "null_sd": float(np.std(z))}
    return out


def bootstrap_delta(
    groups: Sequence[tuple[np.ndarray, np.ndarray, np.ndarray]], augmented: np.ndarray, n_boot: int, seed: int
) -> tuple[float, float]:
    """95% percentile CI of kappa(augmented) - kappa(plain), mean over ``groups`` (one per seed:
    truth, pred and the world-subject index of each row). Subjects are resampled within their arm
    (``augmented``: ``[n_subjects]`` bool) once per replicate, and the same multiplicities apply
    to every seed, since the seeds share most held-out subjects."""
    if not groups:
        return (np.nan, np.nan)
    rng = np.random.default_rng(seed)
    weights = np.zeros((n_boot, len(augmented)))
    for mask in (augmented, ~augmented):
        idx = np.flatnonzero(mask)
        if len(idx):
            weights[:, idx] = rng.multinomial(len(idx), np.full(len(idx), 1 / len(idx)), n_boot)
    total = np.zeros(n_boot)
    for truth, pred, subjects in groups:
        w, aug = weights[:, subjects], augmented[subjects]
        total += arm_kappas(truth, pred, w * aug) - arm_kappas(truth, pred, w * ~aug)
    total /= len(groups)
    return percentile_interval(total[np.isfinite(total)], 0.95)


def bootstrap_mean(values: np.ndarray, n_boot: int, seed: int) -> dict:
    v = np.asarray(values, float)
    v = v[np.isfinite(v)]
    if len(v) < 2:
        return {
            "estimate": float(np.mean(v)) if len(v) else float("nan"),
            "ci_low": float("nan"),
            "ci_high": float("nan"),
            "n": len(v),
        }
    idx = bootstrap_indices(np.random.default_rng(seed), len(v), n_boot)
    low, high = percentile_interval(v[idx].mean(1), 0.95)
    return {"estimate": float(v.mean()), "ci_low": low, "ci_high": high, "n": len(v)}


def ratio_and_slope(df: pd.DataFrame, manipulated: Sequence[str], n_boot: int, seed: int) -> dict:
    """β = ΣΔg / ΣΔρ over the manipulated relations and the cross-sectional slope of pooled
    generalization on pooled readability over all relations, each with a bootstrap CI over relations."""
    rng = np.random.default_rng(seed)
    m = df[df.relation.isin(manipulated)].dropna(subset=["delta_generalization", "delta_readability"])
    dg, dr = m.delta_generalization.to_numpy(), m.delta_readability.to_numpy()
    out = {}
    if len(m) >= 2:
        idx = bootstrap_indices(rng, len(m), n_boot)
        with np.errstate(invalid="ignore", divide="ignore"):
            boots = dg[idx].sum(1) / dr[idx].sum(1)
        low, high = percentile_interval(boots[np.isfinite(boots)], 0.95)
        out["beta"] = {"estimate": float(dg.sum() / dr.sum()), "ci_low": low, "ci_high": high, "n": len(m)}
    c = df.dropna(subset=["readability_all", "generalization_all"])
    x, y = c.readability_all.to_numpy(), c.generalization_all.to_numpy()
    if len(c) >= 3:
        idx = bootstrap_indices(rng, len(c), n_boot)
        slopes = np.array([np.polyfit(x[i], y[i], 1)[0] if np.ptp(x[i]) > 0 else np.nan for i in idx])
        low, high = percentile_interval(slopes[np.isfinite(slopes)], 0.95)
        out["cross_sectional_slope"] = {
            "estimate": float(np.polyfit(x, y, 1)[0]),
            "ci_low": low,
            "ci_high": high,
            "n": len(c),
        }
    return out


def decide(first_stage: dict, primary: dict, control: dict, beta: dict | None, slope: dict | None) -> str:
    """The pre-registered decision rule (module docstring)."""
    stage_holds = first_stage["ci_low"] > 0
    control_ok = not (control["ci_low"] > 0 or control["ci_high"] < 0)
    if stage_holds and primary["estimate"] > 0 and primary["p_value"] < 0.05 and control_ok:
        return "supports"
    if stage_holds and primary["p_value"] >= 0.05 and beta and slope and beta["ci_high"] < slope["estimate"]:
        return "refutes"
    return "open"


def _ci_bars(g: pd.DataFrame, column: str) -> dict:
    """Plotly error bars from ``column`` and its ``_ci_low`` / ``_ci_high`` columns."""
    return {
        "type": "data",
        "symmetric": False,
        "array": g[f"{column}_ci_high"] - g[column],
        "arrayminus": g[column] - g[f"{column}_ci_low"],
        "thickness": 1,
    }


def effects_figure(df: pd.DataFrame, summary: dict) -> go.Figure:
    """Per relation: Δρ (x) against Δg (y) with 95% CIs (subjects resampled within arms), by
    group, and the line the cross-sectional slope predicts through the origin."""
    fig = go.Figure()
    for group, color in (("manipulated", "#d62728"), ("control", "#1f77b4"), ("derived", "#7f7f7f")):
        g = df[df.group == group]
        if g.empty:
            continue
        fig.add_trace(
            go.Scatter(
                x=g.delta_readability,
                y=g.delta_generalization,
                mode="markers+text",
                text=g.relation,
                textposition="top center",
                name=group,
                marker={"color": color, "size": 9},
                error_x=_ci_bars(g, "delta_readability"),
                error_y=_ci_bars(g, "delta_generalization"),
            )
        )
    slope = summary.get("cross_sectional_slope", {}).get("estimate")
    if slope is not None and np.isfinite(slope):
        x = np.array([df.delta_readability_ci_low.min(), df.delta_readability_ci_high.max()])
        fig.add_trace(
            go.Scatter(
                x=x,
                y=slope * x,
                mode="lines",
                name=f"cross-sectional slope {slope:.2f}",
                line={"dash": "dash", "color": "black"},
            )
        )
    fig.update_layout(
        title="Randomized writing: readability vs generalization, augmented − plain (kappa)",
        xaxis_title="Δ readability (augmented − plain)",
        yaxis_title="Δ generalization (augmented − plain)",
        template="plotly_white",
        width=900,
        height=620,
    )
    return place_labels(fig)


# ----------------------------------------------------------------------------------------------
# power
def power_analysis(
    cells: pd.DataFrame, base_kappa: float, effects: Sequence[float], n_sims: int, seed: int = 0
) -> pd.DataFrame:
    """Power of T at each effect (a kappa difference, augmented minus plain) for a design.

    ``cells``: one row per (relation, arm) with ``n_heldout`` and ``n_labels``. Held-out truth is
    uniform over the labels; a prediction is right with the probability that gives kappa
    ``base_kappa ± effect / 2`` in the arm (else a uniformly drawn wrong label). The critical
    value is the 95% quantile of |T| at zero effect from the same simulation (a two-sided test at
    level 0.05)."""
    rng = np.random.default_rng(seed)

    def simulate(effect: float) -> np.ndarray:
        ts = np.zeros(n_sims)
        for _, g in cells.groupby("relation"):
            d = np.zeros(n_sims)
            for arm, sign in zip(ARMS, (0.5, -0.5)):
                row = g[g.arm == arm].iloc[0]
                n, c = int(row.n_heldout), int(row.n_labels)
                k = np.clip(base_kappa + sign * effect, -0.99, 1.0)
                acc = k * (1 - 1 / c) + 1 / c
                truth = rng.integers(0, c, (n_sims, n))
                right = rng.random((n_sims, n)) < acc
                wrong = (truth + rng.integers(1, c, (n_sims, n))) % c
                pred = np.where(right, truth, wrong)
                po = (pred == truth).mean(1)
                pt = np.stack([(truth == i).mean(1) for i in range(c)], 1)
                pp = np.stack([(pred == i).mean(1) for i in range(c)], 1)
                pe = (pt * pp).sum(1)
                d += (1 if sign > 0 else -1) * (po - pe) / (1 - pe)
            ts += d
        return ts / cells.relation.nunique()

    crit = float(np.quantile(np.abs(simulate(0.0)), 0.95))
    rows = [
        {"effect": float(e), "power": float(np.mean(np.abs(simulate(e)) > crit)), "critical_T": crit} for e in effects
    ]
    return pd.DataFrame(rows)


def smallest_detectable(power: pd.DataFrame, level: float = 0.8) -> float:
    ok = power[power.power >= level]
    return float(ok.effect.min()) if len(ok) else float("nan")


# ----------------------------------------------------------------------------------------------
# the experiment
def randomized_causal_test(
    out: str | Path,
    spec: WorldSpec | None = None,
    train: TrainConfig = TrainConfig(),
    config: CausalConfig = CausalConfig(),
    progress: bool | None = None,
    retrain: bool = False,
    executor=None,
) -> pd.DataFrame:
    """Pretrain (or copy) the randomized world's model, measure every relation by arm, fine-tune,
    and run the pre-registered analysis (module docstring). Resumes from ``out``."""
    out = Path(out)
    spec = spec or randomized_spec()
    if not spec.randomized:
        raise ValueError("the world has no randomized relations; build it with lab.world.spec.randomized_spec()")
    world = World.generate(spec)
    runner = Runner(out, progress=progress)
    ckpt = runner.run(world_task(out, "world_randomized", spec, train, retrain=retrain, progress=progress)).folder
    model = interp.load_model(str(ckpt))
    study = config.study
    knowledge: ArmKnowledge = runner.run(
        Task(
            ARM_KNOWLEDGE,
            ArmKnowledgeInputs(model, spec, study.folds, study.probe_C, progress),
            "arms_readability.parquet",
        )
    )
    manipulated = list(spec.randomized)
    derived = {r.name: r.derived_from for r in spec.relations}
    controls = [
        r.name for r in spec.relations if r.name not in manipulated and not derived_from(r.name, manipulated, derived)
    ]
    relations = {r.name: r for r in from_world(world)}
    labels = tuple(LABELS[study.category])
    arms_of = tuple(world.arm[s] for s in world.subjects)
    jobs = [ArmJob(name, "both", s) for name in relations for s in config.seeds]
    if config.one_arm:
        jobs += [ArmJob(name, src, s) for name in manipulated for src in ARMS for s in config.seeds]
    power = _power(relations, arms_of, manipulated, study, labels, config)
    write_table(power, out / "power.csv")
    tasks = [
        Task(
            ARM_FINETUNE,
            ArmFinetuneInputs(model, relations[j.relation], _arms_for(relations[j.relation], world), labels, study, j),
            f"runs/{j.id}.json",
        )
        for j in jobs
    ]
    records = runner.map(tasks, executor=executor, desc="fine-tunes", labels=[j.id for j in jobs])
    df, arms_table, summary = analyze(world, knowledge, records, manipulated, controls, config)
    summary["power"] = {
        "smallest_effect_80": smallest_detectable(power),
        "base_kappa": config.base_kappa,
        "table": "power.csv",
    }
    write_table(df, out / "randomized.csv")
    write_table(arms_table, out / "randomized_arms.csv")
    write_json(summary, out / "randomized.json")
    export(effects_figure(df, summary), out / "figures" / "randomized_effects", ("html", "png"))
    return df


def _arms_for(r: Relation, world: World) -> tuple[str, ...]:
    return tuple(world.arm[s] for s in r.subjects)


def _power(relations, arms_of, manipulated, study, labels, config) -> pd.DataFrame:
    """The power table from the design alone: the held-out sizes of the first seed's split."""
    cells = []
    for name in manipulated:
        r = relations[name]
        arms = arms_of  # a world relation lists every subject in the world's order
        ft, ho, _ = arm_split(r, arms, study.per_answer(r), "both", config.seeds[0])
        n_labels = len({r.answers[i] for i in ft})
        for arm in ARMS:
            cells.append(
                {"relation": name, "arm": arm, "n_heldout": sum(arms[i] == arm for i in ho), "n_labels": n_labels}
            )
    return power_analysis(
        pd.DataFrame(cells), config.base_kappa, np.round(np.arange(0, 0.205, 0.01), 3), config.power_sims
    )


def analyze(
    world: World,
    knowledge: ArmKnowledge,
    records: Sequence[dict | None],
    manipulated: Sequence[str],
    controls: Sequence[str],
    config: CausalConfig,
) -> tuple[pd.DataFrame, pd.DataFrame, dict]:
    """The per-relation table, the per (relation, source, arm) table and the summary."""
    done = [r for r in records if r is not None and r.get("status") == "done"]
    failed = [r for r in records if r is not None and r.get("status") == "failed"]
    index = {s: i for i, s in enumerate(world.subjects)}
    heldouts = [HeldOut.of(r, index) for r in done]
    observed = np.array([world.arm[s] == ARMS[0] for s in world.subjects])
    strata = [world.stratum(s) for s in world.subjects]
    layers = knowledge.layers
    best = layers.loc[layers.groupby(["relation", "arm"]).kappa.idxmax()].set_index(["relation", "arm"])
    readout = knowledge.readout

    arm_rows = []
    for src in SOURCES:
        for name in [r.name for r in world.spec.relations]:
            hs = [h for h in heldouts if h.relation == name and h.source == src]
            if not hs:
                continue
            for arm in ARMS:
                mask = observed if arm == ARMS[0] else ~observed
                ks = [arm_kappas(h.truth, h.pred, mask[None, h.subjects])[0] for h in hs]
                arm_rows.append(
                    {
                        "relation": name,
                        "source": src,
                        "arm": arm,
                        "generalization_kappa": float(np.nanmean(ks)),
                        "n_heldout": int(np.mean([mask[h.subjects].sum() for h in hs])),
                        "n_seeds": len(hs),
                    }
                )
    arms_table = pd.DataFrame(
        arm_rows, columns=["relation", "source", "arm", "generalization_kappa", "n_heldout", "n_seeds"]
    )
    rows = []
    for r in world.spec.relations:
        g = arms_table[(arms_table.relation == r.name) & (arms_table.source == "both")].set_index("arm")
        hs = [h for h in heldouts if h.relation == r.name and h.source == "both"]
        pooled = (
            float(np.nanmean([arm_kappas(h.truth, h.pred, np.ones((1, len(h.truth)), bool))[0] for h in hs]))
            if hs
            else np.nan
        )
        row = {
            "relation": r.name,
            "group": "manipulated" if r.name in manipulated else ("control" if r.name in controls else "derived"),
            "readability_augmented": best.loc[(r.name, "augmented"), "kappa"],
            "readability_plain": best.loc[(r.name, "plain"), "kappa"],
            "readability_all": best.loc[(r.name, "all"), "kappa"],
            "recall_augmented": best.loc[(r.name, "augmented"), "recall"],
            "recall_plain": best.loc[(r.name, "plain"), "recall"],
            "generalization_augmented": g.generalization_kappa.get("augmented", np.nan),
            "generalization_plain": g.generalization_kappa.get("plain", np.nan),
            "generalization_all": pooled,
        }
        row["delta_readability"] = row["readability_augmented"] - row["readability_plain"]
        row["delta_generalization"] = row["generalization_augmented"] - row["generalization_plain"]
        # per-relation CIs: subjects resampled within each arm (readability at each arm's best layer)
        parts = []
        for arm in ARMS:
            ro = readout[
                (readout.relation == r.name)
                & (readout.arm == arm)
                & (readout.layer == best.loc[(r.name, arm), "layer"])
            ]
            parts.append(ro.assign(aug=arm == ARMS[0]))
        ro = pd.concat(parts)
        codes = {a: i for i, a in enumerate(sorted(set(ro.answer) | set(ro.predicted)))}
        row["delta_readability_ci_low"], row["delta_readability_ci_high"] = bootstrap_delta(
            [(ro.answer.map(codes).to_numpy(), ro.predicted.map(codes).to_numpy(), ro.subject.map(index).to_numpy())],
            observed,
            config.n_boot // 5,
            0,
        )
        row["delta_generalization_ci_low"], row["delta_generalization_ci_high"] = bootstrap_delta(
            [(h.truth, h.pred, h.subjects) for h in hs], observed, config.n_boot // 5, 0
        )
        row["delta_recall"] = row["recall_augmented"] - row["recall_plain"]
        rows.append(row)
    df = pd.DataFrame(rows)
    m, c = df[df.group == "manipulated"], df[df.group == "control"]
    seed, nb = 0, config.n_boot
    tests = randomization_test(
        heldouts, {"manipulated": manipulated, "controls": controls}, strata, observed, config.n_redraws, seed
    )
    primary = tests["manipulated"] | {
        k: v for k, v in bootstrap_mean(m.delta_generalization, nb, seed).items() if k != "estimate"
    }
    control = tests["controls"] | {
        k: v for k, v in bootstrap_mean(c.delta_generalization, nb, seed).items() if k != "estimate"
    }
    first_stage = bootstrap_mean(m.delta_readability, nb, seed)
    iv = ratio_and_slope(df, manipulated, nb, seed)
    one_arm = {}
    for src in ARMS:
        t = arms_table[(arms_table.source == src) & arms_table.relation.isin(manipulated)]
        one_arm[f"finetuned on {src}"] = {arm: float(t[t.arm == arm].generalization_kappa.mean()) for arm in ARMS}
    summary = {
        "design": "randomized subjects, one pretraining run",
        "manipulated": list(manipulated),
        "controls": list(controls),
        "arms": {a: int(sum(world.arm[s] == a for s in world.subjects)) for a in ARMS},
        "first_stage_delta_readability": first_stage,
        "first_stage_controls": bootstrap_mean(c.delta_readability, nb, seed),
        "recall_delta": bootstrap_mean(m.delta_recall, nb, seed),
        "primary_mean_delta_generalization": primary,
        "negative_control_mean_delta_generalization": control,
        # exploratory, not pre-registered: the manipulated relations' mean delta beyond the controls'
        "exploratory_manipulated_minus_controls": {
            "delta_generalization": tests["manipulated - controls"],
            "delta_readability": float(m.delta_readability.mean() - c.delta_readability.mean()),
        },
        **iv,
        "one_arm_finetunes": one_arm,
        "decision": decide(first_stage, primary, control, iv.get("beta"), iv.get("cross_sectional_slope")),
        "failed_finetunes": [{"job": r["job"], "reason": r["reason"]} for r in failed],
        "n_finetunes": len(done) + len(failed),
    }
    return df, arms_table, summary
