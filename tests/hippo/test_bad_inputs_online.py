"""The online models' entry points (``OnlineSGPR.update``/``log_bound``/``__call__``, ``OnlineELBO``,
``OnlineGPModel.posterior``) with NaN, Inf, empty, integer, float32 and extreme inputs: a named error
or the result of the same input in float64 (never a NaN posterior or bound)."""

import math

import gpytorch
import pytest
import torch

from gpytorch_hippo import HiPPOInducingVariables, InducingPoints, InterdomainVariationalStrategy, OnlineELBO, OnlineSGPR
from gpytorch_hippo.botorch import OnlineGPModel

DT = torch.float64
NAN, INF = float("nan"), float("inf")


def make_sgpr(kind):
    kernel = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel()).to(DT)
    kernel.base_kernel.lengthscale = 0.3
    likelihood = gpytorch.likelihoods.GaussianLikelihood().to(DT)
    likelihood.noise = 0.05
    if kind == "points":
        variables = InducingPoints(torch.linspace(0, 4, 6, dtype=DT), learn=False)
    else:
        variables = HiPPOInducingVariables(8, "legs", t=4.0)
    return OnlineSGPR(variables, kernel, likelihood, captured_variance_warning=None)


def data(n=20):
    x = torch.linspace(0, 4, n, dtype=DT)
    return x, torch.sin(2 * x)


def with_value(tensor, index, value):
    tensor = tensor.clone()
    tensor[index] = value
    return tensor


KINDS = ["points", "hippo"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(
    "bad, match",
    [
        (lambda x, y: (with_value(x, 3, NAN), y), "train_x contains NaN"),
        (lambda x, y: (with_value(x, 3, INF), y), "train_x contains infinite"),
        (lambda x, y: (x, with_value(y, 3, NAN)), "train_y contains NaN"),
        (lambda x, y: (x, with_value(y, 3, -INF)), "train_y contains infinite"),
        (lambda x, y: (x[:0], y), "train_x must have shape"),
        (lambda x, y: (x, y[:-1]), "train_y must have shape"),
        (lambda x, y: (["day"] * len(x), y), "train_x must be a torch.Tensor or an array of numbers"),
        (lambda x, y: (x, 1e300 * y), "online update is not finite.*train_y"),
    ],
)
def test_update_names_the_bad_argument(kind, bad, match):
    model = make_sgpr(kind)
    with pytest.raises((ValueError, TypeError), match=match):
        model.update(*bad(*data()))
    assert not model.has_posterior  # nothing half-stored


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(
    "lr, match",
    [(INF, "lr must be a finite"), (NAN, "lr must be a finite"), (0.0, "lr must be > 0"), (True, "lr must be a real")],
)
def test_update_rejects_a_bad_learning_rate(kind, lr, match):
    with pytest.raises((ValueError, TypeError), match=match):
        make_sgpr(kind).update(*data(), num_iter=2, lr=lr)


@pytest.mark.parametrize("kind", KINDS)
def test_prediction_rejects_nan_queries_and_promotes_integer_and_float32_ones(kind):
    model = make_sgpr(kind)
    model.update(*data())
    for query in (torch.tensor([1.0, NAN], dtype=DT), torch.tensor([[INF]], dtype=DT)):
        with pytest.raises(ValueError, match="x contains"):
            model(query)
    with pytest.raises(TypeError, match="x must be a torch.Tensor or an array of numbers"):
        model(["one", "two"])
    with torch.no_grad():
        reference = model(torch.tensor([1.0, 2.0, 3.0], dtype=DT))
        for query in (torch.tensor([1, 2, 3]), torch.tensor([1.0, 2.0, 3.0], dtype=torch.float32), [1.0, 2.0, 3.0]):
            predictive = model(query)
            assert predictive.mean.dtype == DT
            torch.testing.assert_close(predictive.mean, reference.mean, rtol=0, atol=1e-12)
            torch.testing.assert_close(predictive.variance, reference.variance, rtol=0, atol=1e-12)


@pytest.mark.parametrize("kind", KINDS)
def test_integer_training_inputs_give_the_float_result(kind):
    integer, floating = make_sgpr(kind), make_sgpr(kind)
    x = torch.arange(0, 4)
    y = torch.cos(x.to(DT))
    bound_integer, bound_float = integer.update(x, y), floating.update(x.to(DT), y)
    assert math.isfinite(bound_integer.item()) and abs(bound_integer.item() - bound_float.item()) < 1e-12


class SVGP(gpytorch.models.ApproximateGP):
    def __init__(self):
        variables = InducingPoints(torch.linspace(0, 4, 6, dtype=DT), learn=False)
        q = gpytorch.variational.CholeskyVariationalDistribution(6)
        super().__init__(InterdomainVariationalStrategy(self, variables, q))
        self.mean_module = gpytorch.means.ZeroMean()
        self.covar_module = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel())

    def forward(self, x):
        return gpytorch.distributions.MultivariateNormal(self.mean_module(x), self.covar_module(x))


@pytest.mark.parametrize(
    "bad, match",
    [
        (lambda x, y: (x, with_value(y, 2, INF)), "target contains infinite"),
        (lambda x, y: (x, with_value(y, 2, NAN)), "target contains NaN"),
        (lambda x, y: (x[:0], y[:0]), "minibatch is empty"),
        (lambda x, y: (x, y.numpy()), "target must be a torch.Tensor"),
    ],
)
def test_online_elbo_names_the_bad_target(bad, match):
    model = SVGP().to(DT)
    elbo = OnlineELBO(gpytorch.likelihoods.GaussianLikelihood().to(DT), model, num_data=20)
    x, y = bad(*data())
    with pytest.raises((ValueError, TypeError), match=match):
        elbo(model(x.unsqueeze(-1)), y)


@pytest.mark.filterwarnings("ignore::gpytorch_hippo.botorch.InducingApproximationWarning")  # 6 points, to be fast
def test_botorch_posterior_names_a_nan_candidate():
    x, y = data()
    points = InducingPoints(torch.linspace(0, 1, 6, dtype=DT), learn=False)
    model = OnlineGPModel(x.unsqueeze(-1) / 4, y.unsqueeze(-1), points, fit_maxiter=0, outcome_transform=None)
    with pytest.raises(ValueError, match="X contains NaN"):
        model.posterior(torch.tensor([[[0.5], [NAN]]], dtype=DT))
