"""Small float64 SGPA layers and inputs shared by the attention and sampler tests, with the references they are compared
with: the attention kernels written out by hand, and GPyTorch's ``UnwhitenedVariationalStrategy`` (an SVGP with a
Cholesky variational distribution)."""

import gpytorch
import torch
from gpytorch.distributions import MultivariateNormal
from gpytorch.kernels import RBFKernel, ScaleKernel
from gpytorch.variational import CholeskyVariationalDistribution, UnwhitenedVariationalStrategy

from gpytorch_sgpa import SGPAttention
from gpytorch_sgpa.kernels import ExponentialKernel

D_MODEL, HEADS, LENGTH, NUM_GLOBAL, BATCH = 6, 2, 5, 3, 2
E = D_MODEL // HEADS
TIGHT = dict(rtol=1e-6, atol=1e-8)


def _layer(seed=0, **kwargs):
    torch.manual_seed(seed)
    kwargs.setdefault("num_global", NUM_GLOBAL)
    layer = SGPAttention(D_MODEL, HEADS, **kwargs).double()
    with torch.no_grad():  # moderate variational parameters keep every matrix well conditioned
        for name, p in layer.named_parameters():
            if name.startswith("global_chol") or name == "global_values":
                p.mul_(0.3)
    return layer


def _inputs(seed=1, batch=BATCH, length=LENGTH):
    torch.manual_seed(seed)
    return 0.7 * torch.randn(batch, length, D_MODEL, dtype=torch.double)


def _heads(t):
    return t.view(t.shape[0], t.shape[1], HEADS, E).transpose(1, 2)


def _step_through(layer, x, noise):
    """Feed ``x`` one position at a time through ``forward_step`` with the matching noise slices."""
    from gpytorch_sgpa.attention import SGPANoise

    state, steps = None, []
    for t in range(x.shape[1]):
        out, state = layer.forward_step(x[:, t : t + 1], state, noise=SGPANoise(noise.local[:, :, t : t + 1], noise.global_))
        steps.append(out)
    return torch.cat(steps, 1), state


def _hand_kernel(layer, h, x1, x2):
    """sigma_f^2 exp(-0.5 sum (x-x')^2/l^2) or sigma_f^2 exp(sum x x'/l^2), written out."""
    ls = layer.kernel.base_kernel.lengthscale[h, 0]
    os_ = layer.kernel.outputscale[h]
    if layer.kernel_name == "rbf":
        diff = (x1[:, None, :] - x2[None, :, :]) / ls
        return os_ * torch.exp(-0.5 * diff.square().sum(-1))
    return os_ * torch.exp((x1 / ls) @ (x2 / ls).T)


def _ref_svgp(layer, h, inducing, mean_u, chol_u, x):
    """GPyTorch unwhitened SVGP with q(u) = N(mean_u[d], chol_u[d] chol_u[d]^T), one per output dim."""
    num_dims, m = mean_u.shape

    class Ref(gpytorch.models.ApproximateGP):
        def __init__(self):
            dist = CholeskyVariationalDistribution(m, batch_shape=torch.Size([num_dims]))
            strategy = UnwhitenedVariationalStrategy(self, inducing, dist, learn_inducing_locations=False, jitter_val=1e-12)
            super().__init__(strategy)
            if layer.kernel_name == "rbf":
                base = RBFKernel(ard_num_dims=E)
            else:
                base = ExponentialKernel(ard_num_dims=E)
            self.covar_module = ScaleKernel(base)
            self.covar_module.base_kernel.lengthscale = layer.kernel.base_kernel.lengthscale[h].detach()
            self.covar_module.outputscale = layer.kernel.outputscale[h].detach()

        def forward(self, inputs):
            return MultivariateNormal(torch.zeros(inputs.shape[:-1], dtype=inputs.dtype), self.covar_module(inputs))

    ref = Ref().double()
    with torch.no_grad():
        ref.variational_strategy._variational_distribution.variational_mean.copy_(mean_u)
        ref.variational_strategy._variational_distribution.chol_variational_covar.copy_(chol_u)
        ref.variational_strategy.variational_params_initialized.fill_(1)  # keep the values set here
    ref.eval()
    with torch.no_grad():
        out = ref(x.expand(num_dims, *x.shape))
        return out.mean, out.covariance_matrix
