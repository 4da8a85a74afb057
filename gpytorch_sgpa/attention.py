r"""Multi-head attention layers: scaled dot-product, kernel, and sparse Gaussian process attention.

Every layer has the call signature ``forward(x, key_padding_mask=None, global_inputs=None)`` and
returns ``(output, kl)``:

* ``x``: ``(batch, L, d_model)`` (the input ``s`` of the attention block, i.e. ``G_φ(F^{l-1})``);
* ``key_padding_mask``: optional bool ``(batch, L)``, ``True`` marks a padded position.  Padded
  positions never influence the outputs at the other positions nor the KL;
* ``global_inputs``: only used by decoupled :class:`SGPAttention` (ignored elsewhere): the global
  inducing inputs after the block's feature map, ``G_φ(Z_g)`` of eq. ``fhl``, shaped
  ``(num_heads, num_global, d_model)``.  When omitted the layer's own parameter
  ``global_inducing_inputs`` is used as is (``G_φ`` = identity);
* ``kl``: scalar tensor, the KL term of the layer averaged over the sequences of the batch and
  summed over heads and output dimensions (``0`` for the maximum-likelihood layers).

Shapes inside: ``B`` batch, ``H`` heads, ``L`` length, ``e = d_model / H`` head dimension,
``M`` number of global inducing points per head.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import gpytorch
import torch
from linear_operator.utils.cholesky import psd_safe_cholesky
from torch import Tensor, nn

from .kernels import KERNEL_NAMES, evaluate_kernel, kernel_blocks, make_attention_kernel

__all__ = [
    "ScaledDotProductAttention",
    "KernelAttention",
    "SGPAttention",
    "SGPANoise",
    "SGPAPosterior",
    "SGPAStepState",
    "SGPA_MODES",
    "SGPA_VARIANTS",
    "SGPA_SAMPLERS",
]

SGPA_MODES = ("standard", "decoupled")
SGPA_VARIANTS = ("orthogonal", "dsvgp")
SGPA_SAMPLERS = ("diagonal", "full", "decomposed")


def _check_sizes(d_model, num_heads, dropout) -> int:
    for name, value in (("d_model", d_model), ("num_heads", num_heads)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{name} must be an int, got {type(value).__name__}")
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    if d_model % num_heads != 0:
        raise ValueError(f"d_model must be divisible by num_heads, got d_model={d_model}, num_heads={num_heads}")
    if not isinstance(dropout, (int, float)) or not 0.0 <= dropout < 1.0:
        raise ValueError(f"dropout must be a float in [0, 1), got {dropout!r}")
    return d_model // num_heads


def _gp_dtype(dtype: torch.dtype) -> torch.dtype:
    """The GP algebra (Gram matrices, Cholesky, solves, KL) runs in float32 at least."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def _relative_jitter(kernel, dtype: torch.dtype) -> Tensor:
    """``gpytorch.settings.cholesky_jitter`` times each head's ``σ_f²``, shaped ``(H, 1, 1)``.

    An absolute jitter is swamped (or swamps) when ``σ_f²`` is far from 1; relative to ``σ_f²``
    it is the same fraction of every Gram matrix's scale (``k(x, x) >= σ_f²`` for both kernels).
    """
    scale = kernel.outputscale.detach().to(dtype)
    return gpytorch.settings.cholesky_jitter.value(dtype) * scale.reshape(-1, 1, 1)


def _no_autocast(x: Tensor):
    """Context in which the GP algebra runs in its own dtype, not autocast's."""
    return torch.autocast(device_type=x.device.type, enabled=False)


def _causal_mask(length: int, device) -> Tensor:
    return torch.ones(length, length, dtype=torch.bool, device=device).tril()


class _MultiHeadAttention(gpytorch.Module):
    """Shared input checks and head splitting.

    ``gpytorch.Module.__call__`` skips ``nn.Module``'s hooks; the layers use ``nn.Module``'s so
    that forward (pre-)hooks fire (profilers, activation capture, offloading).
    """

    __call__ = nn.Module.__call__

    def __init__(self, d_model: int, num_heads: int, dropout: float, causal: bool):
        super().__init__()
        self.head_dim = _check_sizes(d_model, num_heads, dropout)
        if not isinstance(causal, bool):
            raise TypeError(f"causal must be a bool, got {type(causal).__name__}")
        self.d_model = d_model
        self.num_heads = num_heads
        self.causal = causal
        self.dropout = nn.Dropout(dropout)
        self.out_proj = nn.Linear(d_model, d_model)

    def _check_input(self, x: Tensor, key_padding_mask: Tensor | None) -> None:
        if not isinstance(x, Tensor) or not x.is_floating_point():
            raise TypeError(f"x must be a floating-point tensor, got {type(x).__name__}")
        if x.dim() != 3 or x.shape[-1] != self.d_model:
            raise ValueError(f"x must have shape (batch, L, d_model={self.d_model}), got {tuple(x.shape)}")
        if key_padding_mask is not None:
            if not isinstance(key_padding_mask, Tensor) or key_padding_mask.dtype != torch.bool:
                raise TypeError("key_padding_mask must be a bool tensor (True = padded)")
            if key_padding_mask.shape != x.shape[:2]:
                raise ValueError(
                    f"key_padding_mask must have shape (batch, L)={tuple(x.shape[:2])}, "
                    f"got {tuple(key_padding_mask.shape)}"
                )
            if key_padding_mask.all(-1).any():
                raise ValueError("key_padding_mask pads every position of some sequence; each needs >= 1 token")

    def _check_step(self, x_t: Tensor, state) -> None:
        if not self.causal:
            raise ValueError("forward_step needs a causal layer (causal=True)")
        self._check_input(x_t, None)
        if x_t.shape[1] != 1:
            raise ValueError(f"x_t must hold exactly one token, shape (batch, 1, d_model), got {tuple(x_t.shape)}")
        if state is not None and state.keys.shape[0] != x_t.shape[0]:
            raise ValueError(f"x_t has batch size {x_t.shape[0]} but the state holds {state.keys.shape[0]}")

    def _split(self, x: Tensor) -> Tensor:
        batch, length, _ = x.shape
        return x.view(batch, length, self.num_heads, self.head_dim).transpose(1, 2)

    def _merge(self, x: Tensor) -> Tensor:
        batch, _, length, _ = x.shape
        return x.transpose(1, 2).reshape(batch, length, self.d_model)

    def _key_mask(self, key_padding_mask: Tensor | None, length: int, device) -> Tensor | None:
        """Bool ``(B or 1, 1, L, L)`` mask of allowed (query, key) pairs, or ``None`` for all."""
        allowed = None
        if key_padding_mask is not None:
            allowed = (~key_padding_mask)[:, None, None, :]
        if self.causal:
            causal = _causal_mask(length, device)
            allowed = causal if allowed is None else allowed & causal
        return allowed


class ScaledDotProductAttention(_MultiHeadAttention):
    r"""Multi-head scaled dot-product attention, eq. ``sdp``: ``softmax(q kᵀ/√d_k) v`` (MLE baseline).

    Separate query/key/value projections, head outputs combined by eq. ``combine_heads``;
    ``dropout`` acts on the attention weights (MC dropout keeps it active at test time).
    Returns ``(output, kl)`` with ``kl = 0``.
    """

    def __init__(self, d_model: int, num_heads: int, dropout: float = 0.0, causal: bool = False):
        super().__init__(d_model, num_heads, dropout, causal)
        self.q_proj = nn.Linear(d_model, d_model)
        self.k_proj = nn.Linear(d_model, d_model)
        self.v_proj = nn.Linear(d_model, d_model)

    def forward(self, x: Tensor, key_padding_mask: Tensor | None = None, global_inputs: Tensor | None = None):
        self._check_input(x, key_padding_mask)
        q, k, v = self._split(self.q_proj(x)), self._split(self.k_proj(x)), self._split(self.v_proj(x))
        scores = q.matmul(k.transpose(-2, -1)) / math.sqrt(self.head_dim)
        allowed = self._key_mask(key_padding_mask, x.shape[1], x.device)
        if allowed is not None:
            # a padded query of a causal layer with left padding has no allowed key: it gets
            # zero weights (not softmax(-inf, ..., -inf) = NaN, which would reach valid positions)
            scores = scores.masked_fill(~allowed, float("-inf"))
            weights = torch.softmax(scores.masked_fill(~allowed.any(-1, keepdim=True), 0.0), dim=-1)
            weights = weights.masked_fill(~allowed, 0.0)
        else:
            weights = torch.softmax(scores, dim=-1)
        return self.out_proj(self._merge(self.dropout(weights).matmul(v))), x.new_zeros(())

    def forward_step(self, x_t: Tensor, state: SGPAStepState | None = None, global_inputs=None, noise=None):
        """One new token ``(B, 1, d_model)`` of a causal layer with a key/value cache: ``(output_t, state)``."""
        self._check_step(x_t, state)
        q, k, v = self._split(self.q_proj(x_t)), self._split(self.k_proj(x_t)), self._split(self.v_proj(x_t))
        state = _append_to_cache(state, k, v)
        scores = q.matmul(state.keys.transpose(-2, -1)) / math.sqrt(self.head_dim)
        weights = self.dropout(torch.softmax(scores, dim=-1))
        return self.out_proj(self._merge(weights.matmul(state.values))), state


class KernelAttention(_MultiHeadAttention):
    r"""Multi-head kernel attention, eq. ``kattn``: ``F = K_{qk} v`` (MLE baseline).

    Queries and keys share one projection ``W_qk`` (Tsai et al., 2019) so that ``K_{qk}`` is a
    symmetric kernel's Gram matrix; ``kernel`` is ``"rbf"`` (ARD-RBF) or ``"exponential"``, one
    set of hyperparameters per head, initialised by ``kernel_init`` (see
    :func:`~gpytorch_sgpa.kernels.make_attention_kernel`).  ``dropout`` acts on the Gram matrix entries.  Returns
    ``(output, kl)`` with ``kl = 0``.
    """

    def __init__(self, d_model: int, num_heads: int, kernel: str = "rbf", dropout: float = 0.0, causal: bool = False,
                 kernel_init: str = "sdp"):
        super().__init__(d_model, num_heads, dropout, causal)
        self.kernel = make_attention_kernel(kernel, self.head_dim, num_heads, init=kernel_init)
        self.kernel_name = kernel
        self.qk_proj = nn.Linear(d_model, d_model, bias=False)
        self.v_proj = nn.Linear(d_model, d_model, bias=False)

    def forward(self, x: Tensor, key_padding_mask: Tensor | None = None, global_inputs: Tensor | None = None):
        self._check_input(x, key_padding_mask)
        q, v = self._split(self.qk_proj(x)), self._split(self.v_proj(x))
        gram = evaluate_kernel(self.kernel, q)
        allowed = self._key_mask(key_padding_mask, x.shape[1], x.device)
        if allowed is not None:
            gram = gram.masked_fill(~allowed, 0.0)
        heads = self.dropout(gram).matmul(v)
        return self.out_proj(self._merge(heads)), x.new_zeros(())

    def forward_step(self, x_t: Tensor, state: SGPAStepState | None = None, global_inputs=None, noise=None):
        """One new token ``(B, 1, d_model)`` of a causal layer with a key/value cache: ``(output_t, state)``."""
        self._check_step(x_t, state)
        q, v = self._split(self.qk_proj(x_t)), self._split(self.v_proj(x_t))
        state = _append_to_cache(state, q, v)
        gram_row = evaluate_kernel(self.kernel, q, state.keys)  # (B, H, 1, t+1)
        return self.out_proj(self._merge(self.dropout(gram_row).matmul(state.values))), state


class SGPANoise(NamedTuple):
    """Standard-normal draws behind one SGPA sample (eq. ``reparam_dgp``).

    ``local``: ``(B, H, L, e)``, one per position and output dimension.  ``global_``:
    ``(B, H, e, M)`` or ``None``; only used by the decoupled mode with ``sampler="full"``
    (``diag_sample=False``), where the sample is
    ``m + chol(K_qq - K_qg K_gg⁻¹ K_gq) ε_local + K_qg K_gg⁻¹ C_d ε_global`` and ``S_g = C Cᵀ``
    (exact draw from ``N(m_d, Σ_d)`` of eq. ``odsvgp``), and with ``sampler="decomposed"``, where
    it is ``m + sqrt(diag(K_qq - K_qg K_gg⁻¹ K_gq)) ⊙ ε_local + K_qg K_gg⁻¹ C_d ε_global``.
    """

    local: Tensor
    global_: Tensor | None = None


class SGPAPosterior(NamedTuple):
    """Per-head posterior of the attention outputs (before the output projection).

    ``mean``: ``(B, H, L, e)``; ``variance``: ``(B, H, L, e)`` marginal variances; ``covariance``:
    ``(B, H, e, L, L)`` when requested, else ``None``; ``kl``: ``(B,)`` per-sequence KL summed over
    heads and output dimensions (App. B.1.2).
    """

    mean: Tensor
    variance: Tensor
    covariance: Tensor | None
    kl: Tensor


class _GlobalFactors(NamedTuple):
    keys: Tensor  # k_g, (H, M, e)
    chol: Tensor  # L with L Lᵀ = K_gg + jitter I, (H, M, M)
    whitened_cov_factor: Tensor  # W_d = L⁻¹ C_d, (H, e or 1, M, M)
    whitened_values: Tensor | None  # Lᵀ v_g, (H, M, e) (orthogonal variant)
    kl: Tensor  # (H,) global part of the KL, summed over output dimensions


@dataclass
class SGPAStepState:
    """Key/value cache of a causal attention layer for autoregressive prediction.

    Created by the first ``forward_step`` call of a causal :class:`SGPAttention`,
    :class:`KernelAttention` or :class:`ScaledDotProductAttention` and updated in place by the
    following ones (the maximum-likelihood layers use ``keys`` and ``values`` only).  ``length``
    tokens have been processed.
    """

    keys: Tensor  # (B, H, t, e)
    values: Tensor  # (B, H, t, e)
    global_factors: _GlobalFactors | None = None
    projected_values: Tensor | None = None  # Σ_j a_j v_jᵀ, (B, H, M, e) (orthogonal variant)
    whitened_keys: Tensor | None = None  # a_j = L⁻¹ K_g,k_j, (B, H, M, t) (full covariance)
    conditional_chol: Tensor | None = None  # chol of K_qq - AᵀA over the prefix, (B, H, t, t)
    local_noise: Tensor | None = None  # (B, H, t, e) (full covariance)
    global_noise: Tensor | None = None  # (B, H, e, M) (full covariance, decoupled)

    @property
    def length(self) -> int:
        return self.keys.shape[-2]


def _append_to_cache(state: SGPAStepState | None, keys: Tensor, values: Tensor) -> SGPAStepState:
    if state is None:
        return SGPAStepState(keys=keys, values=values)
    state.keys = torch.cat([state.keys, keys], dim=-2)
    state.values = torch.cat([state.values, values], dim=-2)
    return state


class SGPAttention(_MultiHeadAttention):
    r"""Sparse Gaussian process attention (thesis ch. 3): each head's output is an SVGP posterior.

    Queries and amortised keys share the projection ``W_qk`` (``q = k_a = s W_qk``), values are
    ``v_a = s W_v`` (eq. ``fhl``); the head outputs are sampled by reparameterisation
    (eq. ``reparam_dgp``) and combined by the output projection (eq. ``combine_heads``).

    ``mode="standard"`` (eq. ``fpost``): inducing inputs are the amortised keys only, the
    variational covariance is input dependent, ``S = L_S L_Sᵀ`` with row ``i`` of ``L_S`` the
    projection ``s_i W_s`` (strictly lower part; diagonal through ``exp``), tied across output
    dimensions; it needs ``max_len`` (``W_s`` has one column per position).  Since queries equal
    keys, eq. ``fpost`` reduces exactly to mean ``K_qk v`` and covariance ``S``; the KL (App. B.1.1
    with ``v = K⁻¹ m_u``) needs one Cholesky of ``K_kk`` per sequence and head.

    ``mode="decoupled"``: ``M = num_global`` global inducing inputs ``Z_g`` per head, a parameter
    in the layer's input space (``global_inducing_inputs``, ``(H, M, d_model)``); the keys are
    ``k_g = G_φ(Z_g) W_qk`` where ``G_φ(Z_g)`` is passed as ``global_inputs`` by the model
    (eq. ``fhl``).  Variational parameters ``v_g`` (``(H, M, e)``) and ``C`` lower triangular,
    exp-diagonal, one per output dimension (``(H, e, M, M)``; one per head with
    ``share_covariance=True``).  ``whitened=True`` (GPyTorch's term; the authors'
    parameterisation) sets ``S_g = L C Cᵀ Lᵀ`` with ``L L ᵀ = K_gg``, so ``C`` parameterises
    ``q`` of the whitened variables ``L⁻¹ u_g`` and stays well scaled whatever ``K_gg``;
    ``whitened=False`` sets ``S_g = C Cᵀ``.

    * ``variant="orthogonal"`` (ODSVGP, eq. ``odsvgp`` / ``dsgp_predictive``):
      ``m_d = K_qa v_a - K_qg K_gg⁻¹ K_ga v_a + K_qg v_g``;
    * ``variant="dsvgp"`` (eq. ``naivedsvgp``): ``m_d = K_qa v_a``;
    * both: ``Σ_d = K_qq + K_qg K_gg⁻¹ (S_g,d - K_gg) K_gg⁻¹ K_gq``.

    KL (App. B.1.2, including the constant ``-M/2`` per dimension so it is the exact KL):
    ``½ Σ_d [v_a,dᵀ B v_a,d + v_g,dᵀ K_gg v_g,d + tr(K_gg⁻¹ S_g,d) - log|S_g,d| + log|K_gg| - M]``,
    which whitened is ``½ Σ_d [v_a,dᵀ B v_a,d + v_g,dᵀ K_gg v_g,d + ‖C_d‖²_F - log|C_d C_dᵀ| - M]``
    with ``B = K_aa - K_ag K_gg⁻¹ K_ga`` (orthogonal) or ``B = K_aa`` (dsvgp: the RKHS norm of the
    decoupled mean, which is the exact KL of ``q(u) = N(K_{Z a} v_a, S_u)`` over ``Z = (k_g, k_a)``;
    there ``v_g`` is unused).

    ``kernel_init`` chooses the kernel hyperparameters' initialisation (``"sdp"`` or the authors',
    ``"authors"``; :func:`~gpytorch_sgpa.kernels.make_attention_kernel`); ``v_g``, ``C``'s strictly
    lower part and log-diagonal start ``N(0, variational_init_std²)`` (thesis App. B.4).

    Cost per forward: one Cholesky of ``K_gg`` per head shared by the batch, triangular solves,
    no inverses.  In eval mode with gradients disabled the global factors (``k_g``, the Cholesky of
    ``K_gg``, ``L⁻¹ C``, ``Lᵀ v_g``, global KL) are cached; the cache is dropped by ``train()``
    and whenever a parameter or ``global_inputs`` changes.  Jitter
    ``gpytorch.settings.cholesky_jitter`` is added to ``K_gg`` (escalated by linear_operator's
    ``psd_safe_cholesky`` if needed).

    Samplers (``sampler``; when ``None`` it is ``"diagonal"`` if ``diag_sample`` else ``"full"``,
    so ``diag_sample`` keeps its meaning; ``layer.diag_sample`` reads/sets the same choice):

    * ``"diagonal"`` (``diag_sample=True``, the default): each position independently from its
      marginal ``N(m_d(q), Σ_d(q, q))`` of eq. ``odsvgp`` (App. B.4, the diagonalised covariance of
      the thesis' sampler);
    * ``"full"`` (``diag_sample=False``): the full covariance, as ``m + chol(K_qq - K_qg K_gg⁻¹
      K_gq) ε + K_qg K_gg⁻¹ C_d ε_g`` (one ``L × L`` Cholesky per sequence and head, shared by the
      output dimensions);
    * ``"decomposed"`` (decoupled mode only): eq. ``odsvgp`` written as
      ``Σ_d = (K_qq - Q_qq) + A S_g,d Aᵀ`` with ``A = K_qg K_gg⁻¹``, ``Q_qq = A K_gg Aᵀ``; the
      global part is drawn exactly and only the residual ``K_qq - Q_qq`` is diagonalised:
      ``f_d(q) = m_d(q) + A_q C_d ε_d + sqrt(k(q, q) - A_q K_gg A_qᵀ) ξ_{q,d}`` with
      ``ε_d ~ N(0, I_M)`` drawn once per sequence (shared by its queries) and ``ξ`` iid.  The
      marginals are exact: ``ε`` and ``ξ`` are independent, so ``Var f_d(q) = A_q S_g,d A_qᵀ +
      k(q, q) - Q_qq(q, q) = Σ_d(q, q)``; the cross-position covariance is ``A S_g,d Aᵀ`` (the
      residual's off-diagonal is dropped).  It never forms ``diag(A S_g,d Aᵀ)``: ``C_d ε_d`` costs
      ``O(B H e M²)`` and ``A (C_d ε_d)`` ``O(B H L M e)``.  The residual variance is clamped below
      at the Cholesky jitter before its square root.

    Per layer the marginal variances of ``"diagonal"`` cost ``O(B H L e M²)`` with one ``S_g`` per
    output dimension and ``O(B H L M²)`` with ``share_covariance=True``; the full-covariance
    sampler costs ``O(B H (L³ + L² e + L M e + e M²))``, so for short sequences it is the cheaper
    of the two; ``"decomposed"`` costs ``O(B H (e M² + L M e))`` on top of the mean's
    ``O(B H L M²)`` solve.  :meth:`posterior` is the same for every sampler.  ``causal=True`` lets position ``i`` use the
    amortised keys ``j <= i`` only (a decoder layer; the KL is that of the whole sequence's
    inducing set, i.e. of the last position); :meth:`forward_step` then predicts one token
    at a time with a key/value cache and reproduces :meth:`forward` given the same noise.
    """

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        kernel: str = "rbf",
        mode: str = "decoupled",
        variant: str = "orthogonal",
        num_global: int = 32,
        diag_sample: bool = True,
        causal: bool = False,
        dropout: float = 0.0,
        max_len: int | None = None,
        share_covariance: bool = False,
        variational_init_std: float = 1.0,
        sampler: str | None = None,
        whitened: bool = False,
        kernel_init: str = "sdp",
    ):
        super().__init__(d_model, num_heads, dropout, causal)
        if not isinstance(mode, str) or mode not in SGPA_MODES:
            raise ValueError(f"mode must be one of {SGPA_MODES}, got {mode!r}")
        if not isinstance(variant, str) or variant not in SGPA_VARIANTS:
            raise ValueError(f"variant must be one of {SGPA_VARIANTS}, got {variant!r}")
        if not isinstance(kernel, str) or kernel not in KERNEL_NAMES:
            raise ValueError(f"kernel must be one of {KERNEL_NAMES}, got {kernel!r}")
        if not isinstance(diag_sample, bool):
            raise TypeError(f"diag_sample must be a bool, got {type(diag_sample).__name__}")
        if not isinstance(whitened, bool):
            raise TypeError(f"whitened must be a bool, got {type(whitened).__name__}")
        if not variational_init_std > 0:
            raise ValueError(f"variational_init_std must be > 0, got {variational_init_std!r}")
        if sampler is None:
            sampler = "diagonal" if diag_sample else "full"
        elif not isinstance(sampler, str) or sampler not in SGPA_SAMPLERS:
            raise ValueError(f"sampler must be one of {SGPA_SAMPLERS} or None, got {sampler!r}")
        elif sampler == "diagonal" and not diag_sample:
            raise ValueError("sampler='diagonal' contradicts diag_sample=False; pass only one of them")
        if sampler == "decomposed" and mode != "decoupled":
            raise ValueError(
                "sampler='decomposed' needs mode='decoupled' (it splits Σ_d of eq. odsvgp into its "
                "global-inducing part and the residual K_qq - Q_qq; standard SGPA has no such split)"
            )
        self.mode = mode
        self.variant = variant
        self.kernel_name = kernel
        self.sampler = sampler
        self.whitened = whitened
        self.kernel = make_attention_kernel(kernel, self.head_dim, num_heads, init=kernel_init)
        self.qk_proj = nn.Linear(d_model, d_model, bias=False)
        self.v_proj = nn.Linear(d_model, d_model, bias=False)
        heads, e = num_heads, self.head_dim
        if mode == "standard":
            if isinstance(max_len, bool) or not isinstance(max_len, int) or max_len < 1:
                raise ValueError(f"mode='standard' needs max_len, a positive int, got {max_len!r}")
            self.max_len = max_len
            self.cov_proj = nn.Linear(d_model, heads * max_len)
            self.global_inducing_inputs = None
        else:
            if isinstance(num_global, bool) or not isinstance(num_global, int):
                raise TypeError(f"num_global must be an int, got {type(num_global).__name__}")
            if num_global < 1:
                raise ValueError(f"num_global must be >= 1, got {num_global}")
            self.max_len = max_len
            self.num_global = num_global
            cov_dims = 1 if share_covariance else e
            std = variational_init_std
            self.global_inducing_inputs = nn.Parameter(torch.randn(heads, num_global, d_model))
            if variant == "orthogonal":
                self.global_values = nn.Parameter(std * torch.randn(heads, num_global, e))
            else:
                self.global_values = None
            self.global_chol_lower = nn.Parameter(std * torch.randn(heads, cov_dims, num_global, num_global))
            self.global_chol_log_diag = nn.Parameter(std * torch.randn(heads, cov_dims, num_global))
        self.share_covariance = share_covariance
        self._cache = None

    @property
    def diag_sample(self) -> bool:
        """``True`` iff ``sampler == "diagonal"``; setting it selects ``"diagonal"`` / ``"full"``."""
        return self.sampler == "diagonal"

    @diag_sample.setter
    def diag_sample(self, value: bool) -> None:
        if not isinstance(value, bool):
            raise TypeError(f"diag_sample must be a bool, got {type(value).__name__}")
        self.sampler = "diagonal" if value else "full"

    def _uses_global_noise(self) -> bool:
        return self.mode == "decoupled" and self.sampler in ("full", "decomposed")

    # ------------------------------------------------------------------ caching
    def train(self, mode: bool = True):
        self._cache = None
        return super().train(mode)

    def clear_cache(self) -> None:
        """Drop the eval-mode cache of the global factors (automatic on parameter changes)."""
        self._cache = None

    def _global_parameters(self) -> list[Tensor]:
        """The parameters the global factors depend on."""
        tensors = [self.qk_proj.weight, self.global_inducing_inputs, self.global_chol_lower, self.global_chol_log_diag]
        if self.global_values is not None:
            tensors.append(self.global_values)
        return tensors + list(self.kernel.parameters())

    # ------------------------------------------------------------------ pieces
    def global_cov_factor(self, dtype: torch.dtype | None = None) -> Tensor:
        """``C`` (``S_g = C Cᵀ``, whitened ``S_g = L C Cᵀ Lᵀ``): strictly lower part plus ``exp``
        diagonal, ``(H, e or 1, M, M)``."""
        lower, log_diag = self.global_chol_lower, self.global_chol_log_diag
        if dtype is not None:
            lower, log_diag = lower.to(dtype), log_diag.to(dtype)
        return lower.tril(-1) + torch.diag_embed(log_diag.exp())

    def global_keys(self, global_inputs: Tensor | None = None, dtype: torch.dtype | None = None) -> Tensor:
        """``k_g = G_φ(Z_g) W_qk`` per head (eq. ``fhl``), ``(H, M, e)``."""
        inputs = self._global_inputs(global_inputs)
        weight = self.qk_proj.weight.view(self.num_heads, self.head_dim, self.d_model)
        if dtype is not None:
            inputs, weight = inputs.to(dtype), weight.to(dtype)
        return torch.einsum("hmd,hed->hme", inputs, weight)

    def _global_inputs(self, global_inputs: Tensor | None) -> Tensor:
        if self.mode != "decoupled":
            raise ValueError("global inducing inputs exist only for mode='decoupled'")
        if global_inputs is None:
            return self.global_inducing_inputs
        if not isinstance(global_inputs, Tensor):
            raise TypeError(f"global_inputs must be a tensor, got {type(global_inputs).__name__}")
        expected = (self.num_heads, self.num_global, self.d_model)
        if tuple(global_inputs.shape) != expected:
            raise ValueError(f"global_inputs must have shape {expected}, got {tuple(global_inputs.shape)}")
        return global_inputs

    def _global_factors(self, global_inputs: Tensor | None, dtype: torch.dtype) -> _GlobalFactors:
        """The global factors; in eval mode without gradients cached, keyed on the values they
        depend on (GPyTorch's setters and ``.data`` writes do not bump a tensor's ``_version``)."""
        if self.training or torch.is_grad_enabled():
            return self._compute_global_factors(global_inputs, dtype)
        key = [t.detach() for t in self._global_parameters()] + ([] if global_inputs is None else [global_inputs])
        if self._cache is not None:
            cached_key, cached_dtype, factors = self._cache
            if cached_dtype == dtype and len(cached_key) == len(key) and all(
                a.shape == b.shape and a.dtype == b.dtype and torch.equal(a, b) for a, b in zip(cached_key, key)
            ):
                return factors
        factors = self._compute_global_factors(global_inputs, dtype)
        self._cache = ([t.detach().clone() for t in key], dtype, factors)
        return factors

    def _compute_global_factors(self, global_inputs: Tensor | None, dtype: torch.dtype) -> _GlobalFactors:
        keys = self.global_keys(global_inputs, dtype)
        gram = evaluate_kernel(self.kernel, keys)
        num_global = gram.shape[-1]
        eye = torch.eye(num_global, dtype=gram.dtype, device=gram.device)
        chol = psd_safe_cholesky(gram + _relative_jitter(self.kernel, dtype) * eye)
        cov_factor = self.global_cov_factor(dtype)
        if self.whitened:  # W_d = L⁻¹ (L C_d) = C_d; log|S_g,d| - log|K_gg| = log|C_d C_dᵀ|
            whitened_cov_factor, log_det_prior = cov_factor, 0.0
        else:
            whitened_cov_factor = torch.linalg.solve_triangular(chol.unsqueeze(1), cov_factor, upper=False)
            log_det_prior = 2.0 * chol.diagonal(dim1=-2, dim2=-1).log().sum(-1, keepdim=True)
        whitened_values = None
        if self.global_values is not None:
            whitened_values = chol.transpose(-2, -1).matmul(self.global_values.to(dtype))
        e = self.head_dim
        per_dim = (
            whitened_cov_factor.square().sum((-2, -1))
            - 2.0 * self.global_chol_log_diag.to(dtype).sum(-1)
            + log_det_prior
            - num_global
        )  # (H, e or 1)
        cov_kl = per_dim.sum(-1) * (e if self.share_covariance else 1)
        mean_kl = whitened_values.square().sum((-2, -1)) if self.variant == "orthogonal" else 0.0
        kl = 0.5 * (cov_kl + mean_kl)
        return _GlobalFactors(keys, chol, whitened_cov_factor, whitened_values, kl)

    def global_kl(self, global_inputs: Tensor | None = None) -> Tensor:
        """KL of the global inducing variables (App. B.1.2), summed over heads and output
        dimensions: the part of every sequence's KL that all sequences share (``0`` for standard)."""
        if self.mode != "decoupled":
            return self.qk_proj.weight.new_zeros((), dtype=_gp_dtype(self.qk_proj.weight.dtype))
        return self._global_factors(global_inputs, _gp_dtype(self.qk_proj.weight.dtype)).kl.sum()

    def _project(self, x: Tensor, key_padding_mask: Tensor | None):
        """Queries and values (under any autocast), returned in the GP algebra's dtype."""
        dtype = _gp_dtype(x.dtype)
        queries = self._split(self.qk_proj(x)).to(dtype)
        values = self._split(self.v_proj(x)).to(dtype)
        if key_padding_mask is not None:
            values = values.masked_fill(key_padding_mask[:, None, :, None], 0.0)
        return queries, values

    def _standard_cov_factor(self, x: Tensor, key_padding_mask: Tensor | None) -> Tensor:
        """``L_S`` of eq. ``fpost`` (input-dependent Cholesky factor), ``(B, H, L, L)``."""
        batch, length, _ = x.shape
        if length > self.max_len:
            raise ValueError(f"sequence length {length} exceeds max_len={self.max_len} of mode='standard'")
        raw = self.cov_proj(x).to(_gp_dtype(x.dtype))
        raw = raw.view(batch, length, self.num_heads, self.max_len).transpose(1, 2)[..., :length]
        factor = raw.tril(-1) + torch.diag_embed(raw.diagonal(dim1=-2, dim2=-1).exp())
        if key_padding_mask is not None:
            valid = (~key_padding_mask)[:, None, :].to(factor.dtype)
            factor = factor * valid.unsqueeze(-1) * valid.unsqueeze(-2)
            factor = factor + torch.diag_embed(key_padding_mask[:, None, :].to(factor.dtype)).expand_as(factor)
        return factor

    # ------------------------------------------------------------------ posterior
    def _posterior_terms(
        self, x, key_padding_mask, global_inputs, full_covariance: bool, with_sampler: bool, global_noise=None
    ):
        """Mean, variance, optional covariance, per-sequence KL and what sampling needs.

        With ``global_noise`` ``ε`` (decoupled mode, ``(B, H, e, M)``) the returned mean already holds
        the correlated global part of the sample, ``m_d + K_qg K_gg⁻¹ C_d ε_d = m_d + Aᵀ W_d ε_d``:
        it shares the one product with ``Aᵀ`` that the orthogonal mean needs.
        """
        queries, values = self._project(x, key_padding_mask)
        if self.mode == "decoupled":
            factors = self._global_factors(global_inputs, queries.dtype)
            # K_qq = K_qa = K_aa (B, H, L, L) and K_qg (B, H, L, M) in one kernel pass
            gram, cross = kernel_blocks(self.kernel, queries, factors.keys)
        else:
            gram = evaluate_kernel(self.kernel, queries)  # K_qq = K_qa = K_aa, (B, H, L, L)
        length = x.shape[1]
        causal = _causal_mask(length, x.device) if self.causal else None
        gram_values = gram.matmul(values)
        amortised_mean = gram.masked_fill(~causal, 0.0).matmul(values) if causal is not None else gram_values
        valid = None if key_padding_mask is None else (~key_padding_mask)[:, None, :]
        sampler = {}
        if self.mode == "standard":
            factor = self._standard_cov_factor(x, key_padding_mask)
            mean = amortised_mean
            variance = factor.square().sum(-1).unsqueeze(-1).expand_as(mean)
            covariance = None
            if full_covariance:
                covariance = factor.matmul(factor.transpose(-2, -1)).unsqueeze(2).expand(-1, -1, self.head_dim, -1, -1)
            kl = self._standard_kl(gram, gram_values, values, factor, key_padding_mask)
            sampler["cov_factor"] = factor
            return mean, variance, covariance, kl, sampler

        whitened = torch.linalg.solve_triangular(factors.chol, cross.transpose(-2, -1), upper=False)  # A, (B,H,M,L)
        need_conditional = causal is not None or full_covariance or (with_sampler and self.sampler == "full")
        conditional = None
        if need_conditional:  # K_qq - K_qg K_gg⁻¹ K_gq
            conditional = gram - whitened.transpose(-2, -1).matmul(whitened)
        # everything multiplied by Aᵀ is gathered in one (B, H, M, e) coefficient: one product
        coefficient = None
        if global_noise is not None:  # W_d ε_d, (B, H, M, e)
            coefficient = torch.einsum("hdmn,bhdn->bhmd", factors.whitened_cov_factor, global_noise)
        if self.variant == "orthogonal":
            whitened_values = whitened.matmul(values)  # A v_a, (B, H, M, e)
            if causal is not None:
                mean = conditional.masked_fill(~causal, 0.0).matmul(values)
                own = factors.whitened_values
            else:
                mean = gram_values
                own = factors.whitened_values - whitened_values  # Lᵀ v_g - A v_a
            coefficient = own if coefficient is None else coefficient + own
            amortised_kl = (values * gram_values).sum((-3, -2, -1)) - whitened_values.square().sum((-3, -2, -1))
        else:
            mean = amortised_mean
            amortised_kl = (values * gram_values).sum((-3, -2, -1))
        if coefficient is not None:
            mean = mean + whitened.transpose(-2, -1).matmul(coefficient)
        kl = 0.5 * amortised_kl + factors.kl.sum()
        # Σ_d = (K_qq - AᵀA) + (W_dᵀ A)ᵀ (W_dᵀ A),  W_d = L⁻¹ C_d
        variance = covariance = None
        if with_sampler and self.sampler == "full":  # the full-covariance sampler needs neither
            sampler["conditional_chol"] = self._conditional_chol(conditional, valid)
        elif with_sampler and self.sampler == "decomposed":  # only diag(K_qq - AᵀA), O(B H L M)
            self_cov = evaluate_kernel(self.kernel, queries, diag=True)  # k(q, q), (B, H, L); backward cheaper
            sampler["residual_variance"] = self_cov - whitened.square().sum(-2)
        else:
            projected = torch.einsum("hdmn,bhml->bhdnl", factors.whitened_cov_factor, whitened)  # (B,H,e|1,M,L)
            variance = (gram.diagonal(dim1=-2, dim2=-1) - whitened.square().sum(-2)).unsqueeze(-2)
            variance = (variance + projected.square().sum(-2)).transpose(-2, -1).expand_as(mean)
        if full_covariance:
            covariance = conditional.unsqueeze(2) + projected.transpose(-2, -1).matmul(projected)
            covariance = covariance.expand(-1, -1, self.head_dim, -1, -1)
        sampler["whitened"] = whitened
        sampler["factors"] = factors
        return mean, variance, covariance, kl, sampler

    def _conditional_chol(self, conditional: Tensor, valid: Tensor | None) -> Tensor:
        length = conditional.shape[-1]
        eye = torch.eye(length, dtype=conditional.dtype, device=conditional.device)
        if valid is not None:
            pair = valid.unsqueeze(-1) & valid.unsqueeze(-2)
            conditional = conditional.masked_fill(~pair, 0.0) + torch.diag_embed((~valid).to(conditional.dtype))
            jitter = _relative_jitter(self.kernel, conditional.dtype) * torch.diag_embed(valid.to(conditional.dtype))
        else:
            jitter = _relative_jitter(self.kernel, conditional.dtype) * eye
        return psd_safe_cholesky(conditional + jitter)

    def _standard_kl(self, gram, gram_values, values, factor, key_padding_mask) -> Tensor:
        """Per-sequence KL of standard SGPA (App. B.1.1 with ``v = K⁻¹ m_u``), ``(B,)``."""
        length = gram.shape[-1]
        if key_padding_mask is not None:
            valid = (~key_padding_mask)[:, None, :]
            pair = valid.unsqueeze(-1) & valid.unsqueeze(-2)
            gram = gram.masked_fill(~pair, 0.0) + torch.diag_embed((~valid).to(gram.dtype))
            jitter = _relative_jitter(self.kernel, gram.dtype) * torch.diag_embed(valid.to(gram.dtype))
        else:
            jitter = _relative_jitter(self.kernel, gram.dtype) * torch.eye(length, dtype=gram.dtype, device=gram.device)
        chol = psd_safe_cholesky(gram + jitter)
        whitened = torch.linalg.solve_triangular(chol, factor, upper=False)
        per_dim = (
            whitened.square().sum((-2, -1))
            - length
            + 2.0 * chol.diagonal(dim1=-2, dim2=-1).log().sum(-1)
            - 2.0 * factor.diagonal(dim1=-2, dim2=-1).log().sum(-1)
        )  # (B, H); padded positions contribute exactly 0
        return 0.5 * (self.head_dim * per_dim.sum(-1) + (values * gram_values).sum((-3, -2, -1)))

    def posterior(
        self,
        x: Tensor,
        key_padding_mask: Tensor | None = None,
        global_inputs: Tensor | None = None,
        full_covariance: bool = False,
    ) -> SGPAPosterior:
        """Posterior of each head's output at the queries (eq. ``fpost`` / ``odsvgp`` / ``naivedsvgp``)."""
        self._check_input(x, key_padding_mask)
        with _no_autocast(x):
            mean, variance, covariance, kl, _ = self._posterior_terms(
                x, key_padding_mask, global_inputs, full_covariance, with_sampler=False
            )
        return SGPAPosterior(mean, variance, covariance, kl)

    def sample_noise(self, batch_size: int, length: int, dtype=None, device=None) -> SGPANoise:
        """Draw the standard-normal noise one forward pass of ``batch_size × length`` uses."""
        dtype = dtype or self.qk_proj.weight.dtype
        device = device or self.qk_proj.weight.device
        shape = (batch_size, self.num_heads, length, self.head_dim)
        local = torch.randn(shape, dtype=dtype, device=device)
        global_ = None
        if self._uses_global_noise():
            global_ = torch.randn(batch_size, self.num_heads, self.head_dim, self.num_global, dtype=dtype, device=device)
        return SGPANoise(local, global_)

    def _check_noise(self, noise: SGPANoise, batch: int, length: int) -> SGPANoise:
        if not isinstance(noise, SGPANoise):
            raise TypeError(f"noise must be an SGPANoise, got {type(noise).__name__}")
        expected = (batch, self.num_heads, length, self.head_dim)
        if tuple(noise.local.shape) != expected:
            raise ValueError(f"noise.local must have shape {expected}, got {tuple(noise.local.shape)}")
        if self._uses_global_noise():
            expected_global = (batch, self.num_heads, self.head_dim, self.num_global)
            if noise.global_ is None or tuple(noise.global_.shape) != expected_global:
                raise ValueError(f"noise.global_ must have shape {expected_global} when sampler={self.sampler!r}")
        return noise

    def forward(
        self,
        x: Tensor,
        key_padding_mask: Tensor | None = None,
        global_inputs: Tensor | None = None,
        noise: SGPANoise | None = None,
    ):
        """One reparameterised sample of the layer output and the batch-mean KL (eq. ``reparam_dgp``)."""
        self._check_input(x, key_padding_mask)
        batch, length, _ = x.shape
        if noise is None:
            noise = self.sample_noise(batch, length, x.dtype, x.device)
        noise = self._check_noise(noise, batch, length)
        dtype = _gp_dtype(x.dtype)
        local = noise.local.to(dtype)
        global_noise = noise.global_.to(dtype) if self._uses_global_noise() else None
        with _no_autocast(x):
            # full / decomposed (decoupled): ``mean`` comes back as m_d + K_qg K_gg⁻¹ C_d ε_d = m_d + Aᵀ W_d ε_d
            mean, variance, _, kl, sampler = self._posterior_terms(
                x, key_padding_mask, global_inputs, full_covariance=False, with_sampler=True, global_noise=global_noise
            )
            jitter = _relative_jitter(self.kernel, dtype)
            if self.sampler == "diagonal":
                sample = mean + variance.clamp_min(jitter).sqrt() * local
            elif self.mode == "standard":
                sample = mean + sampler["cov_factor"].matmul(local)
            elif self.sampler == "full":
                sample = mean + sampler["conditional_chol"].matmul(local)
            else:  # decomposed: the residual K_qq - Q_qq diagonalised
                residual = sampler["residual_variance"]
                sample = mean + residual.unsqueeze(-1).clamp_min(jitter).sqrt() * local
        return self.out_proj(self.dropout(self._merge(sample.to(x.dtype)))), kl.mean()

    # ------------------------------------------------------------------ incremental decoding
    def forward_step(
        self,
        x_t: Tensor,
        state: SGPAStepState | None = None,
        global_inputs: Tensor | None = None,
        noise: SGPANoise | None = None,
    ):
        """Process one new token ``x_t`` ``(B, 1, d_model)`` of a causal layer using the cache ``state``.

        Returns ``(output_t, state)``; ``output_t`` is ``(B, 1, d_model)``.  With the noise of
        position ``t`` (``noise.local[:, :, t:t+1]``; ``noise.global_`` is read at the first step),
        the outputs equal those of :meth:`forward` on the whole prefix.  The global factors are
        computed at the first step and kept in the state.  Padding is not supported here.
        """
        self._check_step(x_t, state)
        batch = x_t.shape[0]
        if noise is None:
            noise = self.sample_noise(batch, 1, x_t.dtype, x_t.device)
        noise = self._check_noise(noise, batch, 1)
        query, value = self._project(x_t, None)  # (B, H, 1, e)
        with _no_autocast(x_t):
            if state is None:
                state = SGPAStepState(keys=query[..., :0, :], values=value[..., :0, :])
                if self.mode == "decoupled":
                    state.global_factors = self._global_factors(global_inputs, query.dtype)
                    m = self.num_global
                    state.projected_values = query.new_zeros(batch, self.num_heads, m, self.head_dim)
                    state.whitened_keys = query.new_zeros(batch, self.num_heads, m, 0)
                    state.global_noise = None if noise.global_ is None else noise.global_.to(query.dtype)
                    state.conditional_chol = query.new_zeros(batch, self.num_heads, 0, 0)
                state.local_noise = query.new_zeros(batch, self.num_heads, 0, self.head_dim)
            position = state.length
            state.keys = torch.cat([state.keys, query], dim=-2)
            state.values = torch.cat([state.values, value], dim=-2)
            state.local_noise = torch.cat([state.local_noise, noise.local.to(query.dtype)], dim=-2)
            gram_row = evaluate_kernel(self.kernel, query, state.keys)  # (B, H, 1, t+1)
            mean = gram_row.matmul(state.values)
            if self.mode == "standard":
                sample = self._standard_step_sample(x_t, position, mean, state)
            else:
                sample = self._decoupled_step_sample(query, value, gram_row, mean, state)
        return self.out_proj(self.dropout(self._merge(sample.to(x_t.dtype)))), state

    def _standard_step_sample(self, x_t, position, mean, state) -> Tensor:
        if position >= self.max_len:
            raise ValueError(f"sequence length {position + 1} exceeds max_len={self.max_len} of mode='standard'")
        raw = self.cov_proj(x_t).to(mean.dtype).view(x_t.shape[0], self.num_heads, self.max_len)[..., : position + 1]
        row = torch.cat([raw[..., :position], raw[..., position:].exp()], dim=-1).unsqueeze(-2)  # (B,H,1,t+1)
        if self.sampler == "diagonal":
            return mean + row.square().sum(-1, keepdim=True).sqrt() * state.local_noise[..., -1:, :]
        return mean + row.matmul(state.local_noise)

    def _decoupled_step_sample(self, query, value, gram_row, mean, state) -> Tensor:
        factors = state.global_factors
        cross = evaluate_kernel(self.kernel, query, factors.keys)  # (B, H, 1, M)
        whitened = torch.linalg.solve_triangular(factors.chol, cross.transpose(-2, -1), upper=False)  # (B,H,M,1)
        if self.variant == "orthogonal":
            state.projected_values = state.projected_values + whitened.matmul(value)
            mean = mean - whitened.transpose(-2, -1).matmul(state.projected_values)
            mean = mean + whitened.transpose(-2, -1).matmul(factors.whitened_values)
        self_cov = gram_row[..., -1:]  # k(q_t, q_t), (B, H, 1, 1)
        conditional_tt = self_cov - whitened.square().sum(-2, keepdim=True)
        jitter = _relative_jitter(self.kernel, conditional_tt.dtype)
        if self.sampler == "decomposed":
            global_term = torch.einsum("hdmn,bhdn->bhdm", factors.whitened_cov_factor, state.global_noise)
            residual = conditional_tt.clamp_min(jitter).sqrt()
            return (
                mean
                + torch.einsum("bhml,bhdm->bhld", whitened, global_term)
                + residual * state.local_noise[..., -1:, :]
            )
        projected = torch.einsum("hdmn,bhml->bhdnl", factors.whitened_cov_factor, whitened)  # (B,H,e|1,M,1)
        if self.sampler == "diagonal":
            variance = conditional_tt + projected.square().sum(-2).transpose(-2, -1)  # (B,H,1,e|1)
            state.whitened_keys = torch.cat([state.whitened_keys, whitened], dim=-1)
            return mean + variance.clamp_min(jitter).sqrt() * state.local_noise[..., -1:, :]
        conditional_row = gram_row[..., :-1] - whitened.transpose(-2, -1).matmul(state.whitened_keys)  # (B,H,1,t)
        previous_chol = state.conditional_chol
        row = torch.linalg.solve_triangular(previous_chol, conditional_row.transpose(-2, -1), upper=False)
        row = row.transpose(-2, -1)  # (B, H, 1, t)
        # the new Cholesky diagonal of (K_qq - Q_qq + jitter I), clamped as a PSD-safe Cholesky would
        diag = (conditional_tt + jitter - row.square().sum(-1, keepdim=True)).clamp_min(jitter).sqrt()
        top = torch.cat([previous_chol, previous_chol.new_zeros(*previous_chol.shape[:-1], 1)], dim=-1)
        state.conditional_chol = torch.cat([top, torch.cat([row, diag], dim=-1)], dim=-2)
        state.whitened_keys = torch.cat([state.whitened_keys, whitened], dim=-1)
        global_term = torch.einsum("hdmn,bhdn->bhdm", factors.whitened_cov_factor, state.global_noise)
        return (
            mean
            + state.conditional_chol[..., -1:, :].matmul(state.local_noise)
            + torch.einsum("bhml,bhdm->bhld", whitened, global_term)
        )
