"""README's continual SVGPVAE example runs; its ELBO terms obey App. C's identity and the model has
learned task 1 (RMSE well below the outputs' spread)."""
import pathlib
import re

import torch

README = pathlib.Path(__file__).resolve().parents[2] / "README.md"


def test_readme_gpvae_example():
    blocks = [b for b in re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S) if "gpytorch_hippo.gpvae" in b]
    assert len(blocks) == 1
    namespace = {}
    exec(compile(blocks[0], str(README), "exec"), namespace)
    terms, y = namespace["terms"], namespace["y"]
    torch.testing.assert_close(terms.elbo, terms.reconstruction - terms.pseudo_fit + terms.gp_elbo)
    metrics = namespace["trainer"].evaluate(namespace["t"], y, y)
    spread = y[~torch.isnan(y)].std().item()
    assert metrics["rmse"] < 0.5 * spread  # an untrained decoder (a constant) would score about the spread
