"""``gpytorch_sgpa`` follows the device and dtype of its inputs and modules.

Every test builds the same seeded model and inputs in float64 on the CPU -- the reference -- and on
``device`` in ``device_dtype`` (``tests/conftest.py``: float64 on CUDA where a GPU is available,
float32 on the CPU), and checks that the results live on ``device``, have its dtype, and equal the
reference.  The layers draw their noise on the device they run on, whose generator differs between
CPU and CUDA; the tests therefore draw it in float64 from seeded CPU generators and move it
(:func:`noise_from_cpu`), so both runs use the same numbers.  Tolerance on CUDA: each layer is a few
small Cholesky factorisations and triangular solves of well-conditioned matrices (the variational
parameters are scaled by 0.3, as in the CPU tests), where CPU and CUDA round-off differ at
``~1e-14`` relative; checked at ``1e-9``.  In float32 on the CPU: those factorisations amplify
float32 round-off to ``~1e-3`` relative in a layer's gradients (checked at ``1e-2``, ``1e-3``
absolute); the ELBOs and their gradients agree to ``1e-5`` absolute (checked at ``1e-4`` relative,
``1e-5`` absolute); sampled and greedy tokens are compared exactly.
"""

import contextlib
import copy

import pytest
import torch

from gpytorch_sgpa import SGPAELBO, SGPADecoder, SGPANoise, SGPAttention, SGPAViT
from gpytorch_sgpa.baselines import predict_proba
from gpytorch_sgpa.metrics import classification_metrics, regression_metrics

DT = torch.float64
CPU = torch.device("cpu")
TOL = dict(rtol=1e-9, atol=1e-11)
FLOAT32 = dict(rtol=1e-4, atol=1e-5)
FLOAT32_LAYER = dict(rtol=1e-2, atol=1e-3)
D_MODEL, HEADS, LENGTH, BATCH, NUM_GLOBAL = 6, 2, 5, 3, 3

# every mode, variant and sampler of SGPAttention
LAYERS = [
    ("decoupled", "orthogonal", "decomposed", False),
    ("decoupled", "orthogonal", "diagonal", False),
    ("decoupled", "orthogonal", "full", False),
    ("decoupled", "orthogonal", "decomposed", True),  # whitened
    ("decoupled", "dsvgp", "decomposed", False),
    ("decoupled", "dsvgp", "diagonal", False),
    ("decoupled", "dsvgp", "full", False),
    ("standard", None, "diagonal", False),
    ("standard", None, "full", False),
]
IDS = [f"{mode}-{variant}-{sampler}{'-whitened' if whitened else ''}" for mode, variant, sampler, whitened in LAYERS]


def moderate(module):
    """Scale the variational parameters by 0.3 (well-conditioned matrices, as in the CPU tests)."""
    with torch.no_grad():
        for name, parameter in module.named_parameters():
            if "global_chol" in name or "global_values" in name:
                parameter.mul_(0.3)
    return module


def make_layer(where, mode, variant, sampler, whitened, causal=False, dtype=DT):
    torch.manual_seed(0)
    kwargs = dict(mode=mode, sampler=sampler, causal=causal, whitened=whitened)
    kwargs.update(max_len=LENGTH) if mode == "standard" else kwargs.update(variant=variant, num_global=NUM_GLOBAL)
    return moderate(SGPAttention(D_MODEL, HEADS, **kwargs).double()).to(where, dtype)


def make_inputs(where, length=LENGTH, dtype=DT):
    generator = torch.Generator().manual_seed(1)
    return (0.7 * torch.randn(BATCH, length, D_MODEL, generator=generator, dtype=DT)).to(where, dtype)


def move_noise(noise: SGPANoise, where, dtype=None) -> SGPANoise:
    return SGPANoise(noise.local.to(where, dtype), None if noise.global_ is None else noise.global_.to(where, dtype))


@contextlib.contextmanager
def noise_from_cpu(seed=2):
    """Every ``SGPAttention.sample_noise`` call inside draws in float64 on the CPU from a seeded stream, then
    moves the draws to the requested device and dtype: the n-th call gives the same numbers on every
    device and, to rounding, in every dtype."""
    original = SGPAttention.sample_noise
    calls = [0]

    def sample_noise(layer, batch_size, length, dtype=None, device=None, generator=None):
        dtype = dtype or layer.qk_proj.weight.dtype
        if generator is not None:  # draws from a CPU generator are the same for every device already
            noise = original(layer, batch_size, length, DT, device, generator=generator)
            return move_noise(noise, noise.local.device, dtype)
        calls[0] += 1
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed * 100_000 + calls[0])
            noise = original(layer, batch_size, length, DT, CPU)
        return move_noise(noise, device or layer.qk_proj.weight.device, dtype)

    SGPAttention.sample_noise = sample_noise
    try:
        yield
    finally:
        SGPAttention.sample_noise = original


@pytest.mark.parametrize("mode, variant, sampler, whitened", LAYERS, ids=IDS)
def test_sgpa_layer_sample_posterior_and_gradients_on_device(device, device_dtype, assert_matches_cpu, mode, variant, sampler, whitened):
    def run(where, dtype):
        layer = make_layer(where, mode, variant, sampler, whitened, dtype=dtype)
        x = make_inputs(where, dtype=dtype)
        padding = torch.zeros(BATCH, LENGTH, dtype=torch.bool)
        padding[1, -2:] = True
        padding = padding.to(where)
        with noise_from_cpu():
            output, kl = layer(x, key_padding_mask=padding)
        posterior = layer.posterior(x, key_padding_mask=padding)
        (output.square().sum() + kl).backward()
        return output, kl, layer.global_kl(), posterior.mean, posterior.variance, [p.grad for p in layer.parameters()]

    result, reference = run(device, device_dtype), run(CPU, DT)
    if mode == "standard" and device_dtype == torch.float32:
        # the standard KL (~3e3 here) goes through the keys' ill-conditioned Gram matrix: float32 keeps 2e-3 of it
        # and loses up to 20% of some gradients, so only the outputs, posterior and KL are compared
        result, reference = result[:-1], reference[:-1]
    assert_matches_cpu(result, reference, **TOL, float32=FLOAT32_LAYER)


@pytest.mark.parametrize("mode, variant, sampler, whitened", LAYERS[:3] + LAYERS[4:5] + LAYERS[7:], ids=IDS[:3] + IDS[4:5] + IDS[7:])
def test_sgpa_forward_step_cache_on_device(device, device_dtype, assert_matches_cpu, mode, variant, sampler, whitened):
    """A causal layer fed one token at a time: the key/value cache lives on ``device`` and the steps
    equal the full forward pass given the same noise."""

    def run(where, dtype):
        layer = make_layer(where, mode, variant, sampler, whitened, causal=True, dtype=dtype).eval()
        x = make_inputs(where, dtype=dtype)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(3)
            noise = move_noise(layer.sample_noise(BATCH, LENGTH, dtype=DT, device=CPU), where, dtype)
        with torch.no_grad():
            full, _ = layer(x, noise=noise)
            state, steps = None, []
            for t in range(LENGTH):
                out, state = layer.forward_step(x[:, t : t + 1], state, noise=SGPANoise(noise.local[:, :, t : t + 1], noise.global_))
                steps.append(out)
        torch.testing.assert_close(torch.cat(steps, 1), full, **(TOL if dtype == DT else FLOAT32_LAYER))
        return torch.cat(steps, 1), state.keys, state.values, state.local_noise

    assert_matches_cpu(run(device, device_dtype), run(CPU, DT), **TOL, float32=FLOAT32_LAYER)


def test_sgpa_eval_cache_is_not_reused_across_dtype_and_device(device):
    """The eval-mode cache of the global factors built for float32 on the CPU is rebuilt once the layer
    is moved to ``device`` in float64; a cache keyed on tensors of another device (simulated by the
    meta device) is rebuilt too instead of raising in ``torch.equal``."""
    layer = make_layer(CPU, "decoupled", "orthogonal", "decomposed", False).float().eval()
    x = make_inputs(CPU)
    cpu_noise = layer.sample_noise(BATCH, LENGTH, dtype=DT, device=CPU)
    noise = move_noise(cpu_noise, device)
    fresh = copy.deepcopy(layer).to(device=device, dtype=DT)
    with torch.no_grad():
        layer(x.float(), noise=SGPANoise(*(t.float() for t in cpu_noise)))
        layer.to(device=device, dtype=DT)
        got, _ = layer(x.to(device), noise=noise)
        expected, _ = fresh(x.to(device), noise=noise)
        torch.testing.assert_close(got, expected, rtol=1e-13, atol=1e-15)
        snapshot, dtype, factors = layer._cache
        on_meta = tuple((shape, dt, torch.device("meta")) for shape, dt, _ in snapshot.layout)
        layer._cache = (type(snapshot)(on_meta, snapshot.values.to("meta")), dtype, factors)
        again, _ = layer(x.to(device), noise=noise)
    assert again.device.type == device.type
    torch.testing.assert_close(again, expected, rtol=1e-13, atol=1e-15)
    assert layer._cache[0].values.device.type == device.type


def make_decoder(where, attention="sgpa", kwargs=None, dtype=DT):
    torch.manual_seed(0)
    kwargs = {"num_global": 4} if kwargs is None else kwargs
    return (
        moderate(SGPADecoder(9, d_model=8, num_heads=2, num_layers=2, max_len=8, attention=attention, attention_kwargs=kwargs).double())
        .to(where, dtype)
        .eval()
    )


@pytest.mark.parametrize(
    "attention, kwargs", [("sgpa", None), ("sgpa", {"num_global": 4, "sampler": "full"}), ("sgpa-standard", {}), ("kernel", {})]
)
def test_decoder_generate_on_device(device, device_dtype, assert_matches_cpu, attention, kwargs):
    """``generate`` with a seeded CPU generator (the next-token draws are made where the generator lives)
    and greedy decoding; tokens equal the CPU's exactly."""

    def run(where, dtype):
        decoder = make_decoder(where, attention, kwargs, dtype)
        prompt = torch.tensor([[1, 2], [3, 4], [5, 6]], device=where)
        with noise_from_cpu():
            sampled = decoder.generate(prompt, 5, generator=torch.Generator().manual_seed(4))
            greedy = decoder.generate(prompt, 5, greedy=True)
        return sampled, greedy

    assert_matches_cpu(run(device, device_dtype), run(CPU, DT), rtol=0, atol=0)


def test_sequence_and_classification_elbos_on_device(device, device_dtype, assert_matches_cpu):
    """The decoder's sequence ELBO and an SGPA ViT's classification ELBO, their gradients, and the
    Monte-Carlo predictive probabilities."""

    def run(where, dtype):
        decoder = make_decoder(where, dtype=dtype).train()
        tokens = torch.randint(0, 9, (BATCH, 7), generator=torch.Generator().manual_seed(5)).to(where)
        torch.manual_seed(0)
        vit = moderate(
            SGPAViT(
                image_size=8,
                patch_size=4,
                in_channels=1,
                num_classes=3,
                d_model=8,
                num_heads=2,
                num_layers=1,
                attention_kwargs={"num_global": 4},
            ).double()
        ).to(where, dtype)
        images = torch.rand(BATCH, 1, 8, 8, generator=torch.Generator().manual_seed(6), dtype=DT).to(where, dtype)
        labels = torch.tensor([0, 2, 1], device=where)
        with noise_from_cpu():
            logits, kl = decoder(tokens)
            sequence_elbo = SGPAELBO(decoder, num_data=40).to(where)(logits[:, :-1], kl, tokens[:, 1:])
            outputs, vit_kl = vit(images)
            image_elbo = SGPAELBO(vit, num_data=50).to(where)(outputs, vit_kl, labels)
            (sequence_elbo + image_elbo).backward()
            probabilities = predict_proba(vit, images, num_samples=3)
        gradients = [p.grad for p in list(decoder.parameters()) + list(vit.parameters()) if p.grad is not None]
        return sequence_elbo, image_elbo, gradients, probabilities

    assert_matches_cpu(run(device, device_dtype), run(CPU, DT), **TOL, float32=FLOAT32)


@pytest.mark.parametrize("likelihood", ["gaussian", "laplace"])
def test_regression_elbo_on_device(device, device_dtype, assert_matches_cpu, likelihood):
    def run(where, dtype):
        torch.manual_seed(0)
        vit = moderate(
            SGPAViT(
                image_size=8,
                patch_size=4,
                in_channels=1,
                num_classes=2,
                d_model=8,
                num_heads=2,
                num_layers=1,
                task="regression",
                attention_kwargs={"num_global": 4},
            ).double()
        ).to(where, dtype)
        images = torch.rand(BATCH, 1, 8, 8, generator=torch.Generator().manual_seed(6), dtype=DT).to(where, dtype)
        targets = torch.randn(BATCH, 2, generator=torch.Generator().manual_seed(7), dtype=DT).to(where, dtype)
        elbo = SGPAELBO(vit, num_data=50, likelihood=likelihood).to(where)
        with noise_from_cpu():
            outputs, kl = vit(images)
            value = elbo(outputs, kl, targets)
        value.backward()
        return value, [p.grad for p in elbo.parameters() if p.grad is not None]

    assert_matches_cpu(run(device, device_dtype), run(CPU, DT), **TOL, float32=FLOAT32)


def test_metrics_accept_tensors_on_device(device, device_dtype, assert_matches_cpu):
    def run(where, dtype):
        generator = torch.Generator().manual_seed(8)
        probs = torch.softmax(torch.randn(40, 4, generator=generator, dtype=DT), -1).to(where, dtype)
        ood = torch.softmax(0.3 * torch.randn(25, 4, generator=generator, dtype=DT), -1).to(where, dtype)
        labels = torch.randint(0, 4, (40,), generator=generator).to(where)
        targets = torch.randn(30, generator=generator, dtype=DT).to(where, dtype)
        samples = targets + 0.3 * torch.randn(5, 30, generator=generator, dtype=DT).to(where, dtype)
        noise = torch.tensor(0.4, device=where, dtype=dtype)
        return classification_metrics(probs, labels, ood), regression_metrics(targets, samples, noise)

    assert_matches_cpu(run(device, device_dtype), run(CPU, DT), rtol=1e-12, atol=1e-14, float32=FLOAT32)
