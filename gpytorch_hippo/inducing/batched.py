"""Independent streams' inducing variables as one batch: ``S`` single-stream sets, each with its own state.

GPyTorch batches a model by a leading ``batch_shape`` of its kernel and likelihood; the covariances here
are ``(S, M, M)`` and ``(S, M, N)`` stacks of the streams' own, so that an online model of ``S`` streams
(:class:`~gpytorch_hippo.online.OnlineSGPR`) factorises them in one batched call. Each stream's covariances
are those of its own set under its own slice of a batched kernel (``batch_shape=(S,)``: stream ``s`` sees the
hyperparameters at index ``s``; a kernel without a batch shape is shared), taken through
``torch.func.functional_call`` so that gradients reach the batched hyperparameters. Used for inducing
variables whose state cannot be a tensor batch, e.g. HiPPO bases with a clock per stream
(``HiPPOInducingVariables(M, "legs", t=t0, batch_shape=torch.Size([S]))``).
"""
from __future__ import annotations

import copy
from collections.abc import Callable, Sequence

import gpytorch
import torch
from linear_operator import to_dense
from linear_operator.operators import DenseLinearOperator, LinearOperator
from torch import Tensor, nn

from .base import InducingVariables, InputsOutsideSupportError


class _Apply(nn.Module):
    """Runs ``fn(module)`` inside ``torch.func.functional_call``, which swaps the module's tensors."""

    def __init__(self, module: nn.Module):
        super().__init__()
        self.module = module

    def forward(self, fn: Callable):
        return fn(self.module)


class BatchedInducingVariables(InducingVariables):
    """``S`` independent streams' inducing variables (``streams[s]``, each ``M`` variables).

    :param streams: the single-stream sets, all of one type and ``M``.
    """

    def __init__(self, streams: Sequence[InducingVariables]):
        streams = list(streams)
        if not streams or not all(isinstance(s, InducingVariables) for s in streams):
            raise TypeError("streams must be a non-empty sequence of InducingVariables")
        if len({type(s) for s in streams}) != 1 or len({s.num_inducing for s in streams}) != 1:
            raise ValueError("the streams' inducing variables must be of one type and one number M")
        super().__init__(jitter=streams[0].jitter)
        self.streams = nn.ModuleList(streams)
        self._relative_jitter = streams[0]._relative_jitter
        self._templates: dict = {}

    @property
    def num_inducing(self) -> int:
        return self.streams[0].num_inducing

    @property
    def batch_shape(self) -> torch.Size:
        return torch.Size([len(self.streams)])

    def extra_repr(self) -> str:
        return f"S={len(self.streams)}"

    # ------------------------------------------------------------------ per-stream views of a batched module
    def _per_stream(self, module: nn.Module | None, index: int, fn: Callable):
        """``fn`` of ``module`` as stream ``index`` sees it: the direct parameters of its submodules with
        ``batch_shape == (S,)`` sliced at ``index`` (differentiably), every other tensor as it is."""
        if module is None or not _batched_modules(module, len(self.streams)):
            return fn(module)
        key = id(module)
        if key not in self._templates or self._templates[key][0] is not module:
            template = copy.deepcopy(module)  # its tensors are replaced in every call: only its structure is used
            for sub in template.modules():
                if isinstance(sub, gpytorch.kernels.Kernel) and sub.batch_shape == self.batch_shape:
                    sub._batch_shape = torch.Size([])
            self._templates[key] = (module, _Apply(template))
        batched = _batched_modules(module, len(self.streams))
        tensors = {}
        for prefix, sub in module.named_modules():
            sliced = sub in batched
            for name, tensor in list(sub.named_parameters(recurse=False)) + list(sub.named_buffers(recurse=False)):
                full = f"module.{prefix}.{name}" if prefix else f"module.{name}"
                tensors[full] = tensor[index] if sliced and tensor.dim() > 0 and tensor.shape[0] == len(self.streams) else tensor
        return torch.func.functional_call(self._templates[key][1], tensors, (fn,))

    def _stack(self, fn: Callable[[int, InducingVariables], Tensor]) -> Tensor:
        return torch.stack([fn(i, stream) for i, stream in enumerate(self.streams)])

    def _stream_inputs(self, x: Tensor) -> Tensor:
        if x.dim() < 3 or x.shape[-3] != len(self.streams):
            raise ValueError(
                f"inputs of {len(self.streams)} batched streams must have shape ({len(self.streams)}, N, D), got {tuple(x.shape)}"
            )
        return x

    # ------------------------------------------------------------------ the interface
    def Kuu(self, kernel: gpytorch.kernels.Kernel) -> LinearOperator:
        """``(S, M, M)``: each stream's ``Kuu`` under its own hyperparameters."""
        return DenseLinearOperator(self._stack(lambda i, s: self._per_stream(kernel, i, lambda k: to_dense(s.Kuu(k)))))

    def Kuf(self, kernel: gpytorch.kernels.Kernel, x: Tensor) -> Tensor:
        """``(S, M, N)`` for inputs ``(S, N, D)``: stream ``s``'s ``Kuf`` at its own inputs ``x[s]``."""
        x = self._stream_inputs(x)
        return self._stack(lambda i, s: self._per_stream(kernel, i, lambda k: s.Kuf(k, x[i])))

    def Kuu_cross(self, other: InducingVariables, kernel: gpytorch.kernels.Kernel) -> Tensor:
        """``(S, M, M')``: stream by stream with another batch of ``S`` streams (e.g. the stored copy)."""
        if not isinstance(other, BatchedInducingVariables) or len(other.streams) != len(self.streams):
            raise TypeError(f"the cross-covariance of {len(self.streams)} batched streams needs another batch of as many streams")
        return self._stack(lambda i, s: self._per_stream(kernel, i, lambda k: s.Kuu_cross(other.streams[i], k)))

    def prior_mean(self, mean_module: gpytorch.means.Mean | None) -> Tensor | None:
        means = [self._per_stream(mean_module, i, s.prior_mean) for i, s in enumerate(self.streams)]
        if all(m is None for m in means):
            return None
        return torch.stack([torch.zeros(self.num_inducing) if m is None else m for m in means])

    def unshared_jitter(self, other: InducingVariables, kuu: Tensor) -> Tensor:
        if not isinstance(other, BatchedInducingVariables) or len(other.streams) != len(self.streams):
            return super().unshared_jitter(other, kuu)
        return self._stack(lambda i, s: s.unshared_jitter(other.streams[i], kuu[i]))

    def jitter_variance(self, kuu: Tensor) -> Tensor:
        return self._stack(lambda i, s: s.jitter_variance(kuu[i]))

    def input_support(self) -> None:
        """``None``: the streams' supports differ; see :meth:`stream_supports`."""
        return None

    def stream_supports(self) -> Tensor | None:
        """``(S, 2)``: each stream's ``(lower, upper)`` input range, or ``None`` where any input is reachable."""
        supports = [s.input_support() for s in self.streams]
        if any(s is None for s in supports):
            return None
        return torch.tensor(supports, dtype=torch.float64)

    def check_inputs_within_support(self, x: Tensor, what: str = "training inputs") -> None:
        """Each stream's inputs ``x[s]`` against its own support; the error names the stream."""
        if x.dim() < 3:
            return
        for i, stream in enumerate(self.streams):
            try:
                stream.check_inputs_within_support(x[i], what)
            except InputsOutsideSupportError as error:
                raise InputsOutsideSupportError(f"stream {i}: {error}") from None

    def coverage_advice(self, cause: str) -> str:
        return self.streams[0].coverage_advice(cause)

    # ------------------------------------------------------------------ streams that move (HiPPO clocks)
    @property
    def t(self) -> Tensor:
        """``(S,)``: each stream's clock (HiPPO bases)."""
        return torch.tensor([float(s.t) for s in self.streams], dtype=torch.float64)

    def advance(self, t_new: float | Tensor) -> None:
        """Move each stream's bases to its ``t_new`` (a float for all, or ``(S,)``); a stream whose ``t_new``
        equals its clock stays where it is (e.g. a stream without data in this task)."""
        self._check_movable("advance(t_new)")
        targets = torch.as_tensor(t_new, dtype=torch.float64).detach().cpu()
        if targets.dim() == 0:
            targets = targets.expand(len(self.streams))
        if targets.shape != (len(self.streams),):
            raise ValueError(f"t_new must be a number or have shape ({len(self.streams)},), got {tuple(targets.shape)}")
        for i, (stream, target) in enumerate(zip(self.streams, targets.tolist())):
            if target != stream.t:
                try:
                    stream.advance(target)
                except ValueError as error:
                    raise ValueError(f"stream {i}: {error}") from None


def _batched_modules(module: nn.Module, size: int) -> set:
    """The GPyTorch kernels, means and likelihoods within ``module`` whose batch shape is ``(size,)``."""
    kinds = (gpytorch.kernels.Kernel, gpytorch.means.Mean, gpytorch.likelihoods.Likelihood)
    return {sub for sub in module.modules() if isinstance(sub, kinds) and getattr(sub, "batch_shape", None) == torch.Size([size])}
