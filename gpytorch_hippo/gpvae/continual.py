r"""Continual SVGPVAE on a stream of tasks (thesis §4.6.3, App. C.3): OHSVGP, OSVGP, OVC and OVC-per-dim.

All four share the model (:class:`~gpytorch_hippo.gpvae.SVGPVAE`) and its objective, the SVGPVAE ELBO
of Jazbec et al. (2021) -- :math:`q(u)` amortised, computed in closed form from the current task's
encodings, with its KL to the prior :math:`p(u)` -- plus EWC on the encoder and decoder. The kernel
hyperparameters are trained on the first task and kept fixed thereafter, as in the thesis. Nothing
about :math:`q(u)` is stored between tasks: the memory is in the EWC-protected networks and the inducing
variables. The variants differ only in those inducing variables between tasks:

* ``ohsvgp``: HiPPO-LegS inducing variables over ``[start, t]``, advanced to each task's end
  (``InterdomainVariationalStrategy.advance``);
* ``osvgp``: ``M`` learnable inducing points (all the times of a first task shorter than that),
  re-drawn at random for each task from the old points and the new task's times (Bui et al. 2017's
  initialisation), shared by the ``L`` channels;
* ``ovc``: at most ``M`` fixed points chosen by pivoted Cholesky from the old points and the new times
  (:func:`~gpytorch_hippo.inducing.selection.select_pivoted_cholesky`), shared by the channels;
* ``ovc-per-dim``: the same with one kernel and one set of points per latent channel.

Two departures from the thesis are options: ``online_kl=True`` adds the online-ELBO term of the
non-amortised models (thesis eq. (4.6)), :math:`\mathrm{KL}(\tilde q(a) \,\|\, q_{\mathrm{old}}(a))` against the :math:`q(u)` encoded from
the whole finished task, and ``retrain_kernel=True`` trains the kernel on every task.
"""

from __future__ import annotations

import math

import gpytorch
import torch
from torch import Tensor

from ..inducing import HiPPOInducingVariables, InducingPoints
from ..inducing.selection import select_pivoted_cholesky
from ..metrics import interval_ece, nlpd_from_log_density, rmse
from .ewc import ElasticWeightConsolidation, fisher_diagonal
from .model import SVGPVAE, LatentGP

__all__ = ["METHODS", "ContinualSVGPVAE"]

#: The continual-learning methods of :class:`ContinualSVGPVAE` (``method=``).
METHODS = ("ohsvgp", "osvgp", "ovc", "ovc-per-dim")


class ContinualSVGPVAE:
    r"""Trains one SVGPVAE task by task and evaluates it on held-out entries of any task.

    :param method: one of :data:`METHODS`.
    :param observation_dim: :math:`D`.
    :param latent_dim: :math:`L` latent GP channels.
    :param num_inducing: :math:`M` (per channel for ``ovc-per-dim``).
    :param lengthscale: initial RBF length scale of the latent GPs (in the units of ``times``).
    :param hidden_dim: width of the MLPs.
    :param num_iter: full-batch Adam steps per task.
    :param lr: Adam learning rate (thesis: 0.005).
    :param ewc_strength: EWC's :math:`\lambda` (``1`` is the Laplace approximation's weight).
    :param fisher_chunk: time points per sample of the empirical Fisher.
    :param seed: seeds the networks, the inducing-point draws and the reparameterisation.
    :param dtype: of the networks and the GP.
    :param online_kl: add the online-ELBO term :math:`\mathrm{KL}(\tilde q(a) \| q_{old}(a))` with :math:`q_{old}` encoded from each
        finished task (module docstring; ``False``, the default, is the thesis's objective).
    :param retrain_kernel: train the kernel hyperparameters on every task (``False``, the default: on
        the first task only, as the thesis).
    """

    def __init__(
        self,
        method: str,
        observation_dim: int,
        latent_dim: int = 4,
        num_inducing: int = 20,
        lengthscale: float = 1.0,
        hidden_dim: int = 32,
        num_iter: int = 200,
        lr: float = 0.005,
        ewc_strength: float = 1.0,
        fisher_chunk: int = 16,
        seed: int = 0,
        dtype: torch.dtype = torch.float64,
        online_kl: bool = False,
        retrain_kernel: bool = False,
    ):
        if method not in METHODS:
            raise ValueError(f"method must be one of {METHODS}, got {method!r}")
        for name, value in (("latent_dim", latent_dim), ("num_inducing", num_inducing), ("fisher_chunk", fisher_chunk)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if isinstance(num_iter, bool) or not isinstance(num_iter, int) or num_iter < 0:
            raise ValueError(f"num_iter must be a non-negative int, got {num_iter!r}")
        if not lengthscale > 0:
            raise ValueError(f"lengthscale must be positive, got {lengthscale!r}")
        self.method = method
        self.observation_dim = observation_dim
        self.latent_dim = latent_dim
        self.num_inducing = num_inducing
        self.lengthscale = float(lengthscale)
        self.hidden_dim = hidden_dim
        self.num_iter = num_iter
        self.lr = lr
        self.ewc_strength = ewc_strength
        self.fisher_chunk = fisher_chunk
        self.dtype = dtype
        self.online_kl = bool(online_kl)
        self.retrain_kernel = bool(retrain_kernel)
        self.generator = torch.Generator().manual_seed(seed)
        self.seed = seed
        self.model: SVGPVAE | None = None
        self.ewc: ElasticWeightConsolidation | None = None
        self.num_tasks = 0
        self._last_time = -math.inf

    # ------------------------------------------------------------------ inducing variables
    def _kernel(self) -> gpytorch.kernels.Kernel:
        batch_shape = torch.Size([self.latent_dim]) if self.method == "ovc-per-dim" else torch.Size([])
        kernel = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel(batch_shape=batch_shape), batch_shape=batch_shape)
        kernel.base_kernel.lengthscale = self.lengthscale
        return kernel.to(self.dtype)

    def _points(self, kernel: gpytorch.kernels.Kernel, old_points: Tensor | None, times: Tensor) -> InducingPoints:
        candidates = times.reshape(-1, 1)
        if old_points is not None:
            candidates = torch.cat([old_points.reshape(-1, 1), candidates])
        num = min(self.num_inducing, candidates.shape[0])  # a first task shorter than M: all its times, then up to M
        if self.method == "osvgp":
            pick = torch.randperm(candidates.shape[0], generator=self.generator)[:num]
            return InducingPoints(candidates[pick].sort(dim=0).values.clone(), learn=True)
        chosen = select_pivoted_cholesky(kernel, candidates, num)
        return InducingPoints(chosen.sort(dim=-2).values.clone(), learn=False)

    def _build(self, times: Tensor) -> None:
        torch.manual_seed(self.seed)
        kernel = self._kernel()
        if self.method == "ohsvgp":
            inducing = HiPPOInducingVariables(self.num_inducing, "legs", t=float(times[-1]), start=min(0.0, float(times[0])))
        else:
            inducing = self._points(kernel, None, times)
        latent_gp = LatentGP(inducing.to(self.dtype), kernel, self.latent_dim)
        self.model = SVGPVAE(self.observation_dim, latent_gp, hidden_dim=self.hidden_dim, online_kl=self.online_kl).to(self.dtype)
        self.ewc = ElasticWeightConsolidation([self.model.encoder, self.model.decoder], self.ewc_strength)

    def _fitted(self) -> tuple[SVGPVAE, ElasticWeightConsolidation]:
        """The model and its EWC penalty, which the first :meth:`fit_task` builds."""
        if self.model is None or self.ewc is None:
            raise RuntimeError("no task has been fit yet: call fit_task first")
        return self.model, self.ewc

    def _move_inducing_variables(self, times: Tensor) -> None:
        strategy = self._fitted()[0].latent_gp.variational_strategy
        if self.method == "ohsvgp":
            strategy.advance(float(times[-1]))
        else:
            old = strategy.inducing_variables.points.detach()
            strategy.replace_inducing_variables(self._points(strategy.kernel, old, times).to(self.dtype))

    # ------------------------------------------------------------------ one task
    def fit_task(self, times: Tensor, y: Tensor, mask: Tensor | None = None) -> None:
        """Train on one task (its ``times``, ``y`` with NaN or ``mask=False`` at unobserved
        entries), then store EWC's Fisher and anchor (and, with ``online_kl``, the GP's ``q_old``).
        After the first task the kernel is frozen unless ``retrain_kernel``.

        :param times: the task's times ``(T,)``, strictly increasing, after the previous task's last time.
        :param y: its observations ``(T, D)``, NaN at unobserved entries.
        :param mask: ``(T, D)`` bool, ``True`` at observed entries; ``None`` (default): where ``y`` is not NaN.
        """
        times, y = times.to(self.dtype), y.to(self.dtype)
        if self.model is None:
            self._build(times)
        else:
            if not float(times[0]) > self._last_time:
                raise ValueError(
                    f"times of a new task must start after the previous task's end {self._last_time:g}, got {float(times[0]):g}"
                )
            self._move_inducing_variables(times)
        model, ewc = self._fitted()
        model.train()
        if self.num_tasks == 1 and not self.retrain_kernel:
            model.latent_gp.covar_module.requires_grad_(False)
        optimizer = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=self.lr)
        with torch.random.fork_rng():
            torch.manual_seed(self.seed * 1000 + self.num_tasks)
            for _ in range(self.num_iter):
                optimizer.zero_grad()
                loss = (ewc.penalty() - model.elbo_terms(times, y, mask).elbo) / times.shape[0]
                loss.backward()
                optimizer.step()
            self._end_task(times, y, mask)
        self._last_time = float(times[-1])
        self.num_tasks += 1

    def _end_task(self, times: Tensor, y: Tensor, mask: Tensor | None) -> None:
        model, ewc = self._fitted()
        chunks = [slice(i, i + self.fisher_chunk) for i in range(0, times.shape[0], self.fisher_chunk)]
        masks = [None] * len(chunks) if mask is None else [mask[c] for c in chunks]
        parameters = list(ewc.protected.parameters())
        samples = (model.elbo_terms(times[c], y[c], m).reconstruction for c, m in zip(chunks, masks))
        ewc.consolidate(fisher_diagonal(parameters, samples))
        if self.online_kl:
            with torch.no_grad():
                model.encode_posterior(times, y, mask)
                model.gp_objective.end_task()

    # ------------------------------------------------------------------ evaluation
    @torch.no_grad()
    def evaluate(self, times: Tensor, y_observed: Tensor, y_test: Tensor, num_samples: int = 100) -> dict[str, float]:
        r"""NLPD, RMSE and interval ECE on the finite entries of ``y_test``, with :math:`q(u)` encoded
        from the finite entries of ``y_observed`` (NaN elsewhere); the predictive of an entry is the
        mixture over ``num_samples`` latent draws of :math:`\mathcal{N}(\varphi(f_t)_d, \sigma_d^2)`.

        :param times: the times ``(T,)`` of the entries.
        :param y_observed: the entries to encode ``(T, D)``, NaN elsewhere.
        :param y_test: the held-out entries ``(T, D)`` to score, NaN elsewhere.
        :param num_samples: the number of latent draws (default 100).
        :return: ``{"nlpd": ..., "rmse": ..., "ece": ...}``.
        """
        if self.model is None:
            raise RuntimeError("fit_task must be called before evaluate")
        times, y_observed, y_test = times.to(self.dtype), y_observed.to(self.dtype), y_test.to(self.dtype)
        if y_test.shape != y_observed.shape:
            raise ValueError(f"y_test must have the shape of y_observed {tuple(y_observed.shape)}, got {tuple(y_test.shape)}")
        test = ~torch.isnan(y_test)
        if not test.any():
            raise ValueError("y_test has no finite entries to evaluate")
        self.model.eval()
        with torch.random.fork_rng():
            torch.manual_seed(self.seed)
            decoded = self.model.predictive_samples(times, y_observed, num_samples=num_samples)[:, test]  # (S, N)
            noise = self.model.noise.expand_as(y_test)[test]
            target = y_test[test]
            log_density = -0.5 * (torch.log(2 * math.pi * noise) + (target - decoded).square() / noise)
            log_density = torch.logsumexp(log_density, dim=0) - math.log(num_samples)
            samples = decoded + noise.sqrt() * torch.randn_like(decoded)
        return {
            "nlpd": nlpd_from_log_density(log_density),
            "rmse": rmse(decoded.mean(0), target),
            "ece": interval_ece(samples, target),
        }
