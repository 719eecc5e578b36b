"""Run a probe sweep over an activation store in a fresh process; print peak anonymous memory growth.

    python tests/out_of_core_sweep.py STORE_DIR {in_memory|out_of_core} OUT_CSV

Anonymous resident memory (``RssAnon``: heap and tensors, not the page cache of memory-mapped
files) is sampled every 2 ms while the sweep runs; its largest growth is printed as JSON.
"""

import json
import sys
import threading
import time

import torch

from interp.relations import Relation
from interp.store import ActivationStore
from probes import ProbeSweep


def rss_anon_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def main():
    root, mode, out = sys.argv[1], sys.argv[2], sys.argv[3]
    torch.set_num_threads(2)
    store = ActivationStore(root)
    meta = json.loads((ActivationStore(root).root / "labels.json").read_text())
    relation = Relation("synthetic", meta["subjects"], meta["answers"])
    sweep = ProbeSweep(
        folds=3, control=False, readout=False, progress=False, sites_per_pass=1 if mode == "out_of_core" else None
    )
    base = rss_anon_mb()
    peak = [base]
    running = [True]

    def sample():
        while running[0]:
            peak[0] = max(peak[0], rss_anon_mb())
            time.sleep(0.002)

    t = threading.Thread(target=sample, daemon=True)
    t.start()
    source = {"synthetic": store}
    if mode == "in_memory":  # every site loaded up front, as a sweep over in-memory tensors holds them
        source = {"synthetic": {s: store[s] for s in store.keys()}}
    table = sweep.run(source, [relation])
    running[0] = False
    t.join()
    table.to_csv(out, index=False)
    print(json.dumps({"peak_growth_mb": peak[0] - base, "store_mb": store_size_mb(store)}))


def store_size_mb(store) -> float:
    return sum(p.stat().st_size for p in store.root.glob("*.safetensors")) / 2**20


if __name__ == "__main__":
    main()
