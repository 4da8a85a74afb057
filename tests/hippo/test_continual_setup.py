"""The continual-regression set-up of thesis §4.6.2: min-max inputs, a global test split, the
stable oracle order, and task-1 hyperparameters from an exact GP fitted with BoTorch."""

import math

import gpytorch
import pytest
import torch

from experiments.hippo import online_elbo
from experiments.hippo.online_elbo import fit_exact_gp, run_elbo_method
from gpytorch_hippo.data import Dataset, minmax_inputs, split_order, split_tasks


def tied_inputs():
    # first coordinate takes 3 values (many ties); the second decreases along the rows, so a
    # stable sort of the first key alone keeps the tied rows in reverse order of the second key
    first = torch.tensor([2.0, 1.0, 2.0, 1.0, 0.0, 2.0, 1.0, 0.0], dtype=torch.float64)
    second = torch.arange(8, 0, -1, dtype=torch.float64)
    third = torch.tensor([5.0, 3.0, 1.0, 4.0, 2.0, 0.0, 7.0, 6.0], dtype=torch.float64)
    return torch.stack([first, second, third], -1)


def test_oracle_order_breaks_ties_by_the_next_key():
    x = tied_inputs()
    expected = sorted(range(8), key=lambda i: tuple(x[i].tolist()))  # Python's lexicographic tuple sort
    assert split_order(x, "first-dim").tolist() == expected
    # the order the runner used before (argsort of the split key alone) differs on these ties
    assert torch.argsort(x[:, 0], stable=True).tolist() != expected
    norms = x.norm(dim=-1).tolist()
    expected_l2 = sorted(range(8), key=lambda i: (norms[i], *x[i].tolist()))
    assert split_order(x, "l2").tolist() == expected_l2


def test_oracle_order_breaks_ties_of_the_l2_key():
    # points on one circle: equal norms, ordered by the first and then the second coordinate
    x = torch.tensor([[0.0, 1.0], [1.0, 0.0], [0.0, -1.0], [-1.0, 0.0]], dtype=torch.float64)
    assert split_order(x, "l2").tolist() == [3, 2, 0, 1]


def test_minmax_inputs_maps_each_dimension_onto_minus_one_one():
    x = torch.tensor([[0.0, 10.0], [5.0, 30.0], [10.0, 20.0]], dtype=torch.float64)
    data = minmax_inputs(Dataset("toy", x, torch.zeros(3)))
    assert torch.equal(data.x, torch.tensor([[-1.0, -1.0], [0.0, 1.0], [1.0, 0.0]], dtype=torch.float64))
    with pytest.raises(ValueError, match="constant"):
        minmax_inputs(Dataset("toy", torch.ones(3, 2, dtype=torch.float64), torch.zeros(3)))


def test_global_split_holds_out_one_tenth_of_all_points_once():
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(103, 3, generator=generator, dtype=torch.float64)
    data = Dataset("toy", x, torch.arange(103, dtype=torch.float64))
    tasks = split_tasks(data, 5, seed=4, test_fraction=0.1, split="first-dim", test_split="global")
    test_ids = torch.cat([t.test_y for t in tasks]).long()
    train_ids = torch.cat([t.train_y for t in tasks]).long()
    assert test_ids.numel() == math.floor(0.1 * 103)
    assert sorted(torch.cat([test_ids, train_ids]).tolist()) == list(range(103))
    # tasks are contiguous blocks of the oracle order, the held-out set does not depend on the tasks
    blocks = torch.tensor_split(split_order(x, "first-dim"), 5)
    for task, block in zip(tasks, blocks):
        assert sorted(torch.cat([task.train_y, task.test_y]).long().tolist()) == sorted(block.tolist())
    other = split_tasks(data, 2, seed=4, test_fraction=0.1, split="first-dim", test_split="global")
    assert sorted(torch.cat([t.test_y for t in other]).long().tolist()) == sorted(test_ids.tolist())


def closed_form_log_marginal(raw, x, y):
    """log N(y | c 1, s K_rbf(x; l) + n I) from raw (softplus-constrained) values, without GPyTorch."""
    raw_l, raw_s, raw_n, c = raw
    lengthscale, scale, noise = (torch.nn.functional.softplus(v) for v in (raw_l, raw_s, raw_n))
    noise = noise + 1e-4  # GaussianLikelihood's noise constraint: GreaterThan(1e-4)
    z = x / lengthscale
    cov = scale * torch.exp(-0.5 * torch.cdist(z, z) ** 2) + noise * torch.eye(x.shape[0], dtype=x.dtype)
    return torch.distributions.MultivariateNormal(c.expand(x.shape[0]), cov).log_prob(y)


def test_fit_exact_gp_reaches_a_stationary_point_of_the_closed_form_marginal_likelihood():
    generator = torch.Generator().manual_seed(1)
    x = torch.rand(40, 2, generator=generator, dtype=torch.float64) * 2 - 1
    y = torch.sin(3 * x[:, 0]) + 0.1 * x[:, 1] + 0.1 * torch.randn(40, generator=generator, dtype=torch.float64)
    kernel = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel(ard_num_dims=2)).double()
    likelihood = gpytorch.likelihoods.GaussianLikelihood().double()
    mean = gpytorch.means.ConstantMean().double()
    kernel.base_kernel.lengthscale = 0.5

    def raw_values():
        return [
            kernel.base_kernel.raw_lengthscale.detach().clone().squeeze(0),
            kernel.raw_outputscale.detach().clone(),
            likelihood.noise_covar.raw_noise.detach().clone().squeeze(0),
            mean.constant.detach().clone(),
        ]

    start = closed_form_log_marginal(raw_values(), x, y)
    fit_exact_gp(kernel, likelihood, mean, x, y)
    fitted = [v.requires_grad_(True) for v in raw_values()]
    value = closed_form_log_marginal(fitted, x, y)
    value.backward()
    assert value > start + 5
    for v in fitted:
        assert v.grad.abs().max() < 1e-2 * x.shape[0]  # L-BFGS-B's stopping tolerance, on the summed log density


def test_fit_exact_gp_falls_back_to_adam_where_every_lbfgs_attempt_fails(monkeypatch):
    """BoTorch raises ModelFittingError when all L-BFGS-B attempts fail (seen on one task 1 of diabetes): the fit
    restarts from the same start with Adam, says so, and still climbs the closed-form marginal likelihood."""
    import botorch.fit
    from botorch.exceptions.errors import ModelFittingError

    original = botorch.fit.fit_gpytorch_mll

    def lbfgs_fails(mll, **kwargs):
        if "optimizer" not in kwargs:
            mll.model.covar_module.base_kernel.raw_lengthscale.data.fill_(30.0)  # a failed attempt leaves its values
            raise ModelFittingError("All attempts to fit the model have failed.")
        return original(mll, **kwargs)

    monkeypatch.setattr(botorch.fit, "fit_gpytorch_mll", lbfgs_fails)
    generator = torch.Generator().manual_seed(1)
    x = torch.rand(40, 2, generator=generator, dtype=torch.float64) * 2 - 1
    y = torch.sin(3 * x[:, 0]) + 0.1 * x[:, 1] + 0.1 * torch.randn(40, generator=generator, dtype=torch.float64)
    kernel = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel(ard_num_dims=2)).double()
    likelihood, mean = gpytorch.likelihoods.GaussianLikelihood().double(), gpytorch.means.ConstantMean().double()
    kernel.base_kernel.lengthscale = 0.5
    raw = [
        kernel.base_kernel.raw_lengthscale.detach().clone().squeeze(0),
        kernel.raw_outputscale.detach().clone(),
        likelihood.noise_covar.raw_noise.detach().clone().squeeze(0),
        mean.constant.detach().clone(),
    ]
    start = closed_form_log_marginal(raw, x, y)
    with pytest.warns(RuntimeWarning, match="fitted by Adam from the same start"):
        assert fit_exact_gp(kernel, likelihood, mean, x, y) == "adam"
    fitted = [
        kernel.base_kernel.raw_lengthscale.detach().squeeze(0),
        kernel.raw_outputscale.detach(),
        likelihood.noise_covar.raw_noise.detach().squeeze(0),
        mean.constant.detach(),
    ]
    assert closed_form_log_marginal(fitted, x, y) > start + 5
    assert float(kernel.base_kernel.raw_lengthscale.detach().max()) < 30.0  # restarted from the start, not from the failed attempt


def task_data(n=120, seed=0):
    generator = torch.Generator().manual_seed(seed)
    x = torch.rand(n, 3, generator=generator, dtype=torch.float64) * torch.tensor([1.0, 10.0, 100.0], dtype=torch.float64)
    y = torch.sin(3 * x[:, 0]) + torch.cos(x[:, 1] / 3) + 0.1 * torch.randn(n, generator=generator, dtype=torch.float64)
    return Dataset("toy3", x, (y - y.mean()) / y.std())


def record_first_ordering(monkeypatch):
    seen = []
    original = online_elbo.order_inputs

    def recording(x, criterion, kernel=None, start=None):
        if not seen:
            seen.append(kernel.base_kernel.lengthscale.detach().clone())
        return original(x, criterion, kernel=kernel, start=start)

    monkeypatch.setattr(online_elbo, "order_inputs", recording)
    return seen


def test_exact_gp_kernel_is_fitted_on_task_one_fixed_and_orders_task_one(monkeypatch):
    data = task_data()
    seen = record_first_ordering(monkeypatch)
    rows, model, likelihood = run_elbo_method(data, "ohsvgp-k", 8, seed=0, num_tasks=3, split="first-dim", svgp_iters=5, num_rff=100)
    # the independent fit: the same start, min-max inputs and global split, fit_exact_gp alone
    task1 = split_tasks(minmax_inputs(data), 3, 0, test_fraction=0.1, split="first-dim", test_split="global")[0]
    kernel = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel(ard_num_dims=3)).double()
    kernel.base_kernel.lengthscale = 2.0 / 4  # span / 4 of the min-max inputs
    reference_likelihood = gpytorch.likelihoods.GaussianLikelihood().double()
    fit_exact_gp(kernel, reference_likelihood, gpytorch.means.ConstantMean().double(), task1.train_x, task1.train_y)
    lengthscale = model.covar_module.base_kernel.lengthscale.detach()
    torch.testing.assert_close(lengthscale, kernel.base_kernel.lengthscale.detach(), rtol=1e-6, atol=1e-8)
    torch.testing.assert_close(likelihood.noise.detach(), reference_likelihood.noise.detach(), rtol=1e-6, atol=1e-8)
    torch.testing.assert_close(seen[0], lengthscale)  # task 1 was ordered with the fitted kernel
    assert len(rows) == 6 and all(math.isfinite(r["nlpd"]) for r in rows)


def test_elbo_option_keeps_the_former_behaviour(monkeypatch):
    data = task_data()
    seen = record_first_ordering(monkeypatch)
    _, model, _ = run_elbo_method(
        data,
        "ohsvgp-k",
        8,
        seed=0,
        num_tasks=3,
        split="first-dim",
        svgp_iters=5,
        num_rff=100,
        first_task_kernel="elbo",
        preprocessing="standardise",
    )
    span = data.x.max(0).values - data.x.min(0).values
    torch.testing.assert_close(seen[0].squeeze(0), span / 4)  # ordered with the starting kernel
    assert not torch.allclose(model.covar_module.base_kernel.lengthscale.detach().squeeze(0), span / 4)  # then trained
    with pytest.raises(ValueError, match="first_task_kernel"):
        run_elbo_method(data, "ohsvgp-k", 8, seed=0, num_tasks=3, split="first-dim", first_task_kernel="grid")
    with pytest.raises(ValueError, match="preprocessing"):
        run_elbo_method(data, "ohsvgp-k", 8, seed=0, num_tasks=3, split="first-dim", preprocessing="minmax")
