"""The batched Lyapunov engine (all streams' LegS covariances in one step) against each stream's exact spectral or
quadrature covariances: clocks that differ, stand still, jump far, a stream start after 0, M = 16 and 64, and a
hyperparameter change that must restart the carried state of the stream it concerns."""

import gpytorch
import pytest
import torch

from gpytorch_hippo import HiPPOInducingVariables
from gpytorch_hippo.inducing.lyapunov_batched import PIECE, BatchedLegS, rbf_hyperparameters

DT = torch.float64


def exact(M, t, start, ell, scale):
    """One stream's variables (exact backend) and kernel."""
    kernel = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel()).double()
    kernel.base_kernel.lengthscale = torch.tensor(ell, dtype=DT)
    kernel.outputscale = torch.tensor(scale, dtype=DT)
    return HiPPOInducingVariables(M, "legs", t=t, start=start, method="spectral"), kernel


def exact_cross(M, t_a, t_b, start, ell, scale):
    a, kernel = exact(M, t_a, start, ell, scale)
    b, _ = exact(M, t_b, start, ell, scale)
    with torch.no_grad():
        return a.backend_for(kernel).cross(a, b, kernel).double()


def relative(a, b):
    return float((a - b).abs().max() / b.abs().max())


@pytest.mark.parametrize("M", [16, 64])
def test_state_cross_and_kuf_equal_each_streams_exact_covariances(M):
    ell = torch.tensor([0.4, 1.0, 2.5, 0.8], dtype=DT)
    scale = torch.tensor([1.0, 2.0, 0.5, 1.3], dtype=DT)
    start = torch.tensor([0.0, 0.0, 1.5, 0.0], dtype=DT)
    engine = BatchedLegS(M)
    # stream 1 stands still in the second step; stream 2 jumps more than PIECE length scales; stream 3 restarts late
    schedule = [[1.0, 2.0, 3.0, 1.0], [2.5, 2.0, 3.0 + 2.2 * PIECE * 2.5, 4.0], [3.0, 7.5, 100.0, 4.5]]
    previous = None
    for clocks in schedule:
        t = torch.tensor(clocks, dtype=DT)
        K = engine.state(t, start, ell, scale)
        for s in range(4):
            assert relative(K[s], exact_cross(M, clocks[s], clocks[s], start[s].item(), ell[s].item(), scale[s].item())) < 1e-11
        if previous is not None:
            C = engine.cross(previous, t, start, ell, scale)
            for s in range(4):
                reference = exact_cross(M, previous[s].item(), clocks[s], start[s].item(), ell[s].item(), scale[s].item())
                assert relative(C[s], reference) < 1e-11
        previous = t
    # inputs before the start, within the support, beyond t and far beyond it (exactly zero there)
    x = torch.stack([torch.linspace(-2.0, c + 30.0, 40, dtype=DT) for c in schedule[-1]])
    kuf = engine.kuf(x, previous, start, previous, ell, scale)
    for s in range(4):
        ivars, kernel = exact(M, schedule[-1][s], start[s].item(), ell[s].item(), scale[s].item())
        with torch.no_grad():
            reference = ivars.Kuf(kernel, x[s].unsqueeze(-1)).mT
        torch.testing.assert_close(kuf[s], reference, rtol=0, atol=1e-12 * float(reference.abs().max()))
    far = x > (previous + 9.5 * ell)[:, None]  # beyond the kernel's reach of every basis: exactly zero
    assert far.sum() >= 4 and torch.equal(kuf[far], torch.zeros_like(kuf[far]))


def test_a_changed_length_scale_restarts_that_streams_state():
    M, start = 24, torch.zeros(3, dtype=DT)
    ell, scale = torch.tensor([0.5, 1.0, 2.0], dtype=DT), torch.ones(3, dtype=DT)
    engine = BatchedLegS(M)
    for clock in (1.0, 2.0, 3.0):
        engine.state(torch.full((3,), clock, dtype=DT), start, ell, scale)
    changed = ell.clone()
    changed[1] = 0.7
    K = engine.state(torch.full((3,), 4.0, dtype=DT), start, changed, scale)
    for s in range(3):
        assert relative(K[s], exact_cross(M, 4.0, 4.0, 0.0, changed[s].item(), 1.0)) < 1e-11


def test_only_rbf_kernels_shared_or_batched_by_stream_are_taken():
    """RBF kernels and their subclasses (the kernel registry's Gaussian spectral density), one length scale, a shared
    kernel or one batched by stream; anything else is left to the streams' own backends."""

    class MyRBF(gpytorch.kernels.RBFKernel):
        pass

    assert rbf_hyperparameters(MyRBF(), 3) is not None
    rbf = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel(batch_shape=torch.Size([3])), batch_shape=torch.Size([3]))
    ell, scale = rbf_hyperparameters(rbf, 3)
    assert ell.shape == scale.shape == (3,)
    assert rbf_hyperparameters(gpytorch.kernels.RBFKernel(), 3)[0].shape == (3,)
    assert rbf_hyperparameters(gpytorch.kernels.MaternKernel(nu=1.5), 3) is None
    assert rbf_hyperparameters(gpytorch.kernels.RBFKernel(batch_shape=torch.Size([2])), 3) is None
    assert rbf_hyperparameters(gpytorch.kernels.RBFKernel(ard_num_dims=2), 3) is None
