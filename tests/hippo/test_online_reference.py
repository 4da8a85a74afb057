"""OnlineSGPR and OnlineELBO when hyperparameters, the mean and the inducing variables all change
between tasks, against a naive Bui et al. (2017) reference written here in plain torch: dense
matrices and explicit inverses straight from the definition of the online ELBO (thesis eq.
``online_elbo``), no project code. HiPPO covariances come from an independent Gauss-Legendre
quadrature of the LegS basis. The old-task factor must use the *old* hyperparameters (K'_aa,
μ'_a): these tests fail if the new ones are used there. Tolerances: float64 round-off of the
reference's explicit inverses, amplified by cond(K'_aa) <~ 3e3 (1e-7 on moments, 1e-6 on bounds ~50)."""

import math

import gpytorch
import numpy as np
import pytest
import torch

from gpytorch_hippo import HiPPOInducingVariables, InducingPoints, InterdomainVariationalStrategy, OnlineELBO, OnlineSGPR

DT = torch.float64
OLD = dict(lengthscale=0.7, outputscale=1.3, constant=0.4, noise=0.05)  # θ' (task 1)
NEW = dict(lengthscale=0.5, outputscale=0.9, constant=-0.3, noise=0.08)  # θ (task 2)
LATER = dict(lengthscale=0.6, outputscale=1.1, constant=0.1, noise=0.08)  # set after task 2, before predicting


# ---------------------------------------------------------------- the naive reference
def rbf(a, b, hyp):
    return hyp["outputscale"] * torch.exp(-0.5 * (a[:, None] - b[None, :]).square() / hyp["lengthscale"] ** 2)


def legs_rule(t, num=160):
    """Gauss-Legendre nodes/weights on [0, t] and the LegS measure-times-basis φ_m(s) = √(2m+1) P_m(2s/t - 1) / t."""
    z, w = np.polynomial.legendre.leggauss(num)
    s, ws = t * (z + 1) / 2, w * t / 2
    return torch.tensor(s), torch.tensor(ws)


def legs_phi(s, t, M):
    z = (2 * s / t - 1).numpy()
    return torch.tensor(np.stack([math.sqrt(2 * m + 1) * np.polynomial.legendre.Legendre.basis(m)(z) / t for m in range(M)]))


class Points:
    """u = f(Z): prior mean m(Z), covariances by the kernel."""

    def __init__(self, Z):
        self.Z = Z

    def mean(self, hyp):
        return torch.full((len(self.Z),), hyp["constant"], dtype=DT)

    def cov(self, other, hyp):
        return rbf(self.Z, other.Z, hyp)

    def cov_f(self, x, hyp):
        return rbf(self.Z, x, hyp)


class LegS:
    """u_m = ∫ (f - m)(s) φ_m(s) ds on [0, t] (the centred process: zero prior mean), by quadrature."""

    def __init__(self, M, t):
        self.s, w = legs_rule(t)
        self.weighted = legs_phi(self.s, t, M) * w  # (M, Q)

    def mean(self, hyp):
        return torch.zeros(self.weighted.shape[0], dtype=DT)

    def cov(self, other, hyp):
        return self.weighted @ rbf(self.s, other.s, hyp) @ other.weighted.T

    def cov_f(self, x, hyp):
        return self.weighted @ rbf(self.s, x, hyp)


def expected_log_gaussian(mean, covar, target_mean, target_covar):
    """E_{N(mean, covar)}[log N(a; target_mean, target_covar)]."""
    diff = mean - target_mean
    inv = torch.linalg.inv(target_covar)
    return -0.5 * (diff @ inv @ diff + torch.trace(inv @ covar) + torch.logdet(2 * math.pi * target_covar))


def kl_gaussian(m, S, mu, K):
    inv = torch.linalg.inv(K)
    return 0.5 * (torch.trace(inv @ S) + (mu - m) @ inv @ (mu - m) - len(m) + torch.logdet(K) - torch.logdet(S))


def titsias_q(x, y, u, hyp):
    """Optimal q(u) of batch SGPR (first task): N(μ_u + K_uu Σ^{-1} K_ux (y - m) / σ², K_uu Σ^{-1} K_uu)."""
    Kuu, Kux = u.cov(u, hyp), u.cov_f(x, hyp)
    sigma = Kuu + Kux @ Kux.T / hyp["noise"]
    mean = u.mean(hyp) + Kuu @ torch.linalg.solve(sigma, Kux @ (y - hyp["constant"])) / hyp["noise"]
    return mean, Kuu @ torch.linalg.solve(sigma, Kuu)


def online_terms(b, hyp, a, m_a, S_a, hyp_old, m_b, S_b, x, y):
    """(ELL, KL(q(b)||p(b)), E_{q~(a)}[log q_old(a) - log p_old(a)]) of the online ELBO for q(b) = N(m_b, S_b)."""
    Kbb_inv = torch.linalg.inv(b.cov(b, hyp))
    A_x, A = b.cov_f(x, hyp).T @ Kbb_inv, a.cov(b, hyp) @ Kbb_inv
    mu_b = b.mean(hyp)
    mean_f = hyp["constant"] + A_x @ (m_b - mu_b)
    var_f = hyp["outputscale"] - (A_x * b.cov_f(x, hyp).T).sum(-1) + ((A_x @ S_b) * A_x).sum(-1)
    ell = (-0.5 * math.log(2 * math.pi * hyp["noise"]) - ((y - mean_f).square() + var_f) / (2 * hyp["noise"])).sum()
    kl = kl_gaussian(m_b, S_b, mu_b, b.cov(b, hyp))
    mean_a = a.mean(hyp) + A @ (m_b - mu_b)
    covar_a = a.cov(a, hyp) - A @ b.cov(a, hyp) + A @ S_b @ A.T
    old = expected_log_gaussian(mean_a, covar_a, m_a, S_a) - expected_log_gaussian(mean_a, covar_a, a.mean(hyp_old), a.cov(a, hyp_old))
    return ell, kl, old


def bui_q(b, hyp, a, m_a, S_a, hyp_old, x, y):
    """Optimal q(b) ∝ p(b) exp(E_{p(f|b)} log p(y|f) + E_{p(a|b)} log q_old(a)/p_old(a)) with
    q_old(a)/p_old(a) ∝ exp(-½ aᵀ D⁻¹ a + aᵀ h), D⁻¹ = S_a⁻¹ - K'_aa⁻¹, h = S_a⁻¹ m_a - K'_aa⁻¹ μ'_a."""
    Kbb_inv = torch.linalg.inv(b.cov(b, hyp))
    A_x, A = b.cov_f(x, hyp).T @ Kbb_inv, a.cov(b, hyp) @ Kbb_inv
    S_a_inv, Kaa_old_inv = torch.linalg.inv(S_a), torch.linalg.inv(a.cov(a, hyp_old))
    D_inv = S_a_inv - Kaa_old_inv
    h = S_a_inv @ m_a - Kaa_old_inv @ a.mean(hyp_old)
    mu_b = b.mean(hyp)
    offset_a = a.mean(hyp) - A @ mu_b  # E[a | b] = A b + offset_a
    precision = Kbb_inv + A_x.T @ A_x / hyp["noise"] + A.T @ D_inv @ A
    linear = Kbb_inv @ mu_b + A_x.T @ (y - hyp["constant"] + A_x @ mu_b) / hyp["noise"] + A.T @ (h - D_inv @ offset_a)
    S_b = torch.linalg.inv(precision)
    return S_b @ linear, S_b


def predict(b, hyp, m_b, S_b, xs):
    Kbb_inv = torch.linalg.inv(b.cov(b, hyp))
    A_s = b.cov_f(xs, hyp).T @ Kbb_inv
    mean = hyp["constant"] + A_s @ (m_b - b.mean(hyp))
    covar = rbf(xs, xs, hyp) - A_s @ b.cov_f(xs, hyp) + A_s @ S_b @ A_s.T
    return mean, covar


# ---------------------------------------------------------------- the models
def data(seed, start, end, n):
    g = torch.Generator().manual_seed(seed)
    x = torch.sort(start + (end - start) * torch.rand(n, generator=g, dtype=DT)).values
    return x, torch.sin(2.5 * x) + 0.3 + 0.2 * torch.randn(n, generator=g, dtype=DT)


def set_hyperparameters(kernel, mean, likelihood, hyp):
    """(float64 tensors: GPyTorch's setters would round a Python float through float32)"""
    value = {name: torch.tensor(v, dtype=DT) for name, v in hyp.items()}
    kernel.base_kernel.lengthscale, kernel.outputscale = value["lengthscale"], value["outputscale"]
    mean.constant.data.fill_(hyp["constant"])
    likelihood.noise = value["noise"]


def two_sets(kind):
    """(ours_a, ours_b, naive_a, naive_b, hyperparameters of task 2, of LATER). Point sets change
    (and M: 6 -> 7) with the mean; HiPPO variables advance t = 2 -> 4 with a fixed mean
    (centred projections, see OnlineELBO's docstring). jitter = 0: the reference has none."""
    if kind == "points":
        Za, Zb = torch.linspace(0, 2, 6, dtype=DT), torch.linspace(0.9, 4.1, 7, dtype=DT)
        return InducingPoints(Za, learn=False, jitter=0.0), InducingPoints(Zb, learn=False, jitter=0.0), Points(Za), Points(Zb), NEW, LATER
    ours = HiPPOInducingVariables(5, "legs", t=2.0, jitter=0.0)
    fixed_mean = {**NEW, "constant": OLD["constant"]}
    return ours, None, LegS(5, 2.0), LegS(5, 4.0), fixed_mean, {**LATER, "constant": OLD["constant"]}


@pytest.mark.parametrize("kind", ["points", "hippo"])
def test_online_sgpr_with_changing_hyperparameters_and_inducing_variables_equals_bui(kind):
    x1, y1 = data(0, 0.0, 2.0, 30)
    x2, y2 = data(1, 1.5, 4.0, 30)
    ours_a, ours_b, a, b, new, later = two_sets(kind)
    kernel = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel()).to(DT)
    mean, likelihood = gpytorch.means.ConstantMean().to(DT), gpytorch.likelihoods.GaussianLikelihood().to(DT)
    set_hyperparameters(kernel, mean, likelihood, OLD)
    model = OnlineSGPR(ours_a, kernel, likelihood, mean_module=mean)
    model.update(x1, y1)
    set_hyperparameters(kernel, mean, likelihood, new)
    if kind == "points":
        model.inducing_variables = ours_b
    else:
        model.inducing_variables.advance(4.0)
    bound = model.update(x2, y2)

    m_a, S_a = titsias_q(x1, y1, a, OLD)
    m_b, S_b = bui_q(b, new, a, m_a, S_a, OLD, x2, y2)
    ell, kl, old = online_terms(b, new, a, m_a, S_a, OLD, m_b, S_b, x2, y2)
    q_b = model.inducing_posterior()
    assert (q_b.mean - m_b).abs().max() < 1e-7
    assert (q_b.covariance_matrix - S_b).abs().max() < 1e-7
    # the collapsed bound is the online ELBO at the optimal q(b)
    assert abs(bound.item() - (ell - kl + old).item()) < 1e-6
    assert abs(old.item()) > 1.0  # the old-task factor is far from negligible here

    xs = torch.linspace(-0.5, 4.5, 23, dtype=DT)
    with torch.no_grad():
        prediction = model(xs)
    mean_ref, covar_ref = predict(b, new, m_b, S_b, xs)
    assert (prediction.mean - mean_ref).abs().max() < 1e-7
    assert (prediction.covariance_matrix - covar_ref).abs().max() < 1e-7

    # hyperparameters changed after the last task: the stored q(b) is re-whitened for prediction
    set_hyperparameters(kernel, mean, likelihood, later)
    with torch.no_grad():
        prediction = model(xs)
    mean_ref, covar_ref = predict(b, later, m_b, S_b, xs)
    assert (prediction.mean - mean_ref).abs().max() < 1e-7
    assert (prediction.covariance_matrix - covar_ref).abs().max() < 1e-7


class SVGP(gpytorch.models.ApproximateGP):
    def __init__(self, inducing_variables, whitened):
        q = gpytorch.variational.CholeskyVariationalDistribution(inducing_variables.num_inducing)
        super().__init__(InterdomainVariationalStrategy(self, inducing_variables, q, whitened=whitened))
        self.mean_module = gpytorch.means.ConstantMean()
        self.covar_module = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel())

    def forward(self, x):
        return gpytorch.distributions.MultivariateNormal(self.mean_module(x), self.covar_module(x))


def random_q(model, seed):
    """Random variational parameters, and q(u) in the unwhitened coordinates, computed naively."""
    g = torch.Generator().manual_seed(seed)
    distribution = model.variational_strategy._variational_distribution
    M = distribution.variational_mean.shape[-1]
    mean = torch.randn(M, generator=g, dtype=DT)
    chol = 0.3 * torch.randn(M, M, generator=g, dtype=DT).tril() + 0.6 * torch.eye(M, dtype=DT)
    distribution.variational_mean.data.copy_(mean)
    distribution.chol_variational_covar.data.copy_(chol)
    model.variational_strategy.variational_params_initialized.fill_(1)
    return mean, chol @ chol.T


def unwhitened(q_mean, q_covar, u, hyp, whitened):
    if not whitened:
        return q_mean, q_covar
    L = torch.linalg.cholesky(u.cov(u, hyp))
    return u.mean(hyp) + L @ q_mean, L @ q_covar @ L.T


@pytest.mark.parametrize("kind", ["points", "hippo"])
@pytest.mark.parametrize("whitened", [True, False])
def test_online_elbo_old_term_uses_the_old_prior(kind, whitened):
    """OnlineELBO for arbitrary q_old and q(b) (not optima) vs the online ELBO written densely."""
    x2, y2 = data(2, 1.5, 4.0, 25)
    ours_a, ours_b, a, b, new, _ = two_sets(kind)
    if kind == "points":  # one variational distribution: same M for both sets here
        z_b = torch.linspace(0.9, 4.1, 6, dtype=DT)
        ours_b, b = InducingPoints(z_b, learn=False, jitter=0.0), Points(z_b)
    model = SVGP(ours_a, whitened).to(DT)
    likelihood = gpytorch.likelihoods.GaussianLikelihood().to(DT)
    set_hyperparameters(model.covar_module, model.mean_module, likelihood, OLD)
    elbo = OnlineELBO(likelihood, model, num_data=len(x2))
    m_a, S_a = unwhitened(*random_q(model, 3), a, OLD, whitened)
    elbo.end_task()
    set_hyperparameters(model.covar_module, model.mean_module, likelihood, new)
    if kind == "points":
        model.variational_strategy.inducing_variables = ours_b
    else:
        model.variational_strategy.advance(4.0)
    m_b, S_b = unwhitened(*random_q(model, 4), b, new, whitened)

    ell, kl, old = online_terms(b, new, a, m_a, S_a, OLD, m_b, S_b, x2, y2)
    model.train()
    assert abs(elbo.online_kl_divergence().item() - (kl - old).item()) < 1e-7
    assert abs(elbo(model(x2), y2).item() * len(x2) - (ell - kl + old).item()) < 1e-7
    assert abs(old.item()) > 1.0
