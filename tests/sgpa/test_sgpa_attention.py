"""SGPA layers against independent references (float64).

References: hand-coded kernels; eqs. (3.14) and (3.15) (the decoupled SVGP predictive, Chen & Li 2023) written out with explicit
inverses; GPyTorch's ``UnwhitenedVariationalStrategy`` (an SVGP with a Cholesky variational
distribution) over the inducing set the thesis derives each SGPA variant from; and
``torch.distributions.kl_divergence`` between the implied Gaussians ``q(u)`` and ``p(u)``.
"""

import itertools
import math

import gpytorch
import pytest
import torch
import torch.nn.functional as F
from gpytorch.distributions import MultivariateNormal
from gpytorch.kernels import RBFKernel, ScaleKernel
from gpytorch.variational import CholeskyVariationalDistribution, UnwhitenedVariationalStrategy
from sgpa_layer_fixtures import BATCH, D_MODEL, HEADS, LENGTH, NUM_GLOBAL, TIGHT, E, _heads, _inputs, _layer, _step_through
from torch.distributions import MultivariateNormal as TorchMVN
from torch.distributions import kl_divergence

from gpytorch_sgpa.attention import (
    KernelAttention,
    ScaledDotProductAttention,
    SGPANoise,
    SGPAttention,
)
from gpytorch_sgpa.kernels import ExponentialKernel, evaluate_kernel, kernel_blocks, make_attention_kernel


@pytest.fixture(autouse=True)
def _tiny_jitter():
    with gpytorch.settings.cholesky_jitter(float_value=1e-6, double_value=1e-12):
        yield


def _hand_kernel(layer, h, x1, x2):
    """sigma_f^2 exp(-0.5 sum (x-x')^2/l^2) or sigma_f^2 exp(sum x x'/l^2), written out."""
    ls = layer.kernel.base_kernel.lengthscale[h, 0]
    os_ = layer.kernel.outputscale[h]
    if layer.kernel_name == "rbf":
        diff = (x1[:, None, :] - x2[None, :, :]) / ls
        return os_ * torch.exp(-0.5 * diff.square().sum(-1))
    return os_ * torch.exp((x1 / ls) @ (x2 / ls).T)


def _ref_svgp(layer, h, inducing, mean_u, chol_u, x):
    """GPyTorch unwhitened SVGP with q(u) = N(mean_u[d], chol_u[d] chol_u[d]^T), one per output dim."""
    num_dims, m = mean_u.shape

    class Ref(gpytorch.models.ApproximateGP):
        def __init__(self):
            dist = CholeskyVariationalDistribution(m, batch_shape=torch.Size([num_dims]))
            strategy = UnwhitenedVariationalStrategy(self, inducing, dist, learn_inducing_locations=False, jitter_val=1e-12)
            super().__init__(strategy)
            if layer.kernel_name == "rbf":
                base = RBFKernel(ard_num_dims=E)
            else:
                base = ExponentialKernel(ard_num_dims=E)
            self.covar_module = ScaleKernel(base)
            self.covar_module.base_kernel.lengthscale = layer.kernel.base_kernel.lengthscale[h].detach()
            self.covar_module.outputscale = layer.kernel.outputscale[h].detach()

        def forward(self, inputs):
            return MultivariateNormal(torch.zeros(inputs.shape[:-1], dtype=inputs.dtype), self.covar_module(inputs))

    ref = Ref().double()
    with torch.no_grad():
        ref.variational_strategy._variational_distribution.variational_mean.copy_(mean_u)
        ref.variational_strategy._variational_distribution.chol_variational_covar.copy_(chol_u)
        ref.variational_strategy.variational_params_initialized.fill_(1)  # keep the values set here
    ref.eval()
    with torch.no_grad():
        out = ref(x.expand(num_dims, *x.shape))
        return out.mean, out.covariance_matrix


# ---------------------------------------------------------------------------------------- kernels
def test_kernels_match_closed_forms():
    torch.manual_seed(0)
    x1, x2 = torch.randn(3, 4, 2, dtype=torch.double), torch.randn(3, 5, 2, dtype=torch.double)
    for name in ("rbf", "exponential"):
        kernel = make_attention_kernel(name, head_dim=2, num_heads=3).double()
        kernel.base_kernel.lengthscale = torch.tensor([[[0.7, 1.3]], [[1.1, 0.5]], [[2.0, 0.9]]])
        kernel.outputscale = torch.tensor([0.5, 1.5, 2.5])
        gram = evaluate_kernel(kernel, x1, x2)
        diag = evaluate_kernel(kernel, x1, diag=True)
        lazy = kernel(x1, x2).to_dense()
        for h in range(3):
            ls, os_ = kernel.base_kernel.lengthscale[h, 0], kernel.outputscale[h]
            a, b = x1[h] / ls, x2[h] / ls
            if name == "rbf":
                expected = os_ * torch.exp(-0.5 * torch.cdist(a, b).square())
                expected_diag = os_.expand(4)
            else:
                expected = os_ * torch.exp(a @ b.T)
                expected_diag = os_ * torch.exp(a.square().sum(-1))
            torch.testing.assert_close(gram[h], expected, **TIGHT)
            torch.testing.assert_close(lazy[h], expected, **TIGHT)
            torch.testing.assert_close(diag[h], expected_diag, **TIGHT)
    # batched (batch, heads, L, d) inputs broadcast against the per-head hyperparameters
    xb = torch.randn(2, 3, 4, 2, dtype=torch.double)
    torch.testing.assert_close(evaluate_kernel(kernel, xb)[1], evaluate_kernel(kernel, xb[1]), **TIGHT)
    # the exponential kernel is positive semi-definite
    assert torch.linalg.eigvalsh(evaluate_kernel(kernel, x1)).min() > -1e-10


def _gpytorch_reference(kernel, x1, x2):
    """GPyTorch's own evaluation (``ScaleKernel.forward``), the independent reference of the lean path."""
    return kernel.outputscale[..., None, None] * kernel.base_kernel.forward(x1, x2)


@pytest.mark.parametrize("name", ["rbf", "exponential"])
def test_kernel_blocks_equal_gpytorch_values_and_gradients(name):
    """One fused pass for [k(q, q), k(q, g)] equals GPyTorch's evaluation, values and gradients."""
    torch.manual_seed(1)
    kernel = make_attention_kernel(name, head_dim=3, num_heads=2).double()
    kernel.base_kernel.lengthscale = torch.tensor([[[0.7, 1.3, 2.0]], [[1.1, 0.5, 0.8]]])
    kernel.outputscale = torch.tensor([0.5, 1.5])
    queries = torch.randn(4, 2, 5, 3, dtype=torch.double, requires_grad=True)  # (B, H, L, e)
    keys = torch.randn(2, 6, 3, dtype=torch.double, requires_grad=True)  # (H, M, e), broadcast over B
    gram, cross = kernel_blocks(kernel, queries, keys)
    ref_gram, ref_cross = _gpytorch_reference(kernel, queries, queries), _gpytorch_reference(kernel, queries, keys)
    torch.testing.assert_close(gram, ref_gram, **TIGHT)
    torch.testing.assert_close(cross, ref_cross, **TIGHT)
    torch.testing.assert_close(evaluate_kernel(kernel, queries, keys), ref_cross, **TIGHT)
    weights = torch.randn(2, 4, 2, 5, 11, dtype=torch.double)
    inputs = [queries, keys, kernel.base_kernel.raw_lengthscale, kernel.raw_outputscale]
    ours = torch.autograd.grad((torch.cat([gram, cross], -1) * weights[0]).sum(), inputs)
    theirs = torch.autograd.grad((torch.cat([ref_gram, ref_cross], -1) * weights[0]).sum(), inputs)
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a, b, **TIGHT)
    # single precision: the centred |a|² + |b|² - 2 aᵀb form keeps float32 rounding at GPyTorch's level
    gram32, cross32 = kernel_blocks(kernel.float(), queries.float(), keys.float())
    torch.testing.assert_close(gram32.double(), ref_gram, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(cross32.double(), ref_cross, rtol=1e-5, atol=1e-5)


def test_kernel_blocks_fall_back_to_forward_for_other_kernels():
    torch.manual_seed(2)
    kernel = ScaleKernel(gpytorch.kernels.MaternKernel(nu=1.5, batch_shape=torch.Size([2])), batch_shape=torch.Size([2]))
    x1, x2 = torch.randn(2, 4, 3, dtype=torch.double), torch.randn(2, 5, 3, dtype=torch.double)
    kernel = kernel.double()
    gram, cross = kernel_blocks(kernel, x1, x2)
    torch.testing.assert_close(gram, kernel.forward(x1, x1), **TIGHT)
    torch.testing.assert_close(cross, kernel.forward(x1, x2), **TIGHT)
    with pytest.raises(ValueError, match="feature dimension"):
        kernel_blocks(kernel, x1, torch.randn(2, 5, 4, dtype=torch.double))


# ---------------------------------------------------------------------------------------- MLE layers
def test_scaled_dot_product_attention_matches_torch():
    torch.manual_seed(0)
    layer = ScaledDotProductAttention(D_MODEL, HEADS).double()
    x = _inputs()
    mask = torch.tensor([[False] * 4 + [True], [False] * 5])
    out, kl = layer(x, key_padding_mask=mask)
    q, k, v = (_heads(p(x)) for p in (layer.q_proj, layer.k_proj, layer.v_proj))
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=~mask[:, None, None, :])
    expected = layer.out_proj(ref.transpose(1, 2).reshape(BATCH, LENGTH, D_MODEL))
    torch.testing.assert_close(out, expected, **TIGHT)
    assert kl.dim() == 0 and kl.item() == 0.0
    causal = ScaledDotProductAttention(D_MODEL, HEADS, causal=True).double()
    causal.load_state_dict(layer.state_dict())
    ref_causal = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    expected = layer.out_proj(ref_causal.transpose(1, 2).reshape(BATCH, LENGTH, D_MODEL))
    torch.testing.assert_close(causal(x)[0], expected, **TIGHT)


@pytest.mark.parametrize("kernel", ["rbf", "exponential"])
def test_kernel_attention_is_gram_times_values(kernel):
    torch.manual_seed(0)
    layer = KernelAttention(D_MODEL, HEADS, kernel=kernel).double()
    x = _inputs()
    mask = torch.tensor([[False, True, False, False, True], [False] * 5])
    out, kl = layer(x, key_padding_mask=mask)
    q, v = _heads(layer.qk_proj(x)), _heads(layer.v_proj(x))
    heads = torch.zeros(BATCH, HEADS, LENGTH, E, dtype=torch.double)
    for b, h in itertools.product(range(BATCH), range(HEADS)):
        keep = ~mask[b]
        heads[b, h] = _hand_kernel(layer, h, q[b, h], q[b, h][keep]) @ v[b, h][keep]
    expected = layer.out_proj(heads.transpose(1, 2).reshape(BATCH, LENGTH, D_MODEL))
    torch.testing.assert_close(out, expected, **TIGHT)
    assert kl.item() == 0.0


# ---------------------------------------------------------------------------------------- standard SGPA
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


# ---------------------------------------------------------------------------------------- decoupled SGPA
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
