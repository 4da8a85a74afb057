"""``python -m experiments.sgpa.demo [--out DIR] [--dataset digits|fashion_mnist|vader]``: a one-minute demo.

Trains a small MLE kernel-attention ViT and its SGPA counterpart (thesis ch. 3) on sklearn digits
(or a ``--quick`` subset of another dataset),
then prints accuracy, NLL, ECE/MCE and OOD AUROC/AUPR side by side and writes results.csv/.png.
The full runner is ``python -m experiments.sgpa.calibration``.
"""

import argparse

from .calibration import main as calibration_main


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m experiments.sgpa.demo", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="out/sgpa_demo")
    parser.add_argument("--dataset", default="digits", choices=("digits", "fashion_mnist", "vader"))
    parser.add_argument("--no-progress", action="store_true")
    args = parser.parse_args(argv)
    command = ["--dataset", args.dataset, "--methods", "mle-kernel,ts,sgpa", "--seeds", "1", "--quick", "--out", str(args.out)]
    if args.dataset == "digits":
        command += [
            "--train-size",
            "1000",
            "--val-size",
            "200",
            "--test-size",
            "397",
            "--ood-size",
            "397",
            "--epochs",
            "10",
            "--mle-init-epochs",
            "3",
            "--batch-size",
            "50",
            "--d-model",
            "32",
            "--threads",
            "1",
        ]
    if args.no_progress:
        command.append("--no-progress")
    return calibration_main(command)


if __name__ == "__main__":
    main()
