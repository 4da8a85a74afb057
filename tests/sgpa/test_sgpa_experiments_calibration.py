"""End-to-end calibration runner on scikit-learn digits (no Debian dataset needed)."""

import csv
import math
import sys

import numpy as np
import pytest
import torch
from sklearn.metrics import accuracy_score, average_precision_score, log_loss, roc_auc_score

from experiments.sgpa.calibration import CSV_COLUMNS, QUICK_CONFIG, _Runner, load_task, main


@pytest.fixture(scope="module")
def runner():
    torch.manual_seed(0)
    return _Runner(load_task("digits", QUICK_CONFIG, seed=0), QUICK_CONFIG, progress=False)


def test_mle_row_matches_sklearn_on_recomputed_probabilities(runner):
    row = runner.evaluate("mle-kernel", 0)
    model, seconds = runner.networks[("mle-kernel", 0)]
    task = runner.task
    with torch.no_grad():
        probs = model.eval()(task.test.features)[0].softmax(-1).double().numpy()
        ood = model(task.ood.features)[0].softmax(-1).double().numpy()
    probs, ood = probs / probs.sum(-1, keepdims=True), ood / ood.sum(-1, keepdims=True)
    labels = task.test.labels.numpy()
    assert row["accuracy"] == pytest.approx(accuracy_score(labels, probs.argmax(-1)))
    assert row["nll"] == pytest.approx(log_loss(labels, probs, labels=list(range(10))), rel=1e-5)
    entropy = np.r_[-(probs * np.log(probs)).sum(-1), -(ood * np.log(ood)).sum(-1)]
    is_ood = np.r_[np.zeros(len(probs)), np.ones(len(ood))]
    assert row["auroc"] == pytest.approx(roc_auc_score(is_ood, entropy), abs=1e-4)
    assert row["aupr"] == pytest.approx(average_precision_score(is_ood, entropy), abs=1e-4)
    assert row["train_s_per_epoch"] == seconds > 0


def test_ts_mcd_de_reuse_the_mle_network(runner):
    mle = runner.evaluate("mle-kernel", 0)
    ts = runner.evaluate("ts", 0)
    mcd = runner.evaluate("mcd", 0)
    de = runner.evaluate("de", 0)
    # A temperature rescales logits: the argmax and hence the accuracy are unchanged.
    assert ts["accuracy"] == mle["accuracy"]
    assert ts["train_s_per_epoch"] == mcd["train_s_per_epoch"] == mle["train_s_per_epoch"]
    member_seconds = [runner.networks[("mle-kernel", k)][1] for k in range(QUICK_CONFIG.ensemble_size)]
    assert de["train_s_per_epoch"] == pytest.approx(sum(member_seconds))
    # Temperature scaling minimises validation NLL, so it cannot be worse there than T = 1.
    model = runner.networks[("mle-kernel", 0)][0]
    with torch.no_grad():
        val_logits = model.eval()(runner.task.val.features)[0].double()
    from gpytorch_sgpa.baselines import TemperatureScaling

    scaler = TemperatureScaling().fit(val_logits, runner.task.val.labels)
    val_labels = runner.task.val.labels
    assert (
        float(torch.nn.functional.cross_entropy(scaler(val_logits).detach(), val_labels))
        <= float(torch.nn.functional.cross_entropy(val_logits, val_labels)) + 1e-9
    )


def test_cli_writes_contract_csv_and_table(tmp_path, capsys):
    rows = main(
        [
            "--dataset",
            "digits",
            "--methods",
            "mle-sdp,sgpa",
            "--seeds",
            "2",
            "--quick",
            "--train-size",
            "128",
            "--test-size",
            "64",
            "--out",
            str(tmp_path),
            "--no-progress",
        ]
    )
    with open(tmp_path / "results.csv") as handle:
        reader = csv.DictReader(handle)
        assert tuple(reader.fieldnames) == CSV_COLUMNS
        written = list(reader)
    assert [(r["method"], r["seed"]) for r in written] == [("mle-sdp", "0"), ("sgpa", "0"), ("mle-sdp", "1"), ("sgpa", "1")]
    assert all(0 <= float(r["accuracy"]) <= 1 and math.isfinite(float(r["nll"])) for r in written)
    assert len(rows) == 4 and (tmp_path / "results.png").is_file()
    table = capsys.readouterr().out
    assert "| digits | sgpa | 2 |" in table and "±" in table


def test_sgpa_starts_from_the_mle_snapshot():
    # Thesis App. B.4: SGPA's deep-kernel parameters start from an MLE network part-way through
    # training. With a vanishing learning rate the SGPA network keeps the snapshot it was given.
    from dataclasses import replace

    config = replace(QUICK_CONFIG, epochs=2, mle_init_epochs=1, lr=1e-30, train_size=64)
    torch.manual_seed(0)
    init_runner = _Runner(load_task("digits", config, seed=0), config, progress=False)
    sgpa, _ = init_runner.network("sgpa", 0, 0)
    snapshot = init_runner.mle_snapshots[0]
    state = sgpa.state_dict()
    shared = [k for k in snapshot if k in state]
    assert "layers.0.attention.qk_proj.weight" in shared and "head.weight" in shared
    assert all(torch.allclose(state[k], snapshot[k]) for k in shared)
    assert "layers.0.attention.global_inducing_inputs" in state
    with pytest.raises(ValueError, match="mle_init_epochs"):
        from experiments.sgpa.calibration import run

        run("digits", ["sgpa"], [0], replace(config, mle_init_epochs=2))


def test_checkpoint_is_selected_on_validation_accuracy():
    """Thesis App. B.4: the evaluated checkpoint is the epoch with the best validation accuracy.
    Reference: the same (deterministic, MLE) training without selection, snapshotted every epoch."""
    from dataclasses import replace

    from experiments.sgpa import calibration
    from gpytorch_sgpa import metrics

    config = replace(QUICK_CONFIG, epochs=4, train_size=128, lr=3e-3)
    task = load_task("digits", config, seed=0)
    accuracies = []
    original = calibration.train_classifier

    def recording(model, data, **kwargs):
        hook = kwargs.pop("on_epoch_end")

        def record(epoch, trained):
            with torch.no_grad():
                probs = trained.eval()(task.val.features)[0].softmax(-1).double()
            accuracies.append(metrics.accuracy(probs, task.val.labels))
            hook(epoch, trained)

        return original(model, data, on_epoch_end=record, **kwargs)

    calibration.train_classifier = recording
    try:
        torch.manual_seed(0)
        selected = _Runner(task, config, progress=False)
        selected.network("mle-sdp", 0, 0)
    finally:
        calibration.train_classifier = original
    record = selected.training_records[("mle-sdp", 0)]
    best = max(range(len(accuracies)), key=lambda i: (accuracies[i], -i))
    assert record["selected_epoch"] == best + 1
    model = selected.networks[("mle-sdp", 0)][0]
    with torch.no_grad():
        probs = model.eval()(task.val.features)[0].softmax(-1).double()
    assert metrics.accuracy(probs, task.val.labels) == pytest.approx(max(accuracies))
    final = _Runner(task, replace(config, select_on_validation=False), progress=False)
    torch.manual_seed(0)
    final.network("mle-sdp", 0, 0)
    assert final.training_records[("mle-sdp", 0)]["selected_epoch"] == config.epochs


def test_demo_runs_the_calibration_runner_with_valid_flags(tmp_path, monkeypatch):
    """``python -m experiments.sgpa.demo`` hands the runner a command line that the runner's own parser accepts."""
    from experiments.sgpa import calibration, demo

    commands = []
    monkeypatch.setattr(demo, "calibration_main", lambda command: commands.append(command) or [])
    demo.main(["--out", str(tmp_path), "--no-progress"])
    args = calibration.build_parser().parse_args(commands[0])
    assert (args.dataset, args.methods, args.out, args.quick, args.no_progress) == ("digits", "mle-kernel,ts,sgpa", tmp_path, True, True)
    assert (args.train_size, args.epochs, args.threads) == (1000, 10, 1)


def test_kfllla_without_laplace_torch_refuses_before_training(monkeypatch):
    from experiments.sgpa import calibration

    monkeypatch.setitem(sys.modules, "laplace", None)
    monkeypatch.setattr(calibration, "train_classifier", lambda *a, **k: pytest.fail("trained before refusing"))
    with pytest.raises(ModuleNotFoundError, match=r"'laplace-torch'.*pip install laplace-torch"):
        calibration.run("digits", ["mle-kernel", "kfllla"], [0], QUICK_CONFIG)
    with pytest.raises(ValueError, match="kfllla needs an image dataset"):
        calibration.run("vader", ["kfllla"], [0], QUICK_CONFIG)
