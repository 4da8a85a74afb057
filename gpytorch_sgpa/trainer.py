r"""Fine-tuning a converted Hugging Face model with ``transformers.Trainer`` on the ELBO (thesis eq. (3.18), the SGPA ELBO of
Chen & Li (2023): :math:`\mathbb{E}_q[\log p(Y \mid F^L)]` minus the KL terms of every layer and head).

:class:`SGPATrainer` is a ``Trainer`` whose training loss is ``-elbo(logits, kl_divergence(model),
labels)`` of an :class:`~gpytorch_sgpa.elbo.SGPAELBO` (its ``beta``, ``"auto"`` included, its
annealing and its ``kl_weighting``), with the same steps as a plain loop over the same batches:

* **loss scale**: an optimizer step's loss is the negative ELBO of its whole batch, the :math:`G`
  sequences of all its gradient-accumulation micro-batches on all processes.  ELL and KL terms are
  batch means, so micro-batch :math:`i` of :math:`n_i` sequences on one of :math:`W` data-parallel processes
  enters with :math:`-W (n_i / G)\, \mathrm{elbo}_i` (data parallelism averages gradients over the :math:`W`
  processes); the sum is the step's negative ELBO exactly (the weighted KL is linear in the batch
  mean of the amortised KL; the global KL enters once);
* **β**: with ``beta="auto"`` it is chosen at the first training step, from all of that step's
  micro-batches on all processes (one forward pass without gradients, with the random state put
  back), never from evaluation data;
* **annealing**: the ELBO's counter is the number of optimizer steps (``state.global_step``), not
  of micro-batches;
* **checkpoints**: :math:`\beta` is saved beside each checkpoint (``sgpa_elbo.json``) and restored by
  ``train(resume_from_checkpoint=...)``, the counter from the restored step: a resumed run equals
  the uninterrupted one;
* **evaluation** (``evaluate``, ``predict``, best-model selection): a deterministic prediction, by
  default the posterior mean of every attention output (:func:`~gpytorch_sgpa.posterior_mean`, one
  pass); ``eval_samples=k`` gives instead ``log`` of the mean of ``k`` samples' class
  probabilities, the :math:`i`-th sequence of the evaluated data set drawing its samples from the seed
  ``args.seed`` :math:`\cdot 2^{32} + i` (:func:`~gpytorch_sgpa.per_example_noise`): the same every call, and a
  sequence's prediction does not depend on the batch size, its neighbours or the padding after it (one process;
  under data parallelism :math:`i` counts the sequences of each process's shard); evaluating leaves the
  training's random state untouched (an ``evaluate()`` before ``train()`` changes neither β nor the
  training's noise).  The evaluation loss is the negative expected log-likelihood of that prediction per
  sequence, without the KL (which does not depend on held-out data);
* **logs**: each training log adds ``kl`` (the last step's ``kl_divergence``), ``beta`` and
  ``kl_weight`` (:math:`w_t`).

Causal language models (``Trainer``'s label shift) score ``logits[:, :-1]`` against
``labels[:, 1:]``.  The stock ``Trainer`` works too, through the loss the converted model returns given
``labels`` (:mod:`gpytorch_sgpa.model_loss`), with the differences the user guide lists.  ``Trainer`` needs
``accelerate`` (``pip install "probseq[zoo]"``).
"""

from __future__ import annotations

import json
import math
import os
from typing import TYPE_CHECKING, cast

import torch

from probseq._optional import require

from ._outputs import output_logits
from .attention import per_example_noise, posterior_mean
from .dropin import kl_divergence
from .elbo import SGPAELBO
from .model_loss import shifts_labels

if TYPE_CHECKING:
    import transformers
else:  # the error of a missing transformers names the extra that installs it
    transformers = require("transformers", "zoo", "gpytorch_sgpa.trainer")
require("accelerate", "zoo", "gpytorch_sgpa.trainer (transformers.Trainer)")

__all__ = ["ELBO_STATE_NAME", "SGPATrainer"]

#: The file beside each ``Trainer`` checkpoint that holds the ELBO's state.
ELBO_STATE_NAME = "sgpa_elbo.json"


class SGPATrainer(transformers.Trainer):
    """``Trainer(model, args, ..., elbo=SGPAELBO(model, num_data, beta=..., anneal_steps=...),
    eval_samples=0)``: fine-tunes ``model`` on ``-elbo`` (module docstring).  ``elbo.model`` must be
    ``model``; an ELBO with parameters of its own (a Gaussian or Laplace likelihood) needs an
    optimizer given through ``optimizers=``.  Batches need ``labels``.  The likelihood term is the ELBO's:
    ``compute_loss_func`` and ``label_smoothing_factor`` (which would replace or change it) raise.

    :param elbo: the objective, an :class:`~gpytorch_sgpa.elbo.SGPAELBO` whose ``model`` is the trained model.
    :param eval_samples: the posterior samples averaged per evaluation prediction, an int >= 0 (default 0: the
        posterior mean, one pass).
    """

    loss_is_scaled_for_ga = True  # compute_loss scales each micro-batch by its share of the step

    def __init__(self, *args, elbo: SGPAELBO, eval_samples: int = 0, **kwargs):
        super().__init__(*args, **kwargs)
        if not isinstance(elbo, SGPAELBO):
            raise TypeError(f"elbo must be a gpytorch_sgpa.SGPAELBO, got {type(elbo).__name__}")
        if elbo.model is not self.model:
            raise ValueError("elbo.model must be the model the Trainer trains")
        in_model = {id(p) for p in self.model.parameters()}
        if any(id(p) not in in_model for p in elbo.parameters()) and kwargs.get("optimizers", (None,))[0] is None:
            raise ValueError(
                "the ELBO has parameters outside the model (its likelihood's), which the Trainer's default "
                "optimizer would not train: pass optimizers=(torch.optim.AdamW(elbo.parameters()), None)"
            )
        if self.compute_loss_func is not None:
            raise ValueError(
                "SGPATrainer trains on the negative ELBO, so compute_loss_func would be ignored: drop it, and choose the "
                "ELBO's likelihood term with SGPAELBO(model, num_data, likelihood=...) (a GPyTorch likelihood)"
            )
        if self.args.label_smoothing_factor != 0:
            raise ValueError(
                f"SGPATrainer trains on the negative ELBO, whose likelihood term is the log-likelihood of the labels, so "
                f"label_smoothing_factor={self.args.label_smoothing_factor} would be ignored: set label_smoothing_factor=0 "
                "in TrainingArguments (the KL term already regularises the attention outputs)"
            )
        if isinstance(eval_samples, bool) or not isinstance(eval_samples, int) or eval_samples < 0:
            raise ValueError(f"eval_samples must be an int >= 0 (0: the posterior mean), got {eval_samples!r}")
        self.elbo = elbo
        self.eval_samples = eval_samples
        get_base_model = getattr(self.model, "get_base_model", None)  # peft's base model
        base = get_base_model() if callable(get_base_model) else self.model
        self._shifts_labels = shifts_labels(base)
        self._step_sequences = None
        self._last_kl = None
        self._evaluated_rows = 0  # sequences predicted so far in the running evaluation (their index: their seed)
        self.add_callback(_ELBOStateSaver(elbo))

    # ------------------------------------------------------------------ training
    def _scored(self, logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self._shifts_labels:
            return logits[..., :-1, :], labels[..., 1:]
        return logits, labels

    def _global_sum(self, value: torch.Tensor) -> torch.Tensor:
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            value = value.clone()
            torch.distributed.all_reduce(value)
        return value

    def get_batch_samples(self, epoch_iterator, num_batches, device):
        r"""``Trainer``'s micro-batches of one optimizer step; counts the step's sequences on all
        processes and, at the first step with ``beta="auto"``, chooses :math:`\beta` from them.

        :param epoch_iterator: the iterator over the training batches (as ``Trainer`` passes it).
        :param num_batches: the number of micro-batches of the optimizer step.
        :param device: the device the sequence count is reduced on.
        """
        batch_samples, num_items_in_batch = super().get_batch_samples(epoch_iterator, num_batches, device)
        if batch_samples:
            rows = sum(len(batch["labels"]) for batch in batch_samples)
            self._step_sequences = float(self._global_sum(torch.tensor(float(rows), dtype=torch.float64, device=device)))
            if self.elbo.auto_beta and math.isnan(self.elbo.beta):
                self._choose_beta(batch_samples)
        return batch_samples, num_items_in_batch

    @torch.no_grad()
    def _choose_beta(self, batch_samples) -> None:
        model = cast(torch.nn.Module, self.model)  # elbo.model (checked when built), not None
        training = model.training
        model.train()
        totals, classes = None, None
        with torch.random.fork_rng(devices=_cuda_devices(model)):  # the training passes draw the same noise and dropout
            for batch in batch_samples:
                inputs = dict(self._prepare_inputs(batch))
                logits, labels = self._scored(output_logits(model(**{k: v for k, v in inputs.items() if k != "labels"})), inputs["labels"])
                part = self.elbo.beta_totals(labels, self.elbo.weighted_kl(kl_divergence(model)))
                totals = part if totals is None else totals + part
                classes = logits.shape[-1]
        model.train(training)
        if totals is None or classes is None:  # get_batch_samples calls this with at least one batch
            raise RuntimeError("choosing beta needs at least one batch")
        self.elbo.set_auto_beta(totals, classes)

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        r""":math:`-W (n_i / G)\, \mathrm{ELBO}_i` with :math:`\mathrm{ELBO}_i` = ``elbo(logits, kl_divergence(model),
        labels)`` for a micro-batch of :math:`n_i` sequences (:math:`W` processes, :math:`G` sequences per optimizer
        step; module docstring), the ELBO's counter set to the optimizer step.

        :param model: the model being trained (``inputs`` are its keyword arguments).
        :param inputs: the micro-batch, a mapping with ``labels`` and the model's other inputs.
        :param return_outputs: whether to return ``(loss, outputs)`` rather than the loss alone (default ``False``).
        :param num_items_in_batch: ignored: the scale comes from the step's sequence count (accepted for ``Trainer``).
        """
        inputs = dict(inputs)
        labels = inputs.pop("labels")
        outputs = model(**inputs)
        logits, labels = self._scored(output_logits(outputs), labels)
        kl = kl_divergence(model)
        self.elbo.num_updates.fill_(self.state.global_step)
        loss = -self.elbo(logits, kl, labels)
        if model.training and self._step_sequences is not None:
            world_size = torch.distributed.get_world_size() if torch.distributed.is_initialized() else 1
            loss = loss * (world_size * labels.shape[0] / self._step_sequences)
        self._last_kl = kl.detach()
        return (loss, outputs) if return_outputs else loss

    def log(self, logs: dict, *args, **kwargs) -> None:
        """``Trainer.log`` with ``kl``, ``beta`` and ``kl_weight`` added to training logs.

        :param logs: the values to log, as ``Trainer.log`` takes them.
        """
        if "loss" in logs and self._last_kl is not None:
            logs = {**logs, "kl": float(self._last_kl), "beta": self.elbo.beta, "kl_weight": self.elbo.kl_weight}
        super().log(logs, *args, **kwargs)

    # ------------------------------------------------------------------ checkpoints
    def save_model(self, output_dir: str | None = None, *args, **kwargs) -> None:
        """``Trainer.save_model`` (also each checkpoint's model); for a ``peft`` model also SGPA's own parameters,
        which the adapter leaves out (:func:`gpytorch_sgpa.lora.save_sgpa_parameters`), so that
        :func:`gpytorch_sgpa.lora.load_adapter` restores the trained function.

        :param output_dir: the directory (default ``args.output_dir``), as ``Trainer.save_model``.
        """
        super().save_model(output_dir, *args, **kwargs)
        model = self.accelerator.unwrap_model(self.model)
        if self.args.should_save and hasattr(model, "peft_config") and hasattr(model, "get_base_model"):
            from .lora import save_sgpa_parameters

            directory = output_dir if output_dir is not None else cast(str, self.args.output_dir)  # TrainingArguments sets it
            save_sgpa_parameters(model, directory)

    def hyperparameter_search(self, *args, **kwargs):
        """Not supported: each trial builds a new model (``model_init``), while the ELBO, and the β and checkpoints it
        keeps, belong to the one model it was built for; raises ``NotImplementedError``."""
        raise NotImplementedError(
            "SGPATrainer does not run hyperparameter_search: each trial builds a new model, which the ELBO built for "
            "one model does not follow. Build one SGPATrainer per setting (model, SGPAELBO(model, ...)) and compare "
            "their evaluate() results"
        )

    def train(self, resume_from_checkpoint=None, *args, **kwargs):
        r"""``Trainer.train``; resuming from a checkpoint restores the ELBO's :math:`\beta`.

        :param resume_from_checkpoint: a checkpoint directory, ``True`` for the last one in ``args.output_dir``, or
            ``None`` / ``False`` (the default): start afresh; as ``Trainer.train``.
        """
        if resume_from_checkpoint is not None and resume_from_checkpoint is not False:
            if resume_from_checkpoint is True:
                resume_from_checkpoint = transformers.trainer_utils.get_last_checkpoint(self.args.output_dir)
            path = os.path.join(resume_from_checkpoint, ELBO_STATE_NAME)
            if not os.path.isfile(path):
                raise FileNotFoundError(
                    f"{path} is missing: the checkpoint was not written by SGPATrainer, so the ELBO's β and counter cannot be restored"
                )
            with open(path) as handle:
                state = json.load(handle)
            self.elbo.beta = float(state["beta"])
            if self.elbo.auto_beta:
                self.elbo.chosen_beta.fill_(self.elbo.beta)
        return super().train(resume_from_checkpoint, *args, **kwargs)

    # ------------------------------------------------------------------ evaluation
    def evaluation_loop(self, *args, **kwargs):
        """``Trainer.evaluation_loop``, counting the sequences from 0 (each one's index seeds its samples)."""
        self._evaluated_rows = 0
        return super().evaluation_loop(*args, **kwargs)

    def evaluate(self, *args, **kwargs) -> dict[str, float]:
        """``Trainer.evaluate`` with the global random state put back afterwards, so that evaluating (before or
        during training) does not change the training's noise (the evaluation's data loader draws a seed from it)."""
        with torch.random.fork_rng(devices=_cuda_devices(self.model)):
            return super().evaluate(*args, **kwargs)

    def predict(self, *args, **kwargs):
        """``Trainer.predict`` with the global random state put back afterwards (as :meth:`evaluate`)."""
        with torch.random.fork_rng(devices=_cuda_devices(self.model)):
            return super().predict(*args, **kwargs)

    def prediction_step(self, model, inputs, prediction_loss_only, ignore_keys=None):
        """``(loss, logits, labels)`` of the deterministic prediction (module docstring).

        :param model: the evaluated model.
        :param inputs: the batch, a mapping with the model's inputs and optionally ``labels``.
        :param prediction_loss_only: whether to return only the loss (``(loss, None, None)``).
        :param ignore_keys: ignored (accepted for ``Trainer``'s signature).
        """
        inputs = dict(self._prepare_inputs(inputs))
        labels = inputs.pop("labels", None)
        with torch.no_grad():
            if self.eval_samples == 0:
                with posterior_mean():
                    logits = output_logits(model(**inputs))
            else:
                rows = next(value for value in inputs.values() if isinstance(value, torch.Tensor)).shape[0]
                first, self._evaluated_rows = self._evaluated_rows, self._evaluated_rows + rows
                seeds = [self.args.seed * 2**32 + first + row for row in range(rows)]
                with per_example_noise(seeds):
                    total = None
                    for _ in range(self.eval_samples):
                        sample = output_logits(model(**inputs))
                        probabilities = torch.softmax(sample.double(), dim=-1)
                        total = probabilities if total is None else total + probabilities
                    logits = (total / self.eval_samples).log().to(sample.dtype)
            loss = None
            if labels is not None:
                scored, targets = self._scored(logits, labels)
                loss = -self.elbo.expected_log_likelihood(scored, targets).mean()
        if prediction_loss_only:
            return loss, None, None
        return loss, logits, labels


class _ELBOStateSaver(transformers.TrainerCallback):
    """Writes the ELBO's :math:`\\beta` and counter beside each checkpoint (``on_save``: after ``Trainer`` wrote it)."""

    def __init__(self, elbo: SGPAELBO):
        self.elbo = elbo

    def on_save(self, args, state, control, **kwargs):
        if args.should_save:
            folder = os.path.join(args.output_dir, f"{transformers.trainer_utils.PREFIX_CHECKPOINT_DIR}-{state.global_step}")
            with open(os.path.join(folder, ELBO_STATE_NAME), "w") as handle:
                json.dump({"beta": self.elbo.beta, "num_updates": state.global_step}, handle)


def _cuda_devices(model) -> list[int]:
    """The CUDA device of ``model``'s parameters (for ``torch.random.fork_rng``), or none."""
    parameter = next(model.parameters(), None)
    return [parameter.device.index or 0] if parameter is not None and parameter.is_cuda else []
