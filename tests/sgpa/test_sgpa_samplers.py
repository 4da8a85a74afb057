"""The ``sampler`` option of decoupled SGPA, in particular ``sampler="decomposed"`` (float64).

The decomposed sampler draws ``f_d(q) = m_d(q) + A_q C_d ε_d + sqrt(k(q,q) - A_q K_gg A_qᵀ) ξ_{q,d}``
with ``A = K_qg K_gg⁻¹``, ``S_g,d = C_d C_dᵀ`` (whitened layers: ``L C_d`` in place of ``C_d``,
``L = chol(K_gg)``), ``ε_d ~ N(0, I_M)`` shared by the queries of a sequence and ``ξ`` iid.
References are written with explicit inverses of ``K_gg``; the Monte-Carlo checks use 20,000
seeded samples and CLT tolerances.
"""

import math

import gpytorch
import pytest
import torch
from sgpa_layer_fixtures import BATCH, D_MODEL, HEADS, LENGTH, NUM_GLOBAL, TIGHT, E, _heads, _inputs, _layer, _step_through

from gpytorch_sgpa import SGPAELBO, SGPATransformer, SGPAttention, SGPAViT
from gpytorch_sgpa.attention import SGPA_SAMPLERS, SGPANoise
from gpytorch_sgpa.kernels import evaluate_kernel

NUM_SAMPLES = 20000


@pytest.fixture(autouse=True)
def _tiny_jitter():
    with gpytorch.settings.cholesky_jitter(float_value=1e-6, double_value=1e-12):
        yield


def _identity_output(layer):
    with torch.no_grad():
        layer.out_proj.weight.copy_(torch.eye(D_MODEL))
        layer.out_proj.bias.zero_()
    return layer


def _reference_terms(layer, x):
    """Per head, with explicit inverses: queries, A = K_qg K_gg⁻¹, K_gg, K_qq and the factor of S_g,d
    (e or 1 of them): C_d, or L C_d with L = chol(K_gg) when the layer is whitened."""
    queries = _heads(layer.qk_proj(x))  # (B, H, L, e)
    keys = layer.global_keys()  # (H, M, e)
    k_gg = evaluate_kernel(layer.kernel, keys)  # (H, M, M)
    k_qg = evaluate_kernel(layer.kernel, queries, keys)  # (B, H, L, M)
    k_qq = evaluate_kernel(layer.kernel, queries)  # (B, H, L, L)
    a = k_qg @ torch.linalg.inv(k_gg)  # (B, H, L, M)
    cov_factor = layer.global_cov_factor()  # C: (H, e or 1, M, M)
    if layer.whitened:
        cov_factor = torch.linalg.cholesky(k_gg).unsqueeze(1) @ cov_factor
    return a, k_gg, k_qq, cov_factor


# ---------------------------------------------------------------------------------------- exactness
@pytest.mark.parametrize("variant", ["orthogonal", "dsvgp"])
@pytest.mark.parametrize("share_covariance", [False, True])
@pytest.mark.parametrize("kernel", ["rbf", "exponential"])
@pytest.mark.parametrize("whitened", [False, True])
def test_decomposed_sample_equals_the_formula_by_hand(variant, share_covariance, kernel, whitened):
    """Given the noise, the sample is m + A C_d ε_d + sqrt(k(q,q) - A K_gg Aᵀ) ξ exactly."""
    layer = _layer(variant=variant, share_covariance=share_covariance, sampler="decomposed", kernel=kernel, whitened=whitened)
    layer = _identity_output(layer)
    x = _inputs()
    noise = layer.sample_noise(BATCH, LENGTH)
    assert noise.global_ is not None and noise.global_.shape == (BATCH, HEADS, E, NUM_GLOBAL)
    out, kl = layer(x, noise=noise)
    post = layer.posterior(x)
    a, k_gg, k_qq, cov_factor = _reference_terms(layer, x)
    cov_factor = cov_factor.expand(HEADS, E, NUM_GLOBAL, NUM_GLOBAL)
    global_part = torch.einsum("bhlm,hdmn,bhdn->bhld", a, cov_factor, noise.global_)
    residual = k_qq.diagonal(dim1=-2, dim2=-1) - torch.einsum("bhlm,hmn,bhln->bhl", a, k_gg, a)
    expected = post.mean + global_part + residual.sqrt().unsqueeze(-1) * noise.local
    torch.testing.assert_close(_heads(out), expected, **TIGHT)
    torch.testing.assert_close(kl, post.kl.mean(), **TIGHT)
    # the marginal variances are those of eq. (3.15): residual + diag(A S_d Aᵀ)
    s = cov_factor @ cov_factor.transpose(-2, -1)
    global_var = torch.einsum("bhlm,hdmn,bhln->bhld", a, s, a)
    torch.testing.assert_close(post.variance, residual.unsqueeze(-1) + global_var, **TIGHT)


@pytest.mark.parametrize("variant", ["orthogonal", "dsvgp"])
def test_decomposed_samples_have_exact_marginals_and_global_cross_covariance(variant):
    """Monte Carlo, every head and output dimension (one S_g per dimension): mean = m_d, variance =
    Σ_d(q, q) of eq. (3.15), covariance between positions = (A S_d Aᵀ)(q, q')."""
    layer = _identity_output(_layer(variant=variant, sampler="decomposed"))
    x = _inputs(batch=1).expand(NUM_SAMPLES, LENGTH, D_MODEL)
    torch.manual_seed(3)
    with torch.no_grad():
        samples = _heads(layer(x)[0])  # (n, H, L, e)
        post = layer.posterior(x[:1], full_covariance=True)
        a, _, _, cov_factor = _reference_terms(layer, x[:1])
    s = cov_factor @ cov_factor.transpose(-2, -1)  # (H, e, M, M)
    global_cov = torch.einsum("hlm,hdmn,hkn->hdlk", a[0], s, a[0])  # A S_d Aᵀ, (H, e, L, L)
    n = NUM_SAMPLES
    residual_offdiag = 0.0
    for h in range(HEADS):
        for d in range(E):
            mean, variance = post.mean[0, h, :, d], post.variance[0, h, :, d]
            scale = variance.sqrt()
            draws = samples[:, h, :, d]  # (n, L)
            assert ((draws.mean(0) - mean).abs() / scale).max() < 5 / math.sqrt(n)
            # sample variance: relative standard error sqrt(2 / n)
            assert ((draws.var(0) / variance - 1).abs()).max() < 5 * math.sqrt(2 / n)
            expected = global_cov[h, d].clone()
            expected.diagonal().copy_(variance)
            emp_cov = torch.cov(draws.T)
            corr_err = (emp_cov - expected).abs() / (scale[:, None] * scale[None, :])
            assert corr_err.max() < 0.04  # correlation standard error <= 1/sqrt(n) = 0.007
            full = post.covariance[0, h, d]
            off = ~torch.eye(LENGTH, dtype=torch.bool)
            residual_offdiag = max(residual_offdiag, ((full - expected).abs() / (scale[:, None] * scale[None, :]))[off].max().item())
    # the test can tell the decomposed sampler from the full one: the dropped residual is not tiny
    assert residual_offdiag > 2 * 0.04


def test_decomposed_draws_the_global_noise_once_per_sequence():
    """Changing ε of one output dimension moves every position of that dimension, ξ only one position."""
    layer = _identity_output(_layer(sampler="decomposed"))
    x = _inputs()
    noise = layer.sample_noise(BATCH, LENGTH)
    base = _heads(layer(x, noise=noise)[0])
    moved_global = noise.global_.clone()
    moved_global[0, 1, 2] += 1.0
    changed = _heads(layer(x, noise=SGPANoise(noise.local, moved_global))[0]) - base
    assert (changed[0, 1, :, 2].abs() > 1e-6).all()
    changed[0, 1, :, 2] = 0
    assert changed.abs().max() < 1e-12
    moved_local = noise.local.clone()
    moved_local[1, 0, 3, 1] += 1.0
    changed = _heads(layer(x, noise=SGPANoise(moved_local, noise.global_))[0]) - base
    assert changed[1, 0, 3, 1].abs() > 1e-6
    changed[1, 0, 3, 1] = 0
    assert changed.abs().max() < 1e-12


# ---------------------------------------------------------------------------------------- gradients, causal, padding
@pytest.mark.parametrize("variant", ["orthogonal", "dsvgp"])
@pytest.mark.parametrize("share_covariance", [False, True])
def test_decomposed_gradients_reach_every_parameter(variant, share_covariance):
    layer = _layer(variant=variant, share_covariance=share_covariance, sampler="decomposed")
    out, kl = layer(_inputs())
    (out.square().sum() + kl).backward()
    for name, p in layer.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
        assert p.grad.abs().sum() > 0, name
    # and through the sample alone (not only via the KL): the variational covariance factor
    layer.zero_grad()
    layer(_inputs())[0].square().sum().backward()
    for name in ("global_chol_lower", "global_chol_log_diag", "global_inducing_inputs", "qk_proj.weight"):
        assert layer.get_parameter(name).grad.abs().sum() > 0, name


@pytest.mark.parametrize("variant", ["orthogonal", "dsvgp"])
def test_decomposed_causal_steps_equal_full_recomputation(variant):
    layer = _layer(variant=variant, sampler="decomposed", causal=True)
    x = _inputs()
    noise = layer.sample_noise(BATCH, LENGTH)
    full, _ = layer(x, noise=noise)
    stepped, _ = _step_through(layer, x, noise)
    torch.testing.assert_close(stepped, full, **TIGHT)


# ---------------------------------------------------------------------------------------- options
def test_diag_sample_keeps_its_meaning_and_sampler_names_map_onto_it():
    assert SGPA_SAMPLERS == ("diagonal", "full", "decomposed")
    # the decoupled default is "decomposed" (cost); standard SGPA keeps the thesis's "diagonal"
    assert _layer().sampler == "decomposed" and not _layer().diag_sample
    assert SGPAttention(D_MODEL, HEADS, mode="standard", max_len=LENGTH).sampler == "diagonal"
    assert _layer(diag_sample=True).sampler == "diagonal"
    with pytest.raises(ValueError, match="contradicts"):
        _layer(sampler="full", diag_sample=True)
    assert _layer(diag_sample=False).sampler == "full"
    assert _layer(sampler="full").diag_sample is False
    assert _layer(sampler="diagonal", diag_sample=True).sampler == "diagonal"
    assert _layer(sampler="decomposed").diag_sample is False
    x = _inputs()
    for name, old in (("diagonal", dict(diag_sample=True)), ("full", dict(diag_sample=False))):
        new_layer, old_layer = _layer(sampler=name), _layer(**old)
        noise = old_layer.sample_noise(BATCH, LENGTH)
        assert (noise.global_ is None) == (name == "diagonal")
        torch.testing.assert_close(new_layer(x, noise=noise)[0], old_layer(x, noise=noise)[0], rtol=0, atol=0)
    layer = _layer(sampler="decomposed")
    layer.diag_sample = True  # the attribute still selects the diagonal / full samplers
    assert layer.sampler == "diagonal"
    layer.diag_sample = False
    assert layer.sampler == "full"
    standard = SGPAttention(D_MODEL, HEADS, mode="standard", max_len=LENGTH, sampler="full")
    assert standard.sample_noise(1, LENGTH).global_ is None


def test_sampler_errors_are_clear():
    with pytest.raises(ValueError, match="sampler"):
        SGPAttention(D_MODEL, HEADS, sampler="cholesky")
    with pytest.raises(ValueError, match="contradicts"):
        SGPAttention(D_MODEL, HEADS, sampler="diagonal", diag_sample=False)
    with pytest.raises(ValueError, match="decoupled"):
        SGPAttention(D_MODEL, HEADS, mode="standard", max_len=LENGTH, sampler="decomposed")
    layer = _layer(sampler="decomposed")
    noise = layer.sample_noise(BATCH, LENGTH)
    with pytest.raises(ValueError, match="global_"):
        layer(_inputs(), noise=SGPANoise(noise.local, None))


# ---------------------------------------------------------------------------------------- models
@pytest.mark.parametrize("attention", ["sgpa", "sgpa-dsvgp"])
def test_models_pass_the_sampler_through_attention_kwargs(attention):
    kwargs = {"num_global": 4, "sampler": "decomposed"}
    torch.manual_seed(0)
    model = SGPATransformer(11, 3, 8, 2, 2, max_len=6, attention=attention, attention_kwargs=kwargs)
    torch.manual_seed(0)
    vit = SGPAViT(8, 4, 1, 3, 8, 2, 2, attention=attention, attention_kwargs=kwargs)
    inputs = {model: torch.arange(12).remainder(11).view(2, 6), vit: torch.randn(2, 1, 8, 8)}
    for net, data in inputs.items():
        layers = [m for m in net.modules() if isinstance(m, SGPAttention)]
        assert len(layers) == 2 and all(m.sampler == "decomposed" for m in layers)
        elbo = SGPAELBO(net, num_data=100)
        elbo(*net(data), torch.tensor([0, 2])).backward()
        for name, p in net.named_parameters():
            assert p.grad is not None and torch.isfinite(p.grad).all(), name
            assert p.grad.abs().sum() > 0, name
    with pytest.raises(ValueError, match="decoupled"):
        SGPATransformer(11, 3, 8, 2, 1, max_len=6, attention="sgpa-standard", attention_kwargs={"sampler": "decomposed"})
