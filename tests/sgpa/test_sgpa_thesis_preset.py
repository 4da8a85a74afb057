"""``--preset thesis`` of the calibration runner: each setting against the thesis and the SGPA
authors' code, the learning-rate schedule against a hand computation, and a tiny run."""

import csv
import math
from dataclasses import fields

import pytest
import torch

import gpytorch_sgpa.elbo
from experiments.sgpa.calibration import (
    CSV_COLUMNS,
    PRESETS,
    QUICK_CONFIG,
    ExperimentConfig,
    Task,
    build_network,
    load_task,
    main,
    make_config,
    thesis_num_global,
)
from experiments.sgpa.training import Split, learning_rate_factor, train_classifier


def test_presets_set_the_thesis_items_and_keep_the_default_by_name():
    assert make_config("default") == ExperimentConfig()
    thesis = make_config("thesis")
    assert thesis.kl_weighting == "authors" and thesis.beta == 1.0  # eq. (3.18): each sequence's KL x 1
    assert thesis.kl_anneal_fraction == 0.5 and thesis.kl_anneal_epochs == 0  # 0 -> 1 over the first half
    assert thesis.num_global is None  # the thesis's rule, thesis_num_global
    assert thesis.kernel_init == "authors"
    assert (thesis.lr, thesis.lr_final, thesis.lr_warmup_fraction, thesis.restart_optimizer) == (5e-4, 1e-5, 0.01, True)
    changed = {f.name for f in fields(ExperimentConfig) if getattr(thesis, f.name) != getattr(ExperimentConfig(), f.name)}
    assert changed == set(PRESETS["thesis"]) - {"beta", "kl_anneal_epochs"}  # sizes are untouched
    assert make_config("thesis", QUICK_CONFIG, num_global=5).num_global == 5  # options override the preset
    with pytest.raises(ValueError, match="preset"):
        make_config("paper")


def test_thesis_num_global_is_twice_the_average_length_over_the_heads():
    image = Task(
        name="f", kind="image", train=None, val=None, test=None, ood=None, num_classes=10, kernel="rbf", image_size=28, patch_size=7
    )
    assert thesis_num_global(image, 4) == 8  # 16 patches, 4 heads (CIFAR: 64 patches, 4 heads -> 32)
    mask = torch.tensor([[False] * 9 + [True] * 3, [False] * 12, [False] * 4 + [True] * 8])  # lengths 9, 12, 4
    text = Task(
        name="t",
        kind="text",
        train=Split(torch.zeros(3, 12, dtype=torch.long), torch.zeros(3, dtype=torch.long), mask),
        val=None,
        test=None,
        ood=None,
        num_classes=2,
        kernel="exponential",
    )
    assert thesis_num_global(text, 4) == math.ceil(2 * (25 / 3) / 4) == 5  # CoLA: ~10 tokens, 4 heads, 5 keys


def test_thesis_kernel_initialisation_is_the_authors():
    config = make_config("thesis")
    task = load_task("digits", replace_sizes(config), seed=0)
    torch.manual_seed(0)
    network = build_network(task, "sgpa", config)
    kernels = [m.kernel for m in network.modules() if hasattr(m, "kernel") and hasattr(m.kernel, "outputscale")]
    assert len(kernels) == config.num_layers
    log_lengthscales = torch.cat([k.base_kernel.lengthscale.detach().log().flatten() for k in kernels])
    assert log_lengthscales.numel() == config.num_layers * config.d_model
    assert abs(float(log_lengthscales.mean())) < 0.3 and 0.75 < float(log_lengthscales.std()) < 1.25  # N(0, 1)
    for kernel in kernels:
        torch.testing.assert_close(kernel.outputscale.detach(), torch.ones(config.num_heads))  # sigma_f^2 = 1
    default = build_network(task, "sgpa", ExperimentConfig())
    default_kernel = next(m.kernel for m in default.modules() if hasattr(m, "kernel") and hasattr(m.kernel, "outputscale"))
    head_dim = ExperimentConfig().d_model // ExperimentConfig().num_heads
    torch.testing.assert_close(
        default_kernel.base_kernel.lengthscale.detach(), torch.full_like(default_kernel.base_kernel.lengthscale, math.sqrt(head_dim))
    )


def replace_sizes(config):
    from dataclasses import replace

    return replace(config, train_size=256, val_size=64, test_size=64, ood_size=64)


def test_learning_rate_schedule_by_hand():
    ratio = 1e-5 / 5e-4
    # 11 updates, 2 of warm-up from lr_final: r, (1 + r) / 2, then 1 at update 2 decaying to r at update 10
    factors = [learning_rate_factor(step, 11, ratio, 2) for step in range(11)]
    expected = [ratio, (1 + ratio) / 2] + [1 - (1 - ratio) * k / 8 for k in range(9)]
    assert factors == pytest.approx(expected, abs=1e-15)
    assert factors[-1] == pytest.approx(ratio) and max(factors) == 1.0
    # without warm-up: the former schedule, lr decaying linearly to a tenth
    assert [learning_rate_factor(s, 5) for s in range(5)] == pytest.approx([1, 0.775, 0.55, 0.325, 0.1])


def test_train_classifier_follows_the_schedule_and_restarts_adam_each_epoch(monkeypatch):
    seen = []
    original_step = torch.optim.Adam.step

    def recording_step(self, *args, **kwargs):
        seen.append((self, self.param_groups[0]["lr"], len(self.state)))  # the optimiser itself: ids are reused once freed
        return original_step(self, *args, **kwargs)

    monkeypatch.setattr(torch.optim.Adam, "step", recording_step)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(4, 3))
    generator = torch.Generator().manual_seed(0)
    data = Split(torch.randn(40, 1, 2, 2, generator=generator), torch.randint(0, 3, (40,), generator=generator))
    train_classifier(
        model, data, epochs=4, batch_size=10, lr=5e-4, lr_final=1e-5, warmup_fraction=0.1, restart_optimizer_each_epoch=True, progress=False
    )
    lrs = [lr for _, lr, _ in seen]
    assert lrs == pytest.approx([5e-4 * learning_rate_factor(s, 16, 1e-5 / 5e-4, 2) for s in range(16)], rel=1e-12)
    assert lrs[0] == pytest.approx(1e-5) and lrs[2] == pytest.approx(5e-4) and lrs[-1] == pytest.approx(1e-5)
    optimisers = [seen[k][0] for k in range(0, 16, 4)]
    assert len({id(optimiser) for optimiser in optimisers}) == 4  # a new Adam each epoch (all alive here) ...
    assert all(seen[k][0] is optimisers[k // 4] for k in range(16))  # ... used for all of its epoch's steps
    assert [seen[k][2] for k in range(0, 16, 4)] == [0, 0, 0, 0]  # ... with no moments at its first update


def test_tiny_run_with_the_thesis_preset(tmp_path, monkeypatch):
    built = []
    original = gpytorch_sgpa.elbo.SGPAELBO

    class RecordingELBO(original):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            built.append(self)

    monkeypatch.setattr(gpytorch_sgpa.elbo, "SGPAELBO", RecordingELBO)
    rows = main(
        [
            "--dataset",
            "digits",
            "--methods",
            "mle-kernel,sgpa",
            "--seeds",
            "1",
            "--quick",
            "--preset",
            "thesis",
            "--epochs",
            "3",
            "--mle-init-epochs",
            "1",
            "--train-size",
            "128",
            "--test-size",
            "64",
            "--out",
            str(tmp_path),
            "--no-progress",
        ]
    )
    (elbo,) = built
    steps_per_epoch = math.ceil(128 / QUICK_CONFIG.batch_size)
    assert elbo.kl_weighting == "authors"
    assert elbo.anneal_steps == round(0.5 * 2 * steps_per_epoch)  # half of the 2 ELBO epochs
    # after training the weight is 1 on each sequence's whole KL: ELBO = -CE - KL
    logits, labels, kl = torch.randn(5, 10), torch.arange(5), torch.tensor(3.25)
    with torch.no_grad():
        value = elbo.eval()(logits, kl, labels)
    torch.testing.assert_close(value, -torch.nn.functional.cross_entropy(logits, labels) - kl)
    with open(tmp_path / "results.csv") as handle:
        reader = csv.DictReader(handle)
        assert tuple(reader.fieldnames) == CSV_COLUMNS
        written = list(reader)
    assert [r["method"] for r in written] == ["mle-kernel", "sgpa"]
    for row in rows:
        assert 0 <= row["ece_all"] <= row["mce_all"] <= 1 and math.isfinite(row["ece"])
