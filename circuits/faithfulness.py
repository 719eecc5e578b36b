"""Circuit faithfulness: how much of the model's behaviour a circuit of each size keeps.

A method that scores edges (path patching, EAP, EAP-IG) or nodes (activation patching, AtP)
implies a family of circuits: the top ``k`` items by score. Following the Mechanistic
Interpretability Benchmark (MIB; Mueller et al. 2025), each circuit ``C`` is run with every
edge outside it patched (:class:`~circuits.EdgePatching`: ``counterfactual``, the sender's value
on the pair's corrupted input, or ``mean``, its mean over the clean inputs), and scored by

    f(C) = (m(C) - m(empty)) / (m(full) - m(empty))

with ``m`` the metric averaged over pairs, ``full`` the unpatched model and ``empty`` every edge
patched (for counterfactual ablation: the corrupted run). Sweeping the size over MIB's grid of
fractions of all items (0.1%, 0.2%, 0.5%, 1%, 2%, 5%, 10%, 20%, 50%, 100%; ``k = floor(p * N)``
as in MIB's code) gives the faithfulness curve, and two areas under it (trapezoids over the
fraction of items actually kept, from the empty circuit at 0 to the full model at 1, linear
axis by default, so CPR + CMD = 1 whenever f stays within [0, 1]):

- **CPR**, circuit performance ratio: the area under ``f`` (higher is better; a circuit that
  over-performs the model can exceed the area of ``f = 1``);
- **CMD**, circuit-model distance: the area between ``f`` and 1 (0 is best).

Items are ranked by ``|score|`` (MIB's default; ``absolute=False`` ranks by signed score, and
then the sign convention of the scores matters). Ties, and items the scores do not mention
(refused unless ``allow_unscored=True``), are ordered by a seeded random permutation, never by
the graph's order; ``summary_`` counts both. Node circuits (``level="node"``) patch every edge
out of a node outside the circuit, i.e. replace the node's output.

**The random baseline is part of the result**: ``n_random`` random orderings of the same items
give the curve and areas a method must beat; ``summary_`` reports each method's CPR and CMD
with a bootstrap interval over pairs, the random circuits' mean and spread, the excess of the
method's CPR over the random mean with a bootstrap interval over pairs (``excess_cpr``,
``excess_low``, ``excess_high``: the pairs' sampling noise, which the next number ignores), and
the fraction of random circuits at least as good on these pairs (``p_random_cpr``, with the +1
correction, so it cannot go below ``1 / (n_random + 1)``: the default 99 allows 0.01).

    >>> fa = Faithfulness(model, "logit_diff", n_random=20)
    >>> curve = fa.run(pairs, {"EAP-IG": eap_ig_edges, "EAP": eap_edges})
    >>> fa.summary_        # method, cpr, cmd, cpr_low, cpr_high, random_cpr_mean, p_random_cpr, ...
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd
import torch

from interp.resampling import bootstrap_indices, monte_carlo_p, percentile_interval, resampled_means

from .edge_patching import EdgePatching
from .pairs import Pairs
from .runs import metric_of
from .statistics import generator

MIB_FRACTIONS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)
LEVELS = ("edge", "node")


class Faithfulness:
    """Faithfulness curves, CPR and CMD of score-ranked circuits against random circuits.

    Parameters
    ----------
    model : interp.Model
    metric : name, Metric or function (see :mod:`circuits.metrics`)
    level : ``"edge"`` (rank edges; scores need ``sender`` and ``receiver`` columns) or
        ``"node"`` (rank nodes; scores need a ``node`` column, e.g. ``AttributionPatching.nodes``)
    ablation : ``"counterfactual"`` or ``"mean"`` (see :class:`~circuits.EdgePatching`)
    fractions : circuit sizes as fractions of all items (default: MIB's grid)
    n_random : random orderings for the baseline
    absolute : rank by ``|score|`` (MIB) rather than by signed score
    allow_unscored : rank items the scores leave out last (in random order) instead of refusing
    log_x : areas over ``log(fraction)`` instead of the fraction (points with no item dropped)
    n_boot : bootstrap resamples of pairs for the CPR/CMD intervals
    senders, receivers : restrict the graph (default: the whole model)
    """

    def __init__(
        self,
        model,
        metric="logit_diff",
        level: str = "edge",
        ablation: str = "counterfactual",
        fractions: Sequence[float] = MIB_FRACTIONS,
        n_random: int = 99,
        absolute: bool = True,
        allow_unscored: bool = False,
        log_x: bool = False,
        n_boot: int = 1000,
        seed: int = 0,
        senders: Sequence | None = None,
        receivers: Sequence | None = None,
        batch_size: int = 512,
        progress: bool | None = None,
    ):
        self.model = model
        self.metric = metric
        self.level = level
        self.ablation = ablation
        self.fractions = fractions
        self.n_random = n_random
        self.absolute = absolute
        self.allow_unscored = allow_unscored
        self.log_x = log_x
        self.n_boot = n_boot
        self.seed = seed
        self.senders = senders
        self.receivers = receivers
        self.batch_size = batch_size
        self.progress = progress

    def _validate(self) -> None:
        if self.level not in LEVELS:
            raise ValueError(f"level must be one of {LEVELS}, got {self.level!r}")
        fr = [float(f) for f in self.fractions]
        if not fr or any(not 0 < f <= 1 for f in fr) or fr != sorted(fr):
            raise ValueError(f"fractions must be increasing and in (0, 1], got {list(self.fractions)}")
        if self.n_random < 0 or self.n_boot < 1:
            raise ValueError(f"n_random must be >= 0 and n_boot >= 1, got {self.n_random} and {self.n_boot}")
        self.fractions_ = fr
        self.engine_ = EdgePatching(
            self.model,
            self.metric,
            senders=self.senders,
            receivers=self.receivers,
            ablation=self.ablation,
            batch_size=self.batch_size,
            progress=self.progress,
        )
        self.edges_ = self.engine_.edges()
        self.items_ = (
            list(zip(self.edges_.sender, self.edges_.receiver))
            if self.level == "edge"
            else [s.name for s in self.engine_.senders_]
        )

    # ------------------------------------------------------------------------------------------
    def ranking(self, scores: pd.DataFrame, name: str = "scores") -> tuple[np.ndarray, int, int]:
        """Item indices from most to least important (ties and unscored items in a seeded random
        order), how many items the scores left out, and how many share their score with another."""
        if self.level == "edge":
            need = ["sender", "receiver", "score"]
            keys = list(zip(scores.get("sender", []), scores.get("receiver", [])))
        else:
            need = ["node", "score"]
            keys = list(scores.get("node", []))
        missing = [c for c in need if c not in scores.columns]
        if missing:
            hint = (
                "edge scores come from AttributionPatching.edges or PathPatching.run"
                if self.level == "edge"
                else "node scores come from AttributionPatching.nodes (by_position=False)"
            )
            raise ValueError(f"{self.level}-level faithfulness needs columns {need}; missing {missing} ({hint})")
        if scores.duplicated(need[:-1]).any():
            raise ValueError(
                f"scores have several rows per {self.level}: one score per {self.level} "
                "(e.g. by_position=False, one receiver input per row)"
            )
        value = dict(zip(keys, scores["score"].astype(float)))
        known = set(self.items_)
        extra = [k for k in value if k not in known]
        if extra:
            raise ValueError(f"{len(extra)} scored {self.level}s are not in this model's graph, e.g. {extra[0]!r}")
        s = np.array([value.get(item, np.nan) for item in self.items_], dtype=float)
        unscored = int(np.isnan(s).sum())
        if unscored and not self.allow_unscored:
            example = self.items_[int(np.flatnonzero(np.isnan(s))[0])]
            raise ValueError(
                f"{name!r} scores {len(s) - unscored} of the graph's {len(s)} {self.level}s (e.g. not "
                f"{example!r}); score them all (e.g. AttributionPatching(...).edges with the default "
                "receivers), restrict the graph (senders=, receivers=), or pass allow_unscored=True to "
                "rank the rest last in random order"
            )
        key = np.abs(s) if self.absolute else s
        key = np.where(np.isnan(key), -np.inf, key)
        shuffle = torch.randperm(len(s), generator=generator(self.seed, "ties", name)).numpy()
        order = shuffle[np.argsort(-key[shuffle], kind="stable")]  # ties: a seeded random order
        finite = key[np.isfinite(key)]
        tied = int(len(finite) - len(np.unique(finite)))
        return order, unscored, tied

    def _mask(self, kept: np.ndarray) -> torch.Tensor:
        """Edges to patch (1) for a circuit given as kept item indices."""
        if self.level == "edge":
            m = torch.ones(len(self.items_))
            m[torch.as_tensor(kept, dtype=torch.long)] = 0.0
            return m
        keep_nodes = {self.items_[i] for i in kept}
        return torch.tensor([0.0 if s in keep_nodes else 1.0 for s in self.edges_.sender])

    def _sizes(self) -> list[int]:
        n = len(self.items_)
        return [int(math.floor(f * n + 1e-9)) for f in self.fractions_]

    # ------------------------------------------------------------------------------------------
    def run(self, pairs: Pairs, scores: pd.DataFrame | Mapping[str, pd.DataFrame]) -> pd.DataFrame:
        """The faithfulness curve of each method's ranking and of ``n_random`` random rankings.

        Returns one row per (method, draw, size): ``method, draw, fraction, n_items, score,
        faithfulness`` (``draw`` is NaN for methods); ``summary_`` holds the areas."""
        self._validate()
        methods = dict(scores) if isinstance(scores, Mapping) else {"scores": scores}
        if not methods:
            raise ValueError("no scores given")
        if "random" in methods:
            raise ValueError("'random' names the baseline; call the method something else")
        orders = {name: self.ranking(df, name) for name, df in methods.items()}
        n_items = len(self.items_)
        gen = generator(self.seed, "faithfulness", self.level)
        randoms = [torch.randperm(n_items, generator=gen).numpy() for _ in range(self.n_random)]
        sizes = self._sizes()
        curves = [(name, None, order) for name, (order, _, _) in orders.items()]
        curves += [("random", r, order) for r, order in enumerate(randoms)]
        masks: list[torch.Tensor] = [torch.zeros(len(self.edges_)), torch.ones(len(self.edges_))]  # full, empty
        index: dict[bytes, int] = {masks[0].numpy().tobytes(): 0, masks[1].numpy().tobytes(): 1}
        rows = []
        for name, draw, order in curves:
            for frac, k in zip(self.fractions_, sizes):
                m = self._mask(order[:k])
                key = m.numpy().tobytes()
                if key not in index:
                    index[key] = len(masks)
                    masks.append(m)
                rows.append({"method": name, "draw": draw, "fraction": frac, "n_items": k, "mask": index[key]})
        per_pair = self.engine_.evaluate(pairs, torch.stack(masks))  # [masks, n]
        self.per_pair_ = per_pair
        means = per_pair.double().mean(-1).numpy()
        full, empty = means[0], means[1]
        if abs(full - empty) < 1e-6 * max(1.0, abs(full)):
            raise ValueError(
                f"the full model and the empty circuit score the same ({full:.4g}): faithfulness is "
                "undefined; choose pairs whose clean and corrupted runs differ on this metric"
            )
        self._check_empty(pairs, empty)
        curve = pd.DataFrame(rows)
        curve["score"] = means[curve["mask"].to_numpy()]
        curve["faithfulness"] = (curve["score"] - empty) / (full - empty) if full != empty else np.nan
        curve["draw"] = curve["draw"].astype("Int64")
        curve.attrs.update(
            full_score=float(full),
            empty_score=float(empty),
            level=self.level,
            ablation=self.ablation,
            n_items=n_items,
            n_edges=len(self.edges_),
            n_pairs=len(pairs),
            log_x=self.log_x,
        )
        self.summary_ = self._summary(curve, per_pair)
        self.summary_["n_unscored"] = [orders[m][1] for m in self.summary_.method]
        self.summary_["n_tied"] = [orders[m][2] for m in self.summary_.method]
        return curve.drop(columns="mask")

    def _check_empty(self, pairs: Pairs, empty: float) -> None:
        """With counterfactual ablation the empty circuit is the corrupted run: if it is not, the
        model's first layer reads more than the embedding writes (scaled embeddings, an encoder's
        token types...) and edge patching does not describe it."""
        if self.ablation != "counterfactual":
            return
        corrupted = sum(
            float(metric_of(self.model, part.corrupted, part, self.engine_.metric_).double().sum())
            for part in pairs.batches(self.batch_size)
        ) / len(pairs)
        if abs(corrupted - empty) > 1e-3 * max(1.0, abs(corrupted)):
            raise ValueError(
                f"with every edge patched the model scores {empty:.4g}, but the corrupted run scores "
                f"{corrupted:.4g}: this architecture's residual stream is not the sum of the writes edge "
                "patching knows (embeddings, heads, MLPs); its faithfulness numbers would be wrong"
            )

    # ------------------------------------------------------------------------------------------
    def _area_rows(self, curve: pd.DataFrame, f_of_mask: np.ndarray) -> pd.DataFrame:
        """CPR and CMD of every (method, draw) for faithfulness values per mask ``[..., masks]``;
        on a linear axis the curve starts at the empty circuit (0 items, mask 1, f = 0)."""
        out = []
        for (name, draw), g in curve.groupby(["method", "draw"], dropna=False, sort=False):
            x = g["n_items"].to_numpy() / len(self.items_)
            idx = g["mask"].to_numpy()
            if not self.log_x and x[0] > 0:
                x, idx = np.r_[0.0, x], np.r_[1, idx]
            cpr, cmd = areas(x, f_of_mask[..., idx], self.log_x)
            out.append({"method": name, "draw": draw, "cpr": cpr, "cmd": cmd})
        return pd.DataFrame(out)

    def _summary(self, curve: pd.DataFrame, per_pair: torch.Tensor) -> pd.DataFrame:
        x = per_pair.double().numpy()  # [masks, n]
        n = x.shape[1]

        def faith(means):
            return (means - means[..., 1:2]) / (means[..., 0:1] - means[..., 1:2])

        point = self._area_rows(curve, faith(x.mean(-1)))
        rng = np.random.default_rng(self.seed)
        boot = faith(resampled_means(x, bootstrap_indices(rng, n, self.n_boot)).T)  # [B, masks]
        boot_areas = self._area_rows(curve, boot)
        methods = point[point.method != "random"]
        rand = point[point.method == "random"]
        rows = []
        for _, row in methods.iterrows():
            b = boot_areas[(boot_areas.method == row.method)].iloc[0]
            entry = {
                "method": row.method,
                "cpr": float(row.cpr),
                "cmd": float(row.cmd),
            }
            entry["cpr_low"], entry["cpr_high"] = percentile_interval(b.cpr)
            entry["cmd_low"], entry["cmd_high"] = percentile_interval(b.cmd)
            if len(rand):
                r_cpr, r_cmd = rand.cpr.to_numpy(float), rand.cmd.to_numpy(float)
                boot_rand = np.stack(boot_areas[boot_areas.method == "random"].cpr.to_list()).mean(0)  # [B]
                excess = np.asarray(b.cpr) - boot_rand
                entry["excess_cpr"] = float(row.cpr - r_cpr.mean())
                entry["excess_low"], entry["excess_high"] = percentile_interval(excess)
                entry.update(
                    random_cpr_mean=float(r_cpr.mean()),
                    random_cpr_sd=float(r_cpr.std(ddof=1)) if len(rand) > 1 else np.nan,
                    random_cmd_mean=float(r_cmd.mean()),
                    random_cmd_sd=float(r_cmd.std(ddof=1)) if len(rand) > 1 else np.nan,
                    p_random_cpr=monte_carlo_p(r_cpr, row.cpr, "greater", tolerance=0.0),
                    p_random_cmd=monte_carlo_p(r_cmd, row.cmd, "less", tolerance=0.0),
                )
            rows.append(entry)
        out = pd.DataFrame(rows)
        out.attrs.update(n_random=len(rand), n_boot=self.n_boot, level=self.level, ablation=self.ablation)
        return out


def areas(x: np.ndarray, f: np.ndarray, log_x: bool = False) -> tuple:
    """CPR and CMD: trapezoid areas under ``f`` and between ``f`` and 1 over ``x`` (the last axis of
    ``f`` runs along ``x``; leading axes, e.g. bootstrap draws, are kept)."""
    x = np.asarray(x, dtype=float)
    f = np.asarray(f, dtype=float)
    if log_x:
        keep = x > 0
        x, f = np.log(x[keep]), f[..., keep]
    dx = np.diff(x)
    cpr = ((f[..., 1:] + f[..., :-1]) / 2 * dx).sum(-1)
    gap = np.abs(1 - f)
    cmd = ((gap[..., 1:] + gap[..., :-1]) / 2 * dx).sum(-1)
    return cpr, cmd
