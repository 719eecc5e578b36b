"""Causal evidence on any model: erase or steer the readable direction, and see whether
generalization follows.

The study measures a correlation: relations whose original answer is linearly readable at the
subject generalize better after relabelling. Two interventions ask whether the fine-tune *uses*
that readable structure. Both act at the subject's last token of the fine-tuning prompt (as the
model reads it when it answers: an encoder's masked slot included), at the layer where the answer
is most readable *on the fine-tuning subjects* (a cross-validated probe; held-out subjects play no
part), chosen among the layers before the last (the last block's output at the subject reaches no
other token, so an intervention there could change nothing). They go through the model handle's
standing interventions (:meth:`interp.models.Model.intervened`), so they run on any model and
backend.

**Erasure (amnesic test).** A LEACE eraser (:mod:`probes.erasure`) of the original answer is fitted
on the pretrained model's states of the *fine-tuning subjects only* (no held-out subject informs
it) and applied during relabelling fine-tuning and during evaluation. Four arms per relation, all
with the same design, seed and stopping rule:

- ``none``: no intervention (the study's fine-tune);
- ``leace``: the answer's subspace erased (rank ``k - 1`` for ``k`` answers);
- ``shuffled``: LEACE of the answers shuffled among the fine-tuning subjects: the same number of
  classes, class sizes and whitened geometry, no link to the subject (the control for "LEACE
  removes high-variance directions");
- ``random``: a random subspace of the same rank erased (``n_random`` draws), the control for
  "the model lost that many dimensions".

Reported per relation: how far each eraser moves the states (``moved_*``: mean squared change over
the states' variance), readability after erasure (5-fold cross-validated logistic probe, kappa, on
the erased fine-tuning states, the eraser refitted inside each fold so that the probe meets
states it was not fitted on (:func:`erased_probe_kappa`); LEACE's in-sample guarantee, zero
cross-covariance, is checked by ``leftover_covariance``; transferred to erased held-out states; and in the
*fine-tuned* LEACE model, whose earlier
blocks moved, so the fixed eraser may no longer remove everything: ``probe_after_tuned_kappa``);
held-out generalization kappa per arm; the **excess drop** ``kappa(random) - kappa(leace)`` (how
much more erasing the answer hurts than erasing as many random dimensions) with a bootstrap CI
over held-out subjects and random draws (not over fine-tuning seeds), and the excess over the
shuffled control. Across relations (the independent units, each with its fine-tunes' own noise):
the mean excess drop with a bootstrap CI over relations and a sign-flip p, and whether it grows
with readability (Pearson r with bootstrap CI and permutation p, :mod:`lab.study.stats`). Every
control is drawn per relation (seeded by its name).

**Steering.** After the ``none`` fine-tune, each held-out subject whose label the fine-tuned model
gets right (``label(a)`` for original answer ``a``) gets a vector added at the same site: the
direction from the class mean of ``a`` to that of another answer ``b`` (drawn per subject, seeded;
class means of the *pretrained* model's fine-tuning-subject states, i.e. the readable structure
before fine-tuning), scaled to ``steer_scale`` times the median distance between class means. The
**switch rate** is how often the prediction becomes ``label(b)``; the control adds random
directions of the same norm (``n_random`` draws). If the fine-tuned model reads the new label from
the direction the probe found before fine-tuning, steering along it switches labels and random
directions do not.

**Scope.** The intervention acts at one site and one position: other tokens of a multi-token
subject, and the residual stream at other layers, keep whatever they carry about the answer, and
later layers may read it from there. A drop is therefore a lower bound on what the readable
structure at that site contributes; no drop does not show that the model does not use the answer
elsewhere.

Results (``interp study interventions``): ``interventions.csv`` (one row per relation),
``arms.csv`` (one row per relation and arm), ``steering.csv`` (one row per steered subject),
``interventions.json`` (across relations), figures and ``interventions.html``. Every fine-tune
arm is saved as it finishes (``runs/``), so an interrupted run resumes.
"""

from __future__ import annotations

import html
import json
import random
import zlib
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import torch
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import StratifiedKFold, cross_val_predict
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

import interp
from interp.models import Model
from interp.plots import PALETTE, export, style
from interp.progress import progress_bar
from interp.prompts import Prompt
from interp.relations import Relation
from interp.results import write_json, write_table, write_text
from interp.tokens import Batch, encode, resolve_positions
from probes.chance import kappa
from probes.erasure import Eraser, fit_leace, leftover, random_subspace
from probes.readability import best_layers

from .finetune import finetune
from .run import default_config, make_study
from .stats import pearson
from .study import StudyConfig
from .validate import validate_study


@dataclass(frozen=True)
class InterventionConfig:
    """``method``: the fine-tuning method of every arm; ``n_random``: random-subspace erasures and
    random steering directions per relation; ``steer_scale``: the steering vector's norm in units
    of the median distance between class means; ``n_boot``: bootstrap resamples of each CI."""

    method: str = "full"
    n_random: int = 3
    steer_scale: float = 1.0
    n_boot: int = 2000
    folds: int = 5
    seed: int = 0

    def to_dict(self) -> dict:
        return asdict(self)


# where the intervention acts ------------------------------------------------------------------
class SubjectEnd:
    """The subject's last token in prompts that put the subject before fixed template words
    (``"{} is associated with the word"``), found in any batch by its content: the token before
    the template's own tokens. Works for padded, reordered or candidate-extended batches alike (a
    forward pass never says which prompt a row came from). The template's tokens are read off
    ``prompts[0]`` as the tokenizer splits it in context (so SentencePiece word-start pieces are
    right), and every prompt is checked against the tokenizer's character offsets."""

    def __init__(self, tokenizer, prompts: Sequence[Prompt]):
        if not prompts:
            raise ValueError("SubjectEnd needs the prompts it will locate subjects in")
        first = prompts[0]
        enc = tokenizer(first.text, return_offsets_mapping=True)
        end = first.text.index(first.subject) + len(first.subject)
        self.suffix = [t for t, (a, b) in zip(enc["input_ids"], enc["offset_mapping"]) if a >= end and b > a]
        if not self.suffix:
            raise ValueError(
                f"{first.text!r} has no words after the subject {first.subject!r}; the subject's end cannot be found"
            )
        for i, p in enumerate(prompts):
            ids = tokenizer(p.text)["input_ids"]
            want = resolve_positions(encode(tokenizer, [p])[0], p, "subject_last", i)[0]
            try:
                got = self.position(ids)
            except ValueError:
                got = None
            if got != want:
                raise ValueError(
                    f"in {p.text!r} the subject's last token is not followed by the template's tokens "
                    f"{self.suffix} (the tokenizer merges across the boundary, or the template differs)"
                )

    def position(self, ids: Sequence[int]) -> int:
        n, m = len(ids), len(self.suffix)
        for i in range(n - m, 0, -1):
            if list(ids[i : i + m]) == self.suffix:
                return i - 1
        raise ValueError(f"the template's tokens {self.suffix} do not occur in a prompt of this batch: {list(ids)}")

    def __call__(self, batch: Batch) -> torch.Tensor:
        """Position of the subject's last token in every row of ``batch`` (padding included)."""
        ids, mask = batch.input_ids.tolist(), batch.attention_mask.tolist()
        return torch.tensor(
            [self.position([t for t, m in zip(row, mrow) if m]) + _lead(mrow) for row, mrow in zip(ids, mask)]
        )

    def prefix(self, row: Sequence[int], mask: Sequence[int]) -> tuple[int, ...]:
        """The row's tokens up to and including the subject's last token: a key for the prompt."""
        toks = [t for t, m in zip(row, mask) if m]
        return tuple(toks[: self.position(toks) + 1])


def _lead(mask_row: Sequence[int]) -> int:
    """Left padding before the first real token."""
    for i, m in enumerate(mask_row):
        if m:
            return i
    return 0


def erasing(locate: SubjectEnd, eraser: Eraser):
    """A standing intervention applying ``eraser`` at the subject's last token of every row."""

    def fn(act, batch):
        pos = locate(batch).to(act.device)
        rows = torch.arange(act.shape[0], device=act.device)
        out = act.clone()
        out[rows, pos] = eraser(act[rows, pos])
        return out

    return fn


def steering(locate: SubjectEnd, vectors: dict[tuple[int, ...], torch.Tensor]):
    """A standing intervention adding ``vectors[prompt prefix]`` at the subject's last token (rows
    whose prompt has no vector are left alone)."""

    def fn(act, batch):
        pos = locate(batch)
        ids, mask = batch.input_ids.tolist(), batch.attention_mask.tolist()
        add = torch.zeros(act.shape[0], act.shape[-1], dtype=act.dtype, device=act.device)
        for r, (row, mrow) in enumerate(zip(ids, mask)):
            v = vectors.get(locate.prefix(row, mrow))
            if v is not None:
                add[r] = v.to(act.device, act.dtype)
        out = act.clone()
        rows = torch.arange(act.shape[0], device=act.device)
        out[rows, pos.to(act.device)] = act[rows, pos.to(act.device)] + add
        return out

    return fn


# the test ---------------------------------------------------------------------------------------
def states(model: Model, prompts: Sequence[Prompt], layer: int | Sequence[int]) -> torch.Tensor:
    """Residual states after ``layer`` at each prompt's subject's last token, as the model reads
    the prompt when it answers (:meth:`interp.scoring.Scoring.context`: an encoder's masked slot
    included): ``[n, d_model]``, or ``[layer, n, d_model]`` for several layers."""
    many = not isinstance(layer, int)
    layers = list(layer) if many else [layer]
    sites = [model.resid_site(l) for l in layers]
    read = [Prompt(model.scoring.context(p.text), p.subject) for p in prompts]
    acts = interp.capture(model, read, sites=sites, positions="subject_last", progress=False)
    out = torch.stack([acts[s].float() for s in sites])
    return out if many else out[0]


def probe_kappa(
    x_fit: np.ndarray,
    y_fit: Sequence,
    x_test: np.ndarray | None = None,
    y_test: Sequence | None = None,
    folds: int = 5,
    seed: int = 0,
) -> float:
    """Kappa of a standardized logistic probe: cross-validated on ``(x_fit, y_fit)``, or trained
    there and tested on ``(x_test, y_test)``. Answers rarer than ``folds`` are left out of CV."""
    y_fit = np.asarray(y_fit)
    probe = make_pipeline(StandardScaler(), LogisticRegression(C=1.0, max_iter=2000))
    if x_test is None:
        counts = pd.Series(y_fit).value_counts()
        keep = np.isin(y_fit, counts[counts >= folds].index)
        if len(set(y_fit[keep])) < 2:
            return float("nan")
        cv = StratifiedKFold(folds, shuffle=True, random_state=seed)
        pred = cross_val_predict(probe, x_fit[keep], y_fit[keep], cv=cv)
        return kappa(list(y_fit[keep]), list(pred))
    probe.fit(x_fit, y_fit)
    return kappa(list(y_test), list(probe.predict(x_test)))


def erased_probe_kappa(x: np.ndarray, y: Sequence, folds: int = 5, seed: int = 0) -> float:
    """Cross-validated probe kappa on LEACE-erased states, the eraser fitted inside each fold on
    the training rows only (erasing with an eraser fitted on all rows and then cross-validating
    gives *below*-chance kappas: equalizing the class means of the whole set pushes each held-out
    fold's class means the opposite way of the training folds')."""
    y = np.asarray(y)
    counts = pd.Series(y).value_counts()
    keep = np.isin(y, counts[counts >= folds].index)
    x, y = x[keep], y[keep]
    if len(set(y)) < 2:
        return float("nan")
    pred = np.empty(len(y), dtype=object)
    for train, test in StratifiedKFold(folds, shuffle=True, random_state=seed).split(x, y):
        eraser = fit_leace(torch.as_tensor(x[train]), y[train])
        probe = make_pipeline(StandardScaler(), LogisticRegression(C=1.0, max_iter=2000))
        probe.fit(eraser(torch.as_tensor(x[train])).numpy(), y[train])
        pred[test] = probe.predict(eraser(torch.as_tensor(x[test])).numpy())
    return kappa(list(y), list(pred))


def fit_erasers(x_finetune: torch.Tensor, answers: Sequence[str], n_random: int, seed: int) -> dict[str, Eraser]:
    """Erasers fitted on the fine-tuning subjects' states alone (the only states this function
    sees): ``leace`` (the answers), ``shuffled`` (LEACE of the answers shuffled among the subjects:
    the same number of classes, class sizes and whitened geometry, no link to the subject) and
    ``random0..`` (random subspaces of LEACE's rank). ``seed`` should differ between relations."""
    leace = fit_leace(x_finetune, answers)
    shuffled = list(answers)
    random.Random(seed).shuffle(shuffled)
    rank = leace.rank
    return {
        "leace": leace,
        "shuffled": fit_leace(x_finetune, shuffled),
        **{f"random{j}": random_subspace(x_finetune, rank, seed * 1000 + j) for j in range(n_random)},
    }


def relation_seed(seed: int, relation: str) -> int:
    """A seed of its own for each relation (so the controls of different relations are independent draws)."""
    return zlib.crc32(f"{seed}:{relation}".encode()) % (2**31)


class Interventions:
    """Erasure and steering on ``model`` over the relations a study of it would use (see the
    module docstring). ``study_config``: the study's design and fine-tuning settings (default:
    the study's own for this model); ``relations`` (and ``labels`` for a real model): as
    :func:`lab.study.run_study` takes them."""

    def __init__(
        self,
        model="world",
        relations: Sequence | None = None,
        out: str | Path = "results/interventions",
        config: InterventionConfig = InterventionConfig(),
        study_config: StudyConfig | None = None,
        backend: str = interp.DEFAULT_BACKEND,
        progress: bool | None = None,
        labels: dict | None = None,
    ):
        self.out = Path(out)
        self.config = config
        self.progress = progress
        self.study, self.qualification = make_study(
            model,
            relations,
            self.out,
            study_config or default_config(model),
            backend,
            progress,
            labels=labels,
            min_relations=1,
        )
        self.model = self.study.model

    def _check_folder(self) -> None:
        self.study._check_folder()  # the same model, relations and study configuration, or refuse
        path = self.out / "interventions_config.json"
        if path.exists() and json.loads(path.read_text()) != self.config.to_dict():
            raise ValueError(
                f"{self.out} holds interventions run with {json.loads(path.read_text())}, not "
                f"{self.config.to_dict()}; use a new output folder"
            )
        write_json(self.config.to_dict(), path)

    def run(self) -> pd.DataFrame:
        """Run (or resume) both interventions on every relation; returns the per-relation table."""
        if self.config.method not in ("full", "lora"):
            raise ValueError(f"unknown fine-tuning method {self.config.method!r}; use 'full' or 'lora'")
        if self.model.n_layers < 2:
            raise ValueError(
                "an intervention at the subject must act before the last block (whose output at the subject "
                "reaches no other token): the model needs at least 2 layers"
            )
        validate_study(self.study, min_relations=1)  # one relation can be intervened on; correlations need 3
        self._check_folder()
        if self.qualification is not None:
            write_table(self.qualification, self.out / "qualification.csv")
        _, layers, _ = self.study._readability()
        best = best_layers(layers)
        kap = layers.set_index(["relation", "layer"]).kappa
        rows, arms, steer = [], [], []
        relations = list(self.study.relations.values())
        for r in progress_bar(relations, desc="interventions", unit="relations", progress=self.progress):
            row, arm_rows, steer_rows = self._relation(r)
            row["readability_kappa"] = float(kap[(r.name, best[r.name])])
            rows.append(row)
            arms += arm_rows
            steer += steer_rows
        table, arms, steer = pd.DataFrame(rows), pd.DataFrame(arms), pd.DataFrame(steer)
        summary = summarize(table, self.config, self.model.name, self.study.config.finetune.template)
        write_table(table, self.out / "interventions.csv")
        write_table(arms, self.out / "arms.csv")
        write_table(steer, self.out / "steering.csv")
        write_json(summary, self.out / "interventions.json")
        write_report(self.out)
        return table

    # one relation -----------------------------------------------------------------------------
    def _relation(self, r: Relation) -> tuple[dict, list[dict], list[dict]]:
        c, sc = self.config, self.study.config
        seed = relation_seed(c.seed, r.name)
        design = self.study.design(r, sc.category, sc.label_seeds[0])
        tmpl = sc.finetune.template
        prompts = {i: Prompt(tmpl.format(r.subjects[i]), r.subjects[i]) for i in design.finetune + design.heldout}
        locate = SubjectEnd(
            self.model.tokenizer, [Prompt(self.model.scoring.context(p.text), p.subject) for p in prompts.values()]
        )
        a_ft = [r.answers[i] for i in design.finetune]
        a_ho = [r.answers[i] for i in design.heldout]
        # the layer: the most readable one on the fine-tuning subjects (held-out subjects play no part), before
        # the last block, whose output at the subject reaches no other token
        candidates = list(range(self.model.n_layers - 1))
        x_all = states(self.model, [prompts[i] for i in design.finetune], candidates)
        by_layer = [probe_kappa(x.numpy(), a_ft, folds=c.folds, seed=c.seed) for x in x_all]
        layer = candidates[int(np.nanargmax(by_layer))] if np.isfinite(by_layer).any() else candidates[-1]
        x_ft = x_all[layer]
        x_ho = states(self.model, [prompts[i] for i in design.heldout], layer)
        erasers = fit_erasers(x_ft, a_ft, c.n_random, seed)
        leace = erasers["leace"]
        randoms = [a for a in erasers if a.startswith("random")]
        row = {
            "relation": r.name,
            "layer": layer,
            "n_answers": len(design.labels),
            "n_finetune": len(design.finetune),
            "n_heldout": len(design.heldout),
            "rank": leace.rank,
            "leftover_covariance": leftover(leace, x_ft, a_ft),
            "probe_before_kappa": by_layer[layer],
            "probe_after_kappa": erased_probe_kappa(x_ft.numpy(), a_ft, folds=c.folds, seed=c.seed),
            "transfer_before_kappa": probe_kappa(x_ft.numpy(), a_ft, x_ho.numpy(), a_ho),
            "transfer_after_kappa": probe_kappa(leace(x_ft).numpy(), a_ft, leace(x_ho).numpy(), a_ho),
            # how much each eraser moves the states (mean squared change / mean squared deviation from the
            # mean): LEACE removes the answer's directions, which may carry more variance than random ones
            "moved_leace": _moved(x_ft, leace),
            "moved_shuffled": _moved(x_ft, erasers["shuffled"]),
            "moved_random": float(np.mean([_moved(x_ft, erasers[k]) for k in randoms])),
        }
        ft_prompts = [prompts[i].text for i in design.finetune]
        ft_labels = [design.mapping[a] for a in a_ft]
        ho_prompts = [prompts[i].text for i in design.heldout]
        truth = [design.mapping[a] for a in a_ho]
        site = self.model.resid_site(layer)
        preds, arm_rows, tuned_none = {}, [], None
        for arm in ["none", *erasers]:
            path = self.out / "runs" / f"{r.name}__{arm}.json"
            if path.exists():
                res = json.loads(path.read_text())
            else:
                model = self.model if arm == "none" else self.model.intervened(site, erasing(locate, erasers[arm]))
                tuned, info = finetune(
                    model, ft_prompts, ft_labels, design.labels, c.method, sc.finetune, seed=sc.finetune_seeds[0]
                )
                scores = tuned.logprobs(ho_prompts, design.labels)
                res = {"layer": layer, "predicted": [design.labels[j] for j in scores.argmax(-1).tolist()], **info}
                if arm == "none":
                    tuned_none = tuned
                else:  # is the answer still erased in the fine-tuned model? (its earlier blocks moved)
                    res["probe_after_tuned_kappa"] = probe_kappa(
                        states(tuned, [prompts[i] for i in design.finetune], layer).numpy(),
                        a_ft,
                        folds=c.folds,
                        seed=c.seed,
                    )
                (self.out / "runs").mkdir(parents=True, exist_ok=True)
                write_json(res, path)
            preds[arm] = res["predicted"]
            arm_rows.append(
                {
                    "relation": r.name,
                    "arm": arm,
                    "kind": arm.rstrip("0123456789"),
                    "generalization_kappa": kappa(truth, res["predicted"]),
                    "generalization": float(np.mean([p == t for p, t in zip(res["predicted"], truth)])),
                    "probe_after_tuned_kappa": res.get("probe_after_tuned_kappa", np.nan),
                    "train_accuracy": res["train_accuracy"],
                    "steps": res["steps"],
                }
            )
        k = {arm: kappa(truth, preds[arm]) for arm in preds}
        k_random = float(np.mean([k[a] for a in randoms]))
        lo, hi = _bootstrap_excess(truth, preds["leace"], [preds[a] for a in randoms], c.n_boot, seed)
        row.update(
            {
                "probe_after_tuned_kappa": float(
                    next(a["probe_after_tuned_kappa"] for a in arm_rows if a["arm"] == "leace")
                ),
                "generalization_none": k["none"],
                "generalization_leace": k["leace"],
                "generalization_shuffled": k["shuffled"],
                "generalization_random": k_random,
                "generalization_random_sd": float(np.std([k[a] for a in randoms])),
                "drop_leace": k["none"] - k["leace"],
                "drop_random": k["none"] - k_random,
                "excess_drop": k_random - k["leace"],
                "excess_drop_ci_low": lo,
                "excess_drop_ci_high": hi,
                "excess_drop_shuffled": k["shuffled"] - k["leace"],
            }
        )
        steer_rows = self._steer(r, design, locate, layer, x_ft, a_ft, prompts, preds["none"], tuned_none, seed)
        sr = pd.DataFrame(steer_rows)
        if len(sr):
            s_lo, s_hi = _bootstrap_mean_diff(
                sr.switched.to_numpy(float), sr.switched_random.to_numpy(float), c.n_boot, seed
            )
            row.update(
                {
                    "n_steered": len(sr),
                    "switch_rate": float(sr.switched.mean()),
                    "switch_rate_random": float(sr.switched_random.mean()),
                    "changed_rate": float(sr.changed.mean()),
                    "changed_rate_random": float(sr.changed_random.mean()),
                    "switch_excess": float(sr.switched.mean() - sr.switched_random.mean()),
                    "switch_excess_ci_low": s_lo,
                    "switch_excess_ci_high": s_hi,
                    "steer_norm": float(sr.norm.iloc[0]),
                }
            )
        else:
            row.update(
                {
                    c_: np.nan
                    for c_ in (
                        "switch_rate",
                        "switch_rate_random",
                        "changed_rate",
                        "changed_rate_random",
                        "switch_excess",
                        "switch_excess_ci_low",
                        "switch_excess_ci_high",
                        "steer_norm",
                    )
                }
            )
            row["n_steered"] = 0
        return row, arm_rows, steer_rows

    def _steer(self, r, design, locate, layer, x_ft, a_ft, prompts, pred_none, tuned, seed) -> list[dict]:
        """Steering on the ``none`` fine-tune. Its predictions are saved but not its weights: after
        an interruption it is fine-tuned again (same seed) and must reproduce them."""
        path = self.out / "runs" / f"{r.name}__steering.json"
        if path.exists():
            return json.loads(path.read_text())
        c, sc = self.config, self.study.config
        ho_texts = [prompts[i].text for i in design.heldout]
        if tuned is None:
            ft_labels = [design.mapping[a] for a in a_ft]
            tuned, _ = finetune(
                self.model,
                [prompts[i].text for i in design.finetune],
                ft_labels,
                design.labels,
                c.method,
                sc.finetune,
                seed=sc.finetune_seeds[0],
            )
            again = [design.labels[j] for j in tuned.logprobs(ho_texts, design.labels).argmax(-1).tolist()]
            if again != pred_none:
                raise RuntimeError(
                    f"{r.name}: the fine-tune made again for steering does not reproduce the saved predictions "
                    f"({sum(a != b for a, b in zip(again, pred_none))} differ; another machine or thread count?); "
                    f"delete {self.out / 'runs' / (r.name + '__none.json')} to redo both"
                )
        answers = sorted(design.mapping)
        y = np.asarray(a_ft)
        means = {a: x_ft[torch.as_tensor(y == a)].mean(0) for a in answers}
        dists = [float((means[a] - means[b]).norm()) for i, a in enumerate(answers) for b in answers[i + 1 :]]
        norm = c.steer_scale * float(np.median(dists))
        rng = random.Random(seed)
        gen = torch.Generator().manual_seed(seed)
        targets = []
        for i, p in zip(design.heldout, pred_none):
            a = r.answers[i]
            if p != design.mapping[a]:
                continue  # only subjects the fine-tuned model labels right can switch away from label(a)
            targets.append((i, a, rng.choice([x for x in answers if x != a])))
        texts = [self.model.scoring.context(prompts[i].text) for i, _, _ in targets]
        enc = self.model.tokenizer(texts)
        keys = [locate.prefix(ids, m) for ids, m in zip(enc["input_ids"], enc["attention_mask"])]
        shared = {k for k in keys if keys.count(k) > 1}  # two subjects that tokenize alike cannot be steered apart
        targets = [t for t, k in zip(targets, keys) if k not in shared]
        keys = [k for k in keys if k not in shared]
        if not targets:
            write_json([], path)
            return []
        direction = {
            k: (means[b] - means[a]) / (means[b] - means[a]).norm() * norm for k, (_, a, b) in zip(keys, targets)
        }
        texts = [prompts[i].text for i, _, _ in targets]
        site = self.model.resid_site(layer)
        steered = tuned.intervened(site, steering(locate, direction)).logprobs(texts, design.labels).argmax(-1).tolist()
        switched_random, changed_random = np.zeros(len(targets)), np.zeros(len(targets))
        for _ in range(c.n_random):
            rand = {}
            for k in keys:
                v = torch.randn(x_ft.shape[1], generator=gen)
                rand[k] = v / v.norm() * norm
            out = tuned.intervened(site, steering(locate, rand)).logprobs(texts, design.labels).argmax(-1).tolist()
            switched_random += [design.labels[o] == design.mapping[b] for o, (_, _, b) in zip(out, targets)]
            changed_random += [design.labels[o] != design.mapping[a] for o, (_, a, _) in zip(out, targets)]
        rows = [
            {
                "relation": r.name,
                "subject": r.subjects[i],
                "answer": a,
                "target_answer": b,
                "label": design.mapping[a],
                "target_label": design.mapping[b],
                "steered_label": design.labels[o],
                "switched": design.labels[o] == design.mapping[b],
                "changed": design.labels[o] != design.mapping[a],
                "switched_random": float(sw / c.n_random),
                "changed_random": float(ch / c.n_random),
                "norm": norm,
            }
            for (i, a, b), o, sw, ch in zip(targets, steered, switched_random, changed_random)
        ]
        write_json(rows, path)
        return rows


def _moved(x: torch.Tensor, eraser: Eraser) -> float:
    return float(((eraser(x) - x) ** 2).sum(1).mean() / ((x - x.mean(0)) ** 2).sum(1).mean())


def _bootstrap_excess(truth, leace, randoms, n_boot: int, seed: int) -> tuple[float, float]:
    """95% bootstrap CI of ``mean_j kappa(random_j) - kappa(leace)``, resampling held-out subjects
    (paired across arms) and the random draws. It does not cover the spread between fine-tuning
    seeds of the LEACE arm; the test across relations (:func:`summarize`) does."""
    rng = np.random.default_rng(seed)
    truth, leace = np.asarray(truth), np.asarray(leace)
    randoms = [np.asarray(x) for x in randoms]
    n, vals = len(truth), []
    for _ in range(n_boot):
        idx = rng.integers(0, n, n)
        draws = rng.integers(0, len(randoms), len(randoms))
        t = list(truth[idx])
        vals.append(np.mean([kappa(t, list(randoms[j][idx])) for j in draws]) - kappa(t, list(leace[idx])))
    return float(np.quantile(vals, 0.025)), float(np.quantile(vals, 0.975))


def _bootstrap_mean_diff(a: np.ndarray, b: np.ndarray, n_boot: int, seed: int) -> tuple[float, float]:
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(a), (n_boot, len(a)))
    d = a[idx].mean(1) - b[idx].mean(1)
    return float(np.quantile(d, 0.025)), float(np.quantile(d, 0.975))


def across_relations(values: Sequence[float], n_boot: int, seed: int) -> dict:
    """Mean over relations with a bootstrap CI over relations and a two-sided sign-flip p-value
    (relations are the independent units: each value carries its fine-tune's own noise)."""
    v = np.asarray([x for x in values if np.isfinite(x)], float)
    if len(v) < 2:
        return {"mean": float(v.mean()) if len(v) else float("nan"), "n": len(v)}
    rng = np.random.default_rng(seed)
    boot = v[rng.integers(0, len(v), (n_boot, len(v)))].mean(1)
    flips = (rng.choice([-1.0, 1.0], (n_boot, len(v))) * v).mean(1)
    return {
        "mean": float(v.mean()),
        "ci": [float(np.quantile(boot, 0.025)), float(np.quantile(boot, 0.975))],
        "p_sign_flip": float((1 + np.sum(np.abs(flips) >= abs(v.mean()) - 1e-12)) / (n_boot + 1)),
        "n": len(v),
    }


def summarize(table: pd.DataFrame, config: InterventionConfig, model: str, template: str) -> dict:
    """Across relations: means with CIs over relations, and whether the excess drop and the
    steering excess grow with readability."""

    def corr(y: str) -> dict:
        t = table[["readability_kappa", y]].dropna()
        if len(t) < 3:
            return {"r": float("nan"), "n": len(t)}
        out = pearson(t.readability_kappa, t[y], config.n_boot, config.n_boot, config.seed)
        return {"r": out["r"], "ci": [out["ci_low"], out["ci_high"]], "p_value": out["p_value"], "n": out["n"]}

    means = (
        "probe_before_kappa",
        "probe_after_kappa",
        "probe_after_tuned_kappa",
        "transfer_before_kappa",
        "transfer_after_kappa",
        "moved_leace",
        "moved_shuffled",
        "moved_random",
        "generalization_none",
        "generalization_leace",
        "generalization_shuffled",
        "generalization_random",
        "excess_drop",
        "excess_drop_shuffled",
        "switch_rate",
        "switch_rate_random",
        "changed_rate",
        "changed_rate_random",
        "switch_excess",
    )
    return {
        "model": model,
        "template": template,
        "n_relations": int(len(table)),
        "config": config.to_dict(),
        "mean": {c: float(table[c].mean()) for c in means},
        "excess_drop": across_relations(table.excess_drop, config.n_boot, config.seed),
        "excess_drop_shuffled": across_relations(table.excess_drop_shuffled, config.n_boot, config.seed),
        "switch_excess": across_relations(table.switch_excess, config.n_boot, config.seed),
        "relations_excess_drop_ci_above_0": int((table.excess_drop_ci_low > 0).sum()),
        "relations_switch_excess_ci_above_0": int((table.switch_excess_ci_low > 0).sum()),
        "excess_drop_vs_readability": corr("excess_drop"),
        "switch_excess_vs_readability": corr("switch_excess"),
    }


# figures and report ----------------------------------------------------------------------------
def figures(out: Path) -> dict[str, go.Figure]:
    t = pd.read_csv(out / "interventions.csv").sort_values("readability_kappa")
    s = json.loads((out / "interventions.json").read_text())
    bars = go.Figure()
    for (col, name), color in zip(
        [
            ("generalization_none", "no erasure"),
            ("generalization_random", "random subspace"),
            ("generalization_shuffled", "shuffled answers (LEACE)"),
            ("generalization_leace", "answer erased (LEACE)"),
        ],
        PALETTE,
    ):
        bars.add_bar(x=t.relation, y=t[col], name=name, marker_color=color)
    bars.update_layout(
        title="Held-out generalization under erasure (kappa)",
        barmode="group",
        yaxis_title="kappa (0 = chance)",
        xaxis_tickangle=-45,
    )
    figs = {"erasure": style(bars, "two-column")}
    for y, name in (
        ("excess_drop", "excess drop (random - LEACE)"),
        ("switch_excess", "switch rate excess over random"),
    ):
        c = s[f"{y}_vs_readability"]
        sub = (
            f"<br><sup>Pearson r = {c['r']:.2f} "
            f"[{c.get('ci', [np.nan] * 2)[0]:.2f}, {c.get('ci', [np.nan] * 2)[1]:.2f}], "
            f"permutation p = {c.get('p_value', np.nan):.2g}, n = {c['n']}</sup>"
        )
        err = dict(type="data", symmetric=False, array=t[f"{y}_ci_high"] - t[y], arrayminus=t[y] - t[f"{y}_ci_low"])
        fig = go.Figure(
            go.Scatter(
                x=t.readability_kappa,
                y=t[y],
                mode="markers+text",
                text=t.relation,
                error_y=err,
                textposition="top center",
                textfont=dict(size=11),
                marker=dict(size=10, color=PALETTE[0]),
            )
        )
        fig.add_hline(y=0, line_dash="dot", line_color="#888")
        fig.update_layout(
            title=f"{name} vs readability{sub}",
            xaxis_title="probe kappa of the original answer (best layer)",
            yaxis_title=name,
        )
        figs[y] = style(fig, "two-column")
    return figs


def write_report(out: str | Path) -> Path:
    """Figures (HTML, and PNG/SVG/PDF where kaleido can) and ``interventions.html`` from the saved tables."""
    out = Path(out)
    figs = figures(out)
    for name, fig in figs.items():
        export(fig, out / "figures" / f"interventions_{name}")
    s = json.loads((out / "interventions.json").read_text())
    t = pd.read_csv(out / "interventions.csv")
    parts = "".join(
        f"<section>{fig.to_html(full_html=False, include_plotlyjs=i == 0)}</section>"
        for i, fig in enumerate(figs.values())
    )
    page = (
        f"""<!doctype html><html><head><meta charset="utf-8"><title>Interventions: {html.escape(s["model"])}</title>
<style>body{{font-family:Arial,Helvetica,sans-serif;max-width:1500px;margin:2em auto;padding:0 1em}}"""
        f"""table{{border-collapse:collapse;font-size:13px}}
td,th{{border:1px solid #ccc;padding:3px 6px;text-align:right}}</style></head><body>
<h1>Is the readable direction what the fine-tune uses?</h1>
<p>{html.escape(section(out))}</p>
{parts}<section><h2>Relations</h2>{t.to_html(index=False, float_format=lambda v: f"{v:.3f}")}</section></body></html>"""
    )
    path = out / "interventions.html"
    write_text(page, path)
    return path


def section(out: str | Path) -> str:
    """The findings in one paragraph, from the saved tables."""
    s = json.loads((Path(out) / "interventions.json").read_text())
    m, e, w = s["mean"], s["excess_drop_vs_readability"], s["switch_excess_vs_readability"]
    nan2 = [np.nan] * 2
    ci = lambda c: f"[{c.get('ci', nan2)[0]:.3f}, {c.get('ci', nan2)[1]:.3f}]"  # noqa: E731
    ed, es, sw = s["excess_drop"], s["excess_drop_shuffled"], s["switch_excess"]
    return (
        f"{s['model']}, {s['n_relations']} relations ({s['config']['method']} fine-tuning, "
        f"{s['config']['n_random']} random "
        f"draws per control). Erasing the original answer (LEACE at the most readable layer before the last, at the "
        "subject's last token, fitted on the fine-tuning subjects) takes the probe from kappa "
        f"{m['probe_before_kappa']:.3f} "
        f"to {m['probe_after_kappa']:.3f} on those subjects ({m['transfer_after_kappa']:.3f} transferred to held-out "
        f"subjects, from {m['transfer_before_kappa']:.3f}; {m['probe_after_tuned_kappa']:.3f} "
        "in the fine-tuned model, whose "
        f"earlier blocks moved); it moves the states by {m['moved_leace']:.4f} of their variance, LEACE of shuffled "
        f"answers by {m['moved_shuffled']:.4f}, a random subspace of the same rank by {m['moved_random']:.4f}. "
        "Held-out "
        f"generalization kappa: {m['generalization_none']:.3f} without erasure, "
        f"{m['generalization_random']:.3f} with a random "
        f"subspace erased, {m['generalization_shuffled']:.3f} with shuffled answers erased, "
        f"{m['generalization_leace']:.3f} "
        f"with the answer erased. Excess drop over the random control, mean over relations {ed['mean']:.3f} "
        f"(95% CI {ci(ed)}, sign-flip p = {ed.get('p_sign_flip', np.nan):.2g}; its per-relation CI excludes 0 in "
        f"{s['relations_excess_drop_ci_above_0']} relations); over the shuffled control {es['mean']:.3f} "
        f"(CI {ci(es)}, p = {es.get('p_sign_flip', np.nan):.2g}). Across relations, excess drop vs readability: "
        f"r = {e['r']:.2f} {ci(e)}, permutation p = {e.get('p_value', np.nan):.2g}. "
        "Steering held-out subjects from answer "
        f"a toward b along the pretrained class-mean direction switches the fine-tuned model's label to label(b) in "
        f"{m['switch_rate']:.3f} of cases against {m['switch_rate_random']:.3f} for random directions of the same norm "
        f"(any change: {m['changed_rate']:.3f} vs {m['changed_rate_random']:.3f}); "
        f"excess {sw['mean']:.3f} (CI {ci(sw)}, "
        f"sign-flip p = {sw.get('p_sign_flip', np.nan):.2g}); vs readability r = {w['r']:.2f} {ci(w)}."
    )
