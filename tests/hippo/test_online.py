"""OnlineSGPR and OnlineELBO against closed-form batch SGPR (Titsias) and Bui et al.'s pseudo-data form."""

import copy

import gpytorch
import pytest
import torch

from gpytorch_hippo.inducing import InducingPoints
from gpytorch_hippo.online import OnlineELBO, OnlineSGPR
from gpytorch_hippo.variational import InterdomainVariationalStrategy

DT = torch.float64
NOISE = 0.05


def stream(n=90, seed=0):
    g = torch.Generator().manual_seed(seed)
    X = torch.linspace(0, 10, n, dtype=DT).unsqueeze(-1)
    y = torch.sin(X[:, 0]) + 0.2 * torch.randn(n, generator=g, dtype=DT)
    return X, y


def make_kernel():
    kernel = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel()).to(DT)
    kernel.base_kernel.lengthscale = 1.0
    kernel.outputscale = 1.5
    return kernel


def make_likelihood():
    likelihood = gpytorch.likelihoods.GaussianLikelihood().to(DT)
    likelihood.noise = NOISE
    return likelihood


def k(a, b):
    """RBF with lengthscale 1 and outputscale 1.5, written out."""
    return 1.5 * torch.exp(-0.5 * (a - b.T).square())


def titsias(X, y, Z, Xs, jitter):
    """Batch SGPR (thesis eq. ``optimal_qu_svgp`` and the predictive after it), naive dense algebra."""
    Kzz = k(Z, Z) + jitter * torch.eye(len(Z), dtype=DT)
    Kzx, Ksz = k(Z, X), k(Xs, Z)
    Mmat = Kzz + Kzx @ Kzx.T / NOISE
    mean = Ksz @ torch.linalg.solve(Mmat, Kzx @ y) / NOISE
    cov = k(Xs, Xs) - Ksz @ torch.linalg.solve(Kzz, Ksz.T) + Ksz @ torch.linalg.solve(Mmat, Ksz.T)
    qu_mean = Kzz @ torch.linalg.solve(Mmat, Kzx @ y) / NOISE
    qu_cov = Kzz @ torch.linalg.solve(Mmat, Kzz)
    Q = Kzx.T @ torch.linalg.solve(Kzz, Kzx)
    bound = torch.distributions.MultivariateNormal(torch.zeros(len(y), dtype=DT), Q + NOISE * torch.eye(len(y), dtype=DT)).log_prob(y)
    bound = bound - 0.5 / NOISE * (1.5 * len(y) - Q.diagonal().sum())
    return mean, cov, qu_mean, qu_cov, bound


def bui_posterior(X, y, Zb, Za, ma, Sa, Kaa_old, Xs, jitter):
    """Bui et al. (2017) optimal q(b) as regression on augmented data [y; pseudo-obs of a] with
    noise blockdiag(σ² I, D_a + N_a), D_a^{-1} = S_a^{-1} - K'_aa^{-1}; naive inverses. The jitter is
    white noise on the inducing variables, so an old point that is not kept adds its jitter ``N_a``
    to its pseudo-observation's noise (a kept point shares its jitter with the new set)."""
    Kbb = k(Zb, Zb) + jitter * torch.eye(len(Zb), dtype=DT)
    shared = (Zb == Za.T).to(DT)
    Kba = k(Zb, Za) + jitter * shared
    Kbx = k(Zb, X)
    Da = torch.linalg.inv(torch.linalg.inv(Sa) - torch.linalg.inv(Kaa_old))
    Da_inv = torch.linalg.inv(Da + torch.diag(jitter * (1 - shared.sum(0))))
    Kbb_inv = torch.linalg.inv(Kbb)
    precision = Kbb_inv + Kbb_inv @ (Kbx @ Kbx.T / NOISE + Kba @ Da_inv @ Kba.T) @ Kbb_inv
    Sb = torch.linalg.inv(precision)
    pseudo_y = Da @ torch.linalg.solve(Sa, ma)  # D_a S_a^{-1} m_a
    mb = Sb @ Kbb_inv @ (Kbx @ y / NOISE + Kba @ Da_inv @ pseudo_y)
    Ksb = k(Xs, Zb)
    mean = Ksb @ Kbb_inv @ mb
    cov = k(Xs, Xs) - Ksb @ Kbb_inv @ Ksb.T + Ksb @ Kbb_inv @ Sb @ Kbb_inv @ Ksb.T
    return mean, cov


def test_three_tasks_with_fixed_points_equal_batch_sgpr():
    X, y = stream()
    Z = torch.linspace(0, 10, 15, dtype=DT).unsqueeze(-1)
    Xs = torch.linspace(-1, 11, 40, dtype=DT).unsqueeze(-1)
    model = OnlineSGPR(InducingPoints(Z, learn=False), make_kernel(), make_likelihood())
    bounds = [model.update(X[i * 30 : (i + 1) * 30], y[i * 30 : (i + 1) * 30]) for i in range(3)]
    jitter = gpytorch.settings.variational_cholesky_jitter.value(DT)
    mean, cov, qu_mean, qu_cov, bound = titsias(X, y, Z, Xs, jitter)
    model.eval()
    with torch.no_grad():
        pred = model(Xs)
        predictive = model.likelihood(model(Xs))
        qu = model.inducing_posterior()
    assert (pred.mean - mean).abs().max() < 1e-6
    assert (pred.covariance_matrix - cov).abs().max() < 1e-6
    assert (predictive.variance - cov.diagonal() - NOISE).abs().max() < 1e-6
    assert (qu.mean - qu_mean).abs().max() < 1e-6 and (qu.covariance_matrix - qu_cov).abs().max() < 1e-6
    # the per-task online bounds telescope to the batch collapsed bound
    assert abs(sum(bounds).item() - bound.item()) < 1e-6
    assert model.num_tasks.item() == 3


def test_changing_inducing_points_matches_bui_pseudo_data_form():
    X, y = stream(60, seed=1)
    Za = torch.linspace(0, 5, 8, dtype=DT).unsqueeze(-1)
    Zb = torch.cat([Za[::2], torch.linspace(5.5, 10, 4, dtype=DT).unsqueeze(-1)])  # half kept, half new
    Xs = torch.linspace(-1, 11, 30, dtype=DT).unsqueeze(-1)
    jitter = 1e-6
    model = OnlineSGPR(InducingPoints(Za, learn=False, jitter=jitter), make_kernel(), make_likelihood())
    model.update(X[:30], y[:30])
    model.inducing_variables = InducingPoints(Zb, learn=False, jitter=jitter)
    model.update(X[30:], y[30:])
    _, _, ma, Sa, _ = titsias(X[:30], y[:30], Za, Xs, jitter)
    Kaa_old = k(Za, Za) + jitter * torch.eye(8, dtype=DT)
    mean, cov = bui_posterior(X[30:], y[30:], Zb, Za, ma, Sa, Kaa_old, Xs, jitter)
    with torch.no_grad():
        pred = model(Xs)
    assert (pred.mean - mean).abs().max() < 1e-6
    assert (pred.covariance_matrix - cov).abs().max() < 1e-6


def test_training_hyperparameters_improves_the_online_bound():
    X, y = stream(60, seed=2)
    Z = torch.linspace(0, 10, 10, dtype=DT).unsqueeze(-1)
    likelihood = make_likelihood()
    likelihood.noise = 1.0
    model = OnlineSGPR(InducingPoints(Z, learn=True), make_kernel(), likelihood)
    before = model.log_bound(X[:30], y[:30]).item()
    after = model.update(X[:30], y[:30], num_iter=30, lr=0.1).item()
    assert after > before + 5.0
    assert model.likelihood.noise.item() < 0.7
    assert not torch.equal(model.inducing_variables.points, Z)
    assert not model.posterior_inducing_variables.points.requires_grad
    frozen = model.posterior_inducing_variables.points.clone()
    second = model.update(X[30:], y[30:], num_iter=5, lr=0.05)
    assert torch.isfinite(second)
    assert torch.equal(model.posterior_inducing_variables.points, model.inducing_variables.points)
    assert not torch.equal(frozen, model.inducing_variables.points)


def test_num_iter_zero_changes_no_parameter_and_state_round_trips():
    X, y = stream(40)
    points = InducingPoints(torch.linspace(0, 10, 6, dtype=DT))  # 6 points: too few on purpose, the test is about the state
    model = OnlineSGPR(points, make_kernel(), make_likelihood(), captured_variance_warning=None)
    params = {n: p.detach().clone() for n, p in model.named_parameters()}
    model.update(X[:20], y[:20])
    assert all(torch.equal(p, params[n]) for n, p in model.named_parameters() if n in params)
    fresh = OnlineSGPR(InducingPoints(torch.zeros(6, dtype=DT)), make_kernel(), make_likelihood())
    fresh.load_state_dict(model.state_dict())
    clone = copy.deepcopy(model)
    with torch.no_grad():
        ref = model(X[20:])
        for other in (fresh, clone):
            assert torch.allclose(other(X[20:]).mean, ref.mean, atol=1e-12)
            assert torch.allclose(other(X[20:]).variance, ref.variance, atol=1e-12)
        clone.update(X[20:], y[20:])
        assert torch.allclose(model(X[20:]).mean, ref.mean, atol=1e-12)


def test_online_sgpr_bad_inputs():
    model = OnlineSGPR(InducingPoints(torch.linspace(0, 1, 3, dtype=DT)), make_kernel(), make_likelihood())
    x = torch.linspace(0, 1, 5, dtype=DT)
    y = torch.zeros(5, dtype=DT)
    with pytest.raises(ValueError, match="train_y contains NaN"):
        model.update(x, torch.tensor([0.0, float("nan"), 0, 0, 0], dtype=DT))
    with pytest.raises(ValueError, match="train_y must have shape"):
        model.update(x, torch.zeros(4, dtype=DT))
    assert model.update(torch.zeros(0, 1, dtype=DT), torch.zeros(0, dtype=DT)) is None  # an empty task: a no-op
    with pytest.raises(ValueError, match="train_y must have shape"):
        model.update(torch.zeros(3, 1, dtype=DT), torch.zeros(0, dtype=DT))
    with pytest.raises(ValueError, match="x must have shape"):
        model.update(torch.zeros(5, 2, dtype=DT), y)
    with pytest.raises(ValueError, match="num_iter"):
        model.update(x, y, num_iter=-1)
    with pytest.raises(ValueError, match="lr"):
        model.update(x, y, num_iter=1, lr=0.0)
    with pytest.raises(TypeError, match="likelihood"):
        OnlineSGPR(InducingPoints(x), make_kernel(), gpytorch.likelihoods.BernoulliLikelihood())
    with pytest.raises(RuntimeError, match="update"):
        model.inducing_posterior()
    assert model.num_tasks.item() == 0


class SVGP(gpytorch.models.ApproximateGP):
    def __init__(self, Z, whitened, distribution="natural", likelihood_free=True):
        if distribution == "natural":
            q = gpytorch.variational.NaturalVariationalDistribution(len(Z))
        else:
            q = gpytorch.variational.CholeskyVariationalDistribution(len(Z))
        super().__init__(InterdomainVariationalStrategy(self, InducingPoints(Z, learn=False), q, whitened=whitened))
        self.mean_module = gpytorch.means.ZeroMean()
        self.covar_module = make_kernel()

    def forward(self, x):
        return gpytorch.distributions.MultivariateNormal(self.mean_module(x), self.covar_module(x))


@pytest.mark.parametrize("whitened", [False, True])
def test_online_elbo_with_optimal_q_equals_collapsed_online_sgpr(whitened):
    """Two tasks, different inducing points: one natural-gradient step of size 1 is the exact
    optimum of a conjugate bound, so OnlineELBO must land on OnlineSGPR's closed form."""
    X, y = stream(60, seed=3)
    Z1 = torch.linspace(0, 5, 8, dtype=DT).unsqueeze(-1)
    Z2 = torch.linspace(0.3, 10, 8, dtype=DT).unsqueeze(-1)
    tasks = [(X[:30], y[:30]), (X[30:], y[30:])]
    collapsed = OnlineSGPR(InducingPoints(Z1, learn=False), make_kernel(), make_likelihood())
    bounds = [collapsed.update(*tasks[0])]
    collapsed.inducing_variables = InducingPoints(Z2, learn=False)
    bounds.append(collapsed.update(*tasks[1]))

    likelihood = make_likelihood()
    model = SVGP(Z1, whitened).to(DT).train()
    elbo = OnlineELBO(likelihood, model, num_data=30)
    values = []
    for task, (xs, ys) in enumerate(tasks):
        if task == 1:
            elbo.end_task()
            model.variational_strategy.inducing_variables = InducingPoints(Z2, learn=False)
        optimizer = gpytorch.optim.NGD(model.variational_parameters(), num_data=30, lr=1.0)
        for _ in range(2):
            optimizer.zero_grad()
            (-elbo(model(xs), ys)).backward()
            optimizer.step()
        with torch.no_grad():
            values.append(elbo(model(xs), ys).item() * 30)
    model.eval()
    Xs = torch.linspace(-1, 11, 25, dtype=DT).unsqueeze(-1)
    with torch.no_grad():
        pred, ref = model(Xs), collapsed(Xs)
    # the whitened strategy adds GPyTorch's jitter (1e-6) to the data variance: ELL shifts by
    # N * jitter / (2 σ²) = 3e-4 and the covariance diagonal by 1e-6
    tol_value, tol_cov = (1e-3, 2e-6) if whitened else (1e-8, 1e-8)
    for value, bound in zip(values, bounds):
        assert abs(value - bound.item()) < tol_value
    assert (pred.mean - ref.mean).abs().max() < 1e-8
    assert (pred.covariance_matrix - ref.covariance_matrix).abs().max() < tol_cov


@pytest.mark.parametrize("likelihood_cls", [gpytorch.likelihoods.BernoulliLikelihood, gpytorch.likelihoods.GaussianLikelihood])
def test_online_terms_vanish_when_nothing_changed(likelihood_cls):
    """With a = b and q(b) = q_old(a): KL(q̃||p_old) - KL(q̃||q_old) = KL(q||p), so the online
    correction cancels the new KL exactly, for any likelihood."""
    torch.manual_seed(4)
    Z = torch.linspace(0, 10, 6, dtype=DT).unsqueeze(-1)
    model = SVGP(Z, whitened=True, distribution="cholesky").to(DT)
    q = model.variational_strategy._variational_distribution
    q.variational_mean.data.normal_()
    q.chol_variational_covar.data.copy_(0.3 * torch.tril(torch.randn(6, 6, dtype=DT)) + 0.5 * torch.eye(6, dtype=DT))
    model.variational_strategy.variational_params_initialized.fill_(1)
    elbo = OnlineELBO(likelihood_cls().to(DT), model, num_data=10)
    X = torch.linspace(0, 10, 10, dtype=DT).unsqueeze(-1)
    y = (torch.sin(X[:, 0]) > 0).to(DT)
    kl = model.variational_strategy.kl_divergence()
    assert kl.item() > 0.5
    plain = gpytorch.mlls.VariationalELBO(elbo.likelihood, model, num_data=10)(model(X), y)
    assert torch.allclose(elbo(model(X), y), plain, atol=1e-12)
    elbo.end_task()
    assert abs(elbo.online_kl_divergence().item()) < 1e-8
    online = elbo(model(X), y)
    assert abs(online.item() - (plain.item() + kl.item() / 10)) < 1e-8


def test_online_elbo_multitask_and_bad_inputs():
    T, Mz = 2, 5
    Z = torch.linspace(0, 1, Mz, dtype=DT).unsqueeze(-1).expand(T, Mz, 1)

    class MT(gpytorch.models.ApproximateGP):
        def __init__(self):
            q = gpytorch.variational.CholeskyVariationalDistribution(Mz, batch_shape=torch.Size([T]))
            base = InterdomainVariationalStrategy(self, InducingPoints(Z), q)
            super().__init__(gpytorch.variational.IndependentMultitaskVariationalStrategy(base, num_tasks=T))
            self.mean_module = gpytorch.means.ZeroMean(batch_shape=torch.Size([T]))
            self.covar_module = gpytorch.kernels.RBFKernel(batch_shape=torch.Size([T]))

        def forward(self, x):
            return gpytorch.distributions.MultivariateNormal(self.mean_module(x), self.covar_module(x))

    model = MT().to(DT)
    likelihood = gpytorch.likelihoods.MultitaskGaussianLikelihood(num_tasks=T).to(DT)
    elbo = OnlineELBO(likelihood, model, num_data=8)
    X = torch.rand(8, 1, dtype=DT)
    Y = torch.randn(8, T, dtype=DT)
    (-elbo(model(X), Y)).backward()
    elbo.end_task()
    kl = elbo.online_kl_divergence()
    assert kl.shape == torch.Size([]) and abs(kl.item()) < 1e-8
    Y[0, 1] = float("nan")
    with pytest.raises(ValueError, match="target contains NaN"):
        elbo(model(X), Y)
    with pytest.raises(ValueError, match="does not match"):
        elbo(model(X), torch.zeros(7, T, dtype=DT))
    with pytest.raises(ValueError, match="num_data"):
        OnlineELBO(likelihood, model, num_data=0)
    with pytest.raises(ValueError, match="beta"):
        OnlineELBO(likelihood, model, num_data=3, beta=-1.0)
    # end_task can set the next task's size (the KL normaliser of the online ELBO)
    elbo.end_task(num_data=4)
    assert elbo.num_data == 4
    with pytest.raises(ValueError, match="num_data"):
        elbo.end_task(num_data=0)

    class Plain(gpytorch.models.ApproximateGP):
        def __init__(self):
            q = gpytorch.variational.CholeskyVariationalDistribution(3)
            super().__init__(gpytorch.variational.VariationalStrategy(self, torch.zeros(3, 1), q))

    with pytest.raises(TypeError, match="InterdomainVariationalStrategy"):
        OnlineELBO(gpytorch.likelihoods.GaussianLikelihood(), Plain(), num_data=3)


def test_lbfgs_fit_reaches_the_exact_gp_optimum_and_reports_it():
    """With inducing points at the data the task's bound is the exact log marginal likelihood: L-BFGS
    (``optimizer="lbfgs"``) reaches the optimum BoTorch's ``fit_gpytorch_mll`` finds for the exact GP
    (``SingleTaskGP`` with the same kernel, likelihood and zero mean), converges, and reports it; 30 Adam
    steps (the former README recipe) stop well below it."""
    from botorch.fit import fit_gpytorch_mll

    generator = torch.Generator().manual_seed(0)
    x = torch.sort(torch.rand(40, generator=generator, dtype=DT) * 10).values
    y = torch.sin(x) + 0.1 * torch.randn(40, generator=generator, dtype=DT)

    def modules():
        return gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel()).double(), gpytorch.likelihoods.GaussianLikelihood().double()

    reports = {}
    for optimizer, num_iter in (("lbfgs", 200), ("adam", 30)):
        kernel, likelihood = modules()
        model = OnlineSGPR(InducingPoints(x.unsqueeze(-1), learn=False, jitter=1e-10), kernel, likelihood)
        model.update(x, y, num_iter=num_iter, optimizer=optimizer)
        reports[optimizer] = (model.last_fit, kernel, likelihood)

    from botorch.models import SingleTaskGP

    kernel, likelihood = modules()
    exact = SingleTaskGP(
        x.unsqueeze(-1),
        y.unsqueeze(-1),
        likelihood=likelihood,
        covar_module=kernel,
        mean_module=gpytorch.means.ZeroMean(),
        outcome_transform=None,
    )
    mll = gpytorch.mlls.ExactMarginalLogLikelihood(likelihood, exact)
    fit_gpytorch_mll(mll)
    report, ours, our_likelihood = reports["lbfgs"]
    assert report.status == "success" and report.iterations < 200 and report.bound_after > report.bound_before
    torch.testing.assert_close(ours.base_kernel.lengthscale, kernel.base_kernel.lengthscale, rtol=1e-3, atol=0)
    torch.testing.assert_close(our_likelihood.noise, likelihood.noise, rtol=1e-3, atol=0)
    exact.train()
    with torch.no_grad():
        evidence = mll(exact(x.unsqueeze(-1)), y).item() * 40
    assert report.bound_after == pytest.approx(evidence, abs=1e-3)
    adam = reports["adam"][0]
    assert adam.status == "stopped" and adam.iterations == 30 and adam.bound_after < report.bound_after - 1.0
    with pytest.raises(ValueError, match="optimizer"):
        OnlineSGPR(InducingPoints(x[:5].unsqueeze(-1)), *modules()).update(x, y, num_iter=3, optimizer="sgd")
