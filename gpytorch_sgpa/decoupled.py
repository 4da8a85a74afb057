r"""Decoupled SGPA posterior (thesis eqs. (3.15), (B.14), KL of App. B.1.2).

Notation of the code: :math:`L` with :math:`L L^\top = K_{gg} + \text{jitter}\, I` (one per head, shared by the batch),
:math:`A = L^{-1} K_{gq}` (so :math:`K_{qg} K_{gg}^{-1} K_{gq} = A^\top A`), :math:`W_d = L^{-1} C_d` (unwhitened
:math:`S_g = C C^\top`) or :math:`W_d = C_d` (whitened :math:`S_g = L C C^\top L^\top`), so that
:math:`K_{qg} K_{gg}^{-1} S_{g,d} K_{gg}^{-1} K_{gq} = (W_d^\top A)^\top (W_d^\top A)`.

* mean (orthogonal): :math:`K_{qa} v_a - A^\top A v_a + A^\top (L^\top v_g)`, with the layer's per-head mean gate
  :math:`\gamma` :math:`K_{qa} v_a + \gamma A^\top (L^\top v_g - A v_a)`; (dsvgp): :math:`K_{qa} v_a`;
* covariance: :math:`\Sigma_d = (K_{qq} - A^\top A) + (W_d^\top A)^\top (W_d^\top A)`;
* KL: :math:`\tfrac12 \sum_d [v_{a,d}^\top B v_{a,d} + \lVert L^\top v_{g,d} \rVert^2 + \lVert W_d \rVert_F^2 -
  \log|S_{g,d}| + \log|K_{gg}| - M]` with :math:`B = K_{aa} - A^\top A` (orthogonal) or :math:`K_{aa}` (dsvgp); the
  global part (everything but :math:`v_a^\top B v_a`) is :class:`GlobalFactors` ``.kl``; with the gate
  :math:`\lVert L^\top v_g \rVert^2` is :math:`\lVert \gamma L^\top v_g + (1 - \gamma) A v_a \rVert^2`, its part
  :math:`\gamma^2 \lVert L^\top v_g \rVert^2` global, the rest per sequence.

The functions take the :class:`~gpytorch_sgpa.attention.SGPAttention` layer whose parameters they read.
"""

from __future__ import annotations

from typing import NamedTuple, cast

import torch
from torch import Tensor

from ._numerics import masked_cholesky, relative_jitter
from .kernels import (
    ExpKernelParameters,
    centred_scaled_inputs,
    dense_kernel,
    dense_kernel_blocks,
    exp_features,
    exp_kernel,
    exp_kernel_parameters,
    scaled_inputs,
)
from .multihead import psd_cholesky
from .samplers import PosteriorTerms


class GlobalFactors(NamedTuple):
    r"""Per-head quantities of the global inducing variables, shared by every sequence.

    :param keys: the global keys :math:`k_g`, ``(H, M, e)``.
    :param chol: :math:`L` with :math:`L L^\top = K_{gg} + \text{jitter}\, I`, ``(H, M, M)`` lower triangular.
    :param chol_inverse: :math:`L^{-1}`, ``(H, M, M)`` lower triangular.
    :param whitened_cov_factor: :math:`W_d` (:math:`L^{-1} C_d` unwhitened, :math:`C_d` whitened), ``(H, e or 1, M, M)``.
    :param whitened_values: :math:`L^\top v_g`, ``(H, M, e)``; ``None`` for the dsvgp variant (no :math:`v_g`).
    :param kl: the global part of the KL per head, ``(H,)``, summed over output dimensions.
    :param key_features: the global keys' augmented inputs :math:`\tilde b` of :func:`~gpytorch_sgpa.kernels.exp_features`,
        ``(H, M, e + 2)`` (RBF) or ``(H, M, e + 1)`` (exponential); ``None`` (the default) for other kernels.
    :param centre: the centre of the RBF frame (mean of :math:`k_g / \ell`), ``(H, 1, e)``, that the queries are scaled
        in too; ``None`` (the default) for other kernels.
    """

    keys: Tensor  # k_g, (H, M, e)
    chol: Tensor  # L with L Lᵀ = K_gg + jitter I, (H, M, M)
    chol_inverse: Tensor  # L⁻¹, (H, M, M) lower triangular
    whitened_cov_factor: Tensor  # W_d, (H, e or 1, M, M)
    whitened_values: Tensor | None  # Lᵀ v_g, (H, M, e) (orthogonal variant)
    kl: Tensor  # (H,) global part of the KL, summed over output dimensions
    # RBF / exponential kernels: the keys' b̃ (kernels.exp_features), shared by K_gg and every K_qg,
    # and the centre of the frame (mean of k_g / ℓ, RBF) that the queries are scaled in too
    key_features: Tensor | None = None  # (H, M, e + 2 or e + 1)
    centre: Tensor | None = None  # (H, 1, e)


def global_factors(
    layer, global_inputs: Tensor | None, dtype: torch.dtype, params: ExpKernelParameters | None = None, keys: Tensor | None = None
) -> GlobalFactors:
    r""":math:`k_g`, :math:`L`, :math:`W_d`, :math:`L^\top v_g` and the global KL, computed in ``dtype``; ``params``: the
    kernel's hyperparameters already read by the caller (read here when omitted); ``keys``: the
    layer's ``global_keys(global_inputs, dtype)`` already computed by the caller (computed here when omitted).

    :param layer: the decoupled :class:`~gpytorch_sgpa.attention.SGPAttention` layer whose parameters are read.
    :param global_inputs: the global inducing inputs after the block's feature map, :math:`G_\phi(Z_g)`,
        ``(H, M, d_model)``; ``None``: the layer's ``global_inducing_inputs``.
    :param dtype: the dtype the factors are computed in.
    :param params: the kernel's hyperparameters (:func:`~gpytorch_sgpa.kernels.exp_kernel_parameters`); ``None`` (the
        default): read here (and ``None`` again for kernels other than RBF / exponential).
    :param keys: the global keys ``layer.global_keys(global_inputs, dtype)``, ``(H, M, e)``; ``None`` (the default):
        computed here.
    """
    keys = keys if keys is not None else layer.global_keys(global_inputs, dtype)
    params = params if params is not None else exp_kernel_parameters(layer.kernel, dtype)
    key_features = centre = None
    if params is None:
        gram = dense_kernel(layer.kernel, keys)
    else:
        scaled, centre = centred_scaled_inputs(params, keys)
        features = exp_features(params, scaled)
        gram, key_features = exp_kernel(cast(Tensor, features.query), features.key), features.key  # query built: query=True
    num_global = gram.shape[-1]
    eye = torch.eye(num_global, dtype=gram.dtype, device=gram.device)
    chol = psd_cholesky(gram + relative_jitter(layer.kernel, dtype, params) * eye)
    # L⁻¹ once per head (M triangular solves against I): every later "L⁻¹ X" is then one matrix
    # product, which on CPU costs a fraction of a triangular solve broadcast over the batch (forward
    # and backward; benchmarks/sgpa_cost.py) and gives the same values up to rounding (tested).
    chol_inverse = torch.linalg.solve_triangular(chol, eye, upper=False)
    cov_factor = layer.global_cov_factor(dtype)
    # KL per head, ½ [r Σ_d (‖W_d‖²_F - log|C_d C_dᵀ| + log|K_gg| - M) + ‖Lᵀ v_g‖²] with r = e for a
    # shared S_g, else 1, summed over the e or 1 factors C_d at once; whitened, W_d = L⁻¹ (L C_d) = C_d
    # and log|S_g,d| - log|K_gg| = log|C_d C_dᵀ| (no log|K_gg| term)
    cov_dims = cov_factor.shape[1]
    whitened_cov_factor = cov_factor if layer.whitened else chol_inverse.unsqueeze(1).matmul(cov_factor)
    cov_kl = torch.sub(whitened_cov_factor.square().sum((-3, -2, -1)), layer.global_chol_log_diag.to(dtype).sum((-2, -1)), alpha=2.0)
    if not layer.whitened:
        cov_kl = torch.add(cov_kl, chol.diagonal(dim1=-2, dim2=-1).log().sum(-1), alpha=2.0 * cov_dims)
    cov_kl = cov_kl - num_global * cov_dims
    whitened_values = None
    kl = cov_kl * layer.head_dim if layer.share_covariance else cov_kl
    if layer.global_values is not None:
        whitened_values = chol.transpose(-2, -1).matmul(layer.global_values.to(dtype))
        value_kl = whitened_values.square().sum((-2, -1))
        gate = mean_gate(layer, dtype)
        kl = kl + (value_kl if gate is None else gate.reshape(-1).square() * value_kl)
    return GlobalFactors(keys, chol, chol_inverse, whitened_cov_factor, whitened_values, 0.5 * kl, key_features, centre)


class _RowSquares(torch.autograd.Function):
    """``Σ_j x_ij²`` over the last dimension, with the backward ``2 x ⊙ g`` as one product over ``x``
    (autograd's ``x * x`` takes two products and a sum of that size, ``x.square()`` three passes;
    the backward is itself differentiable)."""

    @staticmethod
    def forward(ctx, x: Tensor) -> Tensor:
        ctx.save_for_backward(x)
        return (x * x).sum(-1)

    @staticmethod
    def backward(ctx, grad: Tensor) -> Tensor:
        (x,) = ctx.saved_tensors
        return x * (2 * grad).unsqueeze(-1)


def mean_gate(layer, dtype: torch.dtype) -> Tensor | None:
    r"""The layer's per-head mean gate :math:`\gamma` as ``(H, 1, 1)`` in ``dtype``, or ``None`` (:math:`\gamma = 1`).

    :param layer: the SGPA layer (its ``global_mean_gate`` parameter, ``(H,)``, or none).
    :param dtype: the dtype of the result.
    """
    gate = getattr(layer, "global_mean_gate", None)
    return None if gate is None else gate.to(dtype).reshape(-1, 1, 1)


def decoupled_kernel_blocks(kernel, params: ExpKernelParameters | None, queries: Tensor, factors: GlobalFactors):
    r""":math:`K_{qq} = K_{qa} = K_{aa}` ``(B, H, L, L)`` and :math:`K_{qg}` ``(B, H, L, M)``: RBF and exponential
    kernels build the queries' augmented inputs once, in the frame of the global keys, whose :math:`\tilde b`
    the global factors already hold (one product and one ``exp`` per block); other kernels
    evaluate both blocks with their own ``forward``.

    :param kernel: the layer's GPyTorch kernel (``batch_shape (H,)``).
    :param params: the RBF / exponential hyperparameters of :func:`~gpytorch_sgpa.kernels.exp_kernel_parameters`, or
        ``None`` for other kernels (then ``kernel``'s own ``forward`` is used).
    :param queries: the queries (= amortised keys) :math:`q`, ``(B, H, L, e)``.
    :param factors: the layer's :class:`GlobalFactors` (their keys and, for RBF / exponential, their features).
    """
    if params is None or factors.key_features is None:
        return dense_kernel_blocks(kernel, queries, (factors.keys,), include_self=True)
    features = exp_features(params, scaled_inputs(params, queries, factors.centre))
    query = cast(Tensor, features.query)  # built: query=True
    return exp_kernel(query, features.key), exp_kernel(query, factors.key_features)


def decoupled_terms(
    layer,
    queries,
    values,
    gram,
    cross,
    gram_values,
    amortised_mean,
    causal,
    key_padding_mask,
    factors: GlobalFactors,
    full_covariance: bool,
    sampler: str | None,
    global_noise: Tensor | None,
    params: ExpKernelParameters | None = None,
) -> PosteriorTerms:
    r"""Mean, KL and what ``sampler`` (``None``: :meth:`~gpytorch_sgpa.attention.SGPAttention.posterior`) needs, from :math:`K_{qq}`
    (``gram``) and :math:`K_{qg}` (``cross``).

    With ``global_noise`` :math:`\varepsilon` (``(B, H, e, M)``) the mean already holds the correlated global part
    of the sample, :math:`A^\top W_d \varepsilon_d`: it shares the one product with :math:`A^\top` the orthogonal mean needs.

    :param layer: the decoupled :class:`~gpytorch_sgpa.attention.SGPAttention` layer.
    :param queries: the queries (= amortised keys) :math:`q`, ``(B, H, L, e)``.
    :param values: the amortised values :math:`v_a`, ``(B, H, L, e)``, zero at padded positions.
    :param gram: :math:`K_{qq} = K_{qa} = K_{aa}`, ``(B, H, L, L)``.
    :param cross: :math:`K_{qg}`, ``(B, H, L, M)``.
    :param gram_values: :math:`K_{qa} v_a`, ``(B, H, L, e)``.
    :param amortised_mean: :math:`K_{qa} v_a` with the causal mask applied (``gram_values`` itself for a non-causal layer),
        ``(B, H, L, e)``.
    :param causal: bool ``(L, L)``, ``True`` where query :math:`i` may use key :math:`j \le i`; ``None`` for a
        non-causal layer.
    :param key_padding_mask: bool ``(B, L)``, ``True`` at padded positions, or ``None``.
    :param factors: the layer's :class:`GlobalFactors` in the dtype of ``queries``.
    :param full_covariance: whether to return the covariance across positions, ``(B, H, e, L, L)``.
    :param sampler: ``"full"``, ``"decomposed"`` or ``"diagonal"`` (:mod:`~gpytorch_sgpa.samplers`), or ``None`` for
        :meth:`~gpytorch_sgpa.attention.SGPAttention.posterior` (mean, variance and optionally covariance).
    :param global_noise: the standard-normal draws :math:`\varepsilon` of the global part, ``(B, H, e, M)``, or ``None``.
    :param params: the RBF / exponential hyperparameters, or ``None`` (the default) for other kernels.
    """
    # Aᵀ = K_qg L⁻ᵀ, (B, H, L, M): in this layout the product, the row sums of squares and their
    # backward passes are cheaper than with A itself (benchmarks/sgpa_cost.py --profile)
    whitened_t = cross.matmul(factors.chol_inverse.transpose(-2, -1))
    conditional = None
    if causal is not None or full_covariance or sampler == "full":  # K_qq - AᵀA
        conditional = gram - whitened_t.matmul(whitened_t.transpose(-2, -1))
    coefficient = None  # everything multiplied by Aᵀ, gathered in one (B, H, M, e) coefficient
    if global_noise is not None:  # W_d ε_d
        coefficient = torch.einsum("hdmn,bhdn->bhmd", factors.whitened_cov_factor, global_noise)
    amortised_kl = (values * gram_values).sum((-3, -2, -1))
    if layer.variant == "orthogonal":
        global_values = cast(Tensor, factors.whitened_values)  # Lᵀ v_g: the orthogonal variant has v_g
        whitened_values = whitened_t.transpose(-2, -1).matmul(values)  # A v_a, (B, H, M, e)
        gate = mean_gate(layer, values.dtype)  # γ, (H, 1, 1), or None for γ = 1
        if causal is not None:
            if gate is None:
                mean = cast(Tensor, conditional).masked_fill(~causal, 0.0).matmul(values)  # computed: causal
                own = global_values
            else:  # (K_qq - γ AᵀA) v_a, masked, + γ Aᵀ Lᵀ v_g
                shrunk = gram - gate * whitened_t.matmul(whitened_t.transpose(-2, -1))
                mean = shrunk.masked_fill(~causal, 0.0).matmul(values)
                own = gate * global_values
        else:
            mean = gram_values
            own = global_values - whitened_values  # Lᵀ v_g - A v_a
            if gate is not None:
                own = gate * own
        # own first: the sum is then contiguous, and the product below needs no copy of it
        coefficient = own if coefficient is None else own + coefficient
        squares = whitened_values * whitened_values  # (x * x: its backward is cheaper than square's)
        if gate is None:
            amortised_kl = amortised_kl - squares.sum((-3, -2, -1))
        else:  # ‖γ w + (1 - γ) A v_a‖² - ‖A v_a‖² - γ² ‖w‖² with w = Lᵀ v_g (γ² ‖w‖² is global)
            amortised_kl = amortised_kl - (gate * (2.0 - gate) * squares).sum((-3, -2, -1))
            cross_term = (gate * (1.0 - gate) * global_values * whitened_values).sum((-3, -2, -1))
            amortised_kl = torch.add(amortised_kl, cross_term, alpha=2.0)
    else:
        mean = amortised_mean
    if coefficient is not None:
        mean = mean + whitened_t.matmul(coefficient)
    global_kl = factors.kl.sum()
    kl = torch.add(global_kl, amortised_kl, alpha=0.5)
    variance = covariance = chol_factor = residual = None
    if sampler == "full":  # the full-covariance sampler needs neither variance nor covariance
        valid = None if key_padding_mask is None else (~key_padding_mask)[:, None, :]
        full = cast(Tensor, conditional)  # computed for sampler="full"
        chol_factor = masked_cholesky(full, valid, relative_jitter(layer.kernel, full.dtype, params))
    elif sampler == "decomposed":  # only diag(K_qq - AᵀA), O(B H L M)
        if params is not None and params.form == "rbf":  # k(q, q) = σ_f², (B, H, L)
            self_cov = params.outputscale.unsqueeze(-1).expand(*queries.shape[:-1])
        else:  # backward cheaper than through the diagonal of K_qq
            self_cov = dense_kernel(layer.kernel, queries, diag=True)
        residual = self_cov - _RowSquares.apply(whitened_t)
    else:
        projected = torch.einsum("hdmn,bhlm->bhdnl", factors.whitened_cov_factor, whitened_t)  # (B,H,e|1,M,L)
        variance = (gram.diagonal(dim1=-2, dim2=-1) - _RowSquares.apply(whitened_t)).unsqueeze(-2)
        variance = (variance + projected.square().sum(-2)).transpose(-2, -1).expand_as(mean)
        if full_covariance:
            covariance = cast(Tensor, conditional).unsqueeze(2) + projected.transpose(-2, -1).matmul(projected)  # computed: full_covariance
            covariance = covariance.expand(-1, -1, layer.head_dim, -1, -1)
    return PosteriorTerms(mean, variance, covariance, kl, chol_factor, residual, global_kl)


def decoupled_step_sample(layer, query, value, gram_row, mean, state) -> Tensor:
    r"""Sample at the new position :math:`t` from the cached prefix (``state``), equal to the last row
    of the batched sample: the orthogonal correction uses :math:`\sum_j a_j v_j^\top` over the prefix, the
    full sampler grows the Cholesky factor of :math:`K_{qq} - A^\top A + \text{jitter}\, I` by one row.

    :param layer: the causal decoupled :class:`~gpytorch_sgpa.attention.SGPAttention` layer.
    :param query: the new position's query (= amortised key) :math:`q_t`, ``(B, H, 1, e)``.
    :param value: the new position's value :math:`v_t`, ``(B, H, 1, e)``.
    :param gram_row: :math:`k(q_t, q_{\le t})`, ``(B, H, 1, t + 1)`` (its last entry :math:`k(q_t, q_t)`).
    :param mean: the amortised mean :math:`k(q_t, q_{\le t}) v_{\le t}`, ``(B, H, 1, e)``.
    :param state: the layer's :class:`~gpytorch_sgpa.multihead.SGPAStepState` (updated in place).
    """
    factors = state.global_factors
    cross = dense_kernel(layer.kernel, query, factors.keys)  # (B, H, 1, M)
    whitened = torch.linalg.solve_triangular(factors.chol, cross.transpose(-2, -1), upper=False)  # (B,H,M,1)
    if layer.variant == "orthogonal":
        state.projected_values = state.projected_values + whitened.matmul(value)
        correction = factors.whitened_values - state.projected_values  # Lᵀ v_g - A v_a over the prefix
        gate = mean_gate(layer, mean.dtype)
        if gate is not None:
            correction = gate * correction
        mean = mean + whitened.transpose(-2, -1).matmul(correction)
    self_cov = gram_row[..., -1:]  # k(q_t, q_t), (B, H, 1, 1)
    conditional_tt = self_cov - whitened.square().sum(-2, keepdim=True)
    jitter = relative_jitter(layer.kernel, conditional_tt.dtype)
    local = state.local_noise[..., -1:, :]
    if layer.sampler == "decomposed":
        global_term = torch.einsum("hdmn,bhdn->bhdm", factors.whitened_cov_factor, state.global_noise)
        return mean + torch.einsum("bhml,bhdm->bhld", whitened, global_term) + conditional_tt.clamp_min(jitter).sqrt() * local
    projected = torch.einsum("hdmn,bhml->bhdnl", factors.whitened_cov_factor, whitened)  # (B,H,e|1,M,1)
    if layer.sampler == "diagonal":
        variance = conditional_tt + projected.square().sum(-2).transpose(-2, -1)  # (B,H,1,e|1)
        state.whitened_keys = torch.cat([state.whitened_keys, whitened], dim=-1)
        return mean + variance.clamp_min(jitter).sqrt() * local
    conditional_row = gram_row[..., :-1] - whitened.transpose(-2, -1).matmul(state.whitened_keys)  # (B,H,1,t)
    previous_chol = state.conditional_chol
    row = torch.linalg.solve_triangular(previous_chol, conditional_row.transpose(-2, -1), upper=False)
    row = row.transpose(-2, -1)  # (B, H, 1, t)
    # the new Cholesky diagonal of (K_qq - AᵀA + jitter I), clamped as a PSD-safe Cholesky would
    diag = (conditional_tt + jitter - row.square().sum(-1, keepdim=True)).clamp_min(jitter).sqrt()
    top = torch.cat([previous_chol, previous_chol.new_zeros(*previous_chol.shape[:-1], 1)], dim=-1)
    state.conditional_chol = torch.cat([top, torch.cat([row, diag], dim=-1)], dim=-2)
    state.whitened_keys = torch.cat([state.whitened_keys, whitened], dim=-1)
    global_term = torch.einsum("hdmn,bhdn->bhdm", factors.whitened_cov_factor, state.global_noise)
    return mean + state.conditional_chol[..., -1:, :].matmul(state.local_noise) + torch.einsum("bhml,bhdm->bhld", whitened, global_term)
