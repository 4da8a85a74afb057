"""``pseudovideo`` follows the device and dtype of its inputs and models.

Each test builds the same seeded model and data in float64 on the CPU (the reference) and on
``device`` in ``device_dtype`` (``tests/conftest.py``: float64 on CUDA where a GPU is available,
float32 on the CPU) and checks that the results live on ``device``, have its dtype, and equal the
reference.  Random draws come from seeded CPU generators, which the package accepts for tensors on
any device (draws are made where the generator lives, then moved), so both runs use the same
numbers; float32 draws are made in float64 and rounded (:func:`float64_draws`).  Tolerances on
CUDA: ``1e-9`` for the float64 models (a few layers of convolutions and attention, round-off
``~1e-14``).  In float32 on the CPU: ``1e-3`` relative, ``1e-4`` absolute (the HVAE's ELBO and
gradients differ by ``2e-4`` relative, the rest by ``~1e-6``).  The diffusion model runs in float32
on every device, as it is trained (TF32 is off on CUDA, see the ``device`` fixture), against its
float64 CPU run: tolerance ``1e-4`` relative (its bfloat16 sampling is tested in
``test_diffusion_sampling.py``).  Sampled tokens are compared exactly (a probability would have to
sit within round-off of a draw to flip).
"""

import contextlib

import pytest
import torch
from torch import nn

from pseudovideo import METHODS, make_pseudo_video
from pseudovideo.metrics import frechet_distance, inception_score, psnr, train_classifier
from pseudovideo.models.diffusion import AutoregressiveVideoDiffusion
from pseudovideo.models.hvae import HeatHVAE
from pseudovideo.models.prior import AutoregressiveTokenPrior, MaskedTokenPrior
from pseudovideo.models.tokenizer import ImageTokenizer, VideoTokenizer

DT = torch.float64
CPU = torch.device("cpu")
TOL = dict(rtol=1e-9, atol=1e-11)
FLOAT32 = dict(rtol=1e-3, atol=1e-4)


@contextlib.contextmanager
def float64_draws():
    """Inside, ``torch.randn`` and ``torch.rand`` asked for float32 draw in float64 and round: a generator's float32
    and float64 streams differ, and the package draws in the data's dtype, so that the float32 run uses the
    float64 reference's numbers (to rounding)."""
    originals = torch.randn, torch.rand

    def rounded(draw):
        def wrapper(*size, dtype=None, **kwargs):
            if (dtype or torch.get_default_dtype()) != torch.float32:
                return draw(*size, dtype=dtype, **kwargs)
            return draw(*size, dtype=DT, **kwargs).float()

        return wrapper

    torch.randn, torch.rand = (rounded(draw) for draw in originals)
    try:
        yield
    finally:
        torch.randn, torch.rand = originals


def run_both(run, device, dtype):
    """``run(device, dtype)`` and the float64 CPU reference ``run(CPU, float64)``, float32 draws made in float64
    in both (:func:`float64_draws`; the modules' float32 initialisations too)."""
    with float64_draws():
        return run(device, dtype), run(CPU, DT)


def images(where, shape=(3, 1, 8, 8), seed=0, dtype=DT):
    return torch.rand(*shape, generator=torch.Generator().manual_seed(seed), dtype=DT).to(where, dtype)


@pytest.mark.parametrize("method", METHODS)
def test_pseudo_video_builders_on_device(device, device_dtype, assert_matches_cpu, method):
    def run(where, dtype):
        return make_pseudo_video(images(where, dtype=dtype), 5, method, generator=torch.Generator().manual_seed(1))

    assert_matches_cpu(*run_both(run, device, device_dtype), **TOL, float32=FLOAT32)


@pytest.mark.parametrize("encoder", ["heat", "learned"])
def test_heat_hvae_elbo_gradients_and_samples_on_device(device, device_dtype, assert_matches_cpu, encoder):
    def run(where, dtype):
        torch.manual_seed(0)
        model = HeatHVAE(encoder, num_latents=3, image_size=8, width=8, max_std=6.0).double().to(where, dtype)
        x = (images(where) > 0.5).to(dtype)
        loss = model.negative_elbo(x, generator=torch.Generator().manual_seed(2))
        loss.backward()
        samples = model.sample(2, generator=torch.Generator().manual_seed(3))
        return loss, [p.grad for p in model.parameters() if p.grad is not None], samples

    assert_matches_cpu(*run_both(run, device, device_dtype), **TOL, float32=FLOAT32)


@pytest.mark.parametrize("prior_class", [AutoregressiveTokenPrior, MaskedTokenPrior])
def test_token_priors_loss_and_sampling_on_device(device, device_dtype, assert_matches_cpu, prior_class):
    def run(where, dtype):
        torch.manual_seed(0)
        prior = prior_class(5, (2, 3), dim=16, heads=2, layers=1).double().to(where, dtype)
        tokens = torch.randint(0, 5, (4, 2, 3), generator=torch.Generator().manual_seed(4)).to(where)
        if prior_class is MaskedTokenPrior:
            loss = prior.loss(tokens, generator=torch.Generator().manual_seed(5))
        else:
            loss = prior.loss(tokens)
        loss.backward()
        prior.eval()
        samples = prior.sample(3, generator=torch.Generator().manual_seed(6))
        return loss, [p.grad for p in prior.parameters() if p.grad is not None], samples

    result, reference = run_both(run, device, device_dtype)
    assert_matches_cpu(result[:2], reference[:2], **TOL, float32=FLOAT32)
    assert_matches_cpu(result[2], reference[2], rtol=0, atol=0)


@pytest.mark.parametrize("tokenizer_class", [VideoTokenizer, ImageTokenizer])
def test_tokenizers_on_device(device, device_dtype, assert_matches_cpu, tokenizer_class):
    def run(where, dtype):
        torch.manual_seed(0)
        options = dict(patch_size=4, dim=16, heads=2, code_dim=8, codebook_size=16)
        if tokenizer_class is VideoTokenizer:
            tokenizer = VideoTokenizer(4, 8, tubelet_frames=2, spatial_layers=1, temporal_layers=1, **options)
            data = images(where, (2, 4, 1, 8, 8), dtype=dtype)
        else:
            tokenizer = ImageTokenizer(8, **options)
            data = images(where, (2, 1, 8, 8), dtype=dtype)
        tokenizer = tokenizer.double().to(where, dtype)
        tokens = tokenizer.encode(data)  # before the training pass, which re-seeds dead codes from the device's stream
        decoded = tokenizer.decode(tokens)
        output = tokenizer(data)
        output[2].backward()  # reconstruction + quantiser loss
        return list(output), tokens, decoded, [p.grad for p in tokenizer.parameters() if p.grad is not None]

    assert_matches_cpu(*run_both(run, device, device_dtype), **TOL, float32=FLOAT32)


def test_video_diffusion_loss_and_sampling_on_device(device, assert_matches_cpu):
    def run(where, dtype):
        torch.manual_seed(0)
        model = AutoregressiveVideoDiffusion(3, 1, image_size=4, block_out_channels=(8, 16), num_train_timesteps=50).to(where, dtype)
        videos = images(where, (4, 3, 1, 4, 4), dtype=dtype) * 2 - 1
        loss = model.training_loss(videos, generator=torch.Generator().manual_seed(7))
        loss.backward()
        model.eval()
        samples = model.sample(2, 3, generator=torch.Generator().manual_seed(8))
        return loss, samples

    assert_matches_cpu(*run_both(run, device, torch.float32), rtol=1e-4, atol=1e-5, dtype=torch.float32)


class LinearFeatures(nn.Module):
    """A fixed linear feature map (FID depends on the features' first two moments only)."""

    def __init__(self):
        super().__init__()
        self.matrix = nn.Parameter(torch.randn(3, 16, generator=torch.Generator().manual_seed(9), dtype=DT))
        self.num_features = 3

    def forward(self, x):
        return x.flatten(1).to(self.matrix.dtype) @ self.matrix.T


def test_image_metrics_on_device(device, device_dtype, assert_matches_cpu):
    """PSNR, FID with a feature network on ``device``, and IS of a classifier trained on ``device``."""

    def run(where, dtype):
        real = images(where, (60, 1, 4, 4), seed=10, dtype=dtype)
        fake = images(where, (60, 1, 4, 4), seed=11, dtype=dtype) ** 2
        classifier = train_classifier(real.float(), (real.flatten(1).mean(1) > 0.5).long(), epochs=1, batch_size=20)
        return (
            psnr(fake, real),
            frechet_distance(real, fake, LinearFeatures().to(where, dtype)),
            inception_score(fake.float(), classifier, splits=2),
        )

    assert_matches_cpu(*run_both(run, device, device_dtype), rtol=1e-4, atol=1e-6, float32=FLOAT32)  # IS: a float32 classifier
