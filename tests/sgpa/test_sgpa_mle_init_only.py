"""With only SGPA methods requested, the mle-kernel network that initialises SGPA is trained only
for ``mle_init_epochs`` epochs, and gives the same snapshot as the full MLE run."""

from dataclasses import replace

import torch

from experiments.sgpa import calibration
from experiments.sgpa.calibration import QUICK_CONFIG, _Runner, load_task

CONFIG = replace(QUICK_CONFIG, epochs=4, mle_init_epochs=1, train_size=64, ensemble_size=2)


def _mle_epochs_trained(methods, monkeypatch):
    """Runner after evaluating ``methods``, and the MLE epochs trained per member (by hooking train_classifier)."""
    epochs = {}
    original = calibration.train_classifier

    def counting(model, data, *, on_epoch_end, elbo=None, **kwargs):
        def count(epoch, trained):
            if elbo is None:
                member = kwargs["seed"] // 1000
                epochs[member] = epochs.get(member, 0) + 1
            on_epoch_end(epoch, trained)

        return original(model, data, on_epoch_end=count, elbo=elbo, **kwargs)

    monkeypatch.setattr(calibration, "train_classifier", counting)
    torch.manual_seed(0)
    runner = _Runner(load_task("digits", CONFIG, seed=0), CONFIG, progress=False, seed=0, methods=methods)
    for method in methods:
        runner.evaluate(method, 0)
    return runner, epochs


def test_sgpa_alone_trains_mle_only_for_the_initialisation(monkeypatch):
    runner, epochs = _mle_epochs_trained(["sgpa", "sgpa-standard"], monkeypatch)
    assert epochs == {0: CONFIG.mle_init_epochs}
    assert ("mle-kernel", 0) not in runner.networks
    full, full_epochs = _mle_epochs_trained(["sgpa", "mle-kernel"], monkeypatch)
    assert full_epochs == {0: CONFIG.epochs}
    snapshot, reference = runner.mle_snapshots[0], full.mle_snapshots[0]
    assert snapshot.keys() == reference.keys()
    assert all(torch.equal(snapshot[k], reference[k]) for k in reference)
    # Same initialisation and seed: the SGPA network trained after it is the same as well.
    trained, reference_trained = runner.networks[("sgpa", 0)][0], full.networks[("sgpa", 0)][0]
    state, reference_state = trained.state_dict(), reference_trained.state_dict()
    assert all(torch.equal(state[k], reference_state[k]) for k in reference_state)


def test_ensembles_train_full_mle_members_only_when_evaluated(monkeypatch):
    # sgpae needs one MLE initialisation per member; de evaluates every fully trained member,
    # mcd only member 0.
    _, epochs = _mle_epochs_trained(["sgpae"], monkeypatch)
    assert epochs == {0: CONFIG.mle_init_epochs, 1: CONFIG.mle_init_epochs}
    _, epochs = _mle_epochs_trained(["mcd", "sgpae"], monkeypatch)
    assert epochs == {0: CONFIG.epochs, 1: CONFIG.mle_init_epochs}
    _, epochs = _mle_epochs_trained(["sgpae", "de"], monkeypatch)
    assert epochs == {0: CONFIG.epochs, 1: CONFIG.epochs}


def test_stop_after_keeps_the_full_schedule():
    from experiments.sgpa.training import train_classifier

    task = load_task("digits", CONFIG, seed=0)
    states = []
    for stop_after in (None, 2):
        torch.manual_seed(0)
        model = calibration.build_network(task, "mle-kernel", CONFIG)
        snapshots = []
        train_classifier(
            model,
            task.train,
            epochs=4,
            batch_size=32,
            lr=1e-2,
            seed=0,
            progress=False,
            stop_after=stop_after,
            on_epoch_end=lambda e, m: snapshots.append({k: v.clone() for k, v in m.state_dict().items()}),
        )
        states.append(snapshots)
    assert len(states[0]) == 4 and len(states[1]) == 2
    assert all(torch.equal(states[0][1][k], states[1][1][k]) for k in states[0][1])
