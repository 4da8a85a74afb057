"""The attention kernels against closed forms and GPyTorch's own evaluation (float64), and the authors' initialisation."""

import math

import gpytorch
import pytest
import torch
from gpytorch.kernels import ScaleKernel
from sgpa_layer_fixtures import TIGHT

from gpytorch_sgpa.kernels import evaluate_kernel, kernel_blocks, make_attention_kernel


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


@pytest.mark.parametrize("kernel,log_ls,outputscale", [("rbf", 0.0, 1.0), ("exponential", 4.0, math.exp(-4.0))])
def test_authors_kernel_initialisation(kernel, log_ls, outputscale):
    torch.manual_seed(0)
    k = make_attention_kernel(kernel, head_dim=64, num_heads=8, init="authors")
    logs = k.base_kernel.lengthscale.detach().log()
    assert logs.shape == (8, 1, 64)
    # 512 draws of N(log_ls, 1): mean within 4 standard errors (4/√512 ≈ 0.18), std within 0.15
    assert abs(float(logs.mean()) - log_ls) < 0.18 and abs(float(logs.std()) - 1.0) < 0.15
    torch.testing.assert_close(k.outputscale, torch.full((8,), outputscale))
    with pytest.raises(ValueError, match="init"):
        make_attention_kernel(kernel, head_dim=4, num_heads=2, init="xavier")
