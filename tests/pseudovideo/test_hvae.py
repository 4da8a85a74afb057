"""HVAE of §5.2.1: the fixed encoder is the heat equation plus sigma_h noise with its Gaussian log
density (scipy), the negative ELBO decreases under training, and the runner's --quick contract."""

import csv
import math

import numpy as np
import pytest
import scipy.stats
import torch

from experiments.pseudovideo.hvae import COLUMNS, main
from pseudovideo.augment import heat_dissipation
from pseudovideo.models.hvae import HeatHVAE


def digits():
    from pseudovideo.data import load_images

    images, _ = load_images("digits", limit=256)
    return (images > 0.5).float()


def test_heat_encoder_is_the_heat_equation_plus_noise_with_its_log_density():
    x = digits()[:64]
    model = HeatHVAE("heat", num_latents=4, image_size=8, max_std=6.0, noise_std=0.05)
    latents, log_q = model.encode(x, torch.Generator().manual_seed(0))
    stds = np.logspace(np.log10(0.5), np.log10(6.0), 4)  # z_1 least, z_T most dissipated
    expected_log_q = np.zeros(64)
    for z, std in zip(latents, stds):
        mean = heat_dissipation(x, std**2 / 2)
        residual = (z - mean).numpy()
        assert abs(residual.std() - 0.05) < 0.003  # 4,096 draws: s.e. ~0.0006
        expected_log_q += scipy.stats.norm.logpdf(residual, scale=0.05).reshape(64, -1).sum(1)
    np.testing.assert_allclose(log_q.numpy(), expected_log_q, rtol=1e-5)
    assert not list(model.parameters()) or all("encoder" not in name for name, _ in model.named_parameters())


@pytest.mark.parametrize("encoder", ["heat", "learned"])
def test_training_lowers_the_negative_elbo(encoder):
    x = digits()
    torch.manual_seed(0)
    model = HeatHVAE(encoder, num_latents=3, image_size=8, width=16, max_std=6.0)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        before = model.negative_elbo(x, torch.Generator().manual_seed(1))
    for _ in range(60):
        loss = model.negative_elbo(x[torch.randint(0, 256, (32,), generator=generator)], generator)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    with torch.no_grad():
        after = model.negative_elbo(x, torch.Generator().manual_seed(1))
    assert after < before - 0.1 * abs(before)
    samples = model.sample(5, torch.Generator().manual_seed(2))
    assert samples.shape == (5, 1, 8, 8) and samples.min() >= 0 and samples.max() <= 1
    assert math.isfinite(after)


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="encoder"):
        HeatHVAE("fixed")
    with pytest.raises(ValueError, match="num_latents"):
        HeatHVAE("heat", num_latents=0)
    with pytest.raises(ValueError, match="x must"):
        HeatHVAE("heat", num_latents=2, image_size=8).negative_elbo(torch.zeros(2, 8, 8))


def test_quick_run_writes_the_csv(tmp_path):
    rows = main(
        [
            "--dataset",
            "digits",
            "--downsample",
            "1",
            "--quick",
            "--quiet",
            "--out",
            str(tmp_path),
            "--classifier-cache",
            str(tmp_path / "cache"),
        ]
    )
    with open(tmp_path / "hvae_results.csv") as handle:
        reader = csv.DictReader(handle)
        assert reader.fieldnames == COLUMNS
        written = list(reader)
    assert [r["encoder"] for r in written] == ["heat", "learned"] and len(rows) == 2
    assert all(1 <= float(r["is"]) <= 10 for r in written)
    assert (tmp_path / "hvae_samples_heat_seed0.png").is_file()
    later = main(
        [
            "--dataset",
            "digits",
            "--downsample",
            "1",
            "--quick",
            "--quiet",
            "--encoders",
            "heat",
            "--first-seed",
            "2",
            "--out",
            str(tmp_path / "later"),
            "--classifier-cache",
            str(tmp_path / "cache"),
        ]
    )
    assert [r["seed"] for r in later] == [2] and (tmp_path / "later" / "hvae_samples_heat_seed2.png").is_file()
