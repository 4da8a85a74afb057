"""VQ tokenizers: eq. vqvae_loss against a hand computation, straight-through gradients, perplexity,
token shapes of the image VQ-VAE and of C-ViViT, causal temporal layers, reloads and bad input."""

import math

import pytest
import torch

from pseudovideo.models.quantizer import VectorQuantizer, codebook_perplexity
from pseudovideo.models.tokenizer import ImageTokenizer, VideoTokenizer

CODEBOOK = torch.tensor([[0.0, 0.0, 0.0], [1.0, 0.0, 0.0], [0.0, 2.0, 0.0], [0.0, 0.0, -1.0], [5.0, 5.0, 5.0]])


def quantizer_with(codebook, beta=0.3, dead_code_threshold=0.0):
    quantizer = VectorQuantizer(codebook.shape[1], codebook.shape[0], beta, dead_code_threshold)
    with torch.no_grad():
        quantizer.codebook.copy_(codebook)
    return quantizer


def hand_vq(features, codebook, beta):
    """Nearest codes by explicit distances; loss value and gradients of eq. vqvae_loss written out."""
    flat = features.reshape(-1, codebook.shape[1])
    distances = ((flat[:, None, :] - codebook[None]) ** 2).sum(-1)
    indices = distances.argmin(1)
    codes = codebook[indices]
    count = flat.numel()  # mean over tokens and dimensions
    loss = (1 + beta) * ((codes - flat) ** 2).sum() / count
    grad_features = beta * 2 * (flat - codes) / count
    grad_codebook = torch.zeros_like(codebook).index_add_(0, indices, 2 * (codes - flat) / count)
    return indices.reshape(features.shape[:-1]), loss, grad_features.reshape(features.shape), grad_codebook


def test_vq_loss_and_gradients_match_a_hand_computation():
    torch.manual_seed(0)
    features = (torch.randn(2, 4, 3) * 1.5).requires_grad_()
    quantizer = quantizer_with(CODEBOOK, beta=0.3)
    indices, loss, grad_features, grad_codebook = hand_vq(features.detach(), CODEBOOK, 0.3)
    out = quantizer(features)
    assert torch.equal(out.indices, indices)
    torch.testing.assert_close(out.loss, loss)
    out.loss.backward()
    torch.testing.assert_close(features.grad, grad_features)
    torch.testing.assert_close(quantizer.vq._codebook.embed.grad[0], grad_codebook)


def test_straight_through_gradient_and_value():
    torch.manual_seed(1)
    features = torch.randn(5, 3, requires_grad=True)
    quantizer = quantizer_with(CODEBOOK)
    out = quantizer(features)
    torch.testing.assert_close(out.quantized, CODEBOOK[out.indices])  # value: the nearest code
    upstream = torch.randn(5, 3)
    (out.quantized * upstream).sum().backward()
    torch.testing.assert_close(features.grad, upstream)  # gradient copied to the encoder unchanged
    assert quantizer.vq._codebook.embed.grad is None or not quantizer.vq._codebook.embed.grad.any()


def test_loss_uses_the_codebook_the_search_saw_when_dead_codes_are_reseeded():
    torch.manual_seed(2)
    features = torch.randn(6, 3, requires_grad=True)
    quantizer = quantizer_with(CODEBOOK, dead_code_threshold=2.0)
    _, loss, _, _ = hand_vq(features.detach(), CODEBOOK, 0.3)
    out = quantizer(features)
    torch.testing.assert_close(out.loss, loss)
    # every code is used at most 6 times in a fresh tracker (count 0.2 per use after one EMA step <
    # 2): all are re-seeded to batch features, so the codebook changed after the search
    after = quantizer.codebook.detach()
    assert not torch.allclose(after, CODEBOOK)
    assert all(torch.isclose(row, features.detach()).all(1).any() for row in after)


def test_frozen_update_leaves_the_codebook_alone():
    quantizer = quantizer_with(CODEBOOK, dead_code_threshold=2.0)
    quantizer(torch.randn(6, 3), update_codebook=False)
    torch.testing.assert_close(quantizer.codebook.detach(), CODEBOOK)


def test_perplexity_hand_values():
    assert codebook_perplexity(torch.arange(8), 8).item() == pytest.approx(8.0)
    assert codebook_perplexity(torch.full((10,), 3), 8).item() == pytest.approx(1.0)
    # frequencies (1/2, 1/4, 1/4): entropy 1.5 log 2, perplexity 2^1.5
    assert codebook_perplexity(torch.tensor([0, 0, 1, 2]), 8).item() == pytest.approx(2**1.5, rel=1e-6)


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
