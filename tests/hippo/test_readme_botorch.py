"""README's BoTorch example runs, and its optimiser gets close to the known maximum."""


def test_readme_botorch_example(capsys, run_readme_block):
    namespace = run_readme_block("OnlineGPModel")
    model, X = namespace["model"], namespace["X"]
    assert model.num_updates == 11 and X.shape == (18, 2)
    # the maximum of -(x - 0.3)^2 summed is 0 at (0.3, 0.3); ten LogEI steps from 8 random points get close
    assert namespace["f"](X).max().item() > -0.01
    assert "best value found" in capsys.readouterr().out
