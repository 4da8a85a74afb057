"""VFF inducing variables (OVFF baseline) against numerical integration of the Matérn RKHS inner product."""
import math

import gpytorch
import numpy as np
import pytest
import torch

from gpytorch_hippo import OnlineSGPR
from gpytorch_hippo.inducing import FourierInducingVariables, InducingPoints

A, B = -1.0, 2.0


def matern(nu, lengthscale=0.7, outputscale=1.3):
    kernel = gpytorch.kernels.ScaleKernel(gpytorch.kernels.MaternKernel(nu=nu)).double()
    kernel.base_kernel.lengthscale = lengthscale
    kernel.outputscale = outputscale
    return kernel


def matern_closed_form(nu, lam, variance, r):
    """σ² poly(λr) exp(-λr), λ = √(2ν)/ℓ (differentiable to any order away from r = 0)."""
    poly = {0.5: 1.0, 1.5: 1 + lam * r, 2.5: 1 + lam * r + (lam * r) ** 2 / 3}[nu]
    return variance * poly * torch.exp(-lam * r)


def derivatives(fn, y, order):
    """[f, f', ..., f^(order)] at the nodes ``y`` by repeated autograd (fn acts elementwise)."""
    y = y.clone().requires_grad_(True)
    values = [fn(y)]
    for _ in range(order):
        values.append(torch.autograd.grad(values[-1].sum(), y, create_graph=True)[0])
    return [v.detach() for v in values]


def rkhs_inner(f, g, nu, lam, variance, cut=None, nodes=120):
    """<f, g>_H on [A, B] for Matérn-nu written directly from Durrande et al. (2016):
    c_p/σ² ∫ (λ+D)^p f (λ+D)^p g + boundary terms at A; Gauss-Legendre panels split at ``cut``."""
    p = int(nu + 0.5)
    coefficient = {1: 1 / (2 * lam), 2: 1 / (4 * lam**3), 3: 3 / (16 * lam**5)}[p]
    z, w = np.polynomial.legendre.leggauss(nodes)
    edges = [A, B] if cut is None else [A, cut, B]
    total = 0.0
    for lo, hi in zip(edges[:-1], edges[1:]):
        y = torch.tensor((z + 1) / 2 * (hi - lo) + lo)
        df, dg = derivatives(f, y, p), derivatives(g, y, p)
        lf = sum(math.comb(p, k) * lam ** (p - k) * df[k] for k in range(p + 1))
        lg = sum(math.comb(p, k) * lam ** (p - k) * dg[k] for k in range(p + 1))
        total += coefficient * ((hi - lo) / 2 * torch.tensor(w) * lf * lg).sum().item()
    fa, ga = derivatives(f, torch.tensor([A], dtype=torch.float64), 2), derivatives(g, torch.tensor([A], dtype=torch.float64), 2)
    fa, ga = [v.item() for v in fa], [v.item() for v in ga]
    if p == 1:
        boundary = fa[0] * ga[0]
    elif p == 2:
        boundary = fa[0] * ga[0] + fa[1] * ga[1] / lam**2
    else:
        boundary = (9 / 8 * fa[0] * ga[0] + 9 / (8 * lam**4) * fa[2] * ga[2]
                    + 3 / lam**2 * (fa[1] * ga[1] + fa[2] * ga[0] / 8 + fa[0] * ga[2] / 8))
    return (total + boundary) / variance


def fourier_functions(K):
    omegas = [2 * math.pi * k / (B - A) for k in range(K + 1)]
    cos = [lambda y, o=o: torch.cos(o * (y - A)) for o in omegas]
    sin = [lambda y, o=o: torch.sin(o * (y - A)) for o in omegas[1:]]
    return cos + sin


@pytest.mark.parametrize("nu", [0.5, 1.5, 2.5])
def test_inner_product_reproduces_the_kernel_and_matches_kuu_kuf(nu):
    kernel = matern(nu)
    lam, variance = math.sqrt(2 * nu) / kernel.base_kernel.lengthscale.item(), kernel.outputscale.item()
    features = FourierInducingVariables(3, A, B, jitter=0.0)
    phis = fourier_functions(3)
    x0 = 0.37
    k_x0 = lambda y: matern_closed_form(nu, lam, variance, (y - x0).abs())
    grid = torch.linspace(A, B, 7, dtype=torch.float64)  # the closed form is GPyTorch's kernel
    torch.testing.assert_close(k_x0(grid), kernel(grid.unsqueeze(-1), torch.tensor([[x0]], dtype=torch.float64)).to_dense()[:, 0])
    # reproducing property <φ, k(x0, .)>_H = φ(x0): validates the inner product written above ...
    reproduced = torch.tensor([rkhs_inner(phi, k_x0, nu, lam, variance, cut=x0) for phi in phis], dtype=torch.float64)
    kuf = features.Kuf(kernel, torch.tensor([[x0]], dtype=torch.float64))[:, 0]
    torch.testing.assert_close(reproduced, kuf, rtol=1e-7, atol=1e-7)
    # ... and the same inner product between the features is Kuu
    quadrature = torch.tensor([[rkhs_inner(f, g, nu, lam, variance) for g in phis] for f in phis], dtype=torch.float64)
    kuu = features.Kuu(kernel)
    assert type(kuu).__name__ == "LowRankRootAddedDiagLinearOperator"
    torch.testing.assert_close(kuu.to_dense(), quadrature, rtol=1e-8, atol=1e-8)
