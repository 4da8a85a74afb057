"""Token priors: the AR factorisation is causal and normalised, its sampler draws from the model's own
distribution (with temperature), masked decoding fills every token deterministically under a
generator, and both priors learn a known Markov chain over codes to within a KL tolerance."""

import itertools
import math

import pytest
import torch

from pseudovideo.models.prior import AutoregressiveTokenPrior, MaskedTokenPrior

# a 4-code Markov chain with distinct, non-degenerate transitions
INITIAL = torch.tensor([0.4, 0.3, 0.2, 0.1])
TRANSITION = torch.tensor([[0.70, 0.10, 0.10, 0.10], [0.05, 0.05, 0.80, 0.10], [0.30, 0.30, 0.20, 0.20], [0.10, 0.60, 0.05, 0.25]])


def markov_chains(count, length, generator):
    tokens = torch.multinomial(INITIAL, count, replacement=True, generator=generator)[:, None]
    for _ in range(length - 1):
        tokens = torch.cat([tokens, torch.multinomial(TRANSITION[tokens[:, -1]], 1, generator=generator)], dim=1)
    return tokens


def fit(prior, steps, shape, seed=0):
    torch.manual_seed(seed)
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.Adam(prior.parameters(), lr=3e-3)
    for _ in range(steps):
        tokens = markov_chains(64, math.prod(shape), generator).reshape(64, *shape)
        loss = prior.loss(tokens, generator) if isinstance(prior, MaskedTokenPrior) else prior.loss(tokens)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return prior.eval()


def kl(p, log_q):
    return (p * (p.log() - log_q)).sum(-1)


def test_changing_a_later_token_never_changes_an_earlier_logit():
    torch.manual_seed(0)
    prior = AutoregressiveTokenPrior(7, (2, 3, 3), dim=16, heads=2, layers=2).eval()
    tokens = torch.randint(0, 7, (3, 2, 3, 3))
    base = prior(tokens).reshape(3, 18, 7)
    for position in (0, 5, 9, 17):
        changed = tokens.reshape(3, 18).clone()
        changed[:, position] = (changed[:, position] + 1) % 7
        logits = prior(changed.reshape(3, 2, 3, 3)).reshape(3, 18, 7)
        # logits at i model z_i | z_<i: positions <= the changed one are untouched, later ones move
        torch.testing.assert_close(logits[:, : position + 1], base[:, : position + 1], atol=1e-6, rtol=0)
        if position < 17:
            assert (logits[:, position + 1 :] - base[:, position + 1 :]).abs().max() > 1e-4


def all_sequences(codes, length):
    return torch.tensor(list(itertools.product(range(codes), repeat=length)))


def sequence_log_probs(prior, sequences, temperature=1.0):
    """log prod_i softmax(logits_i / temperature)[z_i] from the teacher-forced logits."""
    log_probs = (prior(sequences) / temperature).log_softmax(-1)
    return log_probs.gather(-1, sequences[..., None]).squeeze(-1).reshape(len(sequences), -1).sum(1)


def test_autoregressive_likelihood_is_normalised():
    # an off-by-one (the target visible in the input) would break normalisation over all 3^4 sequences
    torch.manual_seed(0)
    prior = AutoregressiveTokenPrior(3, (2, 2), dim=16, heads=2, layers=2).eval()
    sequences = all_sequences(3, 4).reshape(-1, 2, 2)
    with torch.no_grad():
        torch.testing.assert_close(sequence_log_probs(prior, sequences).exp().sum(), torch.tensor(1.0))
        nll = prior.loss(sequences)
    torch.testing.assert_close(nll, -sequence_log_probs(prior, sequences).mean() / 4)


@pytest.mark.parametrize("temperature", [1.0, 0.5])
def test_autoregressive_samples_follow_the_model_distribution(temperature):
    torch.manual_seed(0)
    prior = AutoregressiveTokenPrior(2, (3,), dim=16, heads=2, layers=2).eval()
    with torch.no_grad():
        prior.head.weight.mul_(8)  # spread the 8 sequence probabilities apart
    sequences = all_sequences(2, 3)
    with torch.no_grad():
        log_probs = sequence_log_probs(prior, sequences, temperature)
    expected = log_probs.exp() / log_probs.exp().sum()
    count = 4000
    samples = prior.sample(count, temperature=temperature, generator=torch.Generator().manual_seed(1))
    index = (samples * torch.tensor([4, 2, 1])).sum(1)
    observed = torch.bincount(index, minlength=8).double() / count
    # each frequency has s.d. sqrt(p (1 - p) / 4000) <= 0.008: 4.5 s.d. is 0.036
    assert (observed - expected.double()).abs().max() < 0.036
    assert expected.max() - expected.min() > 0.1  # the check is not of a flat distribution


def test_autoregressive_prior_learns_a_markov_chain():
    prior = fit(AutoregressiveTokenPrior(4, (2, 4), dim=32, heads=2, layers=2), 300, (2, 4))
    tokens = markov_chains(512, 8, torch.Generator().manual_seed(9))
    with torch.no_grad():
        log_q = prior(tokens.reshape(512, 2, 4)).reshape(512, 8, 4).log_softmax(-1)
    truth = torch.cat([INITIAL.expand(512, 1, 4), TRANSITION[tokens[:, :-1]]], dim=1)
    divergence = kl(truth, log_q).mean()
    # the chain's entropy is ~1.2 nats/token; an order-0 model would be ~0.3 nats/token away
    assert divergence < 0.02, divergence


def chain_conditionals(tokens, mask):
    """p(z_i | visible tokens) under the chain: only the nearest visible neighbour on each side matters,
    p ∝ (pi P^i or P^{i-l}[z_l, :]) * P^{r-i}[:, z_r] (l, r: nearest visible positions left and right)."""
    count, length = tokens.shape
    powers = [torch.linalg.matrix_power(TRANSITION, d) for d in range(length)]
    out = torch.empty(count, length, 4)
    for b in range(count):
        visible = (~mask[b]).nonzero().flatten().tolist()
        for i in range(length):
            left, right = [j for j in visible if j < i], [j for j in visible if j > i]
            p = powers[i - left[-1]][tokens[b, left[-1]]] if left else INITIAL @ powers[i]
            if right:
                p = p * powers[right[0] - i][:, tokens[b, right[0]]]
            out[b, i] = p / p.sum()
    return out


def test_masked_prior_learns_the_chain_conditionals_under_random_masks():
    prior = fit(MaskedTokenPrior(4, (6,), dim=32, heads=2, layers=2), 600, (6,))
    tokens = markov_chains(256, 6, torch.Generator().manual_seed(9))
    mask = prior.random_mask(256, torch.Generator().manual_seed(8))
    truth = chain_conditionals(tokens, mask)
    with torch.no_grad():
        log_q = prior(tokens, mask).log_softmax(-1)
    # predicting every masked token by its marginal pi P^i (ignoring what is visible) scores 0.115
    # nats here; the trained prior reaches ~0.02 (seeded), so 0.04 needs the visible context used
    assert kl(truth[mask], log_q[mask]).mean() < 0.04
    # everything masked: the marginals pi P^i themselves
    marginals = torch.stack([INITIAL @ torch.linalg.matrix_power(TRANSITION, i) for i in range(6)])
    with torch.no_grad():
        log_q = prior(torch.zeros(1, 6, dtype=torch.long), torch.ones(1, 6, dtype=torch.bool)).log_softmax(-1)[0]
    assert kl(marginals, log_q).mean() < 0.02


def test_masked_loss_scores_only_the_masked_positions():
    torch.manual_seed(0)
    prior = MaskedTokenPrior(5, (2, 4), dim=16, heads=2, layers=1)
    tokens = torch.randint(0, 5, (6, 2, 4))
    loss = prior.loss(tokens, torch.Generator().manual_seed(3))
    mask = prior.random_mask(6, torch.Generator().manual_seed(3))
    log_probs = prior(tokens, mask).log_softmax(-1).gather(-1, tokens[..., None]).squeeze(-1)
    torch.testing.assert_close(loss, -log_probs[mask].mean())


def test_random_masks_follow_the_cosine_schedule():
    prior = MaskedTokenPrior(4, (8, 8), dim=8, heads=1, layers=1)
    masks = prior.random_mask(20000, torch.Generator().manual_seed(0)).reshape(20000, 64)
    counts = masks.sum(1).double()
    # E ceil(cos(pi u / 2) L) for L = 64 by quadrature on a fine grid of u
    u = (torch.arange(200000, dtype=torch.float64) + 0.5) / 200000
    expected = torch.ceil(torch.cos(math.pi * u / 2) * 64).mean()
    assert abs(counts.mean() - expected) < 4 * counts.std() / math.sqrt(20000)
    assert counts.min() >= 1 and counts.max() == 64


def test_masked_decoding_fills_every_token_and_is_deterministic_under_a_generator():
    torch.manual_seed(0)
    prior = MaskedTokenPrior(6, (2, 3, 3), dim=16, heads=2, layers=2).eval()
    first = prior.sample(5, steps=4, generator=torch.Generator().manual_seed(0))
    again = prior.sample(5, steps=4, generator=torch.Generator().manual_seed(0))
    other = prior.sample(5, steps=4, generator=torch.Generator().manual_seed(1))
    assert first.shape == (5, 2, 3, 3) and first.dtype == torch.int64
    assert first.min() >= 0 and first.max() < 6  # no [MASK] symbol (6) left anywhere
    assert torch.equal(first, again) and not torch.equal(first, other)
    # more steps than tokens, a single step, greedy or noisy choice: all end fully decoded
    for steps, choice in [(1, 4.5), (40, 4.5), (4, 0.0), (4, 100.0)]:
        tokens = prior.sample(3, steps=steps, generator=torch.Generator().manual_seed(2), choice_temperature=choice)
        assert tokens.max() < 6


def confident_at_position_zero():
    """A masked prior certain of code 2 at position 0 and uniform over 3 codes elsewhere."""
    torch.manual_seed(0)
    prior = MaskedTokenPrior(3, (4,), dim=8, heads=1, layers=1).eval()
    with torch.no_grad():
        prior.head.weight.zero_()
        prior.head.bias.zero_()
        prior.position[0].zero_()
        prior.position[0, 0] = 1.0
        prior.head.weight[2, 0] = 1e4  # position 0 -> logit of code 2 huge (LayerNorm keeps feature 0 > 0)
    calls = []
    network = prior.network
    prior.network = lambda symbols: calls.append(symbols.clone()) or network(symbols)
    return prior, calls


def test_masked_decoding_reveals_the_most_confident_tokens_first():
    # greedy order (no Gumbel noise): after step 1 of 2, with floor(cos(pi/4) 4) = 2 tokens
    # re-masked, position 0 must be among the two revealed, with its confident code
    prior, calls = confident_at_position_zero()
    prior.sample(8, steps=2, generator=torch.Generator().manual_seed(0), choice_temperature=0.0)
    second_input = calls[1]
    assert (second_input[:, 0] == 2).all()
    assert ((second_input == 3).sum(1) == 2).all()  # exactly two positions re-masked ([MASK] = 3)


def test_choice_noise_randomises_which_tokens_are_revealed():
    # with overwhelming Gumbel noise the 2 revealed positions of 4 are a uniform random pair, so
    # position 0 is revealed with probability 1/2 (s.d. 0.025 over 400 samples; bound at 4.4 s.d.)
    prior, calls = confident_at_position_zero()
    prior.sample(400, steps=2, generator=torch.Generator().manual_seed(0), choice_temperature=1e4)
    second_input = calls[1]
    assert ((second_input == 3).sum(1) == 2).all()
    assert abs((second_input[:, 0] != 3).double().mean() - 0.5) < 0.11


def test_state_dict_reload_and_bad_input():
    torch.manual_seed(0)
    prior = AutoregressiveTokenPrior(5, (4,), dim=16, heads=2, layers=1)
    copy = AutoregressiveTokenPrior(5, (4,), dim=16, heads=2, layers=1)
    copy.load_state_dict(prior.state_dict())
    tokens = torch.randint(0, 5, (2, 4))
    torch.testing.assert_close(copy(tokens), prior(tokens))
    with pytest.raises(ValueError, match="tokens"):
        prior(torch.randint(0, 5, (2, 5)))
    with pytest.raises(ValueError, match="tokens"):
        prior(torch.full((2, 4), 5))
    with pytest.raises(TypeError, match="tokens"):
        prior(torch.zeros(2, 4))
    with pytest.raises(ValueError, match="temperature"):
        prior.sample(2, temperature=0.0)
    with pytest.raises(ValueError, match="num_samples"):
        prior.sample(0)
    with pytest.raises(ValueError, match="token_shape"):
        MaskedTokenPrior(5, (0, 3))
    masked = MaskedTokenPrior(5, (4,), dim=16, heads=2, layers=1)
    with pytest.raises(ValueError, match="mask"):
        masked(tokens, torch.zeros(2, 4))
    with pytest.raises(ValueError, match="steps"):
        masked.sample(2, steps=0)
    with pytest.raises(ValueError, match="choice_temperature"):
        masked.sample(2, choice_temperature=-1.0)
