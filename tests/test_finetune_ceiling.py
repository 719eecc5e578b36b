"""The fine-tune benchmark's floor and ceiling (benchmarks/finetunes.py): its count of matrix
products against the count by hand, the read-out told from the body, and the floor's fallback
for products it cannot replay."""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from finetunes import adamw_seconds, floor_seconds, matmul_work, onednn_product, runs_updates  # noqa: E402

VOCAB = 50


def test_the_count_splits_body_from_read_out_and_matches_the_count_by_hand():
    torch.manual_seed(0)
    body = torch.nn.Linear(16, 32)
    readout = torch.nn.Linear(32, VOCAB, bias=False)
    x = torch.randn(8, 16)  # an input without gradient: the first layer needs no input gradient

    def step():
        torch.nn.functional.cross_entropy(readout(body(x)), torch.zeros(8, dtype=torch.long)).backward()

    gflop_body, gflop_readout, shapes = matmul_work(step, VOCAB)
    by_hand_body = 2 * 8 * 16 * 32 * 2  # forward, weight gradient
    by_hand_readout = 2 * 8 * 32 * VOCAB * 3  # forward, weight gradient, input gradient
    assert gflop_body * 1e9 == pytest.approx(by_hand_body)
    assert gflop_readout * 1e9 == pytest.approx(by_hand_readout)
    flops = sum(n * 2 * a[0] * a[1] * b[-1] for (a, b), n in shapes.items())
    assert flops == by_hand_body  # every body product replayable, none of the read-out's


def test_the_floor_times_the_products_it_can_replay_and_the_rest_at_the_peak_rate():
    assert floor_seconds(3.0, Counter(), peak=100.0) == pytest.approx(0.03)  # nothing replayed: all at peak
    shapes = Counter({((64, 64), (64, 64)): 3})
    replayed = floor_seconds(3 * 2 * 64**3 / 1e9, shapes, peak=1e-9)  # a peak so low it would dominate
    assert 0 < replayed < 1.0  # timed by replaying, not charged at the peak rate


def test_the_optimizer_floor_scales_with_the_updates_a_study_saved(tmp_path):
    import json

    for i, (status, steps, params) in enumerate([("done", 100, 1000), ("done", 40, 1000), ("skipped", 0, 0)]):
        fact = {"status": status} | ({"steps": steps, "trainable_params": params} if status == "done" else {})
        (tmp_path / f"{i}.json").write_text(json.dumps(fact))
    assert runs_updates(tmp_path) == (140_000, 1000)
    assert adamw_seconds(0, 1000) == 0.0
    assert 0 < adamw_seconds(140_000, 1000) < 1.0


def test_the_onednn_product_the_floor_may_take_is_the_same_product():
    product = onednn_product()
    if product is None:
        pytest.skip("this torch has no oneDNN linear: the floor uses torch's own kernel alone")
    x, w = torch.randn(48, 32), torch.randn(24, 32)
    torch.testing.assert_close(product(x, w), x @ w.T, rtol=1e-5, atol=1e-5)
