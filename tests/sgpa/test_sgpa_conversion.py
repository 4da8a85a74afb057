"""Conversions that keep what a trained network computes: kernel attention → every SGPA variant
(orthogonal SGPA through its mean gate), the value bias of ``nn.MultiheadAttention``, old state
dicts, and the kernel scale chosen from the softmax logits (``calibration_inputs``)."""

import copy
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import gpytorch_sgpa
from gpytorch_sgpa import SGPAELBO, MultiheadSGPAttention, SGPAttention, convert, kl_divergence, posterior_mean
from gpytorch_sgpa.decoupled import global_factors


class Classifier(nn.Module):
    """Embedding, ``nn.TransformerEncoder`` (two layers), mean pooling, linear head."""

    def __init__(self, d_model=16, num_heads=2, num_classes=3):
        super().__init__()
        self.embed = nn.Linear(4, d_model)
        layer = nn.TransformerEncoderLayer(d_model, num_heads, dim_feedforward=32, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, 2)
        self.head = nn.Linear(d_model, num_classes)

    def forward(self, x, key_padding_mask=None):
        return self.head(self.encoder(self.embed(x), src_key_padding_mask=key_padding_mask).mean(1))


def _data(n=96, length=6, seed=0):
    """Three classes whose tokens are drawn around different means."""
    generator = torch.Generator().manual_seed(seed)
    labels = torch.arange(n) % 3
    centres = torch.tensor([[1.5, 0, 0, 0], [0, 1.5, 0, 0], [0, 0, 1.5, 0]])
    return centres[labels][:, None, :] + torch.randn(n, length, 4, generator=generator), labels


def _train(model, x, y, steps=40):
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(steps):
        loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return model.eval()


@pytest.fixture(scope="module")
def trained_kernel_model():
    """A kernel-attention classifier trained to well above chance (not a random initialisation)."""
    torch.manual_seed(0)
    x, y = _data()
    model = _train(convert(Classifier(), attention="kernel"), x, y)
    with torch.no_grad():
        assert (model(x).argmax(-1) == y).float().mean() > 0.8
    return model


VARIANTS = [("sgpa", {"num_global": 8}), ("sgpa-dsvgp", {"num_global": 8}), ("sgpa-standard", {"max_len": 6})]


@pytest.mark.parametrize("attention, kwargs", VARIANTS)
def test_every_variant_keeps_the_trained_kernel_network(trained_kernel_model, attention, kwargs):
    x, _ = _data(16, seed=1)
    padding = torch.zeros(16, 6, dtype=torch.bool)
    padding[::2, 4:] = True
    torch.manual_seed(1)
    sgpa = convert(copy.deepcopy(trained_kernel_model), attention=attention, **kwargs)
    with torch.no_grad():
        for mask in (None, padding):
            expected = trained_kernel_model(x, mask)
            with posterior_mean():
                collapsed = sgpa(x, mask)
            torch.testing.assert_close(collapsed, expected, rtol=0, atol=1e-5)
            assert (sgpa(x, mask) - expected).abs().max() > 1e-3  # the posterior still has spread


def test_the_thesis_start_without_the_gate_changes_the_function(trained_kernel_model):
    """``mean_gate=None``: the orthogonal correction with random global values is far from zero;
    ``global_cov_init=None``: the random covariance instead of ``C = 0.1 I``."""
    x, _ = _data(16, seed=1)
    torch.manual_seed(1)
    default = convert(copy.deepcopy(trained_kernel_model), attention="sgpa", num_global=8)
    for layer in (m for m in default.modules() if isinstance(m, SGPAttention)):
        torch.testing.assert_close(layer.global_cov_factor(), 0.1 * torch.eye(8).expand(2, 8, 8, 8))
    ungated = convert(copy.deepcopy(trained_kernel_model), attention="sgpa", num_global=8, mean_gate=None, global_cov_init=None)
    assert all(m.global_mean_gate is None and m.global_chol_lower.abs().sum() > 0 for m in ungated.modules() if isinstance(m, SGPAttention))
    with pytest.raises(ValueError, match="global_cov_init"):
        convert(copy.deepcopy(trained_kernel_model), attention="sgpa", num_global=8, global_cov_init=0.0)
    with torch.no_grad(), posterior_mean():
        assert (ungated(x) - trained_kernel_model(x)).abs().max() > 1e-2


@pytest.fixture(scope="module")
def trained_softmax_model():
    torch.manual_seed(3)
    x, y = _data()
    model = _train(Classifier(), x, y)
    with torch.no_grad():
        assert (model(x).argmax(-1) == y).float().mean() > 0.8
    return model


@pytest.mark.parametrize("attention, kwargs", VARIANTS)
@pytest.mark.parametrize("calibrated", [False, True])
def test_softmax_to_sgpa_in_one_step_starts_at_the_kernel_network(trained_softmax_model, attention, kwargs, calibrated):
    """``convert(softmax, "sgpa")`` is ``convert(softmax, "kernel")`` at its posterior mean, with the
    same kernel scales (``calibration_inputs``) and the gated, near-mean start; ``mean_gate=None,
    global_cov_init=None`` is the thesis's start, a different function."""
    x, _ = _data(16, seed=4)
    calibration = {"calibration_inputs": _data(32, seed=5)[0]} if calibrated else {}
    kernel = convert(copy.deepcopy(trained_softmax_model), attention="kernel", **calibration)
    torch.manual_seed(4)
    sgpa = convert(copy.deepcopy(trained_softmax_model), attention=attention, **kwargs, **calibration)
    layers = [m for m in sgpa.modules() if isinstance(m, SGPAttention)]
    assert len(layers) == 2
    with torch.no_grad():
        expected = kernel(x)
        with posterior_mean():
            torch.testing.assert_close(sgpa(x), expected, rtol=0, atol=1e-5)
        assert (sgpa(x) - expected).abs().max() > 1e-3  # samples still spread around it
    if attention == "sgpa":
        thesis = convert(
            copy.deepcopy(trained_softmax_model), attention="sgpa", mean_gate=None, global_cov_init=None, **kwargs, **calibration
        )
        with torch.no_grad(), posterior_mean():
            assert (thesis(x) - expected).abs().max() > 1e-2


def _bert_classifier(seed):
    """A small random BERT classifier (no dropout, evaluation mode) and a padded batch of its inputs."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(seed)
    config = transformers.BertConfig(
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        vocab_size=100,
        num_labels=3,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    model = transformers.BertForSequenceClassification(config).eval()
    ids = torch.randint(2, 100, (4, 6))
    mask = torch.tensor([[1] * 6, [1] * 4 + [0] * 2, [1] * 6, [1] * 5 + [0]])
    return model, {"input_ids": ids, "attention_mask": mask}


def test_softmax_to_sgpa_in_one_step_for_a_hugging_face_model():
    model, inputs = _bert_classifier(11)
    kernel = convert(copy.deepcopy(model), attention="kernel", calibration_inputs=inputs)
    sgpa = convert(copy.deepcopy(model), attention="sgpa", num_global=4, calibration_inputs=inputs)
    with torch.no_grad(), posterior_mean():
        torch.testing.assert_close(sgpa(**inputs).logits, kernel(**inputs).logits, rtol=0, atol=1e-5)


def test_elbo_fine_tuning_moves_the_gate_then_the_global_parameters(trained_kernel_model):
    """At γ = 0 the likelihood's gradient reaches γ; after one step it reaches v_g and Z_g too (no saddle)."""
    x, y = _data()
    torch.manual_seed(2)
    model = convert(copy.deepcopy(trained_kernel_model), attention="sgpa", num_global=8).train()
    layer = next(m for m in model.modules() if isinstance(m, SGPAttention))
    elbo = SGPAELBO(model, num_data=len(y))
    optimizer = torch.optim.Adam(elbo.parameters(), lr=1e-2)
    for step in range(2):
        optimizer.zero_grad()
        (-elbo(model(x), kl_divergence(model), y)).backward()
        assert layer.global_mean_gate.grad.abs().min() > 0
        assert layer.global_inducing_inputs.grad.abs().sum() > 0
        if step == 1:
            assert layer.global_values.grad.abs().sum() > 0
        optimizer.step()
    assert layer.global_mean_gate.detach().abs().min() > 0


def _dense_gated(layer, x, causal):
    """Mean and per-sequence KL of the gated orthogonal posterior written out with dense solves."""
    dtype = x.dtype
    factors = global_factors(layer, None, dtype)
    q = layer.split_heads(layer.qk_proj(x))
    v = layer.split_heads(layer.v_proj(x))
    kernel = layer.kernel
    gram = kernel(q).to_dense()
    cross = kernel(q, factors.keys).to_dense()  # (B, H, L, M)
    k_gg = factors.chol @ factors.chol.transpose(-2, -1)  # K_gg + jitter, as the layer uses
    gate = layer.global_mean_gate.view(-1, 1, 1)
    effective = gate * layer.global_values + (1 - gate) * torch.linalg.solve(k_gg, cross.transpose(-2, -1) @ v)
    nystrom = cross @ torch.linalg.solve(k_gg, cross.transpose(-2, -1))
    if causal:  # position i conditions on the keys j <= i only: ṽ_g of its prefix
        weights = (gram - gate * nystrom).masked_fill(~torch.ones_like(gram, dtype=torch.bool).tril(), 0.0)
        mean = weights @ v + gate * cross @ layer.global_values
    else:
        mean = (gram - nystrom) @ v + cross @ effective
    mean_kl = (v * ((gram - nystrom) @ v)).sum((-3, -2, -1)) + (effective * (k_gg @ effective)).sum((-3, -2, -1))
    with torch.no_grad():
        ungated_global = factors.kl.sum()  # γ² ‖Lᵀ v_g‖² + covariance terms
        values_kl = 0.5 * (gate.view(-1).square() * (factors.chol.transpose(-2, -1) @ layer.global_values).square().sum((-2, -1))).sum()
    return mean, 0.5 * mean_kl + (ungated_global - values_kl)


@pytest.mark.parametrize("causal", [False, True])
def test_gated_mean_and_kl_are_those_of_the_effective_global_values(causal):
    torch.manual_seed(3)
    layer = SGPAttention(8, 2, num_global=5, causal=causal, mean_gate=0.3, variational_init_std=0.5).double()
    with torch.no_grad():
        layer.global_mean_gate.copy_(torch.tensor([0.3, -0.7], dtype=torch.float64))
    x = torch.randn(3, 4, 8, dtype=torch.float64)
    posterior = layer.posterior(x)
    mean, kl = _dense_gated(layer, x, causal)
    torch.testing.assert_close(posterior.mean, mean, rtol=1e-8, atol=1e-8)
    torch.testing.assert_close(posterior.kl, kl, rtol=1e-8, atol=1e-8)
    if causal:  # one token at a time with the cache gives the same posterior mean
        outputs, state = [], None
        with posterior_mean():
            full, _ = layer(x)
            for t in range(x.shape[1]):
                out, state = layer.forward_step(x[:, t : t + 1], state)
                outputs.append(out)
        torch.testing.assert_close(torch.cat(outputs, 1), full, rtol=1e-8, atol=1e-8)


def test_gate_one_is_the_thesis_layer_and_old_state_dicts_load():
    torch.manual_seed(4)
    plain = SGPAttention(8, 2, num_global=5, variational_init_std=0.5).double()
    gated = SGPAttention(8, 2, num_global=5, mean_gate=0.0).double()
    gated.load_state_dict(plain.state_dict())  # saved without a gate: γ = 1, the thesis's mean
    torch.testing.assert_close(gated.global_mean_gate, torch.ones(2, dtype=torch.float64))
    x = torch.randn(3, 4, 8, dtype=torch.float64)
    a, b = plain.posterior(x), gated.posterior(x)
    torch.testing.assert_close(b.mean, a.mean, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(b.kl, a.kl, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(gated.global_kl(), plain.global_kl(), rtol=1e-10, atol=1e-10)
    rebuilt = SGPAttention(8, 2, num_global=5).double()
    rebuilt.load_state_dict(gated.state_dict())  # saved with a gate: a plain layer gets it
    assert isinstance(rebuilt.global_mean_gate, nn.Parameter)
    with pytest.raises(ValueError, match="mean_gate"):
        SGPAttention(8, 2, variant="dsvgp", mean_gate=0.0)


# --------------------------------------------------------------------------- softmax → kernel
def test_multihead_value_bias_is_kept_and_old_state_dicts_load():
    torch.manual_seed(5)
    mha = nn.MultiheadAttention(8, 2, batch_first=True)
    with torch.no_grad():
        mha.in_proj_bias.normal_()
    adapter = convert(mha, attention="kernel")
    layer = adapter.attention
    torch.testing.assert_close(layer.v_proj.bias, mha.in_proj_bias[16:], rtol=0, atol=0)
    x = torch.randn(2, 5, 8)
    with torch.no_grad():
        q = layer.split_heads(layer.qk_proj(x))
        v = layer.split_heads(x @ mha.in_proj_weight[16:].T + mha.in_proj_bias[16:])
        expected = layer.out_proj(layer.merge_heads(layer.kernel(q).to_dense() @ v))
        torch.testing.assert_close(adapter(x, x, x)[0], expected, rtol=1e-5, atol=1e-6)
    old = {k: v for k, v in adapter.state_dict().items() if k != "attention.v_proj.bias"}  # as 0.1.0 saved it
    reloaded = convert(nn.MultiheadAttention(8, 2, batch_first=True), attention="kernel")
    reloaded.load_state_dict(old)
    torch.testing.assert_close(reloaded.attention.v_proj.bias, torch.zeros(8), rtol=0, atol=0)
    plain = MultiheadSGPAttention(8, 2, batch_first=True, attention="kernel")
    plain.load_state_dict(adapter.state_dict())  # a layer built without the bias gets it
    with torch.no_grad():
        torch.testing.assert_close(plain(x, x, x)[0], adapter(x, x, x)[0], rtol=0, atol=0)
    sgpa = convert(copy.deepcopy(adapter), attention="sgpa-dsvgp", num_global=4)  # the bias goes on
    torch.testing.assert_close(sgpa.attention.v_proj.bias, layer.v_proj.bias, rtol=0, atol=0)


def _spread(values, allowed):
    count = allowed.sum(-1, keepdim=True)
    mean = values.masked_fill(~allowed, 0).sum(-1, keepdim=True) / count
    return ((values - mean).square().masked_fill(~allowed, 0).sum(-1) / count.squeeze(-1)).sqrt().mean((0, 2))


def test_calibration_matches_the_spread_and_mass_of_the_softmax_logits():
    torch.manual_seed(6)
    x, y = _data(48)
    softmax = _train(Classifier(), x, y, steps=20)
    mha = softmax.encoder.layers[0].self_attn
    with torch.no_grad():
        h = softmax.embed(x)
        weight_q, weight_k, _ = mha.in_proj_weight.chunk(3)
        bias_q, bias_k, _ = mha.in_proj_bias.chunk(3)
        split = lambda t: t.view(48, 6, 2, 8).transpose(1, 2)  # noqa: E731
        logits = split(h @ weight_q.T + bias_q) @ split(h @ weight_k.T + bias_k).transpose(-2, -1) / math.sqrt(8)
    kernel_model = convert(copy.deepcopy(softmax), attention="kernel", calibration_inputs=x)
    default = convert(copy.deepcopy(softmax), attention="kernel")
    layer = kernel_model.encoder.layers[0].self_attn.attention
    assert not hasattr(layer, "_softmax_query_key")  # nothing kept after convert
    with torch.no_grad():
        gram = layer.kernel(layer.split_heads(layer.qk_proj(h))).to_dense()
    allowed = torch.ones(48, 1, 6, 6, dtype=torch.bool)
    outputscale = layer.kernel.outputscale.view(1, -1, 1, 1)
    torch.testing.assert_close(_spread((gram / outputscale).log(), allowed), _spread(logits, allowed), rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(gram.sum(-1).log().mean((0, 2)), torch.zeros(2), rtol=0, atol=1e-4)
    assert not torch.equal(layer.kernel.outputscale, default.encoder.layers[0].self_attn.attention.kernel.outputscale)
    sgpa = convert(copy.deepcopy(softmax), attention="sgpa", num_global=4, calibration_inputs=(x,))
    assert isinstance(sgpa.encoder.layers[1].self_attn.attention, SGPAttention)
    with pytest.raises(ValueError, match="softmax"):  # standard SGPA from kernel attention: nothing to calibrate
        convert(copy.deepcopy(kernel_model), attention="sgpa-standard", max_len=6, calibration_inputs=x)


def test_calibration_places_the_global_inducing_inputs_on_the_layers_inputs(trained_kernel_model):
    x, _ = _data(16, seed=2)
    torch.manual_seed(8)
    sgpa = convert(copy.deepcopy(trained_kernel_model), attention="sgpa", num_global=8, calibration_inputs=x)
    layers = [m for m in sgpa.modules() if isinstance(m, SGPAttention)]
    inputs = []
    handles = [layer.register_forward_pre_hook(lambda m, args: inputs.append(args[0])) for layer in layers]
    with torch.no_grad(), posterior_mean():
        collapsed = sgpa(x)
    for handle in handles:
        handle.remove()
    for layer, seen in zip(layers, inputs):
        tokens = seen.reshape(-1, seen.shape[-1])
        for head in layer.global_inducing_inputs.detach():  # each a token of the layer's input
            assert (head[:, None, :] == tokens[None]).all(-1).any(-1).all()
    torch.testing.assert_close(collapsed, trained_kernel_model(x).detach(), rtol=0, atol=1e-5)


def test_calibration_of_a_hugging_face_model():
    model, inputs = _bert_classifier(7)
    ids, mask = inputs["input_ids"], inputs["attention_mask"]
    convert(model, attention="kernel", calibration_inputs=inputs)
    kernels = [m.kernel for m in model.modules() if isinstance(m, gpytorch_sgpa.KernelAttention)]
    assert len(kernels) == 2 and all(not torch.allclose(k.outputscale, torch.ones(4)) for k in kernels)
    kernel_logits = model(ids, attention_mask=mask).logits
    convert(model, attention="sgpa", num_global=4)  # then SGPA, keeping the calibrated kernel network
    with torch.no_grad(), posterior_mean():
        torch.testing.assert_close(model(ids, attention_mask=mask).logits, kernel_logits, rtol=0, atol=1e-5)


def test_gated_gpt2_generates_the_same_with_and_without_the_cache():
    """The key/value cache of a converted GPT-2 (new positions from cached projections) follows the
    mean gate: inside posterior_mean greedy scores equal those of the uncached pass, at γ = 0 those
    of the kernel network, and at other γ too."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(9)
    config = transformers.GPT2Config(
        n_embd=32,
        n_layer=2,
        n_head=4,
        vocab_size=50,
        n_positions=32,
        bos_token_id=0,
        eos_token_id=1,
        pad_token_id=1,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
    )
    config._attn_implementation = "sdpa"
    model = convert(transformers.GPT2LMHeadModel(config).double().eval(), attention="kernel")
    prompt = torch.randint(2, 50, (2, 4))

    def scores(use_cache):
        with torch.no_grad(), posterior_mean():
            out = model.generate(
                prompt, max_new_tokens=4, do_sample=False, use_cache=use_cache, output_scores=True, return_dict_in_generate=True
            )
        return torch.stack(out.scores)

    kernel_scores = scores(False)
    convert(model, attention="sgpa", num_global=4)
    torch.testing.assert_close(scores(True), kernel_scores, rtol=1e-9, atol=1e-9)
    layers = [m for m in model.modules() if isinstance(m, SGPAttention)]
    with torch.no_grad():
        for layer in layers:
            layer.global_mean_gate.copy_(torch.tensor([0.4, 1.0, -0.5, 2.0], dtype=torch.float64))
    gated = scores(False)
    assert (gated - kernel_scores).abs().max() > 1e-4
    torch.testing.assert_close(scores(True), gated, rtol=1e-9, atol=1e-9)


def test_float64_multihead_weights_are_copied_to_the_last_digit():
    torch.manual_seed(10)
    mha = nn.MultiheadAttention(8, 2, batch_first=True).double()
    layer = convert(mha, attention="kernel").attention
    weight_q, weight_k, weight_v = mha.in_proj_weight.detach().chunk(3)
    assert layer.qk_proj.weight.dtype == torch.float64
    torch.testing.assert_close(layer.qk_proj.weight, 0.5 * (weight_q + weight_k), rtol=0, atol=0)
    torch.testing.assert_close(layer.v_proj.weight, weight_v, rtol=0, atol=0)


@pytest.mark.parametrize("num_data", [10, 1_000_000])
def test_auto_beta_puts_the_first_kl_term_at_a_tenth_of_a_uniform_cross_entropy(trained_kernel_model, num_data):
    """``beta="auto"``: β = min(1, 0.1 log C · N / KL) from the first call (a KL far above log C is cut
    to 0.1 log C; a small one keeps β = 1), then fixed, and restored from the state dict."""
    x, y = _data(32, seed=6)
    torch.manual_seed(6)
    model = convert(copy.deepcopy(trained_kernel_model), attention="sgpa", num_global=8).train()
    elbo = SGPAELBO(model, num_data=num_data, beta="auto")
    assert math.isnan(elbo.kl_weight)
    logits = model(x)
    kl = kl_divergence(model)
    value = elbo(logits, kl, y)
    expected_beta = min(1.0, 0.1 * math.log(3) * num_data / float(kl.detach()))
    assert elbo.kl_weight == pytest.approx(expected_beta, rel=1e-6)
    assert (expected_beta < 1.0) == (num_data == 10)
    ell = torch.log_softmax(logits, -1).gather(1, y[:, None]).mean()
    torch.testing.assert_close(value, ell - expected_beta * kl / num_data)
    logits = model(x[:8])  # another batch, another KL: β stays
    elbo(logits, kl_divergence(model), y[:8])
    assert elbo.kl_weight == pytest.approx(expected_beta, rel=1e-6)
    restored = SGPAELBO(copy.deepcopy(model), num_data=num_data, beta="auto")
    restored.load_state_dict(elbo.state_dict())
    assert restored.kl_weight == elbo.kl_weight


def test_auto_beta_counts_the_scored_positions_of_sequences_and_refuses_other_likelihoods(trained_kernel_model):
    model = copy.deepcopy(trained_kernel_model)
    elbo = SGPAELBO(model, num_data=100, beta="auto")
    logits = torch.zeros(2, 5, 7)
    tokens = torch.tensor([[1, 2, 3, -100, -100], [1, 2, 3, 4, 5]])  # 3 and 5 scored positions: P = 4
    elbo(logits, torch.tensor(1e6), tokens)
    assert elbo.kl_weight == pytest.approx(0.1 * 4 * math.log(7) * 100 / 1e6, rel=1e-12)
    with pytest.raises(ValueError, match="categorical"):
        SGPAELBO(model, num_data=100, beta="auto", likelihood="gaussian")
    with pytest.raises(ValueError, match="'auto'"):
        SGPAELBO(model, num_data=100, beta="automatic")
