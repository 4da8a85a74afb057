"""Bad input to the public entry points of pseudovideo: a ValueError/TypeError naming the argument,
never a NaN result or an unrelated error from deep inside torch; or a correct finite result."""

import math

import pytest
import torch

from pseudovideo import METHODS, context_gain_table, make_pseudo_video, min_mse, optimal_predictor
from pseudovideo.metrics import ImageClassifier, PenultimateFeatures, frechet_distance, inception_score, psnr, train_classifier
from pseudovideo.models.diffusion import AutoregressiveVideoDiffusion
from pseudovideo.models.hvae import HeatHVAE
from pseudovideo.models.prior import AutoregressiveTokenPrior, MaskedTokenPrior
from pseudovideo.models.quantizer import VectorQuantizer
from pseudovideo.models.tokenizer import ImageTokenizer, VideoTokenizer

NAN, INF = float("nan"), float("inf")
IMAGES = torch.rand(2, 1, 8, 8, generator=torch.Generator().manual_seed(0))


def _with(value, images=IMAGES):
    images = images.clone()
    images[0, 0, 1, 2] = value
    return images


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("value", [NAN, INF, -INF])
def test_non_finite_images(method, value):
    with pytest.raises(ValueError, match=f"images contains {'NaN' if math.isnan(value) else 'infinite'} values"):
        make_pseudo_video(_with(value), 4, method)


@pytest.mark.parametrize(
    "method, params, error, match",
    [
        ("blur", {"rate": NAN}, ValueError, "rate"),
        ("blur", {"rate": INF}, ValueError, "rate"),
        ("blur", {"rate": 1e6}, ValueError, "rate"),  # exp(rate t) overflows
        ("blur", {"rate": True}, TypeError, "rate"),
        ("blur", {"rate": None}, TypeError, "rate"),
        ("blur", {"kernel_size": True}, TypeError, "kernel_size"),
        ("heat", {"max_std": INF}, ValueError, "max_std"),
        ("heat", {"noise_std": NAN}, ValueError, "noise_std"),
        ("heat", {"noise_std": INF}, ValueError, "noise_std"),
        ("heat", {"min_std": "a"}, TypeError, "min_std"),
        ("markov_first", {"beta_start": None}, TypeError, "beta_start"),
        ("markov_high", {"beta_end": "a"}, TypeError, "beta_end"),
    ],
)
def test_builder_hyperparameters(method, params, error, match):
    with pytest.raises(error, match=match):
        make_pseudo_video(IMAGES, 4, method, **params)


def test_builder_other_arguments():
    with pytest.raises(ValueError, match="images must have C, H, W >= 1"):
        make_pseudo_video(IMAGES[..., :0], 4, "heat")
    with pytest.raises(TypeError, match="generator"):
        make_pseudo_video(IMAGES, 4, "markov_first", generator=3)
    with pytest.raises(ValueError, match="method"):
        make_pseudo_video(IMAGES, 4, ["blur"])


def test_heat_with_a_huge_finite_blur_width_reaches_the_image_mean():
    video = make_pseudo_video(IMAGES.double(), 3, "heat", max_std=1e300, noise_std=0.0)
    assert torch.isfinite(video).all()
    mean = IMAGES.double().mean((-2, -1), keepdim=True).expand_as(IMAGES)
    torch.testing.assert_close(video[:, 0], mean)


COVARIANCE = torch.cov(torch.rand(50, 4, generator=torch.Generator().manual_seed(1)).T.double())


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"covariance": COVARIANCE * INF}, ValueError, "covariance"),
        ({"covariance": COVARIANCE[:0, :0]}, ValueError, "covariance"),
        ({"beta_start": NAN}, ValueError, "beta_start"),
        ({"beta_end": 2.0}, ValueError, "beta_end"),
        ({"given": 3}, TypeError, "given"),
        ({"given": [2.5]}, TypeError, "given"),
    ],
)
def test_min_mse_arguments(kwargs, error, match):
    arguments = {"covariance": COVARIANCE, "num_frames": 4, "method": "markov_high", "given": [3], **kwargs}
    with pytest.raises(error, match=match):
        min_mse(**arguments)


def test_optimal_predictor_and_gain_table():
    with pytest.raises(ValueError, match="mean contains NaN"):
        optimal_predictor(torch.full((4,), NAN), COVARIANCE, 4, "markov_high", given=[3])
    with pytest.raises(TypeError, match="frame_counts"):
        context_gain_table(COVARIANCE, 4)
    rows = context_gain_table(torch.zeros(4, 4, dtype=torch.float64), [4])  # nothing to predict: no gain
    assert [row[-1] for row in rows] == [0.0, 0.0]


@pytest.mark.parametrize(
    "preds, target, data_range, error, match",
    [
        (IMAGES, IMAGES.flip(0), 0.0, ValueError, "data_range"),
        (IMAGES, IMAGES.flip(0), -1.0, ValueError, "data_range"),
        (IMAGES, IMAGES.flip(0), NAN, ValueError, "data_range"),
        (IMAGES, IMAGES.flip(0), INF, ValueError, "data_range"),
        (_with(NAN), IMAGES, 1.0, ValueError, "preds"),
        (IMAGES, _with(INF), 1.0, ValueError, "target"),
        (IMAGES[:0], IMAGES[:0], 1.0, ValueError, "preds"),
        (IMAGES.tolist(), IMAGES, 1.0, TypeError, "preds"),
    ],
)
def test_psnr_arguments(preds, target, data_range, error, match):
    with pytest.raises(error, match=match):
        psnr(preds, target, data_range=data_range)


def test_fid_inception_score_and_classifier_arguments():
    torch.manual_seed(0)
    classifier = ImageClassifier(1, 3, 8)
    images = torch.rand(4, 1, 8, 8)
    with pytest.raises(ValueError, match="real contains NaN"):
        frechet_distance(_with(NAN, images), images, PenultimateFeatures(classifier))
    with pytest.raises(ValueError, match="images contains NaN"):
        inception_score(_with(NAN, images), classifier, splits=1)
    with pytest.raises(ValueError, match="splits"):
        inception_score(images, classifier, splits=0)
    labels = torch.tensor([0, 1, 0, 2])
    for bad_labels, error in ((labels.float(), TypeError), (-labels, ValueError), (labels[:2], ValueError)):
        with pytest.raises(error, match="labels"):
            train_classifier(images, bad_labels, epochs=1)
    with pytest.raises(ValueError, match="images contains NaN"):
        train_classifier(_with(NAN, images), labels, epochs=1)
    with pytest.raises(ValueError, match="batch_size"):
        train_classifier(images, labels, epochs=1, batch_size=0)


def _diffusion():
    torch.manual_seed(0)
    return AutoregressiveVideoDiffusion(3, 1, image_size=8, block_out_channels=(8, 8), num_train_timesteps=10)


VIDEOS = 2 * torch.rand(2, 3, 1, 8, 8, generator=torch.Generator().manual_seed(2)) - 1


@pytest.mark.parametrize(
    "videos, error",
    [
        (VIDEOS * NAN, ValueError),
        (VIDEOS[:0], ValueError),
        (VIDEOS.long(), TypeError),
        (VIDEOS.double(), TypeError),
        (VIDEOS.tolist(), TypeError),
    ],
    ids=["nan", "empty", "int", "float64", "list"],
)
def test_diffusion_videos(videos, error):
    with pytest.raises(error, match="videos"):
        _diffusion().training_loss(videos)


def test_diffusion_sampling_arguments():
    model = _diffusion()
    with pytest.raises(ValueError, match="context_frames contains NaN"):
        model.sample_next_frame(VIDEOS[:, :1] * NAN, 2)
    with pytest.raises(ValueError, match="context_frames must have shape"):
        model.sample_next_frame(VIDEOS[:, :1, :, :4, :4], 2)
    with pytest.raises(ValueError, match="num_inference_steps"):
        model.sample_next_frame(VIDEOS[:, :1], 0)
    with pytest.raises(ValueError, match="num_inference_steps"):
        model.sample(1, 0)
    with pytest.raises(ValueError, match="num_samples"):
        model.sample(0, 2)


def test_diffusion_inputs_in_another_dtype_name_the_conversion():
    model = _diffusion()
    fix = r"but the module's parameters are torch.float32: convert one of them \(e.g. module.to\(torch.float64\)\)"
    with pytest.raises(TypeError, match=f"^videos has dtype torch.float64 {fix}"):
        model.training_loss(VIDEOS.double())
    with pytest.raises(TypeError, match=f"^context_frames has dtype torch.float64 {fix}"):
        model.sample_next_frame(VIDEOS[:, :1].double(), 2)


BINARY = (torch.rand(2, 1, 8, 8, generator=torch.Generator().manual_seed(3)) > 0.5).float()


@pytest.mark.parametrize(
    "x, error, match",
    [
        (BINARY * NAN, ValueError, "x contains NaN"),
        (BINARY[:0], ValueError, "x must not be empty"),
        (BINARY.tolist(), ValueError, "x must be"),
        (BINARY[..., :4, :4], ValueError, "x must have shape"),
        (BINARY.expand(2, 3, 8, 8), ValueError, "x must have shape"),
    ],
    ids=["nan", "empty", "list", "size", "channels"],
)
def test_hvae_input(x, error, match):
    torch.manual_seed(0)
    with pytest.raises(error, match=match):
        HeatHVAE("heat", num_latents=2, width=8, image_size=8).negative_elbo(x)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"noise_std": 0.0}, "noise_std"),
        ({"noise_std": NAN}, "noise_std"),
        ({"noise_std": -1.0}, "noise_std"),
        ({"max_std": INF}, "max_std"),
    ],
)
def test_hvae_hyperparameters(kwargs, match):
    with pytest.raises(ValueError, match=match):
        HeatHVAE("heat", num_latents=2, width=8, image_size=8, **kwargs).negative_elbo(BINARY)


def test_hvae_sample_count():
    with pytest.raises(ValueError, match="num_samples"):
        HeatHVAE("heat", num_latents=2, width=8, image_size=8).sample(-1)


def test_tokenizers_and_quantizer_input():
    torch.manual_seed(0)
    tokenizer = VideoTokenizer(num_frames=2, image_size=8, dim=8, heads=2, spatial_layers=1, temporal_layers=1, code_dim=4, codebook_size=8)
    videos = torch.rand(2, 2, 1, 8, 8)
    for call in (tokenizer, tokenizer.encode):
        with pytest.raises(ValueError, match="videos contains NaN"):
            call(videos * NAN)
        with pytest.raises(ValueError, match="videos must not be empty"):
            call(videos[:0])
    with pytest.raises(ValueError, match="tokens must have shape"):
        tokenizer.decode(torch.zeros(0, 1, 2, 2, dtype=torch.long))
    with pytest.raises(ValueError, match="beta"):
        ImageTokenizer(image_size=8, dim=8, heads=2, spatial_layers=1, code_dim=4, codebook_size=8, beta=INF)
    with pytest.raises(TypeError, match="spatial_layers"):
        VideoTokenizer(num_frames=2, image_size=8, dim=8, heads=2, spatial_layers=1.0, temporal_layers=1)
    quantizer = VectorQuantizer(4, 8)
    with pytest.raises(ValueError, match="features contains NaN"):
        quantizer(torch.full((3, 4), NAN))
    with pytest.raises(ValueError, match="features must not be empty"):
        quantizer(torch.zeros(0, 4))
    with pytest.raises(ValueError, match="dead_code_threshold"):
        VectorQuantizer(4, 8, dead_code_threshold=NAN)


def test_priors_input():
    torch.manual_seed(0)
    tokens = torch.randint(0, 8, (3, 2, 2))
    autoregressive = AutoregressiveTokenPrior(8, (2, 2), dim=8, heads=2, layers=1)
    masked = MaskedTokenPrior(8, (2, 2), dim=8, heads=2, layers=1)
    for prior in (autoregressive, masked):
        with pytest.raises(ValueError, match="tokens must have shape"):
            prior.loss(tokens[:0])
    with pytest.raises(TypeError, match="tokens"):
        masked.loss(tokens.tolist())
    with pytest.raises(ValueError, match="temperature"):
        autoregressive.sample(2, temperature=INF)
    with pytest.raises(ValueError, match="choice_temperature"):
        masked.sample(2, steps=2, choice_temperature=INF)


def test_diffusion_refuses_loader_range_and_8_bit_frames_by_name():
    from pseudovideo import make_pseudo_video, to_model_range
    from pseudovideo.data import load_images

    images, _ = load_images("digits", limit=4)  # (4, 1, 8, 8) in [0, 1], as every loader gives them
    model = _diffusion()
    with pytest.raises(ValueError, match="to_model_range"):
        model.training_loss(make_pseudo_video(images, 3, "blur"))  # forgot to_model_range: trained on [0, 1]
    assert torch.isfinite(model.training_loss(make_pseudo_video(to_model_range(images), 3, "blur")))
    context = make_pseudo_video(to_model_range(images), 3, "blur")[:, :1]  # context=1 previous frame
    for wrong in ((context + 1) / 2, (context + 1) * 127.5):  # [0, 1] and [0, 255] context
        with pytest.raises(ValueError, match="context_frames.*to_model_range"):
            model.sample_next_frame(wrong, 2)
    assert model.sample_next_frame(context, 2).shape == (4, 1, 8, 8)
