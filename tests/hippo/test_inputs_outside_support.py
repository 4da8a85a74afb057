"""Training inputs the inducing variables cannot reach are refused with a named error (they used to be
absorbed as zero covariance, so the fit there stayed at the prior), and long prediction grids stay
within the cost guard, whose advice works for every inducing-variable view."""

import copy
import math

import gpytorch
import pytest
import torch

from gpytorch_hippo import HiPPOInducingVariables, InputsOutsideSupportError, InterdomainVariationalStrategy, OnlineELBO, OnlineSGPR
from gpytorch_hippo.botorch import OnlineGPModel
from gpytorch_hippo.inducing.banded import _Panels
from gpytorch_hippo.inducing.cost import CovarianceCostError
from gpytorch_hippo.inducing.lyapunov import _At

DT = torch.float64


def _model(method, t=1.0, start=0.0, dtype=DT):
    kernel = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel())
    kernel.base_kernel.lengthscale = 0.1
    likelihood = gpytorch.likelihoods.GaussianLikelihood()
    likelihood.noise = 0.01
    ivars = HiPPOInducingVariables(20, "legs", t=t, start=start, method=method)
    return OnlineSGPR(ivars, kernel, likelihood).to(dtype)


def _sine(x):
    return torch.sin(6 * x)


@pytest.mark.parametrize("method", ["lyapunov", "spectral"])
def test_a_forgotten_advance_is_an_error_and_leaves_the_model_unchanged(method):
    model = _model(method)
    x = torch.linspace(0, 1, 50, dtype=DT)
    model.update(x, _sine(x))
    state = copy.deepcopy(model.state_dict())
    later = torch.linspace(1.01, 3, 50, dtype=DT)
    with pytest.raises(InputsOutsideSupportError, match=r"beyond the range \[0, 1\].*advance\(t_new\)"):
        model.update(later, _sine(later))
    with pytest.raises(InputsOutsideSupportError, match="advance"):
        model.log_bound(later, _sine(later))
    assert all(torch.equal(value, model.state_dict()[key]) for key, value in state.items() if isinstance(value, torch.Tensor))
    model.inducing_variables.advance(3.0)
    model.update(later, _sine(later))
    model.eval()
    with torch.no_grad():
        fit = model(later).mean
    assert (fit - _sine(later)).norm() / _sine(later).norm() < 0.05  # learnt once advanced (it was 0.94 before)


@pytest.mark.parametrize("method", ["lyapunov", "spectral"])
def test_inputs_before_the_start_name_start(method):
    model = _model(method, t=2.0, start=1.0)
    x = torch.linspace(0.5, 2.0, 30, dtype=DT)
    with pytest.raises(InputsOutsideSupportError, match=r"before the range \[1, 2\].*start="):
        model.update(x, _sine(x))
    negative = _model(method, t=1.0)
    with pytest.raises(InputsOutsideSupportError, match="LegS bases cover"):
        negative.update(x - 1.0, _sine(x))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_inputs_at_the_ends_of_the_support_are_accepted_in_either_dtype(dtype):
    """``t = 1.1`` is not a float32 number: inputs rounded to it in float32 are within the support."""
    model = _model("lyapunov", t=1.1, start=0.1, dtype=dtype)
    x = torch.tensor([0.1, 0.5, 1.1], dtype=dtype)
    model.update(x, _sine(x))
    assert model.num_tasks.item() == 1


def test_forecasting_beyond_t_stays_allowed():
    model = _model("lyapunov")
    x = torch.linspace(0, 1, 40, dtype=DT)
    model.update(x, _sine(x))
    model.eval()
    with torch.no_grad():
        forecast = model(torch.linspace(1.0, 1.2, 5, dtype=DT))
    assert torch.isfinite(forecast.mean).all() and forecast.variance[-1] > forecast.variance[0]


class _SVGP(gpytorch.models.ApproximateGP):
    def __init__(self):
        q = gpytorch.variational.CholeskyVariationalDistribution(12)
        super().__init__(InterdomainVariationalStrategy(self, HiPPOInducingVariables(12, "legs", t=1.0), q))
        self.mean_module, self.covar_module = gpytorch.means.ZeroMean(), gpytorch.kernels.RBFKernel()
        self.covar_module.lengthscale = 0.2

    def forward(self, x):
        return gpytorch.distributions.MultivariateNormal(self.mean_module(x), self.covar_module(x))


def test_the_online_elbo_refuses_training_inputs_beyond_t_and_forecasts_in_eval_mode():
    model, likelihood = _SVGP().double(), gpytorch.likelihoods.GaussianLikelihood().double()
    elbo = OnlineELBO(likelihood, model, num_data=20)
    x = torch.linspace(0, 1, 20, dtype=DT).unsqueeze(-1)
    (-elbo(model(x), _sine(x[:, 0]))).backward()
    elbo.end_task()
    later = x + 1.0
    with pytest.raises(InputsOutsideSupportError, match="advance"):
        model(later)
    model.eval()
    with torch.no_grad():
        assert torch.isfinite(model(later).mean).all()
    model.train()
    model.variational_strategy.advance(2.0)
    assert torch.isfinite(elbo(model(later), _sine(later[:, 0])))


def test_the_botorch_model_refuses_observations_before_the_start():
    x = torch.linspace(1.0, 2.0, 20, dtype=DT).unsqueeze(-1)
    kernel = gpytorch.kernels.RBFKernel()
    kernel.lengthscale = 0.3
    model = OnlineGPModel(
        x,
        _sine(x),
        HiPPOInducingVariables(12, "legs", t=2.0, start=1.0),
        covar_module=kernel,
        mean_module=gpytorch.means.ZeroMean(),
        fit_maxiter=0,
        outcome_transform=None,
    )
    earlier = x[:5] - 0.9
    with pytest.raises(InputsOutsideSupportError, match="start="):
        model.condition_on_observations(earlier, _sine(earlier))
    later = x[:5] + 1.5  # beyond t: the model advances its bases itself
    assert model.condition_on_observations(later, _sine(later)).inducing_variables.t == pytest.approx(float(later.max()))


def test_a_prediction_grid_over_a_long_stream_stays_within_the_cost_guard():
    """The hourly-irradiance runner at M = 1,000 predicted over the whole year at once: one panel rule
    over 8,760 hours would form 1.7e8 values, so the guard refused (and then failed writing its advice).
    ``Kuf`` over the grid now goes in chunks and equals ``Kuf`` of each part on its own."""
    ivars = HiPPOInducingVariables(1000, "legs", t=8760.0, method="lyapunov")
    kernel = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel()).double()
    kernel.base_kernel.lengthscale = 3.17
    grid = torch.arange(0, 8760, 2, dtype=DT).unsqueeze(-1)
    whole = ivars.Kuf(kernel, grid)
    for part in (slice(0, 40), slice(2000, 2040), slice(4340, 4380)):
        torch.testing.assert_close(whole[:, part], ivars.Kuf(kernel, grid[part]), rtol=0, atol=1e-15)


def test_the_cost_guard_advice_works_for_the_lyapunov_view():
    ivars = HiPPOInducingVariables(1000, "legs", t=8760.0, method="lyapunov")
    view = _At(ivars, 8760.0, 0.0)
    with pytest.raises(CovarianceCostError, match=r"span \[0, 8760\].*length scales"):
        _Panels(view, 1e-3, torch.device("cpu"))
    assert view.input_support() == (0.0, 8760.0) and math.isclose(ivars.input_support()[1], 8760.0)
