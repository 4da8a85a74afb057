"""The SGPA ELBO (thesis eq. (3.18)) against closed forms: the expected log-likelihood written out per sample and
token, the KL weightings against each layer's global KL computed alone, and linear annealing."""

import copy
import math

import pytest
import torch
import torch.nn.functional as F
from sgpa_model_fixtures import BATCH, LENGTH, VOCAB, _decoder, _tokens, _transformer

from gpytorch_sgpa import SGPAELBO, SGPAttention
from gpytorch_sgpa.elbo import IGNORE_INDEX, KL_WEIGHTINGS

TIGHT = dict(rtol=1e-6, atol=1e-8)


def test_elbo_matches_closed_forms_and_anneals_linearly():
    model = _transformer("sgpa")
    elbo = SGPAELBO(model, num_data=50, beta=2.0, anneal_steps=4, kl_weighting="all-over-n")
    torch.manual_seed(0)
    outputs = torch.randn(3, 5, 3, dtype=torch.double)  # 3 MC samples, batch 5, 3 classes
    targets = torch.tensor([0, 2, 1, 1, 0])
    kl = torch.tensor(7.0, dtype=torch.double)
    hand_ell = torch.stack([torch.log(torch.softmax(outputs[s, b], -1)[targets[b]]) for s in range(3) for b in range(5)])
    for step in range(6):
        loss = elbo(outputs, kl, targets)
        weight = 2.0 * min(1.0, step / 4)
        torch.testing.assert_close(loss, hand_ell.mean() - weight * 7.0 / 50, **TIGHT)
    model.eval()
    elbo(outputs, kl, targets)
    assert int(elbo.num_updates) == 6  # evaluation calls do not advance the annealing

    regression = _transformer("sgpa", task="regression")
    laplace = SGPAELBO(regression, num_data=10).double()
    y = torch.randn(5, dtype=torch.double)
    f = torch.randn(2, 5, 3, dtype=torch.double)[..., :1]
    b = laplace.likelihood.noise.sqrt()
    hand = (-torch.log(2 * b) - (y[:, None] - f).abs() / b).mean()
    laplace.kl_weighting = "authors"  # kl = 0 here: the ELBO is the expected log-likelihood
    torch.testing.assert_close(laplace(f, torch.zeros((), dtype=torch.double), y), hand, **TIGHT)
    gaussian = SGPAELBO(regression, num_data=10, likelihood="gaussian").double()
    var = gaussian.likelihood.noise
    hand = (-0.5 * torch.log(2 * math.pi * var) - (y[:, None] - f).square() / (2 * var)).mean()
    gaussian.kl_weighting = "authors"  # kl = 0 here: the ELBO is the expected log-likelihood
    torch.testing.assert_close(gaussian(f, torch.zeros((), dtype=torch.double), y), hand, **TIGHT)


@pytest.mark.parametrize("attention", ["sgpa", "sgpa-dsvgp", "sgpa-standard", "kernel"])
def test_kl_weightings_split_the_kl_into_amortised_and_global_parts(attention):
    """Reference for the global KL: with ``W_v = 0`` the amortised values vanish, so every
    sequence's KL (``posterior(...).kl``) is the global KL alone (orthogonal: ``v_aᵀ B v_a = 0``;
    dsvgp: ``v_aᵀ K_aa v_a = 0``; standard and kernel attention have none)."""
    model = _transformer(attention)
    tokens, mask = _tokens()
    reference = torch.zeros((), dtype=torch.double)
    with torch.no_grad():
        for layer in model.layers:
            if isinstance(layer.attention, SGPAttention):
                zeroed = copy.deepcopy(layer.attention)
                zeroed.v_proj.weight.zero_()
                s = torch.randn(2, 4, 8, dtype=torch.double)
                kl = zeroed.posterior(s, global_inputs=layer.global_inputs()).kl
                reference += kl[0] if zeroed.mode == "decoupled" else 0.0
                if zeroed.mode == "decoupled":
                    torch.testing.assert_close(kl[1], kl[0], **TIGHT)
        torch.testing.assert_close(model.global_kl(), reference, **TIGHT)
    outputs, kl = model(tokens, key_padding_mask=mask)
    labels = torch.tensor([0, 2, 1])
    ell = SGPAELBO(model, num_data=40, kl_weighting="authors").expected_log_likelihood(outputs, labels).mean()
    values = {w: SGPAELBO(model, num_data=40, kl_weighting=w)(outputs, kl, labels) for w in KL_WEIGHTINGS}
    torch.testing.assert_close(values["decomposed"], ell - (kl - reference) - reference / 40, **TIGHT)
    torch.testing.assert_close(values["all-over-n"], ell - kl / 40, **TIGHT)
    torch.testing.assert_close(values["authors"], ell - kl, **TIGHT)
    with pytest.raises(ValueError, match="kl_weighting"):
        SGPAELBO(model, num_data=40, kl_weighting="beta")
    with pytest.raises(TypeError, match="global_kl"):
        SGPAELBO(torch.nn.Linear(2, 2), num_data=40, kl_weighting="decomposed")


def test_sequence_elbo_sums_token_log_likelihoods_and_skips_ignored_targets():
    torch.manual_seed(2)
    model = _decoder("sgpa", {"num_global": 4}).train()
    elbo = SGPAELBO(model, num_data=50, kl_weighting="decomposed")
    tokens = torch.randint(0, VOCAB, (BATCH, LENGTH))
    targets = tokens[:, 1:].clone()
    targets[0, 3:] = IGNORE_INDEX  # a shorter first sequence
    logits, kl = model(tokens)
    logits = logits[:, :-1]
    log_probs = F.log_softmax(logits, -1)
    expected_ell = torch.stack(
        [sum(log_probs[b, t, targets[b, t]] for t in range(LENGTH - 1) if targets[b, t] != IGNORE_INDEX) for b in range(BATCH)]
    )
    torch.testing.assert_close(elbo.expected_log_likelihood(logits, targets), expected_ell, **TIGHT)
    global_kl = model.global_kl()  # the exact ELBO counts the shared global KL once per data set
    torch.testing.assert_close(elbo(logits, kl, targets), expected_ell.mean() - (kl - global_kl) - global_kl / 50, **TIGHT)
    # Monte-Carlo sample dimensions in front are averaged
    stacked = torch.stack([logits, logits])
    torch.testing.assert_close(elbo.expected_log_likelihood(stacked, targets), expected_ell, **TIGHT)
    with pytest.raises(ValueError, match="class indices"):
        elbo.expected_log_likelihood(logits, targets.clamp_min(0) + VOCAB)
    with pytest.raises(ValueError, match="at least one position"):
        elbo.expected_log_likelihood(logits, torch.full_like(targets, IGNORE_INDEX))
    with pytest.raises(ValueError, match="outputs must be"):
        elbo.expected_log_likelihood(logits[:, :-1], targets)
    with pytest.raises(ValueError, match="class indices"):  # -100 is only meaningful in sequences
        elbo.expected_log_likelihood(logits[:, 0], torch.full((BATCH,), IGNORE_INDEX))
