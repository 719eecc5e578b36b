"""Per-pair statistics for patching: parity with TransformerLens 4, calibration under the null, heatmap masks."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from transformer_lens import patching

import interp
from circuits import ActivationPatching, AttributionPatching, PathPatching, Uncertainty, head_heatmap, make_pairs
from circuits.statistics import bootstrap_ci, fdr, sign_flip_p, significant, summarize

CITIES = ["Paris", "Berlin", "Rome", "Madrid", "Tokyo", "Vorn", "Kallit", "Mira"]
COUNTRIES = ["France", "Germany", "Italy", "Spain"]


def _pairs(model, n: int):
    """``n`` same-length pairs "X is the capital of Y" / "X' is the capital of Y" (X != X')."""
    combos = [(a, b, c) for a, b in itertools.permutations(CITIES, 2) for c in COUNTRIES][::7][:n]
    clean = [f"{a} is the capital of {c}" for a, b, c in combos]
    corrupted = [f"{b} is the capital of {c}" for a, b, c in combos]
    return make_pairs(model, clean, corrupted, answer=[a for a, _, _ in combos], wrong=[b for _, b, _ in combos])


@pytest.mark.parametrize("n", [3, 16])  # 3: exact sign-flip enumeration; 16: Monte-Carlo
def test_statistics_equal_transformer_lens(model_dirs, backend, n):
    model = interp.load_model(model_dirs["gpt2"], backend=backend)
    bridge = interp.load_model(model_dirs["gpt2"], backend="transformer_lens").backend.bridge
    pairs = _pairs(model, n)
    config = Uncertainty(n_resamples=500, n_permutations=300, seed=3)
    ap = ActivationPatching(model, "logit_diff", sites=["resid_pre"], progress=False, statistics=config)
    df = ap.run(pairs)
    rows = torch.arange(n)

    def metric(logits):  # per pair: TransformerLens' reduce="none"
        return logits[rows, -1, pairs.answer] - logits[rows, -1, pairs.wrong]

    _, clean_cache = bridge.run_with_cache(pairs.clean.input_ids)
    ref = patching.get_act_patch_resid_pre(
        bridge, pairs.corrupted.input_ids, clean_cache, metric, reduce="none", baseline=True
    )
    values = ref.values.reshape(-1, n)  # [layer * pos, n], layer-major like our rows
    torch.testing.assert_close(ap.per_pair_, values, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ap.baseline_, ref.baseline, atol=1e-5, rtol=1e-5)
    low, high = ref.bootstrap_ci(of_effect=True, n_resamples=500, seed=3)
    np.testing.assert_allclose(df.ci_low, low.reshape(-1).numpy(), atol=1e-5)
    np.testing.assert_allclose(df.ci_high, high.reshape(-1).numpy(), atol=1e-5)
    p = ref.permutation_pvalue(n_permutations=300, seed=3).reshape(-1).numpy()
    np.testing.assert_allclose(df.p_value, p, atol=1e-6)
    np.testing.assert_allclose(df.effect, df.score - df.attrs["target_score"], atol=1e-5)
    assert df.attrs["p_exact"] == (n <= 12)
    if n == 3:  # an exact test on 3 pairs cannot go below 2 / 2**3 = 0.25, however large the effect
        assert df.p_value.min() == pytest.approx(0.25)
    else:
        assert (df.p_value < 0.05).any() and (df.p_value > 0.5).any()  # some cells matter, some do not


def test_statistics_are_calibrated_under_the_null():
    """Symmetric per-pair effects with mean 0: 5% of p-values below 0.05, 95% intervals cover 0."""
    gen = torch.Generator().manual_seed(0)
    for n, dist in [(20, "normal"), (40, "skewed-symmetric")]:
        x = torch.randn(2000, n, generator=gen)
        if dist != "normal":
            x = x.sign() * x.abs() ** 3  # heavy tails, still symmetric
        config = Uncertainty(n_resamples=400, n_permutations=400)
        p = sign_flip_p(x, config).numpy()
        assert 0.035 < (p < 0.05).mean() < 0.065, (n, dist, (p < 0.05).mean())
        low, high = bootstrap_ci(x, config)
        coverage = ((low <= 0) & (high >= 0)).float().mean().item()
        assert 0.90 < coverage < 0.97, (n, dist, coverage)  # the percentile bootstrap under-covers a little
    shifted = torch.randn(200, 30, generator=gen) + 0.8
    assert (sign_flip_p(shifted, Uncertainty()).numpy() < 0.05).mean() > 0.95  # and it has power


def test_fdr_matches_statsmodels():
    from statsmodels.stats.multitest import multipletests

    p = np.random.default_rng(0).uniform(size=200) ** 2
    np.testing.assert_allclose(fdr(p), multipletests(p, method="fdr_bh")[1], atol=1e-12)


def test_path_and_attribution_statistics(model_dirs, backend):
    model = interp.load_model(model_dirs["gpt2"], backend=backend)
    pairs = _pairs(model, 8)
    pp = PathPatching(
        model, senders=["embed", "L0H1", "L0H2"], receivers=["L1H0.k", "logits"], statistics=True, progress=False
    )
    df = pp.run(pairs)
    plain = PathPatching(model, senders=["embed", "L0H1", "L0H2"], receivers=["L1H0.k", "logits"], progress=False).run(
        pairs
    )
    np.testing.assert_allclose(df.score, plain.score, atol=1e-6)  # statistics change nothing else
    np.testing.assert_allclose(pp.per_pair_.mean(-1).numpy(), df.score, atol=1e-5)
    np.testing.assert_allclose(df.effect, df.score - df.attrs["target_score"], atol=1e-5)
    assert ((df.ci_low <= df.effect + 1e-6) & (df.effect <= df.ci_high + 1e-6)).all()
    at = AttributionPatching(model, statistics=True, progress=False)
    nodes = at.nodes(pairs)
    np.testing.assert_allclose(nodes.effect, nodes.score, atol=1e-5)  # attribution scores are effects
    edges = AttributionPatching(model, receivers=["L1H0.q", "logits"], statistics=True, progress=False).edges(pairs)
    np.testing.assert_allclose(edges.effect, edges.score, atol=1e-5)
    assert set(edges.columns) >= {"stderr", "ci_low", "ci_high", "p_value", "p_fdr"}


def test_heatmap_masks_and_marks_cells_that_are_not_significant(model_dirs):
    model = interp.load_model(model_dirs["gpt2"], backend="nnsight")
    pairs = _pairs(model, 16)
    df = ActivationPatching(model, sites=["z"], by_position=False, statistics=True, progress=False).run(pairs)
    crosses_zero = ~(((df.ci_low > 0) | (df.ci_high < 0)) & (df.p_value < 0.05))
    assert 0 < crosses_zero.sum() < len(df)
    masked = head_heatmap(df, value="effect", significance="mask")
    z = np.array(masked.data[0].z, dtype=float)
    assert np.isnan(z).sum() == crosses_zero.sum()
    grid = df.set_index(["layer", "head"]).effect.unstack().to_numpy()
    np.testing.assert_allclose(z[~np.isnan(z)], grid[~np.isnan(z)])
    marked = head_heatmap(df, value="effect", significance="mark")
    assert len(marked.data[1].x) == crosses_zero.sum()
    assert "16 pairs" in marked.layout.title.subtitle.text.replace("<br>", " ")
    with pytest.raises(ValueError, match="statistics=True"):
        head_heatmap(df.drop(columns=["ci_low"]), significance="mask")


def test_significance_keeps_its_false_positive_rate_with_few_pairs():
    """The bootstrap interval alone under-covers with few pairs; significance also needs the exact p."""
    gen = torch.Generator().manual_seed(1)
    config = Uncertainty(n_resamples=400, n_permutations=400)
    for n in (3, 5, 8, 12):
        x = torch.randn(1500, n, generator=gen)
        low, high = bootstrap_ci(x, config)
        interval_only = ((low > 0) | (high < 0)).float().mean().item()
        table = summarize(x, config)
        table.attrs["confidence"] = 0.95
        rate = significant(table).mean()
        assert rate <= 0.06, (n, rate)
        if n <= 8:
            assert interval_only > 0.09, (n, interval_only)  # what the interval alone would claim


def test_float_noise_is_not_an_effect():
    """A patch that changes nothing, up to 1e-7 in one direction for every pair, is not significant."""
    noise = torch.full((1, 20), 1e-7)
    table = summarize(noise, Uncertainty())
    assert table.p_value.iloc[0] == 1.0 and table.effect.iloc[0] == 0.0


def test_statistics_refuse_tables_that_do_not_fit(model_dirs):
    model = interp.load_model(model_dirs["gpt2"], backend="nnsight")
    with pytest.raises(MemoryError, match="restrict the grid"):
        ActivationPatching(model, sites=["z"], statistics=Uncertainty(max_bytes=100), progress=False).run(
            _pairs(model, 4)
        )


def test_resampling_memory_stays_bounded_when_pairs_are_many(monkeypatch):
    """Blocks shrink with the number of pairs (down to one cell), so many pairs fit the default
    budget; a cell's resampled means are the same whatever the block, to the last digit (numpy
    sums a 3-d block's rows in another order than a 2-d one's: measured, at most 3e-16 here)."""
    import numpy as np

    from circuits.statistics import check_memory
    from interp import resampling

    check_memory(cells=12 * 24, n_pairs=20_000, config=Uncertainty(), what="patching")  # refused before: 4.4 GiB
    rng = np.random.default_rng(0)
    values = rng.normal(size=(7, 300))
    idx = resampling.bootstrap_indices(rng, 300, 500)
    whole = resampling.resampled_means(values, idx)
    monkeypatch.setattr(resampling, "WORK_BYTES", 1)  # one cell a block
    assert resampling.block_cells(500, 300) == 1
    assert np.abs(resampling.resampled_means(values, idx) - whole).max() <= 1e-15
