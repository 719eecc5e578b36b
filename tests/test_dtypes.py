"""Half precision: bfloat16 and float16 models through capture, patching, attribution and probes.

Users load real models in bfloat16 (``load_model(..., dtype=torch.bfloat16)``) to halve memory.
These tests run the same tiny models in float32 and in half precision on the CPU and require every
analyzer to run and to agree with float32 within tolerances stated against each quantity's own
scale (bfloat16 keeps 8 bits of mantissa, a relative step of 2^-8 = 0.4%; float16 keeps 11):

- activations: within 4% (bfloat16) / 1% (float16) of the site's largest magnitude;
- patching effects, attribution scores and edge patching's exact metric per pair: within 10% / 3%
  of the largest score, and a Pearson correlation of at least 0.98 / 0.995 with float32;
- probes (fitted in float32 from half-precision features): accuracy within 2 points per fold.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import interp
from circuits import ActivationPatching, AttributionPatching, EdgePatching, PathPatching, make_pairs
from interp.relations import Relation
from probes import ProbeSweep

CLEAN = ["Paris is the capital of France", "Rome is the capital of Italy", "Tokyo is the capital of Japan"]
CORRUPTED = ["Berlin is the capital of France", "Madrid is the capital of Italy", "Vorn is the capital of Japan"]
ANSWER, WRONG = ["Paris", "Rome", "Tokyo"], ["Berlin", "Madrid", "Vorn"]
#: dtype -> (activation tolerance, score tolerance, minimum correlation), each relative to the scale
TOLERANCE = {torch.bfloat16: (0.04, 0.10, 0.98), torch.float16: (0.01, 0.03, 0.995)}
DTYPES = list(TOLERANCE)


def _models(model_dirs, family, backend, dtype):
    full = interp.load_model(model_dirs[family], backend=backend)
    half = interp.load_model(model_dirs[family], backend=backend, dtype=dtype)
    assert next(half.module.parameters()).dtype == dtype
    return full, half


def _pairs_of(model):
    return make_pairs(model, CLEAN, CORRUPTED, answer=ANSWER, wrong=WRONG)


def _close_scores(half: np.ndarray, full: np.ndarray, dtype) -> None:
    _, tol, min_r = TOLERANCE[dtype]
    scale = np.abs(full).max()
    assert scale > 0
    assert np.abs(half - full).max() <= tol * scale, (np.abs(half - full).max(), scale)
    assert np.corrcoef(half, full)[0, 1] >= min_r


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("family", ["gpt2", "llama_gqa"])
def test_capture_in_half_precision(model_dirs, backend, family, dtype):
    full, half = _models(model_dirs, family, backend, dtype)
    sites = ["blocks.1.hook_resid_post", "blocks.1.attn.hook_z", "blocks.0.attn.hook_in"]
    a = interp.capture(full, CLEAN, sites=sites, positions="all")
    b = interp.capture(half, CLEAN, sites=sites, positions="all")
    tol = TOLERANCE[dtype][0]
    for s in sites:
        assert b[s].dtype == dtype, s  # kept in the model's precision (half the memory)
        err = (b[s].float() - a[s]).abs().max()
        assert err <= tol * a[s].abs().max(), (s, float(err))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_patching_and_attribution_in_half_precision(model_dirs, backend, dtype):
    full, half = _models(model_dirs, "gpt2", backend, dtype)
    out = {}
    for name, model in (("full", full), ("half", half)):
        pairs = _pairs_of(model)
        act = ActivationPatching(model, "logit_diff", sites=["resid_pre", "z"], progress=False).run(pairs)
        path = PathPatching(model, "logit_diff", progress=False).run(pairs)
        nodes = AttributionPatching(model, "logit_diff", progress=False).nodes(pairs)
        edges = AttributionPatching(model, "logit_diff", progress=False).edges(pairs)
        ig_edges = AttributionPatching(model, "logit_diff", ig_steps=3, progress=False).edges(pairs)
        out[name] = {"act": act, "path": path, "nodes": nodes, "edges": edges, "ig_edges": ig_edges}
    masks = torch.rand(4, len(EdgePatching(full, "logit_diff").edges()), generator=torch.Generator().manual_seed(0))
    masks = (masks < torch.tensor([0.1, 0.3, 0.6, 1.0])[:, None]).float()
    exact = {
        name: EdgePatching(model, "logit_diff", progress=False).evaluate(_pairs_of(model), masks).flatten().double()
        for name, model in (("full", full), ("half", half))
    }
    _close_scores(exact["half"].numpy(), exact["full"].numpy(), dtype)
    for what in out["full"]:
        f, h = out["full"][what], out["half"][what]
        assert len(f) == len(h) and np.isfinite(h.score).all(), what
        _close_scores(h.score.to_numpy(np.float64), f.score.to_numpy(np.float64), dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_probes_on_half_precision_features(dtype):
    """Half-precision activations are fitted in the sweep's own precision (float32 by default)."""
    rng = np.random.default_rng(0)
    y = rng.integers(0, 4, 240)
    centers = rng.normal(size=(4, 48)) * 3
    X = torch.tensor(centers[y] + rng.normal(size=(240, 48)) * 2.0, dtype=torch.float32) * 40 + 7
    rel = Relation("r", [f"s{i}" for i in range(len(y))], [f"a{v}" for v in y], "{} is")
    site = "blocks.0.hook_resid_post"
    sweep = ProbeSweep(folds=4, control=False)
    full = sweep.run({"r": {site: X}}, [rel])
    half = sweep.run({"r": {site: X.to(dtype)}}, [rel])
    assert full.accuracy.mean() > 0.6
    assert (half.accuracy - full.accuracy).abs().max() <= 0.02
