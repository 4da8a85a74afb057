"""InterdomainVariationalStrategy inside GPyTorch's own wrappers (IndependentMultitaskVariationalStrategy,
LMCVariationalStrategy) and its train-mode covariance, against GPyTorch's VariationalStrategy with the
same parameters (point inducing variables) and against the mixing written out densely here (HiPPO)."""

import gpytorch
import pytest
import torch
from gpytorch.variational import IndependentMultitaskVariationalStrategy, LMCVariationalStrategy

from gpytorch_hippo import HiPPOInducingVariables, InducingPoints, InterdomainVariationalStrategy

DT = torch.float64
M, N, L, T = 6, 20, 2, 3  # inducing variables, inputs, latent functions, tasks


def inputs(seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.sort(torch.rand(N, 1, generator=g, dtype=DT) * 2, dim=0).values


class Latents(gpytorch.models.ApproximateGP):
    """``L`` latent GPs (batched kernel: one length scale each), wrapped by ``wrapper``."""

    def __init__(self, base_factory, wrapper):
        q = gpytorch.variational.CholeskyVariationalDistribution(M, batch_shape=torch.Size([L]))
        super().__init__(wrapper(base_factory(self, q)))
        self.mean_module = gpytorch.means.ConstantMean(batch_shape=torch.Size([L]))
        self.covar_module = gpytorch.kernels.ScaleKernel(
            gpytorch.kernels.RBFKernel(batch_shape=torch.Size([L])), batch_shape=torch.Size([L])
        )
        self.mean_module.constant.data.copy_(torch.tensor([0.3, -0.2]))
        self.covar_module.base_kernel.lengthscale = torch.tensor([[[0.5]], [[0.9]]])
        self.covar_module.outputscale = torch.tensor([1.3, 0.7])

    def forward(self, x):
        return gpytorch.distributions.MultivariateNormal(self.mean_module(x), self.covar_module(x))


def points():
    return torch.linspace(0, 2, M, dtype=DT).unsqueeze(-1).expand(L, M, 1)


def ours_points(model, q):
    return InterdomainVariationalStrategy(model, InducingPoints(points()), q)


def gpytorch_points(model, q):
    return gpytorch.variational.VariationalStrategy(model, points(), q)


def ours_hippo(model, q):
    return InterdomainVariationalStrategy(model, HiPPOInducingVariables(M, "legs", t=2.0, method="quadrature"), q)


def lmc(base):
    return LMCVariationalStrategy(base, num_tasks=T, num_latents=L, latent_dim=-1)


def independent(base):
    return IndependentMultitaskVariationalStrategy(base, num_tasks=L)


def set_parameters(model, seed=1):
    """The same non-prior q(u) (and LMC coefficients) in any model."""
    g = torch.Generator().manual_seed(seed)
    strategy = model.variational_strategy
    base = strategy.base_variational_strategy
    q = base._variational_distribution
    q.variational_mean.data.copy_(torch.randn(L, M, generator=g, dtype=DT))
    q.chol_variational_covar.data.copy_(0.3 * torch.randn(L, M, M, generator=g, dtype=DT).tril() + 0.6 * torch.eye(M, dtype=DT))
    base.variational_params_initialized.fill_(1)
    if isinstance(strategy, LMCVariationalStrategy):
        strategy.lmc_coefficients.data.copy_(torch.randn(L, T, generator=g, dtype=DT))
    return model


@pytest.mark.parametrize("wrapper", [lmc, independent])
def test_wrappers_with_points_equal_gpytorch(wrapper):
    x = inputs()
    num_outputs = T if wrapper is lmc else L
    Y = torch.randn(N, num_outputs, generator=torch.Generator().manual_seed(2), dtype=DT)
    ours = set_parameters(Latents(ours_points, wrapper).to(DT))
    reference = set_parameters(Latents(gpytorch_points, wrapper).to(DT))
    likelihood = gpytorch.likelihoods.MultitaskGaussianLikelihood(num_tasks=num_outputs).to(DT)
    for mode in ("train", "eval"):
        outputs = []
        for model in (ours, reference):
            getattr(model, mode)()
            outputs.append(model(x))
        assert (outputs[0].mean - outputs[1].mean).abs().max() < 1e-10, mode
        assert (outputs[0].covariance_matrix - outputs[1].covariance_matrix).abs().max() < 1e-10, mode
    ours.train(), reference.train()
    elbos = [gpytorch.mlls.VariationalELBO(likelihood, m, num_data=N)(m(x), Y) for m in (ours, reference)]
    assert abs(elbos[0].item() - elbos[1].item()) < 1e-10
    if wrapper is lmc:  # the one-task-per-input path
        tasks = torch.arange(N) % T
        a, b = (m(x, task_indices=tasks) for m in (ours, reference))
        assert (a.covariance_matrix - b.covariance_matrix).abs().max() < 1e-10


@pytest.mark.parametrize("wrapper", [lmc, independent])
def test_wrappers_with_hippo_mix_the_latent_posteriors(wrapper):
    """Multitask output = the latents' q(f_l) (each checked against GPyTorch elsewhere) mixed by
    hand: cov((n, t), (n', t')) = sum_l a_lt a_lt' Σ_l[n, n'] (+ LMC's jitter on the diagonal)."""
    x = inputs(3)
    model = set_parameters(Latents(ours_hippo, wrapper).to(DT)).eval()
    with torch.no_grad():
        output = model(x)
        latent = model.variational_strategy.base_variational_strategy(x)  # batch L
    mean_l, covar_l = latent.mean, latent.covariance_matrix  # (L, N), (L, N, N)
    if wrapper is lmc:
        A = model.variational_strategy.lmc_coefficients.detach()  # (L, T)
        jitter = model.variational_strategy.jitter_val
    else:
        A, jitter = torch.eye(L, dtype=DT), 0.0
    mean = torch.einsum("ln,lt->nt", mean_l, A)
    covar = torch.einsum("lab,ls,lt->asbt", covar_l, A, A).reshape(N * A.shape[-1], N * A.shape[-1])
    covar = covar + jitter * torch.eye(covar.shape[0], dtype=DT)
    assert output.mean.shape == (N, A.shape[-1])
    assert (output.mean - mean).abs().max() < 1e-12
    assert (output.covariance_matrix - covar).abs().max() < 1e-12
    # the latent posteriors do depend on the batched kernel: latent 0 and 1 differ
    assert (covar_l[0] - covar_l[1]).abs().max() > 1e-2


def test_lmc_reads_the_jitter_dtype_from_the_strategy():
    """LMC picks its output jitter from ``inducing_points.dtype`` at construction: the points' dtype
    (as GPyTorch), or for HiPPO variables (no input locations) the variational distribution's."""
    reference = Latents(gpytorch_points, lmc).variational_strategy.jitter_val  # float64 points: 1e-6
    assert Latents(ours_points, lmc).variational_strategy.jitter_val == reference
    hippo = Latents(ours_hippo, lmc)  # float32 q(u) at construction
    assert hippo.variational_strategy.jitter_val == gpytorch.settings.variational_cholesky_jitter.value(torch.float32)
    assert hippo.variational_strategy.base_variational_strategy.inducing_points.shape == (L, M, 0)
    assert not any("inducing_points" in name for name, _ in hippo.named_parameters())


@pytest.mark.parametrize("whitened", [True, False])
def test_train_mode_returns_the_full_covariance(whitened):
    """GPyTorch computes the full q(f) in train mode when asked (diag=False; unwhitened: in eval);
    ours always returns it (lazily), with the same diagonal as GPyTorch's default call."""

    class Single(gpytorch.models.ApproximateGP):
        def __init__(self, ours):
            q = gpytorch.variational.CholeskyVariationalDistribution(M)
            Z = torch.linspace(0, 2, M, dtype=DT).unsqueeze(-1)
            if ours:
                strategy = InterdomainVariationalStrategy(self, InducingPoints(Z), q, whitened=whitened)
            elif whitened:
                strategy = gpytorch.variational.VariationalStrategy(self, Z, q)
            else:
                strategy = gpytorch.variational.UnwhitenedVariationalStrategy(self, Z, q)
            super().__init__(strategy)
            self.mean_module = gpytorch.means.ZeroMean()
            self.covar_module = gpytorch.kernels.RBFKernel()

        def forward(self, x):
            return gpytorch.distributions.MultivariateNormal(self.mean_module(x), self.covar_module(x))

    x = inputs(4)
    models = []
    for ours in (True, False):
        model = Single(ours).to(DT)
        g = torch.Generator().manual_seed(5)
        q = model.variational_strategy._variational_distribution
        q.variational_mean.data.copy_(torch.randn(M, generator=g, dtype=DT))
        q.chol_variational_covar.data.copy_(0.3 * torch.randn(M, M, generator=g, dtype=DT).tril() + 0.5 * torch.eye(M, dtype=DT))
        model.variational_strategy.variational_params_initialized.fill_(1)
        models.append(model.train())
    ours, reference = models
    full = ours(x).covariance_matrix
    if whitened:
        expected = reference.variational_strategy(x, diag=False).covariance_matrix
    else:
        expected = reference.eval()(x).covariance_matrix
        reference.train()
    assert (full - expected).abs().max() < 1e-10
    assert (full.diagonal() - reference(x).variance).abs().max() < 1e-10
    # off-diagonal posterior correlations are present (a diagonal output would fail here)
    assert (full - full.diagonal().diag()).abs().max() > 1e-2
