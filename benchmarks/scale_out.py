"""Benchmark: study throughput on 1 and 2 Ray workers, and an out-of-core probe sweep's memory.

1. The fine-tunes of a small world-model study (6 relations x 2 label seeds, full fine-tuning,
   60 steps each) run three ways: the serial executor (one process, 2 torch threads), Ray with
   one worker (1 CPU), Ray with two workers (1 CPU each). Jobs per minute and the 2-vs-1 worker
   scaling ratio; every run must produce the same tables.
2. A probe sweep over a synthetic activation store (24 sites x 12,000 rows x 256 dims, 281 MB)
   in memory vs out of core (``sites_per_pass=1``): peak growth of anonymous memory, time, and
   whether the accuracies agree.

    python benchmarks/scale_out.py
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("TQDM_DISABLE", "1")
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))

RELATIONS = ["continent", "hand", "season", "diet", "league", "sign"]


def study_throughput(root: Path) -> list[tuple[str, float, int]]:
    import pandas as pd
    import ray

    from lab.executors import RayExecutor, SerialExecutor
    from lab.study import FinetuneConfig, StudyConfig, run_study

    config = StudyConfig(n_finetune=3, methods=("full",), label_seeds=(0, 1), finetune_seeds=(0,), other_categories=(),
                         folds=3, n_boot=100, n_perm=100, finetune=FinetuneConfig(max_steps=60, check_every=60))
    # readability and pretrained scoring are shared by all runs: do them once, then time the fine-tunes only
    warm = root / "warm"
    run_study("world", RELATIONS, out=warm, config=config, max_jobs=0, progress=False)
    rows, tables = [], {}
    for name, make in [("serial (1 process, 2 threads)", lambda: SerialExecutor(progress=False)),
                       ("ray, 1 worker x 1 CPU", lambda: RayExecutor(num_cpus=1, threads=1)),
                       ("ray, 2 workers x 1 CPU", lambda: RayExecutor(num_cpus=1, threads=1))]:
        out = root / name.split(",")[0].split(" ")[0] / name.replace(" ", "_").replace(",", "")
        out.parent.mkdir(parents=True, exist_ok=True)
        import shutil

        shutil.copytree(warm, out)
        if name.startswith("ray"):
            ray.shutdown()
            ray.init(num_cpus=1 if "1 worker" in name else 2, include_dashboard=False, log_to_driver=False)
            ray.get(ray.remote(lambda: 0).remote())  # workers up before timing
        start = time.perf_counter()
        result = run_study("world", RELATIONS, out=out, config=config, progress=False, executor=make())
        seconds = time.perf_counter() - start
        n_jobs = len(list((out / "runs").glob("*.json")))
        rows.append((name, seconds, n_jobs))
        tables[name] = pd.read_csv(out / "relations.csv")
        assert result.complete
    ray.shutdown()
    # with 1 thread per worker, float reductions differ from the 2-thread serial run in the last digits
    first = next(iter(tables.values()))
    cols = [c for c in first.columns if c.startswith(("generalization", "readability", "train_accuracy"))]
    same = all(t[cols].equals(first[cols]) for t in tables.values())
    return rows, same


def sweep_memory(root: Path):
    from test_distributed import _synthetic_store

    store = _synthetic_store(root / "store")
    out = {}
    for mode in ("in_memory", "out_of_core"):
        start = time.perf_counter()
        proc = subprocess.run([sys.executable, str(HERE.parent / "tests" / "out_of_core_sweep.py"), str(store), mode,
                               str(root / f"{mode}.csv")], capture_output=True, text=True, check=True)
        out[mode] = {**json.loads(proc.stdout.strip().splitlines()[-1]), "seconds": time.perf_counter() - start}
    import pandas as pd

    a = pd.read_csv(root / "in_memory.csv").sort_values(["site", "fold"]).accuracy.to_numpy()
    b = pd.read_csv(root / "out_of_core.csv").sort_values(["site", "fold"]).accuracy.to_numpy()
    return out, bool((a == b).all())


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        rows, same = study_throughput(root)
        print(f"study fine-tunes ({rows[0][2]} jobs: {len(RELATIONS)} world relations x 2 label seeds, 60 steps), 2-core machine")
        print(f"{'executor':32s} {'seconds':>8s} {'jobs/min':>9s}")
        for name, seconds, n in rows:
            print(f"{name:32s} {seconds:8.1f} {60 * n / seconds:9.2f}")
        print(f"scaling, 2 Ray workers vs 1: {rows[1][1] / rows[2][1]:.2f}x; identical tables: {same}\n")
        mem, agree = sweep_memory(root)
        print(f"probe sweep over a {mem['out_of_core']['store_mb']:.0f} MB store (24 sites x 12,000 x 256)")
        print(f"{'mode':32s} {'seconds':>8s} {'peak MB':>9s}")
        for mode, m in mem.items():
            print(f"{mode:32s} {m['seconds']:8.1f} {m['peak_growth_mb']:9.1f}")
        print(f"same accuracies: {agree}")


if __name__ == "__main__":
    main()
