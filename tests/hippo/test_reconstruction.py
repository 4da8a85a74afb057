"""Finite-basis reconstruction (thesis App. C) against Monte-Carlo statistics, quadrature integrals
of the GP posterior, independently written Legendre bases, and HiPPO projections of known functions."""

import math

import gpytorch
import numpy as np
import pytest
import torch

from gpytorch_hippo.hippo import project, quadrature_rule
from gpytorch_hippo.inducing import HiPPOInducingVariables, InducingPoints
from gpytorch_hippo.online import OnlineSGPR
from gpytorch_hippo.reconstruction import reconstruction_moments, sample_coefficients, sample_reconstruction
from gpytorch_hippo.variational import InterdomainVariationalStrategy

DT = torch.float64
T_END = 2.0
NUM_MC = 20000
SIGMAS = 5.0  # CLT tolerance of every Monte-Carlo comparison (a handful of entries each; seeded)


def make_kernel(lengthscale=0.5):
    kernel = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel()).to(DT)
    kernel.base_kernel.lengthscale = lengthscale
    kernel.outputscale = 1.0
    return kernel


def series(n=60, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = (T_END * torch.rand(n, generator=g, dtype=DT)).sort().values
    return x, torch.sin(3 * x) + 0.1 * torch.randn(n, generator=g, dtype=DT)


def fitted_osgpr(num_inducing=8, jitter=1e-10):
    likelihood = gpytorch.likelihoods.GaussianLikelihood().to(DT)
    likelihood.noise = 0.01
    ivs = HiPPOInducingVariables(num_inducing, "legs", t=T_END, jitter=jitter)
    model = OnlineSGPR(ivs, make_kernel(), likelihood)
    x, y = series()
    model.update(x, y)
    return model.eval()


class InterdomainGP(gpytorch.models.ApproximateGP):
    def __init__(self, inducing_variables, whitened=True, mean_module=None, seed=0):
        M = inducing_variables.num_inducing
        distribution = gpytorch.variational.CholeskyVariationalDistribution(M)
        strategy = InterdomainVariationalStrategy(self, inducing_variables, distribution, whitened=whitened)
        super().__init__(strategy)
        self.mean_module = mean_module if mean_module is not None else gpytorch.means.ZeroMean()
        self.covar_module = make_kernel()
        self.to(DT)
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            distribution.variational_mean.copy_(torch.randn(M, generator=g, dtype=DT))
            chol = torch.tril(0.3 * torch.randn(M, M, generator=g, dtype=DT), -1) + torch.diag(0.2 + torch.rand(M, generator=g, dtype=DT))
            distribution.chol_variational_covar.copy_(chol)

    def forward(self, x):
        return gpytorch.distributions.MultivariateNormal(self.mean_module(x), self.covar_module(x))


def models():
    return {
        "osgpr": fitted_osgpr(),
        "svgp_whitened": InterdomainGP(HiPPOInducingVariables(6, "legs", t=T_END)).eval(),
        "svgp_unwhitened": InterdomainGP(HiPPOInducingVariables(6, "legs", t=T_END), whitened=False).eval(),
    }


def posterior_of(model):
    if isinstance(model, OnlineSGPR):
        return model.inducing_posterior(), model.posterior_inducing_variables
    return model.variational_strategy.inducing_posterior(), model.variational_strategy.inducing_variables


def assert_mc_moments(samples, mean, cov, sigmas=SIGMAS):
    """Sample mean/covariance of ``samples`` (S, K) against (mean, cov) within ``sigmas`` CLT standard errors."""
    num = samples.shape[0]
    var = cov.diagonal()
    mean_err = (samples.mean(0) - mean).abs()
    assert (mean_err <= sigmas * (var / num).sqrt()).all(), mean_err / (var / num).sqrt()
    centred = samples - mean
    cov_hat = centred.T @ centred / num
    cov_se = ((var[:, None] * var[None, :] + cov.square()) / num).sqrt()
    assert ((cov_hat - cov).abs() <= sigmas * cov_se).all(), ((cov_hat - cov).abs() / cov_se).max()


@pytest.mark.parametrize("name", ["osgpr", "svgp_whitened", "svgp_unwhitened"])
def test_sampled_coefficients_have_mean_m_u_and_covariance_S_u(name):
    model = models()[name]
    q_u, _ = posterior_of(model)
    with torch.no_grad():
        samples = sample_coefficients(model, NUM_MC, generator=torch.Generator().manual_seed(1))
    assert samples.shape == (NUM_MC, q_u.mean.shape[-1])
    assert_mc_moments(samples, q_u.mean.detach(), q_u.covariance_matrix.detach())


@pytest.mark.parametrize("name", ["osgpr", "svgp_whitened"])
def test_moments_equal_sample_statistics_and_independent_bases(name):
    model = models()[name]
    x = torch.tensor([0.05, 0.4, 0.9, 1.3, 1.95], dtype=DT)
    with torch.no_grad():
        moments = reconstruction_moments(model, x)
        samples = sample_reconstruction(model, x, NUM_MC, generator=torch.Generator().manual_seed(2))
        q_u, _ = posterior_of(model)
        # scaled Legendre bases g_m^{(t)}(x) = sqrt(2m+1) P_m(2x/t - 1), written with numpy
        M = q_u.mean.shape[-1]
        G = np.stack([math.sqrt(2 * m + 1) * np.polynomial.legendre.legval(2 * x.numpy() / T_END - 1, np.eye(M)[m]) for m in range(M)], -1)
        G = torch.as_tensor(G)
    torch.testing.assert_close(moments.mean, G @ q_u.mean, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(moments.covariance_matrix, G @ q_u.covariance_matrix @ G.T, rtol=1e-8, atol=1e-12)
    assert samples.shape == (NUM_MC, 5)
    assert_mc_moments(samples, moments.mean, moments.covariance_matrix)


def test_samples_are_bases_times_coefficients_and_reproducible():
    model = models()["svgp_whitened"]
    x = torch.linspace(0, T_END, 7, dtype=DT)
    with torch.no_grad():
        f = sample_reconstruction(model, x, 5, generator=torch.Generator().manual_seed(3))
        f_again = sample_reconstruction(model, x.unsqueeze(-1), 5, generator=torch.Generator().manual_seed(3))
        u = sample_coefficients(model, 5, generator=torch.Generator().manual_seed(3))
        G = model.variational_strategy.inducing_variables.basis(x)
    torch.testing.assert_close(f, u @ G.T)
    assert torch.equal(f, f_again)


def test_app_c_identities_q_u_is_the_projection_of_the_posterior_gp():
    """Thesis App. C: E_q[∫ f φ_m] = m_u and Cov_q[∫ f φ_l, ∫ f φ_m] = S_u, with the integrals of the
    OSGPR posterior mean and covariance computed by an independent 200-node Gauss-Legendre rule."""
    model = fitted_osgpr(num_inducing=10)
    q_u = model.inducing_posterior()
    nodes, weights = quadrature_rule("legs", T_END, num_nodes=200)
    M = 10
    scaled = 2 * nodes.numpy() / T_END - 1
    legendre = np.stack([math.sqrt(2 * m + 1) * np.polynomial.legendre.legval(scaled, np.eye(M)[m]) for m in range(M)], -1)
    phi = torch.as_tensor(legendre) * weights[:, None]  # quadrature weights times g_m ω
    with torch.no_grad():
        posterior_f = model(nodes.unsqueeze(-1))
        mean_projection = phi.T @ posterior_f.mean
        cov_projection = phi.T @ posterior_f.covariance_matrix @ phi
    torch.testing.assert_close(mean_projection, q_u.mean, rtol=0, atol=1e-7)
    torch.testing.assert_close(cov_projection, q_u.covariance_matrix, rtol=0, atol=1e-9)


def test_reconstruction_of_a_hippo_projection_recovers_the_function():
    """q(u) concentrated at the HiPPO coefficients of a known function: the reconstruction is the function."""
    M = 24

    def fn(x):
        return torch.sin(3 * x) + 0.5 * x - 0.3 * torch.cos(7 * x)

    coefficients = project(fn, T_END, M, "legs")
    model = InterdomainGP(HiPPOInducingVariables(M, "legs", t=T_END), whitened=False)
    with torch.no_grad():
        model.variational_strategy._variational_distribution.variational_mean.copy_(coefficients)
        model.variational_strategy._variational_distribution.chol_variational_covar.copy_(1e-4 * torch.eye(M, dtype=DT))
    model.eval()
    x = torch.linspace(0, T_END, 101, dtype=DT)
    with torch.no_grad():
        moments = reconstruction_moments(model, x)
        samples = sample_reconstruction(model, x, 10, generator=torch.Generator().manual_seed(4))
    torch.testing.assert_close(moments.mean, fn(x), rtol=0, atol=1e-8)
    assert (samples - fn(x)).abs().max() < 1e-2  # each sample within the tiny S_u of the function
    # S_u = 1e-8 I: variance 1e-8 sum_m g_m(x)^2, at most 1e-8 sum_m (2m+1) = 1e-8 M^2 (at the ends)
    torch.testing.assert_close(moments.variance.max(), torch.tensor(1e-8 * M**2, dtype=DT))


def test_mean_function_is_added_back():
    """HiPPO inducing variables project f - m: the reconstruction is m(x) + G m_u."""
    mean_module = gpytorch.means.ConstantMean().to(DT)
    mean_module.constant.data.fill_(2.5)
    model = InterdomainGP(HiPPOInducingVariables(6, "legs", t=T_END), mean_module=mean_module).eval()
    bare = InterdomainGP(HiPPOInducingVariables(6, "legs", t=T_END)).eval()
    x = torch.linspace(0, T_END, 9, dtype=DT)
    with torch.no_grad():
        shifted = reconstruction_moments(model, x)
        plain = reconstruction_moments(bare, x)
        drawn = sample_reconstruction(model, x, 3, generator=torch.Generator().manual_seed(5))
        drawn_plain = sample_reconstruction(bare, x, 3, generator=torch.Generator().manual_seed(5))
    torch.testing.assert_close(shifted.mean, plain.mean + 2.5)
    torch.testing.assert_close(shifted.covariance_matrix, plain.covariance_matrix)
    torch.testing.assert_close(drawn, drawn_plain + 2.5)


def test_bad_inputs_raise_clear_errors():
    model = models()["svgp_whitened"]
    x = torch.linspace(0, 1, 5, dtype=DT)
    with pytest.raises(ValueError, match="num_samples"):
        sample_reconstruction(model, x, 0)
    with pytest.raises(ValueError, match="num_samples"):
        sample_coefficients(model, 2.5)
    with pytest.raises(ValueError, match="x must be 1-D"):
        sample_reconstruction(model, torch.zeros(5, 2, dtype=DT), 3)
    with pytest.raises(TypeError, match="x must be a torch.Tensor"):
        reconstruction_moments(model, [0.1, 0.2])
    with pytest.raises(ValueError, match="NaN"):
        reconstruction_moments(model, torch.tensor([0.1, float("nan")], dtype=DT))
    with pytest.raises(TypeError, match="generator"):
        sample_coefficients(model, 3, generator=7)
    with pytest.raises(TypeError, match="model must be an OnlineSGPR"):
        sample_coefficients(torch.nn.Linear(2, 2), 3)
    points_model = InterdomainGP.__new__(InterdomainGP)
    gpytorch.models.ApproximateGP.__init__(
        points_model,
        InterdomainVariationalStrategy(
            points_model, InducingPoints(torch.zeros(3, 1, dtype=DT)), gpytorch.variational.CholeskyVariationalDistribution(3)
        ),
    )
    points_model.mean_module = gpytorch.means.ZeroMean()
    points_model.covar_module = make_kernel()
    with pytest.raises(TypeError, match="basis"):
        reconstruction_moments(points_model.to(DT).eval(), x)
    empty = OnlineSGPR(HiPPOInducingVariables(4, "legs", t=1.0), make_kernel(), gpytorch.likelihoods.GaussianLikelihood())
    with pytest.raises(RuntimeError, match="no task"):
        sample_coefficients(empty, 3)
