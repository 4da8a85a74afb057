"""Metrics of thesis ch. 3 / App. B.2 against scikit-learn, scipy and hand computations."""

import math

import numpy as np
import pytest
import torch
from scipy import stats
from scipy.special import logsumexp
from sklearn.metrics import (
    accuracy_score,
    average_precision_score,
    log_loss,
    matthews_corrcoef,
    roc_auc_score,
)

from gpytorch_sgpa import metrics


def _random_probs(n, c, seed, sharpness=2.0):
    gen = torch.Generator().manual_seed(seed)
    logits = sharpness * torch.randn(n, c, generator=gen, dtype=torch.float64)
    labels = torch.randint(0, c, (n,), generator=gen)
    return logits.softmax(-1), labels


@pytest.mark.parametrize("num_classes", [2, 5])
def test_accuracy_nll_mcc_match_sklearn(num_classes):
    probs, labels = _random_probs(300, num_classes, seed=num_classes)
    predicted = probs.argmax(-1).numpy()
    assert metrics.accuracy(probs, labels) == pytest.approx(accuracy_score(labels, predicted))
    assert metrics.negative_log_likelihood(probs, labels) == pytest.approx(
        log_loss(labels.numpy(), probs.numpy(), labels=list(range(num_classes))), rel=1e-10
    )
    assert metrics.matthews_correlation(probs, labels) == pytest.approx(matthews_corrcoef(labels, predicted))
    assert metrics.matthews_correlation(torch.as_tensor(predicted), labels) == pytest.approx(matthews_corrcoef(labels, predicted))


def test_mcc_constant_prediction_is_zero_like_sklearn():
    labels = torch.tensor([0, 1, 1, 0])
    predicted = torch.zeros(4, dtype=torch.long)
    assert metrics.matthews_correlation(predicted, labels) == matthews_corrcoef(labels, predicted) == 0.0


def test_ece_mce_hand_computed():
    # 15 equal bins on [0, 1]: confidences 0.9, 0.9 fall in (13/15, 14/15]; 0.58, 0.55 in (8/15, 9/15].
    probs = torch.tensor([[0.9, 0.1], [0.1, 0.9], [0.58, 0.42], [0.45, 0.55]], dtype=torch.float64)
    labels = torch.tensor([0, 0, 0, 0])
    # High bin: accuracy 1/2, mean confidence 0.9 -> gap 0.4.
    # Low bin: accuracy 1/2 (0.58 right, 0.55 wrong), mean confidence 0.565 -> gap 0.065.
    ece, mce = metrics.calibration_errors(probs, labels)
    assert ece == pytest.approx(0.5 * 0.4 + 0.5 * 0.065)
    assert mce == pytest.approx(0.4)
    assert metrics.expected_calibration_error(probs, labels) == pytest.approx(ece)
    assert metrics.maximum_calibration_error(probs, labels) == pytest.approx(mce)


def test_ece_matches_loop_reference():
    probs, labels = _random_probs(500, 4, seed=7)
    confidence, predicted = probs.max(-1)
    edges = np.linspace(0, 1, 16)
    ece, mce = 0.0, 0.0
    for lo, hi in zip(edges[:-1], edges[1:]):
        in_bin = (confidence > lo) & (confidence <= hi)
        if in_bin.any():
            gap = abs(float((predicted[in_bin] == labels[in_bin]).double().mean() - confidence[in_bin].mean()))
            ece += gap * float(in_bin.double().mean())
            mce = max(mce, gap)
    got_ece, got_mce = metrics.calibration_errors(probs, labels)
    assert got_ece == pytest.approx(ece)
    assert got_mce == pytest.approx(mce)


def test_perfectly_confident_correct_predictions_are_calibrated():
    labels = torch.tensor([0, 2, 1])
    probs = torch.nn.functional.one_hot(labels, 3).double()
    assert metrics.calibration_errors(probs, labels) == (0.0, 0.0)


def test_ood_auroc_aupr_match_sklearn_with_ties():
    probs_in, _ = _random_probs(200, 3, seed=1, sharpness=3.0)
    probs_out, _ = _random_probs(150, 3, seed=2, sharpness=1.0)
    # Duplicate rows create tied entropies.
    probs_out = torch.cat([probs_out, probs_in[:20]])
    auroc, aupr = metrics.ood_detection_scores(probs_in, probs_out)
    scores = torch.cat([metrics.predictive_entropy(probs_in), metrics.predictive_entropy(probs_out)]).numpy()
    is_ood = np.r_[np.zeros(len(probs_in)), np.ones(len(probs_out))]
    assert auroc == pytest.approx(roc_auc_score(is_ood, scores), abs=1e-12)
    assert aupr == pytest.approx(average_precision_score(is_ood, scores), abs=1e-12)


def test_predictive_entropy_closed_form():
    probs = torch.tensor([[0.5, 0.5], [1.0, 0.0], [0.25, 0.75]], dtype=torch.float64)
    expected = [math.log(2), 0.0, -(0.25 * math.log(0.25) + 0.75 * math.log(0.75))]
    assert torch.allclose(metrics.predictive_entropy(probs), torch.tensor(expected, dtype=torch.float64))


def test_classification_metrics_dictionary():
    probs, labels = _random_probs(50, 3, seed=3)
    result = metrics.classification_metrics(probs, labels)
    assert set(result) == {"accuracy", "nll", "ece", "mce", "ece_all", "mce_all", "mcc", "auroc", "aupr"}
    assert math.isnan(result["auroc"]) and math.isnan(result["aupr"])
    assert (result["ece_all"], result["mce_all"]) == metrics.all_class_calibration_errors(probs, labels)


def test_all_class_calibration_errors_by_hand():
    probs = torch.tensor([[0.7, 0.2, 0.1], [0.4, 0.5, 0.1]], dtype=torch.float64)
    labels = torch.tensor([0, 0])
    # six (probability, outcome) pairs: (.7, 1) (.2, 0) (.1, 0) (.4, 1) (.5, 0) (.1, 0)
    # two bins [0, .5) and [.5, 1]: {.2, .1, .4, .1} mean .2 vs outcomes .25; {.7, .5} mean .6 vs .5
    ece, mce = metrics.all_class_calibration_errors(probs, labels, num_bins=2)
    assert ece == pytest.approx((4 * 0.05 + 2 * 0.1) / 6, abs=1e-12)
    assert mce == pytest.approx(0.1, abs=1e-12)
    # fifteen bins: .7 | .2 | .1 .1 | .4 | .5 each alone but the two .1 (gaps .3, .2, .1, .6, .5)
    ece, mce = metrics.all_class_calibration_errors(probs, labels)
    assert ece == pytest.approx((0.3 + 0.2 + 2 * 0.1 + 0.6 + 0.5) / 6, abs=1e-12)
    assert mce == pytest.approx(0.6, abs=1e-12)
    # the top label on the same two bins: confidences .7 (right) and .5 (wrong, in (0, .5])
    assert metrics.calibration_errors(probs, labels, num_bins=2)[0] == pytest.approx((0.3 + 0.5) / 2, abs=1e-12)


def test_all_class_calibration_errors_match_a_numpy_digitize_reference():
    probs, labels = _random_probs(400, 5, seed=11, sharpness=3.0)
    values = probs.numpy().ravel()
    outcomes = np.eye(5)[labels.numpy()].ravel()
    bins = np.digitize(values, np.linspace(0, 1, 16)[1:-1])  # [b/15, (b+1)/15), the last closed
    gaps, weights = [], []
    for b in range(15):
        inside = bins == b
        if inside.any():
            gaps.append(abs(outcomes[inside].mean() - values[inside].mean()))
            weights.append(inside.sum() / values.size)
    ece, mce = metrics.all_class_calibration_errors(probs, labels)
    assert ece == pytest.approx(float(np.dot(gaps, weights)), abs=1e-12)
    assert mce == pytest.approx(max(gaps), abs=1e-12)


def test_regression_metrics_against_scipy():
    gen = torch.Generator().manual_seed(0)
    targets = torch.randn(40, generator=gen, dtype=torch.float64)
    samples = targets + 0.3 * torch.randn(7, 40, generator=gen, dtype=torch.float64)
    scale = 0.4
    log_pdf = stats.laplace.logpdf(targets.numpy()[None], loc=samples.numpy(), scale=scale)
    expected_nll = -np.mean(logsumexp(log_pdf, axis=0) - math.log(7))
    result = metrics.regression_metrics(targets, samples, scale)
    mean = samples.mean(0).numpy()
    assert result["nll"] == pytest.approx(expected_nll, rel=1e-10)
    assert result["mae"] == pytest.approx(np.mean(np.abs(mean - targets.numpy())))
    assert result["rmse"] == pytest.approx(np.sqrt(np.mean((mean - targets.numpy()) ** 2)))
    single = metrics.laplace_negative_log_likelihood(targets, samples[0], scale)
    assert single == pytest.approx(-np.mean(stats.laplace.logpdf(targets.numpy(), samples[0].numpy(), scale)))


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: metrics.accuracy(torch.tensor([[0.5, 0.6]]), torch.tensor([0])), "sum to 1"),
        (lambda: metrics.accuracy(torch.tensor([0.5, 0.5]), torch.tensor([0])), "probs"),
        (lambda: metrics.accuracy(torch.tensor([[0.5, 0.5]]), torch.tensor([2])), "labels"),
        (lambda: metrics.accuracy(torch.tensor([[0.5, 0.5]]), torch.tensor([0, 1])), "labels"),
        (lambda: metrics.negative_log_likelihood(torch.tensor([[float("nan"), 0.5]]), torch.tensor([0])), "NaN"),
        (lambda: metrics.calibration_errors(torch.tensor([[0.5, 0.5]]), torch.tensor([0]), num_bins=0), "num_bins"),
        (lambda: metrics.laplace_negative_log_likelihood(torch.zeros(3), torch.zeros(3), 0.0), "scale"),
        (lambda: metrics.mean_absolute_error(torch.zeros(2), torch.zeros(3)), "predictions"),
        (lambda: metrics.ood_detection_scores(torch.tensor([[1.0, 0.0]]), torch.tensor([[2.0, -1.0]])), "probs_out"),
    ],
)
def test_bad_input_raises_value_error_naming_argument(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_calibration_errors_agree_with_torchmetrics_away_from_bin_edges():
    """torchmetrics' CalibrationError (a well-kept implementation) gives the same ECE and MCE when
    no confidence lies on a bin edge, where the two binning conventions differ (see the docstring)."""
    from torchmetrics.functional.classification import multiclass_calibration_error

    from gpytorch_sgpa.metrics import calibration_errors

    generator = torch.Generator().manual_seed(0)
    probs = torch.softmax(3 * torch.randn(2000, 5, generator=generator, dtype=torch.float64), -1)
    labels = torch.randint(0, 5, (2000,), generator=generator)
    confidence = probs.max(-1).values
    assert ((confidence * 15 - (confidence * 15).round()).abs() > 1e-9).all()
    ece, mce = calibration_errors(probs, labels)
    assert abs(ece - float(multiclass_calibration_error(probs, labels, 5, n_bins=15, norm="l1"))) < 1e-6  # torchmetrics returns float32
    assert abs(mce - float(multiclass_calibration_error(probs, labels, 5, n_bins=15, norm="max"))) < 1e-6
    assert ece > 0.01  # a miscalibrated predictor: the comparison is not between two zeros


def hand_calibration_errors(confidence, correct, num_bins=15):
    """ECE and MCE by a loop over the bins ((b - 1) / B, b / B], confidence 0 in the first."""
    gaps, ece = [], 0.0
    for b in range(1, num_bins + 1):
        members = [
            (c, k) for c, k in zip(confidence.tolist(), correct.tolist()) if (b - 1) / num_bins < c <= b / num_bins or (b == 1 and c == 0)
        ]
        if members:
            gap = abs(sum(k for _, k in members) - sum(c for c, _ in members)) / len(members)
            gaps.append(gap)
            ece += len(members) / len(confidence) * gap
    return ece, max(gaps)


def test_confidence_calibration_equals_hand_binned_errors():
    torch.manual_seed(0)
    probs = torch.softmax(3 * torch.randn(500, 7, dtype=torch.double), -1)
    probs[0] = torch.nn.functional.one_hot(torch.tensor(3), 7)  # a saturated prediction: confidence 1 in the last bin
    labels = torch.randint(0, 7, (500,))
    confidence, predicted = probs.max(-1)
    expected = hand_calibration_errors(confidence, predicted == labels)
    assert expected[0] > 0.01  # the two errors differ from 0 enough to tell a wrong binning
    ours = metrics.calibration_errors_from_confidence(confidence, predicted == labels)
    assert ours == pytest.approx(expected, abs=1e-12)
    assert metrics.calibration_errors(probs, labels) == pytest.approx(expected, abs=1e-12)
    with pytest.raises(ValueError, match="confidence"):
        metrics.calibration_errors_from_confidence(confidence + 2, predicted == labels)
    with pytest.raises(ValueError, match="one length"):
        metrics.calibration_errors_from_confidence(confidence, (predicted == labels)[:-1])
