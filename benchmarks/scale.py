"""Benchmark: every analyzer at the size users bring, each figure a ratio to its floor and to peers.

Random-weight models of realistic shape, built from configs (no download):

- ``gpt2-small``: GPT-2 small (12 layers, d_model 768, 12 heads, vocab 50,257; 124M parameters);
- ``llama-small``: a Llama-style model of similar size (12 layers, d_model 768, 12 query heads
  over 4 key/value heads (grouped-query attention), RoPE, RMSNorm, SwiGLU; vocab 32,000);
- ``llama-1b``: Llama-3.2-1B's shape (16 layers, d_model 2,048, 32 query heads over 8 key/value
  heads, intermediate 8,192) with a 32k vocabulary, 1.1B parameters: for a GPU
  (``benchmarks/gpu.sh``).

Each row runs in its own process (a warm-up, then the median of ``--repeats`` timed runs) and
reports wall time and peak memory (resident-set growth on the CPU, sampled every 2 ms;
``torch.cuda.max_memory_allocated`` on a GPU) beside its floor and the peers in the same run:

- capture: ``hook_resid_post`` of all layers / of layer 2 only, 128 prompts; floor: a bare
  forward; peers: TransformerLens ``run_with_cache(names_filter, stop_at_layer)``, an nnsight
  trace (with ``tracer.stop()``);
- eap: ``AttributionPatching.edges`` (EAP), 16 pairs; floor: forward + backward;
- eap_ig: EAP-IG-inputs, 5 steps; floor: 5 x (forward + backward);
- path: ``PathPatching``, every sender -> logits; floor: one forward per sender;
- faithfulness: 4 sizes x (EAP + 2 random circuits), batch 4 and 64 rows per pass; floor: one
  forward per circuit;
- probes: ``ProbeSweep``, 4 relations x 12 layers x 5 folds; peer: the scikit-learn loop
  (StandardScaler + LogisticRegression, lbfgs).

    python benchmarks/scale.py [--shape gpt2-small|llama-small|both] [--rows capture,eap,...]
                               [--device cpu|cuda] [--dtype float32|bfloat16] [--repeats 3]
                               [--auto-circuit-python PATH] [--pyvene-python PATH]

- activation: ``ActivationPatching`` of ``resid_pre`` at every (layer, position), 4 pairs; floor:
  one forward per cell; peers: TransformerLens ``patching.get_act_patch_resid_pre`` (one forward
  per cell) and, with ``--pyvene-python``, pyvene's ``VanillaIntervention`` on ``block_input``
  (its own environment: ``benchmarks/peers/pyvene_peer.py``).

auto-circuit (edge attribution and circuit evaluation) pins ``kaleido==0.2.1``, which the
project's plots cannot use, so it runs in an environment of its own:
``--auto-circuit-python .venv-auto-circuit/bin/python`` (built as
``benchmarks/peers/auto_circuit_peer.py`` says) adds its rows at GPT-2-small shape.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("TQDM_DISABLE", "1")

ROWS = ("capture", "eap", "eap_ig", "activation", "path", "faithfulness", "probes")
SHAPES = ("gpt2-small", "llama-small", "llama-1b")
N_WORDS = {"gpt2-small": 50257, "llama-small": 32000, "llama-1b": 32000}
LLAMA = {  # hidden, intermediate, layers, query heads, key/value heads
    "llama-small": (768, 2048, 12, 12, 4),
    "llama-1b": (2048, 8192, 16, 32, 8),  # Llama-3.2-1B's shape with a 32k vocabulary: 1.1B parameters
}


# models -----------------------------------------------------------------------------------------
def make_model(shape: str, root: Path) -> Path:
    """A random-weight model of ``shape`` with a word-level tokenizer, saved once under ``root``."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

    from lab.world.tokenizer import build_tokenizer

    path = root / shape
    if (path / "config.json").exists():
        return path
    tok = build_tokenizer([f"w{i}" for i in range(N_WORDS[shape] - 4)])  # + 4 special tokens
    torch.manual_seed(0)
    if shape == "gpt2-small":
        model = GPT2LMHeadModel(GPT2Config(vocab_size=len(tok), n_positions=1024))
    else:
        hidden, intermediate, layers, heads, kv_heads = LLAMA[shape]
        cfg = LlamaConfig(
            vocab_size=len(tok),
            hidden_size=hidden,
            intermediate_size=intermediate,
            num_hidden_layers=layers,
            num_attention_heads=heads,
            num_key_value_heads=kv_heads,
            max_position_embeddings=1024,
        )
        model = LlamaForCausalLM(cfg)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


def words(rng: random.Random, n: int) -> list[str]:
    return [f"w{rng.randrange(5, 30000)}" for _ in range(n)]


def make_pairs_for(model, n_pairs: int, n_pos: int):
    """``n_pairs`` clean/corrupted prompts of ``n_pos`` words differing in one word."""
    from circuits import make_pairs

    rng = random.Random(0)
    clean, corrupted, answer, wrong = [], [], [], []
    for _ in range(n_pairs):
        text = words(rng, n_pos)
        other = list(text)
        other[n_pos // 2] = words(rng, 1)[0]
        clean.append(" ".join(text))
        corrupted.append(" ".join(other))
        answer.append(words(rng, 1)[0])
        wrong.append(words(rng, 1)[0])
    return make_pairs(model, clean, corrupted, answer=answer, wrong=wrong)


# measurement ------------------------------------------------------------------------------------
def _release_freed_memory() -> None:
    """Return the C allocator's freed pages to the OS (glibc ``malloc_trim``), so that resident
    memory grows with what a row allocates, not less; a no-op where there is no glibc."""
    import ctypes
    import gc

    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


class PeakMemory:
    """Peak memory growth (MB) while inside: CUDA's allocator on a GPU, resident memory on the CPU
    (sampled every 2 ms by ``benchmarks/capture.py``'s ``PeakRSS``, after freed memory is returned
    to the OS)."""

    def __init__(self, device: str):
        self.device = device

    def __enter__(self):
        import torch

        if self.device.startswith("cuda"):
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self.start = torch.cuda.memory_allocated()
        else:
            from capture import PeakRSS  # benchmarks/ is on the path when this script runs

            _release_freed_memory()  # else memory freed by earlier work is reused unseen by the RSS
            self.rss = PeakRSS().__enter__()
        return self

    def __exit__(self, *exc):
        import torch

        if self.device.startswith("cuda"):
            torch.cuda.synchronize()
            self.mb = (torch.cuda.max_memory_allocated() - self.start) / 2**20
        else:
            self.rss.__exit__(*exc)
            self.mb = self.rss.extra_mb


def measure(fn, repeats: int, device: str, warm_up: bool = True) -> tuple[float, float]:
    """Median seconds and the largest peak memory (MB) over ``repeats`` runs, after a warm-up
    (rows that take minutes skip it: their first-call overhead is a small share)."""
    import torch

    if warm_up:
        fn()
    times, peaks = [], []
    for _ in range(repeats):
        with PeakMemory(device) as mem:
            t = time.perf_counter()
            fn()
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            times.append(time.perf_counter() - t)
        peaks.append(mem.mb)
    return statistics.median(times), max(peaks)


def once(fn, args):
    """``(fn(), seconds, peak MB)`` of a single run, no warm-up: for rows that take minutes."""
    out = {}
    t, mb = measure(lambda: out.setdefault("value", fn()), 1, args.device, warm_up=False)
    return out["value"], t, mb


# rows -------------------------------------------------------------------------------------------
def floors(model, pairs, repeats, device):
    """A bare forward, and a forward + backward to the input embeddings, of the pairs' clean batch."""
    import torch

    hf = model.backend.hf_model
    b = pairs.clean
    for p in hf.parameters():
        p.requires_grad_(False)

    def forward():
        with torch.no_grad():
            hf(input_ids=b.input_ids, attention_mask=b.attention_mask)

    def forward_backward():
        emb = hf.get_input_embeddings()(b.input_ids).detach().requires_grad_(True)
        logits = hf(inputs_embeds=emb, attention_mask=b.attention_mask).logits
        (g,) = torch.autograd.grad(logits[:, -1].logsumexp(-1).sum(), emb)

    f, f_mb = measure(forward, repeats, device)
    fb, fb_mb = measure(forward_backward, repeats, device)
    return {"forward_s": f, "forward_mb": f_mb, "forward_backward_s": fb, "forward_backward_mb": fb_mb}


def row_capture(model, path, args):
    import torch

    import interp

    rng = random.Random(1)
    texts = [" ".join(words(rng, 24)) for _ in range(128)]
    bs = 32
    out = []
    L = model.n_layers
    batches = [model.batch(model.encode(texts[i : i + bs]), "right") for i in range(0, len(texts), bs)]
    hf = model.backend.hf_model

    def bare():
        with torch.no_grad():
            for b in batches:
                hf(input_ids=b.input_ids, attention_mask=b.attention_mask)

    floor, floor_mb = measure(bare, args.repeats, args.device)
    out.append({"what": "bare forward, 128 prompts", "seconds": floor, "peak_mb": floor_mb, "ratio": 1.0})
    tl_model = interp.load_model(path, backend="transformer_lens", device=args.device, dtype=args.torch_dtype)
    for layers, label in ((range(L), f"all {L} layers"), ([2], "layer 2")):
        sites = [f"blocks.{l}.hook_resid_post" for l in layers]
        for handle in (model, tl_model):

            def ours(handle=handle, sites=sites):
                interp.capture(handle, texts, sites=sites, positions="last", batch_size=bs, progress=False)

            t, mb = measure(ours, args.repeats, args.device)
            out.append(
                {
                    "what": f"interp.capture ({handle.backend_name}), {label}",
                    "seconds": t,
                    "peak_mb": mb,
                    "ratio": t / floor,
                    "target": (max(layers) + 1) / L + 0.1,
                }
            )
        bridge = tl_model.backend.bridge
        stop = max(layers) + 1 if max(layers) + 1 < L else None

        def run_with_cache(sites=sites, stop=stop):
            with torch.no_grad():
                for b in batches:
                    bridge.run_with_cache(
                        b.input_ids, attention_mask=b.attention_mask, names_filter=sites, stop_at_layer=stop
                    )

        t, mb = measure(run_with_cache, args.repeats, args.device)
        what = f"TransformerLens run_with_cache, {label}"
        out.append({"what": what, "seconds": t, "peak_mb": mb, "ratio": t / floor})
        from nnsight import NNsight

        nm = NNsight(hf)
        blocks = nm.transformer.h if hasattr(nm, "transformer") else nm.model.layers

        def nnsight_trace(layers=layers):
            with torch.no_grad():
                for b in batches:
                    with nm.trace(input_ids=b.input_ids, attention_mask=b.attention_mask) as tracer:
                        for l in layers:
                            blocks[l].output.save()
                        if max(layers) + 1 < L:
                            tracer.stop()

        t, mb = measure(nnsight_trace, args.repeats, args.device)
        out.append({"what": f"nnsight trace (+ stop), {label}", "seconds": t, "peak_mb": mb, "ratio": t / floor})
    return out


def row_eap(model, path, args, ig_steps=None):
    from circuits import AttributionPatching

    pairs = make_pairs_for(model, args.pairs, args.pos)
    fl = floors(model, pairs, args.repeats, args.device)
    ap = AttributionPatching(model, "logit_diff", ig_steps=ig_steps, batch_size=args.pairs, progress=False)
    edges = {}

    def run():
        edges["df"] = ap.edges(pairs)

    t, mb = measure(run, args.repeats, args.device)
    steps = ig_steps or 1
    name = "EAP" if ig_steps is None else f"EAP-IG-inputs, {ig_steps} steps"
    return [
        {"what": "floor: forward + backward, 16 pairs", "seconds": fl["forward_backward_s"], "ratio": 1.0},
        {
            "what": f"AttributionPatching.edges ({name}, {len(edges['df'])} edges)",
            "seconds": t,
            "peak_mb": mb,
            "ratio": t / fl["forward_backward_s"],
            "target": 3.0 * steps,
        },
    ]


def row_activation(model, path, args):
    import torch
    from transformer_lens import patching

    import interp
    from circuits import ActivationPatching

    n_pairs = 4  # TransformerLens runs one forward per cell: 288 of them
    pairs = make_pairs_for(model, n_pairs, args.pos)
    fl = floors(model, pairs, args.repeats, args.device)
    ap = ActivationPatching(model, "logit_diff", sites=["resid_pre"], progress=False)
    df, t, mb = once(lambda: ap.run(pairs), args)
    cells = len(df)
    bridge = interp.load_model(path, backend="transformer_lens", device=args.device, dtype=args.torch_dtype)
    bridge = bridge.backend.bridge
    _, clean_cache = bridge.run_with_cache(pairs.clean.input_ids)
    a, w, rows = pairs.answer, pairs.wrong, torch.arange(len(pairs.answer))

    def tl_patching():
        with torch.no_grad():
            return patching.get_act_patch_resid_pre(
                bridge,
                pairs.corrupted.input_ids,
                clean_cache,
                lambda logits: (logits[rows, -1, a] - logits[rows, -1, w]).mean(),
            )

    tl, t_tl, mb_tl = once(tl_patching, args)
    ours = torch.tensor(df["score"].to_numpy())
    diff = (ours.reshape(tl.shape) - tl.float()).abs().max()
    peers = pyvene_rows(path, pairs, ours, args) if args.pyvene_python else []
    return [
        {"what": f"floor: forward, {n_pairs} pairs", "seconds": fl["forward_s"], "ratio": 1.0},
        {
            "what": f"ActivationPatching, resid_pre x {cells} (layer, position) cells",
            "seconds": t,
            "peak_mb": mb,
            "ratio": t / cells / fl["forward_s"],
            "ratio_is": "forwards per cell",
            "max_score_diff": float(diff),
        },
        {
            "what": "TransformerLens patching.get_act_patch_resid_pre",
            "seconds": t_tl,
            "peak_mb": mb_tl,
            "ratio": t_tl / cells / fl["forward_s"],
            "ratio_is": "forwards per cell",
        },
        *peers,
    ]


def pyvene_rows(path: Path, pairs, ours, args) -> list[dict]:
    """pyvene's patching of the same cells on the same weights and pairs, in its own environment
    (``benchmarks/peers/pyvene_peer.py``); a failed run is a row that says so, not a lost table."""
    import torch

    with tempfile.TemporaryDirectory() as tmp:
        handed = Path(tmp) / "pairs.pt"
        torch.save(
            {
                "clean": pairs.clean.input_ids.cpu(),
                "corrupted": pairs.corrupted.input_ids.cpu(),
                "answer": pairs.answer.cpu(),
                "wrong": pairs.wrong.cpu(),
                "ours": ours,
            },
            handed,
        )
        cmd = [args.pyvene_python, str(Path(__file__).parent / "peers" / "pyvene_peer.py"), f"--model={path}"]
        cmd += [f"--pairs-file={handed}", f"--repeats={args.repeats}", f"--threads={args.threads}"]
        done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        return [{"what": f"pyvene: failed ({done.stderr.strip().splitlines()[-1][:200]})", "seconds": float("nan")}]
    return json.loads(done.stdout.strip().splitlines()[-1])


def row_path(model, path, args):
    from circuits import PathPatching

    pairs = make_pairs_for(model, args.pairs, args.pos)
    fl = floors(model, pairs, args.repeats, args.device)
    pp = PathPatching(model, "logit_diff", receivers=["logits"], progress=False)
    df, t, mb = once(lambda: pp.run(pairs), args)
    n_senders = len(df)
    per_sender = t / n_senders / fl["forward_s"]
    return [
        {"what": "floor: forward, 16 pairs", "seconds": fl["forward_s"], "ratio": 1.0},
        {
            "what": f"PathPatching, {n_senders} senders -> logits",
            "seconds": t,
            "peak_mb": mb,
            "ratio": per_sender,
            "ratio_is": "forwards per sender",
            "target": 1.5,
        },
    ]


def row_faithfulness(model, path, args):
    from circuits import AttributionPatching, Faithfulness

    pairs = make_pairs_for(model, args.pairs, args.pos)
    fl = floors(model, pairs, args.repeats, args.device)
    edges = AttributionPatching(model, "logit_diff", progress=False).edges(pairs)
    n_circuits = 4 * 3 + 2  # sizes x (EAP + 2 random), plus the full and the empty circuit
    rows = [{"what": "floor: forward, 16 pairs", "seconds": fl["forward_s"], "peak_mb": fl["forward_mb"], "ratio": 1.0}]
    for batch in (4, 64):  # the issue's batch of 4 rows per pass; 64 holds every pair in one
        fa = Faithfulness(
            model, "logit_diff", fractions=(0.01, 0.05, 0.2, 0.5), n_random=2, batch_size=batch, progress=False
        )

        def run(fa=fa):
            fa.run(pairs, {"EAP": edges})

        t, mb = measure(run, 1, args.device, warm_up=False)
        rows.append(
            {
                "what": f"Faithfulness, 4 sizes x (EAP + 2 random), batch {batch} ({len(edges)} edges)",
                "seconds": t,
                "peak_mb": mb,
                "ratio": t / n_circuits / fl["forward_s"],
                "ratio_is": "forwards per circuit",
                "target": 3.0,
            }
        )
    return rows


def row_probes(model, path, args):
    import warnings

    import numpy as np
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import StratifiedKFold
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    import interp
    from interp.relations import Relation
    from probes import ProbeSweep

    rng = random.Random(2)
    relations = []
    for k, n_answers in enumerate((4, 6, 8, 10)):
        subjects = [f"w{i}" for i in rng.sample(range(5, 30000), 200)]
        answers = [f"a{k}_{i % n_answers}" for i in range(200)]
        context = " ".join(words(rng, 6))
        relations.append(Relation(f"r{k}", subjects, answers, template=context + " {} is"))
    sites = [model.resid_site(l) for l in range(model.n_layers)]
    features = {}
    for r in relations:
        acts = interp.capture(model, r.prompts(), sites=sites, positions="subject_last", batch_size=64, progress=False)
        features[r.name] = {s: acts[s].float().cpu() for s in sites}
    sweep = ProbeSweep(folds=5, control=False, progress=False, device=args.device)
    res = {}

    def ours():
        res["df"] = sweep.run(features, relations, model_name=args.shape)

    t_ours, mb_ours = measure(ours, args.repeats, args.device)
    sk_acc = {}

    def sklearn_loop():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            for r in relations:
                y = np.array(r.answers)
                split = list(StratifiedKFold(5, shuffle=True, random_state=0).split(np.zeros(len(y)), y))
                for s in sites:
                    X = features[r.name][s].numpy()
                    for fold, (tr, te) in enumerate(split):
                        probe = make_pipeline(StandardScaler(), LogisticRegression(C=1.0, tol=1e-4, max_iter=1000))
                        sk_acc[(r.name, s, fold)] = probe.fit(X[tr], y[tr]).score(X[te], y[te])

    t0 = time.perf_counter()
    sklearn_loop()  # one run: it takes half a minute, and has no warm-up to speak of
    t_sk = time.perf_counter() - t0
    ours_acc = res["df"].set_index(["relation", "site", "fold"]).accuracy
    diffs = [abs(ours_acc[key] - acc) for key, acc in sk_acc.items()]
    return [
        {"what": f"scikit-learn loop, {len(relations)} x {len(sites)} x 5 probes, d {model.d_model}", "seconds": t_sk},
        {
            "what": "ProbeSweep (batched)",
            "seconds": t_ours,
            "peak_mb": mb_ours,
            "ratio": t_sk / t_ours,
            "ratio_is": "speed-up over scikit-learn",
            "target": 10.0,
            "max_acc_diff": max(diffs),
            "mean_acc_diff": statistics.mean(diffs),
        },
    ]


def markdown_table(path: Path) -> str:
    """The rows saved by ``--out`` as the markdown table in docs/benchmarks.md."""
    lines = ["| row | what | seconds | peak MB | ratio | target | measured |", "|---|---|---|---|---|---|---|"]
    for line in path.read_text().splitlines():
        r = json.loads(line)
        mb = f"{r['peak_mb']:.0f}" if r.get("peak_mb") is not None else ""
        ratio = f"{r['ratio']:.2f}" if r.get("ratio") is not None else ""
        if ratio and r.get("ratio_is"):
            ratio += f" ({r['ratio_is']})"
        target = f"{r['target']:.2f}" if r.get("target") is not None else ""
        cells = [r["row"], r["what"], f"{r['seconds']:.2f}", mb, ratio, target, r.get("measured", "")]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def run_row(args) -> list[dict]:
    import torch

    import interp

    torch.set_num_threads(args.threads)
    path = make_model(args.shape, Path(args.cache))
    model = interp.load_model(path, device=args.device, dtype=args.torch_dtype)
    fn = {
        "capture": row_capture,
        "eap": row_eap,
        "eap_ig": lambda m, p, a: row_eap(m, p, a, ig_steps=5),
        "activation": row_activation,
        "path": row_path,
        "faithfulness": row_faithfulness,
        "probes": row_probes,
    }[args.row]
    return fn(model, path, args)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="gpt2-small", choices=SHAPES + ("both",), help="both: the two small shapes")
    ap.add_argument("--rows", default=",".join(ROWS), help=f"comma-separated, from {', '.join(ROWS)}")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"))
    ap.add_argument("--pairs", type=int, default=16)
    ap.add_argument("--pos", type=int, default=24)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--cache", default=str(Path(tempfile.gettempdir()) / "interp-scale-models"))
    ap.add_argument(
        "--auto-circuit-python",
        default=None,
        help="the python of an environment with auto-circuit (see benchmarks/peers/auto_circuit_peer.py): "
        "also run its EAP and circuit evaluation at GPT-2-small shape",
    )
    ap.add_argument(
        "--pyvene-python",
        default=None,
        help="the python of an environment with pyvene (see benchmarks/peers/pyvene_peer.py): "
        "also run its activation patching beside ours",
    )
    ap.add_argument("--out", default=None, help="also write every row as JSON lines to this file")
    ap.add_argument("--row", default=None, help=argparse.SUPPRESS)  # one row, in a child process
    ap.add_argument("--table", nargs="+", default=None, help="print rows saved by --out as docs/benchmarks.md's tables")
    args = ap.parse_args()
    if args.table:
        print("\n\n".join(markdown_table(Path(p)) for p in args.table))
        return
    import torch

    args.torch_dtype = getattr(torch, args.dtype)
    if args.row is not None:
        print(json.dumps(run_row(args)))
        return
    rows = [r for r in args.rows.split(",") if r]
    unknown = sorted(set(rows) - set(ROWS))
    if unknown:
        ap.error(f"unknown rows {unknown}; choose from {', '.join(ROWS)}")
    shapes = ("gpt2-small", "llama-small") if args.shape == "both" else (args.shape,)
    records = []
    print(f"{args.threads} threads, device {args.device}, dtype {args.dtype}; {args.pairs} pairs of {args.pos} tokens")
    for shape in shapes:
        print(f"\n== {shape}")
        print(f"{'what':<72}{'seconds':>9}{'peak MB':>9}{'ratio':>8}{'target':>8}")
        for row in rows:
            cmd = [sys.executable, __file__, "--row", row] + [
                f"--{k}={v}" for k, v in vars(args).items() if k in ("device", "dtype", "pairs", "pos", "repeats")
            ]
            cmd += [f"--pyvene-python={args.pyvene_python}"] if args.pyvene_python and row == "activation" else []
            cmd += [f"--shape={shape}", f"--threads={args.threads}", f"--cache={args.cache}"]
            done = subprocess.run(cmd, capture_output=True, text=True)
            if done.returncode != 0:
                print(f"{row}: failed\n{done.stderr[-3000:]}")
                continue
            for rec in json.loads(done.stdout.strip().splitlines()[-1]):
                rec.update(shape=shape, row=row, device=args.device, dtype=args.dtype)
                records.append(rec)
                mb = f"{rec['peak_mb']:.0f}" if rec.get("peak_mb") is not None else ""
                ratio = f"{rec['ratio']:.2f}" if rec.get("ratio") is not None else ""
                target = f"{rec['target']:.2f}" if rec.get("target") is not None else ""
                print(f"{rec['what']:<72}{rec['seconds']:>9.2f}{mb:>9}{ratio:>8}{target:>8}", flush=True)
                if rec.get("max_score_diff") is not None:
                    peer = "pyvene's" if rec["what"].startswith("pyvene") else "TransformerLens'"
                    print(f"  largest |score - {peer}| of a cell: {rec['max_score_diff']:.1e}", flush=True)
                if rec.get("max_acc_diff") is not None:
                    diff = f"largest {rec['max_acc_diff']:.3f}, mean {rec['mean_acc_diff']:.4f}"
                    print(f"  |accuracy - scikit-learn's| per cell: {diff}", flush=True)
    if args.auto_circuit_python and "gpt2-small" not in shapes:
        print("\nauto-circuit: runs at gpt2-small shape only (on the CPU); not run")
    elif args.auto_circuit_python:
        print("\n== auto-circuit, gpt2-small shape (its own environment, on the CPU)")
        cmd = [args.auto_circuit_python, str(Path(__file__).parent / "peers" / "auto_circuit_peer.py")]
        cmd += [f"--pairs={args.pairs}", f"--pos={args.pos}", f"--repeats={args.repeats}", f"--threads={args.threads}"]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            print(f"auto-circuit: failed\n{done.stderr[-3000:]}")
        else:
            for rec in json.loads(done.stdout.strip().splitlines()[-1]):
                rec.update(shape="gpt2-small", row="auto-circuit", device="cpu", dtype="float32")
                records.append(rec)
                print(f"{rec['what']:<72}{rec['seconds']:>9.2f}{'':>9}{rec['ratio']:>8.2f}", flush=True)
    if args.out:
        today = time.strftime("%Y-%m-%d")
        Path(args.out).write_text("".join(json.dumps({**r, "measured": today}) + "\n" for r in records))


if __name__ == "__main__":
    main()
