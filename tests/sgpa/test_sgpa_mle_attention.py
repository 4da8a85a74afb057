"""The maximum-likelihood attention layers: scaled dot-product attention against PyTorch's own, kernel attention
against the Gram matrix of a hand-coded kernel times the values (float64)."""

import itertools

import pytest
import torch
import torch.nn.functional as F
from sgpa_layer_fixtures import BATCH, D_MODEL, HEADS, LENGTH, TIGHT, E, _hand_kernel, _heads, _inputs

from gpytorch_sgpa.attention import KernelAttention, ScaledDotProductAttention


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
