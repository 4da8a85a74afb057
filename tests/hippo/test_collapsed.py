"""The collapsed online bound and its optimal q(u) as functions (gpytorch_hippo.collapsed).

References: Titsias' collapsed SGPR bound and optimal q(u) written densely here with GPyTorch's kernel matrices
and torch's MultivariateNormal; the jitter-averaged ratio against a dense Gaussian integral; explicit inverses.
"""

import gpytorch
import torch

from gpytorch_hippo import InducingPoints
from gpytorch_hippo.collapsed import collapsed_update, smooth_ratio, unwhiten_ratio, whitened_mean

DT = torch.float64


def first_task():
    generator = torch.Generator().manual_seed(3)
    kernel = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel()).double()
    kernel.base_kernel.lengthscale, kernel.outputscale = 0.6, 1.4
    mean = gpytorch.means.ConstantMean().double()
    mean.constant = 0.3
    points = InducingPoints(torch.linspace(0, 3, 7, dtype=DT).unsqueeze(-1), learn=False)
    x = 3 * torch.rand(25, 1, generator=generator, dtype=DT)
    y = torch.sin(2 * x.squeeze(-1)) + 0.1 * torch.randn(25, generator=generator, dtype=DT)
    return kernel, mean, points, x, y, torch.tensor(0.05, dtype=DT)


def test_the_first_task_is_titsias_bound_and_optimal_q_u_written_densely():
    kernel, mean, points, x, y, noise = first_task()
    with torch.no_grad():
        update = collapsed_update(kernel, points, mean, x, y, noise)
        Kuu, Kux, Kxx = points.Kuu(kernel).to_dense(), points.Kuf(kernel, x), kernel(x).to_dense()
        Qxx = Kux.mT @ torch.linalg.solve(Kuu, Kux)
        N = y.shape[0]
        titsias = torch.distributions.MultivariateNormal(mean(x), Qxx + noise * torch.eye(N, dtype=DT)).log_prob(y)
        titsias = titsias - (Kxx - Qxx).diagonal().sum() / (2 * noise)
        torch.testing.assert_close(update.bound, titsias, rtol=1e-10, atol=0)
        # q(u) = N(m(z) + Kuu Σ⁻¹ Kux (y - m(x)) / σ², Kuu Σ⁻¹ Kuu), Σ = Kuu + Kux Kxu / σ²
        Sigma = Kuu + Kux @ Kux.mT / noise
        mean_u = mean(points.points) + Kuu @ torch.linalg.solve(Sigma, Kux @ (y - mean(x))) / noise
        covar_u = Kuu @ torch.linalg.solve(Sigma, Kuu)
        torch.testing.assert_close(update.prior_mean + update.chol @ whitened_mean(update.shift, update.b_chol), mean_u)
        B_inv = torch.cholesky_inverse(update.b_chol)
        torch.testing.assert_close(update.chol @ B_inv @ update.chol.mT, covar_u)
        torch.testing.assert_close(update.captured, (Qxx.diagonal() / Kxx.diagonal()))


def test_padding_that_the_mask_leaves_out_changes_nothing():
    kernel, mean, points, x, y, noise = first_task()
    with torch.no_grad():
        plain = collapsed_update(kernel, points, mean, x, y, noise)
        padded_x, padded_y = torch.cat([x, torch.full((3, 1), 1.5, dtype=DT)]), torch.cat([y, torch.full((3,), 100.0, dtype=DT)])
        mask = torch.arange(28) < 25
        padded = collapsed_update(kernel, points, mean, padded_x, padded_y, noise, mask=mask)
    for name in ("bound", "precision", "shift"):
        torch.testing.assert_close(getattr(padded, name), getattr(plain, name), rtol=1e-12, atol=1e-12)


def test_unwhiten_ratio_is_the_ratio_written_in_the_unwhitened_variables():
    # exp(-½ wᵀΛw + wᵀη) with w = L⁻¹z is exp(-½ zᵀ L⁻ᵀΛL⁻¹ z + zᵀ L⁻ᵀη)
    generator = torch.Generator().manual_seed(1)
    A = torch.randn(4, 4, generator=generator, dtype=DT)
    precision = A @ A.mT
    chol = torch.linalg.cholesky(A.mT @ A + torch.eye(4, dtype=DT))
    shift = torch.randn(4, generator=generator, dtype=DT)
    inverse = torch.linalg.inv(chol)
    unwhitened_precision, unwhitened_shift = unwhiten_ratio(precision, shift, chol)
    torch.testing.assert_close(unwhitened_precision, inverse.mT @ precision @ inverse)
    torch.testing.assert_close(unwhitened_shift, inverse.mT @ shift)


def test_smoothed_ratio_is_the_gaussian_average_over_the_jitter():
    """``log E_e[r(a + e)]``, ``e ~ N(0, diag(n))``, against the dense integral
    ``∫ N(s; a, diag(n)) exp(-½ sᵀPs + sᵀh) ds`` at several ``a`` (quadratic, linear and constant parts)."""
    torch.manual_seed(0)
    M = 5
    A = torch.randn(M, M, dtype=DT)
    precision = A @ A.T + 0.1 * torch.eye(M, dtype=DT)
    shift = torch.randn(M, dtype=DT)
    noise = torch.rand(M, dtype=DT) + 0.1
    noise[1] = 0.0  # a variable whose jitter the new set shares
    smoothed_precision, smoothed_shift, constant = smooth_ratio(precision, shift, noise)
    keep = noise > 0
    J = torch.diag(noise.sqrt())[:, keep]  # s = a + J z, z ~ N(0, I) on the noisy coordinates
    inner = torch.eye(int(keep.sum()), dtype=DT) + J.T @ precision @ J
    for _ in range(4):
        a = torch.randn(M, dtype=DT)
        b = J.T @ (shift - precision @ a)
        reference = -0.5 * a @ precision @ a + a @ shift - 0.5 * torch.logdet(inner) + 0.5 * b @ torch.linalg.solve(inner, b)
        value = -0.5 * a @ smoothed_precision @ a + a @ smoothed_shift + constant
        assert abs(value - reference) < 1e-10 * max(1.0, abs(reference))
    dense = torch.linalg.inv(torch.linalg.inv(precision) + torch.diag(noise))  # (P^{-1} + N)^{-1}
    torch.testing.assert_close(smoothed_precision, dense, rtol=1e-10, atol=1e-10)
    assert torch.equal(smooth_ratio(precision, shift, torch.zeros(M, dtype=DT))[0], precision)
