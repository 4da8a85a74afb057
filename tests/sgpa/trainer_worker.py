"""A converted BERT fine-tuned by ``SGPATrainer`` on fixed data, and the package's own loop on the same
batches; run by ``test_sgpa_trainer.py`` in process and under torchrun (``python trainer_worker.py OUT``:
2 ranks of 4 sequences per step, rank 0 saves the parameters and β to ``OUT``)."""

import os
import sys

import torch
from torch.utils.data import SequentialSampler

import gpytorch_sgpa
from gpytorch_sgpa import SGPAELBO, kl_divergence

NUM_DATA, LENGTH, CLASSES, SEED = 24, 6, 3, 0


def data():
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(1, 40, (NUM_DATA, LENGTH), generator=generator)
    mask = torch.ones(NUM_DATA, LENGTH, dtype=torch.long)
    mask[::3, -2:] = 0  # some padded sequences
    labels = torch.randint(0, CLASSES, (NUM_DATA,), generator=generator)
    return ids, mask, labels


def model():
    """A small BERT classifier converted to SGPA (no dropout: the comparisons are exact)."""
    import transformers

    torch.manual_seed(SEED)
    config = transformers.BertConfig(
        vocab_size=40,
        hidden_size=16,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=16,
        num_labels=CLASSES,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    network = transformers.BertForSequenceClassification(config)
    return gpytorch_sgpa.convert(network, num_global=4)


def package_loop(network, batch_size, steps, lr, beta, anneal_steps):
    """The package's own loop: SGD on ``-elbo(logits, kl_divergence(model), labels)``, batches in order,
    the global random state seeded as ``Trainer`` seeds it, then one draw as a ``DataLoader`` takes it
    for its workers' base seed when an epoch starts (one epoch here)."""
    ids, mask, labels = data()
    elbo = SGPAELBO(network, num_data=NUM_DATA, beta=beta, anneal_steps=anneal_steps)
    optimizer = torch.optim.SGD(network.parameters(), lr=lr)
    network.train()
    torch.manual_seed(SEED)
    torch.empty((), dtype=torch.int64).random_()
    for step in range(steps):
        rows = torch.arange(step * batch_size, (step + 1) * batch_size) % NUM_DATA
        logits = network(input_ids=ids[rows], attention_mask=mask[rows]).logits
        loss = -elbo(logits, kl_divergence(network), labels[rows])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return network, elbo


class Rows(torch.utils.data.Dataset):
    def __init__(self):
        self.ids, self.mask, self.labels = data()

    def __len__(self):
        return NUM_DATA

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "attention_mask": self.mask[i], "labels": self.labels[i]}


def trainer(network, output_dir, batch_size, steps, lr, beta, anneal_steps, accumulation=1, save_steps=None, eval_batch_size=8, **kwargs):
    """An ``SGPATrainer`` on the rows in order with plain SGD (no clipping, constant rate)."""
    import transformers

    from gpytorch_sgpa.trainer import SGPATrainer

    class InOrder(SGPATrainer):
        def _get_train_sampler(self, *args, **kwargs):
            return SequentialSampler(self.train_dataset)

    arguments = transformers.TrainingArguments(
        output_dir=str(output_dir),
        per_device_train_batch_size=batch_size,
        per_device_eval_batch_size=eval_batch_size,
        gradient_accumulation_steps=accumulation,
        max_steps=steps,
        learning_rate=lr,
        lr_scheduler_type="constant",
        max_grad_norm=0.0,
        logging_steps=1,
        report_to="none",
        use_cpu=True,
        seed=SEED,
        disable_tqdm=True,
        save_strategy="steps" if save_steps else "no",
        save_steps=save_steps or 500,
        dataloader_num_workers=0,
        ddp_backend="gloo" if "WORLD_SIZE" in os.environ else None,
    )
    if kwargs.pop("stock", False):  # transformers' own Trainer; an SGPAELBO built for the model is its loss

        class StockInOrder(transformers.Trainer):
            def _get_train_sampler(self, *args, **kwargs):
                return SequentialSampler(self.train_dataset)

        if beta is not None:
            SGPAELBO(network, num_data=NUM_DATA, beta=beta, anneal_steps=anneal_steps)
        return StockInOrder(
            network,
            arguments,
            train_dataset=Rows(),
            eval_dataset=Rows(),
            optimizers=(torch.optim.SGD(network.parameters(), lr=lr), None),
            **kwargs,
        )
    elbo = SGPAELBO(network, num_data=NUM_DATA, beta=beta, anneal_steps=anneal_steps)
    return InOrder(
        network,
        arguments,
        train_dataset=Rows(),
        eval_dataset=Rows(),
        elbo=elbo,
        optimizers=(torch.optim.SGD(network.parameters(), lr=lr), None),
        **kwargs,
    )


if __name__ == "__main__":
    torch.set_num_threads(1)
    import transformers

    transformers.utils.logging.set_verbosity_error()
    with gpytorch_sgpa.posterior_mean():  # each rank draws its own noise: compare the data-parallel algebra
        run = trainer(model(), sys.argv[2], batch_size=4, steps=3, lr=0.5, beta="auto", anneal_steps=2)
        run.train()
    if run.args.process_index == 0:
        torch.save(
            {
                "world_size": run.args.world_size,
                "beta": run.elbo.beta,
                "state": {k: v.detach().clone() for k, v in run.model.state_dict().items()},
            },
            sys.argv[1],
        )
