"""``benchmarks/sgpa_temperature_scaling.py``: tempering predictive probabilities against temperature scaling of
the logits, and its smallest run."""

import importlib.util
from pathlib import Path

import pytest
import torch

from gpytorch_sgpa.baselines import TemperatureScaling

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
FASHION_MNIST = Path("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz")


@pytest.fixture
def benchmark(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    return pytest.importorskip("sgpa_temperature_scaling")


def test_tempering_softmax_probabilities_is_temperature_scaling_of_the_logits(benchmark):
    generator = torch.Generator().manual_seed(0)
    logits_val, logits_test = 3 * torch.randn(200, 4, generator=generator), 3 * torch.randn(50, 4, generator=generator)
    labels_val = torch.randint(0, 4, (200,), generator=generator)
    tempered, temperature = benchmark.tempered(logits_val.softmax(-1), labels_val, {"test": logits_test.softmax(-1)})
    reference = TemperatureScaling().fit(logits_val, labels_val)
    assert temperature == pytest.approx(reference.temperature, rel=1e-6) and temperature > 1.5  # random labels: T > 1
    torch.testing.assert_close(tempered["test"], reference.predict_proba(logits_test.double()), rtol=1e-6, atol=1e-9)


@pytest.mark.skipif(
    not FASHION_MNIST.exists() or importlib.util.find_spec("mlxtend") is None,
    reason="needs Fashion-MNIST (apt-get install dataset-fashion-mnist) and mlxtend",
)
def test_the_smallest_run_scores_both_methods_on_the_test_and_shifted_splits(benchmark, capsys):
    tiny = "--seeds 0 --train 200 --val 100 --test 50 --epochs 1 --fine-tune 1 --num-samples 2 --calibration 50 --severities 3"
    results = benchmark.main(tiny.split())[0]["results"]
    assert list(results) == ["test", "shift 3"]
    for split in results.values():
        assert list(split) == ["softmax", "softmax + TS", "SGPA", "SGPA + TS"]
        assert split["softmax"]["accuracy"] == split["softmax + TS"]["accuracy"]  # a temperature keeps the argmax
        assert split["SGPA"]["accuracy"] == split["SGPA + TS"]["accuracy"]
        assert all(0 <= scores["ece"] <= 1 and scores["nll"] > 0 for scores in split.values())
    printed = capsys.readouterr().out
    assert "| shift 3 | SGPA + TS |" in printed and "SGPA + TS minus softmax + TS" in printed
