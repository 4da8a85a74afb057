r"""Streaming Bayesian optimisation on a time-varying objective built from real irradiance data.

At each daylight hour :math:`t` of the pvlib TMY3 year (Greensboro, NC) the optimiser chooses the tilt
:math:`\beta \in [0^\circ, 90^\circ]` and azimuth :math:`\gamma \in [90^\circ, 270^\circ]` of a solar panel and observes the plane-of-array
irradiance of that hour (kW/m², pvlib's isotropic transposition of the hour's measured GHI, DNI
and DHI at the sun's position) plus Gaussian noise. The best angles move with the sun and the
cloud cover, so the surrogate models :math:`f(\beta, \gamma, t)` and the acquisition function (UCB) is
maximised over :math:`(\beta, \gamma)` at the next hour :math:`t`. Regret at step :math:`t` is
:math:`\max_x f_t(x) - f_t(x_t)` (maximum over a 1° x 2° grid and :math:`x_t`).

Surrogates (each sees the same first ``--init`` random observations):

* ``ohsgpr``: :class:`~gpytorch_hippo.botorch.OnlineGPModel` with multidimensional HiPPO-LegS
  inducing variables (the ordered path of all inputs, thesis §4.4; Chen et al. (2025), OHSVGP) -- one online update per step;
* ``osgpr``: the same model with ``M`` inducing points at the latest ``M`` inputs (a sliding
  window, replaced before every update) -- one online update per step;
* ``exact``: BoTorch's ``SingleTaskGP`` on all data, refitted every step (warm-started);
* ``svgp``: BoTorch's ``SingleTaskVariationalGP`` (``M`` inducing points) on all data, refitted
  every step (warm-started, ``--svgp-maxiter`` iterations).

Hyperparameters of the online models are fitted on the first batch only. The surrogate time of
a step is the time to absorb its observation (update or refit); acquisition time is separate.

    python -m experiments.hippo.streaming_bo --out out/streaming_bo --steps 220 --threads 1
"""

from __future__ import annotations

import argparse
import csv
import math
import os
import time
import warnings
from typing import TYPE_CHECKING

import numpy as np
import torch
from tqdm import tqdm

from gpytorch_hippo.data.solar import IrradianceObjective
from probseq._optional import require

if TYPE_CHECKING:  # imported where they are used (the runner's --help imports no BoTorch)
    import botorch.models.approximate_gp
    import botorch.models.gp_regression

    from gpytorch_hippo.botorch import OnlineGPModel

#: The surrogates the streaming-BO runner compares.
METHODS = ("ohsgpr", "osgpr", "exact", "svgp")
#: The acquisition functions of ``--acquisition``.
ACQUISITIONS = ("ucb", "qkg", "qjes")
#: The columns of the CSV the runner writes.
COLUMNS = ("method", "seed", "step", "hour", "tilt", "azimuth", "value", "best_value", "regret", "surrogate_seconds", "acquisition_seconds")


def _time_feature(hour: int, first_hour: int, last_hour: int) -> float:
    """Time input of the surrogate: the fraction of the run's span elapsed (so inputs lie in the unit cube)."""
    return (hour - first_hour) / (last_hour - first_hour)


class OnlineSurrogate:
    """OHSGPR / OSGPR through :class:`~gpytorch_hippo.botorch.OnlineGPModel`.

    :param method: ``"ohsgpr"`` (HiPPO-LegS path variables) or ``"osgpr"`` (points at the latest ``M`` inputs).
    :param num_inducing: the number ``M`` of inducing variables.
    :param fit_maxiter: L-BFGS iterations of the hyperparameter fit on the first batch.
    """

    def __init__(self, method: str, num_inducing: int, fit_maxiter: int):
        self.method, self.num_inducing, self.fit_maxiter = method, num_inducing, fit_maxiter
        self.model: OnlineGPModel | None = None
        self.recent: torch.Tensor | None = None

    def observe(self, x: torch.Tensor, y: torch.Tensor) -> None:
        """Build the model on the first batch, then absorb each later one by an online update.

        :param x: inputs ``(n, 3)`` (tilt, azimuth, time feature) in the unit cube.
        :param y: observations ``(n, 1)`` (kW/m²).
        """
        from botorch.models.transforms import Standardize

        from gpytorch_hippo.botorch import OnlineGPModel
        from gpytorch_hippo.inducing import HiPPOInducingVariables, InducingPoints

        self.recent = x if self.recent is None else torch.cat([self.recent, x])[-self.num_inducing :]
        if self.model is None:
            if self.method == "ohsgpr":
                inducing = HiPPOInducingVariables(self.num_inducing, "legs", input_dim=x.shape[-1], features="quadrature", num_rff=1000)
            else:
                inducing = InducingPoints(self.recent, learn=False)
            self.model = OnlineGPModel(x, y, inducing, outcome_transform=Standardize(m=1), fit_maxiter=self.fit_maxiter, keep_data=False)
            return
        if self.method == "osgpr":
            self.model.inducing_variables = InducingPoints(self.recent, learn=False)
        self.model = self.model.condition_on_observations(x, y)


class RefittedSurrogate:
    """BoTorch's ``SingleTaskGP`` or ``SingleTaskVariationalGP`` refitted on all data at every step.

    :param method: ``"exact"`` (``SingleTaskGP``) or ``"svgp"`` (``SingleTaskVariationalGP``).
    :param num_inducing: the number of inducing points of ``"svgp"`` (at most the number of data).
    :param maxiter: L-BFGS iterations of each refit.
    """

    def __init__(self, method: str, num_inducing: int, maxiter: int):
        self.method, self.num_inducing, self.maxiter = method, num_inducing, maxiter
        self.model: botorch.models.gp_regression.SingleTaskGP | botorch.models.approximate_gp.SingleTaskVariationalGP | None = None
        self.X: torch.Tensor | None = None
        self.Y: torch.Tensor | None = None

    def observe(self, x: torch.Tensor, y: torch.Tensor) -> None:
        """Append the batch and refit on all data, warm-started from the previous model.

        :param x: inputs ``(n, 3)`` in the unit cube.
        :param y: observations ``(n, 1)``.
        """
        from botorch.fit import fit_gpytorch_mll
        from botorch.models import SingleTaskGP, SingleTaskVariationalGP
        from botorch.models.transforms import Standardize
        from gpytorch.mlls import ExactMarginalLogLikelihood, VariationalELBO

        self.X = x if self.X is None else torch.cat([self.X, x])
        self.Y = y if self.Y is None else torch.cat([self.Y, y])
        previous = None if self.model is None else torch.nn.Module.state_dict(self.model)
        model: botorch.models.gp_regression.SingleTaskGP | botorch.models.approximate_gp.SingleTaskVariationalGP
        if self.method == "exact":
            model = SingleTaskGP(self.X, self.Y, outcome_transform=Standardize(m=1))
            mll = ExactMarginalLogLikelihood(model.likelihood, model)
        else:
            with warnings.catch_warnings():  # full-batch fits: BoTorch's minibatch caveat does not apply
                warnings.filterwarnings("ignore", message="Using an outcome transform with `SingleTaskVariationalGP`")
                model = SingleTaskVariationalGP(
                    self.X, self.Y, inducing_points=min(self.num_inducing, len(self.X)), outcome_transform=Standardize(m=1)
                )
            mll = VariationalELBO(model.likelihood, model.model, num_data=len(self.X))
        if previous is not None:  # warm start: hyperparameters (and q(u)) of the previous step
            current = torch.nn.Module.state_dict(model)
            kept = {k: v for k, v in previous.items() if "transform" not in k and k in current and current[k].shape == v.shape}
            torch.nn.Module.load_state_dict(model, kept, strict=False)
        fit_gpytorch_mll(mll, optimizer_kwargs={"options": {"maxiter": self.maxiter}})
        self.model = model.eval()


def make_acquisition(name: str, model, bounds: torch.Tensor, t_next: float):
    """The acquisition ``name`` for the next hour ``t_next`` (the time feature is fixed by the optimiser).

    :param name: one of :data:`ACQUISITIONS`: ``"ucb"``, ``"qkg"`` or ``"qjes"`` (see :func:`run`).
    :param model: the surrogate, a BoTorch model.
    :param bounds: the input bounds ``(2, 3)``.
    :param t_next: the time feature of the next hour, in ``[0, 1]``.
    """
    from botorch.acquisition import UpperConfidenceBound, qKnowledgeGradient
    from botorch.acquisition.joint_entropy_search import qJointEntropySearch
    from botorch.acquisition.utils import get_optimal_samples

    if name == "ucb":
        return UpperConfidenceBound(model, beta=4.0)
    if name == "qkg":
        return qKnowledgeGradient(model, num_fantasies=8)
    hour_bounds = bounds.clone()  # optimal samples of the next hour's function (a sliver: BoTorch clamps to the bounds)
    hour_bounds[:, 2] = torch.tensor([max(t_next - 1e-6, 0.0), min(t_next + 1e-6, 1.0)], dtype=bounds.dtype)
    optimal_inputs, optimal_outputs = get_optimal_samples(model, bounds=hour_bounds, num_optima=8)
    return qJointEntropySearch(model, optimal_inputs=optimal_inputs, optimal_outputs=optimal_outputs)


def run(
    steps: int = 220,
    init: int = 20,
    seed: int = 0,
    methods=METHODS,
    num_inducing: int = 32,
    noise_std: float = 0.01,
    svgp_maxiter: int = 20,
    progress: bool = True,
    acquisition: str = "ucb",
) -> list[dict]:
    """One streaming BO run per method; returns one row per (method, step) with the CSV columns.
    ``acquisition``: ``"ucb"`` (β = 4), ``"qkg"`` (one-shot knowledge gradient, 8 fantasies at the next
    hour) or ``"qjes"`` (joint entropy search with 8 optimal samples of the next hour, drawn from
    pathwise samples of every surrogate).

    :param steps: the number of daylight hours of the run, initial ones included (default 220).
    :param init: the number of initial random observations, fewer than ``steps`` (default 20).
    :param seed: seeds the initial points, the noise and the surrogates.
    :param methods: surrogates among :data:`METHODS` (default all).
    :param num_inducing: the number ``M`` of inducing variables of ``ohsgpr``, ``osgpr`` and ``svgp`` (default 32).
    :param noise_std: the standard deviation of the observation noise in kW/m² (default 0.01).
    :param svgp_maxiter: L-BFGS iterations of each ``svgp`` refit (default 20).
    :param progress: show progress bars (default ``True``).
    :param acquisition: one of :data:`ACQUISITIONS` (default ``"ucb"``).
    """
    from botorch.optim import optimize_acqf

    if acquisition not in ACQUISITIONS:
        raise ValueError(f"acquisition must be one of {ACQUISITIONS}, got {acquisition!r}")
    if steps <= init:
        raise ValueError(f"steps must exceed init = {init}, got {steps}")
    objective = IrradianceObjective()
    if steps > len(objective.hours):
        raise ValueError(f"steps must be at most {len(objective.hours)} (daylight hours available), got {steps}")
    hours = objective.hours[:steps]
    generator = np.random.default_rng(seed)
    initial_x = generator.random((init, 2))
    noise = generator.normal(0.0, noise_std, size=steps)
    bounds = torch.tensor([[0.0, 0.0, 0.0], [1.0, 1.0, 1.0]], dtype=torch.float64)  # (tilt, azimuth, time)
    rows: list[dict] = []
    for method in methods:
        if method not in METHODS:
            raise ValueError(f"methods must be among {METHODS}, got {method!r}")
        torch.manual_seed(seed)
        surrogate: object
        if method in ("ohsgpr", "osgpr"):
            surrogate = OnlineSurrogate(method, num_inducing, fit_maxiter=100)
        else:
            surrogate = RefittedSurrogate(method, num_inducing, maxiter=100 if method == "exact" else svgp_maxiter)
        inputs = [np.r_[initial_x[k], _time_feature(hours[k], hours[0], hours[-1])] for k in range(init)]
        values = [float(objective(initial_x[k : k + 1], hours[k])[0]) for k in range(init)]
        start = time.perf_counter()
        surrogate.observe(torch.tensor(np.array(inputs)), torch.tensor(values)[:, None] + torch.tensor(noise[:init])[:, None])
        first_fit = time.perf_counter() - start
        for k in tqdm(range(init, steps), desc=method, disable=not progress):
            t_next = _time_feature(hours[k], hours[0], hours[-1])
            start = time.perf_counter()
            candidate, _ = optimize_acqf(
                make_acquisition(acquisition, surrogate.model, bounds, t_next),
                bounds=bounds,
                q=1,
                num_restarts=2,
                raw_samples=64,
                fixed_features={2: t_next},
                options={"maxiter": 30},
            )
            acquisition_seconds = time.perf_counter() - start
            x = candidate.detach().numpy()[:, :2].clip(0, 1)
            value = float(objective(x, hours[k])[0])
            best = max(objective.best(hours[k]), value)
            start = time.perf_counter()
            surrogate.observe(candidate.detach(), torch.tensor([[value + noise[k]]], dtype=torch.float64))
            surrogate_seconds = time.perf_counter() - start
            rows.append(
                dict(
                    method=method,
                    seed=seed,
                    step=k,
                    hour=int(hours[k]),
                    tilt=float(x[0, 0] * 90),
                    azimuth=float(90 + x[0, 1] * 180),
                    value=value,
                    best_value=best,
                    regret=best - value,
                    surrogate_seconds=surrogate_seconds if k > init else surrogate_seconds + first_fit,
                    acquisition_seconds=acquisition_seconds,
                )
            )
    return rows


def summarise(rows: list[dict], window: int = 20) -> list[dict]:
    """Per method: mean regret over all BO steps and over the last ``window``, and the surrogate time
    per step over the first and last ``window`` BO steps (first step excluded: it holds the first fit).

    :param rows: the rows of :func:`run`.
    :param window: the number of steps of the first and last windows (default 20).
    """
    summary = []
    for method in dict.fromkeys(r["method"] for r in rows):
        mine = [r for r in rows if r["method"] == method]
        early, late = mine[1 : window + 1], mine[-window:]
        summary.append(
            dict(
                method=method,
                mean_regret=float(np.mean([r["regret"] for r in mine])),
                late_regret=float(np.mean([r["regret"] for r in late])),
                early_seconds=float(np.mean([r["surrogate_seconds"] for r in early])),
                late_seconds=float(np.mean([r["surrogate_seconds"] for r in late])),
                acquisition_seconds=float(np.mean([r["acquisition_seconds"] for r in mine])),
                last_step=mine[-1]["step"],
            )
        )
    exact = next((s for s in summary if s["method"] == "exact"), None)
    for s in summary:
        s["exact_over_method"] = exact["late_seconds"] / s["late_seconds"] if exact else math.nan
    return summary


def format_table(summary: list[dict], window: int) -> str:
    """The Markdown table of :func:`summarise`'s numbers.

    :param summary: the entries of :func:`summarise`.
    :param window: the window it used (for the column names).
    """
    header = (
        f"| method | mean regret (kW/m²) | regret, last {window} | surrogate s/step, first {window} | "
        f"surrogate s/step, last {window} | growth | exact / method, last {window} | acquisition s/step |"
    )
    lines = [header, "|" + " --- |" * 8]
    for s in summary:
        lines.append(
            f"| {s['method']} | {s['mean_regret']:.4f} | {s['late_regret']:.4f} | {s['early_seconds']:.4f} | "
            f"{s['late_seconds']:.4f} | {s['late_seconds'] / s['early_seconds']:.2f}x | {s['exact_over_method']:.1f}x | "
            f"{s['acquisition_seconds']:.3f} |"
        )
    return "\n".join(lines)


def plot(rows: list[dict], path: str) -> None:
    """Regret (10-step moving mean) and surrogate seconds per step against the step, one line per method.

    :param rows: the rows of :func:`run`.
    :param path: the image file to write.
    """
    matplotlib = require("matplotlib", "plots", "the figures")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_regret, ax_time) = plt.subplots(1, 2, figsize=(11, 4))
    for method in dict.fromkeys(r["method"] for r in rows):
        mine = [r for r in rows if r["method"] == method]
        steps = np.array([r["step"] for r in mine])
        regret = np.array([r["regret"] for r in mine])
        width = min(10, len(regret))
        smooth = np.convolve(regret, np.ones(width) / width, mode="valid")
        ax_regret.plot(steps[len(steps) - len(smooth) :], smooth, label=method)
        ax_time.semilogy(steps[1:], [r["surrogate_seconds"] for r in mine[1:]], label=method, lw=0.8)
    ax_regret.set(xlabel="step (daylight hour)", ylabel="regret, 10-step mean (kW/m²)", title="Streaming BO: panel angles")
    ax_time.set(xlabel="step (daylight hour)", ylabel="surrogate seconds per step", title="Cost of absorbing one observation")
    ax_regret.legend()
    ax_time.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None) -> list[dict]:
    """The command line (module docstring): run, write the CSV and the figure, print the table.

    :param argv: the arguments; ``None`` (default): ``sys.argv[1:]``. ``--help`` lists them.
    """
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="out/streaming_bo")
    parser.add_argument("--steps", type=int, default=220)
    parser.add_argument("--init", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    parser.add_argument("--num-inducing", type=int, default=32)
    parser.add_argument("--svgp-maxiter", type=int, default=20)
    parser.add_argument(
        "--acquisition", default="ucb", choices=ACQUISITIONS, help="UCB, one-shot knowledge gradient or joint entropy search"
    )
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--quick", action="store_true", help="30 steps, 10 initial: a smoke run")
    parser.add_argument("--no-progress", action="store_true")
    args = parser.parse_args(argv)
    require("matplotlib", "plots", "the runner's figures")  # before hours of training, not after
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    steps, init = (30, 10) if args.quick else (args.steps, args.init)
    rows = run(
        steps,
        init,
        args.seed,
        args.methods,
        args.num_inducing,
        svgp_maxiter=args.svgp_maxiter,
        progress=not args.no_progress,
        acquisition=args.acquisition,
    )
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "streaming_bo.csv"), "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(rows)
    plot(rows, os.path.join(args.out, "streaming_bo.png"))
    window = min(20, max(1, (steps - init - 1) // 2))
    print(format_table(summarise(rows, window), window))
    return rows


if __name__ == "__main__":
    main()
