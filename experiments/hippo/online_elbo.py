"""Uncollapsed online learning (OnlineELBO, the online ELBO of Bui et al. (2017)) for counts and multidimensional inputs,
thesis §4.6 (Chen et al. (2025), OHSVGP): the COVID-style death counts (Negative Binomial) and continual UCI regression
(§4.6.2).

Used by :mod:`experiments.hippo.online` for the data sets whose likelihood is not
Gaussian or whose inputs are not times. Methods, all one ``ApproximateGP`` with
:class:`~gpytorch_hippo.variational.InterdomainVariationalStrategy` trained on
:class:`~gpytorch_hippo.online.OnlineELBO`:

* ``ohsvgp`` (time series): HiPPO-LegS variables advanced to each task's end;
* ``ohsvgp-k`` / ``ohsvgp-o`` (multidimensional): HiPPO variables along the path of the ordered
  inputs (thesis §4.4), ordered by kernel similarity (``kernel_max``) or by the oracle key the
  tasks were split by;
* ``osvgp``: inducing points drawn from old points ∪ new inputs, trained with ``q(u)``;
* ``ovc``: pivoted-Cholesky points, fixed.

Each task runs ``svgp_iters`` Adam steps. Series: task 1 also trains the kernel and likelihood,
which then stay fixed (started from a grid, :func:`first_task_start`, unless ``first_fit="given"``).
Multidimensional inputs (the thesis's set-up, §4.6.2, ``first_task_kernel="exact-gp"``): the ARD-RBF
kernel and the noise come from an exact GP fitted to task 1 (:func:`fit_exact_gp`) and stay fixed
from task 1 on, and the kernel-similarity order of task 1 uses that kernel; ``preprocessing="thesis"``
maps the inputs onto ``[-1, 1]`` and holds out a global 10 % test split (:func:`~gpytorch_hippo.data.split_tasks`).
The oracle order of OHSVGP-o is :func:`~gpytorch_hippo.data.split_order` (stable, ties broken by the next key).
Counts get NLPD (Gauss-Hermite log predictive density) and the thesis's interval ECE
(10 central intervals from 100 predictive samples).
"""

from __future__ import annotations

import math
import time
import warnings

import gpytorch
import torch

from gpytorch_hippo.baselines import PivotedCholeskySchedule, RandomPointsSchedule
from gpytorch_hippo.data import Dataset, minmax_inputs, split_order, split_tasks
from gpytorch_hippo.hyperparameters import grid_start
from gpytorch_hippo.inducing import HiPPOInducingVariables
from gpytorch_hippo.likelihoods import NegativeBinomialLikelihood
from gpytorch_hippo.metrics import gaussian_nlpd, interval_ece, nlpd_from_log_density, rmse
from gpytorch_hippo.online import OnlineELBO
from gpytorch_hippo.ordering import order_inputs
from gpytorch_hippo.variational import InterdomainVariationalStrategy

#: The variational (OHSVGP-family) methods of the runner.
ELBO_METHODS = ("ohsvgp", "ohsvgp-k", "ohsvgp-o", "osvgp", "ovc")
#: ``first_task_kernel`` of :func:`run_elbo_method` (multidimensional inputs).
FIRST_TASK_KERNELS = ("exact-gp", "elbo")
#: ``preprocessing`` of :func:`run_elbo_method` (multidimensional inputs).
PREPROCESSINGS = ("thesis", "standardise")


class OnlineApproximateGP(gpytorch.models.ApproximateGP):
    """SVGP with any inducing variables (Cholesky ``q(u)``), a kernel and a mean.

    :param inducing_variables: any :class:`~gpytorch_hippo.inducing.InducingVariables`.
    :param kernel: the prior kernel.
    :param mean_module: the prior mean.
    """

    def __init__(self, inducing_variables, kernel, mean_module):
        distribution = gpytorch.variational.CholeskyVariationalDistribution(inducing_variables.num_inducing)
        super().__init__(InterdomainVariationalStrategy(self, inducing_variables, distribution))
        self.covar_module, self.mean_module = kernel, mean_module

    def forward(self, x):
        """The prior :math:`p(f(x))`.

        :param x: inputs ``(N, d)``.
        """
        return gpytorch.distributions.MultivariateNormal(self.mean_module(x), self.covar_module(x))


def methods_for(data: Dataset) -> tuple:
    """The methods of :data:`ELBO_METHODS` that apply to ``data`` (series or multidimensional inputs).

    :param data: the data set.
    """
    return ("ohsvgp", "osvgp", "ovc") if data.is_series else ("ohsvgp-k", "ohsvgp-o", "osvgp", "ovc")


def first_task_start(
    kernel: gpytorch.kernels.ScaleKernel,
    likelihood,
    mean_constant: float,
    x: torch.Tensor,
    y: torch.Tensor,
    num_inducing: int | None = None,
) -> None:
    """Start the task-1 hyperparameters at the best point of a grid (the runner's ``--first-fit grid``).

    Gaussian targets: :func:`~gpytorch_hippo.hyperparameters.grid_start` on ``y - mean_constant`` (the exact log marginal
    likelihood on 30 length scales × 5 noise shares; an ARD kernel gets the same length scale in
    every dimension).  Counts: the same grid on the log counts ``log(y + 0.5) - mean_constant`` (the
    latent ``f`` is the log rate) sets the length scale and outputscale; then the dispersion ``r``
    maximises the negative-binomial log likelihood of ``y`` at the rate ``exp`` of that GP's
    posterior mean, over 41 values log-spaced in [0.1, 10⁴].  The task-1 ELBO steps (lr 0.01) move
    a softplus parameter by about 0.01 per step, so without this the initial ``span / 50`` length
    scale and ``r = 1`` are where the fit ends (docs/results.md).

    :param kernel: the ``ScaleKernel``, set in place.
    :param likelihood: a ``GaussianLikelihood`` (noise set) or a
        :class:`~gpytorch_hippo.likelihoods.NegativeBinomialLikelihood` (dispersion set).
    :param mean_constant: the prior mean's constant (subtracted from ``y``, or from the log counts).
    :param x: the first task's inputs ``(N, d)``.
    :param y: its targets ``(N,)`` (counts for the negative binomial).
    :param num_inducing: passed to :func:`~gpytorch_hippo.hyperparameters.grid_start`; ``None`` (default): its default.
    """
    with torch.no_grad():
        if isinstance(likelihood, gpytorch.likelihoods.GaussianLikelihood):
            grid_start(kernel, likelihood, x, y - mean_constant, num_inducing)
            return
        z = (y + 0.5).log() - mean_constant
        gaussian = gpytorch.likelihoods.GaussianLikelihood().to(dtype=x.dtype, device=x.device)
        grid_start(kernel, gaussian, x, z, num_inducing)
        prior = kernel(x).to_dense()
        noise = gaussian.noise.squeeze().item()
        posterior_mean = mean_constant + prior @ torch.linalg.solve(prior + noise * torch.eye(len(x), dtype=x.dtype, device=x.device), z)
        best = (-math.inf, None)
        for r in torch.logspace(-1, 4, 41, dtype=x.dtype).tolist():
            likelihood.dispersion = r
            value = likelihood(posterior_mean).log_prob(y).sum().item()
            if value > best[0]:
                best = (value, r)
        likelihood.dispersion = best[1]


def fit_exact_gp(
    kernel: gpytorch.kernels.Kernel,
    likelihood: gpytorch.likelihoods.GaussianLikelihood,
    mean_module: gpytorch.means.Mean,
    x: torch.Tensor,
    y: torch.Tensor,
) -> str:
    """Fit ``kernel``, ``likelihood`` and ``mean_module`` in place by maximising the exact log
    marginal likelihood ``log N(y | m 1, K_xx + σ² I)`` of task 1 with BoTorch's ``fit_gpytorch_mll``
    (L-BFGS-B) on a BoTorch ``SingleTaskGP`` built from these modules (no input or outcome
    transforms), the thesis's "full GP model trained over the initial task" (§4.6); parameters with
    ``requires_grad=False`` stay as they are.

    Where every L-BFGS-B attempt fails (``ModelFittingError``: e.g. a line search that cannot make
    progress on a flat ridge of the likelihood; the modules have no priors for BoTorch's retries to
    sample new starts from), the fit restarts from the same start with BoTorch's Adam fitter
    (``fit_gpytorch_mll_torch``, at most 1,000 steps) and warns. Returns the fitter that succeeded,
    ``"lbfgs"`` or ``"adam"``.

    :param kernel: the kernel, fitted in place.
    :param likelihood: the Gaussian likelihood, fitted in place.
    :param mean_module: the mean, fitted in place.
    :param x: the first task's inputs ``(N, d)``.
    :param y: its targets ``(N,)``.
    """
    from botorch.exceptions.errors import ModelFittingError
    from botorch.fit import fit_gpytorch_mll
    from botorch.models import SingleTaskGP
    from botorch.optim.fit import fit_gpytorch_mll_torch

    model = SingleTaskGP(x, y.unsqueeze(-1), likelihood=likelihood, covar_module=kernel, mean_module=mean_module, outcome_transform=None)
    mll = gpytorch.mlls.ExactMarginalLogLikelihood(likelihood, model)
    start = {name: value.clone() for name, value in model.state_dict().items()}
    fitter = "lbfgs"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # BoTorch's input-scaling advice: the runner scales the inputs itself
        try:
            fit_gpytorch_mll(mll)
        except ModelFittingError:
            model.load_state_dict(start)
            fit_gpytorch_mll(mll, optimizer=fit_gpytorch_mll_torch, optimizer_kwargs={"step_limit": 1000})
            fitter = "adam"
    if fitter == "adam":
        warnings.warn(
            "the exact GP of task 1 could not be fitted by L-BFGS-B; it was fitted by Adam from the same start",
            RuntimeWarning,
            stacklevel=2,
        )
    model.train()
    return fitter


def _evaluate(model, likelihood, x, y, counts: bool, generator: torch.Generator) -> dict:
    model.eval()
    with torch.no_grad():
        latent = model(x)
        if not counts:
            predictive = likelihood(latent)
            return {"nlpd": gaussian_nlpd(predictive.mean, predictive.variance, y), "rmse": rmse(predictive.mean, y), "ece": ""}
        log_density = likelihood.log_marginal(y, latent)
        f = latent.mean + latent.variance.sqrt() * torch.randn(100, y.shape[0], generator=generator, dtype=y.dtype)
        samples = likelihood(f).sample()
        draws = latent.mean + latent.variance.sqrt() * torch.randn(1000, y.shape[0], generator=generator, dtype=y.dtype)
        mean = likelihood(draws).mean.mean(0)
    model.train()
    return {"nlpd": nlpd_from_log_density(log_density), "rmse": rmse(mean, y), "ece": interval_ece(samples, y)}


def run_elbo_method(
    data: Dataset,
    method: str,
    num_inducing: int,
    seed: int,
    num_tasks: int,
    split: str | None,
    svgp_iters: int = 200,
    lr: float = 0.01,
    num_rff: int = 1000,
    progress: bool = False,
    first_fit: str = "grid",
    first_task_kernel: str = "exact-gp",
    preprocessing: str = "thesis",
):
    """Rows of the runner's CSV columns for one method and seed, the final model and its likelihood.
    ``first_fit``: ``"grid"`` starts the task-1 hyperparameters of a series (the counts) at
    :func:`first_task_start` with ``num_inducing`` points, ``"given"`` at length scale ``span / 50``,
    outputscale ``softplus(0) = 0.69`` and dispersion 1 (the runner before that, whose count fits
    stayed at dispersion ≈ 2).  Multidimensional inputs start at ``span / 4`` per dimension, noise
    and outputscale 0.69, either way: there the isotropic grid reached a lower task-1 ELBO after
    the runner's steps than this ARD start (diabetes, concrete: docs/results.md).
    Multidimensional inputs only: ``first_task_kernel="exact-gp"`` fits the kernel, noise and mean
    constant to task 1 with :func:`fit_exact_gp` from that start and keeps them fixed on every task
    (task 1 trains ``q(u)`` only, and OHSVGP-k orders task 1 with the fitted kernel); ``"elbo"`` trains
    them on task 1's online ELBO and orders task 1 with the starting kernel (the runner before).
    ``preprocessing="thesis"``: :func:`~gpytorch_hippo.data.minmax_inputs` and a global 10 % test split;
    ``"standardise"``: the data as loaded (standardised) and 20 % of each task held out.

    :param data: the data set (counts or multidimensional inputs; series with a Gaussian likelihood work too).
    :param method: one of :func:`methods_for` ``(data)``.
    :param num_inducing: the number ``M`` of inducing variables.
    :param seed: seeds the task split, the random inducing points and features, and the evaluation's samples.
    :param num_tasks: the number of tasks.
    :param split: task split of multidimensional data, ``"first-dim"`` or ``"l2"``; ``None``: ``"time"`` for series,
        ``"first-dim"`` otherwise.
    :param svgp_iters: Adam steps per task (default 200).
    :param lr: Adam learning rate (default 0.01).
    :param num_rff: random Fourier features of the multidimensional HiPPO variables (default 1000).
    :param progress: unused (kept for the runner's signature).
    :param first_fit: ``"grid"`` (default) or ``"given"``, as above.
    :param first_task_kernel: one of :data:`FIRST_TASK_KERNELS`, as above (default ``"exact-gp"``).
    :param preprocessing: one of :data:`PREPROCESSINGS`, as above (default ``"thesis"``).
    :return: ``(rows, final model, likelihood)``.
    """
    if first_fit not in ("grid", "given"):
        raise ValueError(f"first_fit must be 'grid' or 'given', got {first_fit!r}")
    if first_task_kernel not in FIRST_TASK_KERNELS:
        raise ValueError(f"first_task_kernel must be one of {FIRST_TASK_KERNELS}, got {first_task_kernel!r}")
    if preprocessing not in PREPROCESSINGS:
        raise ValueError(f"preprocessing must be one of {PREPROCESSINGS}, got {preprocessing!r}")
    if method not in methods_for(data):
        raise ValueError(f"method {method!r} does not apply to {data.name}; choose from {', '.join(methods_for(data))}")
    counts = data.likelihood == "negative-binomial"
    exact_first = first_task_kernel == "exact-gp" and not data.is_series and not counts
    if preprocessing == "thesis" and not data.is_series:
        data = minmax_inputs(data)
        tasks = split_tasks(data, num_tasks, seed, test_fraction=0.1, split=split, test_split="global")
    else:
        tasks = split_tasks(data, num_tasks, seed, split=split)
    generator = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    dim = data.x.shape[-1]
    kernel = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel(ard_num_dims=dim if dim > 1 else None)).double()
    span = data.x.max(0).values - data.x.min(0).values
    kernel.base_kernel.lengthscale = (span / 50 if data.is_series else span / 4).to(torch.float64)
    mean = gpytorch.means.ConstantMean().double()
    if counts:
        likelihood = NegativeBinomialLikelihood().double()
        mean.constant.data.fill_(math.log(float(tasks[0].train_y.mean()) + 1e-3))
    else:
        likelihood = gpytorch.likelihoods.GaussianLikelihood().double()
    mean.requires_grad_(False)  # interdomain variables project f - m: the mean stays fixed
    if first_fit == "grid" and data.is_series:  # multidimensional inputs keep span / 4 per dimension (docstring)
        first_task_start(kernel, likelihood, float(mean.constant), tasks[0].train_x, tasks[0].train_y, num_inducing)
    if exact_first:
        mean.requires_grad_(True)
        fit_exact_gp(kernel, likelihood, mean, tasks[0].train_x, tasks[0].train_y)
        for module in (kernel, likelihood, mean):
            module.requires_grad_(False)
    if method.startswith("ohsvgp"):
        if data.is_series:
            ivs = HiPPOInducingVariables(num_inducing, "legs", t=tasks[0].t_end, start=float(data.x.min()))
        else:
            ivs = HiPPOInducingVariables(num_inducing, "legs", input_dim=dim, num_rff=num_rff, seed=seed)
        schedule = None
    else:
        schedule = RandomPointsSchedule(num_inducing, num_iter=svgp_iters) if method == "osvgp" else PivotedCholeskySchedule(num_inducing)
        ivs = schedule.first(tasks[0].train_x, tasks[0].t_end, kernel, generator)
    model = OnlineApproximateGP(ivs.double(), kernel, mean).double()
    mll = OnlineELBO(likelihood, model, num_data=tasks[0].train_y.shape[0])
    rows, cum_time, last_input = [], 0.0, None
    for k, task in enumerate(tasks):
        start = time.perf_counter()
        x, y = task.train_x, task.train_y
        strategy = model.variational_strategy
        if k > 0:
            mll.end_task(num_data=y.shape[0])
            if schedule is not None:
                new = schedule.next(strategy.inducing_variables, x, task.t_end, kernel, generator).double()
                strategy.replace_inducing_variables(new)  # q(u) carried over; their number may grow (M > task size)
            elif data.is_series:
                strategy.advance(task.t_end)
        if method.startswith("ohsvgp") and not data.is_series:
            order = (
                split_order(x, split or "first-dim")
                if method == "ohsvgp-o"
                else order_inputs(x, "kernel_max", kernel=kernel, start=last_input)
            )
            x, y = x[order], y[order]
            last_input = x[-1]
            strategy.append_path(x)
        if k == 0:
            parameters = [p for p in list(model.parameters()) + list(likelihood.parameters()) if p.requires_grad]
        else:
            kernel.requires_grad_(False)
            likelihood.requires_grad_(False)
            parameters = list(model.variational_parameters())  # q(u), and osvgp's inducing inputs
        optimizer = torch.optim.Adam(parameters, lr=lr)
        model.train()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            for _ in range(svgp_iters):
                optimizer.zero_grad()
                (-mll(model(x), y)).backward()
                optimizer.step()
        cum_time += time.perf_counter() - start
        for j, seen in enumerate(tasks[: k + 1]):
            rows.append(
                dict(
                    dataset=data.name,
                    method=method,
                    num_inducing=num_inducing,
                    seed=seed,
                    task_trained=k + 1,
                    task_eval=j + 1,
                    cum_time_s=cum_time,
                    **_evaluate(model, likelihood, seen.test_x, seen.test_y, counts, generator),
                )
            )
    return rows, model, likelihood
