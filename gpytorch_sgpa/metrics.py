r"""Predictive-performance and calibration metrics used in the SGPA experiments.

Thesis chapter 3 (section "Experiments") evaluates classifiers by accuracy (or the Matthews
correlation coefficient for CoLA), negative log-likelihood (a proper scoring rule, App. B.2.1),
expected and maximum calibration error with 15 equal-width confidence bins (App. B.2.2, following
Guo et al. 2017; top-label, :func:`calibration_errors`, and over all classes as the SGPA authors'
published numbers, :func:`all_class_calibration_errors`), and out-of-distribution detection by the area under the ROC and precision-recall
curves with predictive entropy as the score. Regression (App. B.3.2, ZINC) uses MAE, RMSE and the
NLL of a Laplace likelihood :math:`g(y \mid f) = \exp(-|y - f| / b) / (2b)`.

All classification functions take predictive class probabilities ``probs`` of shape ``N x C`` (the
Monte-Carlo average over posterior samples for Bayesian models) and integer ``labels`` of shape
``N``. Results are Python floats.
"""

from __future__ import annotations

import math

import torch

__all__ = [
    "accuracy",
    "negative_log_likelihood",
    "calibration_errors",
    "calibration_errors_from_confidence",
    "all_class_calibration_errors",
    "expected_calibration_error",
    "maximum_calibration_error",
    "matthews_correlation",
    "predictive_entropy",
    "ood_detection_scores",
    "classification_metrics",
    "mean_absolute_error",
    "root_mean_squared_error",
    "laplace_negative_log_likelihood",
    "regression_metrics",
]

_PROB_ATOL = 1e-4


def _as_tensor(value, name: str, dtype=None) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        tensor = value.detach()
    else:
        try:
            tensor = torch.as_tensor(value, dtype=dtype)
        except (TypeError, ValueError, RuntimeError) as err:
            raise TypeError(f"{name} must be array-like, got {type(value).__name__}") from err
    if dtype is not None:
        tensor = tensor.to(dtype)
    return tensor.cpu()


def _check_probs(probs, name: str = "probs") -> torch.Tensor:
    probs = _as_tensor(probs, name)
    if not torch.is_floating_point(probs):
        raise TypeError(f"{name} must be a floating-point array of class probabilities")
    probs = probs.double()
    if probs.dim() != 2 or probs.shape[0] < 1 or probs.shape[1] < 2:
        raise ValueError(f"{name} must have shape N x C with N >= 1 and C >= 2, got {tuple(probs.shape)}")
    if not torch.isfinite(probs).all():
        raise ValueError(f"{name} contains NaN or infinite values")
    if (probs < 0).any() or (probs > 1 + _PROB_ATOL).any():
        raise ValueError(f"{name} must lie in [0, 1]")
    row_sums = probs.sum(-1)
    if not torch.allclose(row_sums, torch.ones_like(row_sums), atol=_PROB_ATOL):
        raise ValueError(f"each row of {name} must sum to 1 (max deviation {float((row_sums - 1).abs().max()):.3g})")
    return probs


def _check_labels(labels, num_rows: int, num_classes: int | None, name: str = "labels") -> torch.Tensor:
    labels = _as_tensor(labels, name)
    if torch.is_floating_point(labels):
        if not torch.isfinite(labels).all() or (labels != labels.round()).any():
            raise ValueError(f"{name} must hold integer class indices")
    elif labels.dtype == torch.bool:
        raise TypeError(f"{name} must hold integer class indices, got booleans")
    labels = labels.long()
    if labels.dim() != 1 or labels.shape[0] != num_rows:
        raise ValueError(f"{name} must have shape ({num_rows},), got {tuple(labels.shape)}")
    if (labels < 0).any() or (num_classes is not None and (labels >= num_classes).any()):
        raise ValueError(f"{name} must lie in [0, {num_classes}) for {num_classes} classes")
    return labels


def accuracy(probs, labels) -> float:
    """Fraction of inputs whose most probable class equals the label.

    :param probs: the predicted class probabilities, ``(N, C)``, rows summing to 1.
    :param labels: the true classes, ``(N,)`` integers in ``[0, C)``.
    """
    probs = _check_probs(probs)
    labels = _check_labels(labels, probs.shape[0], probs.shape[1])
    return float((probs.argmax(-1) == labels).double().mean())


def negative_log_likelihood(probs, labels) -> float:
    r"""Mean negative log predictive probability of the true class (thesis App. B.2.1),
    :math:`-\frac{1}{N} \sum_i \log p_{i, y_i}`.

    No clipping: a zero probability on a true class gives ``inf``.

    :param probs: the predicted class probabilities, ``(N, C)``, rows summing to 1.
    :param labels: the true classes, ``(N,)`` integers in ``[0, C)``.
    """
    probs = _check_probs(probs)
    labels = _check_labels(labels, probs.shape[0], probs.shape[1])
    return float(-probs.gather(-1, labels[:, None]).log().mean())


def calibration_errors(probs, labels, num_bins: int = 15) -> tuple[float, float]:
    r"""Expected and maximum calibration error with ``num_bins`` equal-width bins (thesis App. B.2.2).

    The confidence of an input is its largest class probability; bin :math:`b` holds confidences in
    :math:`((b - 1) / B, b / B]`. ECE is :math:`\sum_b (n_b / N)\, |\mathrm{acc}_b - \mathrm{conf}_b|`; MCE is the
    largest :math:`|\mathrm{acc}_b - \mathrm{conf}_b|` over non-empty bins.

    Not ``torchmetrics``' ``CalibrationError``: it bins ``[b / B, (b + 1) / B)`` and puts
    confidence exactly 1 in a bin of its own (a ``B + 1``-th), so saturated predictions (exact 1.0
    after a float32 softmax) are scored apart from the other confident ones, which is not the
    thesis's definition.  Away from bin edges the two agree (``tests/sgpa/test_sgpa_metrics.py``).

    :param probs: the predicted class probabilities, ``(N, C)``, rows summing to 1.
    :param labels: the true classes, ``(N,)`` integers in ``[0, C)``.
    :param num_bins: the number of equal-width confidence bins :math:`B`, a positive int (default 15).
    """
    probs = _check_probs(probs)
    labels = _check_labels(labels, probs.shape[0], probs.shape[1])
    confidence, predicted = probs.max(-1)
    return calibration_errors_from_confidence(confidence, predicted == labels, num_bins)


def calibration_errors_from_confidence(confidence, correct, num_bins: int = 15) -> tuple[float, float]:
    """ECE and MCE (as :func:`calibration_errors`) from each prediction's confidence and correctness.

    For predictions too many to hold as probability rows, e.g. every next-token prediction of a
    language model: ``confidence`` ``(N,)`` in ``[0, 1]``, ``correct`` bool or 0/1 ``(N,)``.

    :param confidence: each prediction's confidence (its largest class probability), ``(N,)`` in ``[0, 1]``.
    :param correct: whether each prediction is right, ``(N,)`` bool or 0/1.
    :param num_bins: the number of equal-width confidence bins :math:`B`, a positive int (default 15).
    """
    if isinstance(num_bins, bool) or not isinstance(num_bins, int) or num_bins < 1:
        raise ValueError(f"num_bins must be a positive integer, got {num_bins!r}")
    confidence = _as_tensor(confidence, "confidence", torch.float64)
    correct = _as_tensor(correct, "correct").double()
    if confidence.dim() != 1 or correct.shape != confidence.shape or confidence.numel() == 0:
        raise ValueError(
            f"confidence and correct must be non-empty 1-D tensors of one length, got {tuple(confidence.shape)} and {tuple(correct.shape)}"
        )
    if ((confidence < -_PROB_ATOL) | (confidence > 1 + _PROB_ATOL)).any() or ((correct != 0) & (correct != 1)).any():
        raise ValueError("confidence must lie in [0, 1] and correct must be 0/1")
    confidence = confidence.clamp(0.0, 1.0)
    bin_index = (torch.ceil(confidence * num_bins).long() - 1).clamp(0, num_bins - 1)
    counts = torch.bincount(bin_index, minlength=num_bins).double()
    conf_sum = torch.bincount(bin_index, weights=confidence, minlength=num_bins)
    correct_sum = torch.bincount(bin_index, weights=correct, minlength=num_bins)
    occupied = counts > 0
    gaps = (correct_sum[occupied] - conf_sum[occupied]).abs() / counts[occupied]
    ece = float((gaps * counts[occupied]).sum() / confidence.shape[0])
    mce = float(gaps.max())
    return ece, mce


def all_class_calibration_errors(probs, labels, num_bins: int = 15) -> tuple[float, float]:
    r"""ECE and MCE over all :math:`N C` (probability, outcome) pairs, the definition of the SGPA authors' evaluation.

    Every class probability :math:`p_{ic}` is a prediction whose outcome is :math:`\mathbb{1}[y_i = c]` (the one-hot
    label), not only the top label's. With :math:`n_b` of the :math:`N C` probabilities in bin :math:`b`
    (:math:`[(b - 1) / B, b / B)`, the last bin closed at 1),

    .. math::

        \mathrm{ECE} = \sum_b \frac{n_b}{N C} \Big| \operatorname{mean}_{(i,c) \in b} \mathbb{1}[y_i = c]
        - \operatorname{mean}_{(i,c) \in b} p_{ic} \Big|,

    and :math:`\mathrm{MCE}` the largest of these gaps over non-empty bins.

    The authors' README states that their ECE/MCE are computed this way ("for all classes, not just
    the max-prob class"). The many near-zero probabilities of a confident classifier sit in the
    first bin with outcomes that are almost all 0, so this ECE is smaller than the top-label one
    (by about a factor :math:`C` for :math:`C` classes when the top label carries the miscalibration).

    :param probs: the predicted class probabilities, ``(N, C)``, rows summing to 1.
    :param labels: the true classes, ``(N,)`` integers in ``[0, C)``.
    :param num_bins: the number of equal-width confidence bins :math:`B`, a positive int (default 15).
    """
    probs = _check_probs(probs)
    labels = _check_labels(labels, probs.shape[0], probs.shape[1])
    if isinstance(num_bins, bool) or not isinstance(num_bins, int) or num_bins < 1:
        raise ValueError(f"num_bins must be a positive integer, got {num_bins!r}")
    outcomes = torch.nn.functional.one_hot(labels, probs.shape[1]).double().flatten()
    values = probs.clamp(0.0, 1.0).flatten()
    bin_index = torch.floor(values * num_bins).long().clamp(0, num_bins - 1)
    counts = torch.bincount(bin_index, minlength=num_bins).double()
    value_sum = torch.bincount(bin_index, weights=values, minlength=num_bins)
    outcome_sum = torch.bincount(bin_index, weights=outcomes, minlength=num_bins)
    occupied = counts > 0
    gaps = (outcome_sum[occupied] - value_sum[occupied]).abs() / counts[occupied]
    return float((gaps * counts[occupied]).sum() / values.shape[0]), float(gaps.max())


def expected_calibration_error(probs, labels, num_bins: int = 15) -> float:
    """ECE with equal-width bins; see :func:`calibration_errors`.

    :param probs: the predicted class probabilities, ``(N, C)``, rows summing to 1.
    :param labels: the true classes, ``(N,)`` integers in ``[0, C)``.
    :param num_bins: the number of equal-width confidence bins :math:`B`, a positive int (default 15).
    """
    return calibration_errors(probs, labels, num_bins)[0]


def maximum_calibration_error(probs, labels, num_bins: int = 15) -> float:
    """MCE with equal-width bins; see :func:`calibration_errors`.

    :param probs: the predicted class probabilities, ``(N, C)``, rows summing to 1.
    :param labels: the true classes, ``(N,)`` integers in ``[0, C)``.
    :param num_bins: the number of equal-width confidence bins :math:`B`, a positive int (default 15).
    """
    return calibration_errors(probs, labels, num_bins)[1]


def matthews_correlation(predictions, labels) -> float:
    """Multi-class Matthews correlation coefficient (Gorodkin 2004), the CoLA metric of chapter 3.

    ``predictions`` is either an ``N x C`` probability matrix (its argmax is used) or ``N`` integer
    class predictions. Returns 0 when the coefficient is undefined (a constant prediction or label).

    :param predictions: the predictions: probabilities ``(N, C)`` or class indices ``(N,)``.
    :param labels: the true classes, ``(N,)`` non-negative integers.
    """
    predictions = _as_tensor(predictions, "predictions")
    if predictions.dim() == 2:
        probs = _check_probs(predictions, "predictions")
        predicted = probs.argmax(-1)
        num_classes = probs.shape[1]
    else:
        predicted = _check_labels(predictions, predictions.shape[0] if predictions.dim() == 1 else -1, None, "predictions")
        num_classes = None
    labels = _check_labels(labels, predicted.shape[0], num_classes)
    size = int(max(predicted.max(), labels.max())) + 1
    confusion = torch.zeros(size, size, dtype=torch.float64)
    confusion.index_put_((labels, predicted), torch.ones_like(labels, dtype=torch.float64), accumulate=True)
    total = confusion.sum()
    true_per_class = confusion.sum(1)
    pred_per_class = confusion.sum(0)
    covariance = confusion.trace() * total - true_per_class @ pred_per_class
    denominator = torch.sqrt((total**2 - pred_per_class @ pred_per_class) * (total**2 - true_per_class @ true_per_class))
    if denominator == 0:
        return 0.0
    return float(covariance / denominator)


def predictive_entropy(probs) -> torch.Tensor:
    r"""Entropy :math:`-\sum_c p_c \log p_c` of each row of ``probs`` (:math:`0 \log 0 = 0`), the OOD score of chapter 3.

    :param probs: the predicted class probabilities, ``(N, C)``, rows summing to 1.
    """
    probs = _check_probs(probs)
    return -torch.special.xlogy(probs, probs).sum(-1)


def _auroc(scores: torch.Tensor, is_positive: torch.Tensor) -> float:
    ranks = _average_ranks(scores)
    num_pos = int(is_positive.sum())
    num_neg = is_positive.numel() - num_pos
    rank_sum = ranks[is_positive].sum()
    return float((rank_sum - num_pos * (num_pos + 1) / 2) / (num_pos * num_neg))


def _average_ranks(values: torch.Tensor) -> torch.Tensor:
    order = torch.argsort(values, stable=True)
    sorted_values = values[order]
    _, inverse, counts = torch.unique_consecutive(sorted_values, return_inverse=True, return_counts=True)
    ends = counts.cumsum(0).double()
    mean_rank_of_group = ends - (counts.double() - 1) / 2
    ranks = torch.empty_like(values, dtype=torch.float64)
    ranks[order] = mean_rank_of_group[inverse]
    return ranks


def _average_precision(scores: torch.Tensor, is_positive: torch.Tensor) -> float:
    order = torch.argsort(scores, descending=True, stable=True)
    sorted_scores = scores[order]
    sorted_positive = is_positive[order].double()
    true_pos = sorted_positive.cumsum(0)
    false_pos = (1 - sorted_positive).cumsum(0)
    # Evaluate the curve only at the last element of each group of tied scores (distinct thresholds).
    last_of_group = torch.ones_like(sorted_scores, dtype=torch.bool)
    last_of_group[:-1] = sorted_scores[1:] != sorted_scores[:-1]
    true_pos, false_pos = true_pos[last_of_group], false_pos[last_of_group]
    precision = true_pos / (true_pos + false_pos)
    recall = true_pos / true_pos[-1]
    recall_steps = torch.diff(recall, prepend=recall.new_zeros(1))
    return float((recall_steps * precision).sum())


def ood_detection_scores(probs_in, probs_out) -> tuple[float, float]:
    r"""AUROC and AUPR for detecting out-of-distribution inputs by predictive entropy (chapter 3).

    OOD inputs are the positive class and higher entropy means "more likely OOD". AUROC is the
    Mann-Whitney statistic (ties count one half); AUPR is the average precision
    :math:`\sum_k (R_k - R_{k-1}) P_k` over distinct entropy thresholds.

    :param probs_in: the class probabilities of the in-distribution inputs, ``(N_in, C)`` (the negatives).
    :param probs_out: the class probabilities of the out-of-distribution inputs, ``(N_out, C)`` (the positives).
    """
    entropy_in = predictive_entropy(_check_probs(probs_in, "probs_in"))
    entropy_out = predictive_entropy(_check_probs(probs_out, "probs_out"))
    scores = torch.cat([entropy_in, entropy_out])
    is_positive = torch.cat([torch.zeros_like(entropy_in, dtype=torch.bool), torch.ones_like(entropy_out, dtype=torch.bool)])
    return _auroc(scores, is_positive), _average_precision(scores, is_positive)


def classification_metrics(probs, labels, ood_probs=None, num_bins: int = 15) -> dict[str, float]:
    """All chapter-3 classification metrics in one dictionary.

    Keys: ``accuracy, nll, ece, mce`` (top label), ``ece_all, mce_all`` (all classes,
    :func:`all_class_calibration_errors`), ``mcc, auroc, aupr`` (the last two are NaN without ``ood_probs``).

    :param probs: the predicted class probabilities, ``(N, C)``, rows summing to 1.
    :param labels: the true classes, ``(N,)`` integers in ``[0, C)``.
    :param ood_probs: the class probabilities of out-of-distribution inputs, ``(N_out, C)``; ``None`` (the default):
        no OOD scores.
    :param num_bins: the number of equal-width confidence bins :math:`B`, a positive int (default 15).
    """
    ece, mce = calibration_errors(probs, labels, num_bins)
    ece_all, mce_all = all_class_calibration_errors(probs, labels, num_bins)
    if ood_probs is None:
        auroc = aupr = math.nan
    else:
        auroc, aupr = ood_detection_scores(probs, ood_probs)
    return {
        "accuracy": accuracy(probs, labels),
        "nll": negative_log_likelihood(probs, labels),
        "ece": ece,
        "mce": mce,
        "ece_all": ece_all,
        "mce_all": mce_all,
        "mcc": matthews_correlation(probs, labels),
        "auroc": auroc,
        "aupr": aupr,
    }


def _check_regression(name: str, value, like: torch.Tensor | None = None) -> torch.Tensor:
    tensor = _as_tensor(value, name, torch.float64)
    if not torch.isfinite(tensor).all():
        raise ValueError(f"{name} contains NaN or infinite values")
    if like is not None and tensor.shape != like.shape:
        raise ValueError(f"{name} must have shape {tuple(like.shape)}, got {tuple(tensor.shape)}")
    return tensor


def mean_absolute_error(predictions, targets) -> float:
    r"""Mean of :math:`|y - \hat y|` (thesis App. B.3.2).

    :param predictions: the predictions :math:`\hat y`, of the shape of ``targets``.
    :param targets: the true values :math:`y`, finite.
    """
    targets = _check_regression("targets", targets)
    predictions = _check_regression("predictions", predictions, targets)
    return float((predictions - targets).abs().mean())


def root_mean_squared_error(predictions, targets) -> float:
    r"""Square root of the mean of :math:`(y - \hat y)^2` (thesis App. B.3.2).

    :param predictions: the predictions :math:`\hat y`, of the shape of ``targets``.
    :param targets: the true values :math:`y`, finite.
    """
    targets = _check_regression("targets", targets)
    predictions = _check_regression("predictions", predictions, targets)
    return float((predictions - targets).pow(2).mean().sqrt())


def laplace_negative_log_likelihood(targets, locations, scale) -> float:
    r"""Mean NLL of ``targets`` under a Laplace likelihood :math:`\exp(-|y - f| / b) / (2b)` (thesis App. B.3.2).

    ``locations`` is either ``N`` function values or ``S x N`` Monte-Carlo samples of them; with
    samples the predictive density is the mixture :math:`\frac{1}{S} \sum_s g(y \mid f_s)`. ``scale`` is
    :math:`b > 0` (a scalar or broadcastable to ``locations``).

    :param targets: the true values :math:`y`, ``(N,)``.
    :param locations: the function values :math:`f`, ``(N,)``, or Monte-Carlo samples of them, ``(S, N)``.
    :param scale: the Laplace scale :math:`b > 0`, a scalar or broadcastable to ``locations``.
    """
    targets = _check_regression("targets", targets)
    if targets.dim() != 1:
        raise ValueError(f"targets must have shape (N,), got {tuple(targets.shape)}")
    locations = _check_regression("locations", locations)
    if locations.dim() == 1:
        locations = locations[None]
    if locations.dim() != 2 or locations.shape[-1] != targets.shape[0]:
        raise ValueError(f"locations must have shape ({targets.shape[0]},) or (S, {targets.shape[0]}), got {tuple(locations.shape)}")
    scale = _check_regression("scale", scale)
    if (scale <= 0).any():
        raise ValueError("scale must be positive")
    log_density = -(targets - locations).abs() / scale - torch.log(2 * scale)
    mixture = torch.logsumexp(log_density, dim=0) - math.log(locations.shape[0])
    return float(-mixture.mean())


def regression_metrics(targets, locations, scale) -> dict[str, float]:
    """MAE and RMSE of the predictive mean and the Laplace NLL; keys ``mae, rmse, nll``.

    ``locations`` is ``N`` or ``S x N`` samples; the predictive mean is the average over samples.

    :param targets: the true values :math:`y`, ``(N,)``.
    :param locations: the function values :math:`f`, ``(N,)``, or Monte-Carlo samples of them, ``(S, N)``.
    :param scale: the Laplace scale :math:`b > 0`, a scalar or broadcastable to ``locations``.
    """
    locations_t = _check_regression("locations", locations)
    mean = locations_t.mean(0) if locations_t.dim() == 2 else locations_t
    return {
        "mae": mean_absolute_error(mean, targets),
        "rmse": root_mean_squared_error(mean, targets),
        "nll": laplace_negative_log_likelihood(targets, locations_t, scale),
    }
