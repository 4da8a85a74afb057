"""Work estimates of the HiPPO covariance backends (gpytorch_hippo.inducing.cost): a kernel's reach, its shortest
length scale, and the error that replaces a covariance too large to form.

References: GPyTorch's own kernels evaluated at the reach, and spans in length scales computed by hand.
"""

import math

import gpytorch
import pytest
import torch

from gpytorch_hippo import HiPPOInducingVariables
from gpytorch_hippo.inducing.cost import CovarianceCostError, check_work, kernel_reach, lengthscale_of

DT = torch.float64


@pytest.mark.parametrize("nu", [None, 0.5, 1.5, 2.5])  # None: RBF
def test_the_kernel_is_below_its_tolerance_beyond_the_reach_and_not_well_before_it(nu):
    base = gpytorch.kernels.RBFKernel() if nu is None else gpytorch.kernels.MaternKernel(nu=nu)
    kernel = gpytorch.kernels.ScaleKernel(base).double()
    kernel.base_kernel.lengthscale, kernel.outputscale = 0.7, 3.0
    reach = kernel_reach(kernel)
    assert reach is not None and reach > 0
    origin = torch.zeros(1, 1, dtype=DT)
    relative = lambda r: kernel(origin, torch.full((1, 1), r, dtype=DT)).to_dense().item() / 3.0  # noqa: E731
    assert relative(reach) <= 2e-18 and relative(1.5 * reach) <= 2e-18
    assert relative(0.75 * reach) > 2e-18  # a reach far too long would cost work for nothing
    kernel.base_kernel.lengthscale = 1.4  # the reach scales with the length scale
    assert kernel_reach(kernel) == pytest.approx(2 * reach, rel=1e-12)


def test_kernels_without_a_registered_reach_have_none():
    assert kernel_reach(gpytorch.kernels.LinearKernel().double()) is None
    ard = gpytorch.kernels.RBFKernel(ard_num_dims=2).double()  # one length scale per dimension: not a 1-D reach
    assert kernel_reach(ard) is None


def test_the_shortest_length_scale_is_read_and_diverged_ones_are_named():
    ard = gpytorch.kernels.ScaleKernel(gpytorch.kernels.MaternKernel(nu=2.5, ard_num_dims=3)).double()
    ard.base_kernel.lengthscale = torch.tensor([[2.0, 0.3, 5.0]], dtype=DT)
    assert lengthscale_of(ard) == pytest.approx(0.3, rel=1e-12)
    assert lengthscale_of(gpytorch.kernels.LinearKernel()) is None
    ard.base_kernel.raw_lengthscale.data[0, 1] = math.nan
    with pytest.raises(ValueError, match="diverged hyperparameters"):
        lengthscale_of(ard)


def test_work_over_the_limit_raises_with_the_span_in_length_scales_and_what_to_change():
    kernel = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel()).double()
    kernel.base_kernel.lengthscale = 0.5
    ivars = HiPPOInducingVariables(8, "legs", t=100.0)
    check_work(1000, "a rule", ivars, kernel, limit=1000)  # at the limit: allowed
    with pytest.raises(CovarianceCostError, match=r"about 1e\+03 values \(limit 999\)") as caught:
        check_work(1000, "a rule", ivars, kernel, limit=999)
    message = str(caught.value)
    assert "[0, 100], 200 kernel length scales (lengthscale = 0.5)" in message  # 100 / 0.5, by hand
    assert "method='lyapunov'" in message and "GreaterThan" in message
    product = gpytorch.kernels.ScaleKernel(gpytorch.kernels.MaternKernel(nu=1.5) * gpytorch.kernels.RBFKernel()).double()
    with pytest.raises(CovarianceCostError, match="Only method='quadrature' takes") as caught:
        check_work(2.0, "a rule", ivars, product, limit=1.0)
    assert "measure='legt' or 'fout'" in str(caught.value) and "a sum of registered kernels" in str(caught.value)
