"""Index splits: disjoint, of the sizes asked for, reproducible from the seed."""

import pytest
import torch

from gpytorch_sgpa.data import split_indices


def test_split_indices_disjoint_and_reproducible():
    first = split_indices(100, [10, 20, 30], seed=3)
    again = split_indices(100, [10, 20, 30], seed=3)
    assert [len(s) for s in first] == [10, 20, 30]
    assert all(torch.equal(a, b) for a, b in zip(first, again))
    assert len(torch.cat(first).unique()) == 60
    with pytest.raises(ValueError, match="sizes"):
        split_indices(10, [6, 6])
