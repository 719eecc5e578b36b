"""Erasure arms of the interventions: fit the erasers on the fine-tuning subjects, fine-tune
once per arm with the eraser standing at the subject, score the held-out subjects.

Per relation (:func:`setup`, recomputed each run, cheap): the design (the study's relabelling
and split), the layer (the most readable one on the fine-tuning subjects, before the last), the
pretrained model's states there, and the erasers (:func:`fit_erasers`). Then one stage task per
arm (:data:`ARM`, saved as ``runs/<relation>__<arm>.json``): ``none``, ``leace``, ``shuffled``,
``random0..``. :func:`erasure_rows` turns the saved arms into the relation's row and its arm
rows, with the excess drop's bootstrap interval over held-out subjects and random draws.

**The bottleneck arms** (``bottleneck_leace``, ``bottleneck_shuffled``, ``bottleneck_random0..``;
``InterventionConfig(bottleneck=True)``) erase at the input instead: the same erasers fitted on
the fine-tuning subjects' *input embeddings* at the subject's last token (``hook_embed``) and
applied there. In the world model that token is the subject's family name, a token of its own
whose embedding row is frozen during fine-tuning, so no block can re-encode from it what the input
no longer holds (the layer arms act after block ``layer``, where attention has already read the
subject's other tokens and the unerased embedding). What the model can still use: the subject's
other tokens (first names, shared among subjects).

**The all-token arms** (``alltoken_leace``, ``alltoken_shuffled``, ``alltoken_random0..``;
``InterventionConfig(all_tokens=True)``) erase at *every* subject token and at every site a later
token reads the subject from: the input embeddings and the residual stream after every block but
the last (:func:`token_sites`). The erasers are fitted site by site on the fine-tuning subjects,
each on the states the model has with the erasers of the earlier sites already standing (as
LEACE's concept scrubbing does), pooled over the subject's tokens in two groups: its last token
and its earlier tokens (each group its own eraser, so a classifier of either group's states finds
no linear trace of the answer). No token after the subject reads an unerased subject state at any
layer; what a later block can still use is information the erasers leave: non-linearly encoded, or
what the template words carry. On a model with word-piece subjects (MiniLM) this is the arm that
closes the routes the one-site arm leaves open.

**Recall after erasure** (:func:`erased_recall`): each eraser standing on the *pretrained* model,
the accuracy of the original relation on the held-out subjects (the argmax among the relation's
answers). Read beside generalization, it tells "the fine-tune needs the erased direction" from
"the erasure broke the model": a LEACE arm should remove recall, a random subspace should not.
"""

from __future__ import annotations

import random
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

import interp
from interp.models import Model
from interp.positions import SubjectEnd, SubjectTokens
from interp.prompts import Prompt
from interp.relations import Relation
from interp.resampling import percentile_interval
from lab.stages import DERIVED, JSON, Codec, Stage
from probes.chance import kappa
from probes.erasure import Eraser, erased_probe_kappa, fit_leace, leftover, random_subspace
from probes.readability import probe_kappa

from ..config import design_for
from ..design import Design
from ..finetune import finetune


def relation_seed(seed: int, relation: str) -> int:
    """A seed of its own for each relation (so the controls of different relations are independent draws)."""
    return zlib.crc32(f"{seed}:{relation}".encode()) % (2**31)


def erasing(locate: SubjectEnd, eraser: Eraser):
    """A standing intervention applying ``eraser`` at the subject's last token of every row."""

    def fn(act, batch):
        pos = locate(batch).to(act.device)
        rows = torch.arange(act.shape[0], device=act.device)
        out = act.clone()
        out[rows, pos] = eraser(act[rows, pos])
        return out

    return fn


#: the input site the bottleneck arms erase at (the token embeddings)
BOTTLENECK_SITE = "hook_embed"
#: the prefix of the bottleneck arms' names
BOTTLENECK = "bottleneck_"


#: the prefix of the all-token arms' names
ALL_TOKENS = "alltoken_"

#: one site's erasers of an all-token arm, by token group (0: the subject's last token, 1: its earlier ones)
TokenErasers = dict[int, Eraser]


def token_sites(model: Model) -> list[str]:
    """Where the all-token arms erase: the input embeddings and the residual stream after every
    block but the last (whose output at the subject reaches no later token)."""
    return [BOTTLENECK_SITE] + [model.resid_site(l) for l in range(model.n_layers - 1)]


def erasing_tokens(locate: SubjectTokens, erasers: TokenErasers):
    """A standing intervention applying ``erasers[group]`` at every subject token of every row
    (group 0: the last token, 1: the earlier ones; a group no eraser was fitted for, because no
    fine-tuning subject had such tokens, gets the last token's)."""

    def fn(act, batch):
        rows, pos, off = locate(batch)
        group = off.clamp(max=1)
        out = act.clone()
        for g in group.unique().tolist():
            sel = group == g
            r, p = rows[sel].to(act.device), pos[sel].to(act.device)
            out[r, p] = erasers.get(g, erasers[0])(act[r, p])
        return out

    return fn


def token_states(
    model: Model, texts: Sequence[str], locate: SubjectTokens, site: str, batch_size: int = 64
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """States at ``site`` of every subject token of ``texts`` (with the model's standing
    interventions): ``[rows, d_model]``, each row's offset from the subject's last token, and
    the index of its text."""
    xs, offsets, index = [], [], []
    for i in range(0, len(texts), batch_size):
        batch = model.batch(model.encode(list(texts[i : i + batch_size])))
        act = model.read(batch, [site])[site]
        rows, pos, off = locate(batch)
        xs.append(act[rows.to(act.device), pos.to(act.device)].float().cpu())
        offsets.append(off)
        index.append(rows + i)
    return torch.cat(xs), torch.cat(offsets), torch.cat(index)


def fit_token_erasers(
    model: Model, texts: Sequence[str], answers: Sequence[str], locate: SubjectTokens, n_random: int, seed: int
) -> tuple[dict[str, list[tuple[str, TokenErasers]]], dict]:
    """The all-token arms' erasers (module docstring), fitted on the fine-tuning subjects' texts
    alone, site after site with the earlier sites' erasers standing: ``alltoken_leace``,
    ``alltoken_shuffled`` (the answers shuffled among the subjects as :func:`fit_erasers` shuffles
    them) and ``alltoken_random0..`` (random subspaces of LEACE's rank at each site and group). Also
    their statistics: the mean rank of an eraser, the largest leftover cross-covariance of a LEACE
    eraser with the answer on the states it was fitted on, and the number of sites."""
    shuffled = list(answers)
    random.Random(seed).shuffle(shuffled)
    targets = {"leace": list(answers), "shuffled": shuffled}
    sites = token_sites(model)
    ranks: dict[tuple[int, int], int] = {}
    worst, stacks = 0.0, {}
    for arm in ["leace", "shuffled", *(f"random{j}" for j in range(n_random))]:
        m, stack = model, []
        for k, site in enumerate(sites):
            x, off, idx = token_states(m, texts, locate, site)
            group = off.clamp(max=1)
            erasers: TokenErasers = {}
            for g in sorted(set(group.tolist())):
                sel = group == g
                if len({answers[i] for i in idx[sel].tolist()}) < 2:  # one answer among these tokens:
                    continue  # nothing to erase; erasing_tokens gives them the last token's eraser
                if arm in targets:
                    y = [targets[arm][i] for i in idx[sel].tolist()]
                    erasers[g] = fit_leace(x[sel], y)
                    if arm == "leace":
                        ranks[(k, g)] = erasers[g].rank
                        worst = max(worst, leftover(erasers[g], x[sel], y))
                else:
                    draw = int(arm.removeprefix("random"))
                    erasers[g] = random_subspace(x[sel], ranks[(k, g)], seed * 1000 + 100 * draw + 2 * k + g)
            stack.append((site, erasers))
            m = m.intervened(site, erasing_tokens(locate, erasers))  # the next site meets these states
        stacks[f"{ALL_TOKENS}{arm}"] = stack
    stats = {
        "alltoken_sites": len(sites),
        "alltoken_rank": float(np.mean(list(ranks.values()))),
        "alltoken_leftover_covariance": worst,
    }
    return stacks, stats


def erasing_everywhere(model: Model, stack: list[tuple[str, TokenErasers]], locate: SubjectTokens) -> Model:
    """``model`` with an all-token arm's erasers standing at every site of ``stack``."""
    for site, erasers in stack:
        model = model.intervened(site, erasing_tokens(locate, erasers))
    return model


def arm_model(model: Model, s: Setup, arm: str, locate: SubjectEnd | None = None, tokens=None) -> Model:
    """``model`` with ``arm``'s erasers standing (``locate``/``tokens``: the locators for the
    prompts it will meet; default: the setup's, built for the study's template)."""
    if arm == "none":
        return model
    if arm.startswith(ALL_TOKENS):
        return erasing_everywhere(model, s.erasers[arm], tokens or s.tokens)
    return model.intervened(arm_site(model, arm, s.layer), erasing(locate or s.locate, s.erasers[arm]))


def states(model: Model, prompts: Sequence[Prompt], layer: int | str | Sequence[int | str]) -> torch.Tensor:
    """Residual states after ``layer`` (or at a named site, e.g. :data:`BOTTLENECK_SITE`) at each
    prompt's subject's last token, as the model reads the prompt when it answers
    (:meth:`interp.scoring.Scoring.context`: an encoder's masked slot included): ``[n, d_model]``,
    or ``[layer, n, d_model]`` for several layers."""
    many = not isinstance(layer, int | str)
    layers = list(layer) if many else [layer]
    sites = [l if isinstance(l, str) else model.resid_site(l) for l in layers]
    read = [Prompt(model.scoring.context(p.text), p.subject) for p in prompts]
    acts = interp.capture(model, read, sites=sites, positions="subject_last", progress=False)
    out = torch.stack([acts[s].float() for s in sites])
    return out if many else out[0]


def fit_erasers(
    x_finetune: torch.Tensor, answers: Sequence[str], n_random: int, seed: int, prefix: str = ""
) -> dict[str, Eraser]:
    """Erasers fitted on the fine-tuning subjects' states alone (the only states this function
    sees): ``leace`` (the answers), ``shuffled`` (LEACE of the answers shuffled among the subjects:
    the same number of classes, class sizes and whitened geometry, no link to the subject) and
    ``random0..`` (random subspaces of LEACE's rank), each name after ``prefix``. ``seed`` should
    differ between relations."""
    leace = fit_leace(x_finetune, answers)
    shuffled = list(answers)
    random.Random(seed).shuffle(shuffled)
    rank = leace.rank
    return {
        f"{prefix}leace": leace,
        f"{prefix}shuffled": fit_leace(x_finetune, shuffled),
        **{f"{prefix}random{j}": random_subspace(x_finetune, rank, seed * 1000 + j) for j in range(n_random)},
    }


def _kinds(erasers) -> list[str]:
    return list(dict.fromkeys(a.rstrip("0123456789") for a in erasers))


def arm_site(model: Model, arm: str, layer: int) -> str:
    """Where an arm's eraser stands: the input embeddings for a bottleneck arm, else the residual
    stream after ``layer``."""
    return BOTTLENECK_SITE if arm.startswith(BOTTLENECK) else model.resid_site(layer)


def erased_recall(model: Model, s: Setup) -> dict[str, float]:
    """Recall of the original relation on the held-out subjects with each eraser standing on the
    pretrained model (and none): the accuracy of the argmax among the relation's answers, keyed
    ``recall_<arm>`` (random draws averaged into ``recall_random`` / ``recall_bottleneck_random``)."""
    r = s.relation
    prompts = [Prompt(r.template.format(r.subjects[i]), r.subjects[i]) for i in s.design.heldout]
    truth = [r.answers[i] for i in s.design.heldout]
    candidates = sorted(set(r.answers))
    read = [Prompt(model.scoring.context(p.text), p.subject) for p in prompts]
    try:
        locate = SubjectEnd(model.tokenizer, read)
        tokens = SubjectTokens(model.tokenizer, read) if any(a.startswith(ALL_TOKENS) for a in s.erasers) else None
    except ValueError:  # the relation's own template splits oddly at the subject: recall is not measured
        return {f"recall_{k}": float("nan") for k in ("none", *_kinds(s.erasers))}
    texts = [p.text for p in prompts]

    def accuracy(m: Model) -> float:
        pred = m.logprobs(texts, candidates).argmax(-1).tolist()
        return float(np.mean([candidates[j] == t for j, t in zip(pred, truth)]))

    out = {"recall_none": accuracy(model)}
    draws: dict[str, list[float]] = {}
    for arm in s.erasers:
        acc = accuracy(arm_model(model, s, arm, locate, tokens))
        kind = arm.rstrip("0123456789")
        if kind != arm:
            draws.setdefault(kind, []).append(acc)
        else:
            out[f"recall_{arm}"] = acc
    out.update({f"recall_{kind}": float(np.mean(v)) for kind, v in draws.items()})
    return out


@dataclass(frozen=True)
class Setup:
    """What every arm of one relation shares (computed from the model, the relation and the
    configurations)."""

    relation: Relation
    design: Design
    prompts: dict[int, Prompt]
    locate: SubjectEnd
    layer: int
    x_finetune: torch.Tensor
    answers_finetune: list[str]
    erasers: dict  # arm -> Eraser, or an all-token arm's [(site, TokenErasers)]
    row: dict
    tokens: SubjectTokens | None = None  # every subject token (the all-token arms)

    @property
    def finetune_prompts(self) -> list[str]:
        return [self.prompts[i].text for i in self.design.finetune]

    @property
    def finetune_labels(self) -> list[str]:
        return [self.design.mapping[a] for a in self.answers_finetune]

    @property
    def heldout_prompts(self) -> list[str]:
        return [self.prompts[i].text for i in self.design.heldout]

    @property
    def truth(self) -> list[str]:
        return [self.design.mapping[self.relation.answers[i]] for i in self.design.heldout]


def setup(model: Model, r: Relation, labels: dict, study_config, config) -> Setup:
    """The relation's design, layer, states and erasers, and its erasure statistics (module
    docstring). ``study_config``: a StudyConfig; ``config``: an InterventionConfig."""
    c, sc = config, study_config
    seed = relation_seed(c.seed, r.name)
    design = design_for(r, labels, sc, sc.category, sc.label_seeds[0])
    tmpl = sc.finetune.template
    prompts = {i: Prompt(tmpl.format(r.subjects[i]), r.subjects[i]) for i in design.finetune + design.heldout}
    locate = SubjectEnd(model.tokenizer, [Prompt(model.scoring.context(p.text), p.subject) for p in prompts.values()])
    a_ft = [r.answers[i] for i in design.finetune]
    a_ho = [r.answers[i] for i in design.heldout]
    # the layer: the most readable one on the fine-tuning subjects (held-out subjects play no part), before
    # the last block, whose output at the subject reaches no other token
    candidates = list(range(model.n_layers - 1))
    x_all = states(model, [prompts[i] for i in design.finetune], candidates)
    by_layer = [probe_kappa(x.numpy(), a_ft, folds=c.folds, seed=c.seed) for x in x_all]
    layer = candidates[int(np.nanargmax(by_layer))] if np.isfinite(by_layer).any() else candidates[-1]
    x_ft = x_all[layer]
    x_ho = states(model, [prompts[i] for i in design.heldout], layer)
    erasers = fit_erasers(x_ft, a_ft, c.n_random, seed)
    leace = erasers["leace"]
    randoms = [a for a in erasers if a.startswith("random")]
    bottleneck = {}
    if c.bottleneck:
        e_ft = states(model, [prompts[i] for i in design.finetune], BOTTLENECK_SITE)
        e_ho = states(model, [prompts[i] for i in design.heldout], BOTTLENECK_SITE)
        erasers |= fit_erasers(e_ft, a_ft, c.n_random, seed, prefix=BOTTLENECK)
        b = erasers[f"{BOTTLENECK}leace"]
        bottleneck = {
            "bottleneck_rank": b.rank,
            "bottleneck_leftover_covariance": leftover(b, e_ft, a_ft),
            "bottleneck_probe_before_kappa": probe_kappa(e_ft.numpy(), a_ft, folds=c.folds, seed=c.seed),
            "bottleneck_probe_after_kappa": erased_probe_kappa(e_ft.numpy(), a_ft, folds=c.folds, seed=c.seed),
            "bottleneck_transfer_before_kappa": probe_kappa(e_ft.numpy(), a_ft, e_ho.numpy(), a_ho),
            "bottleneck_transfer_after_kappa": probe_kappa(b(e_ft).numpy(), a_ft, b(e_ho).numpy(), a_ho),
            "moved_bottleneck_leace": _moved(e_ft, b),
        }
    tokens, alltoken = None, {}
    if getattr(c, "all_tokens", False):
        read = [Prompt(model.scoring.context(p.text), p.subject) for p in prompts.values()]
        tokens = SubjectTokens(model.tokenizer, read)
        texts = [model.scoring.context(prompts[i].text) for i in design.finetune]
        stacks, alltoken = fit_token_erasers(model, texts, a_ft, tokens, c.n_random, seed)
        erasers |= stacks
        erased = erasing_everywhere(model, stacks[f"{ALL_TOKENS}leace"], tokens)
        t_ft = states(erased, [prompts[i] for i in design.finetune], layer)
        t_ho = states(erased, [prompts[i] for i in design.heldout], layer)
        alltoken["alltoken_transfer_after_kappa"] = probe_kappa(t_ft.numpy(), a_ft, t_ho.numpy(), a_ho)
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
        **bottleneck,
        **alltoken,
    }
    return Setup(r, design, prompts, locate, layer, x_ft, a_ft, erasers, row, tokens)


# one arm: a stage ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class ArmInputs:
    """One fine-tune arm. Keyed by the model, the relation, both configurations, the arm and the
    layer; ``setup`` is computed from those."""

    model: Model
    relation: Relation
    labels: dict
    study_config: object  # StudyConfig
    config: object  # InterventionConfig
    arm: str
    layer: int
    setup: Setup = field(metadata=DERIVED)


@dataclass
class ArmResult:
    """The saved record (``layer``, ``predicted`` held-out labels, the fine-tune's log) and, when
    just computed, the fine-tuned model (the ``none`` arm's is steered)."""

    record: dict
    tuned: Model | None = None


def run_arm(a: ArmInputs) -> ArmResult:
    s, c, sc = a.setup, a.config, a.study_config
    model = arm_model(a.model, s, a.arm)
    tuned, info = finetune(
        model, s.finetune_prompts, s.finetune_labels, s.design.labels, c.method, sc.finetune, seed=sc.finetune_seeds[0]
    )
    scores = tuned.logprobs(s.heldout_prompts, s.design.labels)
    res = {"layer": s.layer, "predicted": [s.design.labels[j] for j in scores.argmax(-1).tolist()], **info}
    if a.arm != "none":  # is the answer still erased in the fine-tuned model? (its earlier blocks moved)
        res["probe_after_tuned_kappa"] = probe_kappa(
            states(tuned, [s.prompts[i] for i in s.design.finetune], s.layer).numpy(),
            s.answers_finetune,
            folds=c.folds,
            seed=c.seed,
        )
        return ArmResult(res)
    return ArmResult(res, tuned)


def _save_arm(result: ArmResult, path) -> None:
    JSON.write(result.record, path)


def _load_arm(path) -> ArmResult:
    return ArmResult(JSON.read(path))


ARM = Stage("erasure arm", run_arm, Codec(_save_arm, _load_arm))


def arm_path(relation: str, arm: str) -> str:
    return f"runs/{relation}__{arm}.json"


# the relation's erasure results ------------------------------------------------------------------
def erasure_rows(s: Setup, records: dict[str, dict], n_boot: int, seed: int) -> tuple[dict, list[dict]]:
    """The relation's row (its erasure statistics, generalization per arm, excess drops with a
    bootstrap CI) and one row per arm, from the arms' saved ``records``."""
    truth = s.truth
    arm_rows = [
        {
            "relation": s.relation.name,
            "arm": arm,
            "kind": arm.rstrip("0123456789"),
            "generalization_kappa": kappa(truth, res["predicted"]),
            "generalization": float(np.mean([p == t for p, t in zip(res["predicted"], truth)])),
            "probe_after_tuned_kappa": res.get("probe_after_tuned_kappa", np.nan),
            "train_accuracy": res["train_accuracy"],
            "steps": res["steps"],
        }
        for arm, res in records.items()
    ]
    preds = {arm: res["predicted"] for arm, res in records.items()}
    k = {arm: kappa(truth, preds[arm]) for arm in preds}
    tuned_probe = {a["arm"]: a["probe_after_tuned_kappa"] for a in arm_rows}
    row = {**s.row, "generalization_none": k["none"]}
    # the layer arms (no prefix: the columns' historical names) and the bottleneck arms
    for prefix in ("", BOTTLENECK, ALL_TOKENS):
        if f"{prefix}leace" not in k:
            continue
        randoms = [a for a in s.erasers if a.startswith(f"{prefix}random")]
        k_random = float(np.mean([k[a] for a in randoms]))
        k_leace = k[f"{prefix}leace"]
        lo, hi = bootstrap_excess(truth, preds[f"{prefix}leace"], [preds[a] for a in randoms], n_boot, seed)
        row |= {
            f"{prefix}probe_after_tuned_kappa": float(tuned_probe[f"{prefix}leace"]),
            f"generalization_{prefix}leace": k_leace,
            f"generalization_{prefix}shuffled": k[f"{prefix}shuffled"],
            f"generalization_{prefix}random": k_random,
            f"generalization_{prefix}random_sd": float(np.std([k[a] for a in randoms])),
            f"drop_{prefix}leace": k["none"] - k_leace,
            f"drop_{prefix}random": k["none"] - k_random,
            f"{prefix}excess_drop": k_random - k_leace,
            f"{prefix}excess_drop_ci_low": lo,
            f"{prefix}excess_drop_ci_high": hi,
            f"{prefix}excess_drop_shuffled": k[f"{prefix}shuffled"] - k_leace,
        }
    return row, arm_rows


def bootstrap_excess(truth, leace, randoms, n_boot: int, seed: int) -> tuple[float, float]:
    """95% bootstrap CI of ``mean_j kappa(random_j) - kappa(leace)``, resampling held-out subjects
    (paired across arms) and the random draws. It does not cover the spread between fine-tuning
    seeds of the LEACE arm; the test across relations (:func:`.report.relations_summary`) does.
    (Its statistic is a kappa, not a mean, so it resamples here rather than through
    :func:`interp.resampling.resampled_means`; the interval is :mod:`interp.resampling`'s.)"""
    rng = np.random.default_rng(seed)
    truth, leace = np.asarray(truth), np.asarray(leace)
    randoms = [np.asarray(x) for x in randoms]
    n, vals = len(truth), []
    for _ in range(n_boot):
        idx = rng.integers(0, n, n)
        draws = rng.integers(0, len(randoms), len(randoms))
        t = list(truth[idx])
        vals.append(np.mean([kappa(t, list(randoms[j][idx])) for j in draws]) - kappa(t, list(leace[idx])))
    return percentile_interval(vals)


def _moved(x: torch.Tensor, eraser: Eraser) -> float:
    return float(((eraser(x) - x) ** 2).sum(1).mean() / ((x - x.mean(0)) ** 2).sum(1).mean())
