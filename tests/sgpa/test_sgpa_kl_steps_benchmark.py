"""``benchmarks/sgpa_kl_steps.py``: its split of the global KL against Gaussian KLs computed by
``torch.distributions``, and its smallest run."""

import json
from pathlib import Path

import pytest
import torch
from torch.distributions import MultivariateNormal, kl_divergence

from gpytorch_sgpa import SGPAttention, global_kl_divergence

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture
def kl_steps(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    return pytest.importorskip("sgpa_kl_steps")


@pytest.mark.parametrize("share_covariance", [False, True])
def test_the_global_covariance_part_is_the_kl_of_the_zero_mean_gaussians(kl_steps, share_covariance):
    """Per head and output dimension the global KL is KL(N(K v_g, S_g) || N(0, K_gg)) with S_g = L C Cᵀ Lᵀ;
    its covariance part is the same KL with the mean 0, and the rest is the mean's."""
    torch.manual_seed(0)
    layer = SGPAttention(8, 2, num_global=4, share_covariance=share_covariance, kernel_init="authors").double()
    layer(torch.randn(3, 5, 8, dtype=torch.float64))  # records the forward's KL parts
    with torch.no_grad():
        factors = layer.cached_global_factors(None, torch.float64)
        gram = factors.chol @ factors.chol.transpose(-2, -1)  # K_gg (+ jitter), (H, M, M)
        cov_factor = factors.chol.unsqueeze(1) @ layer.global_cov_factor(torch.float64)  # L C, (H, e or 1, M, M)
        covariance = cov_factor @ cov_factor.transpose(-2, -1)
        means = (gram @ layer.global_values).transpose(-2, -1)  # K_gg v_g per output dimension, (H, e, M)
        prior = MultivariateNormal(torch.zeros_like(means), gram.unsqueeze(1).expand(-1, means.shape[1], -1, -1))
        covariance = covariance.expand(-1, means.shape[1], -1, -1)
        expected_covariance = kl_divergence(MultivariateNormal(torch.zeros_like(means), covariance), prior).sum()
        expected_total = kl_divergence(MultivariateNormal(means, covariance), prior).sum()
        assert float(kl_steps.global_covariance_kl(layer)) == pytest.approx(float(expected_covariance), rel=1e-9)
        assert float(global_kl_divergence(layer)) == pytest.approx(float(expected_total), rel=1e-9)
    assert 0 < float(expected_covariance) < float(expected_total)


def test_the_global_covariance_part_refuses_unwhitened_layers(kl_steps):
    with pytest.raises(ValueError, match="whitened=True"):
        kl_steps.global_covariance_kl(SGPAttention(8, 2, num_global=4, whitened=False))


def test_the_smallest_run_records_every_elbo_update_and_draws_the_plot(kl_steps, tmp_path, capsys):
    out, record = tmp_path / "kl.png", tmp_path / "kl.json"
    tiny = "--dataset digits --epochs 3 --mle-init-epochs 1 --train-size 200 --val-size 50"
    result = kl_steps.main(f"{tiny} --out {out} --json {record}".split())
    rows = result["rows"]
    assert [row["step"] for row in rows] == [0, 1, 2, 3] == list(range(result["updates"]))  # 2 epochs x 2 batches
    assert [row["kl_weight"] for row in rows] == [0.0, 0.5, 1.0, 1.0]  # annealed over the first half (the preset)
    for row in rows:
        assert row["kl"] == pytest.approx(row["global_covariance"] + row["global_mean"] + row["amortised"])
        assert row["global_covariance"] > 0 and row["global_mean"] > 0 and row["cross_entropy"] > 0
    assert out.stat().st_size > 0 and json.loads(record.read_text())["rows"] == rows
    printed = capsys.readouterr().out
    assert "| ELBO updates | KL weight | KL | global covariance |" in printed and "\n| 3 | 1.000 |" in printed
