# ---
# jupyter:
#   jupytext:
#     formats: py:percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 7. SGPA in a Hugging Face Transformer
#
# You have a Hugging Face model trained by maximum likelihood and want calibrated uncertainty from
# it. This tutorial takes a BERT classifier (a small random configuration, so nothing is
# downloaded; with your own weights the steps are the same) through the route of the thesis
# (App. B.4):
#
# 1. train it as usual (softmax attention, cross-entropy);
# 2. `gpytorch_sgpa.convert(model, attention="kernel")`: kernel attention from its weights, fine-tuned briefly;
# 3. `gpytorch_sgpa.convert(model, num_global=...)`: sparse GP attention from the kernel network,
#    fine-tuned on the ELBO — cross-entropy plus `gpytorch_sgpa.kl_divergence(model)` / `num_data`;
# 4. `gpytorch_sgpa.predict_proba(model, inputs, num_samples=...)` for predictions that average
#    over the attention's posterior;
# 5. the same fine-tuning with `transformers.Trainer` (`gpytorch_sgpa.trainer.SGPATrainer`), then
#    `save_model` and `gpytorch_sgpa.from_pretrained` to reload the SGPA model.
#
# The data are the 10,568 movie-review sentences with a non-zero mean rating from the
# vaderSentiment 3.3.2 source archive (`make data` fetches it), labelled positive or negative.
# `pip install "probseq[zoo]"` installs `transformers`.

# %%
import os
import tempfile

import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F
from transformers import BertConfig, BertForSequenceClassification, TrainingArguments
from transformers.utils import logging as transformers_logging

import gpytorch_sgpa
from gpytorch_sgpa.adapters import SelfAttentionAdapter
from gpytorch_sgpa.data.splits import split_indices
from gpytorch_sgpa.data.text import Vocabulary, binary_sentiment, encode_sentences, load_vader_snippets
from gpytorch_sgpa.metrics import accuracy, calibration_errors
from gpytorch_sgpa.trainer import SGPATrainer

SMALL = os.environ.get("PROBSEQ_TUTORIAL_SIZE") == "small"
torch.set_num_threads(1)
torch.manual_seed(0)

sentences, ratings = load_vader_snippets("movie")
sentences, labels, _ = binary_sentiment(sentences, ratings)
num_train = int(0.8 * len(labels))
train, test = split_indices(len(labels), [num_train, len(labels) - num_train], seed=0)
if SMALL:
    train, test = train[:1500], test[:500]
vocabulary = Vocabulary.build([sentences[i] for i in train.tolist()], min_freq=2)
ids, padding = encode_sentences(sentences, vocabulary, max_len=48, truncate=True)
attention_mask = (~padding).long()  # Hugging Face's convention: 1 = a token to attend to
print(f"{len(train)} training and {len(test)} test sentences, vocabulary of {len(vocabulary)} tokens")

# %% [markdown]
# ## 1. An ordinary Hugging Face model, trained by maximum likelihood

# %%
config = BertConfig(
    vocab_size=len(vocabulary),
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=128,
    max_position_embeddings=64,
    num_labels=2,
    pad_token_id=0,
)
model = BertForSequenceClassification(config)


def logits_of(model, rows):
    return model(input_ids=ids[rows], attention_mask=attention_mask[rows]).logits


def fit(model, epochs, kl=False, lr=1e-3):
    """Adam on cross-entropy, plus the KL of every SGPA layer divided by the number of training sentences."""
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    model.train()
    for _ in range(epochs):
        for rows in train[torch.randperm(len(train))].split(64):
            optimizer.zero_grad()
            loss = F.cross_entropy(logits_of(model, rows), labels[rows])
            if kl:
                loss = loss + gpytorch_sgpa.kl_divergence(model) / len(train)
            loss.backward()
            optimizer.step()
    return model.eval()


def evaluate(name, probs):
    nll = F.nll_loss(probs.clamp_min(1e-12).log(), labels[test]).item()
    ece, _ = calibration_errors(probs, labels[test])
    print(f"{name:28s} accuracy {accuracy(probs, labels[test]):.3f}   NLL {nll:.3f}   ECE {ece:.3f}")


EPOCHS = 1 if SMALL else 4
fit(model, EPOCHS)
with torch.no_grad():
    softmax_probs = logits_of(model, test).softmax(-1)
evaluate("softmax attention (MLE)", softmax_probs)

# %% [markdown]
# ## 2. Kernel attention from its weights
# `convert` replaces every BERT self-attention module in place by an adapter with the same call
# signature (masks, `output_attentions`), built from the trained query, key and value weights; the
# rest of the network is untouched. `calibration_inputs`, a batch of training inputs as the model is
# called, sets each head's kernel scale from the trained network's attention logits. The attention
# function changes (softmax to kernel), so a short fine-tune lets the network adapt to it.

# %%
calibration = dict(input_ids=ids[train[:256]], attention_mask=attention_mask[train[:256]])
gpytorch_sgpa.convert(model, attention="kernel", calibration_inputs=calibration)
adapters = [module for module in model.modules() if isinstance(module, SelfAttentionAdapter)]
assert len(adapters) == config.num_hidden_layers  # one per BERT layer, nothing else touched
with torch.no_grad():
    evaluate("kernel attention, converted", logits_of(model, test).softmax(-1))
fit(model, 1)
with torch.no_grad():
    evaluate("kernel attention, fine-tuned", logits_of(model, test).softmax(-1))

# %% [markdown]
# ## 3. Sparse GP attention, trained on the ELBO
# The second conversion turns the kernel layers into decoupled SGPA layers with 16 global
# inducing keys per head (placed on tokens of the calibration batch). It keeps the function: the
# posterior mean of every SGPA layer is the kernel layer's output, checked below. The training loss
# is the ordinary cross-entropy plus one KL term per sentence; the model's own `forward` is unchanged.

# %%
with torch.no_grad():
    kernel_logits = logits_of(model, test)
gpytorch_sgpa.convert(model, num_global=16, calibration_inputs=calibration)
with torch.no_grad(), gpytorch_sgpa.posterior_mean():
    torch.testing.assert_close(logits_of(model, test), kernel_logits, rtol=1e-4, atol=1e-4)
fit(model, EPOCHS, kl=True)
with torch.no_grad():
    sgpa_probs = gpytorch_sgpa.predict_proba(model, input_ids=ids[test], attention_mask=attention_mask[test], num_samples=10)
    with gpytorch_sgpa.posterior_mean():  # one deterministic pass: the posterior mean of every attention output
        mean_probs = logits_of(model, test).softmax(-1)
evaluate("SGPA, 10 samples", sgpa_probs)
evaluate("SGPA, posterior mean", mean_probs)
torch.testing.assert_close(sgpa_probs.sum(-1), torch.ones(len(test)))
with torch.no_grad(), gpytorch_sgpa.posterior_mean():  # deterministic: the same probabilities twice
    torch.testing.assert_close(logits_of(model, test).softmax(-1), mean_probs)

# %% [markdown]
# ## 4. The same with `transformers.Trainer`, saved and reloaded
# `SGPATrainer` is a `Trainer` whose loss is the negative ELBO (`SGPAELBO`: here `beta="auto"`, chosen at
# the first training step, and a short annealing of the KL weight), scaled so that gradient accumulation
# and data-parallel processes take the steps of one process on the whole batch. Its `evaluate` and
# `predict` use the posterior mean, so two calls agree; the logs carry the KL and β. `save_model` writes
# the conversion into the model's config, and `gpytorch_sgpa.from_pretrained` rebuilds the SGPA model from
# the directory: its predictions are the saved model's, sample for sample.

# %%
transformers_logging.set_verbosity_error()
transformers_logging.disable_progress_bar()


def rows_of(split):
    return [{"input_ids": ids[i], "attention_mask": attention_mask[i], "labels": labels[i]} for i in split.tolist()]


output_dir = tempfile.mkdtemp()
elbo = gpytorch_sgpa.SGPAELBO(model, num_data=len(train), beta="auto", anneal_steps=20)
trainer = SGPATrainer(
    model,
    TrainingArguments(
        output_dir=output_dir,
        per_device_train_batch_size=32,
        gradient_accumulation_steps=2,
        num_train_epochs=1,
        learning_rate=1e-3,
        logging_steps=10,
        report_to="none",
        use_cpu=True,
        disable_tqdm=True,
        save_strategy="no",
    ),
    train_dataset=rows_of(train),
    eval_dataset=rows_of(test),
    elbo=elbo,
)
trainer.train()
logged = [entry for entry in trainer.state.log_history if "kl" in entry]
print(f"β = {elbo.beta:.4f}, KL at the last logged step {logged[-1]['kl']:.1f} nats")
first, second = trainer.predict(rows_of(test)), trainer.predict(rows_of(test))
assert (first.predictions == second.predictions).all()  # deterministic: the posterior mean

trainer.save_model(output_dir)
reloaded = gpytorch_sgpa.from_pretrained(BertForSequenceClassification, output_dir)
with torch.no_grad():
    torch.manual_seed(1)
    saved_sample = logits_of(model.eval(), test)
    torch.manual_seed(1)
    assert torch.equal(logits_of(reloaded, test), saved_sample)  # the same weights, the same noise, the same logits
    trainer_probs = gpytorch_sgpa.predict_proba(reloaded, input_ids=ids[test], attention_mask=attention_mask[test], num_samples=10)
evaluate("SGPA, Trainer, reloaded", trainer_probs)

# %% [markdown]
# ## Confidence against accuracy
# A reliability diagram per model: test sentences binned by the model's confidence (its largest
# class probability), accuracy in each bin against the bin's mean confidence. A calibrated model
# lies on the diagonal.


# %%
def reliability(probs, bins=10):
    confidence, predicted = probs.max(-1)
    correct = (predicted == labels[test]).double()
    edges = torch.linspace(0.5, 1.0, bins + 1)
    index = torch.bucketize(confidence, edges[1:-1])
    rows = [(confidence[index == b].mean(), correct[index == b].mean()) for b in range(bins) if (index == b).any()]
    return torch.tensor(rows).T


figure, axis = plt.subplots(figsize=(4.5, 4))
for name, probs in (("softmax (MLE)", softmax_probs), ("SGPA, 10 samples", sgpa_probs), ("SGPA, Trainer", trainer_probs)):
    confidence, observed = reliability(probs)
    axis.plot(confidence, observed, "o-", label=name)
axis.plot([0.5, 1], [0.5, 1], "k--", linewidth=1, label="calibrated")
axis.set(xlabel="confidence", ylabel="accuracy", title="movie-review sentiment, test sentences")
axis.legend()
plt.show()

# %% [markdown]
# `predict_proba` averages the class probabilities of `num_samples` forward passes, each with its
# own draw of every attention output; the spread between the passes is the model's uncertainty
# about its attention. How much calibration this buys on a given task is an empirical question:
# the project's results report the comparison with temperature scaling and MC dropout.
