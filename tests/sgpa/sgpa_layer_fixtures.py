"""Small float64 SGPA layers and inputs shared by the attention and sampler tests."""

import torch

from gpytorch_sgpa import SGPAttention

D_MODEL, HEADS, LENGTH, NUM_GLOBAL, BATCH = 6, 2, 5, 3, 2
E = D_MODEL // HEADS
TIGHT = dict(rtol=1e-6, atol=1e-8)


def _layer(seed=0, **kwargs):
    torch.manual_seed(seed)
    kwargs.setdefault("num_global", NUM_GLOBAL)
    layer = SGPAttention(D_MODEL, HEADS, **kwargs).double()
    with torch.no_grad():  # moderate variational parameters keep every matrix well conditioned
        for name, p in layer.named_parameters():
            if name.startswith("global_chol") or name == "global_values":
                p.mul_(0.3)
    return layer


def _inputs(seed=1, batch=BATCH, length=LENGTH):
    torch.manual_seed(seed)
    return 0.7 * torch.randn(batch, length, D_MODEL, dtype=torch.double)


def _heads(t):
    return t.view(t.shape[0], t.shape[1], HEADS, E).transpose(1, 2)


def _step_through(layer, x, noise):
    """Feed ``x`` one position at a time through ``forward_step`` with the matching noise slices."""
    from gpytorch_sgpa.attention import SGPANoise

    state, steps = None, []
    for t in range(x.shape[1]):
        out, state = layer.forward_step(x[:, t : t + 1], state, noise=SGPANoise(noise.local[:, :, t : t + 1], noise.global_))
        steps.append(out)
    return torch.cat(steps, 1), state
