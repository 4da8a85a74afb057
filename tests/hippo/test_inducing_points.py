"""InducingPoints and the InducingVariables interface, checked against hand-written kernels."""

import gpytorch
import pytest
import torch

from gpytorch_hippo.inducing import InducingPoints, InducingVariables

DT = torch.float64


def rbf(a, b, lengthscale, outputscale):
    sq = (a.unsqueeze(-2) - b.unsqueeze(-3)).square().sum(-1)
    return outputscale * torch.exp(-0.5 * sq / lengthscale**2)


def make_kernel(lengthscale=0.7, outputscale=1.3, batch_shape=torch.Size()):
    kernel = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel(batch_shape=batch_shape), batch_shape=batch_shape).to(DT)
    kernel.base_kernel.lengthscale = lengthscale
    kernel.outputscale = outputscale
    return kernel


class AveragedInducing(InducingVariables):
    """A toy interdomain set: u_m = mean of f over a fixed group of locations (a linear functional)."""

    def __init__(self, groups):
        super().__init__(jitter=0.0)
        self.register_buffer("groups", groups)  # (M, G, D)

    @property
    def num_inducing(self):
        return self.groups.shape[0]

    def Kuf(self, kernel, x):
        M, G, D = self.groups.shape
        return kernel(self.groups.reshape(M * G, D), x).to_dense().reshape(M, G, -1).mean(1)

    def Kuu(self, kernel):
        M, G, D = self.groups.shape
        flat = self.groups.reshape(M * G, D)
        K = kernel(flat).to_dense().reshape(M, G, M, G).mean((1, 3))
        return self.add_jitter(K)


def test_kuu_kuf_match_closed_form_rbf():
    torch.manual_seed(0)
    Z, X = torch.randn(6, 2, dtype=DT), torch.randn(9, 2, dtype=DT)
    kernel = make_kernel()
    ivs = InducingPoints(Z, jitter=1e-5)
    expected = rbf(Z, Z, 0.7, 1.3) + 1e-5 * torch.eye(6, dtype=DT)
    assert torch.allclose(ivs.Kuu(kernel).to_dense(), expected, atol=1e-12)
    assert torch.allclose(ivs.Kuf(kernel, X), rbf(Z, X, 0.7, 1.3), atol=1e-12)
    assert ivs.num_inducing == 6


@pytest.mark.parametrize("dtype, jitter", [(torch.float64, 1e-6), (torch.float32, 1e-4)])
def test_default_jitter_follows_gpytorch_variational_setting(dtype, jitter):
    Z = torch.linspace(0, 1, 4, dtype=dtype)
    kernel = gpytorch.kernels.RBFKernel().to(dtype)
    ivs = InducingPoints(Z)
    assert ivs.jitter_value(dtype) == gpytorch.settings.variational_cholesky_jitter.value(dtype) == jitter
    diff = ivs.Kuu(kernel).to_dense() - kernel(Z.unsqueeze(-1)).to_dense()
    assert torch.allclose(diff, jitter * torch.eye(4, dtype=dtype), atol=jitter * 1e-3)


def test_batched_points_broadcast_against_unbatched_inputs():
    torch.manual_seed(1)
    Z, X = torch.randn(3, 5, 1, dtype=DT), torch.randn(7, 1, dtype=DT)
    kernel = make_kernel(batch_shape=torch.Size([3]))
    Kuf = InducingPoints(Z).Kuf(kernel, X)
    assert Kuf.shape == (3, 5, 7)
    for t in range(3):
        assert torch.allclose(Kuf[t], rbf(Z[t], X, 0.7, 1.3), atol=1e-12)


def test_cross_covariance_between_point_sets_shares_jitter_only_on_common_points():
    Za = torch.tensor([[0.0], [1.0], [2.0]], dtype=DT)
    Zb = torch.tensor([[1.0], [3.0]], dtype=DT)
    kernel = make_kernel()
    a, b = InducingPoints(Za, jitter=1e-3), InducingPoints(Zb, jitter=1e-3)
    expected = rbf(Za, Zb, 0.7, 1.3)
    expected[1, 0] += 1e-3
    assert torch.allclose(a.Kuu_cross(b, kernel), expected, atol=1e-12)
    assert torch.allclose(b.Kuu_cross(a, kernel), expected.T, atol=1e-12)
    assert torch.allclose(a.Kuu_cross(a, kernel), a.Kuu(kernel).to_dense(), atol=1e-12)
    # different jitter policies: no shared white noise
    c = InducingPoints(Zb, jitter=0.0)
    assert torch.allclose(a.Kuu_cross(c, kernel), rbf(Za, Zb, 0.7, 1.3), atol=1e-12)


def test_double_dispatch_with_an_interdomain_set():
    torch.manual_seed(2)
    groups = torch.randn(4, 3, 1, dtype=DT)
    Z = torch.randn(5, 1, dtype=DT)
    kernel = make_kernel()
    avg, pts = AveragedInducing(groups), InducingPoints(Z, jitter=0.0)
    expected = rbf(groups.reshape(12, 1), Z, 0.7, 1.3).reshape(4, 3, 5).mean(1)  # cov(u_avg, f(Z))
    assert torch.allclose(avg.Kuu_cross(pts, kernel), expected, atol=1e-12)
    assert torch.allclose(pts.Kuu_cross(avg, kernel), expected.T, atol=1e-12)
    with pytest.raises(TypeError, match="no cross-covariance"):
        avg.Kuu_cross(AveragedInducing(groups), kernel)
    with pytest.raises(TypeError, match="other"):
        pts.Kuu_cross(Z, kernel)


def test_learn_flag_and_prior_mean():
    Z = torch.linspace(0, 1, 3, dtype=DT)
    learned, fixed = InducingPoints(Z, learn=True), InducingPoints(Z, learn=False)
    assert [n for n, _ in learned.named_parameters()] == ["points"]
    assert list(fixed.named_parameters()) == [] and "points" in dict(fixed.named_buffers())
    assert learned.points.shape == (3, 1)
    mean = gpytorch.means.ConstantMean().to(DT)
    mean.constant.data.fill_(0.25)
    assert torch.allclose(learned.prior_mean(mean), torch.full((3,), 0.25, dtype=DT))
    assert learned.prior_mean(None) is None and learned.prior_mean(gpytorch.means.ZeroMean()) is None
    assert AveragedInducing(torch.zeros(2, 1, 1, dtype=DT)).prior_mean(mean) is None


def test_bad_inputs_raise():
    with pytest.raises(ValueError, match="points"):
        InducingPoints(torch.tensor([[0.0], [float("nan")]]))
    with pytest.raises(ValueError, match="M >= 1"):
        InducingPoints(torch.zeros(0, 2))
    with pytest.raises(TypeError, match="points"):
        InducingPoints([0.0, 1.0])
    with pytest.raises(ValueError, match="jitter"):
        InducingPoints(torch.zeros(2, 1), jitter=-1.0)
    ivs = InducingPoints(torch.zeros(2, 2, dtype=DT))
    with pytest.raises(ValueError, match="x must have shape"):
        ivs.Kuf(make_kernel(), torch.zeros(3, 1, dtype=DT))
