"""Benchmark: batched per-example Jacobians (vmap) against a per-example loop.

On the world model (4 layers, d_model 128), the Jacobian of the last block's output at the last
token with respect to the layer-0 residual stream at the subject's last token (the LRE's
``do/ds``, 128 x 128), for 32 prompts:

- ``jacobians.jacobian`` (one forward over the batch, one vmapped backward over the 128 outputs);
- a per-example loop calling ``torch.autograd.functional.jacobian`` (one output row per backward);
- the same loop with ``vectorize=True`` (vmap over outputs, but one example at a time).

    python benchmarks/jacobian_batching.py [--prompts 32] [--backend nnsight]
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import interp  # noqa: E402  (after the environment above is set)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--backend", default=interp.DEFAULT_BACKEND)
    args = parser.parse_args()

    import torch

    from jacobians import jacobian
    from jacobians.jacobian import forward_with_input, positions_tensor
    from lab.world import from_world, load_world

    torch.set_num_threads(2)
    model = interp.load_model("world", backend=args.backend)
    (rel,) = from_world(load_world(), ["country"])
    prompts = rel.prompts()[: args.prompts]
    wrt, of = "blocks.0.hook_resid_post", f"blocks.{model.n_layers - 1}.hook_resid_post"

    def ours():
        return jacobian(model, prompts, wrt, of, wrt_position="subject_last", of_position="last", batch_size=32)

    def loop(vectorize: bool):
        out = []
        for p in prompts:
            batch = model.batch(model.encode([p]), "right")
            wpos = positions_tensor(model, [p], batch, "subject_last")
            opos = positions_tensor(model, [p], batch, "last")
            x0, _ = forward_with_input(model, batch, wrt, of, wpos, opos)
            f = lambda x: forward_with_input(model, batch, wrt, of, wpos, opos, x=x)[1]  # noqa: E731
            out.append(torch.autograd.functional.jacobian(f, x0.detach(), vectorize=vectorize)[0, :, 0])
        return torch.stack(out)

    ours()  # warm-up
    results = {}
    for name, fn in [
        ("per-example loop (autograd.functional)", lambda: loop(False)),
        ("per-example loop, vectorize=True", lambda: loop(True)),
        ("jacobians.jacobian (batched vmap)", ours),
    ]:
        start = time.perf_counter()
        J = fn()
        results[name] = (time.perf_counter() - start, J)
    base_t, base_J = results["per-example loop (autograd.functional)"]
    print(
        f"{args.prompts} prompts, J = d(block {model.n_layers - 1} out)/d(block 0 out) [{base_J.shape[1]} x "
        f"{base_J.shape[2]}], backend {args.backend}, 2 threads\n"
    )
    print(f"{'method':42s} {'seconds':>8s} {'speed-up':>9s} {'max |diff|':>11s}")
    for name, (t, J) in results.items():
        print(f"{name:42s} {t:8.3f} {base_t / t:8.1f}x {(J - base_J).abs().max().item():11.1e}")


if __name__ == "__main__":
    main()
