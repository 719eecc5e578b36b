"""Benchmark: study throughput on 1 and 2 Ray workers, and an out-of-core probe sweep's memory.

1. The fine-tunes of a small world-model study (6 relations x 2 label seeds, full fine-tuning,
   60 steps each) run five ways: the serial executor with the process's 2 torch threads and with
   ``threads=1``, Ray with one worker and with two (1 CPU each, the default 1 thread per task),
   and two Ray workers given the driver's 2 threads each (the old default, oversubscribing 2
   cores). Jobs per minute and the 2-vs-1 worker scaling ratio; the runs with 1 thread per job
   must produce identical tables.
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

RELATIONS = ["continent", "hand", "season", "diet", "league", "sign"]


def study_throughput(root: Path) -> list[tuple[str, float, int]]:
    import pandas as pd
    import ray

    from lab.executors import RayExecutor, SerialExecutor
    from lab.study import FinetuneConfig, StudyConfig, run_study

    config = StudyConfig(
        n_finetune=3,
        methods=("full",),
        label_seeds=(0, 1),
        finetune_seeds=(0,),
        other_categories=(),
        folds=3,
        n_boot=100,
        n_perm=100,
        finetune=FinetuneConfig(max_steps=60, check_every=60),
    )
    # readability and pretrained scoring are shared by all runs: do them once, then time the fine-tunes only
    warm = root / "warm"
    run_study("world", RELATIONS, out=warm, config=config, max_jobs=0, progress=False)
    rows, tables = [], {}
    for name, make in [
        ("serial, 2 threads", lambda: SerialExecutor(progress=False)),
        ("serial, threads=1", lambda: SerialExecutor(progress=False, threads=1)),
        ("ray, 1 worker x 1 CPU", lambda: RayExecutor(num_cpus=1)),
        ("ray, 2 workers x 1 CPU", lambda: RayExecutor(num_cpus=1)),
        ("ray, 2 workers x 2 threads (old)", lambda: RayExecutor(num_cpus=1, threads=2)),
    ]:
        out = root / name.replace(" ", "_").replace(",", "").replace("(", "").replace(")", "").replace("=", "")
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
    # jobs with 1 thread each must agree exactly; other thread counts may differ in the last digits
    one = [tables[n] for n in ("serial, threads=1", "ray, 1 worker x 1 CPU", "ray, 2 workers x 1 CPU")]
    same = all(t.equals(one[0]) for t in one)
    return rows, same


def sweep_memory(root: Path):
    from interp.store import synthetic_store

    store = synthetic_store(root / "store")
    out = {}
    for mode in ("in_memory", "out_of_core"):
        start = time.perf_counter()
        proc = subprocess.run(
            [
                sys.executable,
                str(HERE.parent / "tests" / "out_of_core_sweep.py"),
                str(store),
                mode,
                str(root / f"{mode}.csv"),
            ],
            capture_output=True,
            text=True,
            check=True,
        )
        out[mode] = {**json.loads(proc.stdout.strip().splitlines()[-1]), "seconds": time.perf_counter() - start}
    import pandas as pd

    a = pd.read_csv(root / "in_memory.csv").sort_values(["site", "fold"]).accuracy.to_numpy()
    b = pd.read_csv(root / "out_of_core.csv").sort_values(["site", "fold"]).accuracy.to_numpy()
    return out, bool((a == b).all())


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        rows, same = study_throughput(root)
        print(
            f"study fine-tunes ({rows[0][2]} jobs: {len(RELATIONS)} world relations x 2 label seeds, 60 steps), "
            "2-core machine"
        )
        print(f"{'executor':34s} {'seconds':>8s} {'jobs/min':>9s}")
        for name, seconds, n in rows:
            print(f"{name:34s} {seconds:8.1f} {60 * n / seconds:9.2f}")
        by = {name: seconds for name, seconds, _ in rows}
        print(
            f"scaling, 2 Ray workers vs 1: {by['ray, 1 worker x 1 CPU'] / by['ray, 2 workers x 1 CPU']:.2f}x; "
            "1 thread per worker vs 2 (old default): "
            f"{by['ray, 2 workers x 2 threads (old)'] / by['ray, 2 workers x 1 CPU']:.2f}x "
            f"faster; identical tables (1 thread per job): {same}\n"
        )
        mem, agree = sweep_memory(root)
        print(f"probe sweep over a {mem['out_of_core']['store_mb']:.0f} MB store (24 sites x 12,000 x 256)")
        print(f"{'mode':32s} {'seconds':>8s} {'peak MB':>9s}")
        for mode, m in mem.items():
            print(f"{mode:32s} {m['seconds']:8.1f} {m['peak_growth_mb']:9.1f}")
        print(f"same accuracies: {agree}")


if __name__ == "__main__":
    main()
