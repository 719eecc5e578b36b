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
over serial, and how many held-out predictions differ from the serial run's; then it runs the
serial stage once more with its matrix products counted, for the stage's ceiling (below). With
``--reference DIR`` (a checkout of an earlier version: ``git worktree add DIR REV``) it also times
that version's serial stage and this one's from the same earlier stages, each in a fresh process
that imports its own code, and takes every speed-up against the earlier version: the
one-at-a-time loop before a change, side by side.

The step table gives milliseconds per job-step, each way's speed-up over serial, and the step's
**ceiling**: the most any program of the same arithmetic could gain over serial on these cores.
``torch.utils.flop_counter`` counts the step's matrix products (forward and backward; attention's
where it runs as matrix products, as in the eager attention the project loads models with); the
**floor** is the time the body's products (the read-out's left out) take with each shape at its
fastest measured rate on these cores (torch's own kernel alone or batched over 4 or 16 jobs'
copies, or oneDNN's, which on the AMD cores we measured runs twice as fast as torch's BLAS),
plus AdamW's update of every trainable parameter at torch's fused kernel's rate, with every other
operation (norms, activations, softmax, indexing, Python) free; ceiling = serial / floor. A
speed-up target above the ceiling cannot be met by batching, processes, fusing or compiling with
the kernels torch has, only by doing less arithmetic or with faster kernels. The models: the world
model (4 layers, d_model 128, the study's default) and MiniLM (6 layers, d_model 384, BERT; its
loss read out at the last position through the input embeddings, as the study's masked slot
does).

    python benchmarks/finetunes.py [--jobs 8] [--steps 10] [--models world,minilm]
    python benchmarks/finetunes.py --stage [--stage-jobs 16] [--models world,minilm] [--reference DIR]
    python benchmarks/finetunes.py --study [--models world]

``--study`` counts the matrix products of a whole ``interp study`` (serial, default
configuration) and prints the study's floor on these cores: its body's products at their
fastest measured rate and its fine-tunes' AdamW updates at the fused kernel's rate.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from collections import Counter

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


def _kwargs(name: str, ids) -> dict:
    """The forward's keyword arguments. The world model: an attention mask, and its head's read-out
    at the last position only, where the label is predicted (as the study's fine-tunes read out,
    :meth:`interp.models.Model.forward`'s ``positions``). BERT: no attention mask, since its
    HuggingFace mask builder branches on the mask's values (``padding_mask.all()``), which vmap
    cannot trace; these batches are unpadded."""
    import torch

    return {"attention_mask": torch.ones_like(ids), "logits_to_keep": 1} if name == "world" else {}


def serial_steps(name: str, jobs: int, steps: int, threads: int, subset=None) -> float:
    """Seconds per job-step, one job after another (each its own module copy and optimizer)."""
    import copy

    import torch

    torch.set_num_threads(threads)
    model, module, ids, targets = _setup(name, jobs)
    loss_of = _loss_fn(name, model)
    which = list(subset if subset is not None else range(jobs))
    copies = [copy.deepcopy(module) for _ in which]
    from lab.study.finetune import adamw  # the study's optimizer

    opts = [adamw([p for p in c.parameters() if p.requires_grad], 1e-4, 0.0) for c in copies]

    def step(k, j):
        out = copies[k](input_ids=ids[j], **_kwargs(name, ids[j]))
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
    from lab.study.finetune import adamw

    opt = adamw(list(stacked.values()), 1e-4, 0.0)

    def one(params, x, y):
        out = functional_call(module, {**frozen, **params}, (x,), _kwargs(name, x))
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


def matmul_work(fn, vocab: int) -> tuple[float, float, Counter]:
    """The matrix products that ``fn()`` computes, forward and backward, as
    ``torch.utils.flop_counter`` counts them (2 x m x n x k a product; fused attention kernels are
    not counted, eager attention's products are): GFLOP
    of the body, GFLOP of the read-out (a product with a vocabulary-sized dimension: the
    unembedding at every position, the masked slot's tied read-out, their input gradients), and
    how often the body computed each product shape (the two operands' shapes)."""
    import torch
    from torch.utils import flop_counter as fc

    head, shapes = [0], Counter()

    def split(formula, first):  # ``first``: where the two matrix operands start in the arguments
        def counted(*args, out_val=None, **kwargs):
            flops = formula(*args, out_val=out_val, **kwargs)
            x, y = args[first : first + 2]
            if vocab in x.shape[-2:] or vocab in y.shape[-2:]:
                head[0] += flops
                return 0
            shapes[(tuple(x.shape), tuple(y.shape))] += 1
            return flops

        counted._get_raw = True  # given the tensors (the registry's formulas take their shapes)
        return counted

    aten = torch.ops.aten
    mapping = {
        aten.mm: split(fc.mm_flop, 0),
        aten.bmm: split(fc.bmm_flop, 0),
        aten.addmm: split(fc.addmm_flop, 1),
        aten.baddbmm: split(fc.baddbmm_flop, 1),
    }
    with fc.FlopCounterMode(display=False, custom_mapping=mapping) as counter:
        fn()
    return counter.get_total_flops() / 1e9, head[0] / 1e9, shapes


def best_seconds(fn, rounds: int) -> float:
    """The fastest of ``rounds`` timings of ``fn()``, after one untimed call (warm-up)."""
    fn()
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def onednn_product():
    """A 2-d fp32 product ``x @ w.T`` through oneDNN (the kernel torch's CPU inference graphs use),
    or None where torch has no oneDNN. On some CPUs it is far faster than the BLAS torch's own
    matmul calls (measured on this machine's AMD cores: about twice MKL's rate at every shape
    here), so a floor must take the better of the two."""
    import torch

    if not torch.backends.mkldnn.is_available():
        return None
    try:
        op = torch.ops.mkldnn._linear_pointwise
        op(torch.ones(2, 2), torch.ones(2, 2), None, "none", [], "")
    except (AttributeError, RuntimeError):
        return None
    return lambda x, w: op(x, w, None, "none", [], "")


def floor_seconds(body_gflop: float, shapes: Counter, peak: float, rounds: int = 3) -> float:
    """The least time the body's matrix products take on these cores with the kernels torch has:
    every product shape replayed in its fastest measured form (torch's own ``bmm`` alone or over
    4 or 16 jobs' copies, as a group of fine-tunes runs it, or, for a 2-d product, oneDNN's
    kernel), timed per job, best of ``rounds``; products the counter saw but not as a matrix
    product at the peak rate. Everything else the step does (norms, activations, softmax,
    AdamW, indexing, Python) counts as free."""
    import torch

    onednn = onednn_product()
    seconds, replayed = 0.0, 0.0
    for (a, b), n in shapes.items():
        flops = 2 * math.prod(a) * b[-1]
        best = float("inf")
        for g in (1, 4, 16):
            if g > 1 and g * flops > 4e9:  # large enough alone; skip a copy that only costs memory
                break
            x = torch.randn(g * a[0], *a[1:]) if len(a) == 3 else torch.randn(g, *a)
            y = torch.randn(g * b[0], *b[1:]) if len(b) == 3 else torch.randn(g, *b)
            best = min(best, best_seconds(lambda: torch.bmm(x, y), rounds) / g)
        if onednn is not None and len(a) == 2:
            x, w = torch.randn(*a), torch.randn(b[1], b[0])
            best = min(best, best_seconds(lambda: onednn(x, w), rounds))
        seconds += n * best
        replayed += n * flops / 1e9
    return seconds + max(0.0, body_gflop - replayed) / peak


def adamw_seconds(updates: int, size: int, rounds: int = 5) -> float:
    """The least time ``updates`` AdamW parameter updates take here: torch's fused AdamW kernel
    (its fastest) on one flat parameter of ``size`` elements (one job's) and of 16 x ``size`` (a
    group's stacked copies), the better time per element, times ``updates``. Every fine-tune
    updates each trainable parameter with AdamW at every step, whatever runs it."""
    import torch

    best = float("inf")
    for n in (size, 16 * size) if 16 * size <= 2**25 else (size,):  # 16 copies of a large model: memory only
        param = torch.nn.Parameter(torch.zeros(n))
        param.grad = torch.randn(n)
        opt = torch.optim.AdamW([param], lr=1e-4, fused=True)
        best = min(best, best_seconds(opt.step, rounds) / n)  # the warm-up step allocates the moments
    return updates * best


def runs_updates(runs) -> tuple[int, int]:
    """Parameter updates (steps x trainable parameters, summed) of a study's saved fine-tunes, and
    the most trainable parameters one of them has."""
    facts = [json.loads(f.read_text()) for f in runs.glob("*.json")]
    facts = [f for f in facts if f.get("status") == "done"]
    if not facts:
        raise ValueError(f"no finished fine-tune in {runs}: nothing to count")
    return sum(f["steps"] * f["trainable_params"] for f in facts), max(f["trainable_params"] for f in facts)


def step_work(name: str) -> tuple[float, float, Counter]:
    """:func:`matmul_work` of one serial training step."""
    import copy

    from lab.study.finetune import adamw

    model, module, ids, targets = _setup(name, 1)
    loss_of = _loss_fn(name, model)
    module = copy.deepcopy(module)
    opt = adamw([p for p in module.parameters() if p.requires_grad], 1e-4, 0.0)

    def step():
        loss_of(module(input_ids=ids[0], **_kwargs(name, ids[0])), targets[0]).backward()
        opt.step()
        opt.zero_grad()

    return matmul_work(step, model.input_embeddings().shape[0])


def step_trainable(name: str) -> int:
    """Trainable parameters of one fine-tune in the step benchmark (embedding tables frozen)."""
    _, module, _, _ = _setup(name, 1)
    return sum(p.numel() for p in module.parameters() if p.requires_grad)


def peak_gflops(threads: int, n: int = 1536, repeats: int = 10, rounds: int = 5, blas_only: bool = False) -> float:
    """This machine's fp32 matmul rate on one large square product (``threads`` threads), the
    best of ``rounds`` timings (a ceiling must not be lowered by a slow first round) and of the
    two kernels torch has (its BLAS, and oneDNN where it has it: :func:`onednn_product`);
    ``blas_only``: torch's own matmul alone, for comparison."""
    import torch

    torch.set_num_threads(threads)
    a, b = torch.randn(n, n), torch.randn(n, n)
    onednn = None if blas_only else onednn_product()
    products = [torch.mm] + ([onednn] if onednn is not None else [])
    best = min(best_seconds(lambda p=p: [p(a, b) for _ in range(repeats)], rounds) for p in products)
    return 2 * n**3 * repeats / best / 1e9


def checkout_stage(checkout: str, model: str, out, jobs: int, threads: int) -> float:
    """Seconds the serial fine-tuning stage takes with the project's code at ``checkout`` (this
    one, or an earlier version from ``git worktree add``), run in a fresh process that imports
    from there, from the finished earlier stages in ``out``: resumed once untimed (imports, the
    model, the saved stages: what the in-process executors find done), then the stage timed."""
    run = f"run_study({model!r}, out={str(out)!r}, config=default_config({model!r}), progress=False"
    code = (  # warmed up as the in-process executors are: the finished earlier stages resumed once
        "import time; from lab.executors import SerialExecutor; from lab.study import run_study; "
        f"from lab.study.run import default_config; {run}, max_jobs=0); t = time.perf_counter(); "
        f"{run}, max_jobs={jobs}, executor=SerialExecutor(threads={threads})); print(time.perf_counter() - t)"
    )
    env = {**os.environ, "PYTHONPATH": os.path.abspath(checkout)}
    done = subprocess.run([sys.executable, "-c", code], env=env, cwd=checkout, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"the serial stage at {checkout} failed:\n{done.stderr[-2000:]}")
    return float(done.stdout.strip().splitlines()[-1])


def stage(name: str, jobs: int, reference: str | None = None) -> None:
    """The study's fine-tuning stage on every executor (module docstring); with ``reference`` (a
    checkout of an earlier version), its serial stage too, timed in the same sitting."""
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
    handle = interp.load_model(model)
    refused = group_refusal(handle, "full", config.finetune.for_model(handle))

    def in_process(ex):
        def run(out) -> float:
            start = time.perf_counter()
            run_study(model, out=out, config=config, progress=False, max_jobs=jobs, executor=ex)
            return time.perf_counter() - start

        return run

    kept = {label: ex for label, ex in executors.items() if not (refused and label.startswith("grouped"))}
    runners = {label: in_process(ex) for label, ex in kept.items()}
    fresh = {}
    if reference is not None:  # both versions' serial stages in fresh processes, the same way
        here = str(Path(__file__).resolve().parents[1])
        fresh = {f"serial ({Path(reference).name}, fresh process)": reference, "serial (fresh process)": here}
        for label, checkout in fresh.items():
            runners[label] = lambda out, checkout=checkout: checkout_stage(checkout, model, out, jobs, threads)
    times, preds = {}, {}
    for label, run in runners.items():
        out = root / label.replace(" ", "_")
        shutil.copytree(root / "base", out)
        times[label] = run(out)
        runs = sorted((out / "runs").glob("*.json"))
        preds[label] = [p["predicted_label"] for f in runs for p in json.loads(f.read_text())["predictions"]]
    times = {k: times[k] for k in [*fresh, *runners]}  # the reference first: the speed-ups' baseline
    print(f"\n{name}: the study's first {jobs} fine-tunes ({threads} cores; seconds, lower is faster)")
    rows = []
    base = next(iter(times))  # the reference's one-at-a-time loop when given, else this version's
    for label, t in times.items():
        same = pd.Series(preds[label]) == pd.Series(preds[base])
        rows.append(
            {
                "executor": label,
                "seconds": round(t, 1),
                "speed-up": f"{times[base] / t:.2f}x",
                f"predictions differing from {base}": f"{int((~same).sum())} of {len(same)}",
            }
        )
    print(pd.DataFrame(rows).to_string(index=False))
    shutil.copytree(root / "base", root / "counted")  # the serial run again, its matrix products counted
    body, readout, shapes = matmul_work(
        lambda: run_study(
            model, out=root / "counted", config=config, progress=False, max_jobs=jobs, executor=executors["serial"]
        ),
        handle.input_embeddings().shape[0],
    )
    peak = peak_gflops(threads)
    products = floor_seconds(body, shapes, peak)
    optimizer = adamw_seconds(*runs_updates(root / "counted" / "runs"))
    floor = products + optimizer
    print(
        f"matrix products of the serial run: body {body:.1f} GFLOP ({len(shapes)} shapes), read-out {readout:.1f} "
        f"GFLOP. The body's, each shape at its fastest measured rate here, take {products:.1f} s "
        f"({body / products:.1f} GFLOP/s; peak {peak:.1f}); AdamW's updates at the fused kernel's rate "
        f"{optimizer:.1f} s. Floor {floor:.1f} s: ceiling {times['serial'] / floor:.2f}x, the most any executor "
        "of this arithmetic could gain over serial here"
    )
    if refused:
        print(f"grouped: refused ({refused.split(';')[0]})")
    shutil.rmtree(root, ignore_errors=True)


def study_floor(name: str) -> None:
    """The matrix products of the whole ``interp study`` (default configuration, serial) counted:
    its earlier stages (readability, baselines, the pretrained answers) and its fine-tunes with
    the summary, and how long the body's products take at their fastest measured rate here (with
    the fine-tunes' AdamW updates at the fused kernel's rate): no program of this arithmetic
    finishes the study on these cores in less."""
    import tempfile
    from pathlib import Path

    import interp
    from lab.study import run_study
    from lab.study.run import default_config

    threads = os.cpu_count() or 1
    model = "world" if name == "world" else "minilm"
    config = default_config(model)
    vocab = interp.load_model(model).input_embeddings().shape[0]
    out = Path(tempfile.mkdtemp(prefix="study-floor-"))
    parts = {
        "earlier stages": lambda: run_study(model, out=out, config=config, progress=False, max_jobs=0),
        "fine-tunes and summary": lambda: run_study(model, out=out, config=config, progress=False),
    }
    peak = peak_gflops(threads)
    print(f"\n{name}: interp study's matrix products (peak fp32 matmul {peak:.1f} GFLOP/s on {threads} cores)")
    total = 0.0
    for label, run in parts.items():
        body, readout, shapes = matmul_work(run, vocab)
        floor = floor_seconds(body, shapes, peak)
        if label.startswith("fine-tunes"):
            floor += adamw_seconds(*runs_updates(out / "runs"))
        total += floor
        print(f"{label:24} body {body:9.1f} GFLOP  read-out {readout:8.1f} GFLOP  floor {floor / 60:5.2f} min")
    print(f"{'the study':24} floor {total / 60:.2f} min (products and AdamW at their fastest, the rest free)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=8)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--models", default="world,minilm")
    ap.add_argument("--stage", action="store_true", help="time the study's fine-tuning stage on each executor")
    ap.add_argument("--stage-jobs", type=int, default=16)
    ap.add_argument(
        "--reference",
        help="with --stage: a checkout of an earlier version (git worktree add DIR REV) whose serial stage is "
        "timed too, and the speed-ups taken against it",
    )
    ap.add_argument("--study", action="store_true", help="count the whole study's matrix products: its floor")
    args = ap.parse_args()
    if args.study:
        for name in args.models.split(","):
            study_floor(name)
        return
    if args.stage:
        for name in args.models.split(","):
            stage(name, args.stage_jobs, args.reference)
        return
    threads = os.cpu_count() or 1
    peak = peak_gflops(threads)
    print(f"{args.jobs} fine-tunes x {args.steps} steps, {threads} cores; ms per job-step (lower is faster)")
    print(
        f"peak fp32 matmul on these cores: {peak:.1f} GFLOP/s (the faster of oneDNN and torch's BLAS; "
        f"torch's own matmul: {peak_gflops(threads, blas_only=True):.1f})\n"
    )
    head = ("serial", 9), ("processes", 10), ("batched", 9), ("proc/ser", 9), ("batch/ser", 10), ("GFLOP", 7)
    head += (("GFLOP/s", 8), ("floor", 7), ("ceiling", 8))
    print(f"{'model':8} " + " ".join(f"{h:>{w}}" for h, w in head))
    for name in args.models.split(","):
        s = serial_steps(name, args.jobs, args.steps, threads)
        p = process_steps(name, args.jobs, args.steps)
        b = batched_steps(name, args.jobs, args.steps, threads)
        body, readout, shapes = step_work(name)
        trainable = step_trainable(name)
        floor = floor_seconds(body, shapes, peak) + adamw_seconds(trainable, trainable)
        print(
            f"{name:8} {s * 1e3:9.1f} {p * 1e3:10.1f} {b * 1e3:9.1f} {s / p:8.2f}x {s / b:9.2f}x {body + readout:7.2f}"
            f" {(body + readout) / s:8.1f} {floor * 1e3:7.1f} {s / floor:7.2f}x"
        )
    print(
        "\nspeed-up > 1: faster than serial. GFLOP: the step's matrix products, forward and backward "
        "(torch.utils.flop_counter), read-out included; GFLOP/s: the serial step's rate of them. floor: "
        "the body's matrix products alone (the read-out left out), each shape at its fastest measured rate "
        "on these cores (torch's kernel alone or batched over 4 or 16 jobs, or oneDNN's), plus AdamW's update "
        "of every trainable parameter "
        "at torch's fused kernel's rate, ms per job-step; "
        "ceiling: serial / floor, the most any program of this arithmetic (batched, in processes, fused; "
        "everything but those free) could gain over serial on these cores."
    )


if __name__ == "__main__":
    main()
