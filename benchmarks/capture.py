"""Benchmark: capture hook_resid_post at the last token of every layer, 2,048 prompts, 6 layers.

Compares interp.capture (both backends) against the physical floor (a bare HuggingFace forward
pass over the same batches), TransformerLens' run_with_cache and a plain nnsight trace saving
the same sites. Each method runs in its own process (a warm-up, then the median of the timed repeats); peak
memory is the largest growth of resident memory during a timed repeat, sampled every 2 ms.

    python benchmarks/capture.py [--prompts 2048] [--batch-size 64] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
METHODS = ["bare_forward", "interp_nnsight", "interp_transformer_lens", "tl_run_with_cache", "nnsight_trace"]


def make_model(root: Path) -> Path:
    """A 6-layer GPT-2 (d_model 256) with a word-level tokenizer, saved once."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    from lab.world.tokenizer import build_tokenizer

    path = root / "gpt2-6l"
    if (path / "config.json").exists():
        return path
    words = [f"w{i}" for i in range(2000)]
    tok = build_tokenizer(words)
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=6, n_embd=256, n_head=8, n_positions=64, vocab_size=len(tok)))
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


def prompts(n: int) -> list[str]:
    import random

    rng = random.Random(0)
    return [" ".join(f"w{rng.randrange(2000)}" for _ in range(rng.randint(10, 20))) for _ in range(n)]


class PeakRSS:
    """Samples this process's resident memory every 2 ms; ``extra_mb``: peak minus the start."""

    def __enter__(self):
        import threading

        import psutil

        self.proc = psutil.Process()
        self.start = self.peak = self.proc.memory_info().rss
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._watch, daemon=True)
        self.thread.start()
        return self

    def _watch(self):
        while not self.done.wait(0.002):
            self.peak = max(self.peak, self.proc.memory_info().rss)

    def __exit__(self, *exc):
        self.done.set()
        self.thread.join()
        self.extra_mb = (self.peak - self.start) / 2**20


def run_one(method: str, path: Path, n: int, batch_size: int, repeats: int) -> dict:
    import numpy as np
    import torch

    import interp

    torch.set_num_threads(2)
    texts = prompts(n)
    layers = range(6)
    sites = [f"blocks.{l}.hook_resid_post" for l in layers]
    backend = "transformer_lens" if method in ("interp_transformer_lens", "tl_run_with_cache") else "nnsight"
    model = interp.load_model(path, backend=backend)
    batches = [model.batch(model.encode(texts[i : i + batch_size]), "right") for i in range(0, n, batch_size)]
    last = [b.attention_mask.sum(-1) - 1 for b in batches]

    def bare():
        hf = model.backend.hf_model
        with torch.no_grad():
            for b in batches:
                hf(input_ids=b.input_ids, attention_mask=b.attention_mask, position_ids=b.position_ids)

    def ours():
        interp.capture(
            model, texts, sites=sites, positions="last", batch_size=batch_size, padding_side="right", progress=False
        )

    def run_with_cache():
        bridge = model.backend.bridge
        out = []
        with torch.no_grad():
            for b, li in zip(batches, last):
                _, cache = bridge.run_with_cache(b.input_ids, attention_mask=b.attention_mask, names_filter=sites)
                out.append(torch.stack([cache[s][torch.arange(len(li)), li] for s in sites], 1))
        return torch.cat(out)

    def nnsight_trace():
        from nnsight import NNsight

        nm = NNsight(model.backend.hf_model)
        out = []
        with torch.no_grad():
            for b, li in zip(batches, last):
                rows = torch.arange(len(li))
                saved = []
                with nm.trace(input_ids=b.input_ids, attention_mask=b.attention_mask, position_ids=b.position_ids):
                    for l in layers:
                        saved.append(nm.transformer.h[l].output[rows, li].save())
                out.append(torch.stack(saved, 1))
        return torch.cat(out)

    fn = {
        "bare_forward": bare,
        "interp_nnsight": ours,
        "interp_transformer_lens": ours,
        "tl_run_with_cache": run_with_cache,
        "nnsight_trace": nnsight_trace,
    }[method]
    fn()  # warm-up
    times, peaks = [], []
    for _ in range(repeats):
        with PeakRSS() as mem:
            t = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t)
        peaks.append(mem.extra_mb)
    return {"method": method, "seconds": float(np.median(times)), "peak_extra_mb": max(peaks)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=int, default=2048)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/interp-bench"))
    ap.add_argument("--method", help=argparse.SUPPRESS)
    args = ap.parse_args()
    path = make_model(args.workdir)
    if args.method:
        print(json.dumps(run_one(args.method, path, args.prompts, args.batch_size, args.repeats)))
        return
    rows = []
    for m in METHODS:
        out = subprocess.run(
            [
                sys.executable,
                __file__,
                "--method",
                m,
                "--prompts",
                str(args.prompts),
                "--batch-size",
                str(args.batch_size),
                "--repeats",
                str(args.repeats),
                "--workdir",
                str(args.workdir),
            ],
            capture_output=True,
            text=True,
            check=True,
        )
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    floor = rows[0]["seconds"]
    print(f"capture of 6 x hook_resid_post at the last token, {args.prompts} prompts, batch {args.batch_size}")
    print(f"{'method':<26}{'seconds':>9}{'x bare forward':>16}{'peak extra MB':>15}")
    for r in rows:
        print(f"{r['method']:<26}{r['seconds']:>9.3f}{r['seconds'] / floor:>16.2f}{r['peak_extra_mb']:>15.1f}")


if __name__ == "__main__":
    main()
