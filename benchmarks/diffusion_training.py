"""A short video-diffusion training run on one device: steps per second, the loss, peak memory.

``AutoregressiveVideoDiffusion`` learns blur pseudo videos of synthetic images (smoothed noise in
``[-1, 1]``, no data set needed) through :func:`pseudovideo.training.train`, as diffusers'
own scripts train with ``accelerate`` (mixed precision, EMA); where ``accelerate`` is not installed, a plain
torch loop over the same loss. The first ``--warmup`` steps are left out of the timing.

    python benchmarks/diffusion_training.py --device cpu --steps 20
    python benchmarks/diffusion_training.py --device cuda --steps 300 --mixed-precision bf16 --ema 0.999
"""

from __future__ import annotations

import argparse
import math
import time

import torch
import torch.nn.functional as F

from pseudovideo import make_pseudo_video
from pseudovideo.models.diffusion import AutoregressiveVideoDiffusion


def synthetic_images(count: int, size: int, generator: torch.Generator) -> torch.Tensor:
    """``(count, 1, size, size)`` smooth random images in ``[-1, 1]`` (noise blurred by a 5x5 box)."""
    noise = torch.randn(count, 1, size, size, generator=generator)
    smooth = F.avg_pool2d(F.pad(noise, (2, 2, 2, 2), mode="reflect"), 5, stride=1)
    return smooth / smooth.abs().amax(dim=(1, 2, 3), keepdim=True)


def run(
    device: str = "cpu",
    steps: int = 20,
    batch: int = 16,
    image_size: int = 32,
    frames: int = 4,
    mixed_precision: str = "no",
    ema: float = 0.0,
    warmup: int = 3,
    seed: int = 0,
) -> dict:
    generator = torch.Generator().manual_seed(seed)
    pool = make_pseudo_video(synthetic_images(256, image_size, generator), frames, "blur")
    torch.manual_seed(seed)
    model = AutoregressiveVideoDiffusion(frames, 1, image_size=image_size, block_out_channels=(32, 64, 64))
    times, losses = [], []

    def next_batch(rng: torch.Generator) -> torch.Tensor:
        times.append(time.perf_counter())
        return pool[torch.randint(0, len(pool), (batch,), generator=rng)].to(device)

    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    try:
        from pseudovideo.training import train

        def batch_loss(wrapped, videos, rng):
            loss = wrapped(videos, rng)
            losses.append(float(loss.detach()))
            return loss

        train(
            model,
            next_batch,
            steps,
            batch_loss=batch_loss,
            mixed_precision=mixed_precision,
            ema_decay=ema,
            seed=seed,
            cpu=device == "cpu",
            progress=False,
        )
        engine = "accelerate"
    except ImportError:
        model = model.to(device)
        optimizer = torch.optim.Adam(model.parameters(), lr=5e-4)
        for _ in range(steps):
            optimizer.zero_grad()
            loss = model(next_batch(generator), generator)
            loss.backward()
            optimizer.step()
            losses.append(float(loss.detach()))
        engine = "torch (accelerate not installed)"
    if device == "cuda":
        torch.cuda.synchronize()
    times.append(time.perf_counter())
    timed = times[warmup:]
    per_second = (len(timed) - 1) / (timed[-1] - timed[0]) if len(timed) > 1 else math.nan
    return {
        "device": device,
        "engine": engine,
        "steps": steps,
        "batch": batch,
        "image_size": image_size,
        "frames": frames,
        "mixed_precision": mixed_precision,
        "steps_per_s": per_second,
        "videos_per_s": per_second * batch,
        "first_loss": losses[0],
        "last_loss": sum(losses[-5:]) / len(losses[-5:]),
        "peak_memory_mb": torch.cuda.max_memory_allocated() / 2**20 if device == "cuda" else math.nan,
    }


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--image-size", type=int, default=32)
    parser.add_argument("--frames", type=int, default=4)
    parser.add_argument("--mixed-precision", default="no", choices=("no", "bf16", "fp16"))
    parser.add_argument("--ema", type=float, default=0.0)
    parser.add_argument("--warmup", type=int, default=3)
    args = parser.parse_args(argv)
    if args.device == "cpu":
        torch.set_num_threads(1)
    result = run(args.device, args.steps, args.batch, args.image_size, args.frames, args.mixed_precision, args.ema, args.warmup)
    print(", ".join(f"{key} {value:.4g}" if isinstance(value, float) else f"{key} {value}" for key, value in result.items()))
    return result


if __name__ == "__main__":
    main()
