"""The last-layer Laplace approximation (``laplace-torch``, optional): named errors, a proper predictive that differs
from the MAP, Hugging Face classifiers, and the install that CI's zoo check runs."""

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from gpytorch_sgpa.baselines import predict_proba
from gpytorch_sgpa.baselines.laplace import LastLayerLaplace

sys.path.insert(0, str(Path(__file__).resolve().parent))  # also under --import-mode=importlib (CI's zoo check)
from classifier_fixtures import _classifier, _hf_classifier  # noqa: E402

needs_laplace = pytest.mark.skipif(
    importlib.util.find_spec("laplace") is None,
    reason="needs laplace-torch (not a probseq dependency): pip install laplace-torch, beside a "
    "torchvision that matches torch (CI's zoo environment)",
)


def _trained(seed=0, steps=150):
    """A small classifier trained to a MAP on 80 points of three classes, with the data."""
    generator = torch.Generator().manual_seed(seed)
    inputs = torch.randn(80, 4, generator=generator)
    labels = (inputs[:, 0] > 0).long() + (inputs[:, 1] > 0.5).long()
    model = _classifier(seed)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(steps):
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(inputs), labels).backward()
        optimizer.step()
    return model, inputs, labels


def test_a_missing_laplace_torch_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "laplace", None)
    model, inputs, labels = _trained(steps=1)
    with pytest.raises(ModuleNotFoundError, match=r"'laplace-torch'.*pip install laplace-torch") as error:
        LastLayerLaplace(model).fit(inputs, labels)
    assert error.value.name == "laplace"


def test_bad_laplace_arguments_raise_named_errors():
    model, inputs, labels = _trained(steps=1)
    with pytest.raises(TypeError, match="torch.nn.Module"):
        LastLayerLaplace(lambda x: x)
    with pytest.raises(ValueError, match="hessian_structure"):
        LastLayerLaplace(model, hessian_structure="block")
    with pytest.raises(ValueError, match="last_layer_name"):
        LastLayerLaplace(model, last_layer_name="1")  # the Tanh
    with pytest.raises(ValueError, match="last_layer_name"):
        LastLayerLaplace(model, last_layer_name="head")
    with pytest.raises(ValueError, match="prior_precision"):
        LastLayerLaplace(model, prior_precision=0.0)
    laplace = LastLayerLaplace(model)
    with pytest.raises(ValueError, match="labels"):
        laplace.fit(inputs, labels[:-1])
    with pytest.raises(ValueError, match="labels"):
        laplace.fit(inputs, labels.float())
    with pytest.raises(ValueError, match="labels"):
        laplace.fit(inputs, labels - 1)
    with pytest.raises(ValueError, match="NaN"):
        laplace.fit(torch.full_like(inputs, float("nan")), labels)
    with pytest.raises(ValueError, match="inputs"):
        laplace.fit(inputs[:0], labels[:0])
    with pytest.raises(ValueError, match="optimize_prior"):
        laplace.fit(inputs, labels, optimize_prior="gridsearch")
    with pytest.raises(ValueError, match="batch_size"):
        laplace.fit(inputs, labels, batch_size=0)
    with pytest.raises(RuntimeError, match="not fitted"):
        laplace.predict_proba(inputs)
    with pytest.raises(TypeError, match="predict_proba"):
        laplace(inputs)


@needs_laplace
def test_last_layer_laplace_is_a_proper_predictive_that_differs_from_the_map():
    model, inputs, labels = _trained()
    model.train()
    weights = {name: value.clone() for name, value in model.state_dict().items()}
    laplace = LastLayerLaplace(model, last_layer_name="3").fit(inputs, labels)
    assert model.training  # mode restored, weights untouched (laplace-torch works on a copy)
    assert all(torch.equal(weights[name], value) for name, value in model.state_dict().items())
    assert laplace.prior_precision > 0
    test = torch.randn(50, 4, generator=torch.Generator().manual_seed(1))
    probs = laplace.predict_proba(test)
    assert probs.shape == (50, 3) and not probs.requires_grad
    assert (probs >= 0).all() and (probs <= 1).all()
    torch.testing.assert_close(probs.sum(-1), torch.ones(50), rtol=0, atol=1e-5)
    with torch.no_grad():
        map_probs = model.eval()(test).softmax(-1)
    assert (probs - map_probs).abs().max() > 1e-3
    # the linearised predictive is less confident than the MAP on average (it integrates over the head)
    assert probs.max(-1).values.mean() < map_probs.max(-1).values.mean()
    assert probs.argmax(-1).eq(map_probs.argmax(-1)).float().mean() > 0.9
    torch.testing.assert_close(predict_proba(laplace, test), probs)  # the package's predict_proba dispatches to it
    torch.testing.assert_close(laplace.predict_proba(test, batch_size=7), probs)  # chunking changes nothing
    mc = laplace.predict_proba(test, link_approx="mc", num_samples=200)
    torch.testing.assert_close(mc.sum(-1), torch.ones(50), rtol=0, atol=1e-5)
    with pytest.raises(ValueError, match="link_approx"):
        laplace.predict_proba(test, link_approx="softmax")
    with pytest.raises(ValueError, match=r"labels must lie in \[0, 3\)"):
        LastLayerLaplace(model).fit(inputs, labels + 1)


@needs_laplace
def test_last_layer_laplace_without_prior_optimisation_keeps_the_given_precision():
    model, inputs, labels = _trained()
    laplace = LastLayerLaplace(model, hessian_structure="diag", prior_precision=3.0).fit(inputs, labels, optimize_prior=None)
    assert laplace.prior_precision == pytest.approx(3.0)
    assert laplace.predict_proba(inputs).shape == (80, 3)


@needs_laplace
def test_last_layer_laplace_of_a_hugging_face_classifier_equals_that_of_its_logits():
    class Logits(torch.nn.Module):
        def __init__(self, model):
            super().__init__()
            self.bert = model

        def forward(self, ids):
            return self.bert(ids).logits

    bert, ids, _ = _hf_classifier(0)
    labels = torch.tensor([0, 1, 2, 1, 0])
    fitted = LastLayerLaplace(bert, last_layer_name="classifier").fit(ids, labels)
    reference = LastLayerLaplace(Logits(bert), last_layer_name="bert.classifier").fit(ids, labels)
    assert fitted.prior_precision == pytest.approx(reference.prior_precision)
    torch.testing.assert_close(fitted.predict_proba(ids), reference.predict_proba(ids))
    assert LastLayerLaplace(bert).fit(ids, labels).predict_proba(ids).shape == (5, 3)  # the head found by laplace-torch


@needs_laplace
@pytest.mark.filterwarnings("ignore:By default `link_approx` is `probit`:UserWarning")  # laplace-torch's reminder
def test_the_calibration_runners_kfllla_is_the_last_layer_laplace_of_its_mle_network():
    """``--methods kfllla`` at the runner's ``--quick`` setting: laplace-torch's own KFLLLA of the ``mle-kernel`` network
    (fitted on the training set, prior precision by the marginal likelihood, probit GLM predictive) gives the row."""
    import laplace
    from sklearn.metrics import log_loss, roc_auc_score

    from experiments.sgpa.calibration import QUICK_CONFIG, _Runner, load_task

    runner = _Runner(load_task("digits", QUICK_CONFIG, seed=0), QUICK_CONFIG, progress=False)
    row, mle = runner.evaluate("kfllla", 0), runner.evaluate("mle-kernel", 0)
    model, seconds = runner.networks[("mle-kernel", 0)]
    task = runner.task

    class Logits(torch.nn.Module):
        def __init__(self, vit):
            super().__init__()
            self.vit = vit

        def forward(self, images):
            return self.vit(images)[0]

    reference = laplace.Laplace(Logits(model), "classification", subset_of_weights="last_layer", hessian_structure="kron")
    train = torch.utils.data.TensorDataset(task.train.features, task.train.labels)
    reference.fit(torch.utils.data.DataLoader(train, batch_size=QUICK_CONFIG.batch_size))
    reference.optimize_prior_precision(method="marglik", pred_type="glm", link_approx="probit")
    probs, ood = (reference(x, pred_type="glm", link_approx="probit").double().numpy() for x in (task.test.features, task.ood.features))
    probs, ood = probs / probs.sum(-1, keepdims=True), ood / ood.sum(-1, keepdims=True)
    labels = task.test.labels.numpy()
    assert row["accuracy"] == pytest.approx((probs.argmax(-1) == labels).mean())
    assert row["nll"] == pytest.approx(log_loss(labels, probs, labels=list(range(10))), rel=1e-4)
    entropy = np.r_[-(probs * np.log(probs)).sum(-1), -(ood * np.log(ood)).sum(-1)]
    assert row["auroc"] == pytest.approx(roc_auc_score(np.r_[np.zeros(len(probs)), np.ones(len(ood))], entropy), abs=1e-4)
    assert row["nll"] != mle["nll"] and row["train_s_per_epoch"] == mle["train_s_per_epoch"] == seconds  # post hoc


def test_the_documented_laplace_install_is_the_one_ci_runs():
    """The guide's commands, and the error of a missing laplace-torch, install the torch/torchvision pair that
    CI's zoo check installs (the pair imports together; the torchvision pip picks for torch 2.13.0 does not)."""
    from gpytorch_sgpa.baselines.laplace import LAPLACE_INSTALL

    root = Path(__file__).resolve().parents[2]
    guide = (root / "docs" / "guide" / "sgpa.md").read_text()
    ci = (root / ".ci" / "run").read_text()
    pair = "pip install torch==2.14.1 torchvision==0.29.1"
    laplace = "laplace-torch==0.3"
    assert pair in LAPLACE_INSTALL and laplace in LAPLACE_INSTALL
    assert f'{pair}\npip install "probseq[zoo]" {laplace}' in guide
    assert pair.replace("install", "install -q") in ci and "laplace-torch" in ci
    assert f"{laplace}\n" in (root / "constraints.txt").read_text()  # what the zoo check's constraints pin
