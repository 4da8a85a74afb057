"""Continual learning with HiPPO inducing variables: thesis Fig. 4.1 (OHSGPR keeps task 1 after task 2,
against OSGPR with inducing points moved to the new task) and Fig. 4.2 (two-moons continual
classification with OHSVGP and the orderings of §4.4)."""

import math

import gpytorch
import pytest
import torch
from sklearn.datasets import make_moons

from gpytorch_hippo.inducing import HiPPOInducingVariables, InducingPoints
from gpytorch_hippo.online import OnlineELBO, OnlineSGPR
from gpytorch_hippo.ordering import order_inputs
from gpytorch_hippo.variational import InterdomainVariationalStrategy

DT = torch.float64


# ---------------------------------------------------------------------------------------------
# (a) toy two-task time series, fixed hyperparameters (thesis Fig. 4.1)


def toy_signal(x):
    return torch.sin(2 * math.pi * 1.2 * x) + 0.5 * torch.cos(2 * math.pi * 0.4 * x)


def fixed_kernel():
    kernel = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel()).to(DT)
    kernel.base_kernel.lengthscale = 0.2
    kernel.outputscale = 1.0
    return kernel


def fixed_likelihood():
    likelihood = gpytorch.likelihoods.GaussianLikelihood().to(DT)
    likelihood.noise = 0.01
    return likelihood


def rmse(model, x):
    with torch.no_grad():
        return (model(x.unsqueeze(-1)).mean - toy_signal(x)).square().mean().sqrt().item()


def test_ohsgpr_keeps_task_one_while_osgpr_with_moved_points_forgets():
    """Task 1 on [0, 1], task 2 on [1, 2], 100 noisy points each (noise sd 0.1), M = 15, fixed
    hyperparameters (no optimisation). OHSGPR: LegS bases at t = 1, advanced to t = 2. OSGPR: 15 points
    spread over task 1, re-initialised over task 2's inputs. Measured: OHSGPR task-1 RMSE 0.036 ->
    0.034, OSGPR 0.036 -> 0.73 (the prior's scale)."""
    g = torch.Generator().manual_seed(0)
    tasks = []
    for low in (0.0, 1.0):
        x = (low + torch.rand(100, generator=g, dtype=DT)).sort().values
        tasks.append((x, toy_signal(x) + 0.1 * torch.randn(100, generator=g, dtype=DT)))
    grid_1 = torch.linspace(0, 1, 200, dtype=DT)
    grid_2 = torch.linspace(1, 2, 200, dtype=DT)
    M = 15

    ohsgpr = OnlineSGPR(HiPPOInducingVariables(M, "legs", t=1.0, method="quadrature"), fixed_kernel(), fixed_likelihood())
    ohsgpr.update(*tasks[0])
    ohsgpr.eval()
    ohsgpr_task1_before = rmse(ohsgpr, grid_1)
    ohsgpr.inducing_variables.advance(2.0)
    ohsgpr.update(*tasks[1])
    ohsgpr_task1_after, ohsgpr_task2 = rmse(ohsgpr, grid_1), rmse(ohsgpr, grid_2)

    osgpr = OnlineSGPR(InducingPoints(torch.linspace(0, 1, M, dtype=DT).unsqueeze(-1), learn=False), fixed_kernel(), fixed_likelihood())
    osgpr.update(*tasks[0])
    osgpr.eval()
    osgpr_task1_before = rmse(osgpr, grid_1)
    osgpr.inducing_variables = InducingPoints(torch.linspace(1, 2, M, dtype=DT).unsqueeze(-1), learn=False)
    osgpr.update(*tasks[1])
    osgpr_task1_after, osgpr_task2 = rmse(osgpr, grid_1), rmse(osgpr, grid_2)

    # both fit task 1 well at first (noise sd 0.1) and task 2 after it
    assert ohsgpr_task1_before < 0.06 and osgpr_task1_before < 0.06
    assert ohsgpr_task2 < 0.06 and osgpr_task2 < 0.06
    # OHSGPR remembers task 1 ...
    assert ohsgpr_task1_after < 1.5 * ohsgpr_task1_before
    # ... OSGPR with its points moved to task 2 forgets it (RMSE near the signal's own scale, ~0.8)
    assert osgpr_task1_after > 0.5
    assert osgpr_task1_after > 10 * ohsgpr_task1_after


# ---------------------------------------------------------------------------------------------
# (b) two-moons continual classification in 3 tasks, 20 HiPPO inducing variables (thesis Fig. 4.2)

MOONS_STEPS = 200
MOONS_LR = 0.05
MOONS_NUM_RFF = 500


def moons_tasks(n, seed):
    """make_moons (noise 0.1) split into 3 tasks by the first coordinate: x1 < 0, 0 <= x1 < 1, x1 >= 1."""
    x, y = make_moons(n_samples=n, noise=0.1, random_state=seed)
    x, y = torch.as_tensor(x, dtype=DT), torch.as_tensor(y, dtype=DT)
    task = torch.bucketize(x[:, 0].contiguous(), torch.tensor([0.0, 1.0], dtype=DT))
    return [(x[task == j], y[task == j]) for j in range(3)]


class HiPPOClassifier(gpytorch.models.ApproximateGP):
    def __init__(self, num_inducing=20):
        inducing_variables = HiPPOInducingVariables(num_inducing, "legs", input_dim=2, num_rff=MOONS_NUM_RFF)
        distribution = gpytorch.variational.CholeskyVariationalDistribution(num_inducing)
        super().__init__(InterdomainVariationalStrategy(self, inducing_variables, distribution))
        self.mean_module = gpytorch.means.ZeroMean()
        self.covar_module = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel(ard_num_dims=2))
        self.covar_module.base_kernel.lengthscale = 0.5

    def forward(self, x):
        return gpytorch.distributions.MultivariateNormal(self.mean_module(x), self.covar_module(x))


def accuracy(model, likelihood, x, y):
    model.eval()
    with torch.no_grad():
        probability = likelihood(model(x)).mean
    model.train()
    return ((probability > 0.5).to(DT) == y).to(DT).mean().item()


def run_ohsvgp(criterion, train, test):
    """OHSVGP: per task, order the inputs, extend the HiPPO path, maximise the online ELBO, end the task.
    Kernel hyperparameters are trained on task 1 only, then fixed. Returns test accuracies per task
    after each task."""
    torch.manual_seed(0)
    model = HiPPOClassifier().to(DT)
    likelihood = gpytorch.likelihoods.BernoulliLikelihood()
    mll = OnlineELBO(likelihood, model, num_data=train[0][1].shape[0])
    last_input, history = None, []
    for index, (x, y) in enumerate(train):
        order = order_inputs(x, criterion, kernel=model.covar_module, start=last_input)
        x, y = x[order], y[order]
        last_input = x[-1]
        model.variational_strategy.append_path(x)  # carries q(u) forward (after end_task)
        mll.num_data = y.shape[0]
        if index == 0:
            parameters = list(model.parameters())
        else:
            model.covar_module.requires_grad_(False)
            parameters = list(model.variational_strategy._variational_distribution.parameters())
        optimizer = torch.optim.Adam(parameters, lr=MOONS_LR)
        model.train()
        for _ in range(MOONS_STEPS):
            optimizer.zero_grad()
            loss = -mll(model(x), y)
            loss.backward()
            optimizer.step()
        mll.end_task()
        history.append([accuracy(model, likelihood, *task) for task in test[: index + 1]])
    return history


@pytest.fixture(scope="module")
def moons_results():
    train = moons_tasks(240, seed=0)
    test = moons_tasks(600, seed=1)
    return {criterion: run_ohsvgp(criterion, train, test) for criterion in ("kernel_max", "kernel_min")}


def test_two_moons_ohsvgp_kernel_max_keeps_all_tasks(moons_results):
    """Thesis Fig. 4.2: OHSVGP-k-max classifies all three tasks after the third (held-out points)."""
    after_last = moons_results["kernel_max"][-1]
    assert len(after_last) == 3
    assert min(after_last) >= 0.95, moons_results["kernel_max"]


@pytest.mark.xfail(
    strict=False,
    reason=(
        "thesis Fig. 4.2 (k-min forgets after task 3) does not reproduce here: with 240 training points, "
        "200 Adam steps per task (lr 0.05), 500 RFF, hyperparameters trained on task 1 only, k-max and k-min both "
        "reach held-out accuracy 1.00/1.00/1.00 on tasks 1/2/3 after task 3 (held-out NLL k-max 0.076/0.036/0.028, "
        "k-min 0.033/0.042/0.030); also both 1.00 everywhere with 300 points, 300 steps, lr 0.03, 500 or 1000 RFF, "
        "and with the tasks split at the tertiles of x1"
    ),
)
def test_two_moons_kernel_max_beats_kernel_min(moons_results):
    kernel_max, kernel_min = moons_results["kernel_max"][-1], moons_results["kernel_min"][-1]
    assert sum(kernel_max) > sum(kernel_min), (kernel_max, kernel_min)
