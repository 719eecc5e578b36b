"""Benchmark: how fast can a study's fine-tunes go on this machine, one at a time or many at once?

A study trains hundreds of small fine-tunes of one model. Three ways to run ``G`` of them for a
training step each, side by side on the same shapes (the study's: a batch of 32 prompts):

1. **serial**: one job's step after another (forward, backward, AdamW), all torch threads;
2. **processes**: two processes with one thread each, each stepping half the jobs (what
   ``run_study(executor=ProcessExecutor(2))`` does);
3. **batched**: one program for the whole group: the trainable parameters stacked ``[G, ...]``,
   the forward pass ``torch.func.vmap`` of ``torch.func.functional_call`` over the jobs, one
   backward, AdamW on the stacked tensors (elementwise, so each job's slice is updated exactly as
   its own optimizer would).

``--stage`` measures what a user waits for instead: the study's own fine-tuning stage (the first
``--stage-jobs`` jobs of ``interp study``'s design, full and LoRA, with their checks, early
stopping and held-out evaluation), run by ``run_study`` on each executor from the same finished
earlier stages: ``serial`` (all threads), ``processes`` (two one-thread processes), ``grouped``
(fine-tunes trained as groups, :mod:`interp.grouped`, all threads) and ``grouped+processes`` (two
one-thread processes, each training a group). It prints the wall time, each executor's speed-up
over serial, and how many held-out predictions differ from the serial run's.

It prints milliseconds per job-step, each way's speed-up over serial, and the arithmetic rate
the serial step reaches (6 x trainable-path parameters x tokens per second: forward plus
backward), which says whether the step is bound by per-operation overhead (batching helps) or
by arithmetic (it cannot). The models: the world model (4 layers, d_model 128, the study's
default) and MiniLM (6 layers, d_model 384, BERT; its loss read out at the last position through
the input embeddings, as the study's masked slot does).

    python benchmarks/finetunes.py [--jobs 8] [--steps 10] [--models world,minilm]
    python benchmarks/finetunes.py --stage [--stage-jobs 16] [--models world,minilm]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("TQDM_DISABLE", "1")

SHAPES = {"world": (32, 14), "minilm": (32, 16)}  # batch, tokens: the study's fine-tuning batches


def _setup(name: str, jobs: int, seed: int = 0):
    import torch

    import interp

    model = interp.load_model("world" if name == "world" else "minilm")
    module = model.hf_model
    module.train()
    for m in module.modules():  # the study freezes the embedding tables (lab.study.finetune)
        if isinstance(m, torch.nn.Embedding):
            m.weight.requires_grad_(False)
    batch, tokens = SHAPES[name]
    gen = torch.Generator().manual_seed(seed)
    vocab = model.input_embeddings().shape[0]
    ids = torch.randint(5, min(vocab, 1000), (jobs, batch, tokens), generator=gen)
    targets = torch.randint(5, min(vocab, 1000), (jobs, batch), generator=gen)
    return model, module, ids, targets


def _loss_fn(name: str, model):
    """The loss of one job's batch, from the module's outputs (a forward function's result)."""
    import torch.nn.functional as F

    embeddings = model.input_embeddings()

    def loss(out, y):
        if name == "world":  # a causal LM: the label token after the prompt
            return F.cross_entropy(out.logits[:, -1], y)
        return F.cross_entropy(out.last_hidden_state[:, -1] @ embeddings.detach().T, y)  # masked slot read-out

    return loss


def _mask(name: str, ids) -> dict:
    """The attention mask argument: none for BERT, whose HuggingFace mask builder branches on the
    mask's values (``padding_mask.all()``), which vmap cannot trace; these batches are unpadded."""
    import torch

    return {"attention_mask": torch.ones_like(ids)} if name == "world" else {}


def serial_steps(name: str, jobs: int, steps: int, threads: int, subset=None) -> float:
    """Seconds per job-step, one job after another (each its own module copy and optimizer)."""
    import copy

    import torch

    torch.set_num_threads(threads)
    model, module, ids, targets = _setup(name, jobs)
    loss_of = _loss_fn(name, model)
    which = list(subset if subset is not None else range(jobs))
    copies = [copy.deepcopy(module) for _ in which]
    opts = [torch.optim.AdamW([p for p in c.parameters() if p.requires_grad], lr=1e-4) for c in copies]

    def step(k, j):
        out = copies[k](input_ids=ids[j], **_mask(name, ids[j]))
        loss_of(out, targets[j]).backward()
        opts[k].step()
        opts[k].zero_grad()

    for k, j in enumerate(which):  # warm-up
        step(k, j)
    start = time.perf_counter()
    for _ in range(steps):
        for k, j in enumerate(which):
            step(k, j)
    return (time.perf_counter() - start) / (steps * len(which))


def batched_steps(name: str, jobs: int, steps: int, threads: int) -> float:
    """Seconds per job-step, the group as one vmapped program."""
    import torch
    from torch.func import functional_call, vmap

    torch.set_num_threads(threads)
    model, module, ids, targets = _setup(name, jobs)
    loss_of = _loss_fn(name, model)
    frozen = {k: v.detach() for k, v in module.named_parameters() if not v.requires_grad}
    frozen.update(dict(module.named_buffers()))
    stacked = {
        k: v.detach().unsqueeze(0).repeat(jobs, *[1] * v.dim()).requires_grad_(True)
        for k, v in module.named_parameters()
        if v.requires_grad
    }
    opt = torch.optim.AdamW(list(stacked.values()), lr=1e-4)

    def one(params, x, y):
        out = functional_call(module, {**frozen, **params}, (x,), _mask(name, x))
        return loss_of(out, y)

    group_loss = vmap(one, in_dims=(0, 0, 0), randomness="different")  # dropout: its own mask per job

    def step():
        group_loss(stacked, ids, targets).sum().backward()  # each job's gradient lands in its own slice
        opt.step()
        opt.zero_grad()

    step()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    return (time.perf_counter() - start) / (steps * jobs)


def process_steps(name: str, jobs: int, steps: int) -> float:
    """Seconds per job-step with two one-thread processes, each stepping half the jobs."""
    halves = [list(range(0, jobs, 2)), list(range(1, jobs, 2))]
    code = (
        "import sys, json; sys.path.insert(0, {here!r}); from finetunes import serial_steps; "
        "print(json.dumps(serial_steps({name!r}, {jobs}, {steps}, 1, {subset})))"
    )
    here = os.path.dirname(os.path.abspath(__file__))
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code.format(here=here, name=name, jobs=jobs, steps=steps, subset=h)],
            stdout=subprocess.PIPE,
            text=True,
        )
        for h in halves
    ]
    per = [float(p.communicate()[0].strip().splitlines()[-1]) for p in procs]
    # both ran at once: the group's wall time per job-step is each process's time per step over two
    return max(per) / 2


def flops_per_step(name: str) -> float:
    import interp

    model = interp.load_model("world" if name == "world" else "minilm")
    trainable = sum(p.numel() for n, p in model.hf_model.named_parameters() if "embeddings" not in n and "wte" not in n)
    trainable -= sum(p.numel() for n, p in model.hf_model.named_parameters() if "wpe" in n)
    batch, tokens = SHAPES[name]
    return 6 * trainable * batch * tokens


def peak_gflops(threads: int, n: int = 1536, repeats: int = 10, rounds: int = 5) -> float:
    """This machine's fp32 matmul rate on one large square product (``threads`` threads), the
    best of ``rounds`` timings (a ceiling must not be lowered by a slow first round): the ceiling
    for any schedule of a step that is nothing but matmuls."""
    import torch

    torch.set_num_threads(threads)
    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b  # warm-up
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(repeats):
            a @ b
        best = min(best, time.perf_counter() - start)
    return 2 * n**3 * repeats / best / 1e9


def stage(name: str, jobs: int) -> None:
    """The study's fine-tuning stage on every executor (module docstring)."""
    import math
    import shutil
    import tempfile
    from pathlib import Path

    import pandas as pd

    import interp
    from lab.executors import GroupedExecutor, ProcessExecutor, SerialExecutor
    from lab.study import run_study
    from lab.study.finetune import group_refusal
    from lab.study.run import default_config

    threads = os.cpu_count() or 1
    model = "world" if name == "world" else "minilm"
    config = default_config(model)
    root = Path(tempfile.mkdtemp(prefix="finetune-stage-"))
    run_study(model, out=root / "base", config=config, progress=False, max_jobs=0)  # readability, baselines, ...
    executors = {
        "serial": SerialExecutor(threads=threads),
        "processes": ProcessExecutor(2),
        "grouped": GroupedExecutor(size=jobs, inner=SerialExecutor(threads=threads)),
        "grouped+processes": GroupedExecutor(size=math.ceil(jobs / 2), inner=ProcessExecutor(2)),
    }
    refused = group_refusal(interp.load_model(model), "full", config.finetune.for_model(interp.load_model(model)))
    times, preds = {}, {}
    for label, ex in executors.items():
        if refused and label.startswith("grouped"):
            continue
        out = root / label
        shutil.copytree(root / "base", out)
        start = time.perf_counter()
        run_study(model, out=out, config=config, progress=False, max_jobs=jobs, executor=ex)
        times[label] = time.perf_counter() - start
        runs = sorted((out / "runs").glob("*.json"))
        preds[label] = [p["predicted_label"] for f in runs for p in json.loads(f.read_text())["predictions"]]
    print(f"\n{name}: the study's first {jobs} fine-tunes ({threads} cores; seconds, lower is faster)")
    rows = []
    for label, t in times.items():
        same = pd.Series(preds[label]) == pd.Series(preds["serial"])
        rows.append(
            {
                "executor": label,
                "seconds": round(t, 1),
                "speed-up": f"{times['serial'] / t:.2f}x",
                "predictions differing from serial": f"{int((~same).sum())} of {len(same)}",
            }
        )
    print(pd.DataFrame(rows).to_string(index=False))
    if refused:
        print(f"grouped: refused ({refused.split(';')[0]})")
    shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=8)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--models", default="world,minilm")
    ap.add_argument("--stage", action="store_true", help="time the study's fine-tuning stage on each executor")
    ap.add_argument("--stage-jobs", type=int, default=16)
    args = ap.parse_args()
    if args.stage:
        for name in args.models.split(","):
            stage(name, args.stage_jobs)
        return
    threads = os.cpu_count() or 1
    peak = peak_gflops(threads)
    print(f"{args.jobs} fine-tunes x {args.steps} steps, {threads} cores; ms per job-step (lower is faster)")
    print(f"peak fp32 matmul on these cores: {peak:.1f} GFLOP/s\n")
    head = ("serial", 9), ("processes", 10), ("batched", 9), ("proc/ser", 9), ("batch/ser", 10), ("GFLOP/s", 8)
    head += (("ceiling", 8),)
    print(f"{'model':8} " + " ".join(f"{h:>{w}}" for h, w in head))
    for name in args.models.split(","):
        s = serial_steps(name, args.jobs, args.steps, threads)
        p = process_steps(name, args.jobs, args.steps)
        b = batched_steps(name, args.jobs, args.steps, threads)
        rate = flops_per_step(name) / s / 1e9
        print(
            f"{name:8} {s * 1e3:9.1f} {p * 1e3:10.1f} {b * 1e3:9.1f} {s / p:8.2f}x {s / b:9.2f}x {rate:8.1f}"
            f" {peak / rate:7.2f}x"
        )
    print(
        "\nspeed-up > 1: faster than serial. GFLOP/s: the serial step's arithmetic rate (6 x trainable "
        "parameters x tokens per second). ceiling: peak / that rate, the most any schedule of the same "
        "arithmetic (batched, in processes, fused) could gain over serial on these cores."
    )


if __name__ == "__main__":
    main()
