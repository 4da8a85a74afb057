"""order_inputs against a naive pure-Python implementation of the greedy definitions of thesis §4.4."""

import math

import gpytorch
import pytest
import torch

from gpytorch_hippo.ordering import ORDERING_CRITERIA, order_inputs

DT = torch.float64


def rbf_kernel(lengthscales=(0.7, 1.3)):
    kernel = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel(ard_num_dims=len(lengthscales))).to(DT)
    kernel.base_kernel.lengthscale = torch.tensor(lengthscales, dtype=DT)
    kernel.outputscale = 2.0
    return kernel


def k_naive(a, b, lengthscales=(0.7, 1.3)):
    """The same ARD RBF kernel written out with Python floats."""
    return 2.0 * math.exp(-0.5 * sum(((ai - bi) / l) ** 2 for ai, bi, l in zip(a, b, lengthscales)))


def greedy_naive(points, maximise, start=None):
    """Thesis §4.4: x_1 = arg-ext_x k(x, start or 0), x_i = arg-ext over the rest of k(x, x_{i-1});
    ties go to the smallest index. Pure Python, one kernel evaluation per pair."""
    remaining = list(range(len(points)))
    previous = [0.0] * len(points[0]) if start is None else start
    order = []
    while remaining:
        values = [k_naive(points[j], previous) for j in remaining]
        best = max(values) if maximise else min(values)
        chosen = remaining[values.index(best)]
        order.append(chosen)
        remaining.remove(chosen)
        previous = points[chosen]
    return order


def data(n=37, seed=0):
    g = torch.Generator().manual_seed(seed)
    return 3 * torch.randn(n, 2, generator=g, dtype=DT)


@pytest.mark.parametrize("criterion", ["kernel_max", "kernel_min"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_greedy_orders_equal_naive_definition(criterion, seed):
    x = data(seed=seed)
    order = order_inputs(x, criterion, kernel=rbf_kernel())
    assert order.dtype == torch.long
    assert order.tolist() == greedy_naive(x.tolist(), maximise=criterion == "kernel_max")


@pytest.mark.parametrize("criterion", ["kernel_max", "kernel_min"])
def test_start_continues_the_path_and_blocks_do_not_matter(criterion):
    x = data(n=29, seed=3)
    start = torch.tensor([4.0, -1.0], dtype=DT)
    expected = greedy_naive(x.tolist(), maximise=criterion == "kernel_max", start=start.tolist())
    for block_size in (1, 5, 29, 1000):
        order = order_inputs(x, criterion, kernel=rbf_kernel(), start=start, block_size=block_size)
        assert order.tolist() == expected


def test_kernel_max_first_point_is_closest_to_origin_and_start():
    x = data(n=50, seed=4)
    order = order_inputs(x, "kernel_max", kernel=rbf_kernel((1.0, 1.0)))
    assert order[0] == x.norm(dim=-1).argmin()
    start = x[7] + 1e-3
    order = order_inputs(x, "kernel_max", kernel=rbf_kernel((1.0, 1.0)), start=start)
    assert order[0] == 7


def test_kernel_max_walk_is_much_shorter_than_kernel_min():
    """The intuition of the thesis: k-max makes consecutive inputs close, k-min makes them far apart."""
    x = data(n=200, seed=5)
    kernel = rbf_kernel((1.0, 1.0))

    def path_length(order):
        return (x[order][1:] - x[order][:-1]).norm(dim=-1).sum()

    random_length = path_length(order_inputs(x, "random", generator=torch.Generator().manual_seed(0)))
    assert path_length(order_inputs(x, "kernel_max", kernel=kernel)) < 0.3 * random_length
    assert path_length(order_inputs(x, "kernel_min", kernel=kernel)) > 1.3 * random_length


@pytest.mark.parametrize("criterion", list(ORDERING_CRITERIA) + ["key"])
def test_every_criterion_returns_a_permutation(criterion):
    x = data(n=64, seed=6)
    key = criterion if criterion != "key" else (lambda z: z[:, 0])
    order = order_inputs(x, key, kernel=rbf_kernel(), generator=torch.Generator().manual_seed(1))
    assert order.dtype == torch.long and order.shape == (64,)
    assert torch.equal(order.sort().values, torch.arange(64))


def test_random_order_is_reproducible_and_seed_dependent():
    x = data(n=100)
    first = order_inputs(x, "random", generator=torch.Generator().manual_seed(11))
    again = order_inputs(x, "random", generator=torch.Generator().manual_seed(11))
    other = order_inputs(x, "random", generator=torch.Generator().manual_seed(12))
    assert torch.equal(first, again)
    assert not torch.equal(first, other)
    assert torch.equal(first, torch.randperm(100, generator=torch.Generator().manual_seed(11)))


def test_key_order_sorts_scores_increasingly_and_stably():
    x = torch.tensor([[3.0, 0.0], [1.0, 5.0], [2.0, 1.0], [1.0, -2.0]], dtype=DT)
    assert order_inputs(x, lambda z: z[:, 0]).tolist() == [1, 3, 2, 0]
    assert order_inputs(x, lambda z: -z[:, 1]).tolist() == [1, 2, 0, 3]


def test_one_dimensional_inputs_and_float32():
    t = torch.tensor([0.5, 0.1, 0.9, 0.3])
    kernel = gpytorch.kernels.RBFKernel()
    kernel.lengthscale = 0.2
    # from 0: 0.1, then nearest 0.3, 0.5, 0.9
    assert order_inputs(t, "kernel_max", kernel=kernel).tolist() == [1, 3, 0, 2]
    assert order_inputs(t.unsqueeze(-1), "kernel_max", kernel=kernel).tolist() == [1, 3, 0, 2]


def test_bad_inputs_raise_errors_naming_the_argument():
    x = data(n=10)
    kernel = rbf_kernel()
    with pytest.raises(ValueError, match="criterion"):
        order_inputs(x, "kernel_mean", kernel=kernel)
    with pytest.raises(TypeError, match="criterion"):
        order_inputs(x, 3, kernel=kernel)
    with pytest.raises(ValueError, match="kernel"):
        order_inputs(x, "kernel_max")
    with pytest.raises(TypeError, match="kernel"):
        order_inputs(x, "kernel_min", kernel=lambda a, b: a @ b.T)
    with pytest.raises(ValueError, match="x must have shape"):
        order_inputs(x.unsqueeze(0), "random")
    with pytest.raises(ValueError, match="x must have shape"):
        order_inputs(torch.empty(0, 2, dtype=DT), "random")
    with pytest.raises(TypeError, match="x must be a torch.Tensor"):
        order_inputs(x.tolist(), "random")
    with pytest.raises(ValueError, match="NaN"):
        order_inputs(torch.tensor([[0.0, float("nan")]]), "random")
    with pytest.raises(ValueError, match="start"):
        order_inputs(x, "kernel_max", kernel=kernel, start=torch.zeros(3, dtype=DT))
    with pytest.raises(ValueError, match="block_size"):
        order_inputs(x, "kernel_max", kernel=kernel, block_size=0)
    with pytest.raises(ValueError, match=r"key function\) must return scores of shape \(10,\)"):
        order_inputs(x, lambda z: z)
    with pytest.raises(TypeError, match="generator"):
        order_inputs(x, "random", generator=0)
