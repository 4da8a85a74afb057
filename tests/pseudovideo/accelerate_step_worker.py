"""One accelerate training step of a tiny video diffusion model; run by ``torchrun --nproc-per-node 2``
from ``test_training.py``, which compares it with a plain single-process step."""

import sys

import torch

from pseudovideo.models.diffusion import AutoregressiveVideoDiffusion
from pseudovideo.models.prior import AutoregressiveTokenPrior
from pseudovideo.training import train

POOL = torch.rand(32, 2, 1, 4, 4, generator=torch.Generator().manual_seed(11)) * 2 - 1
TOKENS = torch.randint(0, 6, (32, 2, 3), generator=torch.Generator().manual_seed(12))
BATCH, LR = 3, 0.1


def tiny_model():
    """2 frames, context 1: every task has one latent slot, so per-process means average to the global mean."""
    torch.manual_seed(0)
    return AutoregressiveVideoDiffusion(2, 1, image_size=4, block_out_channels=(8, 16), num_train_timesteps=20)


def next_batch(generator):
    return POOL[torch.randint(0, len(POOL), (BATCH,), generator=generator)]


def tiny_prior():
    torch.manual_seed(0)
    return AutoregressiveTokenPrior(6, (2, 3), dim=16, heads=2, layers=1)


def next_tokens(generator):
    return TOKENS[torch.randint(0, len(TOKENS), (BATCH,), generator=generator)]


def sgd(parameters):
    return torch.optim.SGD(parameters, lr=LR)


if __name__ == "__main__":
    torch.set_num_threads(1)
    if sys.argv[2:] == ["prior"]:  # a loss that is a method, not forward: AutoregressiveTokenPrior.loss
        model, _, accelerator, _ = train(
            tiny_prior(),
            next_tokens,
            1,
            optimizer_factory=sgd,
            loss="loss",
            batch_loss=lambda module, batch, rng: module(batch),
            seed=0,
            cpu=True,
            progress=False,
        )
    else:
        model, _, accelerator, _ = train(tiny_model(), next_batch, 1, optimizer_factory=sgd, seed=0, cpu=True, progress=False)
    if accelerator.is_main_process:
        torch.save({"world_size": accelerator.num_processes, "state": model.state_dict()}, sys.argv[1])
