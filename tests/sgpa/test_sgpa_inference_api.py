"""The PyTorch-shaped inference API: ``posterior_mean()`` (deterministic SGPA), ``predict_proba(model,
...)`` for any model with SGPA layers, and generation reproducible from its generator alone.
References: the layer's own posterior mean, the models' own methods and Monte Carlo."""

import pytest
import torch
from torch import nn

import gpytorch_sgpa
from gpytorch_sgpa import SGPADecoder, SGPAttention, SGPAViT, convert, posterior_mean, predict_proba


def test_posterior_mean_is_the_layers_posterior_mean_and_deterministic():
    torch.manual_seed(0)
    layer = SGPAttention(8, 2, num_global=4).double().eval()
    x = torch.randn(3, 5, 8, dtype=torch.float64)
    with torch.no_grad(), posterior_mean():
        first, _ = layer(x)
        second, _ = layer(x)
        posterior = layer.posterior(x)
    assert torch.equal(first, second)
    expected = layer.out_proj(layer.merge_heads(posterior.mean))  # the output of the mean, before the output projection
    torch.testing.assert_close(first, expected, rtol=0, atol=1e-12)
    with torch.no_grad():  # outside the context the layer samples again, around that mean
        samples = torch.stack([layer(x)[0] for _ in range(2000)])
    assert not torch.equal(samples[0], samples[1])
    assert (samples.mean(0) - first).abs().max() < 4 * samples.std(0).max() / 2000**0.5


def _vit():
    torch.manual_seed(1)
    return SGPAViT(
        image_size=8, patch_size=4, in_channels=1, num_classes=3, d_model=8, num_heads=2, num_layers=2, attention_kwargs={"num_global": 3}
    ).eval()


def test_predict_proba_for_the_package_models_and_for_converted_ones():
    vit, images = _vit(), torch.randn(4, 1, 8, 8)
    torch.manual_seed(2)
    ours = predict_proba(vit, images, num_samples=5)
    torch.manual_seed(2)
    theirs = vit.predict_proba(images, num_samples=5)
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-6)
    with posterior_mean():
        deterministic = predict_proba(vit, images, num_samples=3)
        torch.testing.assert_close(deterministic, torch.softmax(vit(images)[0], -1), rtol=0, atol=1e-6)

    class Classifier(nn.Module):  # a user's own model: returns logits only
        def __init__(self):
            super().__init__()
            layer = nn.TransformerEncoderLayer(8, 2, dim_feedforward=16, batch_first=True, dropout=0.0)
            self.encoder, self.head = nn.TransformerEncoder(layer, 1, enable_nested_tensor=False), nn.Linear(8, 3)

        def forward(self, x):
            return self.head(self.encoder(x).mean(1))

    model = convert(Classifier(), attention="sgpa").train()
    probabilities = predict_proba(model, torch.randn(5, 4, 8), num_samples=4)
    assert probabilities.shape == (5, 3) and torch.allclose(probabilities.sum(-1), torch.ones(5))
    assert model.training  # the mode is restored
    with pytest.raises(ValueError, match="no SGPAttention"):
        predict_proba(Classifier(), torch.randn(2, 4, 8))


def test_generation_depends_on_its_generator_alone():
    torch.manual_seed(3)
    decoder = SGPADecoder(12, d_model=8, num_heads=2, num_layers=2, max_len=12, attention="sgpa").eval()
    prompt = torch.tensor([[1, 2], [3, 4]])
    outputs = []
    for global_seed in (10, 20):
        torch.manual_seed(global_seed)  # a different global random state each time
        outputs.append(decoder.generate(prompt, 6, generator=torch.Generator().manual_seed(5)))
    assert torch.equal(outputs[0], outputs[1])
    other = decoder.generate(prompt, 6, generator=torch.Generator().manual_seed(6))
    assert other.shape == outputs[0].shape
    with pytest.raises(TypeError, match="generator"):
        decoder.layers[0].attention.sample_noise(1, 1, generator=3)


def test_exported_names():
    assert {"posterior_mean", "predict_proba", "convert", "kl_divergence"} <= set(gpytorch_sgpa.__all__)


def test_kl_after_an_evaluation_pass_raises_instead_of_not_training():
    vit, images = _vit().train(), torch.randn(4, 1, 8, 8)
    vit(images)
    gpytorch_sgpa.kl_divergence(vit).backward()  # right after the training forward: fine
    with torch.no_grad():
        vit(images)  # an evaluation pass in between
    with pytest.raises(RuntimeError, match="without gradients"):
        gpytorch_sgpa.kl_divergence(vit)
    with torch.no_grad():
        assert torch.isfinite(gpytorch_sgpa.kl_divergence(vit))  # reading it without gradients is fine


def test_package_models_can_return_logits_only_for_an_ordinary_loop():
    """``return_kl = False``: ``model(x)`` is the logits, the loss is cross-entropy plus the KL that
    ``kl_divergence`` collects, equal to the default ``(logits, kl)`` route."""
    import torch.nn.functional as F

    vit, images, labels = _vit().train(), torch.randn(4, 1, 8, 8), torch.tensor([0, 1, 2, 0])
    torch.manual_seed(7)
    logits, kl = vit(images)
    reference = F.cross_entropy(logits, labels) + kl / 100
    vit.return_kl = False
    torch.manual_seed(7)
    logits_only = vit(images)
    assert isinstance(logits_only, torch.Tensor) and torch.equal(logits_only, logits)
    loss = F.cross_entropy(logits_only, labels) + gpytorch_sgpa.kl_divergence(vit) / 100
    torch.testing.assert_close(loss, reference, rtol=0, atol=0)
    loss.backward()
    assert vit.predict_proba(images, num_samples=2).shape == (4, 3)
