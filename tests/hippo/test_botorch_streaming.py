"""``OnlineGPStream``: BoTorch's rebuild-every-iteration loop, unchanged but for the class, streams; what does not
extend the previous call's data builds a new model."""

import gpytorch
import pytest
import torch
from botorch.fit import fit_gpytorch_mll
from botorch.generation import MaxPosteriorSampling
from gpytorch.constraints import Interval
from gpytorch.mlls import ExactMarginalLogLikelihood
from test_botorch_models import DOUBLE, data, objective

from gpytorch_hippo.botorch import OnlineGPModel, OnlineGPStream

pytestmark = pytest.mark.filterwarnings("ignore::gpytorch_hippo.botorch.InducingApproximationWarning")
OPTIONS = {"num_inducing": 12, "refit_every": 2, "fit_maxiter": 10}


def tutorial_modules():
    """TuRBO's tutorial builds these anew in every iteration."""
    kernel = gpytorch.kernels.ScaleKernel(
        gpytorch.kernels.MaternKernel(nu=2.5, ard_num_dims=2, lengthscale_constraint=Interval(0.005, 4.0))
    )
    return {"covar_module": kernel, "likelihood": gpytorch.likelihoods.GaussianLikelihood(noise_constraint=Interval(1e-8, 1e-3))}


def test_the_tutorial_loop_with_the_stream_as_its_class_is_the_hand_written_stream():
    """BoTorch's loop (rebuild on all data with fresh modules, fit_gpytorch_mll, Thompson sampling) with
    Model = OnlineGPStream(...) selects the same points, bit for bit, as building OnlineGPModel once and calling
    observe(new batch) by hand: each rebuild is one streaming step and the fit keeps the schedule's hyperparameters
    (a rebuilt OnlineGPModel refits all kept points every iteration)."""
    Model = OnlineGPStream(**OPTIONS)
    x0, y0 = data(10, 3)
    runs = {}
    for kind in ("stream class", "by hand"):
        torch.manual_seed(0)
        X, Y, model = x0, y0, None
        for _ in range(5):
            if kind == "stream class":
                model = Model(X, Y, **tutorial_modules())
                before = model.covar_module.base_kernel.lengthscale.detach().clone()
                fit_gpytorch_mll(ExactMarginalLogLikelihood(model.likelihood, model))
                assert torch.equal(model.covar_module.base_kernel.lengthscale, before)
            else:
                model = OnlineGPModel(X, Y, **OPTIONS, **tutorial_modules()) if model is None else model.observe(X[-3:], Y[-3:])
            candidates = torch.rand(64, 2, dtype=DOUBLE, generator=torch.Generator().manual_seed(X.shape[0]))
            with torch.no_grad():
                X_new = MaxPosteriorSampling(model=model, replacement=False)(candidates, num_samples=3)
            X, Y = torch.cat([X, X_new]), torch.cat([Y, objective(X_new)])
        runs[kind] = (X, model.covar_module.base_kernel.lengthscale.detach(), int(model.num_updates))
    assert torch.equal(runs["stream class"][0], runs["by hand"][0])
    assert torch.equal(runs["stream class"][1], runs["by hand"][1])
    assert runs["stream class"][2] == runs["by hand"][2] == 5  # the first batch and four streaming steps


def test_data_that_do_not_extend_the_previous_call_build_a_new_model_and_the_same_data_return_the_same_model():
    """A restart (fewer rows), an earlier row changed, other modules or other known noise: a new model from the data,
    equal to OnlineGPModel's on them; the same rows again: the same model, nothing absorbed twice."""
    x, y = data(30, 5)
    Model = OnlineGPStream(**OPTIONS)
    first = Model(x[:20], y[:20])
    assert Model(x[:20], y[:20]) is first
    streamed = Model(x, y)
    assert int(streamed.num_updates) == 2
    changed = y.clone()
    changed[3] += 1.0
    cases = {
        "fewer rows": (x[:15], y[:15], dict),
        "a changed row": (x, changed, dict),
        "another kernel": (x, y, lambda: {"covar_module": gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel(ard_num_dims=2))}),
    }
    for name, (X, Y, kwargs) in cases.items():
        Model(x[:20], y[:20])  # back to a model of the first 20 rows
        model = Model(X, Y, **kwargs())
        assert int(model.num_updates) == 1, name
        fresh = OnlineGPModel(X, Y, **OPTIONS, **kwargs())
        test = torch.rand(5, 2, dtype=DOUBLE)
        torch.testing.assert_close(model.posterior(test).mean, fresh.posterior(test).mean, rtol=0, atol=0, msg=name)


def test_known_noise_streams_with_the_new_rows_variances():
    """With train_Yvar the new rows' variances stream with them (equal to observe(X, Y, Yvar) by hand); a call without
    them after calls with them builds anew."""
    x, y = data(24, 8)
    yvar = torch.full_like(y, 1e-3)
    yvar[20:] = 4e-3
    Model = OnlineGPStream(**OPTIONS)
    Model(x[:16], y[:16], yvar[:16])
    streamed = Model(x, y, yvar)
    by_hand = OnlineGPModel(x[:16], y[:16], yvar[:16], **OPTIONS).observe(x[16:], y[16:], yvar[16:])
    test = torch.rand(5, 2, dtype=DOUBLE)
    torch.testing.assert_close(streamed.posterior(test).variance, by_hand.posterior(test).variance, rtol=0, atol=0)
    assert int(Model(x, y).num_updates) == 1


def test_a_setting_of_the_stream_passed_to_a_call_names_where_it_belongs():
    """num_inducing given to each call (as to OnlineGPModel) would clash with the stream's own: the error says to pass it
    to OnlineGPStream(...) and nothing is built."""
    x, y = data(12, 9)
    Model = OnlineGPStream(**OPTIONS)
    with pytest.raises(TypeError, match=r"num_inducing.*OnlineGPStream\(\.\.\.\)"):
        Model(x, y, num_inducing=64)
    assert Model.model is None
