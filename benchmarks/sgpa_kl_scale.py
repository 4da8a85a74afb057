r"""The KL of SGPA at model scale: a ViT-B-sized encoder converted to SGPA, its KL per sequence and per
token, and what weighting keeps it from dominating fine-tuning.

A ViT-B/16 layout (224 x 224 images, 197 tokens, width 768, 12 heads, 12 layers) built from
``nn.TransformerEncoder`` (random weights: a trained network's values differ, so the figures are
orders of magnitude, not a prediction), converted by :func:`gpytorch_sgpa.convert` to kernel attention
and then to SGPA (orthogonal, ``--num-global`` global keys per head).  Printed, from one forward
pass under :func:`gpytorch_sgpa.posterior_mean`:

* the KL per sequence (global part and amortised part) and per token;
* the same with every layer's kernel output scale ``σ_f²`` multiplied by ``c`` and its value
  projection divided by ``c``: the posterior mean is unchanged (``m = σ_f² K̃ v_a``), the amortised
  KL ``½ v_aᵀ B v_a`` falls as ``1/c``;
* for ImageNet (1.28 M images, 1,000 classes) and Fashion-MNIST (60,000, 10 classes), the KL term
  per image under ``SGPAELBO``'s default ``kl_weighting="all-over-n"`` (``KL / N``) against the
  cross-entropy of a uniform prediction, ``log C``, and the ``beta`` that brings it to 10 % of it.

    python benchmarks/sgpa_kl_scale.py              # ViT-B/16 layout, batch of 2 (a minute on one core)
    python benchmarks/sgpa_kl_scale.py --layers 2   # a quick look
"""

from __future__ import annotations

import argparse
import math
import time

import torch
from torch import nn

import gpytorch_sgpa


class ViT(nn.Module):
    """A plain ViT on ``nn.TransformerEncoder`` (pre-norm, class token), as users build one."""

    def __init__(self, width: int, heads: int, layers: int, image_size: int = 224, patch: int = 16, classes: int = 1000):
        super().__init__()
        self.patches = nn.Conv2d(3, width, patch, patch)
        tokens = (image_size // patch) ** 2 + 1
        self.cls = nn.Parameter(torch.zeros(1, 1, width))
        self.position = nn.Parameter(0.02 * torch.randn(1, tokens, width))
        layer = nn.TransformerEncoderLayer(width, heads, 4 * width, dropout=0.0, batch_first=True, norm_first=True, activation="gelu")
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Sequential(nn.LayerNorm(width), nn.Linear(width, classes))

    def forward(self, images):
        x = self.patches(images).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], 1) + self.position
        return self.head(self.encoder(x)[:, 0])


def kl_terms(model, images) -> tuple[float, float, torch.Tensor]:
    """``(total KL, global KL)`` per sequence and the logits, from one posterior-mean pass."""
    with torch.no_grad(), gpytorch_sgpa.posterior_mean():
        logits = model(images)
        return float(gpytorch_sgpa.kl_divergence(model)), float(gpytorch_sgpa.global_kl_divergence(model)), logits


def rescale(model, factor: float) -> None:
    """``σ_f² -> c σ_f²`` and ``W_v, b_v -> (W_v, b_v) / c`` in every SGPA layer: the same posterior mean."""
    for layer in model.modules():
        if isinstance(layer, gpytorch_sgpa.SGPAttention):
            with torch.no_grad():
                layer.kernel.outputscale = layer.kernel.outputscale * factor
                layer.v_proj.weight /= factor
                if layer.v_proj.bias is not None:
                    layer.v_proj.bias /= factor


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--width", type=int, default=768)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--num-global", type=int, default=32)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    start = time.perf_counter()
    model = ViT(args.width, args.heads, args.layers).eval()
    images = torch.randn(args.batch, 3, 224, 224)
    gpytorch_sgpa.convert(model, attention="kernel")
    gpytorch_sgpa.convert(model, num_global=args.num_global)
    tokens = (224 // 16) ** 2 + 1
    print(
        f"ViT: width {args.width}, {args.heads} heads, {args.layers} layers, {tokens} tokens, "
        f"{sum(p.numel() for p in model.parameters()) / 1e6:.1f} M parameters, {args.num_global} global keys per head"
    )
    print(
        "\n| σ_f² scale c | KL per sequence | global | amortised | amortised per token | "
        "max |Δ logits| vs c = 1 |\n| --- | --- | --- | --- | --- | --- |"
    )
    rows, reference, applied = {}, None, 1.0
    for factor in (1.0, 10.0, 100.0):
        rescale(model, factor / applied)
        applied = factor
        total, global_kl, logits = kl_terms(model, images)
        reference = logits if reference is None else reference
        amortised = total - global_kl
        rows[factor] = total
        print(
            f"| {factor:g} | {total:.3g} | {global_kl:.3g} | {amortised:.3g} | {amortised / tokens:.3g} | "
            f"{(logits - reference).abs().max():.1e} |"
        )
    print("\nKL term per image under kl_weighting='all-over-n' (KL / N) against log C, and the beta that makes it 10 % of log C (c = 1):")
    print("| data | N | classes | KL / N | log C | beta for 10 % |\n| --- | --- | --- | --- | --- | --- |")
    for name, count, classes in (("ImageNet", 1_281_167, 1000), ("Fashion-MNIST", 60_000, 10)):
        per_image = rows[1.0] / count
        print(
            f"| {name} | {count:,} | {classes} | {per_image:.3g} | {math.log(classes):.2f} | "
            f"{min(1.0, 0.1 * math.log(classes) / per_image):.2g} |"
        )
    print(f"\n({time.perf_counter() - start:.0f} s)")
    return rows


if __name__ == "__main__":
    main()
