"""Probe sweeps: how linearly readable is each relation's answer, at every site?

For each relation and site, a multinomial logistic probe (:class:`~probes.LinearProbe`'s
objective) is trained from the subject's hidden state to the answer, with stratified k-fold
cross-validation over subjects, for one or more seeds (each seed reshuffles the folds). All
probes of a sweep (relations x sites x folds x seeds, plus controls) are fitted together by
the batched solver of :mod:`probes.logistic`.

**Control task** (Hewitt & Liang 2019): the same subjects with their answers randomly
reassigned (a seeded permutation, so class sizes are kept), probed with the same folds.
*Selectivity* = accuracy - control accuracy: how much of the accuracy reflects the relation
rather than the probe's capacity to memorize arbitrary labels.

**Rare answers** (documented rule, never silent): an answer held by fewer subjects than there
are folds cannot appear in every fold; its subjects are removed from that relation's sweep
before splitting, and every row reports ``dropped_classes`` and ``dropped_subjects``. A relation
left with fewer than 2 answers, or with fewer subjects than folds, raises an error. A subject
listed twice in a relation is kept once (its first answer), so folds split by subject.

Result: one row per (model, relation, site, fold, seed) with ``accuracy``, ``top_k_accuracy``,
``log_loss``, ``balanced_accuracy`` and ``auroc`` (macro one-vs-rest; scikit-learn's definitions,
on the fold's held-out subjects), ``chance`` (1 / number of answers), ``n_train``, ``n_test``, ``n_classes``,
``control_accuracy`` and ``selectivity``, and with ``mdl=True`` the online codelength
(``mdl_bits``, ``uniform_bits``, ``compression``; Voita & Titov 2020). :attr:`ProbeSweep.readout_` holds,
for every subject, the probe's ranked answers from the fold in which that subject was held out.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch
from scipy.stats import rankdata
from sklearn.model_selection import StratifiedKFold

from interp.capture import capture
from interp.models import Model
from interp.progress import progress_bar
from interp.relations import Relation, RelationError
from interp.sites import parse_site

from .baselines import probe_baselines, with_baselines
from .logistic import fit_logistic
from .mdl import online_codelength
from .nonlinear import NONLINEAR, fit_mlp, knn_predict


@dataclass
class _Prepared:
    relation: Relation
    keep: np.ndarray  # indices of kept samples
    classes: list[str]
    y: np.ndarray  # [n_kept] class indices
    folds: list[list[np.ndarray]]  # per seed: fold id per kept sample
    control: list[np.ndarray]  # per seed: permuted labels
    dropped_classes: int
    dropped_subjects: int


class ProbeSweep:
    """A configured probe sweep; :meth:`run` applies it to a model or to stored activations.

    Parameters
    ----------
    sites : site names (default: ``blocks.{l}.hook_resid_post`` for every layer).
    folds : k of the stratified k-fold split. seeds : one split (and control labelling) each.
    C : inverse L2 strength, as in scikit-learn. control : also fit the control task.
    standardize : standardize features with each training fold's mean and standard deviation
        (default; the probe is then ``StandardScaler() + LogisticRegression(C)``). Hidden states
        have large, uneven scales; without it the optimum is ill-conditioned and slow to reach.
    top_k : k of ``top_k_accuracy`` and of the read-out's ranked answers.
    readout_k : length of the read-out's rankings, if not ``top_k`` (``None``: ``top_k``; a large
        number ranks every answer).
    positions : where to read the subject (when capturing from a model).
    device, dtype : where and in what precision the probes are fitted.
    readout : keep every test subject's ranked answers in ``readout_`` (one row per subject, site
        and fold; turn off for very large sweeps, whose read-out would outgrow the features).
    mdl : also measure each relation and site's online codelength (:mod:`probes.mdl`: columns
        ``mdl_bits``, ``uniform_bits``, ``compression``; one fit per block, on all subjects).
    sites_per_pass : with stored activations, load and fit this many sites at a time (default:
        all). With :class:`~interp.ActivationStore` values, whose shards are memory-mapped, peak
        memory is then one pass's features however large the store: out-of-core sweeps.
    nonlinear : also read every task with nonlinear probes on the same states and folds
        (:mod:`probes.nonlinear`: ``"mlp"``, ``"knn"``), adding ``mlp_accuracy`` / ``knn_accuracy``
        to every row and ``mlp_predicted`` / ``knn_predicted`` to the read-out (from which
        :func:`probes.readability_by_layer` takes ``mlp_kappa`` / ``knn_kappa``). ``knn_k``: the
        neighbours kNN votes with.
    baselines : also probe the model's input embeddings and the same architecture with random
        weights (``baseline_seeds``), with the same probe, folds and seeds
        (:mod:`probes.baselines`), and add ``kappa``, ``embedding_kappa``, ``random_kappa``,
        ``baseline_kappa`` and ``kappa_above_baseline`` to every row; the long table is
        ``baselines_``. Needs a model (not stored activations) and ``readout``.
    select : feature selection inside the cross-validation: ``select(X_train, y_train, n_classes)``
        returns the indices of the features a probe reads (best first), and is called for every
        probe (relation, site, seed, fold, and the control task with its own labels) with that
        probe's training rows only (``X_train`` ``[n_train, d]``, ``y_train`` its class indices), so
        the held-out fold never informs the choice. Each probe is then fitted and scored on its own
        features, with the same folds, seeds, metrics and read-out; the choices are ``selected_``
        (one row per probe and rank). :class:`probes.SparseProbeSweep` selects by mean difference.
        Not with ``mdl``, ``baselines`` or ``nonlinear``, which read every probe's features at once.
    """

    def __init__(
        self,
        sites: Sequence[str] | None = None,
        folds: int = 5,
        seeds: Sequence[int] = (0,),
        C: float = 1.0,
        control: bool = True,
        top_k: int = 5,
        positions="subject_last",
        batch_size: int = 64,
        device: str = "cpu",
        dtype: torch.dtype = torch.float32,
        tol: float = 1e-4,
        max_iter: int = 1000,
        max_elements: int = 40_000_000,
        standardize: bool = True,
        sites_per_pass: int | None = None,
        readout: bool = True,
        progress: bool | None = None,
        readout_k: int | None = None,
        mdl: bool = False,
        baselines: bool = False,
        baseline_seeds: Sequence[int] = (0, 1, 2),
        nonlinear: Sequence[str] = (),
        knn_k: int = 10,
        select: Callable[[torch.Tensor, np.ndarray, int], Sequence[int]] | None = None,
    ):
        unknown = [n for n in nonlinear if n not in NONLINEAR]
        if unknown:
            raise ValueError(f"nonlinear probes {unknown} are not known; choose from {NONLINEAR}")
        if knn_k < 1:
            raise ValueError(f"knn_k must be at least 1, got {knn_k}")
        if select is not None:
            for name, on in (("mdl", mdl), ("baselines", baselines), ("nonlinear", bool(nonlinear))):
                if on:
                    raise ValueError(
                        f"{name} cannot be combined with select: {name} reads all subjects at once, so it cannot use "
                        "features chosen per fold; run it in a sweep of its own"
                    )
        self.select = select
        self.nonlinear = tuple(nonlinear)
        self.knn_k = knn_k
        self.mdl = mdl
        self.baselines = baselines
        self.baseline_seeds = tuple(baseline_seeds)
        self.readout = readout
        self.readout_k = readout_k
        self.sites = sites
        self.sites_per_pass = sites_per_pass
        self.folds = folds
        self.seeds = seeds
        self.C = C
        self.control = control
        self.top_k = top_k
        self.positions = positions
        self.batch_size = batch_size
        self.device = device
        self.dtype = dtype
        self.tol = tol
        self.max_iter = max_iter
        self.max_elements = max_elements
        self.standardize = standardize
        self.progress = progress

    # ------------------------------------------------------------------------------------------
    def run(self, source, relations: Sequence[Relation], model_name: str | None = None) -> pd.DataFrame:
        """Sweep ``relations`` over sites. ``source``: a :class:`~interp.Model` (activations are
        captured) or a mapping ``relation name -> {site: [n_samples, d] tensor}`` (stored
        activations, rows in the relation's sample order)."""
        if self.folds < 2:
            raise ValueError(f"folds must be at least 2, got {self.folds}")
        if not relations:
            raise ValueError("no relations to sweep")
        if self.baselines and not isinstance(source, Model):
            raise ValueError("baselines=True needs a model to rebuild with random weights, not stored activations")
        if self.baselines and not self.readout:
            raise ValueError("baselines=True compares pooled kappas from the read-out: keep readout=True")
        prepared = [self._prepare(r) for r in relations]
        self._selected: list[dict] = []
        if isinstance(source, Model):
            sites = list(self.sites or [source.resid_site(l) for l in range(source.n_layers)])
            source.check_sites(sites)
            model_name = model_name or source.name
            features = {}
            for p in progress_bar(
                prepared, desc="capture relations", unit="relations", progress=self.progress, threshold=1
            ):
                every = p.relation.prompts()  # built once per relation (was once per subject)
                prompts = [every[i] for i in p.keep]
                acts = capture(
                    source, prompts, sites=sites, positions=self.positions, batch_size=self.batch_size, progress=False
                )
                features[p.relation.name] = {s: acts[s] for s in sites}
        else:
            return self._run_stored(source, prepared, model_name or "stored")
        self._check_finite(features)
        rows, readout = self._fit_all(prepared, features, model_name)
        self.readout_ = pd.DataFrame(readout)
        self.selected_ = pd.DataFrame(self._selected)
        if self.baselines:
            self.baselines_ = self.baseline_table(source, relations)
            return with_baselines(pd.DataFrame(rows), self.readout_, self.baselines_)
        return pd.DataFrame(rows)

    def baseline_table(self, model: Model, relations: Sequence[Relation]) -> pd.DataFrame:
        """The baselines alone (:func:`probes.baselines.probe_baselines`), with this sweep's probe,
        folds, seeds and positions: one row per (relation, baseline, seed, site) with its kappa
        (``baseline_seeds``: the random-weight models)."""
        if not isinstance(model, Model):
            raise ValueError("baselines need a model to rebuild with random weights, not stored activations")
        run, seeds = self._baseline_run, self.baseline_seeds
        return probe_baselines(run, model, relations, self.positions, seeds, self.batch_size)

    def _baseline_run(self, source, relations, model_name):
        """This sweep's probe, folds and seeds on a baseline's states (no control, MDL or baselines
        of its own): its table and read-out."""
        child = copy.copy(self)
        child.baselines, child.control, child.mdl, child.readout, child.progress = False, False, False, True, False
        child.nonlinear = ()
        child.sites = self.sites if isinstance(source, Model) else None
        return child.run(source, relations, model_name), child.readout_

    def _run_stored(self, source, prepared, model_name: str) -> pd.DataFrame:
        """Stored activations, ``sites_per_pass`` sites at a time: with :class:`~interp.ActivationStore`
        values (memory-mapped shards) only those sites' rows are ever in memory."""
        for p in prepared:
            if p.relation.name not in source:
                raise KeyError(f"no stored activations for relation {p.relation.name!r}; have {sorted(source)}")
        first = source[prepared[0].relation.name]
        sites = list(self.sites or list(first.keys()))
        step = self.sites_per_pass or len(sites)
        rows, readout = [], []
        for i in range(0, len(sites), step):
            features = {p.relation.name: {s: self._stored(source, p, s) for s in sites[i : i + step]} for p in prepared}
            self._check_finite(features)
            r, o = self._fit_all(prepared, features, model_name)
            rows += r
            readout += o
            del features
        self.readout_ = pd.DataFrame(readout)
        self.selected_ = pd.DataFrame(self._selected)
        return pd.DataFrame(rows)

    @staticmethod
    def _stored(source, p, site: str) -> torch.Tensor:
        stored = source[p.relation.name]
        if site not in stored:
            raise KeyError(
                f"relation {p.relation.name!r} has no stored activations at {site!r}; have {sorted(stored.keys())}"
            )
        x = stored[site]
        x = x if isinstance(x, torch.Tensor) else torch.as_tensor(np.asarray(x))
        if x.shape[0] != len(p.relation):
            raise ValueError(
                f"relation {p.relation.name!r}: {x.shape[0]} rows of activations at {site!r} but "
                f"{len(p.relation)} samples; rows must follow the relation's samples one to one"
            )
        return x[torch.as_tensor(p.keep)]

    @staticmethod
    def _check_finite(features) -> None:
        for name, feats in features.items():
            for s, x in feats.items():
                if not torch.isfinite(x.float()).all():
                    raise ValueError(
                        f"activations of relation {name!r} at {s!r} contain NaN or inf; "
                        "check the capture (dtype overflow?)"
                    )

    # ------------------------------------------------------------------------------------------
    def _prepare(self, relation: Relation) -> _Prepared:
        answers = np.asarray(relation.answers, dtype=object)
        first, seen = [], set()
        for i, subject in enumerate(relation.subjects):  # one sample per subject
            if subject not in seen:
                seen.add(subject)
                first.append(i)
        values, counts = np.unique(answers[first], return_counts=True)
        rare = set(values[counts < self.folds])
        keep = np.array([i for i in first if answers[i] not in rare], dtype=int)
        classes = sorted(set(answers[keep])) if len(keep) else []
        if len(keep) < self.folds:
            raise RelationError(
                f"relation {relation.name!r} has {len(keep)} usable subjects, fewer than folds={self.folds}; "
                "lower folds or add subjects"
            )
        if len(classes) < 2:
            raise RelationError(
                f"relation {relation.name!r} has fewer than 2 answers with at least folds={self.folds} subjects "
                f"(answers: {dict(zip(values, counts))}); a probe needs 2 classes. Lower folds or drop the relation."
            )
        index = {c: i for i, c in enumerate(classes)}
        y = np.array([index[a] for a in answers[keep]])
        folds, control = [], []
        for seed in self.seeds:
            split = StratifiedKFold(n_splits=self.folds, shuffle=True, random_state=seed)
            fold_of = np.empty(len(y), dtype=int)
            for f, (_, test) in enumerate(split.split(np.zeros(len(y)), y)):
                fold_of[test] = f
            folds.append(fold_of)
            control.append(np.random.default_rng(10_000 + seed).permutation(y))
        return _Prepared(relation, keep, classes, y, folds, control, len(rare), len(first) - len(keep))

    def _tasks(self, p: _Prepared):
        """Per relation: labels [K, n] and train masks [K, n] with K = seeds x folds x (task, control)."""
        ys, trains, meta = [], [], []
        for si, seed in enumerate(self.seeds):
            for fold in range(self.folds):
                train = p.folds[si] != fold
                for kind in ("task", "control") if self.control else ("task",):
                    ys.append(p.y if kind == "task" else p.control[si])
                    trains.append(train)
                    meta.append((seed, fold, kind, si))
        return np.stack(ys), np.stack(trains), meta

    def _chunks(self, groups: list[tuple], K: int, by_width: bool = False) -> list[list[tuple]]:
        """``groups`` (each ``(prepared, site, X, ...)``, with ``K`` problems) in chunks fitted
        together: similar class counts (at most ~30% padded classes), each under ``max_elements``
        logits; ``by_width``: also one feature width per chunk."""
        key = (lambda t: (t[2].shape[-1], len(t[0].classes))) if by_width else (lambda t: len(t[0].classes))
        chunks, part = [], []
        for item in sorted(groups, key=key):
            trial = part + [item]
            c_max = max(len(t[0].classes) for t in trial)
            size = len(trial) * K * max(len(t[0].keep) for t in trial) * c_max
            padded = len(trial) * c_max > 1.3 * sum(len(t[0].classes) for t in trial)
            other_width = by_width and bool(part) and item[2].shape[-1] != part[0][2].shape[-1]
            if part and (size > self.max_elements or padded or other_width):
                chunks.append(part)
                trial = [item]
            part = trial
        chunks.append(part)
        return chunks

    def _logistic(self, X, Y, T, NC):
        """The sweep's logistic probes on a padded batch of problems (:func:`probes.logistic.fit_logistic`)."""
        to = self.device
        return fit_logistic(
            X.to(to),
            Y.to(to),
            T.to(to),
            NC.to(to),
            C=self.C,
            max_iter=self.max_iter,
            tol=self.tol,
            dtype=self.dtype,
            standardize=self.standardize,
        )

    def _fit_all(self, prepared, features, model_name):
        if self.select is not None:
            return self._fit_selected(prepared, features, model_name)
        groups = []  # (prepared, site, X)
        for p in prepared:
            for s, x in features[p.relation.name].items():
                groups.append((p, s, x))
        K = len(self.seeds) * self.folds * (2 if self.control else 1)
        rows, readout = [], []
        chunks = self._chunks(groups, K)
        bar = progress_bar(total=len(groups), desc="probes", unit="sites", progress=self.progress, threshold=1)
        for part in chunks:
            d = part[0][2].shape[-1]
            if any(x.shape[-1] != d for _, _, x in part):
                raise ValueError(
                    "all sites in a sweep chunk must have the same width; sweep sites of different widths separately"
                )
            n = max(len(p.keep) for p, _, _ in part)
            X = torch.zeros(len(part), n, d, dtype=self.dtype)
            Y = torch.full((len(part), K, n), -1, dtype=torch.long)
            T = torch.zeros(len(part), K, n, dtype=torch.bool)
            NC = torch.zeros(len(part), K, dtype=torch.long)
            metas = []
            for g, (p, _s, x) in enumerate(part):
                m = len(p.keep)
                X[g, :m] = x.reshape(m, -1).to(self.dtype)
                ys, trains, meta = self._tasks(p)
                Y[g, :, :m] = torch.as_tensor(ys)
                T[g, :, :m] = torch.as_tensor(trains)
                NC[g] = len(p.classes)
                metas.append(meta)
            fit = self._logistic(X, Y, T, NC)
            logits = fit.logits(X.to(self.device)).cpu()  # [G, K, n, c]
            other = self._nonlinear(X, Y, T, NC, metas[0])
            for g, (p, s, x) in enumerate(part):
                code = (
                    online_codelength(
                        x.reshape(len(p.keep), -1), p.y, C=self.C, seed=self.seeds[0], standardize=self.standardize
                    )
                    if self.mdl
                    else None
                )
                self._evaluate(
                    p, s, logits[g], metas[g], model_name, fit.converged[g].cpu(), rows, readout, code,
                    {name: pred[g] for name, pred in other.items()},
                )  # fmt: skip
            bar.update(len(part))
        bar.close()
        return rows, readout

    def _fit_selected(self, prepared, features, model_name):
        """``select``: every problem of :meth:`_tasks` (relation, site, seed, fold, task or control)
        fitted on the features its training rows chose, as a group of its own; then scored as
        :meth:`_fit_all` scores a group's problems."""
        units = []  # (prepared, site, X [m, k], problem index, labels [m], train [m])
        problems = {}  # (relation, site) -> (prepared, meta)
        for p in prepared:
            ys, trains, meta = self._tasks(p)
            for s, x in features[p.relation.name].items():
                x = x.reshape(len(p.keep), -1)
                problems[(p.relation.name, s)] = (p, meta)
                for k, (seed, fold, kind, _si) in enumerate(meta):
                    train = trains[k]
                    chosen = self._chosen(x[torch.as_tensor(train)], ys[k][train], len(p.classes), p, s)
                    self._selected += [
                        {"model": model_name, "relation": p.relation.name, "site": s, "seed": seed, "fold": fold}
                        | {"labels": kind, "rank": rank, "feature": int(j)}
                        for rank, j in enumerate(chosen)
                    ]
                    units.append((p, s, x[:, torch.as_tensor(chosen)], k, ys[k], train))
        logits, converged = {}, {}  # (relation, site) -> per problem: [m, c] logits, converged
        bar = progress_bar(total=len(units), desc="probes", unit="probes", progress=self.progress, threshold=1)
        for part in self._chunks(units, 1, by_width=True):
            n = max(len(u[0].keep) for u in part)
            X = torch.zeros(len(part), n, part[0][2].shape[-1], dtype=self.dtype)
            Y = torch.full((len(part), 1, n), -1, dtype=torch.long)
            T = torch.zeros(len(part), 1, n, dtype=torch.bool)
            NC = torch.zeros(len(part), 1, dtype=torch.long)
            for g, (p, _s, x, _k, y, train) in enumerate(part):
                m = len(p.keep)
                X[g, :m] = x.to(self.dtype)
                Y[g, 0, :m] = torch.as_tensor(y)
                T[g, 0, :m] = torch.as_tensor(train)
                NC[g] = len(p.classes)
            fit = self._logistic(X, Y, T, NC)
            out = fit.logits(X.to(self.device)).cpu()  # [G, 1, n, c]
            for g, (p, s, _x, k, _y, _t) in enumerate(part):
                m, c = len(p.keep), len(p.classes)
                logits.setdefault((p.relation.name, s), {})[k] = out[g, 0, :m, :c]
                converged.setdefault((p.relation.name, s), {})[k] = bool(fit.converged[g, 0])
            bar.update(len(part))
        bar.close()
        rows, readout = [], []
        for (name, s), (p, meta) in problems.items():
            every = torch.stack([logits[(name, s)][k] for k in range(len(meta))])  # [K, m, c]
            done = torch.tensor([converged[(name, s)][k] for k in range(len(meta))])
            self._evaluate(p, s, every, meta, model_name, done, rows, readout)
        return rows, readout

    def _chosen(self, X_train: torch.Tensor, y_train: np.ndarray, n_classes: int, p, site: str) -> np.ndarray:
        """``select``'s choice for one problem, checked: distinct feature indices of ``X_train``."""
        chosen = np.asarray(self.select(X_train, y_train, n_classes))
        d = X_train.shape[-1]
        if (
            chosen.ndim != 1
            or not len(chosen)
            or not np.issubdtype(chosen.dtype, np.integer)
            or chosen.min() < 0
            or chosen.max() >= d
            or len(np.unique(chosen)) != len(chosen)
        ):
            raise ValueError(
                f"select must return distinct feature indices (ints from 0 to {d - 1}), at least one; for relation "
                f"{p.relation.name!r} at {site!r} it returned {chosen[:10].tolist()}"
            )
        return chosen

    def _nonlinear(self, X, Y, T, NC, meta) -> dict[str, torch.Tensor]:
        """The nonlinear probes' predictions on the task problems (not the controls) of a chunk:
        ``{name: [G, K_task, n]}``, fitted a block of groups at a time (under ``max_elements``)."""
        if not self.nonlinear:
            return {}
        task = torch.tensor([k for k, m in enumerate(meta) if m[2] == "task"])
        Yt, Tt = Y[:, task], T[:, task]
        NCt = NC[:, task]
        G, K, n = Yt.shape
        per = max(1, self.max_elements // max(1, K * n * max(X.shape[-1], 64, n)))
        out: dict[str, list[torch.Tensor]] = {name: [] for name in self.nonlinear}
        for i in range(0, G, per):
            sl = slice(i, i + per)
            args = [t.to(self.device) for t in (X[sl].to(self.dtype), Yt[sl], Tt[sl], NCt[sl])]
            if "mlp" in out:
                out["mlp"].append(fit_mlp(*args, seed=self.seeds[0]).argmax(-1).cpu())
            if "knn" in out:
                out["knn"].append(knn_predict(*args, k=self.knn_k).cpu())
        return {name: torch.cat(parts) for name, parts in out.items()}

    def _evaluate(self, p, site, logits, meta, model_name, converged, rows, readout, code=None, other=None):
        m, c = len(p.keep), len(p.classes)
        logp = torch.log_softmax(logits[:, :m, :c].double(), -1)  # [K, m, c]
        layer = parse_site(site).layer
        k_top = min(self.top_k, c)
        k_read = min(self.readout_k if self.readout_k is not None else self.top_k, c)
        names = np.asarray(p.classes, dtype=object)
        other = other or {}
        task_index = {}  # problem k -> its index among the task problems (the nonlinear probes')
        for k, (_, _, kind, _) in enumerate(meta):
            if kind == "task":
                task_index[k] = len(task_index)
        by_key = {}
        for k, (seed, fold, kind, si) in enumerate(meta):
            labels = p.y if kind == "task" else p.control[si]
            test = torch.as_tensor(p.folds[si] == fold)
            yl = torch.as_tensor(labels)[test]
            lp = logp[k][test]
            top = lp.topk(k_top, -1).indices
            by_key[(seed, fold, kind)] = {
                "accuracy": (top[:, 0] == yl).double().mean().item(),
                "top_k_accuracy": (top == yl[:, None]).any(-1).double().mean().item(),
                "log_loss": -lp.gather(1, yl[:, None]).mean().item(),
                **(_class_balanced(yl.numpy(), lp.exp().numpy(), c) if kind == "task" else {}),
                "n_train": int((~test).sum()),
                "n_test": int(test.sum()),
                "converged": bool(converged[k]),
            }
            test_np = test.numpy()
            nonlinear_pred = {}
            if kind == "task":
                for name, pred in other.items():
                    nonlinear_pred[name] = pred[task_index[k], :m][test].numpy()
                    by_key[(seed, fold, kind)][f"{name}_accuracy"] = float(
                        np.mean(nonlinear_pred[name] == labels[test_np])
                    )
            if kind == "task" and self.readout:
                order = lp.argsort(-1, descending=True)  # [held out, c]
                ranks = (order == yl[:, None]).int().argmax(-1) + 1
                top_names = names[order[:, :k_read].numpy()].tolist()
                for j, (i, ranked, rank) in enumerate(
                    zip(np.flatnonzero(p.folds[si] == fold).tolist(), top_names, ranks.tolist())
                ):
                    readout.append(
                        {
                            "model": model_name,
                            "relation": p.relation.name,
                            "site": site,
                            "layer": layer,
                            "seed": seed,
                            "fold": fold,
                            "subject": p.relation.subjects[p.keep[i]],
                            "answer": p.classes[p.y[i]],
                            "predicted": ranked[0],
                            "top_answers": ranked,
                            "answer_rank": rank,
                            **{f"{name}_predicted": p.classes[pred[j]] for name, pred in nonlinear_pred.items()},
                        }
                    )
        for seed in self.seeds:
            for fold in range(self.folds):
                t = by_key[(seed, fold, "task")]
                row = {
                    "model": model_name,
                    "relation": p.relation.name,
                    "site": site,
                    "layer": layer,
                    "fold": fold,
                    "seed": seed,
                    "accuracy": t["accuracy"],
                    "top_k_accuracy": t["top_k_accuracy"],
                    "top_k": k_top,
                    "log_loss": t["log_loss"],
                    "balanced_accuracy": t["balanced_accuracy"],
                    "auroc": t["auroc"],
                    "chance": 1.0 / c,
                    "n_train": t["n_train"],
                    "n_test": t["n_test"],
                    "n_classes": c,
                    "dropped_classes": p.dropped_classes,
                    "dropped_subjects": p.dropped_subjects,
                    "converged": t["converged"],
                    **{f"{name}_accuracy": t[f"{name}_accuracy"] for name in other},
                }
                if self.control:
                    ctl = by_key[(seed, fold, "control")]
                    row["control_accuracy"] = ctl["accuracy"]
                    row["selectivity"] = t["accuracy"] - ctl["accuracy"]
                if code is not None:
                    row.update({k: code[k] for k in ("mdl_bits", "uniform_bits", "compression")})
                rows.append(row)


def _class_balanced(y: np.ndarray, probs: np.ndarray, c: int) -> dict:
    """Balanced accuracy (mean recall over the classes present) and macro one-vs-rest AUROC,
    scikit-learn's definitions (``balanced_accuracy_score``; ``roc_auc_score`` with
    ``multi_class="ovr"``; tested equal), computed for all classes at once: AUROC as the
    Mann-Whitney statistic of the midranks, which is the area under the ROC curve with ties
    counted half. NaN if a class is missing from the test fold (scikit-learn's error)."""
    present = np.unique(y)
    pred = probs.argmax(-1)
    recall = np.array([np.count_nonzero(pred[y == k] == k) for k in present]) / np.bincount(y)[present]
    out = {"balanced_accuracy": float(np.mean(recall))}
    if len(present) < (2 if c == 2 else c):
        out["auroc"] = float("nan")
        return out
    if c == 2:
        scores, positive = probs[:, 1:2], (y == 1)[:, None]
    else:
        scores, positive = probs / probs.sum(-1, keepdims=True), y[:, None] == np.arange(c)
    ranks = rankdata(scores, axis=0)  # [n, classes], midranks
    n_pos = positive.sum(0)
    n_neg = len(y) - n_pos
    u = (ranks * positive).sum(0) - n_pos * (n_pos + 1) / 2
    out["auroc"] = float(np.mean(u / (n_pos * n_neg)))
    return out


def sweep(source, relations: Sequence[Relation], model_name: str | None = None, **config) -> pd.DataFrame:
    """Shortcut: ``ProbeSweep(**config).run(source, relations, model_name)``."""
    return ProbeSweep(**config).run(source, relations, model_name)
