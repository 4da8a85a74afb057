"""The GPU kit's diffusion training run, at a tiny size on the CPU: it trains (the loss falls on a fixed
batch pool) and reports what the kit records."""

import math
import pathlib
import sys

import pytest

pytest.importorskip("diffusers")
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "benchmarks"))
import diffusion_training  # noqa: E402


def test_a_short_run_trains_and_reports():
    result = diffusion_training.run("cpu", steps=12, batch=8, image_size=8, frames=3, warmup=2)
    assert result["engine"] in ("accelerate", "torch (accelerate not installed)")
    assert math.isfinite(result["first_loss"]) and result["last_loss"] < result["first_loss"]
    assert result["steps_per_s"] > 0 and result["videos_per_s"] == pytest.approx(8 * result["steps_per_s"])
