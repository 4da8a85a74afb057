"""One SGPA training step on a fixed global batch, run by ``test_sgpa_distributed.py`` under torchrun
(``python ddp_step_worker.py OUT [auto]``, 2 ranks; ``auto``: ``SGPAELBO(beta="auto")``) and in-process
(1 rank); rank 0 saves the parameters, the gradients and the KL weight after the step to ``OUT``.

Common random numbers: each SGPA layer's noise for the whole global batch comes from a generator of
its own; a rank uses the rows of its shard, so both runs draw the same noise for every example.
"""

import sys

import torch

from experiments.sgpa import distributed
from experiments.sgpa.training import Split, train_classifier
from gpytorch_sgpa import SGPAELBO, SGPANoise, SGPAttention, SGPAViT

GLOBAL_BATCH = 7  # odd: shards of 4 and 3 exercise the loss scaling by shard size
SEED = 0


def _shared_noise(layer_index: int, rank: int, world_size: int):
    generator = torch.Generator().manual_seed(100 + layer_index)
    rows = distributed.shard(torch.arange(GLOBAL_BATCH), rank, world_size)

    def sample_noise(self, batch_size, length, dtype=None, device=None):
        assert batch_size == len(rows), (batch_size, len(rows))
        local = torch.randn(GLOBAL_BATCH, self.num_heads, length, self.head_dim, generator=generator, dtype=torch.float64)
        global_ = None
        if self._uses_global_noise():  # the default decomposed sampler's per-sequence global draw
            global_ = torch.randn(GLOBAL_BATCH, self.num_heads, self.head_dim, self.num_global, generator=generator, dtype=torch.float64)[
                rows
            ]
        return SGPANoise(local[rows], global_)

    return sample_noise


def run_step(beta=1.0):
    """Build the model and data (same on every rank), train one step with the ELBO's ``beta``; ``(model, elbo)``."""
    rank, world_size = distributed.world()
    torch.manual_seed(SEED)
    images = torch.rand(GLOBAL_BATCH, 1, 8, 8, dtype=torch.float64)
    labels = torch.arange(GLOBAL_BATCH) % 3
    model = SGPAViT(
        image_size=8,
        patch_size=4,
        in_channels=1,
        num_classes=3,
        d_model=8,
        num_heads=2,
        num_layers=2,
        attention="sgpa",
        attention_kwargs={"num_global": 4},
        dropout=0.0,
    ).double()
    layers = [m for m in model.modules() if isinstance(m, SGPAttention)]
    for index, layer in enumerate(layers):
        layer.sample_noise = _shared_noise(index, rank, world_size).__get__(layer)
    # num_data well below the usual so that the global KL / N weighs on the gradients
    elbo = SGPAELBO(model, num_data=20, beta=beta)
    train_classifier(model, Split(images, labels), epochs=1, batch_size=GLOBAL_BATCH, lr=1e-2, elbo=elbo, seed=SEED, progress=False)
    return model, elbo


def snapshot(model) -> dict:
    return {name: (p.detach().clone(), p.grad.detach().clone()) for name, p in model.named_parameters()}


if __name__ == "__main__":
    distributed.init_from_environment()
    trained, trained_elbo = run_step("auto" if sys.argv[2:] == ["auto"] else 1.0)
    if distributed.is_main():
        torch.save({"world_size": distributed.world()[1], "state": snapshot(trained), "kl_weight": trained_elbo.kl_weight}, sys.argv[1])
    torch.distributed.destroy_process_group()
