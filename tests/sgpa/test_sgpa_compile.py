"""SGPA's training step without graph breaks or host synchronisation.

``torch.compile(..., fullgraph=True)`` raises on the first graph break, so these tests fail for any
data-dependent Python branch (a host synchronisation on a GPU) left in the forward pass and the
ELBO; the ``eager`` backend traces with Dynamo but runs the captured graph op by op, so the compiled
loss must equal the eager one exactly (same random draws).  The sync-free Cholesky and target
handling that make this possible are tested against their eager CPU counterparts.
"""

import gpytorch
import pytest
import torch
from linear_operator.utils.cholesky import psd_safe_cholesky

import gpytorch_sgpa._attention_base as attention_base
import gpytorch_sgpa.elbo as elbo_module
import gpytorch_sgpa.multihead as multihead
import gpytorch_sgpa.transformer as transformer_module
from gpytorch_sgpa.attention import SGPAttention
from gpytorch_sgpa.elbo import SGPAELBO
from gpytorch_sgpa.transformer import SGPADecoder, SGPATransformer, SGPAViT

# (attention, sampler): the decoupled samplers and the standard mode's diagonal sampler
CONFIGS = [("sgpa", "decomposed"), ("sgpa", "diagonal"), ("sgpa", "full"), ("sgpa-dsvgp", "decomposed"), ("sgpa-standard", "diagonal")]


def _kwargs(attention, sampler):
    kwargs = {"kernel": "rbf", "sampler": sampler}
    if attention != "sgpa-standard":
        kwargs["num_global"] = 4
    return kwargs


def _vit(attention, sampler):
    torch.manual_seed(0)
    return SGPAViT(
        image_size=8,
        patch_size=4,
        in_channels=1,
        num_classes=3,
        d_model=8,
        num_heads=2,
        num_layers=2,
        attention=attention,
        attention_kwargs=_kwargs(attention, sampler),
        dropout=0.1,
    )


def _compiled_matches_eager(loss_fn, *inputs, elbo):
    compiled = torch.compile(loss_fn, fullgraph=True, backend="eager")
    torch.manual_seed(1)
    expected = loss_fn(*inputs)
    elbo.num_updates.zero_()  # the same annealed KL weight for both calls
    torch._dynamo.reset()
    torch.manual_seed(1)
    got = compiled(*inputs)  # raises torch._dynamo.exc.Unsupported on a graph break
    torch.testing.assert_close(got, expected, rtol=0, atol=0)
    got.backward()


@pytest.mark.parametrize(
    "attention,sampler,kl_weighting", [(*config, "all-over-n") for config in CONFIGS] + [("sgpa", "decomposed", "decomposed")]
)
def test_vit_training_loss_compiles_without_graph_breaks(attention, sampler, kl_weighting, device):
    """On CUDA this runs the sync-free paths for real (``device`` fixture: cpu, and cuda when present)."""
    model = _vit(attention, sampler).train().to(device)
    elbo = SGPAELBO(model, num_data=100, anneal_steps=5, kl_weighting=kl_weighting).to(device)
    images, labels = torch.rand(4, 1, 8, 8, device=device), torch.tensor([0, 2, 1, 0], device=device)

    def loss_fn(images, labels):
        logits, kl = model(images)
        return -elbo(logits, kl, labels)

    _compiled_matches_eager(loss_fn, images, labels, elbo=elbo)


@pytest.mark.parametrize("attention,sampler", [CONFIGS[0], CONFIGS[2], CONFIGS[4]])
def test_padded_sequences_and_eval_compile_without_graph_breaks(attention, sampler):
    torch.manual_seed(0)
    model = SGPATransformer(11, 3, 8, 2, 2, max_len=6, attention=attention, attention_kwargs=_kwargs(attention, sampler))
    tokens = torch.randint(0, 11, (3, 6))
    mask = torch.zeros(3, 6, dtype=torch.bool)
    mask[0, 4:] = True
    elbo = SGPAELBO(model, num_data=100)
    _compiled_matches_eager(lambda t, m: -elbo(*model.train()(t, m), torch.tensor([0, 1, 2])), tokens, mask, elbo=elbo)
    with torch.no_grad():  # eval: the global-factor cache is bypassed inside the graph
        model.eval()
        compiled = torch.compile(lambda t, m: model(t, m)[0], fullgraph=True, backend="eager")
        torch.manual_seed(2)
        expected = model(tokens, mask)[0]
        torch.manual_seed(2)
        torch.testing.assert_close(compiled(tokens, mask), expected, rtol=0, atol=0)


def test_decoder_sequence_elbo_compiles_without_graph_breaks(device):
    torch.manual_seed(0)
    model = SGPADecoder(13, 8, 2, 2, max_len=7, attention="sgpa", attention_kwargs={"num_global": 4}).train().to(device)
    tokens = torch.randint(0, 13, (3, 7)).to(device)
    mask = torch.zeros(3, 7, dtype=torch.bool, device=device)
    mask[1, :2] = True  # left padding
    targets = tokens[:, 1:].masked_fill(mask[:, 1:], -100)
    elbo = SGPAELBO(model, num_data=50).to(device)

    def loss_fn(tokens, mask, targets):
        logits, kl = model(tokens, mask)
        return -elbo(logits[:, :-1], kl, targets)

    _compiled_matches_eager(loss_fn, tokens, mask, targets, elbo=elbo)


# ---- the sync-free paths, forced on the CPU -------------------------------------------------------


@pytest.fixture
def accelerator_path(monkeypatch):
    """Run the code paths taken on accelerators and under ``torch.compile`` (no host checks)."""
    monkeypatch.setattr(multihead, "checks_on_host", lambda x: False)
    monkeypatch.setattr(attention_base, "checks_on_host", lambda x: False)
    monkeypatch.setattr(elbo_module, "checks_on_host", lambda x: False)
    monkeypatch.setattr(transformer_module, "checks_on_host", lambda x: False)


def _spd(batch, n, seed):
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(batch, n, n, generator=g, dtype=torch.float64)
    return a @ a.mT + n * torch.eye(n, dtype=torch.float64)


def test_sync_free_cholesky_equals_psd_safe_cholesky_where_nothing_fails(accelerator_path):
    matrix = _spd(5, 6, 0).requires_grad_()
    factor = multihead.psd_cholesky(matrix)
    expected = psd_safe_cholesky(matrix)
    torch.testing.assert_close(factor, expected, rtol=0, atol=0)
    (grad,) = torch.autograd.grad(factor.square().sum(), matrix)
    (expected_grad,) = torch.autograd.grad(expected.square().sum(), matrix)
    torch.testing.assert_close(grad, expected_grad, rtol=1e-12, atol=1e-12)


def test_sync_free_cholesky_adds_the_largest_jitter_to_failed_matrices_only(accelerator_path):
    matrix = _spd(3, 4, 1)
    matrix[1] = torch.ones(4, 4, dtype=torch.float64)  # p.s.d. of rank 1: the plain factorisation fails
    matrix[2] = -torch.eye(4, dtype=torch.float64)  # negative definite: fails at every jitter
    factor = multihead.psd_cholesky(matrix)
    largest = gpytorch.settings.cholesky_jitter.value(torch.float64) * 10 ** (gpytorch.settings.cholesky_max_tries.value() - 1)
    torch.testing.assert_close(factor[0], torch.linalg.cholesky(matrix[0]), rtol=0, atol=0)
    torch.testing.assert_close(factor[1], torch.linalg.cholesky(matrix[1] + largest * torch.eye(4, dtype=torch.float64)))
    assert torch.isnan(factor[2]).all()  # where the eager CPU path raises NotPSDError


def test_invalid_class_targets_still_fail_without_the_host_check(accelerator_path):
    model = _vit("sgpa", "decomposed")
    logits, kl = model(torch.rand(2, 1, 8, 8))
    elbo = SGPAELBO(model, num_data=10)
    for bad in (-1, 3):  # an old clamp mapped -1 silently to class 0
        with pytest.raises((IndexError, RuntimeError)):
            elbo(logits, kl, torch.tensor([0, bad]))


def test_annealed_weight_on_the_device_equals_kl_weight():
    model = _vit("sgpa", "decomposed").train()
    elbo = SGPAELBO(model, num_data=10, beta=2.0, anneal_steps=3)
    images, labels = torch.rand(2, 1, 8, 8), torch.tensor([0, 1])
    for _ in range(5):
        weight = elbo.kl_weight
        torch.manual_seed(3)
        logits, kl = model(images)
        value = elbo(logits, kl, labels)
        expected = elbo.expected_log_likelihood(logits, labels).mean() - weight * kl / 10
        torch.testing.assert_close(value, expected)
    assert elbo.kl_weight == 2.0 and int(elbo.num_updates) == 5


def test_fully_padded_sequence_without_the_host_check_leaves_the_others_unchanged(accelerator_path):
    torch.manual_seed(0)
    x = torch.randn(2, 5, 8)
    mask = torch.zeros(2, 5, dtype=torch.bool)
    for layer in (SGPAttention(8, 2, num_global=4), SGPAttention(8, 2, mode="standard", max_len=5)):
        layer.eval()
        noise = layer.sample_noise(2, 5)
        alone, _ = layer(x, key_padding_mask=mask, noise=noise)
        mask[1] = True
        out, kl = layer(x, key_padding_mask=mask, noise=noise)
        mask[1] = False
        torch.testing.assert_close(out[0], alone[0])
        assert torch.isfinite(out).all() and torch.isfinite(kl)
