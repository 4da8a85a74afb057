"""OSGPR (trained points), OVC and OVFF: each is the shared OnlineSGPR with a schedule; checked against a
naive closed-form online posterior (Bui et al. 2017 in natural parameters, explicit inverses) written here."""

import gpytorch
import pytest
import torch

from gpytorch_hippo import OnlineSGPR
from gpytorch_hippo.baselines import PivotedCholeskySchedule, RandomPointsSchedule, learn_task
from gpytorch_hippo.inducing import InducingPoints

DT = torch.float64
JITTER = 1e-6  # InducingPoints' float64 default: white noise on f at the inducing inputs


def rbf(lengthscale=0.3):
    kernel = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel()).to(DT)
    kernel.base_kernel.lengthscale = torch.tensor(lengthscale, dtype=DT)
    kernel.outputscale = torch.tensor(1.5, dtype=DT)
    return kernel


def gaussian(noise=0.05):
    likelihood = gpytorch.likelihoods.GaussianLikelihood().to(DT)
    likelihood.noise = torch.tensor(noise, dtype=DT)
    return likelihood


def two_tasks(seed=0, n=40):
    generator = torch.Generator().manual_seed(seed)
    x1 = torch.rand(n, 1, generator=generator, dtype=DT)
    x2 = 1 + torch.rand(n, 1, generator=generator, dtype=DT)
    f = lambda x: torch.sin(6 * x[:, 0]) + 0.5 * x[:, 0]
    y1 = f(x1) + 0.2 * torch.randn(n, generator=generator, dtype=DT)
    y2 = f(x2) + 0.2 * torch.randn(n, generator=generator, dtype=DT)
    return (x1, y1), (x2, y2)


def k_points(kernel, za, zb):
    """k(Za, Zb) + jitter where points coincide (the jitter is white noise on f at inducing inputs)."""
    same = (za.unsqueeze(-2) == zb.unsqueeze(-3)).all(-1).to(DT)
    return kernel(za, zb).to_dense() + JITTER * same


def naive_online_posterior(kernel, noise, tasks, points, x_test):
    """Predictive mean/variance of f after absorbing ``tasks`` with inducing inputs ``points[i]``:
    natural parameters of q(b) = p(b) × likelihood of the new data × q_old(a)/p_old(a) projected on b."""
    prec_old = mean_old = z_old = None
    for (x, y), z in zip(tasks, points):
        kbb_inv = torch.linalg.inv(k_points(kernel, z, z))
        kbf = kernel(z, x).to_dense()
        precision = kbb_inv + kbb_inv @ kbf @ kbf.mT @ kbb_inv / noise
        shift = kbb_inv @ kbf @ y / noise
        if prec_old is not None:
            kab = k_points(kernel, z_old, z)
            kaa_inv = torch.linalg.inv(k_points(kernel, z_old, z_old))
            # the old factor exp(-½ aᵀPa + aᵀh), averaged over the jitter noise N of the old points
            # that the new set does not keep: P̃ = P (I + N P)^{-1}, h̃ = (I + P N)^{-1} h
            ratio_precision, ratio_shift = prec_old - kaa_inv, prec_old @ mean_old
            unshared = torch.diag(JITTER * (1 - (z_old.unsqueeze(-2) == z.unsqueeze(-3)).all(-1).any(-1).to(DT)))
            eye = torch.eye(len(z_old), dtype=DT)
            ratio_precision = ratio_precision @ torch.linalg.inv(eye + unshared @ ratio_precision)
            ratio_shift = torch.linalg.solve(eye + (prec_old - kaa_inv) @ unshared, ratio_shift)
            precision = precision + kbb_inv @ kab.mT @ ratio_precision @ kab @ kbb_inv
            shift = shift + kbb_inv @ kab.mT @ ratio_shift
        prec_old, mean_old, z_old = precision, torch.linalg.solve(precision, shift), z
    kbb_inv = torch.linalg.inv(k_points(kernel, z_old, z_old))
    ksb = kernel(x_test, z_old).to_dense()
    mean = ksb @ kbb_inv @ mean_old
    covar = kernel(x_test).to_dense() - ksb @ kbb_inv @ ksb.mT + ksb @ kbb_inv @ torch.linalg.inv(prec_old) @ kbb_inv @ ksb.mT
    return mean, covar.diagonal()


def greedy_variance_selection(kernel, candidates, num):
    """Direct greedy: repeatedly take the candidate with the largest variance given those taken."""
    chosen = []
    for _ in range(num):
        gram = kernel(candidates).to_dense()
        if chosen:
            kcz = gram[:, chosen]
            residual = gram.diagonal() - (kcz @ torch.linalg.solve(gram[chosen][:, chosen], kcz.mT)).diagonal()
        else:
            residual = gram.diagonal().clone()
        residual[chosen] = -1.0
        chosen.append(int(residual.argmax()))
    return candidates[chosen]


def predict(model, x):
    model.eval()
    with torch.no_grad():
        posterior = model(x)
    return posterior.mean, posterior.variance


@pytest.mark.parametrize("num_iter", [0, 25])
def test_ovc_and_ovc_optz_match_the_closed_form_online_posterior(num_iter):
    kernel, likelihood = rbf(), gaussian()
    (x1, y1), (x2, y2) = tasks = two_tasks()
    schedule = PivotedCholeskySchedule(8, num_iter=num_iter)
    generator = torch.Generator().manual_seed(1)
    model = OnlineSGPR(schedule.first(x1, 1.0, kernel, generator), kernel, likelihood).to(DT)
    model.requires_grad_(False)  # hyperparameters fixed; only OVC-optZ's points move
    model.inducing_variables.requires_grad_(num_iter > 0)
    model.update(x1, y1)
    z1 = model.inducing_variables.points.detach().clone()
    torch.testing.assert_close(z1, greedy_variance_selection(kernel, x1, 8))
    candidates = torch.cat([z1, x2])
    learn_task(model, schedule, x2, y2, 2.0, generator)
    z2 = model.inducing_variables.points.detach().clone()
    if num_iter == 0:
        torch.testing.assert_close(z2, greedy_variance_selection(kernel, candidates, 8))
    else:  # OVC-optZ moved the selected points
        assert (z2 - greedy_variance_selection(kernel, candidates, 8)).abs().max() > 1e-3
    x_test = torch.linspace(0, 2, 25, dtype=DT).unsqueeze(-1)
    mean, var = predict(model, x_test)
    ref_mean, ref_var = naive_online_posterior(kernel, likelihood.noise.item(), tasks, [z1, z2], x_test)
    torch.testing.assert_close(mean, ref_mean, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(var, ref_var, rtol=1e-6, atol=1e-6)


def test_osgpr_trains_points_from_old_and_new_and_improves_the_online_bound():
    kernel, likelihood = rbf(), gaussian()
    (x1, y1), (x2, y2) = tasks = two_tasks(seed=3)
    generator = torch.Generator().manual_seed(0)
    trained, fixed = RandomPointsSchedule(6, num_iter=30), RandomPointsSchedule(6)
    model = OnlineSGPR(trained.first(x1, 1.0, kernel, generator), kernel, likelihood).to(DT)
    model.covar_module.requires_grad_(False)
    model.likelihood.requires_grad_(False)
    start = model.inducing_variables.points.detach().clone()
    assert all(((x1 == p).all(-1)).any() for p in start)  # first task: drawn from its inputs
    model.update(x1, y1)
    z1 = model.inducing_variables.points.detach().clone()
    # the same draw without training, for the bound comparison of task 2
    state = generator.get_state()
    bound_trained = learn_task(model, trained, x2, y2, 2.0, generator, lr=0.05)
    z2 = model.inducing_variables.points.detach().clone()
    generator.set_state(state)
    draw = fixed.next(InducingPoints(z1, learn=False), x2, 2.0, kernel, generator).points
    candidates = torch.cat([z1, x2])
    assert all(((candidates == p).all(-1)).any() for p in draw)  # re-drawn from old points ∪ new inputs
    assert not all(((candidates == p).all(-1)).any() for p in z2)  # ... then moved by Adam
    reference = OnlineSGPR(InducingPoints(z1, learn=False), kernel, likelihood).to(DT)
    reference.update(x1, y1)
    reference.inducing_variables = InducingPoints(draw, learn=False).to(DT)
    bound_fixed = reference.update(x2, y2)
    assert bound_trained > bound_fixed + 1.0
    # hyperparameters stayed fixed, and the posterior is the closed form with the trained points
    assert model.covar_module.base_kernel.lengthscale.item() == pytest.approx(0.3)
    x_test = torch.linspace(0, 2, 25, dtype=DT).unsqueeze(-1)
    mean, var = predict(model, x_test)
    ref_mean, ref_var = naive_online_posterior(kernel, likelihood.noise.item(), tasks, [z1, z2], x_test)
    torch.testing.assert_close(mean, ref_mean, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(var, ref_var, rtol=1e-6, atol=1e-6)
