"""Benchmark: a probe sweep of every world relation x every layer x 5 folds.

The batched trainer (probes.ProbeSweep, one tensor program) against a loop of scikit-learn
make_pipeline(StandardScaler(), LogisticRegression(C)) (lbfgs, the same standardized probe)
over identical features and identical folds. Reports wall
time of the fitting (features are captured once, outside the timing) and the largest
per-cell accuracy difference.

    python benchmarks/probe_sweep.py [--folds 5] [--C 1.0] [--tol 1e-4]
"""

from __future__ import annotations

import argparse
import os
import time
import warnings

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")


def main() -> None:
    import numpy as np
    import torch
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import StratifiedKFold
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    import interp
    from lab.world import from_world, load_world
    from probes import ProbeSweep

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--folds", type=int, default=5)
    ap.add_argument("--C", type=float, default=1.0)
    ap.add_argument("--tol", type=float, default=1e-4)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    model = interp.load_model("world")
    relations = from_world(load_world())
    sites = [model.resid_site(l) for l in range(model.n_layers)]
    features = {}
    for r in relations:
        acts = interp.capture(model, r.prompts(), sites=sites, positions="subject_last", batch_size=256, progress=False)
        features[r.name] = {s: acts[s].float() for s in sites}

    sweep = ProbeSweep(folds=args.folds, C=args.C, control=False, tol=args.tol, progress=False)
    t = time.perf_counter()
    ours = sweep.run(features, relations, model_name="world")
    t_ours = time.perf_counter() - t

    t = time.perf_counter()
    diffs, n_fits = [], 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        for r in relations:
            y = np.array(r.answers)
            split = list(StratifiedKFold(args.folds, shuffle=True, random_state=0).split(np.zeros(len(y)), y))
            for s in sites:
                X = features[r.name][s].numpy()
                for fold, (tr, te) in enumerate(split):
                    probe = make_pipeline(StandardScaler(), LogisticRegression(C=args.C, tol=args.tol, max_iter=1000))
                    acc = probe.fit(X[tr], y[tr]).score(X[te], y[te])
                    n_fits += 1
                    cell = ours[(ours.relation == r.name) & (ours.site == s) & (ours.fold == fold)].accuracy.item()
                    diffs.append(abs(cell - acc))
    t_sk = time.perf_counter() - t
    print(
        f"probe sweep: {len(relations)} relations x {len(sites)} layers x {args.folds} folds = {n_fits} probes, "
        f"d_model {model.d_model}, {args.threads} threads"
    )
    print(f"{'method':<34}{'seconds':>9}{'speed-up':>10}{'max |acc diff|':>16}")
    print(f"{'sklearn Scaler+LogisticRegression':<34}{t_sk:>9.2f}{1.0:>10.1f}{0.0:>16.4f}")
    print(f"{'probes.ProbeSweep (batched)':<34}{t_ours:>9.2f}{t_sk / t_ours:>10.1f}{max(diffs):>16.4f}")
    print(f"cells within 1 point: {np.mean(np.array(diffs) <= 0.01) * 100:.1f}%")


if __name__ == "__main__":
    main()
