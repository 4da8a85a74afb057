"""Standard SGPA (thesis eq. (3.4), keys as inducing points) against GPyTorch's ``UnwhitenedVariationalStrategy``
over the keys and ``torch.distributions.kl_divergence`` between ``q(u)`` and ``p(u)`` (float64)."""

import gpytorch
import pytest
import torch
from sgpa_layer_fixtures import BATCH, HEADS, E, _hand_kernel, _heads, _inputs, _layer, _ref_svgp
from torch.distributions import MultivariateNormal as TorchMVN
from torch.distributions import kl_divergence


@pytest.fixture(autouse=True)
def _tiny_jitter():
    with gpytorch.settings.cholesky_jitter(float_value=1e-6, double_value=1e-12):
        yield


def _standard_factor_by_hand(layer, x, b, h, keep):
    raw = layer.cov_proj(x[b]).view(x.shape[1], HEADS, layer.max_len)[:, h, : x.shape[1]]
    raw = raw[keep][:, keep]
    return raw.tril(-1) + torch.diag(raw.diagonal().exp())


@pytest.mark.parametrize("kernel", ["rbf", "exponential"])
def test_standard_sgpa_equals_gpytorch_svgp_and_kl(kernel):
    layer = _layer(mode="standard", kernel=kernel, max_len=7)
    x = _inputs()
    mask = torch.tensor([[False, False, True, False, True], [False] * 5])
    post = layer.posterior(x, key_padding_mask=mask, full_covariance=True)
    q, v = _heads(layer.qk_proj(x)).detach(), _heads(layer.v_proj(x)).detach()
    for b in range(BATCH):
        keep = ~mask[b]
        expected_kl = 0.0
        for h in range(HEADS):
            keys, vals = q[b, h][keep], v[b, h][keep]
            gram = _hand_kernel(layer, h, keys, keys).detach()
            chol_s = _standard_factor_by_hand(layer, x, b, h, keep).detach()
            mean_u = (gram @ vals).T  # m_u = K v per output dim (v := K^-1 m_u)
            chol_u = chol_s.expand(E, *chol_s.shape)
            ref_mean, ref_cov = _ref_svgp(layer, h, keys, mean_u, chol_u, keys)
            torch.testing.assert_close(post.mean[b, h][keep].T, ref_mean, rtol=1e-6, atol=1e-7)
            torch.testing.assert_close(post.covariance[b, h][:, keep][:, :, keep], ref_cov, rtol=1e-6, atol=1e-7)
            prior = TorchMVN(torch.zeros(len(keys), dtype=torch.double), covariance_matrix=gram)
            expected_kl += kl_divergence(TorchMVN(mean_u, scale_tril=chol_u), prior).sum()
        torch.testing.assert_close(post.kl[b], expected_kl, rtol=1e-6, atol=1e-8)
    _, kl = layer(x, key_padding_mask=mask)
    torch.testing.assert_close(kl, post.kl.mean())
