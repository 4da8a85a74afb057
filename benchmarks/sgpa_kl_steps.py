r"""SGPA's KL per sequence against ELBO steps with the thesis's set-up, split into the global covariance's
part and the rest.

The calibration runner's ``--preset thesis`` (thesis App. B.4 and the SGPA authors' code: each
sequence's KL weighed by 1, annealed from 0 over the first half of the ELBO updates; ``M_g`` by the
thesis's rule; the authors' kernel and variational initialisation; Adam 5e-4 → 1e-5 after a 1 % warm-up,
a new Adam every epoch), on the runner's task (``--dataset fashion_mnist``: 8,000 training images,
batch 100, 80 updates per epoch). As in the runner, the SGPA network (decoupled, orthogonal) starts
from the ``mle-kernel`` network after ``--mle-init-epochs`` of ``--epochs`` epochs and trains the rest
with the ELBO. At every ELBO update the training batch's KL per sequence is recorded, as the ELBO
sees it, with its parts:

* **global covariance**: :math:`\sum \mathrm{KL}(\mathcal N(0, S_g) \,\|\, \mathcal N(0, K_{gg}))` over layers, heads
  and output dimensions (:func:`global_covariance_kl`), which whitened is
  :math:`\tfrac12 \sum [\lVert C \rVert_F^2 - \log\lvert C C^\top \rvert - M_g]`: it depends on :math:`C` alone;
* **global mean**: the rest of the global inducing variables' KL
  (:func:`gpytorch_sgpa.global_kl_divergence`), :math:`\tfrac12 \sum \gamma^2 \lVert L^\top v_g \rVert^2`;
* **amortised**: the rest of the total (:func:`gpytorch_sgpa.kl_divergence`), the per-sequence part;

and the KL weight and the cross-entropy. Writes the plot (``--out``, log-scale steps) and the
per-update record (``--json``); prints the values at log-spaced steps.

    python benchmarks/sgpa_kl_steps.py --threads 1 --seed 0 --epochs 100 --mle-init-epochs 20 \
        --out docs/figures/sgpa/kl_steps.png --json kl_steps.json     # 6,400 ELBO updates, about 7.5 min on one core

(the schedule of the chapter-3 runs at 100 epochs; ``--epochs 8 --mle-init-epochs 2``: that of the 8-epoch runs).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import torch

from gpytorch_sgpa import SGPAELBO, global_kl_divergence
from gpytorch_sgpa.attention import SGPAttention
from gpytorch_sgpa.baselines import predict_proba
from gpytorch_sgpa.metrics import accuracy

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: the experiments/ tree

from experiments.sgpa.calibration import build_network, load_task, make_config
from experiments.sgpa.training import predict_in_batches, train_classifier

PARTS = ("kl", "global_covariance", "global_mean", "amortised")


def global_covariance_kl(model: torch.nn.Module) -> torch.Tensor:
    r"""The global covariances' part of the KL, summed over the decoupled SGPA layers of ``model`` (whitened
    :math:`S_g = L C C^\top L^\top`, :math:`L L^\top = K_{gg}`), heads and output dimensions:

    .. math:: \mathrm{KL}(\mathcal N(0, S_g) \,\|\, \mathcal N(0, K_{gg})) = \tfrac12 \big[\lVert C \rVert_F^2
        - \log\lvert C C^\top \rvert - M_g\big]

    per head and output dimension (times the head width for a shared covariance), in float64.

    :param model: a module holding decoupled :class:`~gpytorch_sgpa.attention.SGPAttention` layers with
        ``whitened=True``.
    """
    total = torch.zeros((), dtype=torch.float64)
    for layer in model.modules():
        if not isinstance(layer, SGPAttention) or layer.mode != "decoupled":
            continue
        if not layer.whitened:
            raise ValueError("global_covariance_kl needs whitened layers (S_g = L C Cᵀ Lᵀ); build them with whitened=True")
        factor = layer.global_cov_factor(torch.float64)  # C, (H, e or 1, M, M)
        per_dimension = factor.square().sum() - 2.0 * layer.global_chol_log_diag.double().sum() - factor.shape[:-1].numel()
        total = total + 0.5 * per_dimension * (layer.head_dim if layer.share_covariance else 1)
    return total


class RecordedELBO(torch.nn.Module):
    """``elbo`` unchanged, recording at each training call the batch's KL per sequence and its parts (:data:`PARTS`),
    the KL weight and the cross-entropy (before the update that call's loss makes)."""

    def __init__(self, elbo: SGPAELBO):
        super().__init__()
        self.elbo = elbo
        self.rows: list[dict] = []

    def forward(self, logits, kl, labels):
        weight = self.elbo.kl_weight
        value = self.elbo(logits, kl, labels)
        if self.elbo.model.training:
            with torch.no_grad():
                total, global_part = float(kl), float(global_kl_divergence(self.elbo.model))
                covariance = float(global_covariance_kl(self.elbo.model))
                cross_entropy = -float(self.elbo.expected_log_likelihood(logits, labels).mean())
            self.rows.append(
                dict(
                    step=len(self.rows),
                    kl=total,
                    global_covariance=covariance,
                    global_mean=global_part - covariance,
                    amortised=total - global_part,
                    kl_weight=weight,
                    cross_entropy=cross_entropy,
                )
            )
        return value


def run(args) -> dict:
    """Train the MLE initialisation and the SGPA network of one seed; ``{"rows": per-update record, ...}``."""
    torch.set_num_threads(args.threads)
    sizes = dict(epochs=args.epochs, mle_init_epochs=args.mle_init_epochs, train_size=args.train_size, val_size=args.val_size)
    config = make_config("thesis", **sizes, test_size=args.val_size, ood_size=args.val_size)
    task = load_task(args.dataset, config, args.seed)
    options = dict(
        batch_size=config.batch_size,
        lr=config.lr,
        lr_final=config.lr_final,
        warmup_fraction=config.lr_warmup_fraction,
        restart_optimizer_each_epoch=config.restart_optimizer,
        seed=args.seed,
        progress=False,
    )
    start = time.perf_counter()
    torch.manual_seed(args.seed)  # as the runner: the MLE network's first epochs, with the schedule of all of them
    model = build_network(task, "sgpa", config)
    if config.mle_init_epochs > 0:
        torch.manual_seed(args.seed)
        mle = build_network(task, "mle-kernel", config)
        train_classifier(mle, task.train, epochs=config.epochs, stop_after=config.mle_init_epochs, **options)
        torch.manual_seed(args.seed)
        model = build_network(task, "sgpa", config)
        model.load_state_dict(mle.state_dict(), strict=False)
    elbo_epochs = config.epochs - config.mle_init_epochs
    updates = elbo_epochs * math.ceil(len(task.train) / config.batch_size)
    elbo = SGPAELBO(
        model,
        num_data=len(task.train),
        beta=config.beta,
        anneal_steps=round(config.kl_anneal_fraction * updates),
        kl_weighting=config.kl_weighting,
    )
    recorded = RecordedELBO(elbo)
    train_classifier(model, task.train, epochs=elbo_epochs, elbo=recorded, **options)
    probs, _ = predict_in_batches(lambda x, **kw: predict_proba(model.eval(), x, num_samples=10, **kw), task.val, config.batch_size)
    return dict(
        args=vars(args),
        torch=torch.__version__,
        num_global=model.layers[0].attention.num_global,
        updates=updates,
        validation_accuracy=accuracy(probs.double(), task.val.labels),
        seconds=time.perf_counter() - start,
        rows=recorded.rows,
    )


def log_spaced(last: int) -> list[int]:
    """Steps 0, 1, 3, 10, 30, 100, ... up to ``last``, and ``last``."""
    steps = [0] + [m * 10**k for k in range(7) for m in (1, 3) if m * 10**k < last]
    return steps + [last]


def plot(result: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["rows"]
    steps = [row["step"] + 1 for row in rows]  # updates made after this batch's
    figure, axis = plt.subplots(figsize=(6.4, 4.0))
    labels = {"kl": "total", "global_covariance": "global covariance", "global_mean": "global mean", "amortised": "amortised"}
    for part, label in labels.items():
        axis.plot(steps, [max(row[part], 1e-3) for row in rows], label=label, linewidth=1.2)
    axis.plot(steps, [row["cross_entropy"] for row in rows], label="cross-entropy", color="grey", linewidth=0.8)
    full = next((row["step"] + 1 for row in rows if row["kl_weight"] >= 1.0), None)
    if full is not None:
        axis.axvline(full, color="black", linestyle=":", linewidth=0.8, label="KL weight reaches 1")
    axis.set_xscale("log")
    axis.set_yscale("log")
    axis.set_ylim(bottom=0.1)  # below it the amortised part is rounding noise
    axis.set_xlabel("ELBO updates")
    axis.set_ylabel("nats per sequence")
    axis.set_title(
        f"SGPA's KL with the thesis's set-up ({result['args']['dataset']}, seed {result['args']['seed']}, M_g = {result['num_global']})",
        fontsize=9,
    )
    axis.legend(fontsize=8)
    axis.grid(True, which="major", alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset", choices=("fashion_mnist", "digits"), default="fashion_mnist")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--epochs", type=int, default=100, help="epochs in all, the MLE initialisation's included")
    parser.add_argument("--mle-init-epochs", type=int, default=20)
    parser.add_argument("--train-size", type=int, default=8000)
    parser.add_argument("--val-size", type=int, default=1000)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", help="write the plot to this file")
    parser.add_argument("--json", help="write the per-update record to this file")
    args = parser.parse_args(argv)
    if not 0 <= args.mle_init_epochs < args.epochs:
        parser.error(f"--mle-init-epochs must lie in [0, --epochs={args.epochs}), got {args.mle_init_epochs}")
    result = run(args)
    rows = result["rows"]
    print(
        f"{args.dataset}, seed {args.seed}, --preset thesis, {args.epochs} epochs ({args.mle_init_epochs} MLE): "
        f"{result['updates']} ELBO updates, M_g = {result['num_global']}, {result['seconds']:.0f} s; "
        f"validation accuracy at the end {result['validation_accuracy']:.3f}\n"
    )
    print("| ELBO updates | KL weight | KL | global covariance | global mean | amortised | cross-entropy |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for step in log_spaced(len(rows) - 1):
        row = rows[step]
        print(
            f"| {step} | {row['kl_weight']:.3f} | " + " | ".join(f"{row[part]:,.0f}" for part in PARTS) + f" | {row['cross_entropy']:.3f} |"
        )
    if args.out:
        plot(result, args.out)
    if args.json:
        with open(args.json, "w") as file:
            json.dump(result, file, indent=0)
    return result


if __name__ == "__main__":
    main()
