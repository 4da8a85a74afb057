r"""Multi-head attention layers: scaled dot-product, kernel, and sparse Gaussian process attention.

Every layer has the call signature ``forward(x, key_padding_mask=None, global_inputs=None)`` and
returns ``(output, kl)``:

* ``x``: ``(batch, L, d_model)`` (the input ``s`` of the attention block, i.e. :math:`G_\phi(F^{l-1})`);
* ``key_padding_mask``: optional bool ``(batch, L)``, ``True`` marks a padded position.  Padded
  positions never influence the outputs at the other positions nor the KL;
* ``global_inputs``: only used by decoupled :class:`SGPAttention` (ignored elsewhere): the global
  inducing inputs after the block's feature map, :math:`G_\phi(Z_g)` of thesis eq. (3.16), shaped
  ``(num_heads, num_global, d_model)``.  When omitted the layer's own parameter
  ``global_inducing_inputs`` is used as is (:math:`G_\phi` = identity);
* ``kl``: scalar tensor, the KL term of the layer averaged over the sequences of the batch and
  summed over heads and output dimensions (``0`` for the maximum-likelihood layers).

Shapes inside: ``B`` batch, ``H`` heads, ``L`` length, ``e = d_model / H`` head dimension,
``M`` number of global inducing points per head.
"""

from __future__ import annotations

import contextlib
import weakref
from typing import NamedTuple, cast

import torch
from gpytorch.kernels import Kernel
from linear_operator.utils.errors import NanError
from torch import Tensor, nn

from probseq._validation import check_int, check_real, check_tensor

from ._attention_base import MultiHeadAttentionBase
from ._numerics import causal_mask, gp_dtype, no_autocast, relative_jitter
from ._validation import check_finite
from .decoupled import GlobalFactors, decoupled_kernel_blocks, decoupled_step_sample, decoupled_terms, global_factors
from .kernels import ExpKernelParameters, dense_kernel, exp_kernel_parameters, make_attention_kernel
from .mle_attention import KernelAttention, ScaledDotProductAttention
from .multihead import ForwardKL, SGPAStepState
from .samplers import SAMPLERS, SGPA_SAMPLERS, PosteriorTerms
from .standard import standard_step_sample, standard_terms

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

#: The posteriors of :class:`SGPAttention` (``mode=``): amortised keys only, or with global inducing inputs.
SGPA_MODES = ("standard", "decoupled")
#: The decoupled posteriors of :class:`SGPAttention` (``variant=``).
SGPA_VARIANTS = ("orthogonal", "dsvgp")


#: inside :func:`posterior_mean` every SGPA layer draws zero noise: its output is its posterior mean
#: (a plain module flag, which torch.compile guards on without a graph break)
_posterior_mean_active = False


@contextlib.contextmanager
def posterior_mean():
    """Deterministic SGPA: inside ``with gpytorch_sgpa.posterior_mean(): logits = model(x)`` every
    :class:`SGPAttention` layer outputs its posterior mean (the noise of the reparameterised sample,
    thesis eq. (3.17), is zero), so the same input gives the same output; explicit ``noise=``
    arguments still win. Sampling resumes on exit."""
    global _posterior_mean_active
    previous, _posterior_mean_active = _posterior_mean_active, True
    try:
        yield
    finally:
        _posterior_mean_active = previous


#: inside :func:`per_example_noise`: the seeds of a batch's sequences and the count of noise draws so far
_example_seeds: list[int] | None = None
_example_draws = 0


@contextlib.contextmanager
def per_example_noise(seeds):
    """Sampling whose draws for a sequence do not depend on the other sequences of its batch: inside
    ``with gpytorch_sgpa.per_example_noise(seeds): logits = model(x)``, sequence ``b`` of every batch draws the noise of
    each :class:`SGPAttention` call from a generator seeded by ``seeds[b]`` and the call's order in the block, its
    global noise first, then its positions one by one.  So a sequence's sample is the same whatever the batch size,
    its neighbours and the (right) padding after it; the global random state is not used.  Successive forward passes
    inside one block draw new noise.  :func:`posterior_mean` and explicit ``noise=`` arguments still win.

    :param seeds: one integer seed per sequence of the batches that run inside (e.g. ``seed + example index``).
    """
    global _example_seeds, _example_draws
    seeds = [int(seed) for seed in seeds]
    previous = (_example_seeds, _example_draws)
    _example_seeds, _example_draws = seeds, 0
    try:
        yield
    finally:
        _example_seeds, _example_draws = previous


def sampling_per_example() -> bool:
    """Whether a :func:`per_example_noise` block is in force (then a model's forward pass samples, per sequence)."""
    return _example_seeds is not None


def _per_example_draws(shapes: list[tuple[int, int, int, int]], dtype, device) -> list[Tensor]:
    """The draws of :meth:`SGPAttention.sample_noise` inside :func:`per_example_noise`: shapes ``(B, H, L, d)`` and
    optionally ``(B, H, d, M)``; sequence ``b``'s from its own generator, position by position."""
    global _example_draws
    seeds = cast(list[int], _example_seeds)
    batch, heads, length, head_dim = shapes[0]
    if len(seeds) != batch:
        raise ValueError(f"per_example_noise was given {len(seeds)} seeds for a batch of {batch} sequences: give one per sequence")
    call, _example_draws = _example_draws, _example_draws + 1
    local, global_ = [], []
    for seed in seeds:
        generator = torch.Generator().manual_seed((seed * 1_000_003 + call) % 2**63)
        if len(shapes) > 1:
            global_.append(torch.randn(shapes[1][1:], dtype=dtype, generator=generator))
        local.append(torch.stack([torch.randn(heads, head_dim, dtype=dtype, generator=generator) for _ in range(length)], dim=1))
    draws = [torch.stack(local)] + ([torch.stack(global_)] if global_ else [])
    return [draw.to(device) for draw in draws]


class SGPANoise(NamedTuple):
    r"""Standard-normal draws behind one SGPA sample (thesis eq. (3.17), the reparameterisation
    :math:`m + \Sigma^{1/2} \varepsilon` of the head outputs; Chen & Li (2023), SGPA).

    ``local``: ``(B, H, L, e)``, one per position and output dimension.  ``global_``:
    ``(B, H, e, M)`` or ``None``; only used by the decoupled mode with ``sampler="full"``
    (``diag_sample=False``), where the sample is
    :math:`m + \operatorname{chol}(K_{qq} - K_{qg} K_{gg}^{-1} K_{gq}) \varepsilon_\text{local} +
    K_{qg} K_{gg}^{-1} C_d \varepsilon_\text{global}`
    and :math:`S_g = C C^\top` (exact draw from :math:`\mathcal{N}(m_d, \Sigma_d)` of thesis eq. (3.15)), and with
    ``sampler="decomposed"``, where it is
    :math:`m + \sqrt{\operatorname{diag}(K_{qq} - K_{qg} K_{gg}^{-1} K_{gq})} \odot \varepsilon_\text{local} +
    K_{qg} K_{gg}^{-1} C_d \varepsilon_\text{global}`.

    :param local: the standard-normal draws of the local (per-position) part, ``(B, H, L, e)``.
    :param global\_: the standard-normal draws of the global part, ``(B, H, e, M)``; ``None`` (the default) where the
        layer's sampler uses none (standard mode, or ``sampler="diagonal"``).
    """

    local: Tensor
    global_: Tensor | None = None


class SGPAPosterior(NamedTuple):
    """Per-head posterior of the attention outputs (before the output projection).

    ``mean``: ``(B, H, L, e)``; ``variance``: ``(B, H, L, e)`` marginal variances; ``covariance``:
    ``(B, H, e, L, L)`` when requested, else ``None``; ``kl``: ``(B,)`` per-sequence KL summed over
    heads and output dimensions (thesis App. B.1.2; Chen & Li (2023), SGPA).

    :param mean: the posterior mean of each head's output, ``(B, H, L, e)``.
    :param variance: the marginal posterior variances, ``(B, H, L, e)``.
    :param covariance: the posterior covariance across positions per output dimension, ``(B, H, e, L, L)``, or ``None``
        when not requested (``full_covariance=False``).
    :param kl: the per-sequence KL divergence, ``(B,)``, summed over heads and output dimensions.
    """

    mean: Tensor
    variance: Tensor
    covariance: Tensor | None
    kl: Tensor


class _ForwardFactors:
    """The global factors of a layer's last forward pass with gradients (for ``global_kl``).

    ``key``: a :class:`_Snapshot` of the values they were computed from; ``factors`` carry the autograd
    graph of that pass.  The record is dropped (``factors = None``) as soon as a backward pass sends
    a gradient into any of them, since it frees their graph (hooks registered by :meth:`track`).  A
    copy (``copy.deepcopy``, pickling) starts empty, as :class:`ForwardKL` does.
    """

    __slots__ = ("key", "dtype", "factors", "__weakref__")

    def __init__(self, key=None, dtype=None, factors: GlobalFactors | None = None):
        self.key, self.dtype, self.factors = key, dtype, factors

    def track(self) -> _ForwardFactors:
        record = weakref.ref(self)  # a strong reference would be a cycle through the autograd graph

        def drop(grad):
            alive = record()
            if alive is not None:
                alive.factors = None

        for tensor in cast(GlobalFactors, self.factors):  # track() is called on a record that holds its factors
            if isinstance(tensor, Tensor) and tensor.requires_grad:
                tensor.register_hook(drop)
        return self

    def __deepcopy__(self, memo) -> _ForwardFactors:
        return _ForwardFactors()

    def __reduce__(self):
        return (_ForwardFactors, ())


class _Snapshot(NamedTuple):
    """The values of a list of tensors in one flat copy (one op to take, one to compare, where a
    copy per tensor made a kernel launch each), with their shapes, dtypes and devices."""

    layout: tuple
    values: Tensor


def _layout(tensors: list[Tensor]) -> tuple:
    return tuple((t.shape, t.dtype, t.device) for t in tensors)


def _snapshot(tensors: list[Tensor]) -> _Snapshot:
    return _Snapshot(_layout(tensors), torch.cat([t.detach().reshape(-1) for t in tensors]))


def _same_values(snapshot: _Snapshot, current: list[Tensor]) -> bool:
    """Whether ``current`` holds the values, shapes, dtypes and devices of ``snapshot``."""
    return snapshot.layout == _layout(current) and torch.equal(snapshot.values, torch.cat([t.detach().reshape(-1) for t in current]))


class SGPAttention(MultiHeadAttentionBase):
    r"""Sparse Gaussian process attention (thesis ch. 3): each head's output is an SVGP posterior.

    Queries and amortised keys share the projection :math:`W_{qk}` (:math:`q = k_a = s W_{qk}`), values are
    :math:`v_a = s W_v` (thesis eq. (3.16)); the head outputs are sampled by reparameterisation
    (thesis eq. (3.17)) and combined by the output projection (thesis eq. (2.4)).

    ``mode="standard"`` (thesis eq. (3.4)): inducing inputs are the amortised keys only, the
    variational covariance is input dependent, :math:`S = L_S L_S^\top` with row :math:`i` of :math:`L_S` the
    projection :math:`s_i W_s` (strictly lower part; diagonal through :math:`\exp`), tied across output
    dimensions; it needs ``max_len`` (:math:`W_s` has one column per position).  Since queries equal
    keys, thesis eq. (3.4) reduces exactly to mean :math:`K_{qk} v` and covariance :math:`S`; the KL (App. B.1.1
    with :math:`v = K^{-1} m_u`) needs one Cholesky of :math:`K_{kk}` per sequence and head.

    ``mode="decoupled"``: :math:`M` = ``num_global`` global inducing inputs :math:`Z_g` per head, a parameter
    in the layer's input space (``global_inducing_inputs``, ``(H, M, d_model)``); the keys are
    :math:`k_g = G_\phi(Z_g) W_{qk}` where :math:`G_\phi(Z_g)` is passed as ``global_inputs`` by the model
    (thesis eq. (3.16)).  Variational parameters :math:`v_g` (``(H, M, e)``) and :math:`C` lower triangular,
    exp-diagonal, one per output dimension (``(H, e, M, M)``; one per head with
    ``share_covariance=True``).  ``whitened=True`` (the default; GPyTorch's term, the authors'
    parameterisation) sets :math:`S_g = L C C^\top L^\top` with :math:`L L^\top = K_{gg}`, so :math:`C` parameterises
    :math:`q` of the whitened variables :math:`L^{-1} u_g` and stays well scaled whatever :math:`K_{gg}`;
    ``whitened=False`` sets :math:`S_g = C C^\top` (the package's earlier default).  Why the
    default: at the same draw the unwhitened KL of a fresh Fashion-MNIST ViT is 19x the whitened
    one (it pays :math:`\operatorname{tr}(K_{gg}^{-1} C C^\top)` for nearly singular :math:`K_{gg}`), and trained with the same
    objective the whitened layers reached a lower NLL in 6 of 6 seeds (3 at 8 and 3 at 40 epochs)
    and a higher accuracy in 5 of 6 (the sixth 0.001 lower); ECE and OOD AUROC were worse at 8
    epochs and mixed at 40 (``docs/project_results.md``).

    * ``variant="orthogonal"`` (ODSVGP, thesis eqs. (3.15), (3.14)):
      :math:`m_d = K_{qa} v_a - K_{qg} K_{gg}^{-1} K_{ga} v_a + K_{qg} v_g`;
    * ``variant="dsvgp"`` (thesis eq. (B.14)): :math:`m_d = K_{qa} v_a`;
    * both: :math:`\Sigma_d = K_{qq} + K_{qg} K_{gg}^{-1} (S_{g,d} - K_{gg}) K_{gg}^{-1} K_{gq}`.

    ``mean_gate`` (orthogonal only; ``None``, the default, is the thesis's mean): a learnable
    per-head :math:`\gamma` (``global_mean_gate``, ``(H,)``, starting at ``mean_gate``) with
    :math:`m_d = K_{qa} v_a + \gamma K_{qg} (v_g - K_{gg}^{-1} K_{ga} v_a)`.  This is the mean of eq. (3.15) with the
    global mean parameter :math:`\tilde v_g = \gamma v_g + (1 - \gamma) K_{gg}^{-1} K_{ga} v_a` in place of :math:`v_g` (expand
    :math:`K_{qg} \tilde v_g - K_{qg} K_{gg}^{-1} K_{ga} v_a`), so for every :math:`\gamma` the layer is an orthogonally decoupled
    posterior with :math:`\Sigma_d` unchanged, and its KL below, with :math:`\tilde v_g` for :math:`v_g`, is exact:
    :math:`v_{g,d}^\top K_{gg} v_{g,d}` becomes
    :math:`\tilde v_{g,d}^\top K_{gg} \tilde v_{g,d} = \|\gamma L^\top v_{g,d} + (1 - \gamma) L^{-1} K_{ga} v_{a,d}\|^2`, of
    which :math:`\gamma^2 \|L^\top v_{g,d}\|^2` is global and the rest per sequence.  :math:`\gamma = 1` is eq. (3.15);
    :math:`\gamma = 0` gives :math:`m_d = K_{qa} v_a`, the kernel attention's output, whatever :math:`Z_g` and :math:`v_g`:
    why :func:`~gpytorch_sgpa.convert` starts SGPA from kernel attention at ``mean_gate=0``.  An
    input-independent :math:`v_g` cannot cancel the correction :math:`K_{qg} (v_g - K_{gg}^{-1} K_{ga} v_a)` for all
    inputs, since :math:`K_{gg}^{-1} K_{ga} v_a` varies with the sequence (only :math:`K_{qg} = 0`, global keys far
    from every query, would, and there the likelihood's gradients of :math:`Z_g`, :math:`v_g` vanish); at
    :math:`\gamma = 0` instead :math:`\partial m_d / \partial \gamma = K_{qg} (v_g - K_{gg}^{-1} K_{ga} v_a) \ne 0`, so the first
    ELBO step moves :math:`\gamma` and from then on :math:`v_g` and :math:`Z_g` get the likelihood's gradients.

    KL (App. B.1.2, including the constant :math:`-M/2` per dimension so it is the exact KL):

    .. math::

        \tfrac{1}{2} \sum_d \left[v_{a,d}^\top B v_{a,d} + v_{g,d}^\top K_{gg} v_{g,d} + \operatorname{tr}(K_{gg}^{-1} S_{g,d})
        - \log|S_{g,d}| + \log|K_{gg}| - M\right],

    which whitened is
    :math:`\tfrac{1}{2} \sum_d [v_{a,d}^\top B v_{a,d} + v_{g,d}^\top K_{gg} v_{g,d} + \|C_d\|_F^2 - \log|C_d C_d^\top| - M]`
    with :math:`B = K_{aa} - K_{ag} K_{gg}^{-1} K_{ga}` (orthogonal) or :math:`B = K_{aa}` (dsvgp: the RKHS norm of the
    decoupled mean, which is the exact KL of :math:`q(u) = \mathcal{N}(K_{Za} v_a, S_u)` over :math:`Z = (k_g, k_a)`;
    there :math:`v_g` is unused).

    ``kernel``: ``"rbf"``, ``"exponential"``, ``"matern12"``/``"matern32"``/``"matern52"`` or a
    GPyTorch ``ScaleKernel`` with ``batch_shape (num_heads,)`` (used as is, so one object passed
    to several layers is shared by them); ``kernel_init`` chooses the kernel hyperparameters' initialisation (``"sdp"`` or the authors',
    ``"authors"``; :func:`~gpytorch_sgpa.kernels.make_attention_kernel`); :math:`v_g`, :math:`C`'s strictly
    lower part and log-diagonal start :math:`\mathcal{N}(0, \mathtt{variational\_init\_std}^2)`
    (thesis App. B.4).

    Cost per forward: one Cholesky :math:`L` of :math:`K_{gg}` per head shared by the batch and :math:`L^{-1}` from
    :math:`M` triangular solves against the identity (every :math:`L^{-1} X` is then a matrix product), no
    other inverse; in training, :meth:`global_kl` reuses the forward pass's factors.  In eval mode
    with gradients disabled the global factors (:math:`k_g`, the Cholesky of :math:`K_{gg}`, :math:`W_d`,
    :math:`L^\top v_g`, global KL) are cached, keyed on the values of the global keys and of the other
    parameters they depend on (so GPyTorch's setters and adapters of ``qk_proj`` invalidate it too);
    ``train()`` drops it.  Jitter
    ``gpytorch.settings.cholesky_jitter`` × :math:`\sigma_f^2` (relative to each head's output
    scale) is added before every Cholesky (escalated where needed by
    :func:`~gpytorch_sgpa.multihead.psd_cholesky`, which on accelerators and under
    ``torch.compile`` never waits for the device: the training step compiles without graph breaks).
    Under ``torch.autocast`` or in half precision the projections run in the low precision and the GP
    algebra in float32; the output has the input's dtype.

    ``sampler`` is the one sampling knob (:mod:`~gpytorch_sgpa.samplers`): ``"decomposed"``
    (decoupled only, the default there: the global part exact, the residual :math:`K_{qq} - Q_{qq}`
    diagonalised, so the marginals are exact), ``"diagonal"`` (the thesis's: independent
    marginals, App. B.4; the default of ``mode="standard"``) or ``"full"`` (the full covariance).
    Why the default differs from the thesis: at 49 tokens and 32 global keys a training step with
    ``"diagonal"`` costs 3.5–5x one of MLE kernel attention on CPU and ``"decomposed"`` 1.3–1.4x,
    with the same calibration after 40 epochs on Fashion-MNIST (``docs/performance.md``, ``docs/project_results.md``);
    ``sampler="diagonal"`` gives the thesis's sampler.  ``diag_sample`` is an alias kept for
    compatibility: with ``sampler=None`` it means ``"diagonal"`` (``True``) or ``"full"``
    (``False``), and ``layer.diag_sample`` reads/sets the same choice.  :meth:`posterior` is the
    same for every sampler.

    ``causal=True`` lets position :math:`i` use the amortised keys :math:`j \le i` only (a decoder layer; the KL is that of the whole
    sequence's inducing set, i.e. of the last position); :meth:`forward_step` then predicts one token
    at a time with a key/value cache and reproduces :meth:`forward` given the same noise.

    :param d_model: the width of the layer's input and output, a multiple of ``num_heads``.
    :param num_heads: the attention heads :math:`H`; each has ``d_model // num_heads`` dimensions.
    :param kernel: the kernel's name or a GPyTorch ``ScaleKernel`` (above).
    :param mode: ``"decoupled"`` (global and amortised inducing inputs) or ``"standard"`` (amortised only).
    :param variant: ``"orthogonal"`` (ODSVGP) or ``"dsvgp"``, the decoupled posterior's mean (above).
    :param num_global: the global inducing inputs :math:`M` per head (``mode="decoupled"``).
    :param diag_sample: the older alias of ``sampler`` (above; ``None``: ``sampler`` decides).
    :param causal: whether position :math:`i` attends to the keys :math:`j \le i` only (a decoder layer).
    :param dropout: the dropout probability, in ``[0, 1)``, of the sampled head outputs before the output projection.
    :param max_len: the longest sequence, needed by ``mode="standard"`` (``W_s`` has one column per position).
    :param share_covariance: whether the decoupled ``C`` is one per head rather than one per output dimension.
    :param variational_init_std: the standard deviation, > 0, of the variational parameters' initialisation.
    :param sampler: ``"decomposed"``, ``"diagonal"`` or ``"full"`` (above; ``None``: the mode's default).
    :param whitened: whether the decoupled covariance is whitened, :math:`S_g = L C C^\top L^\top` (above).
    :param kernel_init: the kernel hyperparameters' initialisation, ``"sdp"`` or ``"authors"``.
    :param mean_gate: the initial value of the learnable gate :math:`\gamma` of the orthogonal mean
        (above; ``None``: the thesis's mean, no gate).
    """

    max_len: int | None
    # decoupled mode only (None, or absent, in standard mode)
    global_inducing_inputs: Tensor | None
    global_values: Tensor | None  # None for the dsvgp variant
    global_chol_lower: Tensor
    global_chol_log_diag: Tensor
    global_mean_gate: Tensor | None
    _cache: tuple[_Snapshot, torch.dtype, GlobalFactors] | None

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        kernel: str | Kernel = "rbf",
        mode: str = "decoupled",
        variant: str = "orthogonal",
        num_global: int = 32,
        diag_sample: bool | None = None,
        causal: bool = False,
        dropout: float = 0.0,
        max_len: int | None = None,
        share_covariance: bool = False,
        variational_init_std: float = 1.0,
        sampler: str | None = None,
        whitened: bool = True,
        kernel_init: str = "sdp",
        mean_gate: float | None = None,
    ):
        super().__init__(d_model, num_heads, dropout, causal)
        if not isinstance(mode, str) or mode not in SGPA_MODES:
            raise ValueError(f"mode must be one of {SGPA_MODES}, got {mode!r}")
        if not isinstance(variant, str) or variant not in SGPA_VARIANTS:
            raise ValueError(f"variant must be one of {SGPA_VARIANTS}, got {variant!r}")
        if diag_sample is not None and not isinstance(diag_sample, bool):
            raise TypeError(f"diag_sample must be a bool or None, got {type(diag_sample).__name__}")
        if not isinstance(whitened, bool):
            raise TypeError(f"whitened must be a bool, got {type(whitened).__name__}")
        check_real(variational_init_std, "variational_init_std", low=0.0, low_open=True)
        if mean_gate is not None:
            check_real(mean_gate, "mean_gate")
            if mode != "decoupled" or variant != "orthogonal":
                raise ValueError(
                    "mean_gate needs mode='decoupled' and variant='orthogonal' (the only posterior mean with a global correction)"
                )
        if sampler is None and diag_sample is None:
            sampler = "decomposed" if mode == "decoupled" else "diagonal"
        elif sampler is None:
            sampler = "diagonal" if diag_sample else "full"
        elif not isinstance(sampler, str) or sampler not in SGPA_SAMPLERS:
            raise ValueError(f"sampler must be one of {SGPA_SAMPLERS} or None, got {sampler!r}")
        elif diag_sample is not None and (sampler == "diagonal") != diag_sample:
            raise ValueError(f"sampler={sampler!r} contradicts diag_sample={diag_sample}; pass only one of them")
        if sampler == "decomposed" and mode != "decoupled":
            raise ValueError(
                "sampler='decomposed' needs mode='decoupled' (it splits Σ_d of thesis eq. (3.15), "
                "Σ_d = K_qq + K_qg K_gg⁻¹ (S_g - K_gg) K_gg⁻¹ K_gq, into its "
                "global-inducing part and the residual K_qq - Q_qq; standard SGPA has no such split)"
            )
        self.mode = mode
        self.variant = variant
        self.sampler = sampler
        self.whitened = whitened
        self.kernel = make_attention_kernel(kernel, self.head_dim, num_heads, init=kernel_init)
        self.kernel_name = kernel if isinstance(kernel, str) else type(kernel.base_kernel).__name__
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
        if mean_gate is None:
            self.global_mean_gate = None
        else:
            self.global_mean_gate = nn.Parameter(torch.full((heads,), float(mean_gate)))
        self.share_covariance = share_covariance
        self._cache = None
        self._forward_factors = _ForwardFactors()
        self.last_kl = ForwardKL()

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

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs):
        # a state dict saved without the mean gate holds the thesis's mean
        # (γ = 1); one saved with it gives a layer built without it the gate
        key = prefix + "global_mean_gate"
        if self.global_mean_gate is not None and key not in state_dict:
            state_dict[key] = torch.ones_like(self.global_mean_gate)
        elif self.global_mean_gate is None and key in state_dict and getattr(self, "global_values", None) is not None:
            reference = self.global_values
            self.global_mean_gate = nn.Parameter(reference.new_ones(self.num_heads))
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs)

    # ------------------------------------------------------------------ caching
    def train(self, mode: bool = True):
        self._cache = None
        self._forward_factors = _ForwardFactors()
        return super().train(mode)

    def clear_cache(self) -> None:
        """Drop the cached global factors (automatic on parameter changes)."""
        self._cache = None
        self._forward_factors = _ForwardFactors()

    def _global_parameters(self) -> list[Tensor]:
        """The parameters the global factors depend on besides the global keys."""
        tensors = [self.global_chol_lower, self.global_chol_log_diag]
        if self.global_values is not None:
            tensors.append(self.global_values)
        if self.global_mean_gate is not None:
            tensors.append(self.global_mean_gate)
        return tensors + list(self.kernel.parameters())

    # ------------------------------------------------------------------ pieces
    def global_cov_factor(self, dtype: torch.dtype | None = None) -> Tensor:
        r""":math:`C` (:math:`S_g = C C^\top`, whitened :math:`S_g = L C C^\top L^\top`): strictly lower part plus
        :math:`\exp` diagonal, ``(H, e or 1, M, M)``.

        :param dtype: the dtype of the result; ``None`` (the default) keeps the parameters' dtype.
        """
        lower, log_diag = self.global_chol_lower, self.global_chol_log_diag
        if dtype is not None:
            lower, log_diag = lower.to(dtype), log_diag.to(dtype)
        return lower.tril(-1) + torch.diag_embed(log_diag.exp())

    def global_keys(self, global_inputs: Tensor | None = None, dtype: torch.dtype | None = None) -> Tensor:
        r""":math:`k_g = G_\phi(Z_g) W_{qk}` per head (thesis eq. (3.16)), ``(H, M, e)``, in ``dtype`` if given.

        A ``qk_proj`` other than a plain bias-free ``nn.Linear`` (a ``peft`` LoRA layer around it) is
        called on the inputs, as for the queries (head ``h``'s keys: head ``h``'s block of the projection
        of its own inputs), so the keys are those of the adapted weight and merging the adapter keeps
        them; a plain :math:`W_{qk}` gives each head's block only (:math:`H` times fewer products).

        :param global_inputs: the global inducing inputs after the block's feature map, :math:`G_\phi(Z_g)`,
            ``(H, M, d_model)``; ``None`` (the default) uses the layer's ``global_inducing_inputs``.
        :param dtype: the dtype of the keys; ``None`` (the default) keeps the projection's dtype.
        """
        inputs = self._global_inputs(global_inputs)
        projection = self.qk_proj
        heads, num_global = self.num_heads, inputs.shape[1]
        if type(projection) is nn.Linear and projection.bias is None:
            weight = projection.weight.view(heads, self.head_dim, self.d_model)
            if dtype is not None:
                inputs, weight = inputs.to(dtype), weight.to(dtype)
            return torch.einsum("hmd,hed->hme", inputs, weight)
        flat = inputs.reshape(heads * num_global, self.d_model).to(projection.weight.dtype)
        projected = projection(flat).view(heads, num_global, heads, self.head_dim)
        head = torch.arange(heads, device=projected.device)
        keys = projected[head, :, head]  # (H, M, e): head h of inputs h
        return keys if dtype is None else keys.to(dtype)

    def _global_inputs(self, global_inputs: Tensor | None) -> Tensor:
        if self.mode != "decoupled":
            raise ValueError("global inducing inputs exist only for mode='decoupled'")
        if global_inputs is None:
            return cast(Tensor, self.global_inducing_inputs)  # a parameter in decoupled mode
        check_tensor(global_inputs, "global_inputs", floating=True, finite=False)
        expected = (self.num_heads, self.num_global, self.d_model)
        if tuple(global_inputs.shape) != expected:
            raise ValueError(f"global_inputs must have shape {expected}, got {tuple(global_inputs.shape)}")
        if self._checks_values(global_inputs):
            check_finite(global_inputs, "global_inputs")
        return global_inputs

    def _global_key(self, keys: Tensor) -> list[Tensor]:
        """The values the global factors depend on: the global keys ``keys`` (whatever computes them,
        e.g. an adapter of ``qk_proj`` switched on or off) and the other parameters (GPyTorch's setters
        and ``.data`` writes do not bump a tensor's ``_version``, so the caches compare values)."""
        return [keys.detach()] + [t.detach() for t in self._global_parameters()]

    def _current_global_key(self, global_inputs: Tensor | None, dtype: torch.dtype) -> list[Tensor]:
        with torch.no_grad():
            return self._global_key(self.global_keys(global_inputs, dtype))

    def cached_global_factors(
        self, global_inputs: Tensor | None, dtype: torch.dtype, params: ExpKernelParameters | None = None
    ) -> GlobalFactors:
        """The global factors (decoupled mode); in eval mode without gradients cached, keyed on the values they
        depend on.  With gradients they are computed afresh and recorded for :meth:`global_kl`.
        Under ``torch.compile`` they are always computed afresh (neither cached nor recorded).

        :param global_inputs: as in :meth:`global_keys`: :math:`G_\\phi(Z_g)` ``(H, M, d_model)``, or ``None`` for the
            layer's ``global_inducing_inputs``.
        :param dtype: the dtype the GP computes in.
        :param params: the kernel's parameters (:class:`~gpytorch_sgpa.kernels.ExpKernelParameters`) already read for
            this forward, or ``None`` (the default) to read them.
        """
        if torch.compiler.is_compiling():  # no value comparisons or hooks inside a compiled graph
            return global_factors(self, global_inputs, dtype, params)
        keys = self.global_keys(global_inputs, dtype)
        key = self._global_key(keys)
        if self.training or torch.is_grad_enabled():
            factors = global_factors(self, global_inputs, dtype, params, keys)
            if torch.is_grad_enabled():
                self._forward_factors = _ForwardFactors(_snapshot(key), dtype, factors).track()
            return factors
        if self._cache is not None:
            cached_key, cached_dtype, factors = self._cache
            if cached_dtype == dtype and _same_values(cached_key, key):
                return factors
        factors = global_factors(self, global_inputs, dtype, params, keys)
        self._cache = (_snapshot(key), dtype, factors)
        return factors

    def global_kl(self, global_inputs: Tensor | None = None) -> Tensor:
        r"""KL of the global inducing variables (App. B.1.2), summed over heads and output
        dimensions: the part of every sequence's KL that all sequences share (``0`` for standard).

        With gradients enabled it reuses the global factors (and their autograd graph) of the
        layer's last forward pass when the parameters and ``global_inputs`` still have the values
        that pass used and no backward pass has gone through them since, e.g. when
        :class:`~gpytorch_sgpa.elbo.SGPAELBO` asks for it right after the forward pass: the
        :math:`K_{gg}` Cholesky and the global KL, forward and backward, are then computed once per step.
        The value is the same as recomputing it (tested).

        :param global_inputs: the global inducing inputs after the block's feature map, :math:`G_\phi(Z_g)`,
            ``(H, M, d_model)``; ``None`` (the default) uses the layer's ``global_inducing_inputs``.
        """
        dtype = gp_dtype(self.qk_proj.weight.dtype)
        if self.mode != "decoupled":
            return self.qk_proj.weight.new_zeros((), dtype=dtype)
        record = self._forward_factors
        if (
            torch.is_grad_enabled()
            and not torch.compiler.is_compiling()
            and record.factors is not None
            and record.dtype == dtype
            and _same_values(record.key, self._current_global_key(global_inputs, dtype))
        ):
            return record.factors.kl.sum()
        return self.cached_global_factors(global_inputs, dtype).kl.sum()

    def _project(self, x: Tensor, key_padding_mask: Tensor | None):
        """Queries and values (under any autocast), returned in the GP algebra's dtype."""
        dtype = gp_dtype(x.dtype)
        queries = self.split_heads(self.qk_proj(x)).to(dtype)
        values = self.split_heads(self.v_proj(x)).to(dtype)
        if key_padding_mask is not None:
            values = values.masked_fill(key_padding_mask[:, None, :, None], 0.0)
        return queries, values.contiguous()  # one copy for the products with K_qq and A, not one each

    def _terms(
        self,
        x,
        key_padding_mask,
        global_inputs,
        full_covariance: bool,
        sampler: str | None,
        global_noise: Tensor | None,
        params: ExpKernelParameters | None,
    ) -> PosteriorTerms:
        """The posterior terms of :mod:`~gpytorch_sgpa.standard` or :mod:`~gpytorch_sgpa.decoupled`;
        ``params``: the kernel's hyperparameters, read once per call (``None`` for other kernels)."""
        try:
            return self._posterior_terms(x, key_padding_mask, global_inputs, full_covariance, sampler, global_noise, params)
        except NanError as error:  # raised by the Cholesky on the CPU only
            raise ValueError(
                f"x gives kernel matrices with NaN entries: x (largest magnitude {float(x.detach().abs().max()):.3g}) "
                f"is too large for {x.dtype} or not finite, or the layer's parameters are not finite"
            ) from error

    def _posterior_terms(self, x, key_padding_mask, global_inputs, full_covariance, sampler, global_noise, params):
        queries, values = self._project(x, key_padding_mask)
        if self.mode == "decoupled":
            factors = self.cached_global_factors(global_inputs, queries.dtype, params)
            gram, cross = decoupled_kernel_blocks(self.kernel, params, queries, factors)
        else:
            gram = dense_kernel(self.kernel, queries)  # K_qq = K_qa = K_aa, (B, H, L, L)
        causal = causal_mask(x.shape[1], x.device) if self.causal else None
        gram_values = gram.matmul(values)
        amortised_mean = gram.masked_fill(~causal, 0.0).matmul(values) if causal is not None else gram_values
        if self.mode == "standard":
            return standard_terms(self, x, values, gram, gram_values, amortised_mean, key_padding_mask, full_covariance)
        return decoupled_terms(
            self,
            queries,
            values,
            gram,
            cross,
            gram_values,
            amortised_mean,
            causal,
            key_padding_mask,
            factors,
            full_covariance,
            sampler,
            global_noise,
            params,
        )

    def posterior(
        self,
        x: Tensor,
        key_padding_mask: Tensor | None = None,
        global_inputs: Tensor | None = None,
        full_covariance: bool = False,
    ) -> SGPAPosterior:
        r"""Posterior of each head's output at the queries (thesis eqs. (3.4), (3.15), (B.14): the standard, orthogonally
        decoupled and decoupled SVGP posteriors of the class description; Chen & Li (2023), SGPA).

        :param x: the layer input, ``(B, L, d_model)``.
        :param key_padding_mask: bool ``(B, L)``, ``True`` at padded positions; ``None`` (the default): no padding.
        :param global_inputs: the global inducing inputs after the block's feature map, :math:`G_\phi(Z_g)`,
            ``(H, M, d_model)`` (decoupled mode only); ``None`` (the default) uses ``global_inducing_inputs``.
        :param full_covariance: whether to return the covariance across positions as well (else ``covariance`` is ``None``).
        """
        self._check_input(x, key_padding_mask)
        with no_autocast(x):
            params = exp_kernel_parameters(self.kernel, gp_dtype(x.dtype))
            terms = self._terms(x, key_padding_mask, global_inputs, full_covariance, None, None, params)
        variance = cast(Tensor, terms.variance)  # without a sampler the terms hold the marginal variances
        self._check_result(x, terms.mean, variance, terms.kl)
        return SGPAPosterior(terms.mean, variance, terms.covariance, terms.kl)

    def sample_noise(self, batch_size: int, length: int, dtype=None, device=None, generator: torch.Generator | None = None) -> SGPANoise:
        """Draw the standard-normal noise one forward pass of ``batch_size × length`` uses (from
        ``generator`` if given, on its device); zeros inside :func:`posterior_mean`; per sequence inside
        :func:`per_example_noise`.

        :param batch_size: the number of sequences :math:`B`.
        :param length: the sequence length :math:`L`.
        :param dtype: the dtype of the draws; ``None`` (the default): the dtype of ``qk_proj``'s weight.
        :param device: the device the draws are returned on; ``None`` (the default): that of ``qk_proj``'s weight.
        :param generator: the random number generator to draw from; ``None`` (the default): the global one.
        """
        check_int(batch_size, "batch_size")
        check_int(length, "length")
        if generator is not None and not isinstance(generator, torch.Generator):
            raise TypeError(f"generator must be a torch.Generator or None, got {type(generator).__name__}")
        dtype = dtype or self.qk_proj.weight.dtype
        device = device or self.qk_proj.weight.device
        shapes = [(batch_size, self.num_heads, length, self.head_dim)]
        if self._uses_global_noise():
            shapes.append((batch_size, self.num_heads, self.head_dim, self.num_global))
        if _posterior_mean_active:
            draws = [torch.zeros(shape, dtype=dtype, device=device) for shape in shapes]
        elif _example_seeds is not None and generator is None:
            draws = _per_example_draws(shapes, dtype, device)
        else:
            source = device if generator is None else generator.device
            draws = [torch.randn(shape, dtype=dtype, device=source, generator=generator).to(device) for shape in shapes]
        return SGPANoise(draws[0], draws[1] if len(draws) > 1 else None)

    def _check_noise(self, noise: SGPANoise, batch: int, length: int) -> SGPANoise:
        if not isinstance(noise, SGPANoise):
            raise TypeError(f"noise must be an SGPANoise, got {type(noise).__name__}")
        check_tensor(noise.local, "noise.local", floating=True, finite=False)
        expected = (batch, self.num_heads, length, self.head_dim)
        if tuple(noise.local.shape) != expected:
            raise ValueError(f"noise.local must have shape {expected}, got {tuple(noise.local.shape)}")
        parts = [("noise.local", noise.local)]
        if self._uses_global_noise():
            expected_global = (batch, self.num_heads, self.head_dim, self.num_global)
            if noise.global_ is not None:
                check_tensor(noise.global_, "noise.global_", floating=True, finite=False)
            if noise.global_ is None or tuple(noise.global_.shape) != expected_global:
                raise ValueError(f"noise.global_ must have shape {expected_global} when sampler={self.sampler!r}")
            parts.append(("noise.global_", noise.global_))
        if self._checks_values(noise.local):
            for name, part in parts:
                check_finite(part, name)
        return noise

    def forward(
        self,
        x: Tensor,
        key_padding_mask: Tensor | None = None,
        global_inputs: Tensor | None = None,
        noise: SGPANoise | None = None,
    ):
        r"""One reparameterised sample of the layer output and the batch-mean KL (thesis eq. (3.17): the head outputs
        :math:`m + \Sigma^{1/2} \varepsilon` with :math:`\varepsilon \sim \mathcal{N}(0, I)`; Chen & Li (2023), SGPA).

        The KL (and its global part) is also kept in ``last_kl`` until the next call, for
        :func:`gpytorch_sgpa.kl_divergence` to collect without a change to the caller's ``forward``.

        :param x: the layer input, ``(B, L, d_model)``.
        :param key_padding_mask: bool ``(B, L)``, ``True`` at padded positions; ``None`` (the default): no padding.
        :param global_inputs: the global inducing inputs after the block's feature map, :math:`G_\phi(Z_g)`,
            ``(H, M, d_model)`` (decoupled mode only); ``None`` (the default) uses ``global_inducing_inputs``.
        :param noise: the standard-normal draws of the sample (shapes as from :meth:`sample_noise`); ``None`` (the
            default) draws fresh ones (zeros inside :func:`posterior_mean`).
        """
        self._check_input(x, key_padding_mask)
        batch, length, _ = x.shape
        if noise is None:  # drawn here: finite and of the right shapes, nothing to check
            noise = self.sample_noise(batch, length, x.dtype, x.device)
        else:
            noise = self._check_noise(noise, batch, length)
        dtype = gp_dtype(x.dtype)
        local = noise.local.to(dtype)
        global_noise = noise.global_.to(dtype) if self._uses_global_noise() and noise.global_ is not None else None
        with no_autocast(x):
            params = exp_kernel_parameters(self.kernel, dtype)
            terms = self._terms(x, key_padding_mask, global_inputs, False, self.sampler, global_noise, params)
            sample = SAMPLERS[self.sampler](terms, local, relative_jitter(self.kernel, dtype, params))
        kl = terms.kl.mean()
        self.last_kl = ForwardKL(kl, kl.new_zeros(()) if terms.global_kl is None else terms.global_kl)
        output = self.out_proj(self.dropout(self.merge_heads(sample.to(x.dtype))))
        self._check_result(x, output, kl)
        return output, kl

    # ------------------------------------------------------------------ incremental decoding
    def forward_step(
        self,
        x_t: Tensor,
        state: SGPAStepState | None = None,
        global_inputs: Tensor | None = None,
        noise: SGPANoise | None = None,
    ):
        r"""Process one new token ``x_t`` ``(B, 1, d_model)`` of a causal layer using the cache ``state``.

        Returns ``(output_t, state)``; ``output_t`` is ``(B, 1, d_model)``.  With the noise of
        position ``t`` (``noise.local[:, :, t:t+1]``; ``noise.global_`` is read at the first step),
        the outputs equal those of :meth:`forward` on the whole prefix.  The global factors are
        computed at the first step and kept in the state.  Padding is not supported here.

        :param x_t: the new token's layer input, ``(B, 1, d_model)``.
        :param state: the cache of the earlier steps, as returned by the previous call; ``None`` (the default) starts a
            new sequence.
        :param global_inputs: the global inducing inputs after the block's feature map, :math:`G_\phi(Z_g)`,
            ``(H, M, d_model)``, read at the first step only; ``None`` (the default) uses ``global_inducing_inputs``.
        :param noise: the standard-normal draws of this position (``local`` ``(B, H, 1, e)``); ``None`` (the default)
            draws fresh ones.
        """
        self._check_step(x_t, state)
        batch = x_t.shape[0]
        if noise is None:
            noise = self.sample_noise(batch, 1, x_t.dtype, x_t.device)
        noise = self._check_noise(noise, batch, 1)
        query, value = self._project(x_t, None)  # (B, H, 1, e)
        with no_autocast(x_t):
            if state is None:
                state = SGPAStepState(keys=query[..., :0, :], values=value[..., :0, :])
                if self.mode == "decoupled":
                    state.global_factors = self.cached_global_factors(global_inputs, query.dtype)
                    m = self.num_global
                    state.projected_values = query.new_zeros(batch, self.num_heads, m, self.head_dim)
                    state.whitened_keys = query.new_zeros(batch, self.num_heads, m, 0)
                    state.global_noise = None if noise.global_ is None else noise.global_.to(query.dtype)
                    state.conditional_chol = query.new_zeros(batch, self.num_heads, 0, 0)
                state.local_noise = query.new_zeros(batch, self.num_heads, 0, self.head_dim)
            elif state.local_noise is None:
                raise ValueError("state holds no noise of its prefix: pass the state this SGPA layer's forward_step returned")
            position = state.length
            state.keys = torch.cat([state.keys, query], dim=-2)
            state.values = torch.cat([state.values, value], dim=-2)
            state.local_noise = torch.cat([state.local_noise, noise.local.to(query.dtype)], dim=-2)
            gram_row = dense_kernel(self.kernel, query, state.keys)  # (B, H, 1, t+1)
            mean = gram_row.matmul(state.values)
            if self.mode == "standard":
                sample = standard_step_sample(self, x_t, position, mean, state)
            else:
                sample = decoupled_step_sample(self, query, value, gram_row, mean, state)
        output = self.out_proj(self.dropout(self.merge_heads(sample.to(x_t.dtype))))
        self._check_result(x_t, output)
        return output, state
