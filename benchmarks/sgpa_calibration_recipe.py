"""Calibration of the documented conversion recipe against the usual fixes of a trained softmax network,
on Fashion-MNIST, paired by seed.

A small ViT (``nn.TransformerEncoder``, dropout 0.1; :class:`sgpa_conversion.PatchViT`) is trained with
softmax attention for ``--epochs`` epochs on a Fashion-MNIST subset (offline files, see
:func:`gpytorch_sgpa.data.images.load_fashion_mnist`); then every method gets the same
``2 x --fine-tune`` further epochs:

* **softmax**: the softmax network trained on (cross-entropy);
* **softmax + TS**: the same network with a temperature fitted on a held-out validation subset
  (:class:`gpytorch_sgpa.baselines.TemperatureScaling`);
* **MC dropout**: the same network, ``--num-samples`` dropout masks at test time;
* **recipe (SGPA)**: the README's route: ``convert(model, attention="kernel", calibration_inputs=batch)``,
  ``--fine-tune`` epochs of cross-entropy, ``convert(model, num_global=..., calibration_inputs=batch)``,
  ``--fine-tune`` epochs of the ELBO (``SGPAELBO`` defaults), ``predict_proba`` with ``--num-samples``.

Printed per method: test accuracy, NLL, ECE (15 bins) and the AUROC of detecting MNIST digits
(the out-of-distribution set) by predictive entropy, mean ± sd over seeds; then each baseline minus
the recipe, per seed (paired), with how many seeds the recipe wins.

    python benchmarks/sgpa_calibration_recipe.py --seeds 0 1 2      # about 5 minutes on one core
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time

import torch
from sgpa_conversion import PatchViT, _epoch

from gpytorch_sgpa import SGPAELBO, convert, predict_proba
from gpytorch_sgpa.baselines import TemperatureScaling, mc_dropout_predict_proba
from gpytorch_sgpa.data.images import load_fashion_mnist, load_mnist_ood
from gpytorch_sgpa.metrics import accuracy, calibration_errors, negative_log_likelihood, ood_detection_scores

METRICS = ("accuracy", "nll", "ece", "ood_auroc")
HIGHER_IS_BETTER = {"accuracy": True, "nll": False, "ece": False, "ood_auroc": True}


def train(model, images, labels, epochs, generator, lr, batch_size=100, elbo=None):
    """``epochs`` of Adam on cross-entropy, or on the negative ELBO, with the conversion benchmark's epoch loop."""
    optimizer = torch.optim.Adam(model.parameters() if elbo is None else elbo.parameters(), lr=lr)
    for _ in range(epochs):
        _epoch(model, images, labels, optimizer, generator, batch_size, elbo=elbo)
    return model.eval()


@torch.no_grad()
def in_chunks(predict, images):
    return torch.cat([predict(chunk) for chunk in images.split(500)])


def scores(probs, labels, probs_ood) -> dict:
    ece, _ = calibration_errors(probs, labels)
    auroc, _ = ood_detection_scores(probs, probs_ood)
    return dict(accuracy=accuracy(probs, labels), nll=negative_log_likelihood(probs.clamp_min(1e-12), labels), ece=ece,
                ood_auroc=auroc)


def run_seed(seed, data, args) -> dict:
    train_x, train_y, val_x, val_y, test_x, test_y, ood_x = data
    torch.manual_seed(seed)
    generator = torch.Generator().manual_seed(seed)
    start = time.perf_counter()
    trained = train(PatchViT(dropout=0.1), train_x, train_y, args.epochs, generator, args.lr)
    calibration = train_x[torch.randperm(len(train_y), generator=generator)[: args.calibration]]
    results = {}

    softmax = train(copy.deepcopy(trained), train_x, train_y, 2 * args.fine_tune, generator, args.lr)
    logits, logits_ood = in_chunks(softmax, test_x), in_chunks(softmax, ood_x)
    results["softmax"] = scores(logits.softmax(-1), test_y, logits_ood.softmax(-1))
    temperature = TemperatureScaling().fit(in_chunks(softmax, val_x), val_y).temperature
    results["softmax + TS"] = scores((logits / temperature).softmax(-1), test_y, (logits_ood / temperature).softmax(-1))
    mc = lambda images: in_chunks(lambda chunk: mc_dropout_predict_proba(softmax, chunk, num_samples=args.num_samples), images)
    results["MC dropout"] = scores(mc(test_x), test_y, mc(ood_x))

    recipe = convert(copy.deepcopy(trained), attention="kernel", calibration_inputs=calibration)
    recipe = train(recipe, train_x, train_y, args.fine_tune, generator, args.lr)
    recipe = convert(recipe, num_global=args.num_global, calibration_inputs=calibration)
    recipe = train(recipe, train_x, train_y, args.fine_tune, generator, args.lr, elbo=SGPAELBO(recipe, num_data=len(train_y)))
    sgpa = lambda images: in_chunks(lambda chunk: predict_proba(recipe, chunk, num_samples=args.num_samples), images)
    results["recipe (SGPA)"] = scores(sgpa(test_x), test_y, sgpa(ood_x))
    print(f"seed {seed}: {time.perf_counter() - start:.0f} s, temperature {temperature:.2f}", flush=True)
    return results


def add_recipe_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of a run of the recipe on Fashion-MNIST, shared with ``sgpa_kl_weight.py``."""
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--train", type=int, default=6000)
    parser.add_argument("--test", type=int, default=2000)
    parser.add_argument("--epochs", type=int, default=5, help="softmax training epochs before conversion")
    parser.add_argument("--fine-tune", type=int, default=3, help="epochs per recipe stage")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--num-global", type=int, default=16)
    parser.add_argument("--num-samples", type=int, default=10)
    parser.add_argument("--calibration", type=int, default=500, help="images in the calibration batch")
    parser.add_argument("--threads", type=int, default=1)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_recipe_arguments(parser)
    parser.add_argument("--val", type=int, default=1000)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    images, labels = load_fashion_mnist("train")
    test_images, test_labels = load_fashion_mnist("test")
    ood, _ = load_mnist_ood()
    split = torch.randperm(len(labels), generator=torch.Generator().manual_seed(1234))
    train_i, val_i = split[: args.train], split[args.train : args.train + args.val]
    data = (images[train_i].float(), labels[train_i], images[val_i].float(), labels[val_i],
            test_images[: args.test].float(), test_labels[: args.test], ood[: args.test].float())
    per_seed = {seed: run_seed(seed, data, args) for seed in args.seeds}
    methods = list(next(iter(per_seed.values())))
    spread = lambda values: f"{statistics.mean(values):.3f} ± {statistics.stdev(values):.3f}" if len(values) > 1 else f"{values[0]:.3f}"
    print(f"\n{args.train} training images, {len(args.seeds)} seeds, {args.epochs} + {2 * args.fine_tune} epochs\n")
    print("| method | accuracy | NLL | ECE | OOD AUROC (MNIST) |\n| --- | --- | --- | --- | --- |")
    for method in methods:
        print(f"| {method} | " + " | ".join(spread([per_seed[s][method][m] for s in args.seeds]) for m in METRICS) + " |")
    print("\npaired: baseline minus recipe per seed (recipe better in k of n seeds)\n")
    print("| baseline | accuracy | NLL | ECE | OOD AUROC |\n| --- | --- | --- | --- | --- |")
    for method in methods[:-1]:
        cells = []
        for metric in METRICS:
            differences = [per_seed[s][method][metric] - per_seed[s]["recipe (SGPA)"][metric] for s in args.seeds]
            wins = sum((d < 0) if HIGHER_IS_BETTER[metric] else (d > 0) for d in differences)
            cells.append(f"{spread(differences)} ({wins}/{len(differences)})")
        print(f"| {method} | " + " | ".join(cells) + " |")
    return per_seed


if __name__ == "__main__":
    main()
