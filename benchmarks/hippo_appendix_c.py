"""Thesis App. C.1 (the direct ``Kuu`` ODE) and App. C.2 (finite-basis reconstruction), measured (docs/results.md).

``--part reconstruction`` (App. C.2, Fig. 4.1e): the toy two-task series of Fig. 4.1 (task 1 on [0, 1],
task 2 on [1, 2], 100 points each, noise sd 0.1, RBF ℓ = 0.2, fixed hyperparameters), OHSGPR with M LegS
inducing variables (default backend).  After task 2, on a 400-point grid over [0, 2]: the finite-basis
reconstruction ``N(G m_u, G S_u Gᵀ)`` against the OHSGPR posterior of the latent f and against the exact
GP on all the data (the thesis's "gold standard").

``--part kuu-ode`` (App. C.1): ``Kuu(t)`` of LegS with an RBF kernel (ℓ = 1), integrated by explicit Euler
with step ``dt`` from ``t0`` to ``T = 20``, two ways: the direct Lyapunov ODE
``dK/dt = (A K + K Aᵀ + B cᵀ + c Bᵀ) / t`` (``c(t) = Kuf(t, x = t)`` exact at every step, the most
favourable case), and the random-feature route, Euler on the projected features
``dZ/dt = (A Z + B ψ(t)ᵀ) / t`` (R = 1,000 features, ``Kuu ≈ Z Zᵀ / R``), whose discretisation error is
measured against the same features projected exactly.  The reference is ``Kuu`` by Gauss-Legendre quadrature
in time, checked against the library's default (``method="lyapunov"``), which is also carried across the
same grid by ``advance``.  The forcing as printed in App. C.1 (``c 1ᵀ`` in place of ``B cᵀ``) is one more column.

    python benchmarks/hippo_appendix_c.py --part reconstruction
    python benchmarks/hippo_appendix_c.py --part kuu-ode
"""

import argparse
import math

import gpytorch
import torch

from gpytorch_hippo.hippo import normalized_legendre, quadrature_rule, transition
from gpytorch_hippo.inducing import HiPPOInducingVariables
from gpytorch_hippo.online import OnlineSGPR
from gpytorch_hippo.reconstruction import reconstruction_moments

DT = torch.float64


def rbf(lengthscale: float) -> gpytorch.kernels.Kernel:
    kernel = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel()).to(DT)
    kernel.base_kernel.lengthscale = lengthscale
    kernel.outputscale = 1.0
    return kernel


def toy_signal(x):
    return torch.sin(2 * math.pi * 1.2 * x) + 0.5 * torch.cos(2 * math.pi * 0.4 * x)


def reconstruction(seeds, sizes) -> None:
    header = [
        "M", "seed", "recon - OHSGPR mean: RMSE", "max abs", "recon sd / OHSGPR sd (median)",
        "OHSGPR - exact GP mean: RMSE", "recon - signal RMSE", "OHSGPR - signal RMSE",
    ]  # fmt: skip
    print("| " + " | ".join(header) + " |\n|" + " --- |" * len(header))
    grid = torch.linspace(0, 2, 400, dtype=DT)
    for M in sizes:
        for seed in seeds:
            g = torch.Generator().manual_seed(seed)
            tasks = []
            for low in (0.0, 1.0):
                x = (low + torch.rand(100, generator=g, dtype=DT)).sort().values
                tasks.append((x, toy_signal(x) + 0.1 * torch.randn(100, generator=g, dtype=DT)))
            likelihood = gpytorch.likelihoods.GaussianLikelihood().to(DT)
            likelihood.noise = 0.01
            model = OnlineSGPR(HiPPOInducingVariables(M, "legs", t=1.0), rbf(0.2), likelihood)
            model.update(*tasks[0])
            model.inducing_variables.advance(2.0)
            model.update(*tasks[1])
            model.eval()
            with torch.no_grad():
                post = model(grid.unsqueeze(-1))
                recon = reconstruction_moments(model, grid)
                x_all = torch.cat([tasks[0][0], tasks[1][0]])
                y_all = torch.cat([tasks[0][1], tasks[1][1]])
                kernel = rbf(0.2)
                K = kernel(x_all).to_dense() + 0.01 * torch.eye(len(x_all), dtype=DT)
                exact_mean = kernel(grid, x_all).to_dense() @ torch.linalg.solve(K, y_all)
            diff = recon.mean - post.mean
            ratio = (recon.variance.clamp_min(0).sqrt() / post.variance.sqrt()).median().item()
            truth = toy_signal(grid)
            cells = [
                diff.square().mean().sqrt().item(),
                diff.abs().max().item(),
                ratio,
                (post.mean - exact_mean).square().mean().sqrt().item(),
                (recon.mean - truth).square().mean().sqrt().item(),
                (post.mean - truth).square().mean().sqrt().item(),
            ]
            print(f"| {M} | {seed} | " + " | ".join(f"{c:.3g}" for c in cells) + " |")


def exact_kuu(t: float, M: int, lengthscale: float, nodes: int = 600) -> torch.Tensor:
    """``Kuu(t) = ∬ k(x - y) φ(x, t) φ(y, t)ᵀ`` by Gauss-Legendre quadrature over [0, t]."""
    x, w = quadrature_rule("legs", t, 1.0, nodes, 0.0)
    phi = w.unsqueeze(-1) * normalized_legendre(2 * x / t - 1, M)
    k = torch.exp(-0.5 * (x[:, None] - x[None, :]).square() / lengthscale**2)
    return phi.mT @ k @ phi


def projected(fn, t: float, M: int, nodes: int = 600) -> torch.Tensor:
    """``∫_0^t fn(x) φ(x, t) dx`` for ``fn`` mapping times ``(Q,)`` to ``(..., Q)``: ``(..., M)``."""
    x, w = quadrature_rule("legs", t, 1.0, nodes, 0.0)
    return (fn(x) * w) @ normalized_legendre(2 * x / t - 1, M)


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return (torch.linalg.matrix_norm(a - b) / torch.linalg.matrix_norm(b)).item()


def kuu_ode(sizes, steps, num_rff: int, seed: int, t_end: float = 20.0) -> None:
    ell = 1.0
    header = [
        "M", "dt", "t0", "direct ODE: error at T", "max over t", "features (Euler): error at T", "max over t",
        "forcing as printed: error at T", "`lyapunov` carried by `advance`: error at T",
    ]  # fmt: skip
    print("| " + " | ".join(header) + " |\n|" + " --- |" * len(header))
    g = torch.Generator().manual_seed(seed)
    omega = torch.randn(num_rff, generator=g, dtype=DT) / ell
    phase = 2 * math.pi * torch.rand(num_rff, generator=g, dtype=DT)

    def features(x):  # ψ(x): (R, Q), E[ψ(x) ψ(y)] = k(x - y) with 1/R from the sum
        return math.sqrt(2.0) * torch.cos(omega[:, None] * x[None, :] + phase[:, None])

    for M in sizes:
        A, B = transition("legs", M)
        kernel = rbf(ell)
        K_T = exact_kuu(t_end, M, ell)
        library = HiPPOInducingVariables(M, "legs", t=t_end, method="lyapunov").Kuu(kernel).to_dense()
        print(f"<!-- M = {M}: quadrature Kuu(T) against the library's lyapunov Kuu(T): {rel(library, K_T):.2e} (its jitter) -->")
        for dt in steps:
            for t0 in (dt, M * dt):
                n = round((t_end - t0) / dt)
                times = [t0 + i * dt for i in range(n + 1)]
                K = exact_kuu(t0, M, ell)
                K_printed = K.clone()
                Z = projected(features, t0, M)  # (R, M)
                ones = torch.ones(M, dtype=DT)
                ivars = HiPPOInducingVariables(M, "legs", t=t0, method="lyapunov")
                ivars.Kuu(kernel)
                worst_direct = worst_rff = 0.0
                checkpoints = set(range(0, n + 1, max(1, n // 8))) | {n}
                for i, t in enumerate(times[:-1]):
                    c = projected(lambda x, t=t: torch.exp(-0.5 * (t - x).square() / ell**2), t, M)
                    K = K + dt / t * (A @ K + K @ A.mT + torch.outer(B, c) + torch.outer(c, B))
                    K_printed = K_printed + dt / t * (A @ K_printed + K_printed @ A.mT + torch.outer(ones, c) + torch.outer(c, ones))
                    Z = Z + dt / t * (Z @ A.mT + torch.outer(features(torch.tensor([t], dtype=DT)).squeeze(-1), B))
                    ivars.advance(times[i + 1])
                    with torch.no_grad():
                        ivars.Kuu(kernel)
                    if i + 1 in checkpoints:
                        t_next = times[i + 1]
                        K_ref = exact_kuu(t_next, M, ell)
                        Z_ref = projected(features, t_next, M)
                        worst_direct = max(worst_direct, rel(K, K_ref))
                        worst_rff = max(worst_rff, rel(Z.mT @ Z / num_rff, Z_ref.mT @ Z_ref / num_rff))
                Z_ref = projected(features, t_end, M)
                with torch.no_grad():
                    carried = ivars.Kuu(kernel).to_dense()
                cells = [
                    rel(K, K_T),
                    worst_direct,
                    rel(Z.mT @ Z / num_rff, Z_ref.mT @ Z_ref / num_rff),
                    worst_rff,
                    rel(K_printed, K_T),
                    rel(carried, library),
                ]
                print(f"| {M} | {dt:g} | {t0:g} | " + " | ".join(f"{c:.2e}" for c in cells) + " |")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--part", choices=("reconstruction", "kuu-ode"), required=True)
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--sizes", default=None, help="M values (default 8,15,30 / 8,16,32)")
    parser.add_argument("--steps", default="0.2,0.1,0.05,0.02", help="Euler steps dt (kuu-ode)")
    parser.add_argument("--num-rff", type=int, default=1000)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    if args.part == "reconstruction":
        sizes = [int(s) for s in (args.sizes or "8,15,30").split(",")]
        reconstruction([int(s) for s in args.seeds.split(",")], sizes)
    else:
        sizes = [int(s) for s in (args.sizes or "8,16,32").split(",")]
        kuu_ode(sizes, [float(s) for s in args.steps.split(",")], args.num_rff, int(args.seeds.split(",")[0]))


if __name__ == "__main__":
    main()
