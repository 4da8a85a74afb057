r"""Kernels for (sparse Gaussian process) attention.

Thesis App. B.4 ("Detailed Experimental Setups and Hyperparameters"): kernel attention uses either the exponential kernel
:math:`k(x, x') = \sigma_f^2 \exp(\sum_j x_j x'_j / \sigma_j^2)` (text tasks) or the ARD-RBF kernel
:math:`k(x, x') = \sigma_f^2 \exp(-\frac{1}{2} \sum_j (x_j - x'_j)^2 / \sigma_j^2)` (image tasks).  Both are GPyTorch kernels; the
output scale :math:`\sigma_f^2` comes from :class:`gpytorch.kernels.ScaleKernel`.

Attention evaluates one kernel per head on tensors shaped ``(batch, heads, L, d)``.  The kernels
built by :func:`make_attention_kernel` carry ``batch_shape=(heads,)`` so every head has its own
hyperparameters, and :func:`evaluate_kernel` evaluates them densely on such tensors (the head
dimension is the kernel's batch dimension; any leading dimensions broadcast).
"""

from __future__ import annotations

import math
from typing import NamedTuple, cast

import torch
from gpytorch.kernels import Kernel, MaternKernel, RBFKernel, ScaleKernel
from torch import Tensor

from probseq._validation import check_int, check_tensor

from ._validation import check_finite, checks_on_host

__all__ = ["ExponentialKernel", "KERNEL_INITS", "KERNEL_NAMES", "make_attention_kernel", "evaluate_kernel", "kernel_blocks"]

#: The kernels :func:`make_attention_kernel` builds by name.
KERNEL_NAMES = ("rbf", "exponential", "matern12", "matern32", "matern52")
#: The initialisations of :func:`make_attention_kernel` (``init=``).
KERNEL_INITS = ("sdp", "authors")


class ExponentialKernel(Kernel):
    r"""Exponential (dot-product) kernel :math:`k(x, x') = \exp(\sum_j x_j x'_j / \sigma_j^2)`.

    The kernel of Tsai et al. (2019) used for kernel attention in the thesis (App. B.4).  The
    lengthscales :math:`\sigma_j` are GPyTorch lengthscales (ARD when ``ard_num_dims`` is given); wrap the
    kernel in :class:`~gpytorch.kernels.ScaleKernel` for the output scale :math:`\sigma_f^2`.  The kernel is
    positive definite because it is the exponential of the linear kernel.
    """

    has_lengthscale = True

    def forward(self, x1: Tensor, x2: Tensor, diag: bool = False, last_dim_is_batch: bool = False, **params) -> Tensor:
        if last_dim_is_batch:
            x1 = x1.transpose(-1, -2).unsqueeze(-1)
            x2 = x2.transpose(-1, -2).unsqueeze(-1)
        x1_ = x1.div(self.lengthscale)
        x2_ = x2.div(self.lengthscale)
        if diag:
            return torch.exp((x1_ * x2_).sum(-1))
        return torch.exp(x1_.matmul(x2_.transpose(-2, -1)))


def make_attention_kernel(kernel: str | Kernel, head_dim: int, num_heads: int, init: str = "sdp") -> ScaleKernel:
    r"""Per-head attention kernel ``ScaleKernel(base(ard_num_dims=head_dim))`` with batch shape ``(num_heads,)``.

    ``kernel`` is ``"rbf"`` (GPyTorch's ARD :class:`~gpytorch.kernels.RBFKernel`),
    ``"exponential"`` (:class:`ExponentialKernel`), ``"matern12"``/``"matern32"``/``"matern52"``
    (GPyTorch's ARD :class:`~gpytorch.kernels.MaternKernel`, ν = 1/2, 3/2, 5/2), or a GPyTorch
    :class:`~gpytorch.kernels.ScaleKernel` with ``batch_shape == (num_heads,)`` (any base kernel:
    it is evaluated by its own ``forward``; its output scale sets the Cholesky jitter), returned
    as is.  ``init="sdp"``: lengthscales start at :math:`\sqrt{e}` (``head_dim ** 0.5``; RBF, Matérn) and
    :math:`e^{1/4}` (exponential, so that :math:`q \cdot k / \sigma^2 = q \cdot k / \sqrt{e}` as in scaled dot-product
    attention, thesis eq. (3.1), :math:`\operatorname{softmax}(q k^\top / \sqrt{d_k})\, v`), output scales at 1.
    ``init="authors"``: the SGPA authors' public code (Chen & Li (2023), SGPA), :math:`\log \ell_j \sim \mathcal{N}(0, 1)`
    and :math:`\sigma_f^2 = 1` (RBF, Matérn), :math:`\log \ell_j \sim \mathcal{N}(4, 1)` and
    :math:`\sigma_f^2 = e^{-4}` (exponential), drawn from torch's global generator.

    :param kernel: the kernel's name, one of :data:`KERNEL_NAMES`, or a GPyTorch ``ScaleKernel`` (returned as is).
    :param head_dim: the head dimension :math:`e`, the kernel's number of ARD lengthscales.
    :param num_heads: the number of heads :math:`H`, the kernel's batch shape.
    :param init: the hyperparameters' initialisation, ``"sdp"`` (the default) or ``"authors"`` (above).
    """
    if init not in KERNEL_INITS:
        raise ValueError(f"init (kernel_init) must be one of {KERNEL_INITS}, got {init!r}")
    if isinstance(kernel, Kernel):
        if not isinstance(kernel, ScaleKernel) or tuple(kernel.batch_shape) != (num_heads,):
            raise ValueError(
                f"a kernel object must be a gpytorch ScaleKernel (its outputscale sets the jitter) with "
                f"batch_shape ({num_heads},), one set of hyperparameters per head; got {type(kernel).__name__} "
                f"with batch_shape {tuple(kernel.batch_shape)}"
            )
        return kernel
    if not isinstance(kernel, str):
        raise TypeError(f"kernel must be a string in {KERNEL_NAMES} or a ScaleKernel, got {type(kernel).__name__}")
    if kernel not in KERNEL_NAMES:
        raise ValueError(f"kernel must be one of {KERNEL_NAMES}, got {kernel!r}")
    check_int(head_dim, "head_dim")
    check_int(num_heads, "num_heads")
    batch_shape = torch.Size([num_heads])
    if kernel.startswith("matern"):
        base = MaternKernel(nu=int(kernel[-2]) / 2, ard_num_dims=head_dim, batch_shape=batch_shape)
    else:
        base_class = RBFKernel if kernel == "rbf" else ExponentialKernel
        base = base_class(ard_num_dims=head_dim, batch_shape=batch_shape)
    scaled = ScaleKernel(base, batch_shape=batch_shape)
    if init == "sdp":
        base.lengthscale = head_dim**0.25 if kernel == "exponential" else math.sqrt(head_dim)
        scaled.outputscale = 1.0
    else:
        log_mean = 4.0 if kernel == "exponential" else 0.0
        base.lengthscale = (log_mean + torch.randn(num_heads, 1, head_dim)).exp()
        scaled.outputscale = math.exp(-4.0) if kernel == "exponential" else 1.0
    return scaled


def _attention_form(kernel: Kernel) -> str | None:
    """``"rbf"`` / ``"exponential"`` for a kernel built by :func:`make_attention_kernel`, else ``None``."""
    if not isinstance(kernel, ScaleKernel) or kernel.active_dims is not None:
        return None
    base = kernel.base_kernel
    if base.active_dims is not None:
        return None
    if type(base) is RBFKernel:
        return "rbf"
    if type(base) is ExponentialKernel:
        return "exponential"
    return None


def _check_features(x1: Tensor, others) -> None:
    for x2 in others:
        if x1.shape[-1] != x2.shape[-1]:
            raise ValueError(f"x1 and x2 must have the same feature dimension, got {x1.shape[-1]} and {x2.shape[-1]}")


class ExpKernelParameters(NamedTuple):
    r"""Hyperparameters of an RBF or exponential attention kernel, read once per forward pass
    (every GPyTorch property read is a softplus and, in training, a node of the backward pass).

    :param form: ``"rbf"`` or ``"exponential"``.
    :param lengthscale: the ARD lengthscales :math:`\ell`, ``(H, 1, d)``.
    :param outputscale: the output scales :math:`\sigma_f^2`, ``(H,)``.
    :param log_outputscale: :math:`\log \sigma_f^2`, ``(H, 1, 1)``.
    """

    form: str  # "rbf" or "exponential"
    lengthscale: Tensor  # (heads, 1, d)
    outputscale: Tensor  # σ_f², (heads,)
    log_outputscale: Tensor  # log σ_f², (heads, 1, 1)


class ExpFeatures(NamedTuple):
    r"""Augmented inputs with :math:`k(x, y) = \exp(\tilde a(x) \cdot \tilde b(y))` (see :func:`kernel_blocks`).

    :param query: the augmented query inputs :math:`\tilde a`, ``(..., H, N, d + 2)`` (RBF) or ``(..., H, N, d + 1)``
        (exponential); ``None`` where only the keys were built.
    :param key: the augmented key inputs :math:`\tilde b`, of the same widths.
    """

    query: Tensor | None  # (..., heads, N, d + 2) RBF, (..., heads, N, d + 1) exponential; None: keys only
    key: Tensor


def exp_kernel_parameters(kernel: Kernel, dtype: torch.dtype) -> ExpKernelParameters | None:
    """The hyperparameters of a kernel of :func:`make_attention_kernel` in ``dtype``, ``None`` for
    any other kernel (which is then evaluated by its own ``forward``).

    :param kernel: the attention kernel (a ``ScaleKernel`` of :func:`make_attention_kernel`, or any GPyTorch kernel).
    :param dtype: the dtype of the returned hyperparameters.
    """
    form = _attention_form(kernel)
    if form is None:
        return None
    scale = kernel.outputscale.to(dtype)
    return ExpKernelParameters(form, kernel.base_kernel.lengthscale.to(dtype), scale, scale.log().reshape(-1, 1, 1))


def scaled_inputs(params: ExpKernelParameters, x: Tensor, centre: Tensor | None = None) -> Tensor:
    r""":math:`a = x / \ell - \text{centre}`; RBF distances do not depend on the centre, which only keeps the
    expanded form :math:`|a|^2 + |b|^2 - 2 a^\top b` accurate in float32 (GPyTorch centres too).

    :param params: the kernel's hyperparameters (:func:`exp_kernel_parameters`).
    :param x: the inputs, ``(..., H, N, d)``.
    :param centre: the centre subtracted after scaling, ``(..., H, 1, d)``; ``None`` (the default): none.
    """
    a = x.div(params.lengthscale)
    return a if centre is None else a - centre


def centred_scaled_inputs(params: ExpKernelParameters, x: Tensor) -> tuple[Tensor, Tensor | None]:
    """``(a, centre)``: :func:`scaled_inputs` centred at their mean over the points (RBF; the centre is
    detached, distances do not depend on it) for inputs ``(..., heads, N, d)``; exponential: no centre.

    :param params: the kernel's hyperparameters (:func:`exp_kernel_parameters`).
    :param x: the inputs, ``(..., H, N, d)``.
    """
    a = scaled_inputs(params, x)
    if params.form != "rbf":
        return a, None
    centre = a.mean(-2, keepdim=True).detach()
    return a - centre, centre


def exp_features(params: ExpKernelParameters, a: Tensor, query: bool = True) -> ExpFeatures:
    r""":math:`\tilde a` and :math:`\tilde b` of scaled inputs :math:`a` (:func:`scaled_inputs`) with
    :math:`k = \exp(\tilde a \cdot \tilde b)`: RBF :math:`\tilde a = (a, \log \sigma_f^2 - \tfrac12 |a|^2, 1)`,
    :math:`\tilde b = (a, 1, -\tfrac12 |a|^2)`; exponential :math:`\tilde a = (a, \log \sigma_f^2)`,
    :math:`\tilde b = (a, 1)`.  ``query=False`` builds :math:`\tilde b` only (:math:`\tilde a` is ``None``).

    :param params: the kernel's hyperparameters (:func:`exp_kernel_parameters`).
    :param a: the scaled inputs of :func:`scaled_inputs`, ``(..., H, N, d)``.
    :param query: whether to build the query features :math:`\tilde a` too (default ``True``).
    """
    ones = a.new_ones(()).expand(*a.shape[:-1], 1)
    if params.form == "exponential":
        augmented = torch.cat([a, params.log_outputscale.expand(*a.shape[:-1], 1)], -1) if query else None
        return ExpFeatures(augmented, torch.cat([a, ones], -1))
    half_square = a.square().sum(-1, keepdim=True).mul(-0.5)
    augmented = torch.cat([a, params.log_outputscale + half_square, ones], -1) if query else None
    return ExpFeatures(augmented, torch.cat([a, ones, half_square], -1))


def exp_kernel(query: Tensor, key: Tensor) -> Tensor:
    r""":math:`\exp(\tilde a \tilde b^\top)`: one product and one ``exp`` per kernel block.

    :param query: the augmented query inputs :math:`\tilde a`, ``(..., H, N, d')``.
    :param key: the augmented key inputs :math:`\tilde b`, ``(..., H, M, d')``.
    """
    return query.matmul(key.transpose(-2, -1)).exp()


def kernel_blocks(kernel: Kernel, x1: Tensor, *others: Tensor) -> list[Tensor]:
    r"""``[k(x1, x1), k(x1, o) for o in others]`` sharing the work that depends on ``x1`` only.

    Same shapes and broadcasting as :func:`evaluate_kernel`.  For the kernels of
    :func:`make_attention_kernel` every block is ``exp`` of one matrix product of augmented,
    lengthscale-scaled inputs :math:`a = x / \ell` (:func:`exp_features`):

    * RBF: :math:`\sigma_f^2 \exp(-\tfrac12 \|a - b\|^2) = \exp(\tilde a^\top \tilde b)` with
      :math:`\tilde a = (a, \log \sigma_f^2 - \tfrac12 \|a\|^2, 1)` and :math:`\tilde b = (b, 1, -\tfrac12 \|b\|^2)`,
      inputs centred at the mean of ``x1`` first (as GPyTorch does);
    * exponential: :math:`\sigma_f^2 \exp(a^\top b) = \exp(\tilde a^\top \tilde b)` with
      :math:`\tilde a = (a, \log \sigma_f^2)`, :math:`\tilde b = (b, 1)`.

    So :math:`K_{qq}` and :math:`K_{qg}` of SGPA cost one product and one ``exp`` each (the augmented ``x1`` is
    built once); the backward pass is one multiplication and two products per block (no
    elementwise chain over the :math:`N \times M` entries).  Equal to GPyTorch's ``kernel.forward`` up to
    rounding (tested); any other kernel falls back to ``kernel.forward`` block by block.

    :param kernel: the attention kernel, a GPyTorch kernel with batch shape ``(H,)``.
    :param x1: the first inputs, ``(..., H, N, d)``.
    """
    _check_inputs(kernel, x1, *others)
    return dense_kernel_blocks(kernel, x1, others, include_self=True)


def _check_inputs(kernel, x1, *others) -> None:
    if not isinstance(kernel, Kernel):
        raise TypeError(f"kernel must be a gpytorch Kernel, got {type(kernel).__name__}")
    for index, x in enumerate((x1, *others)):
        name = "x1" if index == 0 else ("x2" if len(others) == 1 else f"others[{index - 1}]")
        check_tensor(x, name, floating=True, dim=tuple(range(2, 9)), finite=False)
        if checks_on_host(x):
            check_finite(x, name)


def dense_kernel_blocks(kernel: Kernel, x1: Tensor, others, include_self: bool) -> list[Tensor]:
    """:func:`kernel_blocks` without its type and value checks (the layers' inputs are checked once at their
    entry; only the feature dimensions are compared), with the block :math:`k(x_1, x_1)` only where asked for.

    :param kernel: the attention kernel, a GPyTorch kernel with batch shape ``(H,)``.
    :param x1: the first inputs, ``(..., H, N, d)``.
    :param others: the other inputs, a sequence of ``(..., H, M, d)`` tensors; one block :math:`k(x_1, o)` each.
    :param include_self: whether the first block is :math:`k(x_1, x_1)` (``False``: only the blocks of ``others``).
    """
    _check_features(x1, others)
    params = exp_kernel_parameters(kernel, x1.dtype)
    if params is None:
        return ([kernel.forward(x1, x1)] if include_self else []) + [kernel.forward(x1, x2) for x2 in others]
    a, centre = centred_scaled_inputs(params, x1)
    features = exp_features(params, a)
    query = cast(Tensor, features.query)  # built: query=True
    keys = [features.key] if include_self else []
    keys += [exp_features(params, scaled_inputs(params, x2, centre), query=False).key for x2 in others]
    # one product and one exp per block: concatenating the blocks' keys into one product would
    # copy them, and the backward of splitting its result would copy all its gradients again
    return [exp_kernel(query, key) for key in keys]


def evaluate_kernel(kernel: Kernel, x1: Tensor, x2: Tensor | None = None, diag: bool = False) -> Tensor:
    """Dense kernel matrix ``k(x1, x2)`` for head-batched inputs.

    ``x1``: ``(..., heads, N, d)``, ``x2``: ``(..., heads, M, d)`` (defaults to ``x1``); the
    kernel's batch shape ``(heads,)`` aligns with the head dimension and leading dimensions
    broadcast.  Returns ``(..., heads, N, M)``, or ``(..., heads, N)`` when ``diag=True`` (the
    pairs ``k(x1_i, x2_i)``).  Evaluation is eager, which is what attention needs: every entry is
    used; the kernels of :func:`make_attention_kernel` take the lean path of :func:`kernel_blocks`.

    :param kernel: the attention kernel, a GPyTorch kernel with batch shape ``(H,)``.
    :param x1: the first inputs, ``(..., H, N, d)``.
    :param x2: the second inputs, ``(..., H, M, d)``; ``None`` (the default): ``x1``.
    :param diag: whether to return only the pairs :math:`k(x_{1,i}, x_{2,i})` (default ``False``: the full matrix).
    """
    _check_inputs(kernel, x1, *(() if x2 is None else (x2,)))
    return dense_kernel(kernel, x1, x2, diag)


def dense_kernel(kernel: Kernel, x1: Tensor, x2: Tensor | None = None, diag: bool = False) -> Tensor:
    """:func:`evaluate_kernel` without its argument checks (the layers' inputs are checked once at their entry).

    :param kernel: the attention kernel, a GPyTorch kernel with batch shape ``(H,)``.
    :param x1: the first inputs, ``(..., H, N, d)``.
    :param x2: the second inputs, ``(..., H, M, d)``; ``None`` (the default): ``x1``.
    :param diag: whether to return only the pairs :math:`k(x_{1,i}, x_{2,i})` (default ``False``: the full matrix).
    """
    if diag:
        if (x2 is None or x2 is x1) and _attention_form(kernel) == "rbf":  # k(x, x) = σ_f²
            return kernel.outputscale.to(x1.dtype).unsqueeze(-1).expand(*x1.shape[:-1])
        return kernel.forward(x1, x1 if x2 is None else x2, diag=True)
    if x2 is None or x2 is x1:
        return dense_kernel_blocks(kernel, x1, (), include_self=True)[0]
    return dense_kernel_blocks(kernel, x1, (x2,), include_self=False)[0]
