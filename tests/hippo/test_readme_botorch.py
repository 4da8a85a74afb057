"""README's BoTorch example runs, and its optimiser gets close to the known maximum."""
import pathlib
import re

README = pathlib.Path(__file__).resolve().parents[2] / "README.md"


def test_readme_botorch_example(capsys):
    blocks = [b for b in re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S) if "OnlineGPModel" in b]
    assert len(blocks) == 1
    namespace = {}
    exec(compile(blocks[0], str(README), "exec"), namespace)
    model, X = namespace["model"], namespace["X"]
    assert model.num_updates == 11 and X.shape == (18, 2)
    # the maximum of -(x - 0.3)^2 summed is 0 at (0.3, 0.3); ten LogEI steps from 8 random points get close
    assert namespace["f"](X).max().item() > -0.01
    assert "best value found" in capsys.readouterr().out
