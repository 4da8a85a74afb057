r"""Training objective for SGPA Transformers, thesis eq. (3.18) (derivation in App. B.1.2).

Per data point (sequence) the objective is the Monte-Carlo expected log-likelihood minus the
weighted KL, :math:`\mathrm{ELBO} = \mathrm{ELL} - w_t \, \mathrm{KL}_\mathrm{weighted}` with

.. math::

    \mathrm{ELL} = \frac{1}{B} \sum_b \frac{1}{S} \sum_s \log p\big(y_b \mid F_b^{L,(s)}\big)

where :math:`F^{L,(s)}` are the outputs of :math:`S` reparameterised forward passes through the
:math:`L` layers and :math:`w_t = \beta \min(1, t / \mathrm{anneal\_steps})` after :math:`t` training updates
(:math:`w_t = \beta` when ``anneal_steps = 0``).  The model's ``kl_total`` is the sum over layers and
heads of the per-sequence KL averaged over the batch, :math:`\mathrm{KL}_a + \mathrm{KL}_g`: the amortised inducing
variables are per sequence (:math:`\mathrm{KL}_a`, batch mean), the global ones are shared by all :math:`N`
sequences (:math:`\mathrm{KL}_g`, the model's ``global_kl()``).  ``kl_weighting`` chooses :math:`\mathrm{KL}_\mathrm{weighted}`:

* ``"all-over-n"`` (default): :math:`(\mathrm{KL}_a + \mathrm{KL}_g) / N`, GPyTorch's ``VariationalELBO`` scaling
  applied to all of it;
* ``"decomposed"``: :math:`\mathrm{KL}_a + \mathrm{KL}_g / N`, the exact ELBO of the data set divided by :math:`N` (eq.
  ``elbo`` summed over sequences, the global KL counted once);
* ``"authors"``: :math:`\mathrm{KL}_a + \mathrm{KL}_g` per sequence, as the authors' public code (used with annealing).

Why ``"all-over-n"`` is the default: it is the only weighting that trained in every measured
setting (docs/project_results.md).  With the amortised KL weighed by 1 (``"decomposed"``,
``"authors"``) a sequence's amortised KL (tokens x heads x layers terms) outweighs its one
label's log-likelihood, and the attention outputs collapse to the prior: chance accuracy on
630-4,000 training images, 0.63 vs 0.82 accuracy on 8,000 Fashion-MNIST images after 40 epochs.

:class:`SGPAELBO` returns the **ELBO**, as ``gpytorch.mlls`` objects do: train by minimising its
negative.
"""

from __future__ import annotations

import math

import gpytorch
import torch
import torch.nn.functional as F
from gpytorch.likelihoods import GaussianLikelihood, LaplaceLikelihood, Likelihood
from torch import Tensor, nn

from probseq._validation import check_real, check_tensor

from ._validation import check_finite, checks_on_host
from .attention import SGPAttention
from .dropin import global_kl_divergence
from .model_loss import attach_elbo

__all__ = ["SGPAELBO", "LIKELIHOODS", "IGNORE_INDEX", "KL_WEIGHTINGS"]

#: The likelihoods of :class:`SGPAELBO` (``likelihood=``).
LIKELIHOODS = ("categorical", "gaussian", "laplace")
#: How :class:`SGPAELBO` weighs the KL terms (``kl_weighting=``; module docstring).
KL_WEIGHTINGS = ("decomposed", "all-over-n", "authors")
#: Token targets to skip (padding), as in :func:`torch.nn.functional.cross_entropy`.
IGNORE_INDEX = -100


class SGPAELBO(gpytorch.Module):
    r"""ELBO per sequence of an SGPA model (thesis eq. (3.18)) with linear KL annealing.

    ``value = elbo(outputs, kl, targets)`` (train with ``(-value).backward()``): ``outputs`` are logits ``(..., B, C)`` or regression
    outputs ``(..., B, D)`` where leading dimensions index Monte-Carlo samples; ``kl`` is the
    model's ``kl_total``; ``targets`` are class indices ``(B,)`` or values ``(B, D)`` / ``(B,)``.
    For sequence models (:class:`~gpytorch_sgpa.transformer.SGPADecoder`) ``targets`` may be token
    sequences ``(B, L)`` with logits ``(..., B, L, C)``: a data point is a sequence, its
    log-likelihood the sum over positions whose target is not ``IGNORE_INDEX`` (-100).

    ``likelihood``: ``"categorical"`` (default for classification models), ``"laplace"`` (default
    for regression, scale ``b`` learnt, thesis App. B.2 ZINC), ``"gaussian"`` (noise learnt), or a
    GPyTorch likelihood whose ``forward(f)`` returns a distribution with ``log_prob``.  The model
    and the likelihood are submodules, so ``elbo.parameters()`` holds everything to optimise.
    ``kl_weighting`` is one of :data:`KL_WEIGHTINGS` (module docstring); ``"decomposed"`` needs
    the model's ``global_kl()`` (the package's Transformers have it) or, for any other model with
    SGPA layers (e.g. after :func:`gpytorch_sgpa.convert`), reads their global KL of the current
    forward pass (:func:`gpytorch_sgpa.global_kl_divergence`); pass ``kl`` =
    :func:`gpytorch_sgpa.kl_divergence` of the model then.

    ``beta``: the KL weight :math:`\beta` (a number :math:`\ge 0`), or ``"auto"`` (categorical likelihood only): at the
    first call :math:`\beta = \min(1, 0.1\, P \log C / \mathrm{KL}_\mathrm{weighted})`, fixed from then on (and saved with the state
    dict as ``chosen_beta``), so that the KL term starts at a tenth of the cross-entropy :math:`P \log C` of a
    uniform prediction over :math:`C` classes (:math:`P`: scored positions per sequence, 1 for class labels).
    Use it to fine-tune a converted model: its KL per sequence is the RKHS norm of the trained
    attention outputs, :math:`R = \mathrm{KL} / (N \log C)` times the cross-entropy of a uniform prediction, and with
    :math:`\beta = 1` fine-tuning loses accuracy once :math:`R` reaches about 10 (a ViT-B on ImageNet) and 13 points
    of it at :math:`R = 700` (a ViT-B on 50,000 images), where ``"auto"`` loses none
    (``benchmarks/sgpa_kl_weight.py``).

    :param model: the SGPA model whose outputs and KL are scored (a submodule of the ELBO).
    :param num_data: the training set's size :math:`N` (sequences), which scales the global KL.
    :param beta: the KL weight :math:`\beta \ge 0`, or ``"auto"`` (above).
    :param anneal_steps: the training updates over which the KL weight grows linearly from 0 to
        :math:`\beta` (0: no annealing).
    :param likelihood: ``"categorical"``, ``"laplace"``, ``"gaussian"`` or a GPyTorch likelihood
        (above; ``None``: categorical for classification models, Laplace for regression).
    :param kl_weighting: one of :data:`KL_WEIGHTINGS`, how the KL is weighted per sequence (module docstring).

    The annealing counter advances by one at each call made with the model in training mode and
    gradients enabled.

    Values are checked (class range; ``outputs``, ``kl`` and regression targets free of NaN/Inf) in
    eager mode on the CPU; on accelerators and under ``torch.compile`` the check would stall the
    device or break the graph, so it is skipped: an out-of-range class index then fails in
    ``gather`` (a device-side assertion on CUDA) and a ``NaN`` input makes the ELBO ``NaN``.
    """

    __call__ = nn.Module.__call__  # gpytorch.Module's __call__ would skip forward hooks

    def __init__(
        self,
        model: nn.Module,
        num_data: int,
        beta: float | str = 1.0,
        anneal_steps: int = 0,
        likelihood: str | Likelihood | None = None,
        kl_weighting: str = "all-over-n",
    ):
        super().__init__()
        if not isinstance(model, nn.Module):
            raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
        if isinstance(num_data, bool) or not isinstance(num_data, int) or num_data < 1:
            raise ValueError(f"num_data must be a positive int, got {num_data!r}")
        if isinstance(beta, str):
            if beta != "auto":
                raise ValueError(f"beta must be a number >= 0 or 'auto', got {beta!r}")
        else:
            check_real(beta, "beta", low=0.0)
        if isinstance(anneal_steps, bool) or not isinstance(anneal_steps, int) or anneal_steps < 0:
            raise ValueError(f"anneal_steps must be an int >= 0, got {anneal_steps!r}")
        if not isinstance(kl_weighting, str) or kl_weighting not in KL_WEIGHTINGS:
            raise ValueError(f"kl_weighting must be one of {KL_WEIGHTINGS}, got {kl_weighting!r}")
        if (
            kl_weighting == "decomposed"
            and not callable(getattr(model, "global_kl", None))
            and not any(isinstance(m, SGPAttention) for m in model.modules())
        ):
            raise TypeError(
                f"kl_weighting='decomposed' needs model.global_kl() or SGPAttention layers whose global KL "
                f"it collects (the KL shared by all sequences); {type(model).__name__} has neither: pass "
                "kl_weighting='all-over-n' or 'authors'"
            )
        self.kl_weighting = kl_weighting
        task = getattr(model, "task", "classification")
        if likelihood is None:
            likelihood = "categorical" if task in ("classification", "language_model") else "laplace"
        if isinstance(likelihood, str):
            if likelihood not in LIKELIHOODS:
                raise ValueError(f"likelihood must be one of {LIKELIHOODS} or a GPyTorch likelihood, got {likelihood!r}")
            self.likelihood_name = likelihood
            self.likelihood = {"categorical": None, "gaussian": GaussianLikelihood, "laplace": LaplaceLikelihood}[likelihood]
            if self.likelihood is not None:
                self.likelihood = self.likelihood()
        elif isinstance(likelihood, Likelihood):
            self.likelihood_name = type(likelihood).__name__
            self.likelihood = likelihood
        else:
            raise TypeError(f"likelihood must be a string or a gpytorch Likelihood, got {type(likelihood).__name__}")
        if beta == "auto" and self.likelihood is not None:
            raise ValueError(
                "beta='auto' sets β from a uniform prediction's cross-entropy, so it needs the categorical "
                f"likelihood, not {self.likelihood_name!r}; pass a number"
            )
        self.model = model
        self.num_data = num_data
        self.auto_beta = beta == "auto"
        self.beta = float("nan") if self.auto_beta else float(beta)
        self.anneal_steps = anneal_steps
        self.register_buffer("num_updates", torch.zeros((), dtype=torch.long))
        if self.auto_beta:  # β once set (NaN before the first call), saved with the state dict
            self.register_buffer("chosen_beta", torch.tensor(float("nan"), dtype=torch.float64))
        attach_elbo(self)  # a converted Hugging Face model given labels returns -ELBO (gpytorch_sgpa.model_loss)

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)
        if self.auto_beta:
            self.beta = float(self.chosen_beta)

    def _choose_beta(self, outputs: Tensor, targets: Tensor, weighted_kl: Tensor) -> None:
        """``beta="auto"``: ``β = min(1, 0.1 P log C / KL_weighted)`` from the first call, so that
        the KL term starts at a tenth of a uniform prediction's cross-entropy (``P``: scored positions
        per sequence, 1 for class labels; ``C``: classes).  Under ``torch.distributed`` the batch means
        are those of the global batch (summed over the ranks), so every rank chooses the same ``β``."""
        self.set_auto_beta(self.beta_totals(targets, weighted_kl), outputs.shape[-1])

    def beta_totals(self, targets: Tensor, weighted_kl: Tensor) -> Tensor:
        r""":math:`(\sum_b \mathrm{KL}_\mathrm{weighted}, \sum_b P_b)` over a batch's sequences (float64): what
        ``beta="auto"`` sums over the batches (and ranks) it chooses :math:`\beta` from (:meth:`set_auto_beta`).

        :param targets: the batch's targets: class indices ``(B,)`` (:math:`P_b = 1`) or token sequences ``(B, L)``
            (:math:`P_b`: the positions not equal to :data:`IGNORE_INDEX`).
        :param weighted_kl: the batch's :math:`\mathrm{KL}_\mathrm{weighted}` (:meth:`weighted_kl`), a scalar tensor.
        """
        rows = targets.shape[0]
        positions = (targets != IGNORE_INDEX).sum() if targets.dim() == 2 else rows
        return torch.stack(
            [
                weighted_kl.detach().double() * rows,  # summed over the batch's sequences
                torch.as_tensor(positions, dtype=torch.float64, device=weighted_kl.device),
            ]
        )

    def set_auto_beta(self, totals: Tensor, num_classes: int) -> float:
        r"""Fix :math:`\beta = \min(1, 0.1\, P \log C / \mathrm{KL}_\mathrm{weighted})` of ``beta="auto"`` from ``totals``
        (summed :meth:`beta_totals`; under ``torch.distributed`` summed over the ranks here) and return it.

        :param totals: the sums of :meth:`beta_totals` over the batches used, ``(2,)`` float64.
        :param num_classes: the number of classes :math:`C` (the logits' last dimension).
        """
        if not self.auto_beta:
            raise ValueError("set_auto_beta needs an SGPAELBO built with beta='auto'")
        totals = totals.clone()
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.all_reduce(totals)
        kl_term, positions = totals.tolist()
        self.beta = 1.0 if kl_term <= 0.0 else min(1.0, 0.1 * positions * math.log(num_classes) / kl_term)
        self.chosen_beta.fill_(self.beta)
        return self.beta

    @property
    def kl_weight(self) -> float:
        r"""Current :math:`w_t = \beta \cdot \min(1, t / \mathrm{anneal\_steps})`."""
        return float(self._kl_weight(torch.float64))

    def _kl_weight(self, dtype: torch.dtype) -> float | Tensor:
        """``w_t``; while annealing a tensor computed where the counter lives (no host read)."""
        if self.anneal_steps == 0:
            return self.beta
        return self.beta * (self.num_updates.to(dtype) / self.anneal_steps).clamp(max=1.0)

    def expected_log_likelihood(self, outputs: Tensor, targets: Tensor) -> Tensor:
        r"""Monte-Carlo :math:`\mathbb{E}_q[\log p(y_b \mid F_b)]` per data point, ``(B,)`` (mean over sample dims).

        :param outputs: the model outputs: logits ``(..., B, C)`` or ``(..., B, L, C)`` for the categorical likelihood,
            else ``(..., B, D)``; leading dimensions are samples.
        :param targets: class indices ``(B,)``, token sequences ``(B, L)`` (:data:`IGNORE_INDEX` at unscored
            positions), or regression targets ``(B, D)`` / ``(B,)``.
        """
        check_tensor(outputs, "outputs", floating=True, finite=False)
        check_tensor(targets, "targets", finite=False)
        if targets.dim() == 0 or targets.shape[0] == 0 or targets.numel() == 0:
            raise ValueError(f"targets must hold at least one data point, got shape {tuple(targets.shape)}")
        if checks_on_host(outputs):
            check_finite(outputs, "outputs", allow_negative_infinity=self.likelihood is None)  # masked logits
        if self.likelihood is None:
            if targets.dim() not in (1, 2) or targets.dtype not in (torch.int64, torch.int32):
                raise ValueError(
                    f"targets must be class indices (B,) or token sequences (B, L), got {targets.dtype} {tuple(targets.shape)}"
                )
            if outputs.dim() < targets.dim() + 1 or outputs.shape[-targets.dim() - 1 : -1] != targets.shape:
                raise ValueError(
                    f"outputs must be (..., {', '.join(map(str, targets.shape))}, C) to match targets "
                    f"{tuple(targets.shape)}, got {tuple(outputs.shape)}"
                )
            log_probs = F.log_softmax(outputs, dim=-1)
            keep = targets != IGNORE_INDEX if targets.dim() == 2 else torch.ones_like(targets, dtype=torch.bool)
            if checks_on_host(targets):
                if (keep & ((targets < 0) | (targets >= outputs.shape[-1]))).any():
                    raise ValueError(f"targets must be class indices in [0, {outputs.shape[-1]}) (or {IGNORE_INDEX} in sequences)")
                if targets.dim() == 2 and not keep.any(-1).all():
                    raise ValueError(f"every target sequence needs at least one position that is not {IGNORE_INDEX}")
            # only ignored positions are mapped to a valid index: elsewhere (on accelerators, where the
            # check above is skipped) an invalid target still fails in ``gather``
            index = targets.long().masked_fill(~keep, 0).expand(*outputs.shape[:-1]).unsqueeze(-1)
            ell = log_probs.gather(-1, index).squeeze(-1)
            if targets.dim() == 2:  # a sequence's log-likelihood is the sum over its kept positions
                ell = ell.masked_fill(~keep, 0.0).sum(-1)
        else:
            if targets.dim() == 1:
                targets = targets.unsqueeze(-1)
            if targets.dim() != 2 or outputs.dim() < 2 or outputs.shape[-2:] != targets.shape:
                raise ValueError(
                    f"outputs (..., B, D) must match targets (B, D) or (B,), got {tuple(outputs.shape)} and {tuple(targets.shape)}"
                )
            if checks_on_host(targets):
                check_finite(targets, "targets")
            ell = self.likelihood.forward(outputs).log_prob(targets.to(outputs.dtype)).sum(-1)
        return ell.reshape(-1, ell.shape[-1]).mean(0)

    def weighted_kl(self, kl: Tensor) -> Tensor:
        r""":math:`\mathrm{KL}_\mathrm{weighted}` of the chosen ``kl_weighting`` for the model's ``kl_total`` ``kl``.

        :param kl: the model's ``kl_total`` of the forward pass, a scalar tensor (batch-mean per-sequence KL).
        """
        if self.kl_weighting == "all-over-n":
            return kl / self.num_data
        if self.kl_weighting == "authors":
            return kl
        model_global_kl = getattr(self.model, "global_kl", None)
        if callable(model_global_kl):
            global_kl = model_global_kl()
        else:  # a user's model (e.g. after gpytorch_sgpa.convert): the layers' record of this forward pass
            global_kl = global_kl_divergence(self.model)
        return kl - global_kl + global_kl / self.num_data

    def forward(self, outputs: Tensor, kl: Tensor, targets: Tensor) -> Tensor:
        r"""ELBO per data point: :math:`\frac{1}{B} \sum_b \mathrm{ELL}_b - w_t \, \mathrm{KL}_\mathrm{weighted}`
        (thesis eq. (3.18), the module's formula).

        :param outputs: the model outputs of the forward pass (see :meth:`expected_log_likelihood`).
        :param kl: the model's ``kl_total`` of the same pass, a scalar tensor.
        :param targets: the targets (see :meth:`expected_log_likelihood`).
        """
        if not isinstance(kl, Tensor) or kl.dim() != 0:
            raise ValueError("kl must be a scalar tensor (the model's kl_total)")
        check_tensor(kl, "kl", floating=True, finite=False)
        if checks_on_host(kl):
            check_finite(kl, "kl")
        training = self.model.training and torch.is_grad_enabled()
        expected = self.expected_log_likelihood(outputs, targets).mean()
        weighted_kl = self.weighted_kl(kl)
        if self.auto_beta and math.isnan(self.beta):
            self._choose_beta(outputs, targets, weighted_kl)
        weight = self._kl_weight(kl.dtype)
        if training:
            self.num_updates += 1
        return expected - weight * weighted_kl
