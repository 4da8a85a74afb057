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


@pytest.mark.parametrize("batched", [False, True])
def test_column_by_column_selection_equals_the_gram_one(batched, monkeypatch):
    """Large candidate sets evaluate one kernel column per pivot instead of ``k(X, X)``: same picks,
    also with a batched kernel (one selection per batch member, as OVC-per-dim)."""
    from gpytorch_hippo.inducing import selection

    X = torch.rand(80, 1, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    batch_shape = torch.Size([2]) if batched else torch.Size([])
    kernel = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel(batch_shape=batch_shape), batch_shape=batch_shape).double()
    kernel.base_kernel.lengthscale = torch.tensor([[[0.05]], [[0.2]]], dtype=torch.float64) if batched else 0.1
    with_gram = select_pivoted_cholesky(kernel, X, 15)
    monkeypatch.setattr(selection, "_GRAM_ENTRIES", 0)
    by_column = select_pivoted_cholesky(kernel, X, 15)
    assert torch.equal(with_gram, by_column) and by_column.shape == (*batch_shape, 15, 1)
    for b in range(2 if batched else 1):
        gram = kernel(X).to_dense()[b] if batched else kernel(X).to_dense()
        assert torch.equal(by_column[b] if batched else by_column, X[greedy_max_residual_variance(gram, 15)])
