"""SGPA layers under real use, at realistic sizes in float32 (d_model = 64, 4 heads, 32 global keys).

Each test compares against an independent reference: a freshly built layer holding the same
values (GPyTorch setters), the layer's own batched ``forward`` (``forward_step``), the same model
run with other padded tokens (padding), the float32 layer (mixed precision), and the value a
forward call returns (hooks).
"""

import pytest
import torch

from gpytorch_sgpa import SGPAELBO, SGPADecoder, SGPAttention
from gpytorch_sgpa.attention import SGPA_SAMPLERS, KernelAttention, ScaledDotProductAttention, SGPANoise

D_MODEL, HEADS, NUM_GLOBAL, LENGTH, BATCH = 64, 4, 32, 12, 3


def _layer(seed=0, **kwargs):
    torch.manual_seed(seed)
    kwargs.setdefault("num_global", NUM_GLOBAL)
    return SGPAttention(D_MODEL, HEADS, **kwargs)


def _inputs(seed=1, length=LENGTH):
    torch.manual_seed(seed)
    return torch.randn(BATCH, length, D_MODEL)


def _same_values(layer, **kwargs):
    fresh = _layer(seed=123, **kwargs)  # other initial values, then the trained layer's ones
    fresh.load_state_dict(layer.state_dict())
    return fresh.eval()


# ------------------------------------------------------------------------------- eval-mode cache
@pytest.mark.parametrize("whitened", [False, True])
@pytest.mark.parametrize("sampler", SGPA_SAMPLERS)
def test_gpytorch_setters_invalidate_the_eval_cache(sampler, whitened):
    """GPyTorch's setters write ``.data`` without bumping ``_version``; the layer must notice."""
    layer = _layer(sampler=sampler, whitened=whitened).eval()
    x = _inputs()
    noise = layer.sample_noise(BATCH, LENGTH)
    writes = [
        lambda: setattr(layer.kernel.base_kernel, "lengthscale", 4.0),
        lambda: layer.kernel.initialize(outputscale=2.5),
        lambda: layer.global_inducing_inputs.data.copy_(0.5 * layer.global_inducing_inputs.data),
    ]
    with torch.no_grad():
        layer(x, noise=noise)  # fills the cache
        for write in writes:
            write()
            out, kl = layer(x, noise=noise)
            ref, ref_kl = _same_values(layer, sampler=sampler, whitened=whitened)(x, noise=noise)
            torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4)
            torch.testing.assert_close(kl, ref_kl, rtol=1e-4, atol=1e-2)


# ------------------------------------------------------------------------------- forward_step
# near-duplicate tokens on purpose: the full sampler's Cholesky of K_qq - Q_qq takes linear_operator's jitter (and says
# so); the test checks that the steps stay finite and match the batched pass
@pytest.mark.filterwarnings("ignore:A not p.d., added jitter:gpytorch.utils.warnings.NumericalWarning")
@pytest.mark.parametrize("whitened", [False, True])
@pytest.mark.parametrize("sampler", SGPA_SAMPLERS)
def test_forward_step_is_finite_and_matches_forward_in_float32(sampler, whitened):
    """σ_f² = 100 and near-duplicate tokens: the incremental Cholesky must stay finite (float32).

    With jitter relative to σ_f² the steps reproduce the batched pass; the tolerance is float32
    rounding amplified by the conditioning of ``K_qq - Q_qq`` (entries up to 100).
    """
    layer = _layer(causal=True, sampler=sampler, whitened=whitened)
    with torch.no_grad():
        layer.kernel.outputscale = 100.0
        layer.global_chol_lower.mul_(0.1)
        layer.global_chol_log_diag.mul_(0.1)
    layer.eval()
    torch.manual_seed(2)
    base = torch.randn(BATCH, 1, D_MODEL)
    x = base + 1e-3 * torch.randn(BATCH, LENGTH, D_MODEL)  # near-duplicate tokens
    for seed in range(3):
        torch.manual_seed(seed)
        noise = layer.sample_noise(BATCH, LENGTH)
        with torch.no_grad():
            full, _ = layer(x, noise=noise)
            state, steps = None, []
            for t in range(LENGTH):
                step_noise = SGPANoise(noise.local[:, :, t : t + 1], noise.global_)
                out, state = layer.forward_step(x[:, t : t + 1], state, noise=step_noise)
                steps.append(out)
        steps = torch.cat(steps, 1)
        assert torch.isfinite(steps).all()
        torch.testing.assert_close(steps, full, rtol=0.05, atol=0.05 * full.abs().max().item())


# ------------------------------------------------------------------------------- left padding
@pytest.mark.parametrize("attention", ["sdp", "kernel", "sgpa"])
def test_decoder_with_left_padding_ignores_the_padded_tokens(attention):
    """Causal attention + left padding: rows with no allowed key must not turn the outputs NaN."""
    torch.manual_seed(0)
    model = SGPADecoder(
        50,
        d_model=D_MODEL,
        num_heads=HEADS,
        num_layers=2,
        max_len=LENGTH,
        attention=attention,
        attention_kwargs={"num_global": NUM_GLOBAL} if attention == "sgpa" else None,
    ).eval()
    tokens = torch.randint(0, 50, (BATCH, LENGTH))
    mask = torch.zeros(BATCH, LENGTH, dtype=torch.bool)
    mask[0, :4] = True  # left padding
    mask[2, :1] = True
    other = tokens.clone()
    other[mask] = (other[mask] + 7) % 50  # other padded tokens
    noise = model.sample_noise(BATCH, LENGTH)
    with torch.no_grad():
        logits, kl = model(tokens, key_padding_mask=mask, noise=noise)
        logits_other, kl_other = model(other, key_padding_mask=mask, noise=noise)
    assert torch.isfinite(logits[~mask]).all() and torch.isfinite(kl)
    # float32 round-off through two layers (the default decomposed sampler adds the global term
    # A^T W eps): up to ~2e-5 here; in float64 the difference is ~1e-15
    torch.testing.assert_close(logits[~mask], logits_other[~mask], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(kl, kl_other, rtol=1e-5, atol=1e-4)


def test_sdp_fully_masked_rows_give_zero_attention():
    layer = ScaledDotProductAttention(D_MODEL, HEADS, causal=True).eval()
    x = _inputs()
    mask = torch.zeros(BATCH, LENGTH, dtype=torch.bool)
    mask[1, :5] = True
    with torch.no_grad():
        out, _ = layer(x, key_padding_mask=mask)
    torch.testing.assert_close(out[1, :5], layer.out_proj.bias.expand(5, -1))  # no value reaches them


# ------------------------------------------------------------------------------- mixed precision
MIXED = [
    ("sgpa", {"sampler": "diagonal"}),
    ("sgpa", {"sampler": "full"}),
    ("sgpa", {"sampler": "decomposed"}),
    ("sgpa", {"variant": "dsvgp"}),
    ("sgpa", {"whitened": True}),
    ("sgpa", {"whitened": False}),
    ("standard", {"mode": "standard", "max_len": LENGTH}),
]


@pytest.mark.parametrize("name,kwargs", MIXED)
@pytest.mark.parametrize("half_dtype", [torch.bfloat16, torch.float16])
def test_autocast_and_half_layers_match_float32(name, kwargs, half_dtype):
    """The GP algebra runs in float32; only the projections see the low precision.

    Reference: the float32 layer with the same noise; tolerance: the half-precision rounding of the
    projections (relative 2⁻⁸ for bfloat16, amplified through the kernel's exp).
    """
    layer = _layer(**kwargs).eval()
    x = _inputs()
    noise = layer.sample_noise(BATCH, LENGTH)
    with torch.no_grad():
        ref, ref_kl = layer(x, noise=noise)
        with torch.autocast("cpu", dtype=half_dtype):
            out, kl = layer(x, noise=noise)
        half = _same_values(layer, **kwargs).to(half_dtype)
        half_out, half_kl = half(x.to(half_dtype), noise=SGPANoise(*(n if n is None else n.to(half_dtype) for n in noise)))
    assert half_out.dtype == half_dtype
    scale = ref.abs().max().item()
    for result, result_kl in ((out, kl), (half_out, half_kl)):
        assert torch.isfinite(result).all() and torch.isfinite(result_kl)
        torch.testing.assert_close(result.float(), ref, rtol=0.1, atol=0.1 * scale)
        torch.testing.assert_close(result_kl.float(), ref_kl, rtol=0.1, atol=1.0)


# ------------------------------------------------------------------------------- hooks
@pytest.mark.parametrize(
    "build",
    [
        lambda: _layer(),
        lambda: _layer(mode="standard", max_len=LENGTH),
        lambda: KernelAttention(D_MODEL, HEADS),
        lambda: ScaledDotProductAttention(D_MODEL, HEADS),
    ],
)
def test_forward_hooks_fire_on_every_layer(build):
    layer = build()
    seen = []
    layer.register_forward_pre_hook(lambda module, args: seen.append(("pre", args[0].shape)))
    layer.register_forward_hook(lambda module, args, output: seen.append(("post", output)))
    x = _inputs()
    output = layer(x)
    assert seen[0] == ("pre", x.shape)
    assert seen[1][0] == "post" and seen[1][1][0] is output[0]


def test_forward_hooks_fire_on_the_elbo():
    model = SGPADecoder(20, d_model=8, num_heads=2, num_layers=1, max_len=6)
    elbo = SGPAELBO(model, num_data=10)
    seen = []
    elbo.register_forward_hook(lambda module, args, output: seen.append(output))
    tokens = torch.randint(0, 20, (2, 6))
    logits, kl = model(tokens)
    value = elbo(logits[:, :-1], kl, tokens[:, 1:])
    assert len(seen) == 1 and seen[0] is value
