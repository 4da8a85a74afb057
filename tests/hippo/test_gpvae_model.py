"""SVGPVAE (thesis App. C): the amortised q(u), the GP part of the ELBO against GPyTorch's
VariationalELBO and against closed-form collapsed bounds, masking, dtypes, eval caches, reloads."""

import math

import gpytorch
import pytest
import torch

from gpytorch_hippo import HiPPOInducingVariables, InducingPoints
from gpytorch_hippo.gpvae import SVGPVAE, LatentGP

DT = torch.float64


L, T, D, M = 3, 20, 4, 6


def kernel(dtype=DT):
    k = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel()).to(dtype)
    k.base_kernel.lengthscale = 0.3
    k.outputscale = 1.3
    return k


def pseudo_observations(seed=0):
    generator = torch.Generator().manual_seed(seed)
    times = torch.linspace(0.05, 1.0, T, dtype=DT)
    mean = torch.randn(L, T, generator=generator, dtype=DT)
    var = 0.05 + torch.rand(L, T, generator=generator, dtype=DT)
    return times, mean, var


def make_model(inducing, dtype=DT, seed=0):
    torch.manual_seed(seed)
    return SVGPVAE(D, LatentGP(inducing, kernel(dtype), L), hidden_dim=8).to(dtype)


class ReferenceSVGP(gpytorch.models.ApproximateGP):
    """GPyTorch's own whitened SVGP, batch of L channels."""

    def __init__(self, points):
        q = gpytorch.variational.CholeskyVariationalDistribution(points.shape[-2], batch_shape=torch.Size([L]))
        strategy = gpytorch.variational.VariationalStrategy(self, points, q, learn_inducing_locations=False)
        super().__init__(strategy)
        self.mean_module = gpytorch.means.ZeroMean()
        self.covar_module = kernel()

    def forward(self, x):
        return gpytorch.distributions.MultivariateNormal(self.mean_module(x), self.covar_module(x))


def app_c_posterior(Kuu, Kuf, pseudo_mean, pseudo_var):
    """App. C's q(u) = N(m, A) written out naively: S = Kuu + Kuf V^-1 Kfu, m = Kuu S^-1 Kuf V^-1 ỹ,
    A = Kuu S^-1 Kuu."""
    S = Kuu + (Kuf / pseudo_var.unsqueeze(-2)) @ Kuf.mT
    m = Kuu @ torch.linalg.solve(S, (Kuf @ (pseudo_mean / pseudo_var).unsqueeze(-1))).squeeze(-1).unsqueeze(-1)
    A = Kuu @ torch.linalg.solve(S, Kuu.expand_as(S))
    return m.squeeze(-1), A


def test_gp_part_equals_gpytorch_variational_elbo_on_fixed_pseudo_observations():
    times, pseudo_mean, pseudo_var = pseudo_observations()
    points = torch.linspace(0.0, 1.0, M, dtype=DT).unsqueeze(-1)
    model = make_model(InducingPoints(points.clone(), learn=False))
    pseudo_fit, gp_elbo, _ = model.gp_terms(times, pseudo_mean, pseudo_var)

    reference = ReferenceSVGP(points).to(DT)
    Kuu = reference.covar_module(points).to_dense() + 1e-6 * torch.eye(M, dtype=DT)  # GPyTorch's float64 jitter
    Kuf = reference.covar_module(points, times.unsqueeze(-1)).to_dense()
    m, A = app_c_posterior(Kuu, Kuf, pseudo_mean, pseudo_var)
    chol = torch.linalg.cholesky(Kuu)
    mean_v = torch.linalg.solve_triangular(chol, m.unsqueeze(-1), upper=False).squeeze(-1)
    cov_v = torch.linalg.solve_triangular(chol, torch.linalg.solve_triangular(chol, A, upper=False).mT, upper=False)
    reference.variational_strategy._variational_distribution.variational_mean.data = mean_v
    reference.variational_strategy._variational_distribution.chol_variational_covar.data = torch.linalg.cholesky(cov_v)
    reference.variational_strategy.variational_params_initialized.fill_(1)
    likelihood = gpytorch.likelihoods.FixedNoiseGaussianLikelihood(pseudo_var, learn_additional_noise=False)
    elbo = gpytorch.mlls.VariationalELBO(likelihood, reference, num_data=T)
    expected = elbo(reference(times.unsqueeze(-1)), pseudo_mean).sum() * T
    assert gp_elbo.item() == pytest.approx(expected.item(), rel=1e-8, abs=1e-8)
    # the data term alone: GPyTorch's expected log-likelihood
    expected_fit = likelihood.expected_log_prob(pseudo_mean, reference(times.unsqueeze(-1))).sum()
    assert pseudo_fit.item() == pytest.approx(expected_fit.item(), rel=1e-8)


def test_gp_part_with_inducing_points_at_the_data_is_the_exact_marginal_likelihood():
    """Titsias' bound is tight at Z = X: L_H at App. C's q(u) equals log N(ỹ; 0, K + diag ṽ)."""
    times, pseudo_mean, pseudo_var = pseudo_observations(1)
    model = make_model(InducingPoints(times.unsqueeze(-1).clone(), learn=False, jitter=1e-10))
    _, gp_elbo, _ = model.gp_terms(times, pseudo_mean, pseudo_var)
    K = kernel()(times.unsqueeze(-1)).to_dense()
    exact = torch.distributions.MultivariateNormal(torch.zeros(T, dtype=DT), K + torch.diag_embed(pseudo_var))
    assert gp_elbo.item() == pytest.approx(exact.log_prob(pseudo_mean).sum().item(), rel=1e-6)


def test_gp_part_with_hippo_variables_is_the_collapsed_heteroskedastic_bound():
    """L_H at the optimal q(u) equals Σ_l [log N(ỹ; 0, Q + V) - tr(V^-1 (K - Q)) / 2], Q = Kfu Kuu^-1 Kuf
    (the collapsed bound), here for HiPPO-LegS inducing variables."""
    times, pseudo_mean, pseudo_var = pseudo_observations(2)
    inducing = HiPPOInducingVariables(8, "legs", t=1.0)
    model = make_model(inducing)
    _, gp_elbo, _ = model.gp_terms(times, pseudo_mean, pseudo_var)
    k = kernel()
    Kuu = inducing.Kuu(k).to_dense()
    Kuf = inducing.Kuf(k, times.unsqueeze(-1))
    Q = Kuf.mT @ torch.linalg.solve(Kuu, Kuf)
    K = k(times.unsqueeze(-1)).to_dense()
    expected = 0.0
    for l in range(L):
        gaussian = torch.distributions.MultivariateNormal(torch.zeros(T, dtype=DT), Q + torch.diag(pseudo_var[l]))
        expected += gaussian.log_prob(pseudo_mean[l]) - 0.5 * ((K - Q).diagonal() / pseudo_var[l]).sum()
    assert gp_elbo.item() == pytest.approx(expected.item(), rel=1e-6)


def observations(seed=3):
    generator = torch.Generator().manual_seed(seed)
    times = torch.linspace(0.05, 1.0, T, dtype=DT)
    y = torch.randn(T, D, generator=generator, dtype=DT)
    mask = torch.rand(T, D, generator=generator) > 0.3
    return times, y, mask


def terms(model, *args, seed=7):
    torch.manual_seed(seed)
    return torch.stack(list(model.elbo_terms(*args)))


def test_masked_entries_do_not_change_the_loss():
    times, y, mask = observations()
    model = make_model(InducingPoints(torch.linspace(0, 1, M, dtype=DT).unsqueeze(-1), learn=False))
    reference = terms(model, times, y, mask)
    changed = torch.where(mask, y, 100.0 * torch.randn_like(y))
    assert torch.equal(terms(model, times, changed, mask), reference)
    as_nan = torch.where(mask, y, torch.full_like(y, float("nan")))
    assert torch.equal(terms(model, times, as_nan), reference)  # mask=None: NaN marks the gaps
    # ... while an observed entry does change it (the comparison can fail)
    first = mask.nonzero()[0]
    moved = y.clone()
    moved[first[0], first[1]] += 1.0
    assert not torch.allclose(terms(model, times, moved, mask), reference)
    # the masked likelihood counts only observed entries: with the decoder output fixed the
    # reconstruction term is a sum of Gaussian log densities over mask
    decoded = torch.randn(1, T, D, dtype=DT)
    noise = model.noise.detach()
    direct = sum(
        -0.5 * math.log(2 * math.pi * noise[d]) - 0.5 * (y[t, d] - decoded[0, t, d]) ** 2 / noise[d]
        for t in range(T)
        for d in range(D)
        if mask[t, d]
    )
    assert model._log_likelihood(torch.where(mask, y, 0.0), mask, decoded).item() == pytest.approx(float(direct), rel=1e-12)


def test_float32_matches_float64():
    times, y, mask = observations()
    points = torch.linspace(0, 1, M).unsqueeze(-1)
    model64 = make_model(InducingPoints(points.to(DT), learn=False))
    model32 = make_model(InducingPoints(points, learn=False), dtype=torch.float32)
    model32.load_state_dict({k: v.float() for k, v in model64.state_dict().items()})
    t64 = terms(model64, times, y, mask)
    t32 = terms(model32, times.float(), y.float(), mask)
    assert t32.dtype == torch.float32
    # float32 with GPyTorch's 1e-4 jitter (vs 1e-6): differences of order 1e-4 relative
    assert torch.allclose(t32.double(), t64, rtol=2e-3, atol=2e-2)


def test_eval_mode_predictions_follow_each_new_encoding():
    """Regression: the strategy's eval-mode caches must see a new q(u) (encoding another task)."""
    inducing = InducingPoints(torch.linspace(0, 2, M, dtype=DT).unsqueeze(-1), learn=False)
    model = make_model(inducing).eval()
    times, y, _ = observations()
    other_times, other_y, _ = observations(4)
    with torch.no_grad():
        model.encode_posterior(times, y)
        fresh = model.latent_marginals(times)
        model.encode_posterior(other_times + 1.0, other_y)
        model.latent_marginals(other_times + 1.0)
        model.encode_posterior(times, y)
        again = model.latent_marginals(times)
    assert torch.equal(fresh[0], again[0]) and torch.equal(fresh[1], again[1])


def test_state_dict_reload_gives_the_same_elbo():
    times, y, mask = observations()
    model = make_model(HiPPOInducingVariables(8, "legs", t=1.0), seed=1)
    fresh = make_model(HiPPOInducingVariables(8, "legs", t=1.0), seed=2)
    assert not torch.allclose(terms(model, times, y, mask), terms(fresh, times, y, mask))
    fresh.load_state_dict(model.state_dict())
    assert torch.equal(terms(model, times, y, mask), terms(fresh, times, y, mask))


def test_bad_input_names_the_argument():
    times, y, mask = observations()
    model = make_model(InducingPoints(torch.linspace(0, 1, M, dtype=DT).unsqueeze(-1), learn=False))
    with pytest.raises(ValueError, match="times"):
        model.elbo_terms(times.flip(0), y, mask)
    with pytest.raises(ValueError, match="y must have shape"):
        model.elbo_terms(times, y[:, :2], mask)
    with pytest.raises(ValueError, match="mask"):
        model.elbo_terms(times, y, mask.double())
    bad = y.clone()
    bad[0, 0] = float("nan")
    with pytest.raises(ValueError, match="NaN at entries the mask marks as observed"):
        model.elbo_terms(times, bad, torch.ones_like(mask))
    with pytest.raises(ValueError, match="num_samples"):
        model.elbo_terms(times, y, mask, num_samples=0)
    with pytest.raises(TypeError, match="latent_gp"):
        SVGPVAE(D, object())
    with pytest.raises(ValueError, match="observation_dim"):
        SVGPVAE(0, model.latent_gp)
