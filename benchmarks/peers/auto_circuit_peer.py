"""auto-circuit's edge attribution and circuit evaluation at GPT-2-small shape, for ``scale.py``.

Runs in its own environment (auto-circuit pins ``kaleido==0.2.1``, which the project's plots
cannot use), built once:

    python3 -m venv .venv-auto-circuit
    .venv-auto-circuit/bin/pip install torch==2.13.0 auto-circuit attrs typeguard \
        "transformer-lens==2.4.1" "transformers<4.45"

then ``python benchmarks/scale.py --auto-circuit-python .venv-auto-circuit/bin/python``. The model
is a random-weight ``HookedTransformer`` of GPT-2 small's shape (12 layers, d_model 768, 12 heads,
vocab 50,257), configured as auto-circuit's own ``load_tl_model`` configures GPT-2 (split q/k/v
inputs, head results, MLP inputs), on the same number of pairs and positions as ``scale.py``.
Prints one JSON list of rows: the floors (a bare forward and a forward + backward of the clean
batch, on this model) and auto-circuit's EAP (``mask_gradient_prune_scores`` with ``mask_val=0``,
which auto-circuit documents as exactly EAP), its 5-sample mask integrated gradients, and
``run_circuits`` over the same 14 circuits as ``scale.py``'s faithfulness row (4 sizes x (EAP + 2
random orderings) + the full and the empty circuit).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

os.environ.setdefault("TQDM_DISABLE", "1")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pairs", type=int, default=16)
    ap.add_argument("--pos", type=int, default=24)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    import torch as t
    import transformer_lens as tl
    from auto_circuit.data import PromptDataLoader, PromptDataset
    from auto_circuit.prune import run_circuits
    from auto_circuit.prune_algos.mask_gradient import mask_gradient_prune_scores
    from auto_circuit.types import AblationType, PatchType
    from auto_circuit.utils.graph_utils import patchable_model

    t.set_num_threads(args.threads)
    t.manual_seed(0)
    cfg = tl.HookedTransformerConfig(
        n_layers=12, d_model=768, n_heads=12, d_head=64, d_mlp=3072, d_vocab=50257, n_ctx=1024, act_fn="gelu_new"
    )
    model = tl.HookedTransformer(cfg)
    model.eval()
    for p in model.parameters():
        p.requires_grad = False
    n, pos = args.pairs, args.pos
    clean = t.randint(10, 50000, (n, pos))
    corrupt = clean.clone()
    corrupt[:, 1] = t.randint(10, 50000, (n,))
    answers = [t.randint(10, 50000, (1,)) for _ in range(n)]
    wrong = [t.randint(10, 50000, (1,)) for _ in range(n)]
    loader = PromptDataLoader(PromptDataset(clean, corrupt, answers, wrong), seq_len=None, diverge_idx=0, batch_size=n)

    def timed(fn, repeats, warm_up=True):
        if warm_up:
            fn()
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
        return statistics.median(times)

    def forward():
        with t.no_grad():
            model(clean)

    def forward_backward():
        emb = model.embed(clean).detach().requires_grad_(True)
        logits = model(emb + model.pos_embed(clean), start_at_layer=0)
        t.autograd.grad(logits[:, -1].logsumexp(-1).sum(), emb)

    f_s = timed(forward, args.repeats)  # the floors on the plain model, as for ours
    fb_s = timed(forward_backward, args.repeats)
    model.cfg.use_attn_result = True  # what auto-circuit's load_tl_model sets for edge patching
    model.cfg.use_attn_in = True
    model.cfg.use_split_qkv_input = True
    model.cfg.use_hook_mlp_in = True
    pm = patchable_model(model, factorized=True, slice_output="last_seq", separate_qkv=True, device=t.device("cpu"))
    n_edges = pm.n_edges
    scores = {}

    def eap():
        scores["eap"] = mask_gradient_prune_scores(
            pm, loader, None, grad_function="logit", answer_function="avg_diff", mask_val=0.0
        )

    def eap_ig():
        mask_gradient_prune_scores(
            pm, loader, None, grad_function="logit", answer_function="avg_diff", integrated_grad_samples=5
        )

    eap_s = timed(eap, 1, warm_up=False)  # each of these takes tens of seconds or more
    ig_s = timed(eap_ig, 1, warm_up=False)
    sizes = [max(1, round(f * n_edges)) for f in (0.01, 0.05, 0.2, 0.5)]
    randoms = [{k: t.rand_like(v) for k, v in scores["eap"].items()} for _ in range(2)]

    def circuits():
        for ps in [scores["eap"], *randoms]:
            run_circuits(pm, loader, sizes, ps, patch_type=PatchType.TREE_PATCH, ablation_type=AblationType.RESAMPLE)
        run_circuits(pm, loader, [0, n_edges], scores["eap"], patch_type=PatchType.TREE_PATCH)

    circ_s = timed(circuits, 1, warm_up=False)
    n_circuits = 3 * len(sizes) + 2
    print(
        json.dumps(
            [
                {"what": "auto-circuit: floor, forward (HookedTransformer)", "seconds": f_s, "ratio": 1.0},
                {"what": "auto-circuit: floor, forward + backward", "seconds": fb_s, "ratio": 1.0},
                {
                    "what": f"auto-circuit EAP (mask gradients, {n_edges} edges)",
                    "seconds": eap_s,
                    "ratio": eap_s / fb_s,
                    "ratio_is": "forward + backwards",
                },
                {
                    "what": "auto-circuit mask integrated gradients, 5 samples",
                    "seconds": ig_s,
                    "ratio": ig_s / fb_s,
                    "ratio_is": "forward + backwards",
                },
                {
                    "what": f"auto-circuit run_circuits, {n_circuits} circuits",
                    "seconds": circ_s,
                    "ratio": circ_s / n_circuits / f_s,
                    "ratio_is": "forwards per circuit",
                },
            ]
        )
    )


if __name__ == "__main__":
    main()
