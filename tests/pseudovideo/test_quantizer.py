"""The vector quantizer of the tokenizers: eq. vqvae_loss and its gradients against a hand computation, the
straight-through estimator, dead-code re-seeding, a frozen codebook and the codebook perplexity's hand values."""

import pytest
import torch

from pseudovideo.models.quantizer import VectorQuantizer, codebook_perplexity

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
