"""InterdomainVariationalStrategy against GPyTorch's own VariationalStrategy / UnwhitenedVariationalStrategy."""

import ast
import copy
import pathlib

import gpytorch
import pytest
import torch

from gpytorch_hippo import variational
from gpytorch_hippo.inducing import HiPPOInducingVariables, InducingPoints
from gpytorch_hippo.variational import InterdomainVariationalStrategy
from probseq._compat import VariationalStrategyBase

DT = torch.float64
M, N = 8, 40


def data(dtype=DT, seed=0):
    g = torch.Generator().manual_seed(seed)
    X = torch.rand(N, 2, generator=g, dtype=DT) * 4
    y = torch.sin(X.sum(-1)) + 0.1 * torch.randn(N, generator=g, dtype=DT)
    Z = torch.rand(M, 2, generator=g, dtype=DT) * 4
    return X.to(dtype), y.to(dtype), Z.to(dtype)


def make_distribution(kind, batch_shape=torch.Size()):
    if kind == "cholesky":
        return gpytorch.variational.CholeskyVariationalDistribution(M, batch_shape=batch_shape)
    return gpytorch.variational.MeanFieldVariationalDistribution(M, batch_shape=batch_shape)


class Base(gpytorch.models.ApproximateGP):
    def _init_prior(self, batch_shape=torch.Size()):
        self.mean_module = gpytorch.means.ConstantMean(batch_shape=batch_shape)
        self.covar_module = gpytorch.kernels.ScaleKernel(
            gpytorch.kernels.RBFKernel(ard_num_dims=2, batch_shape=batch_shape), batch_shape=batch_shape
        )
        self.mean_module.constant.data.fill_(0.3)
        self.covar_module.base_kernel.lengthscale = torch.tensor([0.7, 1.1])
        self.covar_module.outputscale = 1.3

    def forward(self, x):
        return gpytorch.distributions.MultivariateNormal(self.mean_module(x), self.covar_module(x))


class Ours(Base):
    def __init__(self, Z, whitened=True, kind="cholesky"):
        strategy = InterdomainVariationalStrategy(self, InducingPoints(Z), make_distribution(kind), whitened=whitened)
        super().__init__(strategy)
        self._init_prior()


class Reference(Base):
    def __init__(self, Z, whitened=True, kind="cholesky"):
        cls = gpytorch.variational.VariationalStrategy if whitened else gpytorch.variational.UnwhitenedVariationalStrategy
        super().__init__(cls(self, Z, make_distribution(kind)))
        self._init_prior()


def set_variational(model, seed=3):
    """Put the same random (non-prior) variational parameters into any of the two models."""
    g = torch.Generator().manual_seed(seed)
    q = model.variational_strategy._variational_distribution
    q.variational_mean.data.copy_(torch.randn(M, generator=g, dtype=DT))
    if hasattr(q, "chol_variational_covar"):
        L = torch.tril(torch.randn(M, M, generator=g, dtype=DT)) * 0.3 + 0.5 * torch.eye(M, dtype=DT)
        q.chol_variational_covar.data.copy_(L)
    else:
        q._variational_stddev.data.copy_(0.2 + torch.rand(M, generator=g, dtype=DT))
    model.variational_strategy.variational_params_initialized.fill_(1)


def pair(whitened, kind, dtype=DT):
    X, y, Z = data(dtype)
    ours, ref = Ours(Z, whitened, kind).to(dtype), Reference(Z, whitened, kind).to(dtype)
    set_variational(ours)
    set_variational(ref)
    return ours, ref, X, y


@pytest.mark.parametrize("whitened", [True, False])
@pytest.mark.parametrize("kind", ["cholesky", "meanfield"])
def test_equals_gpytorch_strategy(whitened, kind):
    ours, ref, X, y = pair(whitened, kind)
    likelihood = gpytorch.likelihoods.GaussianLikelihood().to(DT)
    likelihood.noise = 0.2
    for mll_cls in (gpytorch.mlls.VariationalELBO, gpytorch.mlls.PredictiveLogLikelihood):
        values = []
        for model in (ours, ref):
            model.train()
            values.append(mll_cls(likelihood, model, num_data=100)(model(X), y))
        assert abs(values[0].item() - values[1].item()) < 1e-8, mll_cls.__name__
    assert abs(ours.variational_strategy.kl_divergence().item() - ref.variational_strategy.kl_divergence().item()) < 1e-8
    ours.eval(), ref.eval()
    Xs = data(seed=5)[0][:15]
    with torch.no_grad():
        p, r = ours(Xs), ref(Xs)
    assert (p.mean - r.mean).abs().max() < 1e-8
    assert (p.covariance_matrix - r.covariance_matrix).abs().max() < 1e-8


def test_minibatch_training_tracks_gpytorch_step_by_step():
    ours, ref, X, y = pair(True, "cholesky")
    likelihoods = [gpytorch.likelihoods.GaussianLikelihood().to(DT) for _ in range(2)]
    optimizers, mlls = [], []
    for model, likelihood in zip((ours, ref), likelihoods):
        model.train(), likelihood.train()
        params = list(model.parameters()) + list(likelihood.parameters())
        optimizers.append(torch.optim.Adam(params, lr=0.05))
        mlls.append(gpytorch.mlls.VariationalELBO(likelihood, model, num_data=N))
    for step in range(6):
        idx = torch.arange(step * 10, step * 10 + 10) % N
        for model, opt, mll in zip((ours, ref), optimizers, mlls):
            opt.zero_grad()
            (-mll(model(X[idx]), y[idx])).backward()
            opt.step()
    assert torch.allclose(ours.variational_strategy.inducing_variables.points, ref.variational_strategy.inducing_points, atol=1e-8)
    assert torch.allclose(ours.covar_module.base_kernel.lengthscale, ref.covar_module.base_kernel.lengthscale, atol=1e-8)
    q_ours = ours.variational_strategy._variational_distribution
    q_ref = ref.variational_strategy._variational_distribution
    assert torch.allclose(q_ours.chol_variational_covar, q_ref.chol_variational_covar, atol=1e-8)
    names = [n for n, _ in ours.named_parameters()]
    assert not any("inducing_points" in n for n in names)
    assert "variational_strategy.inducing_variables.points" in names


def test_eval_cache_refreshes_when_hyperparameters_change():
    ours, ref, X, _ = pair(True, "cholesky")
    ours.eval(), ref.eval()
    with torch.no_grad():
        ours(X[:5])  # fill the caches
        for model in (ours, ref):
            model.covar_module.base_kernel.lengthscale = torch.tensor([0.4, 2.0])
            model.variational_strategy._variational_distribution.variational_mean.data.mul_(2.0)
        p, r = ours(X[:5]), ref.train()(X[:5], diag=False)  # train mode: GPyTorch recomputes everything
    assert (p.mean - r.mean).abs().max() < 1e-8
    assert (p.covariance_matrix - r.covariance_matrix).abs().max() < 1e-8


def test_state_dict_round_trip_and_deepcopy():
    ours, _, X, y = pair(False, "cholesky")
    ours.eval()
    with torch.no_grad():
        before = ours(X[:6])
    fresh = Ours(data()[2] + 1.0, whitened=False).to(DT).eval()
    with torch.no_grad():
        fresh(X[:6])  # initialise and cache with other values
    fresh.load_state_dict(ours.state_dict())
    clone = copy.deepcopy(ours)
    assert clone.variational_strategy.model is clone
    with torch.no_grad():
        for model in (fresh, clone):
            after = model(X[:6])
            assert torch.allclose(after.mean, before.mean, atol=1e-12)
            assert torch.allclose(after.covariance_matrix, before.covariance_matrix, atol=1e-12)
        clone.covar_module.outputscale = 5.0
        assert torch.allclose(ours(X[:6]).mean, before.mean, atol=1e-12)


def test_float32_close_to_float64():
    results = []
    for dtype in (torch.float32, torch.float64):
        ours, _, X, y = pair(True, "cholesky", dtype)
        likelihood = gpytorch.likelihoods.GaussianLikelihood().to(dtype)
        ours.train()
        elbo = gpytorch.mlls.VariationalELBO(likelihood, ours, num_data=N)(ours(X), y)
        ours.eval()
        with torch.no_grad():
            pred = ours(X[:5])
        assert pred.mean.dtype == dtype and elbo.dtype == dtype
        results.append((elbo.item(), pred.mean.double(), pred.variance.double()))
    assert abs(results[0][0] - results[1][0]) < 1e-3
    assert torch.allclose(results[0][1], results[1][1], atol=1e-3)
    assert torch.allclose(results[0][2], results[1][2], atol=1e-3)


def test_independent_multitask_matches_gpytorch():
    T = 3
    X, _, Z = data()
    Y = torch.stack([torch.sin(X.sum(-1) + t) for t in range(T)], -1)
    Zb = Z.expand(T, M, 2)

    class MT(Base):
        def __init__(self, ours):
            q = make_distribution("cholesky", torch.Size([T]))
            if ours:
                base = InterdomainVariationalStrategy(self, InducingPoints(Zb), q)
            else:
                base = gpytorch.variational.VariationalStrategy(self, Zb, q)
            super().__init__(gpytorch.variational.IndependentMultitaskVariationalStrategy(base, num_tasks=T))
            self._init_prior(torch.Size([T]))

    models = [MT(True).to(DT), MT(False).to(DT)]
    values, preds = [], []
    for model in models:
        torch.manual_seed(7)
        q = model.variational_strategy.base_variational_strategy._variational_distribution
        q.variational_mean.data.copy_(torch.randn(T, M, dtype=DT))
        model.variational_strategy.base_variational_strategy.variational_params_initialized.fill_(1)
        likelihood = gpytorch.likelihoods.MultitaskGaussianLikelihood(num_tasks=T).to(DT)
        model.train()
        values.append(gpytorch.mlls.VariationalELBO(likelihood, model, num_data=N)(model(X), Y).item())
        model.eval()
        with torch.no_grad():
            preds.append(model(X[:4]))
    assert abs(values[0] - values[1]) < 1e-8
    assert (preds[0].mean - preds[1].mean).abs().max() < 1e-8
    assert (preds[0].covariance_matrix - preds[1].covariance_matrix).abs().max() < 1e-8


def test_explicit_kernel_and_bad_arguments():
    X, y, Z = data()

    class NoKernel(gpytorch.models.ApproximateGP):
        def __init__(self, kernel=None):
            strategy = InterdomainVariationalStrategy(self, InducingPoints(Z), make_distribution("cholesky"), kernel=kernel)
            super().__init__(strategy)
            self.k = kernel if kernel is not None else gpytorch.kernels.RBFKernel()

        def forward(self, x):
            return gpytorch.distributions.MultivariateNormal(torch.zeros(x.shape[:-1], dtype=x.dtype), self.k(x))

    with pytest.raises(TypeError, match="covar_module"):
        NoKernel().to(DT)(X)
    kernel = gpytorch.kernels.RBFKernel()
    model = NoKernel(kernel).to(DT)
    assert model(X).mean.shape == (N,)
    assert any(n.startswith("variational_strategy._explicit_kernel") for n, _ in model.named_parameters())
    with pytest.raises(ValueError, match="num_inducing"):
        InterdomainVariationalStrategy(None, InducingPoints(Z), gpytorch.variational.CholeskyVariationalDistribution(M + 1))
    with pytest.raises(TypeError, match="inducing_variables"):
        InterdomainVariationalStrategy(None, Z, make_distribution("cholesky"))


def dense_carried_marginal(model, Z_new):
    """``int p(u' | u) q(u) du`` in closed form from the kernel and q(u) (thesis eq. ``online_elbo``).
    The float64 point jitter 1e-6 is white noise on ``f`` at the inducing inputs (InducingVariables'
    jitter policy): it is on both prior covariances and on the cross covariance of shared points."""
    strategy, kernel, mean = model.variational_strategy, model.covar_module, model.mean_module
    Z_old = strategy.inducing_variables.points.detach()
    q = strategy.inducing_posterior()
    with torch.no_grad():
        Kuu = kernel(Z_old).to_dense() + 1e-6 * torch.eye(len(Z_old), dtype=DT)
        shared = (Z_old[:, None, :] == Z_new[None, :, :]).all(-1).to(DT)
        A = torch.linalg.solve(Kuu, kernel(Z_old, Z_new).to_dense() + 1e-6 * shared).mT  # cov(u', u) K_uu^-1
        m = mean(Z_new) + A @ (q.mean - mean(Z_old))
        S = kernel(Z_new).to_dense() + 1e-6 * torch.eye(len(Z_new), dtype=DT) - A @ (Kuu - q.covariance_matrix) @ A.mT
    return m, S


@pytest.mark.parametrize("whitened", [True, False])
@pytest.mark.parametrize("kind", ["cholesky", "meanfield"])
def test_replace_inducing_variables_carries_q_and_changes_their_number(whitened, kind):
    # OSVGP re-draws its points between tasks, and their number grows while a task has fewer
    # inputs than M: the new q(u') must be the carried marginal (closed form above), in a
    # variational distribution of the new size and of the same kind.
    model = Ours(data()[2], whitened, kind).to(DT)
    set_variational(model)
    strategy = model.variational_strategy
    same = InducingPoints(strategy.inducing_variables.points.detach().clone())
    before = strategy.inducing_posterior()
    strategy.replace_inducing_variables(same)  # identical points: q(u) unchanged
    after = strategy.inducing_posterior()
    assert strategy.inducing_variables is same
    torch.testing.assert_close(after.mean, before.mean, rtol=0, atol=1e-8)
    torch.testing.assert_close(after.covariance_matrix, before.covariance_matrix, rtol=0, atol=1e-8)
    g = torch.Generator().manual_seed(11)
    Z_new = torch.cat([same.points.detach()[:5], torch.rand(7, 2, generator=g, dtype=DT) * 4])  # 8 -> 12
    expected_mean, expected_covar = dense_carried_marginal(model, Z_new)
    strategy.replace_inducing_variables(InducingPoints(Z_new))
    q = strategy._variational_distribution
    assert type(q) is type(make_distribution(kind)) and q.shape() == torch.Size([12])
    assert all(p.dtype == DT for p in q.parameters())
    carried = strategy.inducing_posterior()
    torch.testing.assert_close(carried.mean, expected_mean, rtol=0, atol=1e-8)
    if kind == "cholesky":
        torch.testing.assert_close(carried.covariance_matrix, expected_covar, rtol=0, atol=1e-8)
    elif not whitened:  # mean-field keeps the variances of its own coordinates (whitened: of v, not u)
        torch.testing.assert_close(carried.covariance_matrix.diagonal(), expected_covar.diagonal(), rtol=0, atol=1e-8)
    X, y, _ = data()
    optimizer = torch.optim.Adam(model.variational_parameters(), lr=0.01)
    likelihood = gpytorch.likelihoods.GaussianLikelihood().to(DT)
    loss = -gpytorch.mlls.VariationalELBO(likelihood, model, num_data=N)(model(X), y)
    loss.backward()
    optimizer.step()
    assert q.variational_mean.grad is not None and q.variational_mean.grad.shape == (12,)


def test_a_direct_assignment_of_another_number_of_inducing_variables_is_refused_by_name():
    model = Ours(data()[2]).to(DT)
    model.variational_strategy.inducing_variables = InducingPoints(torch.rand(5, 2, dtype=DT))
    with pytest.raises(RuntimeError, match="replace_inducing_variables"):
        model(data()[0])
    with pytest.raises(TypeError, match="inducing_variables must be an InducingVariables"):
        model.variational_strategy.replace_inducing_variables(torch.rand(5, 2, dtype=DT))


def test_the_strategy_is_built_by_gpytorchs_constructor(monkeypatch):
    """GPyTorch's own constructor of the strategy base runs (it holds the model and the variational distribution and
    registers their initialisation flag) and leaves no copy of the inducing inputs: the strategy reads them live."""
    calls = []
    constructor = VariationalStrategyBase.__init__

    def spy(self, *args, **kwargs):
        calls.append(args)
        constructor(self, *args, **kwargs)

    monkeypatch.setattr(VariationalStrategyBase, "__init__", spy)
    ours = Ours(data()[2]).to(DT)
    strategy = ours.variational_strategy
    assert len(calls) == 1 and calls[0][0] is ours and calls[0][2] is strategy._variational_distribution
    assert not any("inducing_points" in name for name, _ in strategy.named_buffers())
    assert strategy.inducing_points is strategy.inducing_variables.points
    assert strategy.jitter_val == Reference(data()[2]).to(DT).variational_strategy.jitter_val


def test_saved_keys_are_those_of_earlier_releases():
    """A checkpoint keeps its keys: the strategy's own entries, beside those of its inducing variables."""
    points = Ours(data()[2]).to(DT).variational_strategy.state_dict()
    assert set(points) == {
        "variational_params_initialized",
        "online_task_ended",
        "inducing_variables.points",
        "_variational_distribution.variational_mean",
        "_variational_distribution.chol_variational_covar",
    }
    kernel = gpytorch.kernels.RBFKernel()
    distribution = gpytorch.variational.MeanFieldVariationalDistribution(6)
    hippo = InterdomainVariationalStrategy(None, HiPPOInducingVariables(6, "legs", t=1.0), distribution, kernel=kernel).state_dict()
    assert {key for key in hippo if not key.startswith("inducing_variables.")} == {
        "variational_params_initialized",
        "online_task_ended",
        "_variational_distribution.variational_mean",
        "_variational_distribution._variational_stddev",
        "_explicit_kernel.raw_lengthscale",
        "_explicit_kernel.raw_lengthscale_constraint.lower_bound",
        "_explicit_kernel.raw_lengthscale_constraint.upper_bound",
    }


def test_the_class_keeps_hooks_and_public_methods_and_the_algebra_is_in_functions():
    """The class stays near GPyTorch's ``VariationalStrategy`` (273 lines, 7 methods): besides GPyTorch's and torch's
    hooks and its public methods it has at most four private helpers; whitening, the conditional, the cache
    fingerprint and the carried ``q(u)`` are functions of the module."""
    tree = ast.parse(pathlib.Path(variational.__file__).read_text())
    cls = next(node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == "InterdomainVariationalStrategy")
    methods = [node.name for node in cls.body if isinstance(node, ast.FunctionDef)]
    upstream = set(dir(gpytorch.variational.VariationalStrategy))
    helpers = [name for name in methods if name.startswith("_") and not name.startswith("__") and name not in upstream]
    assert cls.end_lineno - cls.lineno + 1 <= 345
    assert len(methods) <= 25 and len(helpers) <= 4, helpers
