"""The state every attention layer shares: the Cholesky factor of the GP algebra against ``torch.linalg.cholesky``,
the record of a forward call's KL terms under copying, and the key/value cache of causal decoding against the layer's
own projections of the prefix (float64)."""

import copy
import pickle

import gpytorch
import pytest
import torch
from linear_operator.utils.errors import NotPSDError
from linear_operator.utils.warnings import NumericalWarning
from sgpa_layer_fixtures import BATCH, D_MODEL, LENGTH, _heads, _inputs, _layer, _step_through

from gpytorch_sgpa import kl_divergence
from gpytorch_sgpa.attention import KernelAttention, ScaledDotProductAttention
from gpytorch_sgpa.multihead import psd_cholesky


def test_psd_cholesky_on_the_cpu_factors_the_matrix_with_gpytorchs_jitter_where_it_fails():
    generator = torch.Generator().manual_seed(0)
    a = torch.randn(2, 4, 4, generator=generator, dtype=torch.float64)
    matrix = a @ a.mT + 4 * torch.eye(4, dtype=torch.float64)
    matrix[1] = torch.ones(4, 4, dtype=torch.float64)  # p.s.d. of rank 1: the plain factorisation fails
    with pytest.warns(NumericalWarning, match="added jitter"):  # linear_operator says so
        factor = psd_cholesky(matrix)
    torch.testing.assert_close(factor[0], torch.linalg.cholesky(matrix[0]), rtol=0, atol=0)
    added = factor[1] @ factor[1].mT - matrix[1]  # the jitter that made it work: a multiple of the identity
    jitter = float(added.diagonal().mean())
    torch.testing.assert_close(added, jitter * torch.eye(4, dtype=torch.float64), rtol=0, atol=1e-12)
    assert jitter == pytest.approx(gpytorch.settings.cholesky_jitter.value(torch.float64), rel=1e-6)  # the first try worked
    with pytest.raises(NotPSDError), pytest.warns(NumericalWarning):
        psd_cholesky(-torch.eye(3, dtype=torch.float64))


def test_a_copy_of_a_layer_starts_with_an_empty_kl_record():
    """The record holds the graph of the last call: ``deepcopy`` of such a (non-leaf) tensor raises, so a copied or
    pickled layer starts empty while the original keeps its KL."""
    layer = _layer()
    _, kl = layer(_inputs())
    assert kl.grad_fn is not None
    with pytest.raises(RuntimeError, match="deepcopy"):
        copy.deepcopy(layer.last_kl.total)
    copied, unpickled = copy.deepcopy(layer), pickle.loads(pickle.dumps(layer))
    for other in (copied, unpickled):
        assert other.last_kl.total is None and other.last_kl.global_ is None
        torch.testing.assert_close(other(_inputs())[1], kl, rtol=0, atol=0)  # same parameters, same KL
    torch.testing.assert_close(kl_divergence(layer), kl, rtol=0, atol=0)


@pytest.mark.parametrize("build", [ScaledDotProductAttention, KernelAttention, _layer])
def test_the_step_state_caches_the_projected_keys_and_values_of_the_prefix(build):
    torch.manual_seed(0)
    layer = _layer(causal=True) if build is _layer else build(D_MODEL, 2, causal=True).double()
    x = _inputs()
    if build is _layer:
        _, state = _step_through(layer, x, layer.sample_noise(BATCH, LENGTH))
    else:
        state = None
        for t in range(LENGTH):
            _, state = layer.forward_step(x[:, t : t + 1], state)
    key_projection = layer.k_proj if build is ScaledDotProductAttention else layer.qk_proj  # SGPA's keys are its queries
    assert state.length == LENGTH
    torch.testing.assert_close(state.keys, _heads(key_projection(x)), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(state.values, _heads(layer.v_proj(x)), rtol=1e-12, atol=1e-12)
