"""``SGPATrainer`` (``transformers.Trainer`` on the ELBO) against the package's own loop on the same
batches: with and without gradient accumulation, ``beta="auto"`` and annealing; a resumed run against
the uninterrupted one; deterministic evaluation (the 2-process torchrun run: test_sgpa_distributed.py)."""

import pathlib
import sys

import pytest
import torch

import gpytorch_sgpa

pytest.importorskip("transformers")
pytest.importorskip("accelerate")

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import trainer_worker as worker  # noqa: E402

LR = 0.5  # SGD: a step is proportional to the loss's scale, which Adam would hide


@pytest.fixture(autouse=True)
def _quiet():
    import transformers

    transformers.utils.logging.set_verbosity_error()


def _assert_same(model, reference, rtol=1e-6, atol=1e-7):
    state = reference.state_dict()
    moved = 0
    for name, value in model.state_dict().items():
        torch.testing.assert_close(value, state[name], rtol=rtol, atol=atol, msg=name)
        moved += name.endswith("global_values")
    assert moved == 2


def test_trainer_steps_equal_the_package_loop_with_sampled_attention(tmp_path):
    """No accumulation, sampled attention outputs: the same noise in the same order, β chosen from the
    first training batch (the choice's forward pass puts the random state back), annealed over 2 steps."""
    reference, reference_elbo = worker.package_loop(worker.model(), 8, 3, LR, "auto", 2)
    run = worker.trainer(worker.model(), tmp_path, batch_size=8, steps=3, lr=LR, beta="auto", anneal_steps=2)
    run.train()
    assert run.elbo.beta == pytest.approx(reference_elbo.beta, rel=1e-6) and run.elbo.beta < 1  # float32 KL
    assert int(run.elbo.num_updates) == int(reference_elbo.num_updates) == 3
    _assert_same(run.model, reference)
    logged = [entry for entry in run.state.log_history if "loss" in entry]
    assert len(logged) == 3 and all(entry["beta"] == run.elbo.beta for entry in logged)
    assert [entry["kl_weight"] for entry in logged] == pytest.approx([run.elbo.beta / 2, run.elbo.beta, run.elbo.beta])
    assert all(entry["kl"] > 0 for entry in logged)


@pytest.mark.parametrize("beta", [0.3, "auto"])
def test_gradient_accumulation_equals_the_package_loop_on_the_whole_batch(tmp_path, beta):
    """Two micro-batches of 4 per optimizer step equal one batch of 8: the loss scale, β from the whole
    step's batch and the annealing counter in optimizer steps (noise off: one batch and two micro-batches
    draw their noise in different orders)."""
    with gpytorch_sgpa.posterior_mean():
        reference, reference_elbo = worker.package_loop(worker.model(), 8, 3, LR, beta, 2)
        run = worker.trainer(worker.model(), tmp_path, batch_size=4, accumulation=2, steps=3, lr=LR, beta=beta, anneal_steps=2)
        run.train()
    assert run.elbo.beta == pytest.approx(reference_elbo.beta, rel=1e-6)  # float32 KL summed per micro-batch
    assert int(run.elbo.num_updates) == 3
    _assert_same(run.model, reference)
    # the logged loss of a step is the negative ELBO of its whole batch, as in the package's loop
    with gpytorch_sgpa.posterior_mean():
        first, _ = worker.package_loop(worker.model(), 8, 0, LR, beta, 2)
        ids, mask, labels = worker.data()
        elbo = gpytorch_sgpa.SGPAELBO(first, num_data=worker.NUM_DATA, beta=run.elbo.beta, anneal_steps=2)
        first.train()
        logits = first(input_ids=ids[:8], attention_mask=mask[:8]).logits
        expected = -elbo(logits, gpytorch_sgpa.kl_divergence(first), labels[:8]).item()
    assert run.state.log_history[0]["loss"] == pytest.approx(expected, rel=1e-5)


def test_a_resumed_run_equals_the_uninterrupted_one(tmp_path):
    """β chosen at the first step is restored from the checkpoint (re-choosing it from the batch at the
    resumed step would differ) and the annealing counter continues from the restored step."""
    whole = worker.trainer(worker.model(), tmp_path / "whole", batch_size=8, steps=4, lr=LR, beta="auto", anneal_steps=3, save_steps=2)
    whole.train()
    checkpoint = tmp_path / "whole" / "checkpoint-2"
    assert (checkpoint / "sgpa_elbo.json").is_file()
    resumed = worker.trainer(worker.model(), tmp_path / "whole", batch_size=8, steps=4, lr=LR, beta="auto", anneal_steps=3, save_steps=2)
    resumed.train(resume_from_checkpoint=str(checkpoint))
    assert resumed.elbo.beta == whole.elbo.beta and int(resumed.elbo.num_updates) == 4
    _assert_same(resumed.model, whole.model, rtol=0, atol=0)


def test_evaluate_and_predict_are_deterministic_and_do_not_choose_beta(tmp_path):
    run = worker.trainer(worker.model(), tmp_path, batch_size=8, steps=1, lr=LR, beta="auto", anneal_steps=0)
    metrics = run.evaluate()
    assert torch.isnan(torch.tensor(run.elbo.beta))  # β is chosen by training, never from evaluation data
    first, second = run.predict(worker.Rows()), run.predict(worker.Rows())
    assert (first.predictions == second.predictions).all() and metrics["eval_loss"] == first.metrics["test_loss"]
    ids, mask, labels = worker.data()
    run.model.eval()
    with torch.no_grad(), gpytorch_sgpa.posterior_mean():
        mean = run.model(input_ids=ids, attention_mask=mask).logits
    torch.testing.assert_close(torch.as_tensor(first.predictions), mean)
    nll = torch.nn.functional.cross_entropy(mean, labels).item()
    assert metrics["eval_loss"] == pytest.approx(nll, rel=1e-5)
    run.train()
    assert run.elbo.beta < 1
    sampled = worker.trainer(run.model, tmp_path / "sampled", batch_size=8, steps=1, lr=LR, beta=0.1, anneal_steps=0, eval_samples=5)
    once, again = sampled.predict(worker.Rows()).predictions, sampled.predict(worker.Rows()).predictions
    assert (once == again).all() and abs(once - mean.numpy()).max() > 1e-4  # samples, not the mean
    torch.manual_seed(worker.SEED)
    expected = gpytorch_sgpa.predict_proba(run.model, input_ids=ids[:8], attention_mask=mask[:8], num_samples=5)
    torch.testing.assert_close(torch.as_tensor(once[:8]).exp(), expected.float(), rtol=1e-5, atol=1e-6)
