"""Temperature scaling (Guo et al. 2017), fitted on a validation set (thesis ch. 3 "TS" baseline)."""

from __future__ import annotations

import torch


class TemperatureScaling(torch.nn.Module):
    r"""Rescales logits by :math:`1 / T` with :math:`T = \exp(\mathtt{log\_temperature})` chosen to minimise validation NLL.

    Parameterising :math:`\log T` keeps :math:`T > 0`; :meth:`fit` runs L-BFGS with a strong-Wolfe line search
    on the mean cross-entropy of ``logits / T``.
    """

    def __init__(self):
        super().__init__()
        self.log_temperature = torch.nn.Parameter(torch.zeros((), dtype=torch.float64))

    @property
    def temperature(self) -> float:
        return float(self.log_temperature.detach().exp())

    @staticmethod
    def _check(logits, labels):
        if not isinstance(logits, torch.Tensor) or logits.dim() != 2 or logits.shape[1] < 2:
            raise ValueError(f"logits must be an N x C tensor with C >= 2, got {getattr(logits, 'shape', logits)}")
        if not torch.isfinite(logits).all():
            raise ValueError("logits contains NaN or infinite values")
        if labels is not None:
            if not isinstance(labels, torch.Tensor) or labels.shape != logits.shape[:1]:
                raise ValueError(f"labels must be a tensor of shape ({logits.shape[0]},)")
            if (labels < 0).any() or (labels >= logits.shape[1]).any():
                raise ValueError(f"labels must lie in [0, {logits.shape[1]})")

    def fit(self, logits: torch.Tensor, labels: torch.Tensor, max_iter: int = 100) -> TemperatureScaling:
        r"""Fit :math:`T` on held-out ``logits`` (``N x C``) and integer ``labels`` (``N``); returns ``self``.

        :param logits: the held-out (validation) logits, ``(N, C)`` with :math:`C \ge 2`, finite.
        :param labels: the held-out classes, ``(N,)`` integers in ``[0, C)``.
        :param max_iter: the most L-BFGS iterations, a positive int (default 100).
        """
        self._check(logits, labels)
        if isinstance(max_iter, bool) or not isinstance(max_iter, int) or max_iter < 1:
            raise ValueError(f"max_iter must be a positive integer, got {max_iter!r}")
        logits = logits.detach().double()
        labels = labels.detach().long()
        optimizer = torch.optim.LBFGS(
            [self.log_temperature], lr=1.0, max_iter=max_iter, tolerance_grad=1e-10, tolerance_change=1e-12, line_search_fn="strong_wolfe"
        )

        def closure():
            optimizer.zero_grad()
            loss = torch.nn.functional.cross_entropy(logits * torch.exp(-self.log_temperature), labels)
            loss.backward()
            return loss

        optimizer.step(closure)
        return self

    def forward(self, logits: torch.Tensor) -> torch.Tensor:
        r"""Calibrated logits :math:`\text{logits} / T` (same dtype as the input).

        :param logits: the logits to calibrate, ``(N, C)``, finite.
        """
        self._check(logits, None)
        return logits / self.log_temperature.exp().to(logits.dtype)

    def predict_proba(self, logits: torch.Tensor) -> torch.Tensor:
        r"""Calibrated class probabilities :math:`\\operatorname{softmax}(\text{logits} / T)`.

        :param logits: the logits to calibrate, ``(N, C)``, finite.
        """
        return self.forward(logits).softmax(-1)
