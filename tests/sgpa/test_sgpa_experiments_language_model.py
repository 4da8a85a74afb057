"""Language-model experiment: encoding, per-word scores against hand computations, the CLI's CSV."""

import csv
import math

import pytest
import torch
from vader_fixtures import fake_vader_corpora

from experiments.sgpa import language_model as lm
from experiments.sgpa.training import mle_loss
from gpytorch_sgpa import SGPADecoder
from gpytorch_sgpa.data import Vocabulary
from gpytorch_sgpa.elbo import IGNORE_INDEX


def _vocabulary():
    return Vocabulary([lm.BOS, lm.EOS, "a", "good", "film", "bad"])


def test_encode_for_lm_shifts_targets_and_truncates():
    vocabulary = _vocabulary()
    split = lm.encode_for_lm(["A good film", "bad bad bad bad bad", "unknownword"], vocabulary, max_len=4)
    s = vocabulary.stoi
    bos, eos, unk = s[lm.BOS], s[lm.EOS], vocabulary.unk_index
    assert split.features.tolist() == [
        [bos, s["a"], s["good"], s["film"]],
        [bos, s["bad"], s["bad"], s["bad"]],
        [bos, unk, 0, 0],
    ]
    assert split.labels.tolist() == [
        [s["a"], s["good"], s["film"], eos],
        [s["bad"]] * 4,  # cut: no room for <eos>
        [unk, eos, IGNORE_INDEX, IGNORE_INDEX],
    ]
    assert torch.equal(split.padding_mask, split.labels == IGNORE_INDEX)


def test_sequence_mle_loss_is_summed_token_nll_per_sequence():
    torch.manual_seed(1)
    logits = torch.randn(3, 4, 6, dtype=torch.double)
    labels = torch.randint(0, 6, (3, 4))
    labels[0, 2:] = IGNORE_INDEX
    log_probs = torch.log_softmax(logits, -1)
    expected = -sum(log_probs[b, t, labels[b, t]] for b in range(3) for t in range(4) if labels[b, t] >= 0) / 3
    torch.testing.assert_close(mle_loss(logits, labels), expected)


def test_evaluate_lm_scores_every_kept_word():
    torch.manual_seed(2)
    vocabulary = _vocabulary()
    split = lm.encode_for_lm(["a good film", "bad film", "good"], vocabulary, max_len=5)
    model = SGPADecoder(len(vocabulary), 8, 2, 1, 5, attention="kernel").eval()
    log_true, confidence, correct, _ = lm.evaluate_lm(model, split, num_samples=1, batch_size=2)
    with torch.no_grad():
        probs = torch.softmax(model(split.features, key_padding_mask=split.padding_mask)[0], -1)
    keep = split.labels != IGNORE_INDEX
    assert log_true.shape == (int(keep.sum()),)
    torch.testing.assert_close(log_true, probs[keep].gather(-1, split.labels[keep][:, None]).squeeze(-1).log())
    torch.testing.assert_close(confidence, probs[keep].max(-1).values)
    assert torch.equal(correct, probs[keep].argmax(-1) == split.labels[keep])


def test_cli_writes_contract_csv(tmp_path, monkeypatch, capsys):
    archive = tmp_path / "vader.tar.gz"
    fake_vader_corpora(archive)
    monkeypatch.setenv("PROBSEQ_VADER_ARCHIVE", str(archive))
    rows = lm.main(
        [
            "--quick",
            "--methods",
            "mle-kernel,mcd,sgpa",
            "--seeds",
            "2",
            "--train-size",
            "60",
            "--test-size",
            "30",
            "--shift-size",
            "20",
            "--no-progress",
            "--out",
            str(tmp_path / "out"),
        ]
    )
    with open(tmp_path / "out" / "results.csv") as handle:
        reader = csv.DictReader(handle)
        assert tuple(reader.fieldnames) == lm.CSV_COLUMNS
        written = list(reader)
    assert len(written) == len(rows) == 6
    for row in rows:
        assert row["perplexity"] == pytest.approx(math.exp(row["token_nll"]))
        assert 0 <= row["accuracy"] <= 1 and 0 <= row["ece"] <= row["mce"] + 1e-12
    assert "| vader_lm | sgpa | 2 |" in capsys.readouterr().out
    with pytest.raises(ValueError, match="methods"):
        lm.run(["gpt"], [0], lm.QUICK_CONFIG)


def test_cli_passes_the_kl_weighting_and_parameterisation_to_sgpa(tmp_path, monkeypatch):
    """``--kl-weighting`` reaches SGPAELBO and ``--whitened/--no-whitened`` every SGPA layer."""
    archive = tmp_path / "vader.tar.gz"
    fake_vader_corpora(archive)
    monkeypatch.setenv("PROBSEQ_VADER_ARCHIVE", str(archive))
    built = []

    class Recording(lm.SGPAELBO):
        def __init__(self, model, *args, **kwargs):
            super().__init__(model, *args, **kwargs)
            built.append((self.kl_weighting, {m.whitened for m in model.modules() if hasattr(m, "whitened")}))

    monkeypatch.setattr(lm, "SGPAELBO", Recording)
    common = [
        "--quick",
        "--methods",
        "sgpa",
        "--seeds",
        "1",
        "--train-size",
        "40",
        "--test-size",
        "10",
        "--shift-size",
        "10",
        "--no-progress",
        "--out",
        str(tmp_path / "out"),
    ]
    lm.main(common)
    lm.main(common + ["--kl-weighting", "decomposed", "--no-whitened"])
    assert built == [("all-over-n", {True}), ("decomposed", {False})]
    with pytest.raises(SystemExit):
        lm.build_parser().parse_args(["--out", "x", "--kl-weighting", "per-token"])
