"""Causal SGPA decoder: incremental decoding equals full recomputation; learning."""

import pytest
import torch
from sgpa_model_fixtures import BATCH, LENGTH, VOCAB, _decoder

from gpytorch_sgpa import SGPAELBO, SGPADecoder, SGPANoise

TIGHT = dict(rtol=1e-6, atol=1e-8)

# every layer type, and each sampler of the decoupled SGPA
CONFIGS = [
    ("sgpa", {"num_global": 4}),
    ("sgpa", {"num_global": 4, "sampler": "full"}),
    ("sgpa", {"num_global": 4, "sampler": "decomposed"}),
    ("sgpa-dsvgp", {"num_global": 4}),
    ("sgpa-standard", {}),
    ("sgpa-standard", {"diag_sample": False}),
    ("kernel", {}),
    ("sdp", {}),
]


def _step_noise(noise, t):
    return [None if n is None else SGPANoise(n.local[:, :, t : t + 1], n.global_) for n in noise]


@pytest.mark.parametrize("attention,kwargs", CONFIGS)
def test_forward_step_reproduces_the_full_forward(attention, kwargs):
    """Token-by-token decoding with per-layer caches gives the logits of one full causal pass
    (same noise), so the model never looks ahead and caching changes nothing."""
    model = _decoder(attention, kwargs)
    torch.manual_seed(1)
    tokens = torch.randint(0, VOCAB, (BATCH, LENGTH))
    noise = model.sample_noise(BATCH, LENGTH)
    with torch.no_grad():
        full, kl = model(tokens, noise=noise)
        states, steps = None, []
        for t in range(LENGTH):
            logits, states = model.forward_step(tokens[:, t], states, noise=_step_noise(noise, t))
            steps.append(logits)
    assert full.shape == (BATCH, LENGTH, VOCAB)
    torch.testing.assert_close(torch.stack(steps, 1), full, **TIGHT)
    assert (kl > 0) == attention.startswith("sgpa")
    # causality: changing the last token leaves every earlier prediction unchanged
    changed = tokens.clone()
    changed[:, -1] = (changed[:, -1] + 1) % VOCAB
    with torch.no_grad():
        other, _ = model(changed, noise=noise)
    torch.testing.assert_close(other[:, :-1], full[:, :-1], **TIGHT)
    assert not torch.allclose(other[:, -1], full[:, -1])


def test_decoder_learns_to_count_and_generates_the_rule():
    """Sequences follow t_{i+1} = t_i + 1 (mod V); an SGPA decoder trained by the sequence ELBO
    continues unseen prompts correctly when generating with its caches."""
    torch.manual_seed(0)
    vocab, length = 7, 8
    starts = torch.randint(0, vocab, (128, 1))
    data = (starts + torch.arange(length)) % vocab
    model = SGPADecoder(vocab, d_model=16, num_heads=2, num_layers=1, max_len=length, attention="sgpa", attention_kwargs={"num_global": 4})
    elbo = SGPAELBO(model, num_data=128, anneal_steps=20)
    optimiser = torch.optim.Adam(elbo.parameters(), lr=1e-2)
    for _ in range(80):
        optimiser.zero_grad()
        logits, kl = model(data)
        loss = -elbo(logits[:, :-1], kl, data[:, 1:])
        loss.backward()
        optimiser.step()
    model.eval()
    prompts = torch.arange(vocab).unsqueeze(1)  # every start token once
    generated = model.generate(prompts, num_tokens=length - 1, greedy=True)
    expected = (prompts + torch.arange(length)) % vocab
    assert generated.shape == (vocab, length) and torch.equal(generated[:, :1], prompts)
    assert (generated == expected).double().mean() > 0.95
    sampled = model.generate(prompts, num_tokens=3, generator=torch.Generator().manual_seed(0))
    assert sampled.shape == (vocab, 4) and sampled.min() >= 0 and sampled.max() < vocab


def test_decoder_bad_arguments():
    model = _decoder("kernel", {})
    with pytest.raises(ValueError, match="causal"):
        SGPADecoder(VOCAB, 8, 2, 1, LENGTH, attention="kernel", attention_kwargs={"causal": False})
    with pytest.raises(ValueError, match="max_len"):
        model(torch.zeros(1, LENGTH + 1, dtype=torch.long))
    with pytest.raises(ValueError, match="vocab_size"):
        model(torch.full((1, 2), VOCAB))
    with pytest.raises(ValueError, match="exceeds max_len"):
        model.generate(torch.zeros(1, 2, dtype=torch.long), num_tokens=LENGTH)
    with pytest.raises(ValueError, match="temperature"):
        model.generate(torch.zeros(1, 2, dtype=torch.long), num_tokens=1, temperature=0.0)
    with pytest.raises(ValueError, match="noise"):
        model(torch.zeros(1, 2, dtype=torch.long), noise=[None])
    with pytest.raises(ValueError, match="token"):
        model.forward_step(torch.zeros(1, 1, dtype=torch.long))
    states = None
    for _ in range(LENGTH):
        _, states = model.forward_step(torch.zeros(1, dtype=torch.long), states)
    with pytest.raises(ValueError, match="max_len"):
        model.forward_step(torch.zeros(1, dtype=torch.long), states)
