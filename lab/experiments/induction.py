"""A known circuit to check the patching tools against: induction heads.

Trained on random token sequences in which a random segment ``r_1 ... r_L`` appears twice (at
random positions, random length, so no positional shortcut exists), a two-layer attention-only
transformer learns to predict the second copy by *induction* (Elhage et al.
2021; Olsson et al. 2022): a **previous-token head** in layer 0 writes "the token before me was
``a``" into each position, and an **induction head** in layer 1 uses it through its *keys*
(K-composition) to attend from a current token ``a`` to the position after an earlier ``a``,
copying what came next. Path patching must single out the ``L0 previous-token head -> L1
induction head (k)`` edge; a test and the tutorial check that it does.

The model is a small Llama (rotary positions, so "the previous token" is a relative offset; it
loads through both backends like any other) whose MLPs are zero and frozen: an attention-only
transformer. Its vocabulary is the words ``t0 ... t{V-1}``.

    >>> model = interp.load_model("induction")               # the shipped checkpoint
    >>> pairs = induction_pairs(model, n=32)                 # clean repeats; corrupted first halves
    >>> PathPatching(model, induction_metric, receivers=["L1H0.k", ...]).run(pairs)

Train your own with ``interp circuits train-induction --out DIR`` (about a minute on 2 cores).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from circuits.activation_patching import ActivationPatching
from circuits.attribution import AttributionPatching
from circuits.components import all_nodes
from circuits.edge_patching import EdgePatching
from circuits.faithfulness import Faithfulness
from circuits.pairs import Pairs, make_pairs
from circuits.path_patching import PathPatching
from interp.models import ModelNotFoundError
from interp.results import atomic_dir, save_table, write_json
from interp.training import TrainingLoop, seed_torch
from lab.world.tokenizer import build_tokenizer

CHECKPOINT = Path(__file__).resolve().parent.parent / "checkpoints" / "induction"


def checkpoint_dir() -> Path:
    """The shipped induction model (registered as ``interp.load_model("induction")``)."""
    if not (CHECKPOINT / "config.json").exists():
        raise ModelNotFoundError(
            f"the induction-head model is missing from {CHECKPOINT}; rebuild it with "
            "`interp circuits train-induction --out lab/checkpoints/induction`"
        )
    return CHECKPOINT


@dataclass(frozen=True)
class InductionConfig:
    vocab: int = 48
    seq_len: int = 33  # tokens per training sequence, <eos> included
    min_repeat: int = 4  # length of the repeated segment: uniform in [min_repeat, max_repeat]
    max_repeat: int = 12
    n_layers: int = 2
    d_model: int = 64
    n_heads: int = 2
    steps: int = 1500
    batch_size: int = 64
    lr: float = 1e-3
    weight_decay: float = 0.01
    seed: int = 0
    threads: int = 2


def _tokenizer(vocab: int):
    return build_tokenizer([f"t{i}" for i in range(vocab)])


def _ids(tokenizer, vocab: int) -> torch.Tensor:
    return torch.tensor(tokenizer.convert_tokens_to_ids([f"t{i}" for i in range(vocab)]))


def repeated_sequences(
    n: int, half: int, token_ids: torch.Tensor, generator: torch.Generator, bos: int
) -> torch.Tensor:
    """``[n, 1 + 2 * half]``: ``bos``, ``half`` random tokens, the same tokens again."""
    first = token_ids[torch.randint(len(token_ids), (n, half), generator=generator)]
    return torch.cat([torch.full((n, 1), bos), first, first], dim=1)


def training_batch(config: InductionConfig, token_ids: torch.Tensor, generator: torch.Generator, bos: int):
    """Random sequences in which, after a random prefix, a random segment of random length repeats
    until the end: ``(tokens [n, seq_len], mask of positions whose next token is a repeat [n,
    seq_len - 1])``. The segment's length varies, so no fixed positional offset predicts the
    repeats: the model has to look the current token up earlier in the context."""
    n, t = config.batch_size, config.seq_len
    x = token_ids[torch.randint(len(token_ids), (n, t), generator=generator)]
    x[:, 0] = bos
    predictable = torch.zeros(n, t - 1, dtype=torch.bool)
    for i in range(n):
        length = int(torch.randint(config.min_repeat, config.max_repeat + 1, (1,), generator=generator))
        start = int(torch.randint(1, t - 2 * length + 1, (1,), generator=generator))
        for p in range(start + length, t):
            x[i, p] = x[i, p - length]
        predictable[i, start + length :] = True  # position p predicts token p + 1 (a repeat of an earlier pair)
    return x, predictable


def train_induction_model(
    out_dir: str | Path, config: InductionConfig = InductionConfig(), progress: bool | None = None
) -> Path:
    """Train the attention-only induction model; save a HuggingFace directory (with ``train_log.json``)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    seed_torch(config.seed)
    tok = _tokenizer(config.vocab)
    cfg = LlamaConfig(
        hidden_size=config.d_model,
        num_hidden_layers=config.n_layers,
        num_attention_heads=config.n_heads,
        num_key_value_heads=config.n_heads,
        intermediate_size=4,
        max_position_embeddings=config.seq_len,
        vocab_size=len(tok),
        bos_token_id=tok.eos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        tie_word_embeddings=True,
    )
    model = LlamaForCausalLM(cfg)
    for block in model.model.layers:  # attention-only: MLPs are zero and stay zero
        for p in block.mlp.parameters():
            torch.nn.init.zeros_(p)
            p.requires_grad_(False)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=config.lr, weight_decay=config.weight_decay, betas=(0.9, 0.98))
    gen = torch.Generator().manual_seed(config.seed)
    ids = _ids(tok, config.vocab)
    model.train()
    loop = TrainingLoop(config.steps, desc="induction model", threads=config.threads, progress=progress)
    for step in loop:
        x, predictable = training_batch(config, ids, gen, tok.eos_token_id)
        for g in opt.param_groups:
            g["lr"] = config.lr * min(1.0, (step + 1) / 100)
        logits = model(input_ids=x).logits
        loss_all = torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), x[:, 1:].flatten())
        loop.optimize(loss_all, opt)
        if loop.logging(step):
            with torch.no_grad():
                rep = logits[:, :-1].argmax(-1).eq(x[:, 1:])[predictable].float().mean()
            loop.log(step, loss=round(loss_all.item(), 4), repeat_accuracy=round(rep.item(), 4))
    model.eval()
    log = loop.rows
    out = Path(out_dir)
    with atomic_dir(out) as tmp:
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        write_json(asdict(config), tmp / "train_config.json")
        write_json(log, tmp / "train_log.json")
    return out


def induction_pairs(model, n: int = 32, half: int | None = None, seed: int = 0, corruption: str = "token") -> Pairs:
    """Clean and corrupted inputs for the induction circuit. Clean: ``<eos> r_1 .. r_L r_1 .. r_L``,
    a random segment of ``half`` = L tokens repeated.

    - ``corruption="token"`` (the default): the prompt ends at the second occurrence of ``r_j``
      (j = L // 2) and the answer is ``r_{j+1}``, what induction predicts there; the corrupted
      prompt replaces the *first* ``r_j`` alone by a token absent from the segment. Only the
      previous-token information reaching the key of the position after the first ``r_j`` changes
      (that key's own token is unchanged), so path patching isolates the previous-token path.
      Metric: :func:`induction_metric`, the answer's log-probability at the last position.
    - ``corruption="copy"``: the whole first copy is replaced, and the metric averages the correct
      next token's log-probability over the second copy. This also changes the current-token
      information that reaches the keys, which confounds the circuit: on the shipped model path
      patching then credits the second layer-0 head (previous-token score 0.21) with 0.12 of the
      effect, against 0.001 under the single-token corruption (docs/circuits.md).
    """
    if corruption not in ("token", "copy"):
        raise ValueError(f"corruption must be 'token' or 'copy', got {corruption!r}")
    vocab = sum(1 for t in model.tokenizer.get_vocab() if t.startswith("t") and t[1:].isdigit())
    if vocab == 0:
        raise ValueError(
            "induction_pairs needs a model whose vocabulary has the words t0, t1, ... (the induction model)"
        )
    if half is None:
        half = 10
    if half < 3:
        raise ValueError(f"half must be at least 3 (a segment to repeat), got {half}")
    gen = torch.Generator().manual_seed(seed)
    ids = _ids(model.tokenizer, vocab)
    bos = model.tokenizer.eos_token_id
    clean = repeated_sequences(n, half, ids, gen, bos)
    if corruption == "copy":
        other = ids[torch.randint(len(ids), (n, half), generator=gen)]
        corrupted = clean.clone()
        corrupted[:, 1 : half + 1] = other
        return make_pairs(model, clean, corrupted)
    j = half // 2
    answer = clean[:, j + 1].clone()
    clean = clean[:, : half + j + 1]  # ends at the second r_j
    corrupted = clean.clone()
    for i in range(n):
        segment = set(clean[i, 1 : half + 1].tolist())
        choices = torch.tensor([t for t in ids.tolist() if t not in segment])
        corrupted[i, j] = choices[torch.randint(len(choices), (1,), generator=gen)]
    return make_pairs(model, clean, corrupted, answer=answer)


def induction_metric(logits: torch.Tensor, pairs: Pairs) -> torch.Tensor:
    """Per pair: with single-token pairs (they carry an ``answer``), the answer's log-probability
    at the last position; with whole-copy pairs, the mean log-probability of the correct next
    token over the repeated half."""
    ids = pairs.clean.input_ids.to(logits.device)
    if pairs.answer is not None:
        rows = torch.arange(len(ids), device=logits.device)
        logp = torch.log_softmax(logits[rows, pairs.last.to(logits.device)].float(), -1)
        return logp.gather(-1, pairs.answer.to(logits.device)[:, None])[:, 0]
    half = (ids.shape[1] - 1) // 2
    pos = torch.arange(half + 1, 2 * half, device=logits.device)
    logp = torch.log_softmax(logits[:, pos].float(), -1)
    return logp.gather(-1, ids[:, pos + 1].unsqueeze(-1)).squeeze(-1).mean(-1)


def repeat_length(pairs: Pairs) -> int:
    """The repeated segment's length L, read off the clean tokens (the last token occurs L earlier)."""
    ids = pairs.clean.input_ids
    for d in range(2, ids.shape[1]):
        if torch.equal(ids[:, -1], ids[:, -1 - d]):
            return d
    raise ValueError("these pairs have no repeated segment")


def previous_token_scores(model, pairs: Pairs, layer: int = 0) -> torch.Tensor:
    """Each head's mean attention from position ``t`` to ``t - 1`` (a previous-token-head score),
    computed from queries and keys: ``[n_heads]``."""
    return _attention_scores(model, pairs, layer, offset=1)


def induction_scores(model, pairs: Pairs, layer: int = 1) -> torch.Tensor:
    """Each head's mean attention from a second-copy token to the token after its first
    occurrence (offset ``half - 1``): ``[n_heads]``."""
    half = repeat_length(pairs)
    return _attention_scores(model, pairs, layer, offset=half - 1, start=half + 1)


def attention_patterns(model, pairs: Pairs, layer: int) -> torch.Tensor:
    """Attention patterns ``[n, head, query, key]`` of the clean inputs at ``layer``."""
    return model.attention_pattern(pairs.clean, layer).float().cpu()


def _attention_scores(model, pairs: Pairs, layer: int, offset: int, start: int = 1) -> torch.Tensor:
    pattern = attention_patterns(model, pairs, layer)
    rows = torch.arange(start, pattern.shape[-1])
    return pattern[:, :, rows, rows - offset].mean((0, 2))


def known_circuit(model, pairs: Pairs) -> set[tuple[str, str]]:
    """The induction circuit's edges under the single-token corruption, from attention patterns:
    the previous-token head (the L0 head attending most to ``t - 1``) reads the changed token
    (its value), every L1 head's key reads the previous-token head, and every L1 head writes the
    answer into the logits. (The queries and values of the L1 heads read unchanged tokens, so
    their edges carry nothing under this corruption.)"""
    prev = int(previous_token_scores(model, pairs).argmax())
    edges = {("embed", f"L0H{prev}.v")}
    for h in range(model.n_heads):
        edges |= {(f"L0H{prev}", f"L1H{h}.k"), (f"L1H{h}", "logits")}
    return edges


def circuit_faithfulness(model, pairs: Pairs, circuit: set[tuple[str, str]], metric=None) -> float:
    """f(C) of one circuit (a set of (sender, receiver) edges), every other edge patched."""
    ep = EdgePatching(model, metric or induction_metric, progress=False)
    edges = ep.edges()
    keep = torch.tensor([0.0 if e in circuit else 1.0 for e in zip(edges.sender, edges.receiver)])
    m = ep.evaluate(pairs, torch.stack([torch.zeros(len(keep)), torch.ones(len(keep)), keep])).double().mean(-1)
    return float((m[2] - m[1]) / (m[0] - m[1]))


def analyze_induction(
    model, out: str | Path, n_pairs: int = 32, ig_steps: int = 5, n_random: int = 99, progress: bool | None = None
) -> dict:
    """Activation patching and path patching (all L0 senders -> every L1 head's q/k/v), both with
    per-pair intervals and p-values; AtP, EAP and EAP-IG-inputs; and the faithfulness of the
    circuits each attribution ranks (edges and nodes, against ``n_random`` random circuits).
    Tables saved in ``out`` and a summary returned."""
    pairs = induction_pairs(model, n=n_pairs)
    heads = model.n_heads
    prev = previous_token_scores(model, pairs).tolist()
    ind = induction_scores(model, pairs).tolist()
    ap = ActivationPatching(
        model, induction_metric, sites=["z"], by_position=False, statistics=True, progress=progress
    ).run(pairs)
    receivers = [f"L1H{h}.{c}" for h in range(heads) for c in "qkv"]
    pp = PathPatching(
        model,
        induction_metric,
        senders=["embed"] + [f"L0H{h}" for h in range(heads)],
        receivers=receivers,
        statistics=True,
        progress=progress,
    ).run(pairs)
    nodes = AttributionPatching(model, induction_metric, progress=progress).nodes(pairs)
    eap = AttributionPatching(model, induction_metric, progress=progress).edges(pairs)
    eap_ig = AttributionPatching(model, induction_metric, ig_steps=ig_steps, progress=progress).edges(pairs)
    edge_faith = Faithfulness(model, induction_metric, n_random=n_random, progress=progress)
    curve = edge_faith.run(pairs, {"EAP": eap, "EAP-IG-inputs": eap_ig})
    # 7 nodes: MIB's grid would test sizes 0, 1, 3 and 7 only; every size is cheap here
    n_nodes = len(all_nodes(model))
    node_faith = Faithfulness(
        model,
        induction_metric,
        level="node",
        fractions=[k / n_nodes for k in range(1, n_nodes + 1)],
        n_random=n_random,
        progress=progress,
    )
    node_curve = node_faith.run(pairs, {"AtP": nodes})
    tables = [
        ("activation_patching", ap),
        ("path_patching", pp),
        ("attribution_nodes", nodes),
        ("eap_edges", eap_ig),
        ("eap_plain_edges", eap),
        ("faithfulness", curve),
        ("faithfulness_summary", edge_faith.summary_),
        ("node_faithfulness", node_curve),
        ("node_faithfulness_summary", node_faith.summary_),
    ]
    for name, df in tables:
        save_table(df, out, name)
    known = known_circuit(model, pairs)
    ranked = eap_ig.reindex(eap_ig.score.abs().sort_values(ascending=False).index).head(len(known))
    top_ig = set(zip(ranked.sender, ranked.receiver))
    head_edges = pp[pp.sender != "embed"].sort_values("score")
    top = head_edges.iloc[0]
    summary = {
        "previous_token_scores": prev,
        "induction_scores": ind,
        "top_head_edge": {
            "sender": top.sender,
            "receiver": top.receiver,
            "normalized": float(top.normalized),
            "ci": [float(top.ci_low), float(top.ci_high)],
            "p_value": float(top.p_value),
        },
        "clean_metric": pp.attrs["target_score"],
        "corrupted_metric": pp.attrs["source_score"],
        "faithfulness": _areas(edge_faith.summary_) | _areas(node_faith.summary_, "nodes: "),
        "known_circuit": {
            "edges": sorted(map(list, known)),
            "n_graph_edges": int(curve.attrs["n_edges"]),
            "faithfulness": circuit_faithfulness(model, pairs, known),
            "top_eap_ig_edges_are_the_circuit": top_ig == known,
        },
    }
    write_json(summary, Path(out) / "summary.json")
    return summary


def _areas(summary, prefix: str = "") -> dict:
    return {
        prefix + r.method: {
            "cpr": r.cpr,
            "cmd": r.cmd,
            "random_cpr": r.random_cpr_mean,
            "random_cpr_sd": r.random_cpr_sd,
            "random_cmd": r.random_cmd_mean,
            "excess_cpr": [r.excess_cpr, r.excess_low, r.excess_high],
            "p_random_cpr": r.p_random_cpr,
        }
        for r in summary.itertuples()
    }
