"""GPyTorch's own ``VariationalTestCase`` (training, evaluation and fantasy-model tests, with batched
data, inducing points and models) run on ``InterdomainVariationalStrategy`` with point inducing
variables, whitened and unwhitened, as GPyTorch runs it on its ``VariationalStrategy`` and
``UnwhitenedVariationalStrategy``; and the fantasy model equal to GPyTorch's."""

import unittest

import gpytorch
import pytest
import torch
from gpytorch.test.variational_test_case import VariationalTestCase

from gpytorch_hippo import HiPPOInducingVariables, InducingPoints, InterdomainVariationalStrategy


class _Whitened(InterdomainVariationalStrategy):
    """GPyTorch's strategy signature ``(model, inducing_points, variational_distribution, learn_inducing_locations)``."""

    whitened_flag = True

    def __init__(self, model, inducing_points, variational_distribution, learn_inducing_locations=True):
        super().__init__(
            model, InducingPoints(inducing_points, learn=learn_inducing_locations), variational_distribution, whitened=self.whitened_flag
        )


class _Unwhitened(_Whitened):
    whitened_flag = False


class TestWhitenedPoints(VariationalTestCase, unittest.TestCase):
    """GPyTorch's test case with the Cholesky counts its own ``VariationalStrategy`` tests assert: one
    factorisation of ``K_uu`` per training pass and one to fill the eval cache, plus two per pass for the
    natural-parameter distribution (GPyTorch: 2 and 1, or 6 and 3). ``UnwhitenedVariationalStrategy``'s
    tests allow one more in training for the Cholesky distribution (3, its initialisation); ours needs none."""

    @property
    def batch_shape(self):
        return torch.Size([])

    @property
    def distribution_cls(self):
        return gpytorch.variational.CholeskyVariationalDistribution

    @property
    def mll_cls(self):
        return gpytorch.mlls.VariationalELBO

    @property
    def strategy_cls(self):
        return _Whitened

    @property
    def _natural(self):
        return self.distribution_cls is gpytorch.variational.NaturalVariationalDistribution

    def test_training_iteration(self, *args, **kwargs):
        cg_mock, cholesky_mock, ciq_mock = super().test_training_iteration(*args, **kwargs)
        self.assertFalse(cg_mock.called)
        self.assertFalse(ciq_mock.called)
        self.assertEqual(cholesky_mock.call_count, 6 if self._natural else 2)  # two passes

    def test_eval_iteration(self, *args, **kwargs):
        cg_mock, cholesky_mock, ciq_mock = super().test_eval_iteration(*args, **kwargs)
        self.assertFalse(cg_mock.called)
        self.assertFalse(ciq_mock.called)
        self.assertEqual(cholesky_mock.call_count, 3 if self._natural else 1)

    def test_fantasy_call(self, *args, **kwargs):
        # as GPyTorch: fantasy models need the Cholesky distribution's parameters, others refuse
        if self.distribution_cls is gpytorch.variational.CholeskyVariationalDistribution:
            return super().test_fantasy_call(*args, **kwargs)
        with self.assertRaises((AttributeError, NotImplementedError)):
            super().test_fantasy_call(*args, **kwargs)


# The unwhitened strategy factorises K_uu of the test case's random inducing points, which needs linear_operator's
# jitter with the Cholesky distribution: 12 NumericalWarnings, as GPyTorch's own UnwhitenedVariationalStrategy
# gives in this test case (0 with its other distributions, and whitened, as ours)
UNWHITENED_JITTER = pytest.mark.filterwarnings("ignore:A not p.d., added jitter:gpytorch.utils.warnings.NumericalWarning")


@UNWHITENED_JITTER
class TestUnwhitenedPoints(TestWhitenedPoints):
    @property
    def strategy_cls(self):
        return _Unwhitened


def _variant(base, distribution=None, mll=None):
    """A subclass of ``base`` with another variational distribution and/or objective (as GPyTorch's variants)."""
    attributes = {}
    if distribution is not None:
        attributes["distribution_cls"] = property(lambda self: distribution)
    if mll is not None:
        attributes["mll_cls"] = property(lambda self: mll)
    name = base.__name__ + (distribution.__name__ if distribution else "") + (mll.__name__ if mll else "")
    return type(name, (base,), attributes)


for _base in (TestWhitenedPoints, TestUnwhitenedPoints):
    for _distribution in (
        gpytorch.variational.MeanFieldVariationalDistribution,
        gpytorch.variational.DeltaVariationalDistribution,
        gpytorch.variational.NaturalVariationalDistribution,
    ):
        _class = _variant(_base, distribution=_distribution)
        globals()[_class.__name__] = _class
    for _mll in (gpytorch.mlls.PredictiveLogLikelihood, gpytorch.mlls.GammaRobustVariationalELBO):
        _class = _variant(_base, mll=_mll)
        globals()[_class.__name__] = _class
del _base, _distribution, _mll, _class


@pytest.mark.parametrize("whitened", [True, pytest.param(False, marks=UNWHITENED_JITTER)])
def test_fantasy_model_equals_gpytorchs(whitened):
    torch.manual_seed(0)
    Z, X = torch.rand(10, 1, dtype=torch.float64), torch.rand(6, 1, dtype=torch.float64)
    reference_cls = gpytorch.variational.VariationalStrategy if whitened else gpytorch.variational.UnwhitenedVariationalStrategy

    class SVGP(gpytorch.models.ApproximateGP):
        def __init__(self, ours):
            q = gpytorch.variational.CholeskyVariationalDistribution(10)
            strategy = (
                InterdomainVariationalStrategy(self, InducingPoints(Z, learn=False), q, whitened=whitened)
                if ours
                else reference_cls(self, Z, q, learn_inducing_locations=False)
            )
            super().__init__(strategy)
            self.mean_module, self.covar_module = gpytorch.means.ConstantMean(), gpytorch.kernels.RBFKernel()
            self.likelihood = gpytorch.likelihoods.GaussianLikelihood()

        def forward(self, x):
            return gpytorch.distributions.MultivariateNormal(self.mean_module(x), self.covar_module(x))

    models = [SVGP(ours).double() for ours in (True, False)]
    q = models[1].variational_strategy._variational_distribution
    q.chol_variational_covar.data = 0.3 * torch.eye(10, dtype=torch.float64) + 0.05 * torch.rand(10, 10, dtype=torch.float64).tril()
    q.variational_mean.data = torch.randn(10, dtype=torch.float64)
    models[0].variational_strategy._variational_distribution.load_state_dict(q.state_dict())
    for model in models:
        model.variational_strategy.variational_params_initialized.fill_(1)
        model.eval()
    test = torch.linspace(0, 1, 7, dtype=torch.float64).unsqueeze(-1)
    fantasies = [model.get_fantasy_model(X, torch.sin(6 * X[:, 0])) for model in models]
    with torch.no_grad():
        ours, reference = (fantasy(test) for fantasy in fantasies)
    torch.testing.assert_close(ours.mean, reference.mean, rtol=0, atol=1e-10)
    torch.testing.assert_close(ours.covariance_matrix, reference.covariance_matrix, rtol=0, atol=1e-10)


def test_hippo_variables_name_the_online_models_instead():
    class SVGP(gpytorch.models.ApproximateGP):
        def __init__(self):
            q = gpytorch.variational.CholeskyVariationalDistribution(6)
            super().__init__(InterdomainVariationalStrategy(self, HiPPOInducingVariables(6, "legs", t=1.0), q))
            self.mean_module, self.covar_module = gpytorch.means.ZeroMean(), gpytorch.kernels.RBFKernel()
            self.likelihood = gpytorch.likelihoods.GaussianLikelihood()

        def forward(self, x):
            return gpytorch.distributions.MultivariateNormal(self.mean_module(x), self.covar_module(x))

    with pytest.raises(NotImplementedError, match="OnlineSGPR"):
        SVGP().get_fantasy_model(torch.rand(3, 1), torch.rand(3))


@pytest.mark.parametrize("whitened", [True, False])
def test_a_gpytorch_checkpoint_loads_into_the_interdomain_strategy(whitened):
    """A trained GPyTorch SVGP's ``state_dict`` loads into the same model built on
    ``InterdomainVariationalStrategy(InducingPoints)`` and predicts the same."""
    torch.manual_seed(1)
    Z = torch.rand(8, 1, dtype=torch.float64)
    reference_cls = gpytorch.variational.VariationalStrategy if whitened else gpytorch.variational.UnwhitenedVariationalStrategy

    class SVGP(gpytorch.models.ApproximateGP):
        def __init__(self, ours):
            q = gpytorch.variational.CholeskyVariationalDistribution(8)
            strategy = (
                InterdomainVariationalStrategy(self, InducingPoints(torch.zeros(8, 1)), q, whitened=whitened)
                if ours
                else reference_cls(self, Z, q, learn_inducing_locations=True)
            )
            super().__init__(strategy)
            self.mean_module, self.covar_module = gpytorch.means.ConstantMean(), gpytorch.kernels.RBFKernel()

        def forward(self, x):
            return gpytorch.distributions.MultivariateNormal(self.mean_module(x), self.covar_module(x))

    reference, ours = SVGP(False).double(), SVGP(True).double()
    likelihood = gpytorch.likelihoods.GaussianLikelihood().double()
    X = torch.rand(30, 1, dtype=torch.float64)
    y = torch.sin(6 * X[:, 0])
    optimizer = torch.optim.Adam([*reference.parameters(), *likelihood.parameters()], lr=0.05)
    elbo = gpytorch.mlls.VariationalELBO(likelihood, reference, num_data=30)
    for _ in range(20):
        optimizer.zero_grad()
        (-elbo(reference(X), y)).backward()
        optimizer.step()
    ours.load_state_dict(reference.state_dict())
    reference.eval(), ours.eval()
    test = torch.linspace(0, 1, 9, dtype=torch.float64).unsqueeze(-1)
    with torch.no_grad():
        torch.testing.assert_close(ours(test).mean, reference(test).mean, rtol=0, atol=1e-10)
        torch.testing.assert_close(ours(test).variance, reference(test).variance, rtol=0, atol=1e-10)
