"""The SGPA layer (``SGPAttention``) against independent references (float64): Monte-Carlo moments of its samples
against its posterior, causal positions against the posterior of their prefix, step-by-step decoding against the full
pass, padded inputs against the valid tokens alone, and cached evaluations against a fresh layer.  The posteriors
themselves are checked against GPyTorch in ``test_sgpa_standard.py`` and ``test_sgpa_decoupled.py``.
"""

import itertools
import math

import gpytorch
import pytest
import torch
from sgpa_layer_fixtures import BATCH, D_MODEL, LENGTH, TIGHT, _heads, _inputs, _layer, _step_through

from gpytorch_sgpa.attention import (
    KernelAttention,
    ScaledDotProductAttention,
    SGPANoise,
    SGPAttention,
)


@pytest.fixture(autouse=True)
def _tiny_jitter():
    with gpytorch.settings.cholesky_jitter(float_value=1e-6, double_value=1e-12):
        yield


# ---------------------------------------------------------------------------------------- samples and gradients


@pytest.mark.parametrize("mode", ["standard", "decoupled"])
def test_samples_have_the_posterior_moments(mode):
    """Monte-Carlo moments of the reparameterised samples vs the posterior (full and diagonal)."""
    n = 20000
    for diag_sample in (True, False):
        layer = _layer(mode=mode, max_len=LENGTH, diag_sample=diag_sample, share_covariance=True)
        with torch.no_grad():
            layer.out_proj.weight.copy_(torch.eye(D_MODEL))
            layer.out_proj.bias.zero_()
        x = _inputs(batch=1).expand(n, LENGTH, D_MODEL)
        torch.manual_seed(3)
        with torch.no_grad():
            samples = _heads(layer(x)[0])[:, 0, :, 0]  # head 0, output dim 0: (n, L)
            post = layer.posterior(x[:1], full_covariance=True)
        mean, cov = post.mean[0, 0, :, 0], post.covariance[0, 0, 0]
        scale = cov.diagonal().sqrt()
        assert ((samples.mean(0) - mean).abs() / scale).max() < 5 / math.sqrt(n)
        emp_cov = torch.cov(samples.T)
        expected = cov if not diag_sample else torch.diag(cov.diagonal())
        assert ((emp_cov - expected).abs() / (scale[:, None] * scale[None, :])).max() < 0.05


@pytest.mark.parametrize(
    "mode,variant,diag_sample",
    [("decoupled", "orthogonal", True), ("decoupled", "dsvgp", False), ("standard", "orthogonal", False)],
)
def test_gradients_reach_every_parameter(mode, variant, diag_sample):
    layer = _layer(mode=mode, variant=variant, diag_sample=diag_sample, max_len=LENGTH)
    out, kl = layer(_inputs())
    (out.square().sum() + kl).backward()
    for name, p in layer.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
        assert p.grad.abs().sum() > 0, name


# ---------------------------------------------------------------------------------------- causal / cache
@pytest.mark.parametrize(
    "mode,variant,diag_sample",
    list(itertools.product(["decoupled"], ["orthogonal", "dsvgp"], [True, False]))
    + [("standard", "orthogonal", True), ("standard", "orthogonal", False)],
)
def test_causal_posterior_uses_the_prefix_and_steps_equal_full_recomputation(mode, variant, diag_sample):
    layer = _layer(mode=mode, variant=variant, diag_sample=diag_sample, causal=True, max_len=LENGTH)
    plain = _layer(mode=mode, variant=variant, diag_sample=diag_sample, causal=False, max_len=LENGTH)
    plain.load_state_dict(layer.state_dict())
    x = _inputs()
    post = layer.posterior(x)
    for t in range(LENGTH):  # position t is the non-causal posterior of the prefix 0..t
        prefix = plain.posterior(x[:, : t + 1])
        torch.testing.assert_close(post.mean[:, :, t], prefix.mean[:, :, t], **TIGHT)
        torch.testing.assert_close(post.variance[:, :, t], prefix.variance[:, :, t], **TIGHT)
    noise = layer.sample_noise(BATCH, LENGTH)
    full, _ = layer(x, noise=noise)
    stepped, state = _step_through(layer, x, noise)
    assert state.length == LENGTH
    torch.testing.assert_close(stepped, full, **TIGHT)


@pytest.mark.parametrize(
    "mode,sampler",
    [("decoupled", "diagonal"), ("decoupled", "full"), ("decoupled", "decomposed"), ("standard", "diagonal"), ("standard", "full")],
)
def test_padded_positions_are_irrelevant(mode, sampler):
    layer = _layer(mode=mode, sampler=sampler, max_len=LENGTH)
    x = _inputs()
    mask = torch.tensor([[False, True, False, False, True], [True, False, False, False, False]])
    noise = layer.sample_noise(BATCH, LENGTH)
    out, kl = layer(x, key_padding_mask=mask, noise=noise)
    changed = x.clone()
    changed[mask] = 10 * torch.randn(int(mask.sum()), D_MODEL, dtype=torch.double)
    noise_changed = SGPANoise(noise.local.clone(), noise.global_)
    noise_changed.local[mask[:, None, :, None].expand_as(noise.local)] = 7.0
    out2, kl2 = layer(changed, key_padding_mask=mask, noise=noise_changed)
    torch.testing.assert_close(out[~mask], out2[~mask], **TIGHT)
    torch.testing.assert_close(kl, kl2, **TIGHT)
    if mode == "decoupled":  # the valid tokens alone give the same outputs and KL
        for b in range(BATCH):
            keep = ~mask[b]
            alone_noise = SGPANoise(noise.local[b : b + 1][:, :, keep], None if noise.global_ is None else noise.global_[b : b + 1])
            alone, kl_alone = layer(x[b : b + 1, keep], noise=alone_noise)
            torch.testing.assert_close(alone[0], out[b, keep], **TIGHT)
            torch.testing.assert_close(kl_alone, layer.posterior(x, key_padding_mask=mask).kl[b], **TIGHT)


def test_eval_cache_is_reused_and_invalidated():
    layer = _layer(diag_sample=False)
    fresh = _layer(diag_sample=False)
    x = _inputs()
    noise = layer.sample_noise(BATCH, LENGTH)
    layer.eval()
    with torch.no_grad():
        first = layer(x, noise=noise)[0]
        factors = layer._cache[2]
        second = layer(x, noise=noise)[0]
        assert layer._cache[2] is factors  # reused: one Cholesky of K_gg per head for many batches
        torch.testing.assert_close(first, second)
    # an optimiser step changes the parameters: the cache must not serve stale factors
    layer.train()
    optimiser = torch.optim.Adam(layer.parameters(), lr=1e-2)
    out, kl = layer(x)
    (out.sum() + kl).backward()
    optimiser.step()
    layer.eval()
    with torch.no_grad():
        before_step = fresh(x, noise=noise)[0]
        after_step = layer(x, noise=noise)[0]
        assert (before_step - after_step).abs().max() > 1e-3
        layer.global_inducing_inputs.add_(0.5)  # in-place edit in eval mode
        cached = layer(x, noise=noise)[0]
        assert (cached - after_step).abs().max() > 1e-3
        fresh.load_state_dict(layer.state_dict())
        fresh.train()
        torch.testing.assert_close(cached, fresh(x, noise=noise)[0], **TIGHT)
        # different global inputs (a changed G_phi) must not hit the cache either
        moved = layer.global_inducing_inputs + 0.3
        torch.testing.assert_close(layer(x, global_inputs=moved, noise=noise)[0], fresh(x, global_inputs=moved, noise=noise)[0], **TIGHT)
    assert layer.train()._cache is None


def test_bad_arguments_raise_clear_errors():
    with pytest.raises(ValueError, match="d_model"):
        SGPAttention(7, 2)
    with pytest.raises(ValueError, match="mode"):
        SGPAttention(6, 2, mode="full")
    with pytest.raises(ValueError, match="variant"):
        SGPAttention(6, 2, variant="odsvgp")
    with pytest.raises(ValueError, match="kernel"):
        SGPAttention(6, 2, kernel="matern")
    with pytest.raises(ValueError, match="kernel"):
        KernelAttention(6, 2, kernel="linear")
    with pytest.raises(ValueError, match="max_len"):
        SGPAttention(6, 2, mode="standard")
    with pytest.raises(ValueError, match="num_global"):
        SGPAttention(6, 2, num_global=0)
    with pytest.raises(ValueError, match="num_heads"):
        ScaledDotProductAttention(6, 0)
    layer = SGPAttention(6, 2, num_global=2)
    x = torch.randn(2, 3, 6)
    with pytest.raises(TypeError, match="key_padding_mask"):
        layer(x, key_padding_mask=torch.zeros(2, 3))
    with pytest.raises(ValueError, match="key_padding_mask"):
        layer(x, key_padding_mask=torch.zeros(2, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match="x must have shape"):
        layer(torch.randn(2, 3, 5))
    with pytest.raises(ValueError, match="global_inputs"):
        layer(x, global_inputs=torch.randn(2, 3, 6))
    with pytest.raises(ValueError, match="causal"):
        layer.forward_step(x[:, :1])
