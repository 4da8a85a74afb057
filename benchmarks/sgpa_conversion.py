"""What a trained softmax network keeps through ``gpytorch_sgpa.convert``, on Fashion-MNIST.

A small ViT (``nn.TransformerEncoder``, 7 x 7 patches = 16 tokens) is trained with softmax
attention on a subset of Fashion-MNIST (the Debian package's files, read offline by
:func:`experiments.fashion_mnist.load_fashion_mnist`), then converted:

* (a) softmax → kernel attention, the kernel at its default scale (``kernel_init="sdp"``);
* (b) softmax → kernel attention with ``calibration_inputs`` (a batch of training images): length
  and output scales from the trained attention logits;
* (c) (b) after its fine-tuning → orthogonal SGPA (the default), which starts at mean gate 0, so
  at conversion its posterior mean is (b)'s function, and at global covariance ``S_g = 0.01 K_gg``;
* (c+) the same with ``calibration_inputs``: the global inducing inputs on tokens of each layer's
  inputs;
* (c0) (c) with ``mean_gate=None, global_cov_init=None``: the thesis's mean and random variational
  parameters (App. B.4), for contrast;
* (d) softmax → orthogonal SGPA in one step with ``calibration_inputs`` (at conversion its
  posterior mean is (b)'s starting point, before (b)'s fine-tuning);
* (d0) softmax → SGPA in one step from the thesis's start (``mean_gate=None, global_cov_init=None``,
  default kernel scale).

Each is evaluated right after conversion and after 1, 2, 3 epochs of fine-tuning (cross-entropy
for kernel attention, the ELBO for SGPA), on the test subset: accuracy and NLL (SGPA: the mean of
``--num-samples`` posterior samples' probabilities, and the posterior mean's accuracy).  Prints a
table per seed and the mean over seeds.

    python benchmarks/sgpa_conversion.py --threads 1 [--seeds 0 1 2 --train 6000 --test 2000 --epochs 5]
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

import gpytorch_sgpa
from gpytorch_sgpa import SGPAELBO, convert, kl_divergence, posterior_mean, predict_proba

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: the experiments/ tree

from experiments.fashion_mnist import load_fashion_mnist


class PatchViT(nn.Module):
    """7 x 7 patches → linear embedding + learned positions → ``nn.TransformerEncoder`` → mean pool → head."""

    def __init__(self, d_model=64, num_heads=4, num_layers=2, patch=7, image=28, num_classes=10, dropout=0.0):
        super().__init__()
        self.patch = patch
        tokens = (image // patch) ** 2
        self.embed = nn.Linear(patch * patch, d_model)
        self.position = nn.Parameter(0.02 * torch.randn(1, tokens, d_model))
        layer = nn.TransformerEncoderLayer(
            d_model, num_heads, dim_feedforward=2 * d_model, dropout=dropout, batch_first=True, norm_first=True
        )
        self.encoder = nn.TransformerEncoder(layer, num_layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, num_classes)

    def forward(self, images):
        p = self.patch
        patches = images.unfold(2, p, p).unfold(3, p, p).reshape(images.shape[0], -1, p * p)
        return self.head(self.norm(self.encoder(self.embed(patches) + self.position).mean(1)))


def _batches(n, batch_size, generator):
    order = torch.randperm(n, generator=generator)
    return [order[i : i + batch_size] for i in range(0, n, batch_size)]


def _epoch(model, images, labels, optimizer, generator, batch_size, elbo=None):
    model.train()
    for index in _batches(len(labels), batch_size, generator):
        logits = model(images[index])
        if elbo is None:
            loss = F.cross_entropy(logits, labels[index])
        else:
            loss = -elbo(logits, kl_divergence(model), labels[index])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()


@torch.no_grad()
def _evaluate(model, images, labels, num_samples, sgpa):
    """``(accuracy, nll, posterior-mean accuracy or None)``."""
    model.eval()
    if sgpa:
        probabilities = torch.cat([predict_proba(model, chunk, num_samples=num_samples) for chunk in images.split(500)])
        with posterior_mean():
            mean_logits = torch.cat([model(chunk) for chunk in images.split(500)])
        mean_accuracy = float((mean_logits.argmax(-1) == labels).float().mean())
    else:
        probabilities = torch.cat([torch.softmax(model(chunk), -1) for chunk in images.split(500)])
        mean_accuracy = None
    accuracy = float((probabilities.argmax(-1) == labels).float().mean())
    nll = float(-probabilities.clamp_min(1e-12).log().gather(1, labels[:, None]).mean())
    return accuracy, nll, mean_accuracy


def run_seed(seed, data, args):
    train_x, train_y, test_x, test_y = data
    torch.manual_seed(seed)
    generator = torch.Generator().manual_seed(seed)
    rows = {}

    def fine_tune(name, model, sgpa, epochs):
        kwargs = {}
        if sgpa:
            kwargs["elbo"] = SGPAELBO(model, num_data=len(train_y))
            parameters = kwargs["elbo"].parameters()
        else:
            parameters = model.parameters()
        optimizer = torch.optim.Adam(parameters, lr=args.lr)
        rows[name] = [_evaluate(model, test_x, test_y, args.num_samples, sgpa)]
        for _ in range(epochs):
            _epoch(model, train_x, train_y, optimizer, generator, args.batch_size, **kwargs)
            rows[name].append(_evaluate(model, test_x, test_y, args.num_samples, sgpa))
        return model

    start = time.perf_counter()
    softmax = PatchViT()
    optimizer = torch.optim.Adam(softmax.parameters(), lr=args.lr)
    for _ in range(args.epochs):
        _epoch(softmax, train_x, train_y, optimizer, generator, args.batch_size)
    rows["softmax (trained)"] = [_evaluate(softmax, test_x, test_y, args.num_samples, False)]
    calibration = train_x[torch.randperm(len(train_y), generator=generator)[: args.calibration]]

    fine_tune("(a) softmax→kernel", convert(copy.deepcopy(softmax), attention="kernel"), False, args.fine_tune)
    calibrated = convert(copy.deepcopy(softmax), attention="kernel", calibration_inputs=calibration)
    calibrated = fine_tune("(b) softmax→kernel, calibrated", calibrated, False, args.fine_tune)
    torch.manual_seed(seed)
    sgpa = convert(copy.deepcopy(calibrated), attention="sgpa", num_global=args.num_global)
    fine_tune("(c) (b)→SGPA, mean gate 0", sgpa, True, args.fine_tune)
    torch.manual_seed(seed)
    placed = convert(copy.deepcopy(calibrated), attention="sgpa", num_global=args.num_global, calibration_inputs=calibration)
    fine_tune("(c+) (c) + Z_g on data tokens", placed, True, args.fine_tune)
    torch.manual_seed(seed)
    thesis = convert(copy.deepcopy(calibrated), attention="sgpa", num_global=args.num_global, mean_gate=None, global_cov_init=None)
    fine_tune("(c0) (b)→SGPA, thesis start", thesis, True, args.fine_tune)
    torch.manual_seed(seed)
    direct = convert(copy.deepcopy(softmax), attention="sgpa", num_global=args.num_global, calibration_inputs=calibration)
    fine_tune("(d) softmax→SGPA, calibrated", direct, True, args.fine_tune)
    torch.manual_seed(seed)
    direct_thesis = convert(copy.deepcopy(softmax), attention="sgpa", num_global=args.num_global, mean_gate=None, global_cov_init=None)
    fine_tune("(d0) softmax→SGPA, thesis start", direct_thesis, True, args.fine_tune)
    print(f"seed {seed}: {time.perf_counter() - start:.0f} s", flush=True)
    return rows


def _format(rows, fine_tune):
    head = f"{'model':34s} " + " ".join(f"{'ep ' + str(e):>20s}" for e in range(fine_tune + 1))
    lines = [head, f"{'':34s} " + " ".join(f"{'acc / NLL (mean acc)':>20s}" for _ in range(fine_tune + 1))]
    for name, values in rows.items():
        cells = []
        for accuracy, nll, mean_accuracy in values:
            cell = f"{accuracy:.3f}/{nll:.3f}"
            cell += f" ({mean_accuracy:.3f})" if mean_accuracy is not None else ""
            cells.append(f"{cell:>20s}")
        lines.append(f"{name:34s} " + " ".join(cells))
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--train", type=int, default=6000)
    parser.add_argument("--test", type=int, default=2000)
    parser.add_argument("--epochs", type=int, default=5, help="softmax training epochs")
    parser.add_argument("--fine-tune", type=int, default=3, help="fine-tuning epochs after each conversion")
    parser.add_argument("--batch-size", type=int, default=100)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--num-global", type=int, default=16)
    parser.add_argument("--num-samples", type=int, default=10)
    parser.add_argument("--calibration", type=int, default=500, help="images in the calibration batch")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    train_x, train_y = load_fashion_mnist("train")
    test_x, test_y = load_fashion_mnist("test")
    data = (train_x[: args.train], train_y[: args.train], test_x[: args.test], test_y[: args.test])
    print(f"Fashion-MNIST: {args.train} training / {args.test} test images; gpytorch_sgpa {gpytorch_sgpa.__version__}")
    results = []
    for seed in args.seeds:
        rows = run_seed(seed, data, args)
        print(_format(rows, args.fine_tune), flush=True)
        results.append(rows)
    if len(results) > 1:
        mean_rows = {}
        for name in results[0]:
            columns = zip(*(rows[name] for rows in results))
            mean_rows[name] = [
                tuple(None if column[0][i] is None else statistics.mean(c[i] for c in column) for i in range(3)) for column in columns
            ]
        print(f"\nmean over seeds {args.seeds}")
        print(_format(mean_rows, args.fine_tune))


if __name__ == "__main__":
    main()
