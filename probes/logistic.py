"""Batched multinomial logistic regression: many independent L2 probes as one tensor program.

A probe sweep fits thousands of small, independent problems: for every site (layer) ``g`` and
every task ``k`` (a relation's labels, with one fold's training mask, one seed or a control
labelling), minimize scikit-learn's objective

    f(W, b) = (1 / n_k) * sum_{i in train_k} CE(softmax(x_gi W + b), y_ki) + ||W||^2 / (2 C n_k)

(the intercept is not penalized). Problems that share features share one matrix product: with
``X`` of shape ``[G, n, d]`` and parameters ``[G, K, d + 1, c]`` the logits of all ``G * K``
problems are ``einsum("gnd,gkdc->gknc")``. The solver is L-BFGS run independently per problem
(per-problem curvature history, two-loop recursion, Armijo backtracking and stopping rule)
but vectorized across problems, so it reaches each problem's own optimum: the same optimum as
``sklearn.linear_model.LogisticRegression(C=C)``, since the objective is strictly convex.

**Standardization** (``standardize=True``): each problem's features are centred and scaled by
its own *training* rows' mean and standard deviation (a zero-variance feature keeps scale 1),
exactly as ``make_pipeline(StandardScaler(), LogisticRegression(C))`` fitted on those rows; the
penalty then acts on standardized coefficients. It is applied implicitly (the effective raw-space
weights are ``W / sigma`` and ``b - (mu / sigma) W``), so the batch still shares one ``X``. It also
makes the problems well conditioned: hidden states have large, uneven scales, on which L-BFGS
(scikit-learn's or ours) needs thousands of iterations.

**Preconditioning**: the two-loop recursion starts from ``H0 = gamma * (a R + lam I)^-1``, with
``R`` the (standardized) second-moment matrix of a problem's training features and
``a = (1 - 1/c) / c`` the softmax curvature at uniform predictions, so ``H0`` is the exact
inverse Hessian's diagonal block at the starting point. Hidden states are strongly correlated,
and this removes most of the ill-conditioning they cause: L-BFGS needs several times fewer
iterations. It changes the path, not the optimum.

Problems that have converged drop out of the computation (whole groups at a time), so a few slow
problems do not keep the whole batch busy.

Two classes: scikit-learn fits one logistic coefficient vector ``w`` penalized by
``||w||^2 / (2 C n)``. The two-column softmax with weights ``(w/2, -w/2)`` is the same model,
and its penalty equals scikit-learn's when the softmax is fitted with ``C / 2``; we do exactly
that, so binary probes match scikit-learn as well.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from jaxtyping import Bool, Float, Int

from interp import memory

Tensor = torch.Tensor


@dataclass
class LogisticFit:
    coef: Float[Tensor, "G K d c"]
    intercept: Float[Tensor, "G K c"]
    n_iter: Int[Tensor, "G K"]
    converged: Bool[Tensor, "G K"]

    def logits(self, X: Float[Tensor, "G n d"]) -> Float[Tensor, "G K n c"]:
        X = X.to(self.coef.dtype)
        return torch.einsum("gnd,gkdc->gknc", X, self.coef) + self.intercept[:, :, None, :]


def fit_logistic(
    X: Float[Tensor, "G n d"],
    y: Int[Tensor, "G K n"] | Int[Tensor, "K n"],
    train: Bool[Tensor, "G K n"] | None = None,
    n_classes: Int[Tensor, "G K"] | None = None,
    C: float = 1.0,
    max_iter: int = 1000,
    tol: float = 1e-5,
    history: int = 10,
    dtype: torch.dtype = torch.float32,
    standardize: bool = False,
    precondition: bool = True,
    reduce: bool | None = None,
) -> LogisticFit:
    """Fit ``G * K`` L2 multinomial logistic regressions at once (see module docstring).

    ``y[g, k]`` holds class indices ``0 .. n_classes[g, k] - 1``; entries outside ``train[g, k]``
    are ignored (``-1`` marks padding). ``y``, ``train`` and ``n_classes`` may omit the group
    axis when every group has the same tasks. Runs on ``X``'s device. ``tol``: stop a problem
    when the largest absolute gradient entry of its (mean-scaled) objective is below ``tol``.
    Returned coefficients act on the raw (unstandardized) features. ``precondition``: use the
    curvature preconditioner (changes the path, not the optimum). ``reduce``: solve each problem
    in the span of its training rows (see :func:`_fit_in_training_span`; same optimum); default:
    when there are many more features than rows (``d > 512`` and ``d >= 2 n``).
    """
    if X.dim() == 2:
        X = X[None]
    G, n, d = X.shape
    device = X.device
    X = X.to(dtype)
    y = torch.as_tensor(y, device=device)
    if y.dim() == 1:
        y = y[None]
    if y.dim() == 2:  # the same tasks for every group
        y = y[None].expand(G, *y.shape)
    K = y.shape[1]
    if train is None:
        train = y >= 0
    train = torch.as_tensor(train, device=device)
    train = train[None].expand(G, K, n) if train.dim() == 2 else train.expand(G, K, n)
    if n_classes is None:
        n_classes = torch.where(train, y, torch.zeros_like(y)).amax(-1) + 1
    n_classes = torch.as_tensor(n_classes, device=device)
    n_classes = n_classes[None].expand(G, K) if n_classes.dim() == 1 else n_classes.expand(G, K)
    counts = train.sum(-1)  # [G, K] training rows per problem
    if (counts == 0).any():
        raise ValueError("a probe has no training samples")
    if reduce is None:
        reduce = d > 512 and d >= 2 * n
    c = int(n_classes.max())
    memory.check_fits(
        solver_bytes(G, K, n, d, c, dtype, reduce, history, int(counts.max())),
        device,
        f"fitting {G * K} probes of {n} samples x {d} features ({c} classes) at once",
        "fit fewer at once (ProbeSweep's max_elements or sites_per_pass), or fit on a device with more memory",
    )
    if reduce:
        return _fit_in_training_span(
            X, y, train, n_classes, C, max_iter, tol, history, dtype, standardize, precondition
        )
    return _fit(X, y, train, n_classes, C, max_iter, tol, history, dtype, standardize, precondition and "dense")


def solver_bytes(
    G: int, K: int, n: int, d: int, c: int, dtype: torch.dtype, reduce: bool, history: int = 10, m: int | None = None
) -> int:
    """Peak bytes of :func:`fit_logistic` on ``G * K`` problems (``m``: the most training rows of a
    problem): the augmented features, a few logit-sized tensors, the iterate, gradient, search
    direction and L-BFGS history per problem, and the preconditioner (``(d + 1)^2`` per problem
    when dense); in the training span, the reduced features and bases plus one group's float64
    ``K x n x d`` copies, then the same solver on ``m`` features."""
    size = torch.tensor([], dtype=dtype).element_size()
    if reduce:
        m = n if m is None else m
        span = size * G * K * n * m + 8 * (G * K * m * m + 3 * K * n * d)
        back = 8 * (G * n * d + G * K * n * c + 4 * G * K * d * c)  # mapping the coefficients back
        return span + max(solver_bytes(G * K, 1, n, m, c, dtype, False, history, m), back)
    params = (12 + 2 * history) * G * K * (d + 1) * c
    return size * (G * n * (d + 1) + 6 * G * K * n * c + params + 3 * G * K * (d + 1) ** 2)


def _fit(X, y, train, n_classes, C, max_iter, tol, history, dtype, standardize, preconditioner) -> LogisticFit:
    """The solver of :func:`fit_logistic` on normalized inputs (``X [G, n, d]``, ``y`` and
    ``train [G, K, n]``, ``n_classes [G, K]``). ``preconditioner``: ``"dense"`` (the Cholesky
    factor of ``a R + lam I``), ``"diagonal"`` (its diagonal: exact when ``R`` is diagonal, as in
    the training span's coordinates) or ``False``."""
    G, n, d = X.shape
    K = y.shape[1]
    device = X.device
    c = int(n_classes.max())
    n_train = train.sum(-1).to(dtype)  # [G, K]
    C_eff = torch.where(n_classes == 2, C / 2.0, C).to(dtype)
    W = {}  # the working set: every per-group tensor, sliced together when groups finish
    W["lam"] = 1.0 / (C_eff * n_train)  # [G, K]
    W["Xa"] = torch.cat([X, torch.ones(G, n, 1, dtype=dtype, device=device)], -1)  # [G, n, d + 1]
    pad = torch.arange(c, device=device) >= n_classes[..., None]  # [G, K, c] padded classes
    W["bias"] = torch.zeros(G, K, 1, c, dtype=dtype, device=device).masked_fill(pad[:, :, None, :], -1e4)
    W["weight"] = train.to(dtype) / n_train[..., None]  # [G, K, n], zero outside the training rows
    W["y"] = torch.where(train, y, torch.zeros_like(y)).clamp(min=0)[..., None]  # [G, K, n, 1]
    if standardize:
        W["scale"], W["shift"] = _scaling(W["weight"], X)
    reg_mask = torch.ones(d + 1, 1, dtype=dtype, device=device)
    reg_mask[-1] = 0.0  # no penalty on the intercept
    if preconditioner:
        W["precond"] = _preconditioner(W, n_classes, standardize, d, diagonal=preconditioner == "diagonal")

    def effective(theta):  # standardized-space parameters -> raw-space parameters
        if not standardize:
            return theta
        w, b = theta[..., :d, :], theta[..., d, :]
        b_eff = b - torch.einsum("gkd,gkdc->gkc", W["shift"], w)
        return torch.cat([w * W["scale"][..., None], b_eff[..., None, :]], -2)

    def pullback(g_eff):  # gradient w.r.t. raw-space parameters -> standardized-space
        if not standardize:
            return g_eff
        gw = g_eff[..., :d, :] * W["scale"][..., None] - W["shift"][..., None] * g_eff[..., d:, :]
        return torch.cat([gw, g_eff[..., d:, :]], -2)

    def logp_of(theta):  # padded classes get a -1e4 logit: probability exactly 0 in float32/64
        z = torch.einsum("gnd,gkdc->gknc", W["Xa"], effective(theta)) + W["bias"]
        return torch.log_softmax(z, -1)

    def objective(theta, logp):
        penalty = 0.5 * W["lam"] * ((theta * reg_mask) ** 2).sum((-1, -2))
        return -(logp.gather(-1, W["y"])[..., 0] * W["weight"]).sum(-1) + penalty

    def value(theta):  # -> f [G, K]
        return objective(theta, logp_of(theta))

    def value_and_grad(theta):
        logp = logp_of(theta)
        f = objective(theta, logp)
        dz = logp.exp_()
        dz.scatter_add_(-1, W["y"], torch.full_like(W["y"], -1, dtype=dz.dtype))  # softmax - onehot
        dz *= W["weight"][..., None]
        g = pullback(torch.einsum("gnd,gknc->gkdc", W["Xa"], dz)) + W["lam"][..., None, None] * theta * reg_mask
        return f, g

    def precond(v):  # approximate inverse Hessian (see _preconditioner), or the identity
        if preconditioner == "diagonal":
            return v / W["precond"][..., None]
        return torch.cholesky_solve(v, W["precond"]) if preconditioner else v

    def dot(a, b):
        return (a * b).sum((-1, -2))

    out_theta = torch.zeros(G, K, d + 1, c, dtype=dtype, device=device)
    out_grad = torch.zeros(G, K, dtype=dtype, device=device)
    out_iter = torch.zeros(G, K, dtype=torch.long, device=device)
    groups = torch.arange(G, device=device)  # which original groups the working set holds
    theta = torch.zeros(G, K, d + 1, c, dtype=dtype, device=device)
    f, g = value_and_grad(theta)
    S: list[Tensor] = []
    Yh: list[Tensor] = []
    rho: list[Tensor] = []
    active = g.abs().amax((-1, -2)) > tol
    n_iter = torch.zeros(G, K, dtype=torch.long, device=device)

    def retire(keep):  # write finished groups to the outputs; slice the working set
        nonlocal theta, f, g, active, n_iter, groups
        done = ~keep
        out_theta[groups[done]] = theta[done]
        out_grad[groups[done]] = g[done].abs().amax((-1, -2))
        out_iter[groups[done]] = n_iter[done]
        for key in W:
            W[key] = W[key][keep]
        theta, f, g, active, n_iter, groups = theta[keep], f[keep], g[keep], active[keep], n_iter[keep], groups[keep]
        for hist in (S, Yh, rho):
            hist[:] = [h[keep] for h in hist]

    for _it in range(max_iter):
        busy = active.any(-1)
        if not busy.any():
            break
        if busy.sum() < 0.75 * len(busy):
            retire(busy)
        # two-loop recursion, per problem
        q = g.clone()
        alphas = []
        for s_j, y_j, r_j in zip(reversed(S), reversed(Yh), reversed(rho)):
            a = r_j * dot(s_j, q)
            q -= a[..., None, None] * y_j
            alphas.append(a)
        r = precond(q)
        if S:
            yPy = dot(Yh[-1], precond(Yh[-1]))
            gamma = torch.where(rho[-1] > 0, 1.0 / (rho[-1] * yPy).clamp(min=1e-30), torch.ones_like(yPy))
        else:
            gamma = torch.ones_like(f) if preconditioner else 1.0 / g.abs().sum((-1, -2)).clamp(min=1.0)
        r = gamma[..., None, None] * r
        for (s_j, y_j, r_j), a in zip(zip(S, Yh, rho), reversed(alphas)):
            b = r_j * dot(y_j, r)
            r += s_j * (a - b)[..., None, None]
        direction = -r
        slope = dot(g, direction)
        bad = slope >= 0  # not a descent direction: fall back to steepest descent
        direction = torch.where(bad[..., None, None], -g, direction)
        slope = torch.where(bad, -dot(g, g), slope)
        direction = direction * active[..., None, None]
        # Armijo backtracking, per problem
        step = torch.ones_like(f)
        for _ in range(40):
            f_new = value(theta + step[..., None, None] * direction)
            ok = (f_new <= f + 1e-4 * step * slope) | ~active
            if ok.all():
                break
            step = torch.where(ok, step, step * 0.5)
        theta_new = theta + step[..., None, None] * direction
        f_new, g_new = value_and_grad(theta_new)
        s, yv = theta_new - theta, g_new - g
        sy = dot(s, yv)
        keep = (sy > 1e-12 * dot(yv, yv).clamp(min=1e-30)) & active
        S.append(s * keep[..., None, None])
        Yh.append(yv * keep[..., None, None])
        rho.append(torch.where(keep, 1.0 / sy.clamp(min=1e-30), torch.zeros_like(sy)))
        if len(S) > history:
            S.pop(0), Yh.pop(0), rho.pop(0)
        theta = torch.where(active[..., None, None], theta_new, theta)
        stalled = (f - f_new).abs() <= 1e-12 * f.abs().clamp(min=1.0)
        f = torch.where(active, f_new, f)
        g = torch.where(active[..., None, None], g_new, g)
        n_iter += active.long()
        active = active & (g.abs().amax((-1, -2)) > tol) & ~(stalled & (step < 1e-6))
    retire(torch.zeros(len(groups), dtype=torch.bool, device=device))
    # back to the full set of groups, in raw-feature coordinates
    if standardize:
        W["scale"], W["shift"] = _scaling(train.to(dtype) / n_train[..., None], X)
    theta = effective(out_theta).masked_fill(pad[:, :, None, :], 0.0)
    return LogisticFit(theta[:, :, :-1, :], theta[:, :, -1, :], out_iter, out_grad <= tol)


def _fit_in_training_span(X, y, train, n_classes, C, max_iter, tol, history, dtype, standardize, precondition):
    """The same fits with each problem's features projected onto the span of its training rows.

    With an L2 penalty the optimum lies in the row space of the (standardized) training features:
    at the optimum ``lam W = -X_train^T (P - Y) / n``. So with ``V`` an orthonormal basis of that
    row space (``[d, r]``, ``r <= n_train``), ``W = V B`` and ``||W|| = ||B||``, and the problem
    in the ``r`` features ``Z = X V`` has the same objective, the same optimum and the same
    predictions. When ``d`` is large and ``n`` small (a hidden state of a real model, a few
    hundred subjects), every solver step then costs ``n_train`` instead of ``d`` per row.

    ``V`` is never formed: with the eigendecomposition ``X_train X_train^T = U L U^T`` of the
    training Gram matrix, ``V = X_train^T U L^-1/2``, so ``Z = (X X_train^T) U L^-1/2`` and
    ``W = X_train^T (U L^-1/2 B)``: one product of ``d``-long rows (every row against the training
    rows), the rest in ``n x n_train``. Directions with eigenvalue below ``1e-10`` of the largest
    are dropped (zero columns, whose coefficients the penalty keeps at zero). In these coordinates
    the training rows are ``U L^1/2``: their second-moment matrix is diagonal (``L / n_train``),
    and with standardized (so centred) features uncorrelated with the intercept too, so the
    solver's preconditioner is exactly its diagonal and costs nothing to apply."""
    G, n, d = X.shape
    K = y.shape[1]
    weight = train.to(dtype) / train.sum(-1, keepdim=True).to(dtype)
    if standardize:
        scale, shift = _scaling(weight, X)  # [G, K, d]
    m = int(train.sum(-1).max())  # training rows, gathered first and padded to the largest count
    rows = torch.argsort((~train).to(torch.int8), dim=-1, stable=True)[..., :m]  # [G, K, m]
    valid = torch.gather(train, -1, rows).double()  # [G, K, m]
    Z = torch.zeros(G, K, n, m, dtype=dtype, device=X.device)
    basis = torch.zeros(G, K, m, m, dtype=torch.float64, device=X.device)  # U L^-1/2
    for g in range(G):  # one group at a time: at most K x n x d values in float64
        Xs = X[g].double()[None].expand(K, n, d)  # [K, n, d]
        if standardize:
            Xs = Xs * scale[g, :, None, :].double() - shift[g, :, None, :].double()  # [K, n, d]
        Xtr = torch.gather(Xs, 1, rows[g, :, :, None].expand(K, m, d)) * valid[g, :, :, None]  # [K, m, d]
        A = Xs @ Xtr.transpose(-1, -2)  # [K, n, m]: every row against the training rows
        gram = torch.gather(A, 1, rows[g, :, :, None].expand(K, m, m)) * valid[g, :, :, None]
        evals, U = torch.linalg.eigh(gram)  # reads the lower triangle
        kept = evals > 1e-10 * evals.amax(-1, keepdim=True).clamp(min=1e-300)
        inv_sqrt = torch.where(kept, evals.clamp(min=1e-300).rsqrt(), torch.zeros_like(evals))
        basis[g] = U * inv_sqrt[..., None, :]
        Z[g] = (A @ basis[g]).to(dtype)
    fit = _fit(
        Z.reshape(G * K, n, m),
        y.reshape(G * K, 1, n),
        train.reshape(G * K, 1, n),
        n_classes.reshape(G * K, 1),
        C,
        max_iter,
        tol,
        history,
        dtype,
        False,
        precondition and ("diagonal" if standardize else "dense"),
    )
    c = fit.coef.shape[-1]
    coef = basis @ fit.coef.reshape(G, K, m, c).double() * valid[..., None]  # [G, K, m, c]: U L^-1/2 B
    full = torch.zeros(G, K, n, c, dtype=torch.float64, device=X.device).scatter_(
        2, rows[..., None].expand(G, K, m, c), coef
    )  # on all n rows, zero outside the training rows
    # W = X_train~^T (U L^-1/2 B), with x~ = x * scale - shift: scale * (X^T full) - shift * sum(full)
    w = torch.einsum("gnd,gknc->gkdc", X.double(), full)
    b = fit.intercept.reshape(G, K, c).double()
    if standardize:
        w = w * scale[..., None].double() - shift[..., None].double() * full.sum(2)[:, :, None, :]
        b = b - torch.einsum("gkd,gkdc->gkc", shift.double(), w)  # back to raw features
        w = w * scale[..., None].double()
    return LogisticFit(w.to(dtype), b.to(dtype), fit.n_iter.reshape(G, K), fit.converged.reshape(G, K))


def _scaling(weight: Tensor, X: Tensor) -> tuple[Tensor, Tensor]:
    """Per-problem ``1 / sigma`` and ``mu / sigma`` of the training rows (``weight`` sums to 1 over
    them), like StandardScaler: population variance, and scale 1 for a constant feature."""
    w64, x64 = weight.double(), X.double()
    mu = torch.einsum("gkn,gnd->gkd", w64, x64)
    var = (torch.einsum("gkn,gnd->gkd", w64, x64 * x64) - mu * mu).clamp(min=0)
    sd = var.sqrt()
    sd = torch.where(sd <= 1e-7 * mu.abs().clamp(min=1.0), torch.ones_like(sd), sd)
    return (1 / sd).to(X.dtype), (mu / sd).to(X.dtype)


def _preconditioner(W: dict, n_classes: Tensor, standardize: bool, d: int, diagonal: bool = False) -> Tensor:
    """Cholesky factors ``[G, K, d + 1, d + 1]`` of ``a R + lam I`` (see module docstring), or with
    ``diagonal`` its diagonal ``[G, K, d + 1]`` (used where ``R`` is diagonal; see
    :func:`_fit_in_training_span`)."""
    Xa, w = W["Xa"], W["weight"]
    c = n_classes.to(Xa.dtype)
    a = (1 - 1 / c) / c
    reg = torch.ones(d + 1, dtype=Xa.dtype, device=Xa.device)
    reg[d] = 0.0
    if diagonal:
        assert not standardize, "the diagonal preconditioner acts on features as given"
        R_diag = torch.einsum("gkn,gnd->gkd", w, Xa * Xa)
        return a[..., None] * R_diag + W["lam"][..., None] * reg + 1e-8
    R = torch.einsum("gkn,gnd,gne->gkde", w, Xa, Xa)  # raw second moments of the training rows
    if standardize:  # R in standardized coordinates: A R A^T with x~ = x * scale - shift, 1
        A = torch.zeros(*R.shape, dtype=R.dtype, device=R.device)
        idx = torch.arange(d, device=R.device)
        A[..., idx, idx] = W["scale"]
        A[..., :d, d] = -W["shift"]
        A[..., d, d] = 1.0
        R = A @ R @ A.transpose(-1, -2)
    M = a[..., None, None] * R + torch.diag_embed(W["lam"][..., None] * reg + 1e-8)
    # A constant feature makes a direction of M zero up to rounding, and the rounding (summation
    # order, so the thread count and the CPU) can make it slightly negative. The preconditioner
    # only speeds the solver up (the optimum is unchanged), so such problems get a small jitter.
    chol, info = torch.linalg.cholesky_ex(M)
    jitter = 1e-6
    while (info > 0).any() and jitter < 1e3:
        scale = M.diagonal(dim1=-2, dim2=-1).abs().mean(-1).clamp(min=1.0)
        bad = (info > 0)[..., None, None]
        M = torch.where(bad, M + jitter * scale[..., None, None] * torch.eye(d + 1, dtype=M.dtype, device=M.device), M)
        chol, info = torch.linalg.cholesky_ex(M)
        jitter *= 10
    if (info > 0).any():
        raise RuntimeError("the probe solver's preconditioner is not positive definite even with jitter")
    return chol
