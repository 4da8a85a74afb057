r"""Work estimates of the HiPPO covariance backends, checked before anything is allocated.

Every exact backend's cost grows with the number of kernel length scales its rule must resolve:
the span of the bases ``[lower, t]`` over :math:`\ell` (LegS bases always cover :math:`[0, t]`, so Unix
timestamps with ``start = 0`` give :math:`t/\ell \approx 10^6\text{-}10^7`), or a length scale collapsing during
training.  Each backend estimates the values it would form (``nodes × M``, node pairs, recurrence
steps) and calls :func:`check_work`, which raises :class:`CovarianceCostError` -- with what to
change -- instead of hanging or exhausting memory.

The reach of a kernel, :func:`kernel_reach`, is the distance beyond which it is below :math:`2 \cdot 10^{-18} \sigma^2`
(RBF :math:`9.5 \ell`, Matérn :math:`48 \ell/\sqrt{2\nu}`; a kernel's registration in :mod:`.covariances` gives it):
inputs further than that from the bases' support have zero covariance with them (:math:`K_{uf} = 0`),
whatever the backend.
"""

from __future__ import annotations

import torch

from .covariances import CovarianceCostError, describe_kernel, kernel_parts, resolve_kernel, supported_kernels, unregistered_factors

__all__ = ["CovarianceCostError", "MAX_ENTRIES", "MAX_SPECTRAL_NODES", "check_work", "kernel_reach"]

#: most values (float64 entries, or kernel evaluations) one covariance evaluation may form: 1 GiB
MAX_ENTRIES = 2**27
#: most frequency nodes of the spectral rule (its Gauss-Legendre nodes cost O(nodes²) once)
MAX_SPECTRAL_NODES = 2**16
#: ``|t|`` above this would overflow squared distances (``t² < 1.8e308``)
MAX_TIME = 1e150


def lengthscale_of(kernel) -> float | None:
    """The shortest length scale of ``kernel`` (``None`` if it has none); ``ValueError`` if it is
    NaN, infinite or not positive (diverged hyperparameters).

    :param kernel: a GPyTorch kernel; every one of its modules (itself, then submodules) with a ``lengthscale`` is read.
    """
    shortest = None
    for module in kernel.modules():
        lengthscale = getattr(module, "lengthscale", None)
        if isinstance(lengthscale, torch.Tensor):
            values = lengthscale.detach()
            if not bool(torch.isfinite(values).all()) or not bool((values > 0).all()):
                raise ValueError(
                    f"kernel lengthscale must be finite and positive, got {values.reshape(-1).tolist()} (diverged hyperparameters?)"
                )
            shortest = float(values.min()) if shortest is None else min(shortest, float(values.min()))
    return shortest


def kernel_reach(kernel) -> float | None:
    r"""Distance :math:`R` beyond which a 1-D registered ``kernel`` is below :math:`2 \cdot 10^{-18} \sigma^2` (``None``: a kernel
    without a registration or without a registered reach).

    :param kernel: a GPyTorch kernel, registered in :mod:`.covariances` (optionally in a scale wrapper), one length scale.
    """
    try:
        spec, _, lengthscale, _ = kernel_parts(kernel)
    except (TypeError, ValueError):
        return None
    if lengthscale.numel() != 1 or spec.reach is None:
        return None
    return spec.reach * float(lengthscale.detach())  # in the registration's length scale (a product's rule length scale)


def check_work(entries: float, what: str, ivars=None, kernel=None, limit: float | None = None, lengthscale: float | None = None) -> None:
    """Raise :class:`CovarianceCostError` if ``entries`` exceeds ``limit`` (default :data:`MAX_ENTRIES`).

    The message gives the span of the bases in length scales and what to change: for a kernel that only the quadrature
    backend takes (an unregistered one, or a product such as RBF x Matérn), a window or a sum of registered kernels;
    else the times' offset and unit and the length scale.

    :param entries: the number of values (float64 entries or kernel evaluations) the evaluation would form.
    :param what: what would form them, for the message (e.g. ``"the quadrature rule (nodes x M)"``).
    :param ivars: the inducing variables being evaluated (their 1-D support goes into the message); ``None``: none.
    :param kernel: the kernel, whose shortest length scale goes into the message unless ``lengthscale`` is given.
    :param limit: the largest number of values allowed; default :data:`MAX_ENTRIES`.
    :param lengthscale: the length scale for the message, in the inputs' unit; ``None``: read from ``kernel``.
    """
    limit = MAX_ENTRIES if limit is None else limit
    if entries <= limit:
        return
    detail = ""
    support = ivars.input_support() if ivars is not None and getattr(ivars, "input_dim", 1) == 1 else None
    if support is not None:
        lower, t = support
        detail = f" The bases span [{lower:.6g}, {t:.6g}]"
        ell = lengthscale if lengthscale is not None else (lengthscale_of(kernel) if kernel is not None else None)
        if ell is not None:
            detail += f", {(t - lower) / ell:.3g} kernel length scales (lengthscale = {ell:.3g})"
        detail += "."
    if kernel is not None and resolve_kernel(kernel).spec is None:
        factors = unregistered_factors(kernel)
        unregistered = f" ({', '.join(factors)}: no registration)" if factors else " (a product of kernels)"
        raise CovarianceCostError(
            f"{what} would form about {entries:.3g} values (limit {limit:.3g}).{detail} Only method='quadrature' takes "
            f"{describe_kernel(kernel)}{unregistered}, and its rule grows with the bases' span in length scales (Kuu with "
            "its square): LegS bases cover [0, t], so the work grows with every advance, whatever the length scales. Bound "
            "the span with a window (measure='legt' or 'fout' with theta=, bases over [t - theta, t]); or write the kernel "
            "as a sum of registered kernels, e.g. a trend plus a season, ScaleKernel(MaternKernel()) + "
            "ScaleKernel(PeriodicKernel()), which method='lyapunov' takes at a cost per task that does not grow with t "
            f"(registered: {supported_kernels()}); or, if the work is intended, raise gpytorch_hippo.inducing.cost.MAX_ENTRIES."
        )
    raise CovarianceCostError(
        f"{what} would form about {entries:.3g} values (limit {limit:.3g}).{detail} "
        "Shift the times so that the stream starts near 0 (x - x[0]: LegS bases always cover [0, t], so "
        "Unix timestamps with start=0 span decades) or rescale them (e.g. hours instead of seconds); for "
        "LegT/FouT/LagT pass start= the stream's first time; keep the length scale from collapsing with a "
        "constraint (e.g. gpytorch.constraints.GreaterThan on the kernel's lengthscale); on a long LegS stream use "
        "method='lyapunov', whose cost per task does not grow with t (RBF, Matérn and periodic kernels, their sums, and "
        "Matérn or RBF times periodic); "
        "or, if the work is intended, raise gpytorch_hippo.inducing.cost.MAX_ENTRIES."
    )
