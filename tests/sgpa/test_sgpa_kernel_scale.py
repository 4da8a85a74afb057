"""The kernel scale chosen from softmax attention (``convert(..., calibration_inputs=...)``) against the softmax
logits computed by hand from ``nn.MultiheadAttention``'s projections: per head, the spread of the kernel's
log-weights over the valid keys equals that of the logits, and a valid query's weights sum to 1 in geometric mean,
for every kernel (Matérn kernels by iteration) and with padded keys."""

import copy
import math

import pytest
import torch
from torch import nn

from gpytorch_sgpa import convert
from gpytorch_sgpa.kernel_scale import calibrate_kernel_scales
from gpytorch_sgpa.kernels import KERNEL_NAMES

D_MODEL, HEADS, BATCH, LENGTH = 8, 2, 4, 7


def _split(t):
    return t.view(BATCH, LENGTH, HEADS, D_MODEL // HEADS).transpose(1, 2)


def _rows(values, mask):
    """Per head, the valid queries' rows of ``values`` (B, H, L, L) over the valid keys, each a 1-D tensor."""
    return [[values[b, h][~mask[b]][:, ~mask[b]] for b in range(BATCH)] for h in range(HEADS)]


def _spread(values, mask):
    """Mean over the valid queries of the standard deviation over the valid keys, per head."""
    return torch.stack([torch.cat([rows.std(-1, unbiased=False) for rows in head]).mean() for head in _rows(values, mask)])


def _log_mass(log_weights, mask):
    """Mean over the valid queries of log Σ_j exp(log_weights), per head."""
    return torch.stack([torch.cat([rows.logsumexp(-1) for rows in head]).mean() for head in _rows(log_weights, mask)])


@pytest.mark.parametrize("kernel", KERNEL_NAMES)
def test_calibrated_kernel_weights_have_the_spread_and_mass_of_the_softmax_logits(kernel):
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(D_MODEL, HEADS, batch_first=True).double().eval()
    x = torch.randn(BATCH, LENGTH, D_MODEL, dtype=torch.double)
    mask = torch.zeros(BATCH, LENGTH, dtype=torch.bool)
    mask[1, 5:], mask[3, 2:] = True, True  # padded keys, and queries, take no part
    weight_q, weight_k, _ = mha.in_proj_weight.detach().chunk(3)
    bias_q, bias_k, _ = mha.in_proj_bias.detach().chunk(3)
    logits = _split(x @ weight_q.T + bias_q) @ _split(x @ weight_k.T + bias_k).transpose(-2, -1) / math.sqrt(D_MODEL // HEADS)

    def log_weights(adapter):
        layer = adapter.attention
        with torch.no_grad():
            gram = layer.kernel(_split(layer.qk_proj(x))).to_dense()  # GPyTorch's own evaluation
        return gram.log(), (gram / layer.kernel.outputscale.view(1, HEADS, 1, 1)).log()

    inputs = {"query": x, "key": x, "value": x, "key_padding_mask": mask}
    calibrated = convert(copy.deepcopy(mha), attention="kernel", kernel=kernel, calibration_inputs=inputs)
    log_gram, log_base = log_weights(calibrated)
    exact = kernel in ("rbf", "exponential")  # one step; Matérn kernels iterate
    torch.testing.assert_close(_spread(log_base, mask), _spread(logits, mask), rtol=1e-6 if exact else 1e-3, atol=0)
    torch.testing.assert_close(_log_mass(log_gram, mask), torch.zeros(HEADS, dtype=torch.double), rtol=0, atol=1e-6)
    _, default = log_weights(convert(copy.deepcopy(mha), attention="kernel", kernel=kernel))
    assert ((_spread(default, mask) / _spread(logits, mask)).log().abs() > 0.1).all()  # the calibration did something


def test_only_layers_converted_from_softmax_attention_can_be_calibrated():
    kernel_model = convert(nn.MultiheadAttention(D_MODEL, HEADS, batch_first=True), attention="kernel")
    x = torch.randn(BATCH, LENGTH, D_MODEL)
    with pytest.raises(ValueError, match="converted from softmax attention"):
        calibrate_kernel_scales(kernel_model, (x, x, x))
