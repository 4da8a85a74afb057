"""Deep ensembles (Lakshminarayanan et al. 2017) and SGPA ensembles (thesis ch. 3 "DE", "SGPAE")."""

from __future__ import annotations

import torch

from .prediction import predict_proba


class EnsembleClassifier(torch.nn.Module):
    """Averages the predictive class probabilities of ``K`` independently trained classifiers.

    With MLE members this is a deep ensemble; with SGPA members (each averaging its own Monte-Carlo
    samples) it is an SGPA ensemble: ``p(y|x) = (1/K) sum_k p_k(y|x)``.
    """

    def __init__(self, members):
        super().__init__()
        members = list(members)
        if not members or not all(isinstance(m, torch.nn.Module) for m in members):
            raise ValueError("members must be a non-empty sequence of torch.nn.Module classifiers")
        self.members = torch.nn.ModuleList(members)

    @torch.no_grad()
    def predict_proba(self, *inputs, num_samples: int = 1, **forward_kwargs) -> torch.Tensor:
        """Mean over members of each member's predictive probabilities (``num_samples`` per member)."""
        total = None
        for member in self.members:
            probs = predict_proba(member, *inputs, num_samples=num_samples, **forward_kwargs)
            total = probs if total is None else total + probs
        return total / len(self.members)

    def forward(self, *inputs, **forward_kwargs):
        raise TypeError("EnsembleClassifier has no single forward pass; call predict_proba")
