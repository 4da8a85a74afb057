"""Elastic weight consolidation (Kirkpatrick et al. 2017) for the SVGPVAE's networks (thesis §4.6.3,
App. C): a quadratic penalty that keeps the encoder and decoder near their values after earlier
tasks, weighted by the diagonal of the Fisher information estimated on each finished task."""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import Tensor

__all__ = ["ElasticWeightConsolidation", "fisher_diagonal"]


def fisher_diagonal(parameters: list[torch.nn.Parameter], sample_log_likelihoods: Iterable[Tensor]) -> list[Tensor]:
    r"""Empirical Fisher diagonal :math:`F = \sum_n (\partial \log p(y_n \mid \theta) / \partial \theta)^2` over the given samples.

    :param parameters: the parameters :math:`\theta`.
    :param sample_log_likelihoods: one scalar :math:`\log p(y_n \mid \theta)` (with its graph) per sample :math:`n`;
        for the SVGPVAE a sample is a chunk of consecutive time points of the finished task.
    :return: one tensor per parameter, shaped like it (the sum over samples, so :math:`F` grows with
        the amount of data like the log-likelihood it approximates).
    """
    parameters = list(parameters)
    if not parameters:
        raise ValueError("parameters must not be empty")
    fisher = [torch.zeros_like(p) for p in parameters]
    count = 0
    for log_likelihood in sample_log_likelihoods:
        if not isinstance(log_likelihood, Tensor) or log_likelihood.dim() != 0:
            raise ValueError("each sample log-likelihood must be a scalar tensor")
        grads = torch.autograd.grad(log_likelihood, parameters, allow_unused=True)
        for f, g in zip(fisher, grads):
            if g is not None:
                f.add_(g.detach().square())
        count += 1
    if count == 0:
        raise ValueError("sample_log_likelihoods must hold at least one sample")
    return fisher


class ElasticWeightConsolidation(torch.nn.Module):
    r"""EWC penalty :math:`(\lambda/2) \sum_i F_i (\theta_i - \theta^*_i)^2` over the parameters of ``modules``.

    After each task :meth:`consolidate` adds that task's Fisher diagonal to :math:`F` and moves the
    anchor :math:`\theta^*` to the current parameters (the running-sum form of EWC, Huszár 2018: one
    quadratic instead of one per task). Before the first task the penalty is zero.

    :param modules: the networks to protect (the SVGPVAE's encoder and decoder).
    :param strength: :math:`\lambda \ge 0`.
    """

    num_consolidated: Tensor

    def __init__(self, modules: Iterable[torch.nn.Module], strength: float = 1.0):
        super().__init__()
        if not float(strength) >= 0:
            raise ValueError(f"strength must be a non-negative float, got {strength!r}")
        self.protected = torch.nn.ModuleList(modules)
        if not list(self.protected.parameters()):
            raise ValueError("modules must hold at least one parameter")
        self.strength = float(strength)
        self.register_buffer("num_consolidated", torch.tensor(0))
        for index, p in enumerate(self.protected.parameters()):
            self.register_buffer(f"anchor_{index}", torch.zeros_like(p))
            self.register_buffer(f"fisher_{index}", torch.zeros_like(p))

    def _buffers_for(self, kind: str) -> list[Tensor]:
        return [getattr(self, f"{kind}_{index}") for index, _ in enumerate(self.protected.parameters())]

    @property
    def anchors(self) -> list[Tensor]:
        return self._buffers_for("anchor")

    @property
    def fisher(self) -> list[Tensor]:
        return self._buffers_for("fisher")

    @torch.no_grad()
    def consolidate(self, task_fisher: list[Tensor]) -> None:
        r"""Add a finished task's Fisher diagonal (from :func:`fisher_diagonal`) and anchor at the current :math:`\theta`.

        :param task_fisher: one non-negative tensor per protected parameter, shaped like it.
        """
        parameters = list(self.protected.parameters())
        if len(task_fisher) != len(parameters) or any(f.shape != p.shape for f, p in zip(task_fisher, parameters)):
            raise ValueError("task_fisher must hold one tensor per protected parameter, shaped like it")
        if any((new < 0).any() for new in task_fisher):
            raise ValueError("task_fisher must be non-negative")
        for p, anchor, fisher, new in zip(parameters, self.anchors, self.fisher, task_fisher):
            anchor.copy_(p.detach())
            fisher.add_(new.to(fisher))
        self.num_consolidated += 1

    def penalty(self) -> Tensor:
        r""":math:`\frac{\lambda}{2} \sum_i F_i (\theta_i - \theta^*_i)^2` (a differentiable scalar; zero before the first
        consolidation)."""
        parameters = list(self.protected.parameters())
        total = parameters[0].new_zeros(())
        for p, anchor, fisher in zip(parameters, self.anchors, self.fisher):
            total = total + (fisher * (p - anchor).square()).sum()
        return 0.5 * self.strength * total
