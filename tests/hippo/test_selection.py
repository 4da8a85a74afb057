"""Pivoted-Cholesky selection of inducing inputs (OVC) against a greedy reference written here."""
import gpytorch
import pytest
import torch

from gpytorch_hippo.inducing import select_pivoted_cholesky


def greedy_max_residual_variance(K, num):
    """Direct greedy: repeatedly take the candidate with the largest conditional prior variance."""
    chosen = []
    for _ in range(num):
        best, best_var = None, -1.0
        for j in range(K.shape[0]):
            if j in chosen:
                continue
            if chosen:
                Kc = K[chosen][:, chosen]
                kj = K[chosen, j]
                var = K[j, j] - kj @ torch.linalg.solve(Kc, kj)
            else:
                var = K[j, j]
            if var > best_var:
                best, best_var = j, float(var.detach())
        chosen.append(best)
    return chosen


@pytest.mark.parametrize("lengthscale", [0.1, 0.4])
def test_selection_matches_greedy_conditional_variance(lengthscale):
    torch.manual_seed(3)
    X = torch.rand(60, 2, dtype=torch.float64)
    kernel = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel()).double()
    kernel.base_kernel.lengthscale = lengthscale
    Z = select_pivoted_cholesky(kernel, X, 12)
    reference = greedy_max_residual_variance(kernel(X).to_dense(), 12)
    assert torch.equal(Z, X[reference])


def test_selection_rejects_bad_num():
    kernel = gpytorch.kernels.RBFKernel()
    with pytest.raises(ValueError, match="num"):
        select_pivoted_cholesky(kernel, torch.rand(5, 1), 6)
