"""Bad input to the public entry points of gpytorch_sgpa: a ValueError/TypeError naming the argument,
never a NaN result or an unrelated error from deep inside torch."""

import pytest
import torch
from torch import nn

import gpytorch_sgpa
from gpytorch_sgpa import (
    SGPAELBO,
    KernelAttention,
    MultiheadSGPAttention,
    ScaledDotProductAttention,
    SGPADecoder,
    SGPANoise,
    SGPATransformer,
    SGPAttention,
    SGPAViT,
    evaluate_kernel,
    kernel_blocks,
)
from gpytorch_sgpa.data import corrupt

D, HEADS, LENGTH, BATCH = 8, 2, 5, 2
NAN, INF = float("nan"), float("inf")


def _x(scale=1.0, batch=BATCH, dtype=torch.float32):
    return scale * torch.randn(batch, LENGTH, D, generator=torch.Generator().manual_seed(0), dtype=dtype)


def _with(value):
    x = _x()
    x[0, 1, 2] = value
    return x


def _layers():
    torch.manual_seed(0)
    return {
        "sgpa": SGPAttention(D, HEADS, num_global=3),
        "sgpa-standard": SGPAttention(D, HEADS, mode="standard", max_len=LENGTH),
        "sgpa-causal": SGPAttention(D, HEADS, num_global=3, causal=True),
        "kernel": KernelAttention(D, HEADS),
        "sdp": ScaledDotProductAttention(D, HEADS),
    }


LAYERS = _layers()
SGPA_LAYERS = ("sgpa", "sgpa-standard", "sgpa-causal")


@pytest.mark.parametrize("name", list(LAYERS))
@pytest.mark.parametrize(
    "x, error, match",
    [
        (_with(NAN), ValueError, "x contains NaN"),
        (_with(INF), ValueError, "x contains NaN"),
        (_x(1e20), ValueError, "x .*too large"),  # finite, but its kernel evaluations overflow float32
        (_x(dtype=torch.float64), TypeError, "x has dtype torch.float64"),  # float32 parameters
    ],
    ids=["nan", "inf", "overflow", "dtype"],
)
def test_layer_input(name, x, error, match):
    with pytest.raises(error, match=match):
        LAYERS[name](x)


@pytest.mark.parametrize("name", SGPA_LAYERS)
def test_sgpa_layer_empty_batch_and_posterior(name):
    layer = LAYERS[name]
    with pytest.raises(ValueError, match="x must hold at least one sequence"):
        layer(_x()[:0])
    with pytest.raises(ValueError, match="x contains NaN"):
        layer.posterior(_with(NAN))


@pytest.mark.parametrize("name", SGPA_LAYERS)
def test_sgpa_layer_noise(name):
    layer = LAYERS[name]
    noise = layer.sample_noise(BATCH, LENGTH)
    with pytest.raises(ValueError, match="noise.local contains NaN"):
        layer(_x(), noise=SGPANoise(noise.local * NAN, noise.global_))
    with pytest.raises(ValueError, match="batch_size must be >= 1"):
        layer.sample_noise(-1, LENGTH)


def test_sgpa_global_inputs_and_hyperparameters():
    layer = LAYERS["sgpa"]
    bad = layer.global_inducing_inputs.detach() * NAN
    with pytest.raises(ValueError, match="global_inputs contains NaN"):
        layer(_x(), global_inputs=bad)
    with pytest.raises(ValueError, match="global_inputs contains NaN"):
        layer.global_kl(bad)
    with pytest.raises(ValueError, match="variational_init_std"):
        SGPAttention(D, HEADS, num_global=3, variational_init_std=INF)
    with pytest.raises(ValueError, match="x contains NaN"):
        LAYERS["sgpa-causal"].forward_step(_with(NAN)[:, 1:2])


def _vit():
    torch.manual_seed(0)
    return SGPAViT(
        image_size=8,
        patch_size=4,
        in_channels=1,
        num_classes=3,
        d_model=D,
        num_heads=HEADS,
        num_layers=2,
        attention_kwargs={"num_global": 3},
    )


IMAGES = torch.rand(2, 1, 8, 8, generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize(
    "images, match",
    [
        (IMAGES * NAN, "images contains NaN"),
        (IMAGES.masked_fill(IMAGES > 0.5, INF), "images contains NaN"),
        (IMAGES[:0], "images must hold at least one"),
        (IMAGES * 1e30, "images .*too large"),
    ],
    ids=["nan", "inf", "empty", "overflow"],
)
def test_vit_input(images, match):
    vit = _vit()
    with pytest.raises(ValueError, match=match):
        vit(images)
    with pytest.raises(ValueError, match=match):
        vit.predict_proba(images, num_samples=2)


def test_vit_checks_once_and_its_layers_do_not():
    vit = _vit()
    assert all(not layer.attention.checks_values for layer in vit.layers)
    logits, kl = vit(IMAGES)
    assert torch.isfinite(logits).all() and torch.isfinite(kl)


def _feature_transformer():
    torch.manual_seed(0)
    return SGPATransformer(
        vocab_size=None,
        input_dim=3,
        num_classes=2,
        d_model=D,
        num_heads=HEADS,
        num_layers=1,
        max_len=6,
        task="regression",
        attention_kwargs={"num_global": 3},
    )


FEATURES = torch.randn(2, 5, 3, generator=torch.Generator().manual_seed(2))
TOKENS = torch.randint(0, 10, (2, 5), generator=torch.Generator().manual_seed(3))


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: _feature_transformer()(FEATURES * NAN), "tokens contains NaN"),
        (lambda: _feature_transformer()(FEATURES * INF), "tokens contains NaN"),
        (lambda: _feature_transformer()(FEATURES[:0]), "tokens must hold at least one"),
        (lambda: _feature_transformer()(FEATURES[:, :0]), "tokens must hold at least one"),
        (lambda: SGPATransformer(10, 3, D, HEADS, 1, 6, attention_kwargs={"num_global": 3})(TOKENS[:0]), "tokens must hold at least one"),
        (
            lambda: SGPATransformer(10, 3, D, HEADS, 1, 6, attention_kwargs={"num_global": 3})(TOKENS[:, :0]),
            "tokens must hold at least one",
        ),
    ],
    ids=["features-nan", "features-inf", "features-empty", "features-no-length", "tokens-empty", "tokens-no-length"],
)
def test_transformer_input(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def _decoder():
    torch.manual_seed(0)
    return SGPADecoder(vocab_size=10, d_model=D, num_heads=HEADS, num_layers=2, max_len=8, attention_kwargs={"num_global": 3})


def test_decoder_input():
    decoder = _decoder()
    with pytest.raises(ValueError, match="tokens must hold at least one"):
        decoder(TOKENS[:0])
    noise = [SGPANoise(n.local * NAN, n.global_) for n in decoder.sample_noise(2, 5)]
    with pytest.raises(ValueError, match=r"noise\[0\].local contains NaN"):
        decoder(TOKENS, noise=noise)
    with pytest.raises(TypeError, match="generator"):
        decoder.generate(TOKENS[:, :2], 2, generator=3)
    with pytest.raises(ValueError, match="batch_size"):
        decoder.sample_noise(-1, 3)


def test_elbo_input():
    vit = _vit()
    elbo = SGPAELBO(vit, num_data=100)
    logits, kl = vit(IMAGES)
    labels = torch.tensor([0, 1])
    with pytest.raises(ValueError, match="outputs contains NaN"):
        elbo(logits * NAN, kl, labels)
    with pytest.raises(ValueError, match="outputs contains NaN"):
        elbo(logits * INF, kl, labels)
    masked = logits.detach().clone()
    masked[..., -1] = -INF  # a class masked out by -inf logits, as F.cross_entropy allows
    assert torch.isfinite(elbo(masked, kl, labels))
    with pytest.raises(ValueError, match="kl contains NaN"):
        elbo(logits, kl * NAN, labels)
    with pytest.raises(ValueError, match="kl contains NaN"):
        elbo(logits, kl * INF, labels)
    with pytest.raises(ValueError, match="targets must hold at least one"):
        elbo(logits[:0], kl, labels[:0])
    with pytest.raises(TypeError, match="outputs must be a floating-point tensor"):
        elbo(logits.long(), kl, labels)
    model = _feature_transformer()
    regression = SGPAELBO(model, num_data=10)
    outputs, kl = model(FEATURES)
    with pytest.raises(ValueError, match="targets contains NaN"):
        regression(outputs, kl, torch.full((2, 2), INF))
    with pytest.raises(ValueError, match="targets must hold at least one"):
        regression(outputs[:0], kl, torch.zeros(0, 2))


class _Classifier(nn.Module):
    def __init__(self):
        super().__init__()
        layer = nn.TransformerEncoderLayer(D, HEADS, dim_feedforward=16, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, num_layers=2)

    def forward(self, x):
        return self.encoder(x).mean(1)


def test_converted_model_and_adapter_input():
    torch.manual_seed(0)
    model = gpytorch_sgpa.convert(_Classifier(), num_global=3)
    with pytest.raises(ValueError, match="x contains NaN"):
        model(_with(NAN))
    adapter = MultiheadSGPAttention(D, HEADS, batch_first=True, num_global=3)
    x = _with(INF)
    with pytest.raises(ValueError, match="x contains NaN"):
        adapter(x, x, x)


def test_kernel_functions_and_corruptions_input():
    kernel = LAYERS["kernel"].kernel
    bad = torch.full((1, HEADS, 3, D // HEADS), NAN)
    with pytest.raises(ValueError, match="x1 contains NaN"):
        evaluate_kernel(kernel, bad)
    with pytest.raises(ValueError, match="x1 contains NaN"):
        kernel_blocks(kernel, bad)
    with pytest.raises(TypeError, match="x1 must be a torch.Tensor"):
        evaluate_kernel(kernel, [1.0])
    with pytest.raises(ValueError, match="images must lie in"):
        corrupt(IMAGES * NAN, "blur", 1)


def test_convert_of_an_unsupported_family_names_register_adapter_and_the_supported_modules():
    class Mixer(torch.nn.Module):  # attention-free
        def __init__(self):
            super().__init__()
            self.mix = torch.nn.Linear(4, 4)

    with pytest.raises(ValueError, match=r"register_adapter") as error:
        gpytorch_sgpa.convert(Mixer())
    for name in ("MultiheadAttention", "BertSelfAttention", "ViTAttention", "GPT2Attention"):
        assert name in str(error.value)


def test_per_example_noise_needs_one_seed_per_sequence():
    model = gpytorch_sgpa.convert(nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True), num_global=3)
    x = torch.randn(4, 5, 8)
    with gpytorch_sgpa.per_example_noise(range(4)):
        model(x)
    with pytest.raises(ValueError, match="one per sequence"), gpytorch_sgpa.per_example_noise(range(3)):
        model(x)
