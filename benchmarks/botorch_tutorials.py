"""BoTorch's own tutorials with ``OnlineGPModel`` in place of ``SingleTaskGP``: the class is the only edit.

Five tutorials of BoTorch's repository, written here as functions of the model class at small budgets
(every other line follows the tutorial: its test problem, noise, transforms, ``ModelListGP`` and
``SumMarginalLogLikelihood``, ``fit_gpytorch_mll``, the warm start by ``load_state_dict``, its acquisition
functions and optimiser settings scaled down):

- ``closed_loop``: noisy constrained Hartmann6, known noise, ``Normalize``, qLogNEI, batches of 3;
  the best feasible true objective after each batch.
- ``multi_objective``: noisy BraninCurrin, known noise, qLogNEHVI, batches of 2; the hypervolume of the
  true objectives of the evaluated points.
- ``one_shot_kg``: ``sin(2 pi x1) cos(2 pi x2)`` with noise, one-shot qKG; the true value at the maximiser of
  the posterior mean (BoTorch's recommendation) after each step.
- ``information_theoretic``: the tutorial's 1-D function, ``get_optimal_samples`` and qJointEntropySearch
  (lower bound); the best true value observed.
- ``torch_optimizer``: 15 noisy points of ``sin(2 pi x)`` in float32, the tutorial's SGD loop over
  ``model.train_inputs``/``train_targets`` (150 epochs); the RMSE of the posterior mean and the NLPD of
  ``sin(2 pi x)`` on 101 test points.

Each runs with ``SingleTaskGP`` and with ``OnlineGPModel`` on the same seeds (the same initial data;
the random draws of the optimisers differ once the models' posteriors do). Times: model construction and
fitting per iteration, and ``optimize_acqf`` per iteration. A second table times one acquisition call,
``posterior(X) -> rsample -> backward`` at q = 3, 128 samples, on the closed-loop data.

    python benchmarks/botorch_tutorials.py                     # 5 seeds, every tutorial (about 20 min, 1 core)
    python benchmarks/botorch_tutorials.py --seeds 1 --tutorials one_shot_kg
"""

from __future__ import annotations

import argparse
import csv
import math
import statistics
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import torch
from botorch import fit_gpytorch_mll
from botorch.acquisition import PosteriorMean, qKnowledgeGradient, qLogNoisyExpectedImprovement
from botorch.acquisition.joint_entropy_search import qJointEntropySearch
from botorch.acquisition.multi_objective.logei import qLogNoisyExpectedHypervolumeImprovement
from botorch.acquisition.objective import GenericMCObjective
from botorch.acquisition.utils import get_optimal_samples
from botorch.exceptions import BadInitialCandidatesWarning
from botorch.models import ModelListGP, SingleTaskGP
from botorch.models.transforms.input import Normalize
from botorch.optim import optimize_acqf
from botorch.sampling.normal import SobolQMCNormalSampler
from botorch.test_functions import Hartmann
from botorch.test_functions.multi_objective import BraninCurrin
from botorch.utils import standardize
from botorch.utils.multi_objective.box_decompositions.dominated import DominatedPartitioning
from botorch.utils.sampling import draw_sobol_samples
from botorch.utils.transforms import normalize, unnormalize
from gpytorch.constraints import GreaterThan
from gpytorch.mlls import ExactMarginalLogLikelihood
from gpytorch.mlls.sum_marginal_log_likelihood import SumMarginalLogLikelihood

from gpytorch_hippo.botorch import OnlineGPModel

DOUBLE = torch.double
MODELS = {"SingleTaskGP": SingleTaskGP, "OnlineGPModel": OnlineGPModel}


class Clock:
    """Seconds spent in the model (construction and fit) and in ``optimize_acqf``."""

    def __init__(self) -> None:
        self.fit = self.acquisition = 0.0

    def time(self, part: str, function: Callable, *args, **kwargs):
        start = time.perf_counter()
        result = function(*args, **kwargs)
        setattr(self, part, getattr(self, part) + time.perf_counter() - start)
        return result


def closed_loop(Model, seed: int, clock: Clock, batches: int = 8) -> list[float]:
    """BoTorch's "closed-loop batch, constrained BO" tutorial (qLogNEI arm)."""
    torch.manual_seed(seed)
    hartmann = Hartmann(negate=True)
    noise_se = 0.25
    train_yvar = torch.tensor(noise_se**2, dtype=DOUBLE)

    def constraint(X):
        return X.sum(dim=-1) - 3

    def weighted_obj(X):
        return hartmann(X) * (constraint(X) <= 0).type_as(X)

    def observe(X):
        obj, con = hartmann(X).unsqueeze(-1), constraint(X).unsqueeze(-1)
        return obj + noise_se * torch.randn_like(obj), con + noise_se * torch.randn_like(con)

    def initialize_model(train_x, train_obj, train_con, state_dict=None):
        model_obj = Model(train_x, train_obj, train_yvar.expand_as(train_obj), input_transform=Normalize(d=6)).to(train_x)
        model_con = Model(train_x, train_con, train_yvar.expand_as(train_con), input_transform=Normalize(d=6)).to(train_x)
        model = ModelListGP(model_obj, model_con)
        mll = SumMarginalLogLikelihood(model.likelihood, model)
        if state_dict is not None:
            model.load_state_dict(state_dict)
        return mll, model

    objective = GenericMCObjective(lambda Z, X=None: Z[..., 0])
    bounds = torch.tensor([[0.0] * 6, [1.0] * 6], dtype=DOUBLE)
    train_x = torch.rand(10, 6, dtype=DOUBLE)
    train_obj, train_con = observe(train_x)
    best = [weighted_obj(train_x).max().item()]
    mll, model = clock.time("fit", initialize_model, train_x, train_obj, train_con)
    for _ in range(batches):
        clock.time("fit", fit_gpytorch_mll, mll)
        acquisition = qLogNoisyExpectedImprovement(
            model=model,
            X_baseline=train_x,
            sampler=SobolQMCNormalSampler(sample_shape=torch.Size([128])),
            objective=objective,
            constraints=[lambda Z: Z[..., 1]],
        )
        candidates, _ = clock.time(
            "acquisition",
            optimize_acqf,
            acquisition,
            bounds=bounds,
            q=3,
            num_restarts=4,
            raw_samples=128,
            options={"batch_limit": 5, "maxiter": 100},
        )
        new_x = candidates.detach()
        new_obj, new_con = observe(new_x)
        train_x, train_obj, train_con = torch.cat([train_x, new_x]), torch.cat([train_obj, new_obj]), torch.cat([train_con, new_con])
        best.append(weighted_obj(train_x).max().item())
        mll, model = clock.time("fit", initialize_model, train_x, train_obj, train_con, model.state_dict())
    return best


def multi_objective(Model, seed: int, clock: Clock, batches: int = 6) -> list[float]:
    """BoTorch's "multi-objective BO" tutorial (qLogNEHVI arm)."""
    torch.manual_seed(seed)
    problem = BraninCurrin(negate=True).to(dtype=DOUBLE)
    noise_se = torch.tensor([15.19, 0.63], dtype=DOUBLE)

    def hypervolume(Y_true):
        return DominatedPartitioning(ref_point=problem.ref_point, Y=Y_true).compute_hypervolume().item()

    def initialize_model(train_x, train_obj):
        train_x = normalize(train_x, problem.bounds)
        models = []
        for i in range(train_obj.shape[-1]):
            train_y = train_obj[..., i : i + 1]
            models.append(Model(train_x, train_y, torch.full_like(train_y, noise_se[i] ** 2)))
        model = ModelListGP(*models)
        return SumMarginalLogLikelihood(model.likelihood, model), model

    train_x = draw_sobol_samples(bounds=problem.bounds, n=6, q=1, seed=seed).squeeze(1)
    train_true = problem(train_x)
    train_obj = train_true + torch.randn_like(train_true) * noise_se
    standard_bounds = torch.stack([torch.zeros(2, dtype=DOUBLE), torch.ones(2, dtype=DOUBLE)])
    volumes = [hypervolume(train_true)]
    for _ in range(batches):
        mll, model = clock.time("fit", initialize_model, train_x, train_obj)
        clock.time("fit", fit_gpytorch_mll, mll)
        acquisition = qLogNoisyExpectedHypervolumeImprovement(
            model=model,
            ref_point=problem.ref_point.tolist(),
            X_baseline=normalize(train_x, problem.bounds),
            prune_baseline=True,
            sampler=SobolQMCNormalSampler(sample_shape=torch.Size([64])),
        )
        candidates, _ = clock.time(
            "acquisition",
            optimize_acqf,
            acquisition,
            bounds=standard_bounds,
            q=2,
            num_restarts=4,
            raw_samples=128,
            options={"batch_limit": 5, "maxiter": 100},
            sequential=True,
        )
        new_x = unnormalize(candidates.detach(), bounds=problem.bounds)
        new_true = problem(new_x)
        train_x, train_true = torch.cat([train_x, new_x]), torch.cat([train_true, new_true])
        train_obj = torch.cat([train_obj, new_true + torch.randn_like(new_true) * noise_se])
        volumes.append(hypervolume(train_true))
    return volumes


def one_shot_kg(Model, seed: int, clock: Clock, steps: int = 5) -> list[float]:
    """BoTorch's "one-shot KG" tutorial, run as a loop: the true value at the posterior mean's maximiser."""
    torch.manual_seed(seed)
    bounds = torch.stack([torch.zeros(2, dtype=DOUBLE), torch.ones(2, dtype=DOUBLE)])

    def f(X):
        return torch.sin(2 * math.pi * X[:, [0]]) * torch.cos(2 * math.pi * X[:, [1]])

    train_X = torch.rand(20, 2, dtype=DOUBLE)
    raw_Y = f(train_X) + 0.05 * torch.randn(20, 1, dtype=DOUBLE)
    values = []
    for step in range(steps + 1):
        model = clock.time("fit", Model, train_X, standardize(raw_Y))
        clock.time("fit", fit_gpytorch_mll, ExactMarginalLogLikelihood(model.likelihood, model))
        argmax_pmean, max_pmean = clock.time(
            "acquisition", optimize_acqf, PosteriorMean(model), bounds=bounds, q=1, num_restarts=4, raw_samples=256
        )
        values.append(f(argmax_pmean).item())
        if step == steps:
            break
        kg = qKnowledgeGradient(model, num_fantasies=16, current_value=max_pmean)
        candidate, _ = clock.time(
            "acquisition", optimize_acqf, kg, bounds=bounds, q=1, num_restarts=2, raw_samples=64, options={"maxiter": 50}
        )
        train_X = torch.cat([train_X, candidate.detach()])
        raw_Y = torch.cat([raw_Y, f(candidate.detach()) + 0.05 * torch.randn(1, 1, dtype=DOUBLE)])
    return values


def information_theoretic(Model, seed: int, clock: Clock, steps: int = 8) -> list[float]:
    """BoTorch's "information-theoretic acquisition functions" tutorial (JES lower bound), run as a loop."""
    torch.manual_seed(seed)
    bounds = torch.tensor([[0.0], [1.0]], dtype=DOUBLE)

    def f(x):
        return torch.cos(torch.pi * x) + 10 * torch.sin(torch.pi * x) + 2 * torch.sin(2 * torch.pi * x) + 2 * torch.sin(6 * torch.pi * x)

    train_X = draw_sobol_samples(bounds=bounds, n=5, q=1, seed=seed).squeeze(-2)
    train_Y = f(train_X)
    best = [train_Y.max().item()]
    for _ in range(steps):
        model = clock.time("fit", Model, train_X, train_Y)
        clock.time("fit", fit_gpytorch_mll, ExactMarginalLogLikelihood(model.likelihood, model))

        def acquire():
            optimal_inputs, optimal_outputs = get_optimal_samples(model, bounds=bounds, num_optima=12)
            jes = qJointEntropySearch(model=model, optimal_inputs=optimal_inputs, optimal_outputs=optimal_outputs, estimation_type="LB")
            return optimize_acqf(jes, bounds=bounds, q=1, num_restarts=4, raw_samples=256)

        candidate, _ = clock.time("acquisition", acquire)
        train_X, train_Y = torch.cat([train_X, candidate.detach()]), torch.cat([train_Y, f(candidate.detach())])
        best.append(train_Y.max().item())
    return best


def torch_optimizer(Model, seed: int, clock: Clock) -> list[float]:
    """BoTorch's "fit a model with a torch optimizer" tutorial, float32: [test RMSE, test NLPD]."""
    torch.manual_seed(seed)
    train_X = torch.linspace(0, 1, 15, dtype=torch.float).unsqueeze(1)
    train_Y = torch.sin(train_X * (2 * math.pi)) + 0.15 * torch.randn_like(train_X)

    def fit():
        model = Model(train_X=train_X, train_Y=train_Y)
        model.likelihood.noise_covar.register_constraint("raw_noise", GreaterThan(1e-5))
        mll = ExactMarginalLogLikelihood(likelihood=model.likelihood, model=model).to(train_X)
        optimizer = torch.optim.SGD([{"params": model.parameters()}], lr=0.025)
        model.train()
        for _ in range(150):
            optimizer.zero_grad()
            loss = -mll(model(train_X), model.train_targets)
            loss.backward()
            optimizer.step()
        model.eval()
        return model

    model = clock.time("fit", fit)
    test_X = torch.linspace(0, 1, 101, dtype=torch.float)
    truth = torch.sin(test_X * (2 * math.pi))
    with torch.no_grad():
        posterior = model.posterior(test_X)
        mean, variance = posterior.mean.squeeze(-1), posterior.variance.squeeze(-1)
    rmse = (mean - truth).pow(2).mean().sqrt().item()
    nlpd = (0.5 * torch.log(2 * math.pi * variance) + 0.5 * (truth - mean).pow(2) / variance).mean().item()
    return [rmse, nlpd]


TUTORIALS = {
    "closed_loop": (closed_loop, "best feasible value", "max"),
    "multi_objective": (multi_objective, "hypervolume", "max"),
    "one_shot_kg": (one_shot_kg, "value at argmax posterior mean", "max"),
    "information_theoretic": (information_theoretic, "best value", "max"),
    "torch_optimizer": (torch_optimizer, "test RMSE, NLPD", "min"),
}


def acquisition_call_time(repeats: int = 30) -> dict[str, float]:
    """Milliseconds of ``posterior(X).rsample(128)`` and its backward at q = 3 on 40 Hartmann6 points."""
    torch.manual_seed(0)
    train_X = torch.rand(40, 6, dtype=DOUBLE)
    train_Y = Hartmann(negate=True)(train_X).unsqueeze(-1)
    times = {}
    for name, Model in MODELS.items():
        model = Model(train_X, train_Y)
        fit_gpytorch_mll(ExactMarginalLogLikelihood(model.likelihood, model))
        model.eval()
        X = torch.rand(10, 3, 6, dtype=DOUBLE, requires_grad=True)
        samples = []
        for _ in range(repeats + 3):
            start = time.perf_counter()
            model.posterior(X).rsample(torch.Size([128])).sum().backward()
            samples.append(time.perf_counter() - start)
        times[name] = 1e3 * statistics.median(samples[3:])
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--tutorials", default=",".join(TUTORIALS))
    parser.add_argument("--out", type=Path, default=Path("out/botorch_tutorials"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore", category=BadInitialCandidatesWarning)
    warnings.filterwarnings("ignore", category=RuntimeWarning)
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    print(f"{'tutorial':<22} {'model':<14} {'metric (mean ± se over seeds)':<44} {'fit s/iter':>10} {'acqf s/iter':>11}")
    for tutorial in args.tutorials.split(","):
        run, metric, _ = TUTORIALS[tutorial]
        for name, Model in MODELS.items():
            finals, fit, acquisition = [], [], []
            for seed in range(args.seeds):
                clock = Clock()
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    trace = run(Model, seed, clock)
                iterations = max(len(trace) - 1, 1)
                fit.append(clock.fit / iterations)
                acquisition.append(clock.acquisition / iterations)
                finals.append(trace if tutorial == "torch_optimizer" else trace[-1:])
                rows.append(
                    {
                        "tutorial": tutorial,
                        "model": name,
                        "seed": seed,
                        "trace": " ".join(f"{v:.6g}" for v in trace),
                        "fit_s_per_iteration": fit[-1],
                        "acquisition_s_per_iteration": acquisition[-1],
                    }
                )
            summary = []
            for column in zip(*finals):
                se = statistics.stdev(column) / math.sqrt(len(column)) if len(column) > 1 else float("nan")
                summary.append(f"{statistics.mean(column):.3f} ± {se:.3f}")
            print(
                f"{tutorial:<22} {name:<14} {metric + ': ' + ', '.join(summary):<44} {statistics.mean(fit):>10.3f} "
                f"{statistics.mean(acquisition):>11.3f}",
                flush=True,
            )
    with open(args.out / "runs.csv", "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    times = acquisition_call_time()
    print(
        "\nposterior(X) -> rsample(128) -> backward, q = 3, 10 restarts, 40 points (median ms): "
        + ", ".join(f"{name} {ms:.2f}" for name, ms in times.items())
        + f"; ratio {times['OnlineGPModel'] / times['SingleTaskGP']:.2f}"
    )


if __name__ == "__main__":
    main()
