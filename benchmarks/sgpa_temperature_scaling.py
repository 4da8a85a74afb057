r"""SGPA followed by temperature scaling against temperature scaling alone, on clean and shifted test images,
paired by seed.

The set-up of ``benchmarks/sgpa_calibration_recipe.py`` (Fashion-MNIST, the small softmax ViT trained
``--epochs`` epochs, then ``2 x --fine-tune`` more epochs for every method):

* **softmax + TS**: the softmax network fine-tuned on cross-entropy, its logits divided by a temperature
  fitted on the validation images (:class:`gpytorch_sgpa.baselines.TemperatureScaling`);
* **SGPA + TS**: the README's recipe (kernel attention, cross-entropy, SGPA, ELBO;
  :func:`sgpa_calibration_recipe.fine_tune_recipe`), its predictive distribution
  :math:`\bar p = \frac1S \sum_s \operatorname{softmax}(\text{logits}_s)` (``--num-samples`` samples) tempered as
  :math:`\operatorname{softmax}(\log \bar p / T)`, :math:`T` fitted on the same validation images;
* and, for reference, the two untempered (**softmax**, **SGPA**).

Scored (accuracy, NLL, top-label ECE with 15 bins) on the first ``--test`` test images and on shifted
copies of them: for each ``--severities`` level, every corruption of
:data:`gpytorch_sgpa.data.CORRUPTIONS` (Gaussian noise, blur, contrast, rotation, pixelation) at that
severity, pooled into one split. Printed: each method per split, mean ± sd over seeds, then
SGPA + TS minus softmax + TS per seed (paired) with how many seeds SGPA + TS is better.

    python benchmarks/sgpa_temperature_scaling.py --seeds 0 1 2 --threads 1      # about 1.5 min a seed on one core
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import time

import torch
from sgpa_calibration_recipe import add_recipe_arguments, fine_tune_recipe, in_chunks, load_data, train
from sgpa_conversion import PatchViT

from gpytorch_sgpa import predict_proba
from gpytorch_sgpa.baselines import TemperatureScaling
from gpytorch_sgpa.data import CORRUPTIONS, corrupt
from gpytorch_sgpa.metrics import accuracy, calibration_errors, negative_log_likelihood

METRICS = ("accuracy", "nll", "ece")
HIGHER_IS_BETTER = {"accuracy": True, "nll": False, "ece": False}
METHODS = ("softmax", "softmax + TS", "SGPA", "SGPA + TS")


def scores(probs, labels) -> dict:
    return dict(
        accuracy=accuracy(probs, labels),
        nll=negative_log_likelihood(probs.clamp_min(1e-12), labels),
        ece=calibration_errors(probs, labels)[0],
    )


def tempered(probs_val, val_y, splits: dict) -> dict:
    r"""Each split's ``softmax(log p / T)`` with :math:`T` fitted on the validation predictions ``probs_val``; logits
    are :math:`\log p` (for a softmax network, its logits up to a constant per row)."""
    log = lambda probs: probs.double().clamp_min(1e-12).log()
    scaler = TemperatureScaling().fit(log(probs_val), val_y)
    return {name: scaler.predict_proba(log(probs)) for name, probs in splits.items()}, scaler.temperature


def shifted_splits(test_x, test_y, severities, seed) -> dict:
    """``{"test": (images, labels), "shift s": ...}``: each severity's corruptions pooled."""
    splits = {"test": (test_x, test_y)}
    for severity in severities:
        images = torch.cat([corrupt(test_x, name, severity, seed) for name in CORRUPTIONS])
        splits[f"shift {severity}"] = (images, test_y.repeat(len(CORRUPTIONS)))
    return splits


def run_seed(seed, data, splits, args) -> dict:
    """``{split: {method: {metric: value}}}`` of one seed, and the two temperatures."""
    train_x, train_y, val_x, val_y = data[:4]
    torch.manual_seed(seed)
    generator = torch.Generator().manual_seed(seed)
    start = time.perf_counter()
    trained = train(PatchViT(dropout=0.1), train_x, train_y, args.epochs, generator, args.lr)
    calibration = train_x[torch.randperm(len(train_y), generator=generator)[: args.calibration]]
    softmax = train(copy.deepcopy(trained), train_x, train_y, 2 * args.fine_tune, generator, args.lr)
    sgpa = fine_tune_recipe(trained, calibration, train_x, train_y, generator, args)
    predict = {
        "softmax": lambda images: in_chunks(lambda chunk: softmax(chunk).softmax(-1), images),
        "SGPA": lambda images: in_chunks(lambda chunk: predict_proba(sgpa, chunk, num_samples=args.num_samples), images),
    }
    probs = {method: {name: fn(images) for name, (images, _) in splits.items()} for method, fn in predict.items()}
    temperatures = {}
    for method, fn in predict.items():
        probs[f"{method} + TS"], temperatures[method] = tempered(fn(val_x), val_y, probs[method])
    results = {name: {method: scores(probs[method][name], labels) for method in METHODS} for name, (_, labels) in splits.items()}
    print(
        f"seed {seed}: {time.perf_counter() - start:.0f} s, temperature softmax {temperatures['softmax']:.2f}, "
        f"SGPA {temperatures['SGPA']:.2f}",
        flush=True,
    )
    return dict(results=results, temperatures=temperatures)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_recipe_arguments(parser)
    parser.add_argument("--val", type=int, default=1000)
    parser.add_argument("--severities", type=int, nargs="+", default=[2, 4], help="the shifted splits' severities (1-5)")
    parser.add_argument("--json", help="write the per-seed results to this file")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    data = load_data(args)
    splits = shifted_splits(data[4], data[5], args.severities, seed=0)
    per_seed = {seed: run_seed(seed, data, splits, args) for seed in args.seeds}
    if args.json:
        with open(args.json, "w") as file:
            json.dump({"args": vars(args), "torch": torch.__version__, "per_seed": per_seed}, file, indent=1)
    spread = lambda values: f"{statistics.mean(values):.3f} ± {statistics.stdev(values):.3f}" if len(values) > 1 else f"{values[0]:.3f}"
    print(
        f"\n{args.train} training images, {args.epochs} + {2 * args.fine_tune} epochs, {len(args.seeds)} seeds; "
        f"shifted splits: {', '.join(CORRUPTIONS)} pooled per severity; torch {torch.__version__}\n"
    )
    print("| split | method | accuracy | NLL | ECE |\n| --- | --- | --- | --- | --- |")
    for name in splits:
        for method in METHODS:
            cells = [spread([per_seed[s]["results"][name][method][m] for s in args.seeds]) for m in METRICS]
            print(f"| {name} | {method} | " + " | ".join(cells) + " |")
    print("\npaired: SGPA + TS minus softmax + TS per seed (SGPA + TS better in k of n seeds)\n")
    print("| split | accuracy | NLL | ECE |\n| --- | --- | --- | --- |")
    for name in splits:
        cells = []
        for metric in METRICS:
            split = [per_seed[s]["results"][name] for s in args.seeds]
            differences = [row["SGPA + TS"][metric] - row["softmax + TS"][metric] for row in split]
            wins = sum((d > 0) if HIGHER_IS_BETTER[metric] else (d < 0) for d in differences)
            cells.append(f"{spread(differences)} ({wins}/{len(differences)})")
        print(f"| {name} | " + " | ".join(cells) + " |")
    return per_seed


if __name__ == "__main__":
    main()
