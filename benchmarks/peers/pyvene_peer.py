"""pyvene's activation patching at the scale benchmark's shape, for ``scale.py``'s activation row.

Runs in its own environment (pyvene 0.1.8 brings its own transformers), built once:

    python3 -m venv .venv-pyvene
    .venv-pyvene/bin/pip install torch==2.13.0 pyvene

then ``python benchmarks/scale.py --rows activation --pyvene-python .venv-pyvene/bin/python``.
``scale.py`` hands over the model folder (the same random weights its own row uses) and a file
with the pairs' token ids and our scores. Here every (layer, position) cell of ``resid_pre`` is
patched from the clean run into the corrupted run, as pyvene's causal-tracing tutorial does it:
one ``IntervenableModel`` per layer with a ``VanillaIntervention`` on ``block_input`` (the
residual stream entering the block, TransformerLens' ``hook_resid_pre``), unit ``pos``, one call
per position over all pairs at once. The clean run's residuals are handed over precomputed
(``source_representations``, computed outside the timer), as TransformerLens is handed its clean
cache, so each cell costs one forward of the corrupted batch; with ``--sources`` pyvene runs the
clean batch itself (its documented ``sources=[...]``, two forwards per cell).

Prints one JSON list of rows: the floor (a bare forward of the corrupted batch, with this
environment's transformers) and pyvene's patching, with the largest difference of a cell's
metric (mean logit difference over pairs at the last position) from ours.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

os.environ.setdefault("TQDM_DISABLE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True, help="the folder of the HuggingFace model scale.py built")
    ap.add_argument("--pairs-file", required=True, help="torch file: clean, corrupted, answer, wrong, ours")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--sources", action="store_true", help="let pyvene run the clean batch in every call")
    args = ap.parse_args()
    import pyvene as pv
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(args.threads)
    data = torch.load(args.pairs_file)
    clean, corrupted, answer, wrong = data["clean"], data["corrupted"], data["answer"], data["wrong"]
    hf = AutoModelForCausalLM.from_pretrained(args.model)
    hf.eval()
    hf.requires_grad_(False)
    n, n_pos = corrupted.shape
    n_layers = hf.config.num_hidden_layers
    rows = torch.arange(n)

    def forward():
        with torch.no_grad():
            hf(input_ids=corrupted)

    forward()
    times = []
    for _ in range(args.repeats):
        t = time.perf_counter()
        forward()
        times.append(time.perf_counter() - t)
    floor = statistics.median(times)
    with torch.no_grad():  # the clean residual entering each block (hidden_states[l] = resid_pre of block l)
        clean_resid = hf(input_ids=clean, output_hidden_states=True).hidden_states

    def patch_all() -> torch.Tensor:
        out = torch.empty(n_layers, n_pos)
        with torch.no_grad():
            for layer in range(n_layers):
                config = pv.IntervenableConfig(
                    representations=[
                        pv.RepresentationConfig(layer=layer, component="block_input", unit="pos", max_number_of_units=1)
                    ],
                    intervention_types=pv.VanillaIntervention,
                )
                model = pv.IntervenableModel(config, model=hf)
                for p in range(n_pos):
                    where = {"sources->base": ([[[p]] * n], [[[p]] * n])}
                    if args.sources:
                        _, cf = model({"input_ids": corrupted}, [{"input_ids": clean}], unit_locations=where)
                    else:
                        src = clean_resid[layer][:, p : p + 1]  # [n, 1 unit, d_model]
                        _, cf = model({"input_ids": corrupted}, unit_locations=where, source_representations=[src])
                    logits = cf.logits
                    out[layer, p] = (logits[rows, -1, answer] - logits[rows, -1, wrong]).mean()
        return out

    t = time.perf_counter()
    scores = patch_all()
    seconds = time.perf_counter() - t
    cells = n_layers * n_pos
    diff = (scores - data["ours"].reshape(scores.shape)).abs().max()
    how = "clean batch run by pyvene in each call" if args.sources else "clean residuals given"
    print(
        json.dumps(
            [
                {"what": f"pyvene: floor, forward, {n} pairs", "seconds": floor, "ratio": 1.0},
                {
                    "what": f"pyvene VanillaIntervention, block_input x {cells} cells ({how})",
                    "seconds": seconds,
                    "ratio": seconds / cells / floor,
                    "ratio_is": "forwards per cell",
                    "max_score_diff": float(diff),
                },
            ]
        )
    )


if __name__ == "__main__":
    main()
