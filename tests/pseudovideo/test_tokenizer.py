"""VQ tokenizers: token shapes of the image VQ-VAE and of C-ViViT, gradients through the quantizer, causal temporal
layers, reloads and bad input (the quantizer itself: ``test_quantizer.py``)."""

import math

import pytest
import torch

from pseudovideo.models.quantizer import VectorQuantizer
from pseudovideo.models.tokenizer import ImageTokenizer, VideoTokenizer


def test_video_and_image_token_shapes_and_decode_roundtrip():
    torch.manual_seed(0)
    video = VideoTokenizer(8, 16, dim=16, heads=2, spatial_layers=1, temporal_layers=1, codebook_size=32).eval()
    videos = torch.rand(3, 8, 1, 16, 16)
    out = video(videos)
    assert video.token_shape == (4, 4, 4) and out.tokens.shape == (3, 4, 4, 4)
    assert out.reconstruction.shape == videos.shape and out.tokens.dtype == torch.int64
    torch.testing.assert_close(video.decode(video.encode(videos)), out.reconstruction)
    image = ImageTokenizer(16, channels=3, dim=16, heads=2, spatial_layers=2, codebook_size=32).eval()
    images = torch.rand(2, 3, 16, 16)
    out = image(images)
    assert image.token_shape == (4, 4) and out.tokens.shape == (2, 4, 4) and out.reconstruction.shape == images.shape
    torch.testing.assert_close(image.decode(out.tokens), out.reconstruction)
    torch.testing.assert_close(out.loss, out.reconstruction_loss + out.vq_loss)
    torch.testing.assert_close(out.reconstruction_loss, ((out.reconstruction - images) ** 2).mean())


def test_reconstruction_gradient_reaches_the_encoder_through_the_quantiser():
    torch.manual_seed(0)
    tokenizer = VideoTokenizer(4, 8, dim=16, heads=2, spatial_layers=1, temporal_layers=1, codebook_size=16)
    tokenizer(torch.rand(2, 4, 1, 8, 8)).reconstruction_loss.backward()
    assert tokenizer.embed_tubelets.weight.grad.abs().sum() > 0  # encoder: straight-through path
    assert tokenizer.to_tubelets.weight.grad.abs().sum() > 0
    codebook_grad = tokenizer.quantizer.vq._codebook.embed.grad
    assert codebook_grad is None or not codebook_grad.any()  # codes learn from the VQ terms only


def test_temporal_layers_are_causal():
    torch.manual_seed(0)
    tokenizer = VideoTokenizer(6, 8, dim=16, heads=2, spatial_layers=1, temporal_layers=2, codebook_size=16)
    videos = torch.rand(2, 6, 1, 8, 8)
    changed = videos.clone()
    changed[:, 4:] = torch.rand(2, 2, 1, 8, 8)  # the last tubelet (frames 5, 6)
    before, after = tokenizer.features(videos), tokenizer.features(changed)
    torch.testing.assert_close(before[:, :2], after[:, :2], atol=1e-6, rtol=0)
    assert (before[:, 2] - after[:, 2]).abs().max() > 1e-3


def test_state_dict_reload_reproduces_tokens_and_pixels():
    torch.manual_seed(0)
    tokenizer = VideoTokenizer(2, 8, dim=16, heads=2, spatial_layers=1, temporal_layers=1, codebook_size=16)
    videos = torch.rand(4, 2, 1, 8, 8)
    tokenizer(videos)  # one training-mode pass updates the codebook usage buffers
    torch.manual_seed(1)
    copy = VideoTokenizer(2, 8, dim=16, heads=2, spatial_layers=1, temporal_layers=1, codebook_size=16)
    copy.load_state_dict(tokenizer.state_dict())
    tokenizer.eval(), copy.eval()
    assert torch.equal(copy.encode(videos), tokenizer.encode(videos))
    torch.testing.assert_close(copy(videos).reconstruction, tokenizer(videos).reconstruction)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(num_frames=3, image_size=8), "tubelet_frames"),
        (dict(num_frames=2, image_size=10), "patch_size"),
        (dict(num_frames=2, image_size=8, dim=10, heads=4), "heads"),
        (dict(num_frames=2, image_size=8, spatial_layers=0, temporal_layers=0), "layer"),
        (dict(num_frames=0, image_size=8), "num_frames"),
        (dict(num_frames=2, image_size=8, codebook_size=1), "codebook_size"),
    ],
)
def test_bad_construction_is_named(kwargs, match):
    with pytest.raises(ValueError, match=match):
        VideoTokenizer(**kwargs)


def test_bad_calls_are_named():
    tokenizer = VideoTokenizer(2, 8, dim=16, heads=2, spatial_layers=1, temporal_layers=1, codebook_size=16)
    with pytest.raises(ValueError, match="videos"):
        tokenizer(torch.rand(2, 4, 1, 8, 8))
    with pytest.raises(TypeError, match="videos"):
        tokenizer(torch.zeros(2, 2, 1, 8, 8, dtype=torch.long))
    with pytest.raises(ValueError, match="tokens"):
        tokenizer.decode(torch.full((1, 1, 2, 2), 16))
    with pytest.raises(ValueError, match="tokens"):
        tokenizer.decode(torch.zeros(1, 2, 2, 2, dtype=torch.long))
    with pytest.raises(TypeError, match="tokens"):
        tokenizer.decode(torch.zeros(1, 1, 2, 2))
    with pytest.raises(ValueError, match="beta"):
        VectorQuantizer(4, 8, beta=0.0)
    with pytest.raises(ValueError, match="features"):
        VectorQuantizer(4, 8)(torch.zeros(3, 5))
    with pytest.raises(TypeError, match="videos have dtype torch.float64"):
        tokenizer(torch.rand(1, 2, 1, 8, 8).double())
    out = tokenizer.double()(torch.rand(3, 2, 1, 8, 8).double())  # a float64 tokenizer works end to end
    assert out.reconstruction.dtype == torch.float64 and math.isfinite(out.loss.item())
