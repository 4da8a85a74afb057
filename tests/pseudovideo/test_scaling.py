"""Data ranges: one normalisation helper and its inverse, and the builders and models refusing images
on another scale (8-bit pixels) instead of treating their noise as negligible."""

import pytest
import torch

from pseudovideo import make_pseudo_video, to_data_range, to_model_range
from pseudovideo.data import load_images
from pseudovideo.models.diffusion import AutoregressiveVideoDiffusion
from pseudovideo.models.tokenizer import VideoTokenizer
from pseudovideo.scaling import FAR_OUTSIDE, check_model_range


def test_to_model_range_is_the_affine_map_onto_minus_one_one_and_back():
    images, _ = load_images("digits", limit=50)  # [0, 1]
    model = to_model_range(images)
    torch.testing.assert_close(model, 2 * images - 1)
    assert model.min() == -1 and model.max() == 1  # the digits use the whole range
    torch.testing.assert_close(to_data_range(model), images)
    pixels = (images * 255).round().to(torch.uint8)
    eight_bit = to_model_range(pixels, data_range=(0, 255))
    assert eight_bit.dtype == torch.float32
    torch.testing.assert_close(eight_bit, pixels.float() / 127.5 - 1)
    torch.testing.assert_close(to_data_range(eight_bit, (0, 255)), pixels.float())
    noisy = torch.tensor([-1.5, 0.0, 1.5])
    assert to_data_range(noisy).tolist() == [-0.25, 0.5, 1.25]  # no clipping unless asked
    assert to_data_range(noisy, clip=True).tolist() == [0.0, 0.5, 1.0]


def test_a_wrong_data_range_is_named():
    with pytest.raises(ValueError, match=r"outside data_range=\(0, 1\).*\(0, 255\)"):
        to_model_range(torch.tensor([0.0, 255.0]))
    with pytest.raises(ValueError, match="low < high"):
        to_model_range(torch.rand(3), (1, 0))
    with pytest.raises(TypeError, match="data_range"):
        to_model_range(torch.rand(3), 255)


@pytest.mark.parametrize("method", ["heat", "markov_first", "markov_high"])
def test_noisy_builders_refuse_eight_bit_images(method):
    images = torch.rand(2, 1, 8, 8, generator=torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match="to_model_range"):
        make_pseudo_video(255 * images, 4, method)
    make_pseudo_video(2 * images - 1, 4, method)  # [-1, 1]: accepted
    gaussian = 2 * torch.randn(2, 1, 8, 8, generator=torch.Generator().manual_seed(1))
    make_pseudo_video(gaussian, 4, method)  # Gaussian images, single pixels beyond 3: accepted


def test_blur_is_scale_free_and_accepts_any_range():
    images = torch.rand(2, 1, 8, 8, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(make_pseudo_video(255 * images, 4, "blur"), 255 * make_pseudo_video(images, 4, "blur"))


def test_models_refuse_eight_bit_videos():
    videos = torch.rand(2, 2, 1, 4, 4, generator=torch.Generator().manual_seed(0)) * 255
    model = AutoregressiveVideoDiffusion(2, 1, image_size=4, block_out_channels=(8, 16))
    with pytest.raises(ValueError, match="last frames.*to_model_range"):
        model.training_loss(videos)
    tokenizer = VideoTokenizer(
        2, 4, patch_size=4, tubelet_frames=2, dim=8, heads=2, code_dim=4, codebook_size=8, spatial_layers=1, temporal_layers=1
    )
    with pytest.raises(ValueError, match="videos.*to_model_range"):
        tokenizer(videos)
    assert FAR_OUTSIDE == 3.0 and check_model_range(torch.full((2,), -3.0)) is not None
    with pytest.raises(ValueError, match="root-mean-square pixel of 3.1"):
        check_model_range(torch.full((2,), -3.1))
    digits, _ = load_images("digits", limit=20)
    with pytest.raises(ValueError, match="to_model_range"):  # scikit-learn's raw [0, 16] digits
        make_pseudo_video(16 * digits, 4, "markov_first")
