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


def _max_residual_variance(kernel, X, Z):
    """``max diag(K_XX - K_XZ K_ZZ⁻¹ K_ZX)`` by a direct solve (the reference for the stopping rule)."""
    with torch.no_grad():
        K_xz, K_zz = kernel(X, Z).to_dense(), kernel(Z).to_dense()
        return float((kernel(X, diag=True) - (K_xz * torch.linalg.solve(K_zz, K_xz.mT).mT).sum(-1)).max())


def test_selection_stops_when_the_residual_variance_is_exhausted():
    """A long length scale over a short interval has a numerical rank far below ``num``: the greedy
    pivots stop there (it used to keep pivoting on round-off and return 39 distinct of 50 points)."""
    X = torch.linspace(0, 10, 300, dtype=torch.float64).unsqueeze(-1)
    kernel = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel()).double()
    kernel.base_kernel.lengthscale = 2.0
    kernel.outputscale = 7.0
    Z = select_pivoted_cholesky(kernel, X, 50)
    assert 5 < Z.shape[0] < 50
    assert torch.unique(Z).numel() == Z.shape[0]
    assert _max_residual_variance(kernel, X, Z[:-1]) > 1e-10 * 7.0  # the last pivot was still needed
    assert torch.equal(Z, X[greedy_max_residual_variance(kernel(X).to_dense(), Z.shape[0])])
    assert select_pivoted_cholesky(kernel, X, 50, tol=1e-4).shape[0] < Z.shape[0]  # a looser tolerance stops earlier


def test_duplicate_candidates_are_never_both_chosen():
    """OVC's candidates are the old points and the new inputs; a repeated input is chosen once."""
    X = torch.rand(20, 1, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    candidates = torch.cat([X, X])
    kernel = gpytorch.kernels.RBFKernel().double()
    kernel.lengthscale = 0.01  # every distinct input is needed
    Z = select_pivoted_cholesky(kernel, candidates, 40)
    assert Z.shape[0] == 20 and torch.unique(Z).numel() == 20


def test_batched_selection_has_one_size_and_no_duplicates():
    X = torch.linspace(0, 10, 200, dtype=torch.float64).unsqueeze(-1)
    kernel = gpytorch.kernels.RBFKernel(batch_shape=torch.Size([2])).double()
    kernel.lengthscale = torch.tensor([[[3.0]], [[0.3]]], dtype=torch.float64)
    Z = select_pivoted_cholesky(kernel, X, 60)
    assert Z.shape[0] == 2 and Z.shape[1] < 60
    assert all(torch.unique(Z[b]).numel() == Z.shape[1] for b in range(2))
    long_only = gpytorch.kernels.RBFKernel().double()
    long_only.lengthscale = 3.0
    assert Z.shape[1] == select_pivoted_cholesky(long_only, X, 60).shape[0]  # the long length scale is exhausted first


def test_selection_rejects_a_bad_tolerance():
    with pytest.raises(ValueError, match="tol"):
        select_pivoted_cholesky(gpytorch.kernels.RBFKernel(), torch.rand(5, 1), 3, tol=1.5)
