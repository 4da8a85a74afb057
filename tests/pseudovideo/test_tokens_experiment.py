"""The tokens runner's --quick contract: CSV columns, one row per model and frame count, PNG grids."""

import csv

import pytest
import torch

from experiments.pseudovideo.tokens import COLUMNS, main, parse_arguments


@pytest.mark.filterwarnings("ignore::pseudovideo.metrics.MetricReliabilityWarning")  # quick runs score 16 images
def test_quick_run_writes_the_csv_contract(tmp_path):
    rows = main(
        [
            "--dataset",
            "digits",
            "--downsample",
            "1",
            "--model",
            "tokenizer,ar,masked",
            "--frames",
            "1,2",
            "--seeds",
            "1",
            "--quick",
            "--quiet",
            "--out",
            str(tmp_path),
            "--classifier-cache",
            str(tmp_path / "cache"),
        ]
    )
    with open(tmp_path / "results.csv") as handle:
        reader = csv.DictReader(handle)
        assert reader.fieldnames[:9] == ["dataset", "model", "frames", "augmentation", "seed", "psnr", "fid", "is", "train_s"]
        written = list(reader)
    assert reader.fieldnames == COLUMNS and len(written) == len(rows) == 6
    assert [(r["model"], r["frames"], r["augmentation"]) for r in written] == [
        ("tokenizer", "1", "none"),
        ("ar", "1", "none"),
        ("masked", "1", "none"),
        ("tokenizer", "2", "blur"),
        ("ar", "2", "blur"),
        ("masked", "2", "blur"),
    ]
    for row in written:
        assert float(row["fid"]) >= 0 and float(row["is"]) >= 1 and 1 <= float(row["perplexity"]) <= 32
        assert (row["psnr"] != "") == (row["model"] == "tokenizer")
    names = {path.name for path in tmp_path.glob("*.png")}
    assert {
        "reconstructions_seed0.png",
        "reconstructions_1frames_seed0.png",
        "samples_ar_1frames_seed0.png",
        "samples_masked_2frames_seed0.png",
        "samples_ar_2frames_seed0_videos.png",
        "pseudo_videos_2frames.png",
    } <= names


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--frames", "3"], "--frames"),
        (["--frames", "1,x"], "--frames"),
        (["--model", "gan"], "--model"),
        (["--layers", "3"], "--layers"),
        (["--seeds", "0"], "--seeds"),
        (["--first-seed", "-1"], "--first-seed"),
        (["--augmentation", "noise"], "--augmentation"),
    ],
)
def test_bad_arguments_are_named(argv, message, capsys):
    with pytest.raises(SystemExit):
        parse_arguments(argv + ["--out", "unused"])
    assert message in capsys.readouterr().err


def test_first_seed_selects_the_seed_range():
    assert list(parse_arguments(["--out", "unused"]).seed_range) == [0]
    assert list(parse_arguments(["--seeds", "2", "--first-seed", "3", "--out", "unused"]).seed_range) == [3, 4]


@pytest.mark.filterwarnings("ignore::pseudovideo.metrics.MetricReliabilityWarning")  # quick runs score 16 images
def test_augmentation_chooses_the_tokenizers_pseudo_videos(tmp_path, monkeypatch):
    """``--augmentation markov_high``: the C-ViViT trains on noisy pseudo videos, z_1 = sqrt(1 - beta) z_2 + sqrt(beta) eps."""
    from pseudovideo.models.tokenizer import VideoTokenizer

    seen = []
    forward = VideoTokenizer.forward

    def spy(self, videos, *rest, **keywords):
        seen.append(videos.detach().clone())
        return forward(self, videos, *rest, **keywords)

    monkeypatch.setattr(VideoTokenizer, "forward", spy)
    argv = ["--dataset", "digits", "--downsample", "1", "--model", "tokenizer", "--frames", "1,2", "--quick", "--quiet"]
    rows = main(argv + ["--augmentation", "markov_high", "--out", str(tmp_path), "--classifier-cache", str(tmp_path / "cache")])
    with open(tmp_path / "results.csv") as handle:
        assert [(r["frames"], r["augmentation"]) for r in csv.DictReader(handle)] == [("1", "none"), ("2", "markov_high")]
    assert [r["augmentation"] for r in rows] == ["none", "markov_high"]
    beta = 1e-4  # the linear schedule's only value for two frames
    videos = torch.cat([batch for batch in seen if batch.dim() == 5])  # the image VQ-VAE's batches are 4-D
    noise = (videos[:, 0] - (1 - beta) ** 0.5 * videos[:, 1]) / beta**0.5  # blur would give |noise| ~ 10
    assert noise.numel() >= 256 and abs(noise.mean().item()) < 0.2 and abs(noise.std().item() - 1) < 0.15
    assert parse_arguments(["--out", "unused"]).augmentation == "blur"
