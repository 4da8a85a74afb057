"""Saved state, copies and dtype moves of OnlineSGPR / OnlineELBO (with point and HiPPO inducing
variables), and the advance protocol: q(u) carried forward (vs the Gaussian conditional written
out densely) and refused before end_task. References: the original object's own outputs (a
round trip must reproduce them exactly) and dense conditionals."""

import copy

import gpytorch
import pytest
import torch

from gpytorch_hippo import HiPPOInducingVariables, InducingPoints, InterdomainVariationalStrategy, OnlineELBO, OnlineSGPR, TimeAxis

DT = torch.float64
M = 6


def task_data(seed=0, start=0.0, end=2.0, n=30):
    g = torch.Generator().manual_seed(seed)
    x = torch.sort(start + (end - start) * torch.rand(n, generator=g, dtype=DT)).values
    return x.unsqueeze(-1), torch.sin(3 * x) + 0.1 * torch.randn(n, generator=g, dtype=DT)


def make_kernel():
    kernel = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel()).to(DT)
    kernel.base_kernel.lengthscale, kernel.outputscale = 0.6, 1.2
    return kernel


def make_inducing(kind, t=2.0, jitter=None):
    if kind == "points":
        return InducingPoints(torch.linspace(0, t, M, dtype=DT), learn=False, jitter=jitter)
    return HiPPOInducingVariables(M, "legs", t=t, method="quadrature", jitter=jitter)


class SVGP(gpytorch.models.ApproximateGP):
    def __init__(self, inducing_variables):
        q = gpytorch.variational.CholeskyVariationalDistribution(inducing_variables.num_inducing)
        super().__init__(InterdomainVariationalStrategy(self, inducing_variables, q))
        self.mean_module = gpytorch.means.ConstantMean()
        self.covar_module = make_kernel()

    def forward(self, x):
        return gpytorch.distributions.MultivariateNormal(self.mean_module(x), self.covar_module(x))


def random_q(model, seed):
    g = torch.Generator().manual_seed(seed)
    q = model.variational_strategy._variational_distribution
    q.variational_mean.data.copy_(torch.randn(M, generator=g, dtype=DT))
    q.chol_variational_covar.data.copy_(0.2 * torch.randn(M, M, generator=g, dtype=DT).tril() + 0.5 * torch.eye(M, dtype=DT))
    model.variational_strategy.variational_params_initialized.fill_(1)


def two_task_elbo(kind, jitter=None):
    """An OnlineELBO after task 1 (random q, end_task), moved to task 2, with changed hyperparameters."""
    model = SVGP(make_inducing(kind, jitter=jitter)).to(DT)
    elbo = OnlineELBO(gpytorch.likelihoods.GaussianLikelihood().to(DT), model, num_data=30)
    random_q(model, 1)
    elbo.end_task()
    if kind == "points":
        model.variational_strategy.inducing_variables = InducingPoints(torch.linspace(1, 4, M, dtype=DT), learn=False, jitter=jitter)
    else:
        model.variational_strategy.advance(4.0)
    random_q(model, 2)
    model.covar_module.base_kernel.lengthscale = 0.8
    return model, elbo


@pytest.mark.parametrize("kind", ["points", "hippo"])
def test_online_elbo_state_dict_deepcopy_and_dtype_round_trip(kind):
    model, elbo = two_task_elbo(kind, jitter=1e-4)  # float32's jitter in both dtypes, compared below
    x, y = task_data(3, 2.0, 4.0)
    value = elbo(model(x), y)
    old_term = elbo.online_kl_divergence() - model.variational_strategy.kl_divergence()
    assert abs(old_term.item()) > 1e-2  # the old task matters, so a silent plain-ELBO fallback would show

    fresh_model = SVGP(make_inducing(kind, t=1.0, jitter=1e-4)).to(DT)
    fresh = OnlineELBO(gpytorch.likelihoods.GaussianLikelihood().to(DT), fresh_model, num_data=30)
    fresh.load_state_dict(elbo.state_dict())
    clone = copy.deepcopy(elbo)
    for other in (fresh, clone):
        assert other.has_old_task and other.model is not model
        assert torch.equal(other(other.model(x), y), value)
    clone.old_mean.add_(1.0)
    assert torch.equal(elbo(model(x), y), value)
    assert "old_inducing_variables" in dict(elbo.named_modules())

    elbo.to(torch.float32)
    assert elbo.old_mean.dtype == torch.float32
    assert all(p.dtype == torch.float32 for p in elbo.old_inducing_variables.parameters())
    if kind == "points":  # (HiPPO bases keep their stream state in float64 by design)
        assert elbo.old_inducing_variables.points.dtype == torch.float32
    value32 = elbo(model(x.float()), y.float())
    # same jitter: only float32 round-off of Cholesky factors with condition number <~ 1e4 remains
    assert abs(value32.item() - value.item()) < 1e-3 * max(1.0, abs(value.item()))


@pytest.mark.parametrize("dropped", ["old_mean", "old_covar_chol", "old_prior_chol", "old_prior_mean"])
def test_an_old_task_loaded_in_part_raises_instead_of_reading_as_no_old_task(dropped):
    """A checkpoint without one of the old task's tensors, loaded with ``strict=False``, would otherwise turn the online
    ELBO into the plain ELBO without a word or fail on ``None`` (a fresh ELBO has no old-task buffers for torch to
    report as missing)."""
    model, elbo = two_task_elbo("points")
    state = {key: value for key, value in elbo.state_dict().items() if key != dropped}
    fresh_model = SVGP(make_inducing("points")).to(DT)
    fresh = OnlineELBO(gpytorch.likelihoods.GaussianLikelihood().to(DT), fresh_model, num_data=30)
    assert fresh.load_state_dict(state, strict=False).missing_keys == []
    for read in (lambda: fresh.has_old_task, fresh.online_kl_divergence):
        with pytest.raises(RuntimeError, match="only a part of the old task"):
            read()


@pytest.mark.parametrize("dropped", ["posterior_chol", "posterior_shift"])
def test_a_stored_task_loaded_in_part_raises_instead_of_predicting_the_prior(dropped):
    """Without ``posterior_chol`` the model read as one without a task (predicting the prior); without another summary
    tensor it failed on ``None``. Torch reports neither missing on a fresh model, whose buffers are still ``None``."""
    x, y = task_data(4, 0.0, 4.0, 30)
    model = OnlineSGPR(
        InducingPoints(torch.linspace(0, 4, 8, dtype=DT), learn=False), make_kernel(), gpytorch.likelihoods.GaussianLikelihood().to(DT)
    )
    model.update(x, y)
    fresh = OnlineSGPR(
        InducingPoints(torch.zeros(8, dtype=DT), learn=False), make_kernel(), gpytorch.likelihoods.GaussianLikelihood().to(DT)
    )
    state = {key: value for key, value in model.state_dict().items() if key != dropped}
    assert fresh.load_state_dict(state, strict=False).missing_keys == []
    with pytest.raises(RuntimeError, match="only a part of the stored task"):
        fresh(x)


def test_online_sgpr_state_round_trip_with_a_changed_number_of_points():
    x, y = task_data(4, 0.0, 4.0, 60)
    model = OnlineSGPR(
        InducingPoints(torch.linspace(0, 2, 8, dtype=DT), learn=False), make_kernel(), gpytorch.likelihoods.GaussianLikelihood().to(DT)
    )
    model.update(x[:30], y[:30])
    model.inducing_variables = InducingPoints(torch.linspace(0, 4, 5, dtype=DT), learn=False)  # M: 8 -> 5
    model.update(x[30:], y[30:])
    grid = torch.linspace(0, 4, 17, dtype=DT)
    with torch.no_grad():
        reference = model(grid)
    fresh = OnlineSGPR(
        InducingPoints(torch.zeros(5, dtype=DT), learn=False), make_kernel(), gpytorch.likelihoods.GaussianLikelihood().to(DT)
    )
    fresh.load_state_dict(model.state_dict())
    clone = copy.deepcopy(model)
    with torch.no_grad():
        for other in (fresh, clone):
            prediction = other(grid)
            assert torch.equal(prediction.mean, reference.mean)
            assert torch.equal(prediction.covariance_matrix, reference.covariance_matrix)
        single = model.to(torch.float32)(grid.float())
    assert model.posterior_inducing_variables.points.dtype == torch.float32 and model.last_bound.dtype == torch.float32
    assert (single.mean.double() - reference.mean).abs().max() < 1e-3


def test_advance_is_refused_on_owned_variables_and_before_end_task():
    model = SVGP(make_inducing("hippo")).to(DT)
    random_q(model, 5)
    strategy = model.variational_strategy
    with pytest.raises(RuntimeError, match=r"variational_strategy.advance\(t_new\)"):
        strategy.inducing_variables.advance(3.0)
    strategy.advance(3.0)  # no online objective attached: a plain SVGP may move at any time
    elbo = OnlineELBO(gpytorch.likelihoods.GaussianLikelihood().to(DT), model, num_data=10)
    with pytest.raises(RuntimeError, match=r"end_task\(\) before advance"):
        strategy.advance(4.0)
    assert strategy.inducing_variables.t == 3.0  # nothing moved
    elbo.end_task()
    saved = copy.deepcopy(elbo.state_dict())  # state_dict tensors alias the live ones
    strategy.advance(4.0)
    with pytest.raises(RuntimeError, match="end_task"):
        strategy.advance(5.0)
    # the protocol state travels with the saved state: a reloaded, ended task may advance
    fresh_model = SVGP(make_inducing("hippo")).to(DT)
    fresh = OnlineELBO(gpytorch.likelihoods.GaussianLikelihood().to(DT), fresh_model, num_data=10)
    fresh.load_state_dict(saved)
    fresh_model.variational_strategy.advance(4.0)
    with pytest.raises(TypeError, match="have no advance"):
        SVGP(make_inducing("points")).variational_strategy.advance(3.0)
    # frozen copies are owned by nobody: the stored old variables can still be moved (they never are)
    assert elbo.old_inducing_variables.variational_owner is None


@pytest.mark.parametrize("whitened", [True, False])
def test_advance_carries_q_forward_as_the_gaussian_conditional(whitened):
    """q(b) after advance = N(K_ba K_aa^{-1} m_a, K_bb - K_ba K_aa^{-1} (K_aa - S_a) K_aa^{-1} K_ab),
    written densely from the inducing variables' covariances."""
    ivs = make_inducing("hippo")
    q = gpytorch.variational.CholeskyVariationalDistribution(M)
    model = SVGP(ivs).to(DT)
    model.variational_strategy = InterdomainVariationalStrategy(model, ivs, q.to(DT), whitened=whitened)
    random_q(model, 6)
    strategy, kernel = model.variational_strategy, model.covar_module
    with torch.no_grad():
        q_a = strategy.inducing_posterior()
        m_a, S_a = q_a.mean.clone(), q_a.covariance_matrix.clone()  # (unwhitened: views of the parameters)
        old = copy.deepcopy(ivs)
        strategy.advance(3.5)
        Kaa, Kbb = old.Kuu(kernel).to_dense(), ivs.Kuu(kernel).to_dense()
        Kba = ivs.Kuu_cross(old, kernel)
        gain = Kba @ torch.linalg.inv(Kaa)
        mean = gain @ m_a
        covar = Kbb - gain @ (Kaa - S_a) @ gain.T
        q_b = strategy.inducing_posterior()
    assert ivs.t == 3.5
    assert (q_b.mean - mean).abs().max() < 1e-8
    assert (q_b.covariance_matrix - covar).abs().max() < 1e-8


def test_append_path_carries_q_forward_for_multidimensional_inputs():
    """The path route of §4.4: the same conditional as advance, with the RFF path covariances."""
    g = torch.Generator().manual_seed(9)
    ivs = HiPPOInducingVariables(M, "legs", input_dim=2, num_rff=200)
    model = SVGP(ivs).to(DT)
    strategy, kernel = model.variational_strategy, model.covar_module
    strategy.append_path(torch.randn(12, 2, generator=g, dtype=DT))  # first task: nothing to carry yet
    with pytest.raises(RuntimeError, match=r"variational_strategy.append_path"):
        ivs.append_path(torch.randn(5, 2, generator=g, dtype=DT))
    random_q(model, 10)
    with torch.no_grad():
        q_a = strategy.inducing_posterior()
        old = copy.deepcopy(ivs)
        strategy.append_path(torch.randn(10, 2, generator=g, dtype=DT))
        Kaa, Kbb = old.Kuu(kernel).to_dense(), ivs.Kuu(kernel).to_dense()
        gain = ivs.Kuu_cross(old, kernel) @ torch.linalg.inv(Kaa)
        q_b = strategy.inducing_posterior()
    assert (q_b.mean - gain @ q_a.mean).abs().max() < 1e-8
    assert (q_b.covariance_matrix - (Kbb - gain @ (Kaa - q_a.covariance_matrix) @ gain.T)).abs().max() < 1e-8


def test_a_changed_mean_is_rejected_for_hippo_variables():
    x, y = task_data(7)
    ohsgpr = OnlineSGPR(
        make_inducing("hippo"),
        make_kernel(),
        gpytorch.likelihoods.GaussianLikelihood().to(DT),
        mean_module=gpytorch.means.ConstantMean().to(DT),
    )
    ohsgpr.update(x, y)
    ohsgpr.inducing_variables.advance(4.0)
    x2, y2 = task_data(8, 2.0, 4.0)
    with pytest.raises(ValueError, match=r"requires_grad_\(False\)"):
        ohsgpr.update(x2, y2, num_iter=2)
    ohsgpr.mean_module.constant.data.fill_(0.5)
    with pytest.raises(RuntimeError, match="mean function changed"):
        ohsgpr.update(x2, y2)
    with pytest.raises(RuntimeError, match="mean function changed"):
        ohsgpr(x2)
    ohsgpr.mean_module.constant.data.fill_(0.0)
    ohsgpr.mean_module.requires_grad_(False)
    ohsgpr.update(x2, y2)  # an unchanged mean is fine

    model, elbo = two_task_elbo("hippo")
    model.mean_module.constant.data.fill_(0.5)
    with pytest.raises(RuntimeError, match="mean function changed"):
        elbo(model(x2), y2)


def _train_stream(kind, evaluate_between_tasks=False, interrupt=None, num_tasks=3, steps=6):
    """OHSVGP/OSVGP over ``num_tasks`` tasks with trainable hyperparameters, ``end_task`` right after the
    last optimiser step (the README's loop). ``interrupt=(task, step)``: save everything there (model,
    ELBO, optimiser), rebuild fresh objects from the saved state alone, and carry on with them."""
    torch.manual_seed(0)
    model = SVGP(make_inducing(kind)).to(DT)
    likelihood = gpytorch.likelihoods.GaussianLikelihood().to(DT)
    elbo = OnlineELBO(likelihood, model, num_data=30)

    def adam():
        if task > 0 and kind == "hippo":  # HiPPO variables project f - m: the mean stays fixed after task 1
            model.mean_module.requires_grad_(False)
        trained = [p for p in [*model.parameters(), *likelihood.parameters()] if p.requires_grad]
        return torch.optim.Adam(trained, lr=0.05)

    task = 0
    optimizer = adam()
    for task in range(num_tasks):
        x, y = task_data(seed=task, start=2.0 * task, end=2.0 * (task + 1))
        if task > 0:
            if kind == "points":
                model.variational_strategy.replace_inducing_variables(make_inducing(kind, t=2.0 * (task + 1)))
            else:
                model.variational_strategy.advance(2.0 * (task + 1))
            optimizer = adam()
        for step in range(steps):
            if interrupt == (task, step):
                saved = copy.deepcopy((model.state_dict(), likelihood.state_dict(), elbo.state_dict(), optimizer.state_dict()))
                model = SVGP(make_inducing(kind, t=2.0 * (task + 1))).to(DT)
                likelihood = gpytorch.likelihoods.GaussianLikelihood().to(DT)
                model.load_state_dict(saved[0])
                likelihood.load_state_dict(saved[1])
                elbo = OnlineELBO(likelihood, model, num_data=30)
                elbo.load_state_dict(saved[2])
                optimizer = adam()
                optimizer.load_state_dict(saved[3])
            model.train(), likelihood.train()
            optimizer.zero_grad()
            (-elbo(model(x), y)).backward()
            optimizer.step()
        if evaluate_between_tasks:
            model.eval()
            with torch.no_grad():
                model(x)
            model.train()
        elbo.end_task()
    model.eval()
    with torch.no_grad():
        return model(torch.linspace(0, 2.0 * num_tasks, 25, dtype=DT).unsqueeze(-1)).mean


@pytest.mark.parametrize("kind", ["points", "hippo"])
def test_end_task_after_the_last_optimiser_step_stores_the_current_posterior(kind):
    """``end_task`` reads q(u) with the hyperparameters of the last step, not the Cholesky factor cached
    by the forward before it: evaluating between tasks or not gives the same predictions."""
    plain = _train_stream(kind)
    evaluated = _train_stream(kind, evaluate_between_tasks=True)
    assert (plain - evaluated).abs().max() < 1e-12


@pytest.mark.parametrize("kind", ["points", "hippo"])
@pytest.mark.parametrize("interrupt", [(1, 3), (2, 0)])
def test_online_elbo_resumes_mid_task_and_after_end_task(kind, interrupt):
    """Saving mid-task (or right after ``end_task`` and the move) and resuming from the saved state in
    fresh objects continues exactly as the uninterrupted run."""
    assert (_train_stream(kind, interrupt=interrupt) - _train_stream(kind)).abs().max() < 1e-12


@pytest.mark.parametrize("method", ["lyapunov", "spectral"])
def test_online_sgpr_resumes_a_stream_from_saved_state(method):
    """Save after task 2 of 4, load into a freshly built OnlineSGPR (the backend's carried state and
    settings come from the saved state), continue: the same predictions as the uninterrupted stream;
    loading into a model built with another backend raises."""
    tasks = [task_data(seed=k, start=2.0 * k, end=2.0 * (k + 1)) for k in range(4)]

    def build():
        return OnlineSGPR(
            HiPPOInducingVariables(M, "legs", t=2.0, method=method),
            make_kernel(),
            gpytorch.likelihoods.GaussianLikelihood().to(DT),
            captured_variance_warning=None,
        )

    def learn(model, first, last):
        for k in range(first, last):
            if k > 0:
                model.inducing_variables.advance(2.0 * (k + 1))
            model.update(*tasks[k])

    whole = build()
    learn(whole, 0, 4)
    interrupted = build()
    learn(interrupted, 0, 2)
    saved = copy.deepcopy(interrupted.state_dict())
    resumed = build()
    resumed.inducing_variables.advance(4.0)  # a fresh model at the same point of the stream
    resumed.load_state_dict(saved)
    learn(resumed, 2, 4)
    x = torch.linspace(0, 8, 30, dtype=DT)
    with torch.no_grad():
        torch.testing.assert_close(resumed(x).mean, whole(x).mean, rtol=0, atol=1e-10)
        torch.testing.assert_close(resumed(x).variance, whole(x).variance, rtol=0, atol=1e-10)
    other = OnlineSGPR(
        HiPPOInducingVariables(M, "legs", t=4.0, method="quadrature"), make_kernel(), gpytorch.likelihoods.GaussianLikelihood().to(DT)
    )
    with pytest.raises(ValueError, match="method"):
        other.load_state_dict(saved)


def test_a_stream_on_calendar_time_resumes_with_its_saved_time_axis():
    """A stream on hourly timestamps, saved after task 2 of 4 and resumed into a model built with the default
    TimeAxis('h'): advance(model.time_axis(ts)) works right after the load and the stream continues as the
    uninterrupted one; a model without an axis takes the saved one; a model whose axis has another origin or
    unit refuses the checkpoint, unchanged (it used to take the checkpoint and predict shifted)."""
    pd = pytest.importorskip("pandas")
    start = pd.Timestamp("2013-01-01 06:00")
    tasks = []
    for k in range(4):
        x, y = task_data(seed=k, start=2.0 * k, end=2.0 * (k + 1))
        times = start + pd.to_timedelta(x.squeeze(-1).numpy(), unit="h")
        tasks.append((times, pd.Series(y.numpy(), index=times)))

    def build(axis):
        return OnlineSGPR(
            HiPPOInducingVariables(M, "legs", t=2.0, method="lyapunov"),
            make_kernel(),
            gpytorch.likelihoods.GaussianLikelihood().to(DT),
            captured_variance_warning=None,
            time_axis=axis,
        )

    def learn(model, first, last):
        for k in range(first, last):
            if k > 0:
                model.inducing_variables.advance(model.time_axis(start + pd.Timedelta(hours=2.0 * (k + 1))))
            model.update(*tasks[k])

    whole, interrupted = build(TimeAxis("h")), build(TimeAxis("h"))  # origin: the first time seen
    learn(whole, 0, 4)
    learn(interrupted, 0, 2)
    saved = copy.deepcopy(interrupted.state_dict())
    test = start + pd.to_timedelta(torch.linspace(0, 8, 30, dtype=DT).numpy(), unit="h")
    for axis in (TimeAxis("h"), None):
        resumed = build(axis)
        resumed.load_state_dict(saved)
        assert resumed.time_axis.origin == whole.time_axis.origin == tasks[0][0].min()
        learn(resumed, 2, 4)
        with torch.no_grad():
            torch.testing.assert_close(resumed(test).mean, whole(test).mean, rtol=0, atol=1e-10)
            torch.testing.assert_close(resumed(test).variance, whole(test).variance, rtol=0, atol=1e-10)
    for axis in (TimeAxis("h", origin=start), TimeAxis("m")):
        other = build(axis)
        with pytest.raises(ValueError, match="saved time axis"):
            other.load_state_dict(saved)
        assert not other.has_posterior and other.time_axis.origin == axis.origin
