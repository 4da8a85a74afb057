"""SGPA inside a stock ``nn.TransformerEncoder``: ``MultiheadSGPAttention``, ``convert`` and the KL
collected by ``kl_divergence``."""

import copy
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import gpytorch_sgpa
from gpytorch_sgpa import SGPAELBO, MultiheadSGPAttention, SGPANoise, SGPAttention, convert, kl_divergence


class StockClassifier(nn.Module):
    """What a PyTorch user writes: embedding, ``nn.TransformerEncoder``, mean pooling, linear head."""

    def __init__(self, d_model=16, num_heads=2, num_layers=2, num_classes=3, batch_first=True, dtype=torch.float32):
        super().__init__()
        self.embed = nn.Linear(4, d_model)
        layer = nn.TransformerEncoderLayer(d_model, num_heads, dim_feedforward=32, dropout=0.0, batch_first=batch_first)
        self.encoder = nn.TransformerEncoder(layer, num_layers)
        self.head = nn.Linear(d_model, num_classes)
        self.to(dtype)

    def forward(self, x, key_padding_mask=None, mask=None):
        h = self.encoder(self.embed(x), mask=mask, src_key_padding_mask=key_padding_mask)
        return self.head(h.mean(1))


def _toy_data(n=96, length=6, seed=0):
    """Three classes whose tokens are drawn around different means."""
    generator = torch.Generator().manual_seed(seed)
    labels = torch.arange(n) % 3
    centres = torch.tensor([[1.5, 0, 0, 0], [0, 1.5, 0, 0], [0, 0, 1.5, 0]])
    x = centres[labels][:, None, :] + torch.randn(n, length, 4, generator=generator)
    return x, labels


def _naive_kernel_attention(layer, x, key_padding_mask=None):
    """``out_proj(concat_h K_h v_h)`` with the ARD-RBF Gram matrix written out entry by entry."""
    batch, length, d_model = x.shape
    heads, e = layer.num_heads, layer.head_dim
    q = (x @ layer.qk_proj.weight.T).view(batch, length, heads, e).transpose(1, 2)
    v = (x @ layer.v_proj.weight.T).view(batch, length, heads, e).transpose(1, 2)
    lengthscale = layer.kernel.base_kernel.lengthscale.detach()  # (H, 1, e)
    outputscale = layer.kernel.outputscale.detach()  # (H,)
    outputs = torch.zeros(batch, heads, length, e, dtype=x.dtype)
    for b in range(batch):
        for h in range(heads):
            for i in range(length):
                for j in range(length):
                    if key_padding_mask is not None and key_padding_mask[b, j]:
                        continue
                    if layer.causal and j > i:
                        continue
                    distance = (((q[b, h, i] - q[b, h, j]) / lengthscale[h, 0]) ** 2).sum()
                    outputs[b, h, i] += outputscale[h] * torch.exp(-0.5 * distance) * v[b, h, j]
    return layer.out_proj(outputs.transpose(1, 2).reshape(batch, length, d_model))


def test_convert_copies_weights_and_matches_naive_kernel_attention():
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(8, 2, batch_first=False)
    adapter = convert(mha, attention="kernel")
    weight_q, weight_k, weight_v = mha.in_proj_weight.detach().chunk(3)
    inner = adapter.attention
    torch.testing.assert_close(inner.qk_proj.weight, 0.5 * (weight_q + weight_k), rtol=0, atol=0)
    torch.testing.assert_close(inner.v_proj.weight, weight_v, rtol=0, atol=0)
    torch.testing.assert_close(inner.out_proj.bias, mha.out_proj.bias, rtol=0, atol=0)
    x = torch.randn(5, 3, 8)  # (L, N, E): batch_first=False, as the MultiheadAttention it replaced
    padding = torch.tensor([[False] * 5, [False, False, False, True, True], [False] * 4 + [True]])
    float_padding = torch.zeros(3, 5).masked_fill(padding, float("-inf"))
    with torch.no_grad():
        expected = _naive_kernel_attention(inner, x.transpose(0, 1), padding).transpose(0, 1)
        out_bool, weights = adapter(x, x, x, key_padding_mask=padding)
        out_float, _ = adapter(x, x, x, key_padding_mask=float_padding)
    assert weights is None
    valid = ~padding.T  # padded queries' outputs are unused; compare the others
    torch.testing.assert_close(out_bool[valid], expected[valid], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(out_float, out_bool, rtol=0, atol=0)


def _converted_classifier(attention="sgpa", dtype=torch.float32, seed=0, **kwargs):
    torch.manual_seed(seed)
    return convert(StockClassifier(dtype=dtype), attention=attention, **kwargs)


def test_encoder_inference_path_runs_the_adapter():
    """In eval mode without gradients and with a padding mask, nn.TransformerEncoder would take its
    fused nested-tensor path (bypassing self_attn); convert turns it off, so the output equals the
    one with PyTorch's fast path disabled globally."""
    model = _converted_classifier("kernel").eval()
    x, _ = _toy_data(8)
    padding = torch.zeros(8, 6, dtype=torch.bool)
    padding[:4, 4:] = True
    with torch.no_grad():
        output = model(x, padding)
        torch.backends.mha.set_fastpath_enabled(False)
        try:
            reference = model(x, padding)
        finally:
            torch.backends.mha.set_fastpath_enabled(True)
    torch.testing.assert_close(output, reference, rtol=0, atol=0)


def test_converted_stock_classifier_trains_with_the_elbo():
    x, y = _toy_data()
    # with only 96 sequences the global KL / N of the default N(0, 1) variational initialisation
    # outweighs the likelihood for hundreds of steps; a smaller one keeps the test to 40 steps
    model = _converted_classifier("sgpa", num_global=8, variational_init_std=0.1)
    elbo = SGPAELBO(model, num_data=len(y))
    optimizer = torch.optim.Adam(elbo.parameters(), lr=1e-2)

    def full_data_elbo(samples=8):
        torch.manual_seed(1)
        with torch.no_grad():
            return sum(float(elbo(model(x), kl_divergence(model), y)) for _ in range(samples)) / samples

    torch.manual_seed(2)
    initial = full_data_elbo()
    model.train()
    for step in range(40):
        index = torch.randperm(len(y))[:32]
        value = elbo(model(x[index]), kl_divergence(model), y[index])
        optimizer.zero_grad()
        (-value).backward()
        layer = next(m for m in model.modules() if isinstance(m, SGPAttention))
        if step == 0:  # converted at mean gate 0: the gate gets the likelihood's gradient, v_g not yet
            for parameter in (layer.global_mean_gate, layer.global_inducing_inputs, layer.global_chol_lower, layer.kernel.raw_outputscale):
                assert parameter.grad is not None and parameter.grad.abs().sum() > 0
        if step == 1:  # the gate has moved: v_g reaches the mean
            assert layer.global_values.grad.abs().sum() > 0
        optimizer.step()
    final = full_data_elbo()
    accuracy = float((model(x).argmax(-1) == y).float().mean())
    # ln 3 = 1.10 nats is a chance-level classifier's expected log-likelihood
    assert final > initial + 0.5, (initial, final)
    assert accuracy > 0.8


def test_kl_divergence_sums_the_layers_and_elbo_counts_global_kl_once():
    x, y = _toy_data(16)
    model = _converted_classifier("sgpa", num_global=8)
    layers = [m for m in model.modules() if isinstance(m, SGPAttention)]
    assert len(layers) == 2
    per_layer = []
    handles = [layer.register_forward_hook(lambda m, inputs, output: per_layer.append(output[1])) for layer in layers]
    logits = model(x)
    for handle in handles:
        handle.remove()
    total = kl_divergence(model)
    torch.testing.assert_close(total, per_layer[0] + per_layer[1], rtol=0, atol=0)
    global_part = gpytorch_sgpa.global_kl_divergence(model)
    torch.testing.assert_close(global_part, sum(layer.global_kl() for layer in layers), rtol=1e-6, atol=1e-6)
    assert 0 < global_part.item() < total.item()
    num_data = 1000
    elbo = SGPAELBO(model, num_data=num_data, kl_weighting="decomposed").eval()
    expected = -F.cross_entropy(logits, y) - (total - global_part + global_part / num_data)
    torch.testing.assert_close(elbo(logits, total, y), expected, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("attention, kwargs", [("sgpa-dsvgp", {"num_global": 8}), ("sgpa-standard", {"max_len": 6})])
def test_posterior_mean_of_converted_model_equals_kernel_attention_model(attention, kwargs, monkeypatch):
    """MLE kernel attention first, then SGPA from it (the thesis's path): with zero noise the SGPA
    sample is its posterior mean K_qk v (eq. fpost / naivedsvgp), the kernel attention's output."""
    x, _ = _toy_data(8)
    padding = torch.zeros(8, 6, dtype=torch.bool)
    padding[::2, 5] = True
    kernel_model = _converted_classifier("kernel", dtype=torch.float64).eval()
    sgpa_model = convert(copy.deepcopy(kernel_model), attention=attention, **kwargs).eval()
    assert not any(isinstance(m, nn.MultiheadAttention) for m in sgpa_model.modules())
    x = x.double()
    with torch.no_grad():
        expected = kernel_model(x, padding)
        sampled = sgpa_model(x, padding)
        assert (sampled - expected).abs().max() > 1e-3  # the posterior has spread: noise matters

        monkeypatch.setattr(SGPAttention, "sample_noise", _zero_noise)
        collapsed = sgpa_model(x, padding)
    torch.testing.assert_close(collapsed, expected, rtol=1e-10, atol=1e-10)


def _zero_noise(self, batch_size, length, dtype=None, device=None):
    dtype = dtype or self.qk_proj.weight.dtype
    local = torch.zeros(batch_size, self.num_heads, length, self.head_dim, dtype=dtype)
    global_ = None
    if self._uses_global_noise():
        global_ = torch.zeros(batch_size, self.num_heads, self.head_dim, self.num_global, dtype=dtype)
    return SGPANoise(local, global_)


def test_batch_first_unbatched_and_padding_give_the_same_sample():
    """Same weights and noise draws: (N, L, E), (L, N, E) and unbatched (L, E) inputs agree, and
    padded tokens do not change the outputs at the other positions."""
    torch.manual_seed(0)
    first = MultiheadSGPAttention(8, 2, batch_first=True, attention="sgpa", num_global=4)
    second = MultiheadSGPAttention(8, 2, batch_first=False, attention="sgpa", num_global=4)
    second.load_state_dict(first.state_dict())
    first.double(), second.double()  # float64: padded tokens move valid outputs by round-off only
    x = torch.randn(3, 5, 8, dtype=torch.float64)
    padding = torch.zeros(3, 5, dtype=torch.bool)
    padding[1, 3:] = True
    torch.manual_seed(1)
    out_first, _ = first(x, x, x, key_padding_mask=padding)
    torch.manual_seed(1)
    xt = x.transpose(0, 1)
    out_second, _ = second(xt, xt, xt, key_padding_mask=padding)
    torch.testing.assert_close(out_second.transpose(0, 1), out_first, rtol=1e-12, atol=1e-12)
    changed = x.clone()
    changed[1, 3:] = 10.0
    torch.manual_seed(1)
    out_changed, _ = first(changed, changed, changed, key_padding_mask=padding)
    torch.testing.assert_close(out_changed[~padding], out_first[~padding], rtol=1e-9, atol=1e-9)
    assert (out_changed[padding] - out_first[padding]).abs().max() > 1e-2  # the change did reach the layer
    single = x[0]
    torch.manual_seed(2)
    out_single, _ = first(single, single, single)
    torch.manual_seed(2)
    out_batch, _ = first(x[:1], x[:1], x[:1])
    torch.testing.assert_close(out_single, out_batch[0], rtol=1e-12, atol=1e-12)


def test_causal_conversion_follows_the_square_subsequent_mask():
    x, _ = _toy_data(4)
    model = _converted_classifier("kernel", causal=True).eval()
    mask = nn.Transformer.generate_square_subsequent_mask(6)
    layer = model.encoder.layers[0].self_attn
    h = model.embed(x)
    with torch.no_grad():
        out, _ = layer(h, h, h, attn_mask=mask)
        expected = _naive_kernel_attention(layer.attention, h)  # causal layer: keys j <= i only
        torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-6)
        out_hint, _ = layer(h, h, h, is_causal=True)
        torch.testing.assert_close(out_hint, out, rtol=0, atol=0)
        model(x, mask=mask)  # nn.TransformerEncoder passes the mask through to every layer
        with pytest.raises(ValueError, match="causal=True"):
            model(x)  # a causal layer asked for no mask
    noncausal = _converted_classifier("kernel").eval()
    with torch.no_grad(), pytest.raises(ValueError, match="causal=False"):
        noncausal(x, mask=mask)


def test_bad_input_is_rejected_with_the_argument_named():
    adapter = MultiheadSGPAttention(8, 2, batch_first=True, attention="kernel")
    x = torch.randn(2, 4, 8)
    with pytest.raises(ValueError, match="key and value"):
        adapter(x, torch.randn_like(x), x)
    with pytest.raises(ValueError, match="attn_mask"):
        adapter(x, x, x, attn_mask=torch.zeros(4, 4, dtype=torch.bool).fill_diagonal_(True))
    with pytest.raises(ValueError, match="attn_mask"):
        adapter(x, x, x, attn_mask=torch.full((4, 4), 0.5))
    with pytest.raises(ValueError, match="key_padding_mask"):
        adapter(x, x, x, key_padding_mask=torch.zeros(2, 5, dtype=torch.bool))
    with pytest.raises(ValueError, match="key_padding_mask"):
        adapter(x, x, x, key_padding_mask=torch.full((2, 4), -1.0))
    with pytest.raises(ValueError, match="attention"):
        MultiheadSGPAttention(8, 2, attention="softmax")
    with pytest.raises(ValueError, match="kdim"):
        convert(nn.MultiheadAttention(8, 2, kdim=4, vdim=4))
    with pytest.raises(ValueError, match="no nn.MultiheadAttention"):
        convert(nn.Linear(3, 3))
    with pytest.raises(ValueError, match="kernel must not be given"):
        convert(_converted_classifier("kernel"), kernel="exponential")
    with pytest.raises(ValueError, match="no SGPAttention"):
        kl_divergence(_converted_classifier("kernel"))
    with pytest.raises(ValueError, match="forward pass"):
        kl_divergence(_converted_classifier("sgpa", num_global=4))
    with pytest.raises(TypeError, match="kl_weighting"):
        SGPAELBO(StockClassifier(), num_data=10, kl_weighting="decomposed")


def test_state_dict_reload_and_deepcopy_after_a_forward_pass():
    x, y = _toy_data(8)
    model = _converted_classifier("sgpa", seed=0, num_global=4)
    elbo = SGPAELBO(model, num_data=8)
    (-elbo(model(x), kl_divergence(model), y)).backward()
    clone = copy.deepcopy(model)  # the recorded KL holds a graph; deepcopy must not copy it
    with pytest.raises(ValueError, match="forward pass"):
        kl_divergence(clone)
    reloaded = _converted_classifier("sgpa", seed=1, num_global=4)
    reloaded.load_state_dict(model.state_dict())
    model.eval(), reloaded.eval()
    with torch.no_grad():
        torch.manual_seed(3)
        expected = model(x)
        torch.manual_seed(3)
        torch.testing.assert_close(reloaded(x), expected, rtol=0, atol=0)
        torch.testing.assert_close(kl_divergence(reloaded), kl_divergence(model), rtol=0, atol=0)


def test_shared_attention_module_stays_shared():
    mha = nn.MultiheadAttention(8, 2, batch_first=True)
    model = nn.ModuleDict({"a": mha, "b": mha})
    convert(model, attention="kernel")
    assert model["a"] is model["b"] and isinstance(model["a"], MultiheadSGPAttention)


def test_readme_dropin_example(run_readme_block):
    """The README's drop-in example runs; its loss is the ELBO recomputed here from cross-entropy
    and the KL of the layers, and no softmax attention is left in the model."""
    torch.manual_seed(0)
    namespace = run_readme_block("gpytorch_sgpa.convert")
    model, logits, y, loss = namespace["model"], namespace["logits"], namespace["y"], namespace["loss"]
    layers = [m for m in model.modules() if isinstance(m, SGPAttention)]
    assert len(layers) == 2 and not any(isinstance(m, nn.MultiheadAttention) for m in model.modules())
    kl, beta = namespace["kl"].detach(), namespace["elbo"].kl_weight  # beta="auto": β chosen at that first call
    assert beta == pytest.approx(min(1.0, 0.1 * math.log(3) * 10_000 / float(kl)), rel=1e-6)
    expected = F.cross_entropy(logits, y) + beta * namespace["kl"] / 10_000  # all KL / N, weighted by β
    torch.testing.assert_close(loss, expected, rtol=1e-6, atol=1e-6)
    assert namespace["probabilities"].shape == (8, 3)
    with torch.no_grad(), gpytorch_sgpa.posterior_mean():
        torch.testing.assert_close(model(namespace["x"]), namespace["mean_logits"], rtol=0, atol=0)
    assert all(layer.global_inducing_inputs.grad is not None for layer in layers)
