"""Benchmark: batched path patching and attribution patching on the 4-layer world model.

1. All-heads path patching (every head and the embeddings as senders; every later head's q, k, v
   and the logits as receivers; MLPs frozen): the batched ``PathPatching`` against a naive loop
   with one sender and one receiver per pass (``tests/naive_patching.py``). Scores must agree.
2. Activation patching of every head output at every position (exact, one cell per patch) against
   attribution patching (AtP, one forward + one backward), with their rank correlation; also
   TransformerLens' own loop ``patching.get_act_patch_attn_head_out_by_pos`` as the reference
   implementation of activation patching.

    python benchmarks/patching.py [--pairs 16] [--relation country]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("TQDM_DISABLE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import numpy as np  # noqa: E402  (after the environment above is set)
import torch  # noqa: E402
from naive_patching import naive_path_patch  # noqa: E402
from scipy.stats import pearsonr, spearmanr  # noqa: E402
from transformer_lens import patching  # noqa: E402

import interp  # noqa: E402
from circuits import ActivationPatching, AttributionPatching, PathPatching  # noqa: E402
from circuits.components import parse_receivers  # noqa: E402
from circuits.metrics import as_metric  # noqa: E402
from lab.experiments.relation_circuit import relation_pairs  # noqa: E402
from lab.world import from_world, load_world  # noqa: E402


def timed(fn):
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def world_pairs(relation: str, n: int, backend: str):
    """The world model and ``n`` patching pairs of one relation (2 threads), described on stdout."""
    torch.set_num_threads(2)
    model = interp.load_model("world", backend=backend)
    (rel,) = from_world(load_world(), [relation])
    pairs = relation_pairs(model, [p.text for p in rel.prompts()], rel.answers, n=n, seed=0)
    print(
        f"world model: {model.n_layers} layers x {model.n_heads} heads, d_model {model.d_model}; {len(pairs)} pairs "
        f"of {pairs.n_pos} tokens ({relation}); backend {backend}; 2 threads\n"
    )
    return model, pairs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pairs", type=int, default=16)
    parser.add_argument("--relation", default="country")
    parser.add_argument("--backend", default=interp.DEFAULT_BACKEND)
    args = parser.parse_args()

    model, pairs = world_pairs(args.relation, args.pairs, args.backend)
    L, H = model.n_layers, model.n_heads

    receivers = [f"L{l}H{h}.{c}" for l in range(1, L) for h in range(H) for c in "qkv"] + ["logits"]
    senders = ["embed"] + [f"L{l}H{h}" for l in range(L) for h in range(H)]
    pp = PathPatching(
        model, "logit_diff", senders=senders, receivers=receivers, mlps="frozen", batch_size=256, progress=False
    )
    pp.run(pairs[:2])  # warm-up
    batched, t_batched = timed(lambda: pp.run(pairs))
    metric = as_metric("logit_diff")
    nodes = {s.name: s for s in pp.senders_}

    def naive():
        return [
            naive_path_patch(model, pairs, metric, nodes[r.sender], parse_receivers(model, [r.receiver])[0], "frozen")
            for r in batched.itertuples()
        ]

    ref, t_naive = timed(naive)
    diff = float(np.max(np.abs(np.array(ref) - batched.score.to_numpy())))

    ap = ActivationPatching(model, "logit_diff", sites=["z"], by_position=True, batch_size=256, progress=False)
    exact, t_ap = timed(lambda: ap.run(pairs))
    at = AttributionPatching(
        model, "logit_diff", nodes=[f"L{l}H{h}" for l in range(L) for h in range(H)], by_position=True, progress=False
    )
    at.nodes(pairs[:2])
    approx, t_at = timed(lambda: at.nodes(pairs))
    effects = (exact.score - exact.attrs["target_score"]).to_numpy()
    rho = spearmanr(effects, approx.score.to_numpy()).statistic
    r = pearsonr(effects, approx.score.to_numpy()).statistic

    tl = interp.load_model("world", backend="transformer_lens").backend.bridge
    a, w, rows = pairs.answer, pairs.wrong, torch.arange(len(pairs))
    last = pairs.last

    def tl_metric(logits):
        return (logits[rows, last, a] - logits[rows, last, w]).mean()

    with torch.no_grad():
        _, cache = tl.run_with_cache(pairs.clean.input_ids, attention_mask=pairs.clean.attention_mask)

    def tl_loop():
        return patching.get_act_patch_attn_head_out_by_pos(tl, pairs.corrupted.input_ids, cache, tl_metric)

    _, t_tl = timed(tl_loop)

    n_edges = len(batched)
    print(f"{'method':44s} {'seconds':>8s} {'speed-up':>9s}  agreement")
    print(f"{'path patching, naive loop (' + str(n_edges) + ' edges)':44s} {t_naive:8.2f} {1.0:8.1f}x")
    print(
        f"{'path patching, batched senders':44s} {t_batched:8.2f} {t_naive / t_batched:8.1f}x  "
        f"max |score diff| {diff:.1e}"
    )
    cells = len(exact)
    print(f"{'activation patching, TL loop (' + str(cells) + ' cells)':44s} {t_tl:8.2f} {1.0:8.1f}x")
    print(f"{'activation patching, ours (batched cells)':44s} {t_ap:8.2f} {t_tl / t_ap:8.1f}x  exact")
    print(
        f"{'attribution patching (AtP, 1 fwd + 1 bwd)':44s} {t_at:8.2f} {t_tl / t_at:8.1f}x  "
        f"vs exact: Spearman {rho:.3f}, Pearson {r:.3f}"
    )
    print(f"\nAtP vs our batched activation patching: {t_ap / t_at:.1f}x faster")


if __name__ == "__main__":
    main()
