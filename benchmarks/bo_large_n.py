"""Large-n Bayesian optimisation: ``SingleTaskGP`` against ``OnlineGPModel`` in the same BoTorch loops.

Two loops, written as BoTorch's tutorials run them, on the unit cube (the test function is evaluated at the
inputs mapped to its bounds) and maximising (the test functions are negated):

* **TuRBO-1** (Eriksson et al. 2019, as in BoTorch's TuRBO tutorial): a trust region around the best point, its side
  ``L`` scaled per dimension by the ARD length scales (normalised to a geometric mean of 1), ``L`` doubled after 10
  successes in a row and halved after ``ceil(max(4, d) / q)`` failures; Thompson sampling by
  ``MaxPosteriorSampling`` (without replacement) over Sobol candidates of the trust region, each coordinate of the
  centre perturbed with probability ``min(1, 20 / d)`` (at least one per candidate). The tutorial's kernel
  ``ScaleKernel(MaternKernel(nu=2.5, ard_num_dims=d, lengthscale_constraint=Interval(0.005, 4)))`` and likelihood
  ``GaussianLikelihood(noise_constraint=Interval(1e-8, 1e-3))`` are passed to every model.
  **Departure from TuRBO-1:** when ``L`` falls below ``0.5**7`` the trust region is reset to ``L = 0.8`` and the data
  are kept (TuRBO-1 restarts from a fresh design and forgets the data), so that ``n`` grows.
* **global qLogNEI**: ``qLogNoisyExpectedImprovement`` (``prune_baseline=True``, the evaluated points as the baseline,
  ``SobolQMCNormalSampler``) optimised jointly over a batch by ``optimize_acqf`` on the unit cube; the models with
  their default kernel, likelihood and ``Standardize``.

Models (``--model``):

* ``stgp``: ``SingleTaskGP`` rebuilt on all data and fitted by ``fit_gpytorch_mll`` every iteration (under
  ``gpytorch.settings.max_cholesky_size(inf)``, as the TuRBO tutorial), until one iteration (fit + acquisition) takes
  longer than ``--stgp-max-seconds``: the arm stops there. This time budget is the only thing wall time decides.
* ``swap``: the same code with ``OnlineGPModel`` in place of ``SingleTaskGP`` (rebuilt and refitted every iteration,
  under the same time budget).
* ``stream``: the same code with ``Model = OnlineGPStream()`` in place of the class: the first call builds
  ``OnlineGPModel`` on the initial design, each later one is one streaming step by the new batch (``observe``, the
  online update with the stream's refit schedule, which ``fit_gpytorch_mll`` then keeps); ``--refit-every`` and
  ``--num-inducing`` pass the stream's ``refit_every`` and ``num_inducing`` (0: its defaults, 10 and 512), the
  latter also the swap's.

Batch ``q = 8``, the initial design ``2 d`` scrambled Sobol points (the same per seed for every model), float64, one
torch thread, seeded. One run is one function, loop, model and seed (``--out`` writes its rows, one per iteration:
``n``, the best value so far, seconds of the model fit/update and of the acquisition, cumulative wall time, peak
resident memory by ``resource.getrusage``); ``--summarise`` prints the side-by-side tables of saved CSVs: best value
against evaluations and against wall time (mean and min-max over seeds), seconds per iteration against ``n`` (fit
and acquisition), the ratio ``SingleTaskGP`` / online per iteration, and peak memory.

    python benchmarks/bo_large_n.py --function ackley20 --loop turbo --model stream --seed 0 --out ackley_turbo_stream_0.csv
    python benchmarks/bo_large_n.py --function ackley20 --loop turbo --model stgp --seed 0 --stgp-max-seconds 10 --out ...
    python benchmarks/bo_large_n.py --summarise *.csv
    python benchmarks/bo_large_n.py --smoke            # seconds: every loop and model on a 4-D Ackley, n <= 24
"""

from __future__ import annotations

import argparse
import copy
import csv
import math
import resource
import statistics
import time
import warnings
from collections import defaultdict
from dataclasses import asdict, dataclass, fields, replace

import gpytorch
import torch
from botorch import fit_gpytorch_mll
from botorch.acquisition import qLogNoisyExpectedImprovement
from botorch.exceptions.errors import ModelFittingError
from botorch.exceptions.warnings import BotorchWarning
from botorch.generation import MaxPosteriorSampling
from botorch.models import SingleTaskGP
from botorch.optim import optimize_acqf
from botorch.sampling.normal import SobolQMCNormalSampler
from botorch.test_functions import Ackley, Hartmann
from gpytorch.constraints import Interval
from gpytorch.mlls import ExactMarginalLogLikelihood
from torch.quasirandom import SobolEngine

from gpytorch_hippo.botorch import OnlineGPModel, OnlineGPStream

DOUBLE = torch.float64
MODELS = ("stgp", "swap", "stream")
LOOPS = ("turbo", "qlognei")
LABELS = {"stgp": "SingleTaskGP", "swap": "online swap", "stream": "online stream"}
#: evaluations and wall times (s) at which the tables report the best value
CHECKPOINTS = (100, 250, 500, 1000, 2000, 4000)
WALL_TIMES = (10, 30, 60, 120, 300, 600, 1200)


@dataclass
class Settings:
    """One run: a test function, a loop, a model and a seed (the acquisition settings are the tutorials')."""

    function: str = "ackley20"
    loop: str = "turbo"
    model: str = "stream"
    seed: int = 0
    max_n: int = 4000
    batch: int = 8
    stgp_max_seconds: float = 10.0
    candidates: int = 0  # Thompson sampling candidates; 0: the tutorial's min(5000, max(2000, 200 d))
    restarts: int = 10  # optimize_acqf (qLogNEI), as BoTorch's closed-loop tutorial
    raw_samples: int = 512
    maxiter: int = 200
    mc_samples: int = 128
    num_inducing: int = 0  # OnlineGPModel's num_inducing; 0: the class default
    refit_every: int = 0  # the stream arm's OnlineGPModel(refit_every=...); 0: the class default
    stgp_probe_at: str = ""  # the stream arm: n (comma-separated) at which one SingleTaskGP iteration is timed on its data


def objective(name: str):
    """``(f, d)``: ``f`` maps ``(n, d)`` unit-cube inputs to ``(n, 1)`` values to maximise. ``ackley<d>`` on
    ``[-5, 10]^d`` (the TuRBO tutorial's bounds) or ``hartmann6`` on ``[0, 1]^6``, negated."""
    if name.startswith("ackley") and name[6:].isdigit():
        problem = Ackley(dim=int(name[6:]), negate=True, bounds=[(-5.0, 10.0)] * int(name[6:]))
    elif name == "hartmann6":
        problem = Hartmann(dim=6, negate=True)
    else:
        raise ValueError(f"unknown function {name!r}: use ackley<d> (e.g. ackley20) or hartmann6")
    problem = problem.to(DOUBLE)
    low, high = problem.bounds

    def f(x):
        return problem(low + (high - low) * x).unsqueeze(-1)

    return f, problem.dim


def turbo_modules(d: int):
    """The TuRBO tutorial's kernel and likelihood."""
    kernel = gpytorch.kernels.MaternKernel(nu=2.5, ard_num_dims=d, lengthscale_constraint=Interval(0.005, 4.0))
    likelihood = gpytorch.likelihoods.GaussianLikelihood(noise_constraint=Interval(1e-8, 1e-3))
    return dict(covar_module=gpytorch.kernels.ScaleKernel(kernel), likelihood=likelihood)


class Surrogate:
    """The model of one arm, rebuilt by the loop on all data and fitted every iteration as in BoTorch's tutorials: the
    model class is ``SingleTaskGP`` (``stgp``), ``OnlineGPModel`` (``swap``) or an ``OnlineGPStream`` (``stream``: the
    rebuild is one streaming step, the fit the stream's refit schedule)."""

    def __init__(self, settings: Settings, d: int):
        self.kind, self.loop, self.d = settings.model, settings.loop, d
        self.num_inducing, self.fit_failures = settings.num_inducing, 0
        stream_options = {"num_inducing": settings.num_inducing, "refit_every": settings.refit_every}
        self.stream = OnlineGPStream(**{name: value for name, value in stream_options.items() if value})

    def options(self) -> dict:
        """The tutorial's modules (TuRBO) and the swap's ``num_inducing`` given on the command line."""
        options = turbo_modules(self.d) if self.loop == "turbo" else {}
        if self.kind == "swap" and self.num_inducing:
            options["num_inducing"] = self.num_inducing
        return options

    def update(self, X, Y):
        Model = {"stgp": SingleTaskGP, "swap": OnlineGPModel}.get(self.kind, self.stream)
        model = Model(X, Y, **self.options())
        try:
            with gpytorch.settings.max_cholesky_size(float("inf")):
                fit_gpytorch_mll(ExactMarginalLogLikelihood(model.likelihood, model))
        except ModelFittingError:  # every attempt failed: BoTorch rolled the model back to its initial values
            self.fit_failures += 1
        return model


class TrustRegion:
    """TuRBO-1's trust-region side and its success/failure counters (reset, data kept, when it collapses)."""

    LENGTH, LENGTH_MIN, LENGTH_MAX, SUCCESS_TOLERANCE = 0.8, 0.5**7, 1.6, 10

    def __init__(self, d: int, batch: int, best: float):
        self.failure_tolerance = math.ceil(max(4.0 / batch, d / batch))
        self.best, self.resets = best, 0
        self.reset()

    def reset(self):
        self.length, self.successes, self.failures = self.LENGTH, 0, 0

    def update(self, Y_new):
        if Y_new.max().item() > self.best + 1e-3 * abs(self.best):
            self.successes, self.failures = self.successes + 1, 0
        else:
            self.successes, self.failures = 0, self.failures + 1
        if self.successes == self.SUCCESS_TOLERANCE:
            self.length, self.successes = min(2 * self.length, self.LENGTH_MAX), 0
        elif self.failures == self.failure_tolerance:
            self.length, self.failures = self.length / 2, 0
        self.best = max(self.best, Y_new.max().item())
        if self.length < self.LENGTH_MIN:
            self.reset()
            self.resets += 1


def thompson_batch(model, X, Y, region: TrustRegion, settings: Settings, sobol: SobolEngine):
    """TuRBO-1's Thompson sample of a batch from perturbed Sobol candidates in the trust region."""
    d = X.shape[-1]
    centre = X[Y.argmax()]
    lengthscale = model.covar_module.base_kernel.lengthscale.detach().reshape(-1)
    weights = lengthscale / lengthscale.mean()
    weights = weights / weights.prod().pow(1.0 / d)
    low = (centre - weights * region.length / 2).clamp(0.0, 1.0)
    high = (centre + weights * region.length / 2).clamp(0.0, 1.0)
    count = settings.candidates or min(5000, max(2000, 200 * d))
    perturbed = low + (high - low) * sobol.draw(count).to(DOUBLE)
    mask = torch.rand(count, d, dtype=DOUBLE) <= min(20.0 / d, 1.0)
    empty = mask.sum(dim=1) == 0
    mask[empty, torch.randint(0, d, (int(empty.sum()),))] = True
    candidates = centre.expand(count, d).clone()
    candidates[mask] = perturbed[mask]
    with torch.no_grad(), gpytorch.settings.max_cholesky_size(float("inf")):
        return MaxPosteriorSampling(model=model, replacement=False)(candidates, num_samples=settings.batch)


def qlognei_batch(model, X, settings: Settings):
    """A batch jointly maximising qLogNEI over the unit cube, as BoTorch's closed-loop tutorial."""
    acquisition = qLogNoisyExpectedImprovement(
        model=model,
        X_baseline=X,
        sampler=SobolQMCNormalSampler(sample_shape=torch.Size([settings.mc_samples])),
        prune_baseline=True,
    )
    bounds = torch.stack([torch.zeros(X.shape[-1], dtype=DOUBLE), torch.ones(X.shape[-1], dtype=DOUBLE)])
    with gpytorch.settings.max_cholesky_size(float("inf")):
        candidates, _ = optimize_acqf(
            acquisition,
            bounds=bounds,
            q=settings.batch,
            num_restarts=settings.restarts,
            raw_samples=settings.raw_samples,
            options={"batch_limit": 5, "maxiter": settings.maxiter},
        )
    return candidates.detach()


def peak_memory_mb() -> float:
    """The process's peak resident memory so far (``ru_maxrss``, KiB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run(settings: Settings, emit=None) -> list[dict]:
    """One arm: the loop from the seed's initial design until ``n >= max_n`` (or the SingleTaskGP time budget);
    ``emit(row)`` is called with each row as it is made."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", BotorchWarning)  # the online model's approximation notes, BoTorch's optimiser notes
        warnings.simplefilter("ignore", RuntimeWarning)  # as BoTorch's tutorials
        return run_loop(settings, emit)


def run_loop(settings: Settings, emit=None) -> list[dict]:
    """:func:`run` without its warning filters."""
    if settings.model not in MODELS or settings.loop not in LOOPS:
        raise ValueError(f"model must be one of {MODELS} and loop one of {LOOPS}, got {settings.model!r}, {settings.loop!r}")
    torch.manual_seed(settings.seed)
    f, d = objective(settings.function)
    X = SobolEngine(d, scramble=True, seed=settings.seed).draw(2 * d).to(DOUBLE)
    Y = f(X)
    sobol = SobolEngine(d, scramble=True, seed=settings.seed + 1)
    region = TrustRegion(d, settings.batch, Y.max().item())
    surrogate = Surrogate(settings, d)
    start = time.perf_counter()
    model = surrogate.update(X, Y)
    fit_s, rows, iteration, probed_s = time.perf_counter() - start, [], 0, 0.0
    base = asdict(settings)

    def row(**values):
        values = dict(NO_PROBE, **values)
        return dict(
            base, **values, tr_length=region.length, tr_resets=region.resets, fit_failures=surrogate.fit_failures, peak_mb=peak_memory_mb()
        )

    rows.append(row(iteration=0, n=len(X), best=Y.max().item(), fit_s=fit_s, acq_s=0.0, wall_s=fit_s, stopped=""))
    if emit:
        emit(rows[-1])
    while len(X) < settings.max_n:
        iteration += 1
        tick = time.perf_counter()
        if settings.loop == "turbo":
            X_new = thompson_batch(model, X, Y, region, settings, sobol)
        else:
            X_new = qlognei_batch(model, X, settings)
        acq_s = time.perf_counter() - tick
        Y_new = f(X_new)
        region.update(Y_new)
        X, Y = torch.cat([X, X_new]), torch.cat([Y, Y_new])
        probe = stgp_probe(settings, X, Y, region, sobol) if crossed(settings, len(X)) else {}
        probed_s += sum(probe.values())
        tick = time.perf_counter()
        model = surrogate.update(X, Y)
        fit_s = time.perf_counter() - tick
        over = settings.model != "stream" and fit_s + acq_s > settings.stgp_max_seconds
        stopped = f"iteration took {fit_s + acq_s:.1f} s > {settings.stgp_max_seconds:g} s" if over else ""
        wall_s = time.perf_counter() - start - probed_s  # the stream's own time: probes left out
        rows.append(
            row(iteration=iteration, n=len(X), best=Y.max().item(), fit_s=fit_s, acq_s=acq_s, wall_s=wall_s, stopped=stopped, **probe)
        )
        if emit:
            emit(rows[-1])
        if over:
            break
    return rows


#: the probe's columns in the rows of the iterations without one
NO_PROBE = {"stgp_probe_fit_s": math.nan, "stgp_probe_acq_s": math.nan}


def crossed(settings: Settings, n: int) -> bool:
    """Whether the stream arm's last batch took its data to ``n`` points past one of ``--stgp-probe-at``."""
    at = [int(v) for v in settings.stgp_probe_at.split(",") if v.strip()]
    return settings.model == "stream" and any(n - settings.batch < limit <= n for limit in at)


def stgp_probe(settings: Settings, X, Y, region: TrustRegion, sobol: SobolEngine) -> dict:
    """One ``SingleTaskGP`` iteration of the loop on the stream's data ``(X, Y)``, timed as the ``stgp`` arm's (build and
    ``fit_gpytorch_mll``, then the acquisition), side by side with the stream in the same run where ``SingleTaskGP``'s own
    arm stopped at its time budget; the random state and the Sobol engine are restored, so the stream's run is the
    same with or without probes."""
    rng, engine = torch.get_rng_state(), copy.deepcopy(sobol)
    surrogate = Surrogate(replace(settings, model="stgp"), X.shape[-1])
    tick = time.perf_counter()
    model = surrogate.update(X, Y)
    fit_s = time.perf_counter() - tick
    tick = time.perf_counter()
    if settings.loop == "turbo":
        thompson_batch(model, X, Y, copy.deepcopy(region), settings, engine)
    else:
        qlognei_batch(model, X, settings)
    acq_s = time.perf_counter() - tick
    torch.set_rng_state(rng)
    return {"stgp_probe_fit_s": fit_s, "stgp_probe_acq_s": acq_s}


# ---------------------------------------------------------------------------------------------------- tables
def read_rows(paths) -> list[dict]:
    numeric = {field.name: field.type for field in fields(Settings)}
    rows = []
    for path in paths:
        with open(path, newline="") as handle:
            for row in csv.DictReader(handle):
                for key, value in row.items():
                    if key in ("function", "loop", "model", "stopped", "stgp_probe_at"):
                        continue
                    row[key] = (
                        int(value) if numeric.get(key) == "int" or key in ("iteration", "n", "tr_resets", "fit_failures") else float(value)
                    )
                rows.append(row)
    return rows


def spread(values, runs: int = 0, form: str = ".3g") -> str:
    """``mean (min – max)`` of ``values``, with ``[k/runs]`` where only ``k`` of the ``runs`` have a value."""
    if not values:
        return "–"
    mean, low, high = (format(v, form) for v in (statistics.fmean(values), min(values), max(values)))
    text = mean if len(values) == 1 else f"{mean} ({low} – {high})"
    return text + (f" [{len(values)}/{runs}]" if len(values) < runs else "")


def best_at(run_rows, key, limit, batch):
    """Best value over the rows with ``key <= limit``, if the run reached ``limit`` (``None`` otherwise)."""
    reached = run_rows[-1][key] > limit - (batch if key == "n" else 0) or (key == "wall_s" and run_rows[-1]["n"] >= run_rows[-1]["max_n"])
    inside = [row["best"] for row in run_rows if row[key] <= limit]
    return max(inside) if reached and inside else None


def per_iteration(run_rows, limit, part, batch):
    """Mean seconds of ``part`` over the (up to 10) iterations ending at ``n <= limit``, if the run got there (a
    refit every 10 iterations counts once)."""
    if run_rows[-1]["n"] <= limit - batch:
        return None
    window = [row for row in run_rows if row["iteration"] > 0 and row["n"] <= limit][-10:]
    return statistics.fmean(row[part] for row in window) if window else None


def table(header, lines) -> str:
    lines = [line for line in lines if any(cell != "–" for cell in line[1:])]
    out = ["| " + " | ".join(header) + " |", "| " + " | ".join("---" for _ in header) + " |"]
    out += ["| " + " | ".join(line) + " |" for line in lines]
    return "\n".join(out)


def summarise(rows: list[dict], checkpoints=CHECKPOINTS, wall_times=WALL_TIMES) -> str:
    """The side-by-side tables (markdown) of the runs in ``rows``, per function and loop (rows of the tables where no
    run has a value are left out)."""
    runs = defaultdict(list)
    for row in rows:
        runs[(row["function"], row["loop"], row["model"], row["seed"])].append(row)
    groups = defaultdict(dict)
    for (function, loop, model, seed), run_rows in runs.items():
        groups[(function, loop)].setdefault(model, []).append(sorted(run_rows, key=lambda row: row["iteration"]))
    text = []
    for (function, loop), by_model in sorted(groups.items()):
        models = [m for m in MODELS if m in by_model]
        batch = int(next(iter(by_model.values()))[0][0]["batch"])
        seeds = {m: sorted(int(r[0]["seed"]) for r in by_model[m]) for m in models}
        text.append(
            f"### {function}, {loop}: "
            + "; ".join(f"{LABELS[m]} seeds {seeds[m]}, max n {max(r[-1]['n'] for r in by_model[m])}" for m in models)
        )
        for m in models:
            for r in by_model[m]:
                if r[-1]["stopped"]:
                    text.append(f"- {LABELS[m]} seed {int(r[0]['seed'])} stopped at n = {r[-1]['n']}: {r[-1]['stopped']}")
                if r[-1].get("fit_failures"):
                    text.append(
                        f"- {LABELS[m]} seed {int(r[0]['seed'])}: {r[-1]['fit_failures']} fits failed "
                        "(ModelFittingError: the initial hyperparameters used)"
                    )
        header = ["n"] + [f"{LABELS[m]} best" for m in models]
        lines = [
            [f"{limit:,}"]
            + [spread([v for v in (best_at(r, "n", limit, batch) for r in by_model[m]) if v is not None], len(by_model[m])) for m in models]
            for limit in checkpoints
        ]
        text += [
            "",
            "Best value against evaluations (mean (min – max) over seeds; [k/s]: only k of the s seeds got there):",
            "",
            table(header, lines),
        ]
        header = ["wall s"] + [f"{LABELS[m]} best" for m in models]
        lines = [
            [str(t)]
            + [
                spread([v for v in (best_at(r, "wall_s", t, batch) for r in by_model[m]) if v is not None], len(by_model[m]))
                for m in models
            ]
            for t in wall_times
        ]
        text += ["", "Best value against wall time (seconds since the start, initial fit included):", "", table(header, lines)]
        header = ["n"] + [f"{LABELS[m]} {part}" for m in models for part in ("fit s", "acq s")]
        header += [f"SingleTaskGP / {LABELS[m]}" for m in models if m != "stgp" and "stgp" in models]
        lines = []
        for limit in checkpoints:
            cells, totals = [f"{limit:,}"], {}
            for m in models:
                parts = [
                    [v for v in (per_iteration(r, limit, part, batch) for r in by_model[m]) if v is not None] for part in ("fit_s", "acq_s")
                ]
                cells += [f"{statistics.fmean(values):.3g}" if values else "–" for values in parts]
                totals[m] = statistics.fmean(parts[0]) + statistics.fmean(parts[1]) if parts[0] and parts[1] else None
            for m in models:
                if m != "stgp" and "stgp" in models:
                    cells.append(f"{totals['stgp'] / totals[m]:.2g}×" if totals.get("stgp") and totals.get(m) else "–")
            lines.append(cells)
        text += ["", "Seconds per iteration against n (mean of the 10 iterations up to n, mean over seeds):", "", table(header, lines)]
        header = ["model", "peak memory MB (mean (min – max) over runs)"]
        lines = [[LABELS[m], spread([max(row["peak_mb"] for row in r) for r in by_model[m]], form=",.0f")] for m in models]
        text += ["", table(header, lines), ""]
        if "stgp" in models:
            text += [target(by_model, m, checkpoints, batch) for m in models if m != "stgp"] + [""]
    return "\n".join(text)


def target(by_model, model, checkpoints, batch) -> str:
    """The target, for one online arm: at every ``n`` where ``SingleTaskGP`` ran, the online mean best value at least
    ``SingleTaskGP``'s worst seed; from ``n = 2,000`` on, time per iteration 10x below ``SingleTaskGP``'s (its last
    measured iteration, a lower bound where it stopped before) and flat (at 4,000 within 1.5x of 2,000)."""
    quality = []
    for limit in checkpoints:
        reference = [v for v in (best_at(r, "n", limit, batch) for r in by_model["stgp"]) if v is not None]
        online = [v for v in (best_at(r, "n", limit, batch) for r in by_model[model]) if v is not None]
        if reference and online:
            quality.append(
                f"n = {limit:,}: {statistics.fmean(online):.3g} vs ≥ {min(reference):.3g} "
                f"{'yes' if statistics.fmean(online) >= min(reference) else 'NO'}"
            )
    last = [r[-1] for r in by_model["stgp"]]
    reference_s = statistics.fmean(row["fit_s"] + row["acq_s"] for row in last)

    def mean_seconds(limit):
        runs = by_model[model]
        parts = [[v for v in (per_iteration(r, limit, part, batch) for r in runs) if v is not None] for part in ("fit_s", "acq_s")]
        return statistics.fmean(parts[0]) + statistics.fmean(parts[1]) if parts[0] and parts[1] else None

    seconds = {limit: mean_seconds(limit) for limit in (2000, 4000) if mean_seconds(limit) is not None}
    cost = ", ".join(f"n = {limit:,}: {s:.3g} s ({reference_s / s:.2g}× below)" for limit, s in seconds.items())
    flat = f"; 4,000 / 2,000: {seconds[4000] / seconds[2000]:.2f}" if len(seconds) == 2 else ""
    probes = []
    for limit in sorted({int(v) for r in by_model[model] for v in str(r[0].get("stgp_probe_at", "")).split(",") if v.strip()}):
        rows = [row for r in by_model[model] for row in r if row["n"] - batch < limit <= row["n"]]
        probed = [row for row in rows if not math.isnan(row.get("stgp_probe_fit_s", math.nan))]
        stream_s = mean_seconds(limit)
        if probed and stream_s:
            probe_s = statistics.fmean(row["stgp_probe_fit_s"] + row["stgp_probe_acq_s"] for row in probed)
            probes.append(f"n = {limit:,}: {probe_s:.3g} s against {stream_s:.3g} s ({probe_s / stream_s:.2g}× below, {len(probed)} runs)")
    probed_text = f" One SingleTaskGP iteration timed on the stream's data (--stgp-probe-at): {'; '.join(probes)}." if probes else ""
    return (
        f"Target, {LABELS[model]}: best value at least SingleTaskGP's worst seed — {'; '.join(quality) or 'no common n'}. "
        f"Time per iteration against SingleTaskGP's last iteration, the one over its budget ({reference_s:.3g} s at "
        f"n = {statistics.fmean(row['n'] for row in last):.0f}): {cost or 'n < 2,000'}{flat}.{probed_text}"
    )


#: the smallest setting (no time budget: the rows a run makes never depend on the machine's load)
SMOKE = dict(
    function="ackley4", max_n=24, batch=4, candidates=64, restarts=2, raw_samples=16, maxiter=10, mc_samples=16, stgp_max_seconds=math.inf
)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    defaults = Settings()
    for field in fields(Settings):
        parser.add_argument(
            "--" + field.name.replace("_", "-"), type=type(getattr(defaults, field.name)), default=getattr(defaults, field.name)
        )
    parser.add_argument("--out", help="CSV of the run's rows, one per iteration")
    parser.add_argument("--summarise", nargs="+", metavar="CSV", help="print the tables of saved runs")
    parser.add_argument("--smoke", action="store_true", help="every loop and model on a tiny setting, in seconds")
    args = parser.parse_args(argv)
    if args.summarise:
        text = summarise(read_rows(args.summarise))
        print(text)
        return text
    torch.set_num_threads(1)
    settings = Settings(**{field.name: getattr(args, field.name) for field in fields(Settings)})
    arms = [replace(settings, **SMOKE, loop=loop, model=model) for loop in LOOPS for model in MODELS] if args.smoke else [settings]
    rows, handle = [], open(args.out, "w", newline="") if args.out else None
    writer = None

    def emit(row):
        nonlocal writer
        if handle is None:
            return
        writer = writer or csv.DictWriter(handle, fieldnames=list(row))
        if handle.tell() == 0:
            writer.writeheader()
        writer.writerow(row)
        handle.flush()
        if row["iteration"] % 25 == 0:
            print(
                f"  n = {row['n']}, best {row['best']:.4g}, fit {row['fit_s']:.2f} s, acquisition {row['acq_s']:.2f} s, "
                f"{row['wall_s']:.0f} s",
                flush=True,
            )

    for arm in arms:
        rows += run(arm, emit)
        last = rows[-1]
        print(
            f"{arm.function} {arm.loop} {arm.model} seed {arm.seed}: n = {last['n']}, best {last['best']:.4g}, "
            f"{last['wall_s']:.1f} s, peak {last['peak_mb']:.0f} MB {last['stopped']}"
        )
    if handle is not None:
        handle.close()
    if args.smoke:
        print(summarise(rows, checkpoints=(16, 24), wall_times=(10,)))
    return rows


if __name__ == "__main__":
    main()
