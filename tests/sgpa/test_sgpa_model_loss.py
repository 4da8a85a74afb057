"""The loss a converted Hugging Face model returns when given ``labels``: the negative ELBO of its ``SGPAELBO`` in
training mode (of the shifted labels for a causal language model), the negative expected log-likelihood at the
posterior mean in evaluation mode, against the ELBO evaluated by hand on the same forward pass."""

import pytest
import torch

import gpytorch_sgpa
from gpytorch_sgpa.model_loss import shifts_labels

transformers = pytest.importorskip("transformers")


@pytest.fixture(autouse=True)
def _quiet():
    transformers.utils.logging.set_verbosity_error()


def _bert_classifier():
    torch.manual_seed(0)
    config = transformers.BertConfig(
        vocab_size=40, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
        max_position_embeddings=8, num_labels=3, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
    )  # fmt: skip
    return gpytorch_sgpa.convert(transformers.BertForSequenceClassification(config), num_global=3).train()


def test_a_converted_classifier_given_labels_returns_the_negative_elbo_once_it_has_one():
    model = _bert_classifier()
    ids, labels = torch.randint(2, 40, (4, 6)), torch.tensor([0, 2, 1, 1])
    with pytest.raises(ValueError, match=r"SGPAELBO\(model, num_data="):  # one sample's cross-entropy is no objective
        model(input_ids=ids, labels=labels)
    elbo = gpytorch_sgpa.SGPAELBO(model, num_data=50)
    torch.manual_seed(1)
    outputs = model(input_ids=ids, labels=labels)
    torch.manual_seed(1)
    logits = model(input_ids=ids).logits
    expected = -elbo(logits, gpytorch_sgpa.kl_divergence(model), labels)  # labels not shifted
    torch.testing.assert_close(outputs.logits, logits, rtol=0, atol=0)
    torch.testing.assert_close(outputs.loss, expected)
    torch.manual_seed(1)
    loss, tuple_logits = model(input_ids=ids, labels=labels, return_dict=False)[:2]  # a tuple starts with the loss
    torch.testing.assert_close(loss, expected)
    torch.testing.assert_close(tuple_logits, logits, rtol=0, atol=0)
    assert not shifts_labels(model) and not model.accepts_loss_kwargs


def test_a_converted_language_model_given_labels_returns_the_shifted_negative_elbo(tmp_path):
    """GPT-2 (whose transformers loss shifts the labels): ``outputs.loss`` is ``-elbo`` of ``logits[:, :-1]`` against
    ``labels[:, 1:]`` under the same noise; in evaluation mode the logits are the posterior mean's."""
    import transformers

    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=30, n_embd=16, n_layer=1, n_head=2, n_positions=8, bos_token_id=0, eos_token_id=1)
    model = gpytorch_sgpa.convert(transformers.GPT2LMHeadModel(config), num_global=3).train()
    elbo = gpytorch_sgpa.SGPAELBO(model, num_data=100, beta=0.5)
    ids = torch.randint(2, 30, (3, 6))
    torch.manual_seed(1)
    outputs = model(input_ids=ids, labels=ids)
    torch.manual_seed(1)
    logits = model(input_ids=ids).logits
    expected = -elbo(logits[:, :-1], gpytorch_sgpa.kl_divergence(model), ids[:, 1:])
    torch.testing.assert_close(outputs.loss, expected)
    from gpytorch_sgpa.trainer import SGPATrainer  # scores GPT-2 (whose loss_type is unset) shifted as well

    arguments = transformers.TrainingArguments(output_dir=str(tmp_path), report_to="none", use_cpu=True)
    trainer = SGPATrainer(model, arguments, elbo=elbo)
    torch.manual_seed(1)
    loss = trainer.compute_loss(model, {"input_ids": ids, "labels": ids})
    torch.testing.assert_close(loss, expected)
    model.eval()
    with torch.no_grad():
        first, second = model(input_ids=ids, labels=ids), model(input_ids=ids, labels=ids)
        with gpytorch_sgpa.posterior_mean():
            mean = model(input_ids=ids).logits
    assert torch.equal(first.logits, mean) and torch.equal(second.logits, mean)
    torch.testing.assert_close(first.loss, -elbo.expected_log_likelihood(mean[:, :-1], ids[:, 1:]).mean())
