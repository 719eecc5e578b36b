"""Benchmark: the cost of per-pair statistics in patching (time and memory vs means only).

Activation patching of every head output at every position and path patching of every head into
every later head's q/k/v and the logits, on the 4-layer world model, run three ways:

1. means only (``statistics=False``, the default);
2. with per-pair values kept and summarized (``statistics=True``: bootstrap interval of the mean
   effect with 1,000 resamples, sign-flip p-value with 1,000 permutations, FDR);
3. the reference: TransformerLens 4's loop with ``reduce="none", baseline=True`` and its
   ``bootstrap_ci(of_effect=True)`` / ``permutation_pvalue()`` on the same pairs (activation
   patching only: TransformerLens has no per-pair path patching).

Memory is the per-pair table the statistics keep (``4 * cells * pairs`` bytes, float32) and the
peak resident memory of the process after each run (ru_maxrss; it only grows, so runs are
ordered from smallest to largest).

    python benchmarks/patching_statistics.py [--pairs 64] [--relation country]
"""

from __future__ import annotations

import argparse
import resource

# first: benchmarks/patching.py sets the offline environment, and has the model, prompts and timer
from patching import timed, world_pairs  # isort: skip

import torch  # noqa: E402
from transformer_lens import patching  # noqa: E402

import interp  # noqa: E402
from circuits import ActivationPatching, PathPatching, Uncertainty  # noqa: E402


def peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pairs", type=int, default=64)
    parser.add_argument("--relation", default="country")
    parser.add_argument("--backend", default=interp.DEFAULT_BACKEND)
    args = parser.parse_args()

    model, pairs = world_pairs(args.relation, args.pairs, args.backend)
    L, H = model.n_layers, model.n_heads
    config = Uncertainty(n_resamples=1000, n_permutations=1000)
    rows = []

    def ours(name, make):
        plain = make(False)
        plain.run(pairs[:2])  # warm-up
        _, t_plain = timed(lambda: plain.run(pairs))
        mem_plain = peak_mib()
        stats = make(config)
        df, t_stats = timed(lambda: stats.run(pairs))
        kept = stats.per_pair_.numel() * 4 / 1024**2
        rows.append((f"{name}, means only", len(df), t_plain, t_plain, 0.0, mem_plain))
        rows.append((f"{name}, per-pair statistics", len(df), t_stats, t_plain, kept, peak_mib()))
        return df

    receivers = [f"L{l}H{h}.{c}" for l in range(1, L) for h in range(H) for c in "qkv"] + ["logits"]
    senders = ["embed"] + [f"L{l}H{h}" for l in range(L) for h in range(H)]
    ours(
        "path patching",
        lambda s: PathPatching(
            model, "logit_diff", senders=senders, receivers=receivers, batch_size=256, progress=False, statistics=s
        ),
    )
    ap = ours(
        "activation patching z",
        lambda s: ActivationPatching(
            model, "logit_diff", sites=["z"], by_position=True, batch_size=256, progress=False, statistics=s
        ),
    )

    tl = interp.load_model("world", backend="transformer_lens").backend.bridge
    a, w, idx = pairs.answer, pairs.wrong, torch.arange(len(pairs))
    last = pairs.last

    def tl_metric(logits):
        return logits[idx, last, a] - logits[idx, last, w]

    def tl_run():
        with torch.no_grad():
            _, cache = tl.run_with_cache(pairs.clean.input_ids, attention_mask=pairs.clean.attention_mask)
            res = patching.get_act_patch_attn_head_out_by_pos(
                tl, pairs.corrupted.input_ids, cache, tl_metric, reduce="none", baseline=True
            )
        res.bootstrap_ci(of_effect=True, n_resamples=1000)
        res.permutation_pvalue(n_permutations=1000)
        return res

    tl_run()  # warm-up, as for ours
    res, t_tl = timed(tl_run)
    rows.append(
        (
            "activation patching z, TransformerLens 4",
            res.values[..., 0].numel(),
            t_tl,
            rows[-1][3],
            res.values.numel() * 4 / 1024**2,
            peak_mib(),
        )
    )

    print(f"{'run':44s} {'cells':>6s} {'seconds':>8s} {'x means':>8s} {'kept MiB':>9s} {'peak RSS MiB':>13s}")
    for name, cells, t, base, kept, peak in rows:
        print(f"{name:44s} {cells:6d} {t:8.2f} {t / base:7.2f}x {kept:9.2f} {peak:13.0f}")
    n_sig = int(((ap.ci_low > 0) | (ap.ci_high < 0)).sum())
    print(
        f"\nactivation patching: {n_sig} of {len(ap)} cells have a 95% interval excluding 0; "
        f"{int((ap.p_fdr < 0.05).sum())} have FDR-adjusted p < 0.05"
    )


if __name__ == "__main__":
    main()
