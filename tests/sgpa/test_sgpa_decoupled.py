"""Decoupled SGPA (thesis eqs. (3.14) and (3.15), Chen & Li 2023) against the predictive written out with explicit
inverses, and against GPyTorch's ``UnwhitenedVariationalStrategy`` over the global and amortised keys with
``torch.distributions.kl_divergence`` for the KL (float64)."""

import itertools

import gpytorch
import pytest
import torch
from sgpa_layer_fixtures import BATCH, HEADS, NUM_GLOBAL, TIGHT, E, _hand_kernel, _heads, _inputs, _layer, _ref_svgp
from torch.distributions import MultivariateNormal as TorchMVN
from torch.distributions import kl_divergence


@pytest.fixture(autouse=True)
def _tiny_jitter():
    with gpytorch.settings.cholesky_jitter(float_value=1e-6, double_value=1e-12):
        yield


def _decoupled_pieces(layer, x, b, h):
    """Queries, values, global keys and the lower-triangular factor of ``S_g`` of head ``h``:
    ``C`` (unwhitened, ``S_g = C Cᵀ``) or ``L C`` with ``L = chol(K_gg)`` written from the hand
    kernel (whitened, ``S_g = L C Cᵀ Lᵀ``)."""
    q = _heads(layer.qk_proj(x))[b, h].detach()
    v = _heads(layer.v_proj(x))[b, h].detach()
    kg = layer.global_keys()[h].detach()
    chol_s = layer.global_cov_factor()[h].detach()  # (E, M, M)
    if layer.whitened:
        chol_s = torch.linalg.cholesky(_hand_kernel(layer, h, kg, kg).detach()) @ chol_s
    return q, v, kg, chol_s


@pytest.mark.parametrize("whitened", [False, True])
@pytest.mark.parametrize("kernel", ["rbf", "exponential"])
def test_decoupled_orthogonal_equals_eq_dsgp_predictive_by_hand(kernel, whitened):
    layer = _layer(kernel=kernel, whitened=whitened)
    x = _inputs()
    post = layer.posterior(x, full_covariance=True)
    for b, h in itertools.product(range(BATCH), range(HEADS)):
        q, v, kg, chol_s = _decoupled_pieces(layer, x, b, h)
        k = lambda a, c: _hand_kernel(layer, h, a, c).detach()  # noqa: E731
        kgg_inv = torch.linalg.inv(k(kg, kg))
        vg = layer.global_values[h].detach()
        mean = k(q, q) @ v - k(q, kg) @ kgg_inv @ k(kg, q) @ v + k(q, kg) @ vg
        torch.testing.assert_close(post.mean[b, h], mean, **TIGHT)
        for d in range(E):
            s_d = chol_s[d] @ chol_s[d].T
            cov = k(q, q) + k(q, kg) @ kgg_inv @ (s_d - k(kg, kg)) @ kgg_inv @ k(kg, q)
            torch.testing.assert_close(post.covariance[b, h, d], cov, **TIGHT)
            torch.testing.assert_close(post.variance[b, h, :, d], cov.diagonal(), **TIGHT)


@pytest.mark.parametrize(
    "variant,kernel,share_covariance,whitened",
    [
        ("orthogonal", "rbf", False, False),
        ("dsvgp", "rbf", False, False),
        ("orthogonal", "exponential", True, False),
        ("orthogonal", "rbf", False, True),
        ("dsvgp", "exponential", True, True),
    ],
)
def test_decoupled_equals_gpytorch_svgp_over_global_and_amortised_keys(variant, kernel, share_covariance, whitened):
    """Eq. (3.15) and the naive decoupled SVGP of App. B are the SVGP posterior with Z = (k_g, k_a) and the structured q(u)
    of eq. (3.15) (orthogonal: m_u = (K_gg v_g, K_ag v_g + B v_a)) or m_u = K_Za v_a (dsvgp), with
    S_u = [[S_g, S_g C^T], [C S_g, B + C S_g C^T]], C = K_ag K_gg^-1, B = K_aa - C K_ga.  The layer's
    KL must equal KL(q(u) || N(0, K_ZZ)) (App. B.1.2); whitened, S_g = L C C^T L^T."""
    layer = _layer(variant=variant, kernel=kernel, share_covariance=share_covariance, whitened=whitened)
    x = _inputs()
    post = layer.posterior(x, full_covariance=True)
    for b in range(BATCH):
        expected_kl = 0.0
        for h in range(HEADS):
            q, v, kg, chol_s = _decoupled_pieces(layer, x, b, h)
            chol_s = chol_s.expand(E, NUM_GLOBAL, NUM_GLOBAL)  # one S_g per output dim, or shared
            k = lambda a, c: _hand_kernel(layer, h, a, c).detach()  # noqa: E731
            kgg, kga, kaa = k(kg, kg), k(kg, q), k(q, q)
            c_mat = kga.T @ torch.linalg.inv(kgg)
            schur = kaa - c_mat @ kga
            inducing = torch.cat([kg, q])
            k_zz = k(inducing, inducing)
            if variant == "orthogonal":
                vg = layer.global_values[h].detach()
                mean_u = torch.cat([kgg @ vg, kga.T @ vg + schur @ v]).T
            else:
                mean_u = (k_zz[:, NUM_GLOBAL:] @ v).T
            chol_b = torch.linalg.cholesky(schur)
            chol_u = torch.zeros(E, len(inducing), len(inducing), dtype=torch.double)
            chol_u[:, :NUM_GLOBAL, :NUM_GLOBAL] = chol_s
            chol_u[:, NUM_GLOBAL:, :NUM_GLOBAL] = c_mat @ chol_s
            chol_u[:, NUM_GLOBAL:, NUM_GLOBAL:] = chol_b
            ref_mean, ref_cov = _ref_svgp(layer, h, inducing, mean_u, chol_u, q)
            torch.testing.assert_close(post.mean[b, h].T, ref_mean, rtol=1e-6, atol=1e-7)
            torch.testing.assert_close(post.covariance[b, h], ref_cov, rtol=1e-6, atol=1e-7)
            prior = TorchMVN(torch.zeros(len(inducing), dtype=torch.double), covariance_matrix=k_zz)
            expected_kl += kl_divergence(TorchMVN(mean_u, scale_tril=chol_u), prior).sum()
        torch.testing.assert_close(post.kl[b], expected_kl, rtol=1e-6, atol=1e-8)
