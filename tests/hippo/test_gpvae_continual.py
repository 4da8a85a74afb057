"""Continual SVGPVAE (thesis §4.5.3): on a two-task stream HiPPO inducing variables keep task 1's
reconstruction while a few inducing points, re-drawn for task 2, forget it; the trainer's
bookkeeping (EWC anchors, the stored GP task, errors)."""
import pytest
import torch

from gpytorch_hippo.gpvae import ContinualSVGPVAE

DT = torch.float64


D, T = 5, 40
MIXING = torch.randn(2, D, generator=torch.Generator().manual_seed(1), dtype=DT)


def task(k):
    """Two smooth latent signals on [k, k+1] mixed linearly into D outputs, plus noise 0.05."""
    times = torch.linspace(k, k + 1, T + 1, dtype=DT)[:-1] + 0.5 / T
    latent = torch.stack([torch.sin(6 * times), torch.cos(4 * times)], -1)
    noise = 0.05 * torch.randn(T, D, generator=torch.Generator().manual_seed(10 + k), dtype=DT)
    return times, latent @ MIXING + noise


def reconstruction_rmse(trainer, times, y):
    return trainer.evaluate(times, y, y, num_samples=20)["rmse"]


@pytest.fixture(scope="module")
def two_task_runs():
    tasks = [task(0), task(1)]
    results = {}
    for method, num_inducing in (("ohsvgp", 16), ("osvgp", 4)):
        trainer = ContinualSVGPVAE(method, D, latent_dim=2, num_inducing=num_inducing, lengthscale=0.2,
                                   hidden_dim=16, num_iter=120, lr=0.01, seed=0)
        trainer.fit_task(*tasks[0])
        after_first = reconstruction_rmse(trainer, *tasks[0])
        trainer.fit_task(*tasks[1])
        results[method] = (after_first, reconstruction_rmse(trainer, *tasks[0]), reconstruction_rmse(trainer, *tasks[1]), trainer)
    return results


def test_hippo_keeps_task_one_while_few_inducing_points_forget_it(two_task_runs):
    """The outputs have standard deviation ~1.3 and noise 0.05. Both models reconstruct each task
    right after learning it (RMSE < 0.15); after task 2 the HiPPO model still reconstructs task 1
    (its LegS basis spans [0, 2]) while the 4 points, re-drawn mostly from task 2's times, leave
    task 1 to the prior and its RMSE grows several-fold."""
    hippo_first, hippo_kept, hippo_second = two_task_runs["ohsvgp"][:3]
    points_first, points_kept, points_second = two_task_runs["osvgp"][:3]
    assert hippo_first < 0.15 and points_first < 0.15
    assert hippo_second < 0.15 and points_second < 0.15
    assert hippo_kept < 0.15
    assert points_kept > 0.3
    assert points_kept > 2.5 * hippo_kept


def test_trainer_stores_each_task(two_task_runs):
    trainer = two_task_runs["ohsvgp"][3]
    assert trainer.num_tasks == 2
    assert trainer.ewc.num_consolidated.item() == 2
    assert all((f >= 0).all() for f in trainer.ewc.fisher) and any((f > 0).any() for f in trainer.ewc.fisher)
    assert all(torch.equal(a, p.detach()) for a, p in zip(trainer.ewc.anchors, trainer.ewc.protected.parameters()))
    assert trainer.model.gp_objective.has_old_task
    assert trainer.model.latent_gp.variational_strategy.inducing_variables.t == pytest.approx(float(task(1)[0][-1]))


@pytest.mark.parametrize("method", ["ovc", "ovc-per-dim"])
def test_ovc_reselects_points_from_old_points_and_new_times(method):
    trainer = ContinualSVGPVAE(method, D, latent_dim=2, num_inducing=6, lengthscale=0.2, hidden_dim=8, num_iter=2, seed=0)
    first, second = task(0), task(1)
    trainer.fit_task(*first)
    points = trainer.model.latent_gp.variational_strategy.inducing_variables.points.detach().clone()
    trainer.fit_task(*second)
    new = trainer.model.latent_gp.variational_strategy.inducing_variables.points.detach()
    assert new.shape == points.shape == ((2, 6, 1) if method == "ovc-per-dim" else (6, 1))
    candidates = torch.cat([points.reshape(-1), second[0]])
    assert all((candidates - z).abs().min() == 0 for z in new.reshape(-1))  # chosen among the candidates
    assert (new > 1.0).any() and (new < 1.0).any()  # pivoted Cholesky spreads them over both tasks


def test_bad_input_names_the_argument():
    with pytest.raises(ValueError, match="method"):
        ContinualSVGPVAE("svgp", D)
    with pytest.raises(ValueError, match="num_inducing"):
        ContinualSVGPVAE("ovc", D, num_inducing=0)
    trainer = ContinualSVGPVAE("ovc", D, latent_dim=2, num_inducing=4, hidden_dim=8, num_iter=1)
    with pytest.raises(RuntimeError, match="fit_task"):
        trainer.evaluate(*task(0), task(0)[1])
    trainer.fit_task(*task(1))
    with pytest.raises(ValueError, match="must start after the previous task"):
        trainer.fit_task(*task(0))
    times, y = task(1)
    with pytest.raises(ValueError, match="y_test"):
        trainer.evaluate(times, y, torch.full_like(y, float("nan")))
    with pytest.raises(ValueError, match="num_inducing=50 exceeds"):
        ContinualSVGPVAE("osvgp", D, num_inducing=50, hidden_dim=8, num_iter=1).fit_task(*task(0))
