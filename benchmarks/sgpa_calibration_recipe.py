"""Calibration of the documented conversion recipe against the usual fixes of a trained softmax network
and the baselines practitioners use, on Fashion-MNIST, paired by seed.

A small ViT (``nn.TransformerEncoder``, dropout 0.1; :class:`sgpa_conversion.PatchViT`) is trained with
softmax attention for ``--epochs`` epochs on a Fashion-MNIST subset (offline files, see
:func:`experiments.fashion_mnist.load_fashion_mnist`); then every method gets the same
``2 x --fine-tune`` further epochs:

* **softmax**: the softmax network trained on (cross-entropy);
* **softmax + TS**: the same network with a temperature fitted on a held-out validation subset
  (:class:`gpytorch_sgpa.baselines.TemperatureScaling`);
* **MC dropout**: the same network, ``--num-samples`` dropout masks at test time;
* **deep ensemble**: ``--ensemble-size`` softmax networks averaged (``EnsembleClassifier``): the softmax
  network above and ``K - 1`` more, each trained from its own initialisation and data order for the same
  ``--epochs + 2 x --fine-tune`` epochs (0 or 1: not run);
* **last-layer Laplace**: the softmax network with a Kronecker-factored Laplace posterior on its head, the
  prior precision by marginal likelihood on the training images, GLM predictive with the probit
  approximation (:class:`gpytorch_sgpa.baselines.laplace.LastLayerLaplace`; needs ``laplace-torch``, which
  probseq does not install: without it the row is not run and the run says so);
* **recipe + LoRA**: the recipe with LoRA (``gpytorch_sgpa.lora.get_peft_model``, rank ``--lora-rank``,
  ``lora_alpha = 2 x rank``, the head in ``modules_to_save``) in both stages: the kernel stage's adapter is
  merged (``merge_and_unload``) before the SGPA conversion, which gets an adapter of its own; embedding,
  feed-forward layers, norms and the attention's output projection stay frozen (0: not run);
* **recipe (SGPA)**: the README's route: ``convert(model, attention="kernel", calibration_inputs=batch)``,
  ``--fine-tune`` epochs of cross-entropy, ``convert(model, num_global=..., calibration_inputs=batch)``,
  ``--fine-tune`` epochs of the ELBO (``SGPAELBO`` defaults), ``predict_proba`` with ``--num-samples``.

Printed per method: test accuracy, NLL, ECE (15 bins), the AUROC of detecting MNIST digits (the
out-of-distribution set) by predictive entropy, mean ± sd over seeds, and the wall time of the method
after the shared softmax pre-training (its fine-tuning, fitting and test + OOD prediction; the deep
ensemble's includes its extra members' whole training); then each method minus the recipe, per seed
(paired), with how many seeds the recipe wins.  The methods added later (ensemble, Laplace, LoRA) draw
from their own seeds, so the first four methods' numbers do not depend on which of them run.

    python benchmarks/sgpa_calibration_recipe.py --seeds 0 1 2                  # about 2.3 min a seed on one core
    python benchmarks/sgpa_calibration_recipe.py --seeds 0 1 2 --preset long    # 20 fine-tuning epochs: 5-7 min a seed

(the deep ensemble takes most of it; without it, ``--ensemble-size 0``, the default preset takes 45 s a seed).
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import json
import statistics
import sys
import time
from pathlib import Path

import torch
from sgpa_conversion import PatchViT, _epoch

from gpytorch_sgpa import SGPAELBO, convert, predict_proba
from gpytorch_sgpa.baselines import EnsembleClassifier, TemperatureScaling, mc_dropout_predict_proba
from gpytorch_sgpa.baselines.laplace import LAPLACE_INSTALL, LastLayerLaplace
from gpytorch_sgpa.data.images import load_mnist_ood
from gpytorch_sgpa.metrics import accuracy, calibration_errors, negative_log_likelihood, ood_detection_scores

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: the experiments/ tree

from experiments.fashion_mnist import load_fashion_mnist

METRICS = ("accuracy", "nll", "ece", "ood_auroc")
HIGHER_IS_BETTER = {"accuracy": True, "nll": False, "ece": False, "ood_auroc": True}
RECIPE = "recipe (SGPA)"
#: ``--preset``: option defaults; ``long`` gives every method 2 x 10 = 20 fine-tuning epochs.
PRESETS = {"default": {}, "long": {"fine_tune": 10}}


def train(model, images, labels, epochs, generator, lr, batch_size=100, elbo=None):
    """``epochs`` of Adam on cross-entropy, or on the negative ELBO, with the conversion benchmark's epoch loop."""
    parameters = model.parameters() if elbo is None else elbo.parameters()
    optimizer = torch.optim.Adam([p for p in parameters if p.requires_grad], lr=lr)
    for _ in range(epochs):
        _epoch(model, images, labels, optimizer, generator, batch_size, elbo=elbo)
    return model.eval()


@torch.no_grad()
def in_chunks(predict, images):
    return torch.cat([predict(chunk) for chunk in images.split(500)])


def scores(probs, labels, probs_ood) -> dict:
    ece, _ = calibration_errors(probs, labels)
    auroc, _ = ood_detection_scores(probs, probs_ood)
    return dict(accuracy=accuracy(probs, labels), nll=negative_log_likelihood(probs.clamp_min(1e-12), labels), ece=ece, ood_auroc=auroc)


def fine_tune_recipe(trained, calibration, train_x, train_y, generator, args):
    """The README's recipe on a copy of the softmax network ``trained``: kernel attention, ``--fine-tune`` epochs of
    cross-entropy, SGPA, ``--fine-tune`` epochs of the ELBO (``SGPAELBO`` defaults)."""
    recipe = convert(copy.deepcopy(trained), attention="kernel", calibration_inputs=calibration)
    recipe = train(recipe, train_x, train_y, args.fine_tune, generator, args.lr)
    recipe = convert(recipe, num_global=args.num_global, calibration_inputs=calibration)
    return train(recipe, train_x, train_y, args.fine_tune, generator, args.lr, elbo=SGPAELBO(recipe, num_data=len(train_y)))


def load_data(args) -> tuple:
    """``(train_x, train_y, val_x, val_y, test_x, test_y, ood_x)``: ``--train`` and ``--val`` images of Fashion-MNIST's
    training set (one fixed draw), its first ``--test`` test images and as many MNIST digits."""
    images, labels = load_fashion_mnist("train")
    test_images, test_labels = load_fashion_mnist("test")
    ood, _ = load_mnist_ood()
    split = torch.randperm(len(labels), generator=torch.Generator().manual_seed(1234))
    train_i, val_i = split[: args.train], split[args.train : args.train + args.val]
    return (
        images[train_i].float(),
        labels[train_i],
        images[val_i].float(),
        labels[val_i],
        test_images[: args.test].float(),
        test_labels[: args.test],
        ood[: args.test].float(),
    )


def run_seed(seed, data, args) -> dict:
    """``{method: {metric: value, "seconds": wall time}}`` of one seed."""
    train_x, train_y, val_x, val_y, test_x, test_y, ood_x = data
    torch.manual_seed(seed)
    generator = torch.Generator().manual_seed(seed)
    start = time.perf_counter()
    trained = train(PatchViT(dropout=0.1), train_x, train_y, args.epochs, generator, args.lr)
    calibration = train_x[torch.randperm(len(train_y), generator=generator)[: args.calibration]]
    results = {}

    clock = time.perf_counter()
    softmax = train(copy.deepcopy(trained), train_x, train_y, 2 * args.fine_tune, generator, args.lr)
    softmax_seconds = time.perf_counter() - clock
    logits, logits_ood = in_chunks(softmax, test_x), in_chunks(softmax, ood_x)
    results["softmax"] = scores(logits.softmax(-1), test_y, logits_ood.softmax(-1))
    results["softmax"]["seconds"] = time.perf_counter() - clock
    clock = time.perf_counter()
    temperature = TemperatureScaling().fit(in_chunks(softmax, val_x), val_y).temperature
    results["softmax + TS"] = scores((logits / temperature).softmax(-1), test_y, (logits_ood / temperature).softmax(-1))
    results["softmax + TS"]["seconds"] = results["softmax"]["seconds"] + time.perf_counter() - clock
    clock = time.perf_counter()
    mc = lambda images: in_chunks(lambda chunk: mc_dropout_predict_proba(softmax, chunk, num_samples=args.num_samples), images)
    results["MC dropout"] = scores(mc(test_x), test_y, mc(ood_x))
    results["MC dropout"]["seconds"] = softmax_seconds + time.perf_counter() - clock

    clock = time.perf_counter()
    recipe = fine_tune_recipe(trained, calibration, train_x, train_y, generator, args)
    sgpa = lambda images: in_chunks(lambda chunk: predict_proba(recipe, chunk, num_samples=args.num_samples), images)
    recipe_scores = scores(sgpa(test_x), test_y, sgpa(ood_x))
    recipe_scores["seconds"] = time.perf_counter() - clock

    if args.ensemble_size > 1:
        clock = time.perf_counter()
        members = [softmax]
        for k in range(1, args.ensemble_size):  # each member: its own initialisation, dropout and data order
            torch.manual_seed(seed + 1000 * k)
            member_generator = torch.Generator().manual_seed(seed + 1000 * k)
            member = train(PatchViT(dropout=0.1), train_x, train_y, args.epochs, member_generator, args.lr)
            members.append(train(member, train_x, train_y, 2 * args.fine_tune, member_generator, args.lr))
        ensemble = EnsembleClassifier(members)
        results[f"deep ensemble ({args.ensemble_size})"] = scores(
            in_chunks(ensemble.predict_proba, test_x), test_y, in_chunks(ensemble.predict_proba, ood_x)
        )
        results[f"deep ensemble ({args.ensemble_size})"]["seconds"] = softmax_seconds + time.perf_counter() - clock

    if args.laplace:
        clock = time.perf_counter()
        laplace = LastLayerLaplace(softmax, hessian_structure="kron", last_layer_name="head").fit(train_x, train_y)
        results["last-layer Laplace"] = scores(laplace.predict_proba(test_x), test_y, laplace.predict_proba(ood_x))
        results["last-layer Laplace"]["seconds"] = softmax_seconds + time.perf_counter() - clock
        results["last-layer Laplace"]["prior_precision"] = laplace.prior_precision

    if args.lora_rank > 0:
        from sgpa_peft import lora_recipe_stage

        clock = time.perf_counter()
        torch.manual_seed(seed + 30000)
        lora_generator = torch.Generator().manual_seed(seed + 30000)
        tune = lambda model, elbo=None: train(model, train_x, train_y, args.fine_tune, lora_generator, args.lr, elbo=elbo)
        kernel = convert(copy.deepcopy(trained), attention="kernel", calibration_inputs=calibration)
        kernel, _ = lora_recipe_stage(kernel, tune, args.lora_rank, ["head"])
        adapted, trainable = lora_recipe_stage(
            convert(kernel.merge_and_unload(), num_global=args.num_global, calibration_inputs=calibration),
            tune,
            args.lora_rank,
            ["head"],
            elbo_data=len(train_y),
        )
        lora = lambda images: in_chunks(lambda chunk: predict_proba(adapted, chunk, num_samples=args.num_samples), images)
        results["recipe + LoRA"] = scores(lora(test_x), test_y, lora(ood_x))
        results["recipe + LoRA"]["seconds"] = time.perf_counter() - clock
        results["recipe + LoRA"]["trainable"] = trainable
        recipe_scores["trainable"] = sum(p.numel() for p in recipe.parameters())

    results[RECIPE] = recipe_scores
    print(
        f"seed {seed}: {time.perf_counter() - start:.0f} s, temperature {temperature:.2f}"
        + (f", Laplace prior precision {results['last-layer Laplace']['prior_precision']:.3g}" if args.laplace else ""),
        flush=True,
    )
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
    parser.add_argument(
        "--preset", choices=sorted(PRESETS), default="default", help="long: --fine-tune 10, i.e. 2 x 10 = 20 fine-tuning epochs per method"
    )
    parser.add_argument("--ensemble-size", type=int, default=5, help="deep-ensemble members (0 or 1: not run)")
    parser.add_argument("--lora-rank", type=int, default=8, help="rank of the recipe + LoRA run (0: not run)")
    parser.add_argument(
        "--no-laplace",
        dest="laplace",
        action="store_false",
        help="skip the last-layer Laplace baseline (skipped anyway without laplace-torch)",
    )
    parser.add_argument("--json", help="write the per-seed results to this file")
    preset, _ = parser.parse_known_args(argv)
    parser.set_defaults(**PRESETS[preset.preset])
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.laplace and importlib.util.find_spec("laplace") is None:
        print(f"last-layer Laplace: not run, laplace-torch is not installed ({LAPLACE_INSTALL})")
        args.laplace = False
    data = load_data(args)
    per_seed = {seed: run_seed(seed, data, args) for seed in args.seeds}
    if args.json:
        with open(args.json, "w") as file:
            json.dump({"args": vars(args), "torch": torch.__version__, "results": per_seed}, file, indent=1)
    methods = list(next(iter(per_seed.values())))
    spread = lambda values: f"{statistics.mean(values):.3f} ± {statistics.stdev(values):.3f}" if len(values) > 1 else f"{values[0]:.3f}"
    seconds = lambda values: f"{statistics.mean(values):.0f} ± {statistics.stdev(values):.0f}" if len(values) > 1 else f"{values[0]:.0f}"
    print(
        f"\n{args.train} training images, {len(args.seeds)} seeds, {args.epochs} + {2 * args.fine_tune} epochs"
        f" (preset {args.preset}), torch {torch.__version__}\n"
    )
    print("| method | accuracy | NLL | ECE | OOD AUROC (MNIST) | wall time (s) |\n| --- | --- | --- | --- | --- | --- |")
    for method in methods:
        print(
            f"| {method} | "
            + " | ".join(spread([per_seed[s][method][m] for s in args.seeds]) for m in METRICS)
            + f" | {seconds([per_seed[s][method]['seconds'] for s in args.seeds])} |"
        )
    if "recipe + LoRA" in methods:
        trainable = per_seed[args.seeds[0]]
        print(
            f"\nrecipe + LoRA trains {trainable['recipe + LoRA']['trainable']:,} parameters in its SGPA stage, "
            f"the recipe {trainable[RECIPE]['trainable']:,}"
        )
    print("\npaired: method minus recipe per seed (recipe better in k of n seeds)\n")
    print("| method | accuracy | NLL | ECE | OOD AUROC |\n| --- | --- | --- | --- | --- |")
    for method in methods[:-1]:
        cells = []
        for metric in METRICS:
            differences = [per_seed[s][method][metric] - per_seed[s][RECIPE][metric] for s in args.seeds]
            wins = sum((d < 0) if HIGHER_IS_BETTER[metric] else (d > 0) for d in differences)
            cells.append(f"{spread(differences)} ({wins}/{len(differences)})")
        print(f"| {method} | " + " | ".join(cells) + " |")
    return per_seed


if __name__ == "__main__":
    main()
