"""k-sparse probing: how well do the best k features read an answer, chosen without seeing the test fold?

A dense probe reads every dimension of a site. On SAE features (:mod:`interp.sae_sites`), whose
point is that a few of them carry a concept, the question is how few suffice: the *k-sparse* probe
(Gurnee et al. 2023, *Finding neurons in a haystack*; Gao et al. 2024 and Kantamneni et al. 2025 on
SAE latents) keeps the ``k`` features that differ most between the answers and fits the sweep's
probe on those alone, for ``k`` in 1, 2, 4, 8, 16, 64.

**The ranking** is by mean difference: feature ``j``'s score is its largest one-vs-rest gap

    score_j = max over answers c of | mean(x_j | answer c) - mean(x_j | other answers) |

(for two answers, the gap between their means), highest first, ties to the lower index. It is
computed **on each training fold only**: a ranking computed on all subjects has seen the test
fold's labels, so even a random-label task would find features that separate its test subjects,
and accuracy would be inflated (the same leak as selecting features before cross-validation;
Hastie et al., *Elements of Statistical Learning*, 7.10.2). The **control task** (random answers)
is treated as a task of its own: its features are ranked by its own labels on the same training
folds, so selectivity compares the same procedure, select-then-probe, on real and on random
answers (Hewitt & Liang 2019). :attr:`SparseProbeSweep.ranking_` holds every probe's ranking, so
that this can be checked.

Everything else is :class:`~probes.ProbeSweep`'s: each ``k`` is one sweep whose ``select``
parameter ranks the features of every probe on that probe's training rows (the sweep's own folds,
seeds, probe, control task, metrics and read-out, one definition), so ``folds x seeds`` probes of
``k`` features per relation and site (twice, with the control task), cheap next to one dense probe
on ``d_sae`` features. ``k=None`` adds the dense probe on every feature. One row per (relation,
site, k, fold, seed).

>>> model = interp.attach_sae(interp.load_model("world"), interp.load_sae("path/to/sae"))
>>> table = SparseProbeSweep(ks=(1, 4, 16, None), folds=5).run(model, relations)
>>> table.groupby(["relation", "k"]).accuracy.mean()
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd
import torch

from interp.capture import capture
from interp.models import Model
from interp.relations import Relation
from interp.sae_sites import attached_saes, feature_site

from .sweep import ProbeSweep

#: the k of the k-sparse probes, as in the literature's sweeps
DEFAULT_KS = (1, 2, 4, 8, 16, 64)


def mean_difference_scores(X: np.ndarray | torch.Tensor, y: np.ndarray, n_classes: int | None = None) -> np.ndarray:
    """Each feature's largest one-vs-rest mean difference ``[d]`` over the rows given (pass the
    training rows only). ``X``: ``[n, d]``; ``y``: ``[n]`` class indices."""
    X = np.asarray(X.detach().cpu().double() if isinstance(X, torch.Tensor) else X, dtype=np.float64)
    y = np.asarray(y)
    if X.ndim != 2 or len(X) != len(y):
        raise ValueError(f"X must be [n, d] with one label per row; got X {X.shape} and {len(y)} labels")
    classes = np.unique(y) if n_classes is None else np.arange(n_classes)
    best = np.zeros(X.shape[1])
    for c in classes:
        inside = y == c
        if inside.all() or not inside.any():
            continue  # a class absent from these rows (or alone in them) separates nothing
        best = np.maximum(best, np.abs(X[inside].mean(0) - X[~inside].mean(0)))
    return best


def mean_difference_ranking(X: np.ndarray | torch.Tensor, y: np.ndarray, n_classes: int | None = None) -> np.ndarray:
    """Feature indices by :func:`mean_difference_scores`, highest first (ties: lower index first)."""
    return np.argsort(-mean_difference_scores(X, y, n_classes), kind="stable")


class TopByMeanDifference:
    """A :class:`~probes.ProbeSweep` ``select``: the ``k`` features of highest
    :func:`mean_difference_scores` on the rows it is given (a probe's training rows)."""

    def __init__(self, k: int):
        self.k = k

    def __call__(self, X_train: torch.Tensor, y_train: np.ndarray, n_classes: int) -> np.ndarray:
        return mean_difference_ranking(X_train, y_train, n_classes)[: self.k]


class SparseProbeSweep:
    """A configured k-sparse probe sweep (module docstring); :meth:`run` applies it.

    Parameters
    ----------
    ks : the k of the probes; ``None`` among them adds the dense probe on every feature.
    sites : the sites to probe (default, on a model: the feature site of every SAE attached to it,
        :func:`interp.sae_sites.feature_site`; on stored activations: every stored site).
    **sweep : :class:`~probes.ProbeSweep`'s parameters (folds, seeds, C, control, positions, ...);
        not ``mdl``, ``baselines`` or ``nonlinear``, which read all subjects at once and so cannot
        use per-fold features, nor ``select``, which this sets.

    After :meth:`run`: ``ranking_`` (one row per relation, site, seed, fold, labels ``"task"`` or
    ``"control"`` and rank up to the largest k: the feature ranked there on that probe's training
    rows; the scores are :func:`mean_difference_scores` of those rows) and ``readout_`` (the
    sweeps' read-out, with ``k``; empty with ``readout=False``).
    """

    def __init__(self, ks: Sequence[int | None] = DEFAULT_KS, sites: Sequence[str] | None = None, **sweep):
        self.ks = ks
        self.sites = sites
        self.sweep = sweep

    def run(self, source, relations: Sequence[Relation], model_name: str | None = None) -> pd.DataFrame:
        """Sweep ``relations`` over sites and ``ks``. ``source``: a model handle (the sites are
        captured) or a mapping ``relation name -> {site: [n_samples, d] tensor}``, as for
        :meth:`ProbeSweep.run <probes.ProbeSweep.run>`. One row per (relation, site, k, fold, seed)
        with ProbeSweep's columns, ``k`` (the features read; all of them for ``None``) and
        ``selection`` (``"mean_difference"`` or ``"all"``)."""
        ks = self._checked_ks()
        for key in ("mdl", "baselines", "nonlinear", "select"):
            if self.sweep.get(key):
                raise ValueError(
                    f"{key} is not a setting of a k-sparse sweep: "
                    + ("it chooses the features itself" if key == "select" else f"{key} reads all subjects at once")
                    + ", so it cannot use features chosen per fold"
                )
        template = ProbeSweep(**self.sweep)  # checks the sweep's own parameters
        if not relations:
            raise ValueError("no relations to sweep")
        if isinstance(source, Model):
            sites = self._model_sites(source)
            self._check_widths({s: source.site_width(s) for s in sites}, ks)
            model_name = model_name or source.name
            stored = {}
            for r in relations:
                acts = capture(
                    source,
                    r.prompts(),
                    sites=sites,
                    positions=template.positions,
                    batch_size=template.batch_size,
                    progress=False,
                )
                stored[r.name] = {s: acts[s] for s in sites}
        else:
            stored, model_name = source, model_name or "stored"
            missing = [r.name for r in relations if r.name not in stored]
            if missing:
                raise KeyError(f"no stored activations for relations {missing}; have {sorted(stored)}")
            sites = list(self.sites or stored[relations[0].name].keys())
            self._check_widths({s: _stored_width(stored, relations, s) for s in sites}, ks)
        stored = {r.name: {s: _as_rows(stored[r.name][s], r, s) for s in sites} for r in relations}
        widths = {s: stored[relations[0].name][s].shape[-1] for s in sites}
        self._check_widths(widths, ks)  # those unknown before

        rows, readout = [], []
        largest = max((k for k in ks if k is not None), default=None)
        self.ranking_ = pd.DataFrame()
        for k in ks:
            select = None if k is None else TopByMeanDifference(k)
            sweep = ProbeSweep(**{**self.sweep, "sites": sites, "select": select})
            table = sweep.run(stored, relations, model_name)
            labels = {"selection": "all" if k is None else "mean_difference"}
            rows.append(table.assign(k=table["site"].map(widths) if k is None else k, **labels))
            if not sweep.readout_.empty:
                read = sweep.readout_
                readout.append(read.assign(k=read["site"].map(widths) if k is None else k, **labels))
            if k is not None and k == largest:
                self.ranking_ = sweep.selected_
        self.readout_ = pd.concat(readout, ignore_index=True) if readout else pd.DataFrame()
        table = pd.concat(rows, ignore_index=True)
        first = ["model", "relation", "site", "layer", "k", "selection", "fold", "seed"]
        return table[first + [c for c in table.columns if c not in first]]

    # ------------------------------------------------------------------------------------------
    def _checked_ks(self) -> list[int | None]:
        ks = list(self.ks)
        bad = [
            k for k in ks if k is not None and (not isinstance(k, (int, np.integer)) or isinstance(k, bool) or k < 1)
        ]
        if not ks or bad:
            raise ValueError(f"ks must be positive ints (None: every feature); got {self.ks!r}")
        if len(set(ks)) != len(ks):
            raise ValueError(f"ks lists a k twice: {self.ks!r}")
        return [None if k is None else int(k) for k in ks]

    def _model_sites(self, model: Model) -> list[str]:
        sites = list(self.sites or [feature_site(s) for s in attached_saes(model)])
        if not sites:
            raise ValueError(
                f"{model.name!r} has no SAE attached (interp.attach_sae) and no sites were given: name the sites "
                "to probe, SparseProbeSweep(sites=[...])"
            )
        return model.check_sites(sites)

    @staticmethod
    def _check_widths(widths: Mapping[str, int | None], ks: list[int | None]) -> None:
        largest = max((k for k in ks if k is not None), default=0)
        narrow = {s: w for s, w in widths.items() if w is not None and w < largest}
        if narrow:
            raise ValueError(
                f"k={largest} is more features than the sites {narrow} have (site: width); drop the larger ks "
                "or probe wider sites"
            )


def _stored_width(stored, relations, site: str) -> int:
    first = stored[relations[0].name]
    if site not in first:
        raise KeyError(f"relation {relations[0].name!r} has no stored activations at {site!r}; have {sorted(first)}")
    return int(np.prod(first[site].shape[1:]))  # a per-head site's heads side by side, as _as_rows reads them


def _as_rows(x, relation: Relation, site: str) -> torch.Tensor:
    """Stored activations as a ``[n_samples, d]`` tensor (a per-head site's heads side by side), one
    row per sample of the relation."""
    x = x if isinstance(x, torch.Tensor) else torch.as_tensor(np.asarray(x))
    if x.dim() < 2 or x.shape[0] != len(relation):
        raise ValueError(
            f"relation {relation.name!r} at {site!r}: a k-sparse probe reads [n_samples={len(relation)}, ...] "
            f"activations at one position per sample, got shape {tuple(x.shape)}"
        )
    return x.reshape(len(relation), -1)
