r"""Last-layer Laplace approximation (Daxberger et al. 2021) of a trained classifier, through ``laplace-torch``.

The network is kept at its trained (MAP) weights; only the last linear layer gets a Gaussian posterior
:math:`\mathcal{N}(\theta_\mathrm{MAP}, (H + \lambda I)^{-1})` (:math:`H`: the layer's generalised Gauss-Newton matrix on the training data,
Kronecker-factored by default), the prior precision :math:`\lambda` chosen by maximising the marginal likelihood,
and the predictive is the linearised (GLM) one with the probit approximation of its softmax.

``laplace-torch`` is not a dependency of probseq, nor in an extra: it requires ``torchvision``, whose wheels
pair with one torch build each, so it is imported only when :class:`LastLayerLaplace` is fitted, and a
missing install raises ``ModuleNotFoundError`` that says how to install it.
"""

from __future__ import annotations

import warnings

import torch
from torch import nn

from .._outputs import output_logits

__all__ = ["HESSIAN_STRUCTURES", "LAPLACE_INSTALL", "LastLayerLaplace", "require_laplace"]

#: The Hessian approximations of the last layer that :class:`LastLayerLaplace` accepts (laplace-torch's names).
HESSIAN_STRUCTURES = ("kron", "diag", "full")
PRIOR_METHODS = ("marglik", None)
LINK_APPROXIMATIONS = ("probit", "mc", "bridge")

#: How to get ``laplace-torch`` (the error of a missing install repeats it).
LAPLACE_INSTALL = (
    "pip install laplace-torch needs a torchvision that imports beside your torch (the one pip picks for the CPU "
    "torch 2.13.0 does not): in a fresh environment run 'pip install torch==2.14.1 torchvision==0.29.1', then "
    "'pip install \"probseq[zoo]\" laplace-torch==0.3', the pair and pins CI's zoo check installs"
)


def require_laplace():
    """The ``laplace`` module of ``laplace-torch``; ``ModuleNotFoundError`` naming the package and how to
    install it if it cannot be imported."""
    try:
        import laplace
    except ImportError as error:
        raise ModuleNotFoundError(
            f"LastLayerLaplace needs the 'laplace-torch' package, which probseq does not install: {LAPLACE_INSTALL}",
            name="laplace",
        ) from error
    return laplace


class _Logits(nn.Module):
    """``model`` whose forward returns its logits (a Hugging Face classifier returns a ``ModelOutput``), what
    ``laplace-torch`` expects."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return output_logits(self.model(inputs))


def _check_inputs(inputs, name="inputs"):
    if not isinstance(inputs, torch.Tensor) or inputs.dim() < 2 or inputs.shape[0] == 0:
        raise ValueError(
            f"{name} must be a tensor with a batch dimension and at least one example, "
            f"got {getattr(inputs, 'shape', type(inputs).__name__)}"
        )
    if inputs.is_floating_point() and not torch.isfinite(inputs).all():
        raise ValueError(f"{name} contains NaN or infinite values")


def _check_positive_int(value, name):
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")


class LastLayerLaplace(nn.Module):
    r"""A last-layer Laplace approximation of ``model``, a classifier whose forward returns logits (or an output with
    ``.logits``, as Hugging Face's classifiers, called with the token ids alone) and whose
    last layer is an ``nn.Linear`` (found by ``laplace-torch``, or named by ``last_layer_name``, e.g.
    ``"head"``).  :meth:`fit` on the training data, then :meth:`predict_proba`.

    ``model`` itself is not changed: ``laplace-torch`` works on a copy, in evaluation mode (no dropout).

    :param model: the trained classifier; its forward returns logits ``(N, C)`` and its last layer is an ``nn.Linear``.
    :param hessian_structure: the Hessian approximation of the last layer, one of :data:`HESSIAN_STRUCTURES` (default
        ``"kron"``, Kronecker-factored).
    :param last_layer_name: the module name of the last ``nn.Linear`` (e.g. ``"head"``); ``None`` (the default): found by
        ``laplace-torch``.
    :param prior_precision: the initial prior precision :math:`\lambda > 0` (default 1; the fitted value with
        ``optimize_prior="marglik"``).
    """

    def __init__(self, model: nn.Module, hessian_structure: str = "kron", last_layer_name: str | None = None, prior_precision: float = 1.0):
        super().__init__()
        if not isinstance(model, nn.Module):
            raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
        if hessian_structure not in HESSIAN_STRUCTURES:
            raise ValueError(f"hessian_structure must be one of {HESSIAN_STRUCTURES}, got {hessian_structure!r}")
        if last_layer_name is not None:
            layer = dict(model.named_modules()).get(last_layer_name)
            if not isinstance(layer, nn.Linear):
                raise ValueError(
                    f"last_layer_name must name an nn.Linear module of model, got {last_layer_name!r} "
                    f"({type(layer).__name__ if layer is not None else 'no such module'})"
                )
        if isinstance(prior_precision, bool) or not isinstance(prior_precision, (int, float)) or not prior_precision > 0:
            raise ValueError(f"prior_precision must be a number > 0, got {prior_precision!r}")
        self.model = model
        self.hessian_structure = hessian_structure
        self.last_layer_name = last_layer_name
        self.initial_prior_precision = float(prior_precision)
        self.laplace = None

    def fit(
        self, inputs: torch.Tensor, labels: torch.Tensor, batch_size: int = 100, optimize_prior: str | None = "marglik"
    ) -> LastLayerLaplace:
        """Fit the posterior of the last layer at the trained weights on ``inputs`` (``N x ...``) and integer
        ``labels`` (``N``); with ``optimize_prior="marglik"`` (the default) choose the prior precision by the
        marginal likelihood (``None``: keep ``prior_precision``).  Returns ``self``.

        :param inputs: the training inputs, ``(N, ...)``.
        :param labels: the training classes, ``(N,)`` integers in ``[0, C)``.
        :param batch_size: the batch size of the passes over the data, a positive int (default 100).
        :param optimize_prior: ``"marglik"`` (the default) or ``None`` (above).
        """
        _check_inputs(inputs)
        if not isinstance(labels, torch.Tensor) or labels.shape != inputs.shape[:1] or labels.is_floating_point():
            raise ValueError(
                f"labels must be an integer tensor of shape ({inputs.shape[0]},), got {getattr(labels, 'shape', type(labels).__name__)}"
            )
        if (labels < 0).any():
            raise ValueError("labels must be class indices >= 0")
        _check_positive_int(batch_size, "batch_size")
        if optimize_prior not in PRIOR_METHODS:
            raise ValueError(f"optimize_prior must be one of {PRIOR_METHODS}, got {optimize_prior!r}")
        laplace = require_laplace()
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.no_grad():
                num_classes = output_logits(self.model(inputs[:1])).shape[-1]
            if (labels >= num_classes).any():
                raise ValueError(f"labels must lie in [0, {num_classes}), the model's classes")
            loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(inputs, labels.long()), batch_size=batch_size)
            approximation = laplace.Laplace(
                _Logits(self.model),
                "classification",
                subset_of_weights="last_layer",
                hessian_structure=self.hessian_structure,
                prior_precision=self.initial_prior_precision,
                last_layer_name=None if self.last_layer_name is None else f"model.{self.last_layer_name}",
            )
            approximation.fit(loader)
            if optimize_prior == "marglik":
                with warnings.catch_warnings():  # laplace-torch reminds of link_approx on every call; it is set here
                    warnings.filterwarnings("ignore", message="By default `link_approx` is `probit`", category=UserWarning)
                    approximation.optimize_prior_precision(pred_type="glm", method="marglik", link_approx="probit")
        finally:
            self.model.train(was_training)
        self.laplace = approximation
        return self

    @property
    def prior_precision(self) -> float:
        """The prior precision ``λ`` of the fitted approximation (its mean, if per parameter group)."""
        if self.laplace is None:
            raise RuntimeError("LastLayerLaplace is not fitted: call fit(inputs, labels) first")
        return float(torch.as_tensor(self.laplace.prior_precision).mean())

    @torch.no_grad()
    def predict_proba(
        self, inputs: torch.Tensor, num_samples: int = 100, link_approx: str = "probit", batch_size: int = 500
    ) -> torch.Tensor:
        """Predictive class probabilities ``(N, C)`` of the linearised (GLM) predictive; ``link_approx``:
        ``"probit"`` (default, deterministic), ``"bridge"``, or ``"mc"`` with ``num_samples`` samples.

        :param inputs: the inputs, ``(N, ...)``.
        :param num_samples: the Monte-Carlo samples of ``link_approx="mc"``, a positive int (default 100; unused otherwise).
        :param link_approx: ``"probit"`` (the default), ``"bridge"`` or ``"mc"``, the approximation of the softmax's expectation.
        :param batch_size: the number of inputs per ``laplace-torch`` call, a positive int (default 500).
        """
        if self.laplace is None:
            raise RuntimeError("LastLayerLaplace is not fitted: call fit(inputs, labels) first")
        _check_inputs(inputs)
        _check_positive_int(num_samples, "num_samples")
        _check_positive_int(batch_size, "batch_size")
        if link_approx not in LINK_APPROXIMATIONS:
            raise ValueError(f"link_approx must be one of {LINK_APPROXIMATIONS}, got {link_approx!r}")
        chunks = [
            self.laplace(chunk, pred_type="glm", link_approx=link_approx, n_samples=num_samples) for chunk in inputs.split(batch_size)
        ]
        return torch.cat(chunks).detach()

    def forward(self, *inputs, **kwargs):
        raise TypeError("LastLayerLaplace has no single forward pass; call predict_proba")
