"""Deep ensembles (Lakshminarayanan et al. 2017) and SGPA ensembles (thesis ch. 3 "DE", "SGPAE")."""

from __future__ import annotations

from typing import cast

import torch

from .prediction import predict_proba


class EnsembleClassifier(torch.nn.Module):
    r"""Averages the predictive class probabilities of :math:`K` independently trained classifiers.

    With MLE members this is a deep ensemble; with SGPA members (each averaging its own Monte-Carlo
    samples) it is an SGPA ensemble: :math:`p(y \mid x) = \frac{1}{K} \sum_k p_k(y \mid x)`.

    :param members: the ``K`` trained classifiers (``torch.nn.Module``), a non-empty sequence.
    """

    def __init__(self, members):
        super().__init__()
        members = list(members)
        if not members or not all(isinstance(m, torch.nn.Module) for m in members):
            raise ValueError("members must be a non-empty sequence of torch.nn.Module classifiers")
        self.members = torch.nn.ModuleList(members)

    @torch.no_grad()
    def predict_proba(self, *inputs, num_samples: int = 1, **forward_kwargs) -> torch.Tensor:
        """Mean over members of each member's predictive probabilities (``num_samples`` per member).

        :param num_samples: the forward passes (posterior samples) averaged per member, a positive int (default 1).
        """
        total: torch.Tensor | None = None
        for member in self.members:
            probs = predict_proba(member, *inputs, num_samples=num_samples, **forward_kwargs)
            total = probs if total is None else total + probs
        return cast(torch.Tensor, total) / len(self.members)  # the ensemble has members (checked when built)

    def forward(self, *inputs, **forward_kwargs):
        raise TypeError("EnsembleClassifier has no single forward pass; call predict_proba")
