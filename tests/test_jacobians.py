"""Jacobians, GrokAlign measures and regularizer, linear relational embeddings."""

from __future__ import annotations

import pytest
import torch

import interp
from jacobians import (
    GrokAlignRegularizer,
    JacobianError,
    LinearRelationalEmbedding,
    alignment_scores,
    centroid_alignment,
    estimate_affine,
    jacobian,
    jacobian_alignment,
    jacobian_of,
    projected_norm_sq,
)
from jacobians.jacobian import forward_with_input, positions_tensor

PROMPTS = ["Paris is the capital of France", "Rome is the capital of Italy", "Tokyo is the capital of Japan"]


def _reference(model, prompt, wrt, of, wrt_position="last", of_position="last"):
    """torch.autograd.functional.jacobian on a one-example function, and central differences."""
    batch = model.batch(model.encode([prompt]), "right")
    wpos = positions_tensor(model, [interp.Prompt(prompt)], batch, wrt_position)
    opos = positions_tensor(model, [interp.Prompt(prompt)], batch, of_position)
    x0, _ = forward_with_input(model, batch, wrt, of, wpos, opos)
    x0 = x0.detach().double()

    def f(x):
        return forward_with_input(model, batch, wrt, of, wpos, opos, x=x.float())[1].double()

    J = torch.autograd.functional.jacobian(f, x0)[0, :, 0]
    eps = 1e-3
    cols = []
    with torch.no_grad():
        for i in range(x0.shape[1]):
            e = torch.zeros_like(x0)
            e[0, i] = eps
            cols.append((f(x0 + e) - f(x0 - e))[0] / (2 * eps))
    return J, torch.stack(cols, dim=1)


@pytest.mark.parametrize("family", ["gpt2", "llama"])
@pytest.mark.parametrize("wrt,of", [("hook_embed", "logits"), ("blocks.0.hook_resid_post", "blocks.1.hook_resid_post")])
def test_jacobian_matches_autograd_and_finite_differences(model_dirs, backend, family, wrt, of):
    model = interp.load_model(model_dirs[family], backend=backend)
    J = jacobian(model, PROMPTS, wrt, of, wrt_position=0, of_position="last")
    assert J.shape[0] == 3
    for k, prompt in enumerate(PROMPTS):
        ref, fd = _reference(model, prompt, wrt, of, wrt_position=0)
        rel = lambda a, b: ((a.double() - b).norm() / b.norm()).item()  # noqa: E731
        assert rel(J[k], ref) < 1e-3
        assert rel(J[k], fd) < 1e-3
    loop = jacobian(model, PROMPTS, wrt, of, wrt_position=0, method="loop")
    torch.testing.assert_close(J, loop)


def test_jacobian_errors(model_dirs):
    model = interp.load_model(model_dirs["gpt2"], backend="nnsight")
    with pytest.raises(JacobianError, match="before"):
        jacobian(model, PROMPTS, "blocks.1.hook_resid_post", "blocks.0.hook_resid_post")
    with pytest.raises(Exception, match="blocks.1.hook_resid_post"):
        jacobian(model, PROMPTS, "blocks.1.hook_resid_psot", "logits")
    with pytest.raises(JacobianError, match="does not depend"):  # a detached path
        x = torch.zeros(2, 3, requires_grad=True)
        jacobian_of(torch.ones(2, 4, requires_grad=True) * 2, x)
    with pytest.raises(ValueError, match=r"\[batch, C\]"):
        projected_norm_sq(torch.zeros(2, 3, 4, requires_grad=True), torch.zeros(2, 3, requires_grad=True))


def test_alignment_of_an_aligned_map_is_one():
    torch.manual_seed(0)
    x = torch.randn(4, 6)
    scales = torch.randn(4, 5)
    J = scales[:, :, None] * x[:, None, :]  # every row a multiple of x
    df = alignment_scores(J, x)
    assert df.alignment.tolist() == pytest.approx([1.0] * 4, abs=1e-9)
    assert df.mean_abs_cosine.tolist() == pytest.approx([1.0] * 4, abs=1e-9)
    assert df.centroid_alignment.abs().tolist() == pytest.approx([1.0] * 4, abs=1e-9)
    random_rows = alignment_scores(torch.randn(4, 50, 6), x)
    assert random_rows.alignment.max() < 0.6


def test_centroid_alignment_by_hand_on_a_tiny_mlp():
    torch.manual_seed(0)
    mlp = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2))
    x = torch.randn(5, 3)
    W1, b1, W2 = mlp[0].weight, mlp[0].bias, mlp[2].weight
    expected = []
    for xi in x:  # J = W2 diag(1 - tanh^2) W1; mu = J^T 1
        d = 1 - torch.tanh(W1 @ xi + b1) ** 2
        J = W2 @ torch.diag(d) @ W1
        mu = J.T @ torch.ones(2)
        expected.append(torch.dot(mu, xi) / (mu.norm() * xi.norm()))
    xs = x.clone().requires_grad_(True)
    J = jacobian_of(mlp(xs), xs)
    got = alignment_scores(J, x).centroid_alignment
    assert got.tolist() == pytest.approx(torch.stack(expected).tolist(), abs=1e-6)


def test_centroid_alignment_on_a_model_equals_full_jacobian(model_dirs, backend):
    model = interp.load_model(model_dirs["gpt2"], backend=backend)
    fast = centroid_alignment(model, PROMPTS)
    full = jacobian_alignment(model, PROMPTS)
    assert fast.centroid_alignment.tolist() == pytest.approx(full.centroid_alignment.tolist(), abs=1e-5)
    assert ((full.alignment > 0) & (full.alignment <= 1)).all()


def test_frobenius_estimator_is_unbiased_and_its_gradient_matches():
    torch.manual_seed(0)
    A = torch.randn(40, 8, requires_grad=True)
    x = torch.randn(3, 8, requires_grad=True)
    y = torch.tanh(x @ A.T)  # J_i = diag(1 - y_i^2) A
    exact_sq = torch.stack([((1 - y[i] ** 2)[:, None] * A).pow(2).sum() for i in range(3)])
    gen = torch.Generator().manual_seed(1)
    draws = torch.stack([projected_norm_sq(y, x, generator=gen) for _ in range(3000)])
    assert (draws.mean(0) / exact_sq).tolist() == pytest.approx([1.0] * 3, abs=0.05)
    # the norm itself: sqrt of the squared estimate is biased low for one projection (Jensen), and
    # consistent as projections are averaged; with 16 per estimate it is within 5%
    norms = torch.stack([projected_norm_sq(y, x, n_proj=16, generator=gen).sqrt() for _ in range(300)])
    assert (norms.mean(0) / exact_sq.sqrt()).tolist() == pytest.approx([1.0] * 3, abs=0.05)
    # gradient of the regularizer (squared form) w.r.t. the weights matches autograd on the exact norm
    (g_exact,) = torch.autograd.grad(exact_sq.mean(), A)
    reg = GrokAlignRegularizer(lam=1.0, squared=True)
    g_mean = torch.zeros_like(A)
    n = 3000
    for _ in range(n):
        y = torch.tanh(x @ A.T)
        (g,) = torch.autograd.grad(reg(y, x, generator=gen), A)
        g_mean += g / n
    assert ((g_mean - g_exact).norm() / g_exact.norm()).item() < 0.05


def test_estimate_affine_recovers_a_linear_map():
    torch.manual_seed(0)
    A, c = torch.randn(5, 4).double(), torch.randn(5).double()
    W, b = estimate_affine(lambda x: x @ A.T + c, torch.randn(6, 4).double())
    torch.testing.assert_close(W, A)
    torch.testing.assert_close(b, c)


def _linear_gpt2(tmp_path):
    """A GPT-2 whose attention and MLP write nothing: the last block's output is the layer-l state."""

    from tiny_models import build

    model, tok = build("gpt2")
    with torch.no_grad():
        for block in model.transformer.h:
            for p in list(block.attn.c_proj.parameters()) + list(block.mlp.c_proj.parameters()):
                p.zero_()
    path = tmp_path / "linear_gpt2"
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


def test_lre_on_a_linear_model_is_faithful_and_causal(tmp_path, backend):
    from interp.relations import Relation

    model = interp.load_model(_linear_gpt2(tmp_path), backend=backend)
    subjects = ["Paris", "Rome", "Tokyo", "Berlin", "Madrid", "Vorn", "Kallit", "Mira", "Tesh", "Oba", "Lunde", "Sarn"]
    # the relation's answers are whatever the model says, so every example is "correct"
    batch = model.batch(model.encode(subjects), "right")
    own = model.tokenizer.convert_ids_to_tokens(model.run(batch)[:, 0].argmax(-1))
    rel = Relation("identity", subjects, own, template="{}")
    lre_model = LinearRelationalEmbedding(model, layer=0, icl=False, n_train=4)
    lre = lre_model.fit(rel, [0, 1, 2, 3]).lre_
    torch.testing.assert_close(lre.W, torch.eye(model.d_model, dtype=lre.W.dtype), atol=1e-5, rtol=1e-5)
    assert lre.b.abs().max() < 1e-5
    table = lre_model.evaluate(rel, [0, 1, 2, 3], list(range(4, 12)))
    summary = lre_model.summary(table)
    assert summary["faithfulness"] == 1.0
    if table.causal.notna().any():
        assert summary["causality"] == 1.0


def test_lre_bad_layer(model_dirs):
    model = interp.load_model(model_dirs["gpt2"], backend="nnsight")
    from interp.relations import Relation

    rel = Relation("r", ["a", "b"], ["a", "b"], template="{}")
    with pytest.raises(ValueError, match="layer must be in"):
        LinearRelationalEmbedding(model, layer=1).fit(rel, [0, 1])


def test_grokking_runs_resume_and_track(tmp_path):
    from dataclasses import replace

    from jacobians.dynamics import from_log, track, trajectory_plot
    from lab.experiments.grokking import CPU_CONFIG, grokking_experiment, load_logs, train_modular

    cfg = replace(CPU_CONFIG, p=11, steps=40, eval_every=10, d_model=16, d_mlp=32)
    log, summary = train_modular(replace(cfg, grokalign=1e-3))
    assert list(log.step) == [0, 10, 20, 30, 40] and log.centroid_alignment.between(-1, 1).all()
    assert summary["grok_step"] is None or summary["grok_step"] <= 40
    again, _ = train_modular(replace(cfg, grokalign=1e-3))
    assert log.drop(columns="seconds").equals(again.drop(columns="seconds"))  # same seed, same numbers
    table = grokking_experiment(tmp_path, cfg, seeds=(0,))
    stamp = (tmp_path / "runs" / "grokalign_seed0.json").stat().st_mtime_ns
    grokking_experiment(tmp_path, cfg, seeds=(0,))  # finished runs are reused, not redone
    assert (tmp_path / "runs" / "grokalign_seed0.json").stat().st_mtime_ns == stamp
    assert set(table.condition) == {"weight_decay", "grokalign"}
    parallel = grokking_experiment(tmp_path / "parallel", cfg, seeds=(0, 1), workers=2)
    assert list(parallel.condition) == ["weight_decay", "weight_decay", "grokalign", "grokalign"]
    assert len(list((tmp_path / "parallel" / "runs").glob("*.json"))) == 4
    fig = trajectory_plot(from_log(load_logs(tmp_path).drop(columns=["condition", "seed"])))
    assert len(fig.data) == 3
    df = track([(0, 1.0), (10, 2.0)], {"double": lambda c: 2 * c, "pair": lambda c: {"a": c, "b": -c}})
    assert df.value.tolist() == [2.0, 1.0, -1.0, 4.0, 2.0, -2.0]


def test_icl_subspaces_smoke():
    from lab.experiments.icl import SubspaceTasks, evaluate_icl, task_vector_readability, train_icl

    task = SubspaceTasks(d=6, n_subspaces=2, rank=2, n_examples=8)
    with pytest.raises(ValueError, match="do not fit"):
        SubspaceTasks(d=3, n_subspaces=2, rank=2)
    w = task.task_vectors(50, 0, torch.Generator().manual_seed(0))
    assert torch.allclose(w @ task.bases[1], torch.zeros(50, 2), atol=1e-5)  # subspace 0 is orthogonal to 1
    model, log = train_icl(task, [0, 1], steps=60, d_model=32, n_layers=2)
    assert log.loss.iloc[-1] < log.loss.iloc[0]
    errors = evaluate_icl(model, task, n=200)
    assert set(errors.test) == {"subspace 0", "subspace 1", "span", "full"}
    probe = task_vector_readability(model, task, n=200)
    assert len(probe) == 3 and probe.r2.notna().all()
