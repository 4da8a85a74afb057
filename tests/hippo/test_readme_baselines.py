"""README's baselines example runs, and each method's online posterior mean is close to the exact GP's."""

import gpytorch
import pytest
import torch

from gpytorch_hippo.inducing import CapturedVarianceWarning


def test_readme_baselines_example(capsys, run_readme_block):
    with pytest.warns(CapturedVarianceWarning, match="num_frequencies"):  # OVFF's features lose variance at the interval's ends
        namespace = run_readme_block("FourierSchedule")
    times, series = namespace["times"], namespace["series"]
    for name, base in (
        ("OHSGPR", gpytorch.kernels.RBFKernel()),
        ("OVC", gpytorch.kernels.RBFKernel()),
        ("OVFF", gpytorch.kernels.MaternKernel(nu=2.5)),
    ):
        kernel = gpytorch.kernels.ScaleKernel(base).double()
        kernel.base_kernel.lengthscale = 5.0
        with torch.no_grad():
            gram = kernel(times).to_dense()
            exact = gram @ torch.linalg.solve(gram + 0.01 * torch.eye(1000, dtype=torch.float64), series)
        gap = (namespace["means"][name] - exact).pow(2).mean().sqrt()
        print(name, gap.item())
        assert gap < 0.05, (name, gap)
    assert "captured prior variance" in capsys.readouterr().out
