r"""When does SGPA's KL dominate fine-tuning, and which ``SGPAELBO`` setting keeps it from doing so?

Under ``kl_weighting="all-over-n"`` a converted model's objective per sequence is
``ELL - β KL / N``.  What decides whether the KL term dominates is its size at the start of
fine-tuning against a prediction's cross-entropy, the ratio

``R = KL₀ / (N log C)``

(``KL₀``: the model's KL per sequence right after conversion; ``log C``: the cross-entropy of a
uniform prediction over ``C`` classes).  A ViT-B/16 converted from kernel attention has
``KL₀ ≈ 8.4e7`` nats (``benchmarks/sgpa_kl_scale.py``): ``R ≈ 10`` on ImageNet (1.28 M images) and
``R ≈ 700`` on a 50,000-image, 10-class fine-tuning set.  That model does not fine-tune on this
machine; this script reproduces the ratio on the small Fashion-MNIST ViT of
``benchmarks/sgpa_conversion.py``, whose own ``R`` is about 4 at 6,000 images, by giving the ELBO
``num_data = KL₀ / (R log C)`` (the data, the steps and everything else unchanged), and compares at
each ``R``:

* ``β = 1`` (the default);
* ``anneal``: ``anneal_steps`` = every fine-tuning step (β rises linearly from 0 to 1);
* ``β = "auto"`` (``SGPAELBO(beta="auto")``): ``β = min(1, 0.1 log C · N / KL)`` at the first step,
  which puts the KL term at 10 % of ``log C`` whatever ``R``;
* ``β = 0`` (likelihood only) and the kernel network the SGPA model starts from, for reference.

Recipe before the comparison (the README's): softmax training, ``convert(attention="kernel",
calibration_inputs=...)``, cross-entropy fine-tuning, ``convert(num_global=...,
calibration_inputs=...)``; then ``--fine-tune`` ELBO epochs per setting.  Printed: test accuracy,
NLL and ECE (``--num-samples`` posterior samples), and the KL per sequence at the end, mean ± sd
over seeds.

    python benchmarks/sgpa_kl_weight.py --seeds 0 1 2      # about 8 minutes on one core
"""

from __future__ import annotations

import argparse
import copy
import math
import statistics
import sys
import time
from pathlib import Path

import torch
from sgpa_calibration_recipe import add_recipe_arguments, in_chunks, train
from sgpa_conversion import PatchViT

from gpytorch_sgpa import SGPAELBO, convert, kl_divergence, predict_proba
from gpytorch_sgpa.metrics import accuracy, calibration_errors, negative_log_likelihood

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: the experiments/ tree

from experiments.fashion_mnist import load_fashion_mnist

NUM_CLASSES = 10


@torch.no_grad()
def initial_kl(model, images) -> float:
    """The model's KL per sequence (batch mean) on ``images``, in training mode (as the ELBO sees it)."""
    model.train()
    model(images)
    value = float(kl_divergence(model))
    model.eval()
    return value


def evaluate(model, images, labels, num_samples, sgpa=True) -> dict:
    predict = (lambda chunk: predict_proba(model, chunk, num_samples=num_samples)) if sgpa else (lambda chunk: model(chunk).softmax(-1))
    probs = in_chunks(predict, images)
    return dict(
        accuracy=accuracy(probs, labels),
        nll=negative_log_likelihood(probs.clamp_min(1e-12), labels),
        ece=calibration_errors(probs, labels)[0],
    )


def run_seed(seed, data, args) -> dict:
    train_x, train_y, test_x, test_y = data
    torch.manual_seed(seed)
    generator = torch.Generator().manual_seed(seed)
    start = time.perf_counter()
    softmax = train(PatchViT(), train_x, train_y, args.epochs, generator, args.lr)
    calibration = train_x[torch.randperm(len(train_y), generator=generator)[: args.calibration]]
    kernel = convert(softmax, attention="kernel", calibration_inputs=calibration)
    kernel = train(kernel, train_x, train_y, args.fine_tune, generator, args.lr)
    results = {"kernel network (start)": {**evaluate(kernel, test_x, test_y, 1, sgpa=False), "kl": None}}
    torch.manual_seed(seed)
    start_model = convert(copy.deepcopy(kernel), num_global=args.num_global, calibration_inputs=calibration)
    kl0 = initial_kl(start_model, train_x[:500])
    steps = args.fine_tune * math.ceil(len(train_y) / 100)
    own_ratio = kl0 / (len(train_y) * math.log(NUM_CLASSES))
    settings = [("β = 1, the data's own R", len(train_y), 1.0, 0), ("β = 'auto', the data's own R", len(train_y), "auto", 0)]
    for ratio in args.ratios:
        num_data = max(1, round(kl0 / (ratio * math.log(NUM_CLASSES))))
        settings += [
            (f"β = 1, R = {ratio:g}", num_data, 1.0, 0),
            (f"anneal, R = {ratio:g}", num_data, 1.0, steps),
            (f"β = 'auto', R = {ratio:g}", num_data, "auto", 0),
        ]
    settings.append(("β = 0", len(train_y), 0.0, 0))
    for name, num_data, beta, anneal_steps in settings:
        torch.manual_seed(seed)
        fine_tune_generator = torch.Generator().manual_seed(seed + 1000)
        model = copy.deepcopy(start_model)
        elbo = SGPAELBO(model, num_data=num_data, beta=beta, anneal_steps=anneal_steps)
        model = train(model, train_x, train_y, args.fine_tune, fine_tune_generator, args.lr, elbo=elbo)
        results[name] = {**evaluate(model, test_x, test_y, args.num_samples), "kl": initial_kl(model, train_x[:500])}
    print(
        f"seed {seed}: KL0 = {kl0:.4g} nats per sequence (R = {own_ratio:.2f} at N = {len(train_y)}), {time.perf_counter() - start:.0f} s",
        flush=True,
    )
    return results


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_recipe_arguments(parser)
    parser.add_argument(
        "--ratios",
        type=float,
        nargs="+",
        default=[10.0, 100.0, 700.0],
        help="KL₀ / (N log C) to reproduce (ViT-B: about 10 on ImageNet, 700 on 50,000 images)",
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    images, labels = load_fashion_mnist("train")
    test_images, test_labels = load_fashion_mnist("test")
    data = (images[: args.train].float(), labels[: args.train], test_images[: args.test].float(), test_labels[: args.test])
    per_seed = {seed: run_seed(seed, data, args) for seed in args.seeds}
    spread = lambda values: (
        "-"
        if None in values
        else f"{statistics.mean(values):.3g} ± {statistics.stdev(values):.2g}"
        if len(values) > 1
        else f"{values[0]:.3g}"
    )
    print(f"\n{args.train} training images, {len(args.seeds)} seeds, {args.fine_tune} ELBO epochs per setting\n")
    print("| setting | accuracy | NLL | ECE | KL per sequence at the end |\n| --- | --- | --- | --- | --- |")
    names = list(per_seed[args.seeds[0]])
    for name in names:
        cells = [spread([per_seed[s][name][m] for s in args.seeds]) for m in ("accuracy", "nll", "ece", "kl")]
        print(f"| {name} | " + " | ".join(cells) + " |")
    return per_seed


if __name__ == "__main__":
    main()
