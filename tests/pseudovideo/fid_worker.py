"""FID of a share of the images per process; run by ``torchrun --nproc-per-node 2`` from
``test_metrics_distributed.py``, which compares it with one process on all of them."""

import sys

import torch
import torch.distributed as dist

from pseudovideo.metrics import ImageClassifier, frechet_distance


def sets():
    generator = torch.Generator().manual_seed(0)
    real = torch.rand(40, 1, 8, 8, generator=generator)
    fake = (real[:36] + 0.2 * torch.rand(36, 1, 8, 8, generator=generator)).clamp(0, 1)
    return real, fake


def feature():
    torch.manual_seed(0)
    return ImageClassifier(num_features=6).eval()


if __name__ == "__main__":
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, size = dist.get_rank(), dist.get_world_size()
    real, fake = sets()
    value = frechet_distance(real[rank::size], fake[rank::size], feature(), batch_size=7, distributed=True)
    if rank == 0:
        torch.save({"fid": value, "world_size": size}, sys.argv[1])
    dist.destroy_process_group()
