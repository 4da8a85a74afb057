"""README's continual SVGPVAE example runs; its ELBO terms obey App. C's identity and the model has
learned task 1 (RMSE well below the outputs' spread)."""

import torch


def test_readme_gpvae_example(run_readme_block):
    namespace = run_readme_block("gpytorch_hippo.gpvae")
    terms, y = namespace["terms"], namespace["y"]
    torch.testing.assert_close(terms.elbo, terms.reconstruction - terms.pseudo_fit + terms.gp_elbo)
    metrics = namespace["trainer"].evaluate(namespace["t"], y, y)
    spread = y[~torch.isnan(y)].std().item()
    assert metrics["rmse"] < 0.5 * spread  # an untrained decoder (a constant) would score about the spread
