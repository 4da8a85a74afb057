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
import itertools
from collections.abc import Callable, Sequence
from typing import cast

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

    #: the single-stream sets (an ``nn.ModuleList``, typed by what it holds)
    streams: Sequence[InducingVariables]

    def __init__(self, streams: Sequence[InducingVariables]):
        streams = list(streams)
        if not streams or not all(isinstance(s, InducingVariables) for s in streams):
            raise TypeError("streams must be a non-empty sequence of InducingVariables")
        if len({type(s) for s in streams}) != 1 or len({s.num_inducing for s in streams}) != 1:
            raise ValueError("the streams' inducing variables must be of one type and one number M")
        super().__init__(jitter=streams[0].jitter)
        self.streams = cast(Sequence[InducingVariables], nn.ModuleList(streams))
        self._relative_jitter = streams[0]._relative_jitter
        self._templates: dict = {}
        # an engine that forms every stream's covariances at once (e.g. LegS with method="lyapunov"), or None
        engine = getattr(streams[0], "batched_engine", None)
        self._engine = engine() if callable(engine) else None

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
                    sub.batch_shape = torch.Size([])
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

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        """Every stream takes its own saved values: sets and tensors shared between streams (:meth:`frozen_copy`,
        :func:`share_equal_buffers`) are separated first."""
        seen_modules, seen_tensors = set(), set()
        for i, stream in enumerate(self.streams):
            if id(stream) in seen_modules:
                stream = self.streams[i] = copy.deepcopy(stream)
            seen_modules.add(id(stream))
            for module in stream.modules():
                for name, tensor in list(module.named_buffers(recurse=False, remove_duplicate=False)):
                    if id(tensor) in seen_tensors:
                        setattr(module, name, tensor.clone())
                    else:
                        seen_tensors.add(id(tensor))
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def frozen_copy(self) -> BatchedInducingVariables:
        """A copy for a stored task (it never moves): streams in the same state share one copied set, so that a
        fleet whose streams keep the same clocks stores their variables once."""
        groups: dict[tuple, list[int]] = {}
        seen: dict = {}  # tensors the streams share (e.g. their Fourier draws) are read once
        for i, stream in enumerate(self.streams):
            groups.setdefault(_state_key(stream, seen), []).append(i)
        copies: list = [None] * len(self.streams)
        for group in groups.values():
            shared = copy.deepcopy(self.streams[group[0]])
            for i in group:
                copies[i] = shared
        frozen = BatchedInducingVariables(copies)
        frozen._engine = self._engine  # its cache is keyed by the clocks and hyperparameters it was computed for
        return frozen

    def keep_streams(self, stored: BatchedInducingVariables, kept: Tensor) -> None:
        """Take ``stored``'s sets for the streams where ``kept`` is ``True``, in place: a stream without points in a task
        keeps its stored posterior, which holds only on the variables it was computed for (e.g. its bases at the clock of
        its last update, whatever ``advance`` moved since).

        :param stored: the stored task's copy of these ``S`` streams.
        :param kept: booleans ``(S,)``, ``True`` for the streams that keep their stored posterior.
        """
        for i in kept.reshape(-1).nonzero().squeeze(-1).tolist():
            cast(nn.ModuleList, self.streams)[i] = stored.streams[i]  # a stored set never moves: the two copies may share it

    def _groups(self, kernel: nn.Module, other: BatchedInducingVariables | None = None) -> list[list[int]] | None:
        """Streams whose covariances coincide: the same state (every parameter and buffer of their own sets, and of
        ``other``'s) and the same slice of ``kernel`` -- e.g. streams that advanced to the same clocks under shared
        hyperparameters. Each group's covariances are formed once. ``None`` (every stream for itself) where
        gradients with respect to the kernel are needed, so that each stream's slice receives its own."""
        if torch.is_grad_enabled() and any(p.requires_grad for p in kernel.parameters()):
            return None
        size = len(self.streams)
        sliced = [
            t.detach()
            for sub in _batched_modules(kernel, size)
            for t in itertools.chain(sub.parameters(recurse=False), sub.buffers(recurse=False))
            if t.dim() > 0 and t.shape[0] == size
        ]
        groups: dict[tuple, list[int]] = {}
        seen: dict = {}  # tensors the streams share (e.g. their Fourier draws) are read once
        for i, stream in enumerate(self.streams):
            sets = (stream,) if other is None else (stream, other.streams[i])
            key = tuple(_state_key(s, seen) for s in sets) + tuple(_bytes(t[i]) for t in sliced)
            groups.setdefault(key, []).append(i)
        return list(groups.values())

    def _grouped(self, kernel: nn.Module, value: Callable[[list[int]], Tensor], other=None) -> Tensor:
        """Stack ``value(group)`` (a tensor with the group's streams first) over the groups of :meth:`_groups`."""
        groups = self._groups(kernel, other)
        if groups is None or len(groups) == len(self.streams):
            return torch.cat([value([i]) for i in range(len(self.streams))])
        parts = [value(group) for group in groups]
        out = parts[0].new_empty((len(self.streams), *parts[0].shape[1:]))
        for group, part in zip(groups, parts):
            out[group] = part
        return out

    def _stream_inputs(self, x: Tensor) -> Tensor:
        if x.dim() < 3 or x.shape[-3] != len(self.streams):
            raise ValueError(
                f"inputs of {len(self.streams)} batched streams must have shape ({len(self.streams)}, N, D), got {tuple(x.shape)}"
            )
        return x

    # ------------------------------------------------------------------ the interface
    def Kuu(self, kernel: gpytorch.kernels.Kernel) -> LinearOperator:
        """``(S, M, M)``: each stream's ``Kuu`` under its own hyperparameters.

        :param kernel: the GP's kernel, with ``batch_shape=(S,)`` (stream ``s`` sees index ``s``) or shared.
        """
        batched = None if self._engine is None else self._engine.Kuu(self.streams, kernel)
        if batched is not None:
            return DenseLinearOperator(batched)

        def value(group):
            first = group[0]
            kuu = self._per_stream(kernel, first, lambda k: to_dense(self.streams[first].Kuu(k)))
            return kuu.expand(len(group), *kuu.shape)

        return DenseLinearOperator(self._grouped(kernel, value))

    def Kuf(self, kernel: gpytorch.kernels.Kernel, x: Tensor) -> Tensor:
        """``(S, M, N)`` for inputs ``(S, N, D)``: stream ``s``'s ``Kuf`` at its own inputs ``x[s]`` (a group of
        streams with the same state, :meth:`_groups`, in one call on their inputs together).

        :param kernel: the GP's kernel, with ``batch_shape=(S,)`` or shared.
        :param x: inputs ``(S, N, D)``, stream ``s``'s at ``x[s]``.
        """
        x = self._stream_inputs(x)
        batched = None if self._engine is None else self._engine.Kuf(self.streams, kernel, x)
        if batched is not None:
            return batched

        def value(group):
            first, inputs = group[0], x[group]
            kuf = self._per_stream(kernel, first, lambda k: self.streams[first].Kuf(k, inputs.reshape(-1, inputs.shape[-1])))
            return kuf.reshape(kuf.shape[0], len(group), inputs.shape[-2]).transpose(0, 1)

        return self._grouped(kernel, value)

    def Kuu_cross(self, other: InducingVariables, kernel: gpytorch.kernels.Kernel) -> Tensor:
        """``(S, M, M')``: stream by stream with another batch of ``S`` streams (e.g. the stored copy).

        :param other: another :class:`BatchedInducingVariables` of ``S`` streams.
        :param kernel: the GP's kernel, with ``batch_shape=(S,)`` or shared.
        """
        if not isinstance(other, BatchedInducingVariables) or len(other.streams) != len(self.streams):
            raise TypeError(f"the cross-covariance of {len(self.streams)} batched streams needs another batch of as many streams")
        batched = None if self._engine is None else self._engine.Kuu_cross(self.streams, other.streams, kernel)
        if batched is not None:
            return batched

        def value(group):
            first = group[0]
            cross = self._per_stream(kernel, first, lambda k: self.streams[first].Kuu_cross(other.streams[first], k))
            return cross.expand(len(group), *cross.shape)

        return self._grouped(kernel, value, other)

    def prior_mean(self, mean_module: gpytorch.means.Mean | None) -> Tensor | None:
        """``(S, M)``: each stream's prior mean under its slice of ``mean_module``, or ``None`` where all are zero.

        :param mean_module: the GP's prior mean function, with ``batch_shape=(S,)`` or shared (``None``: zero).
        """
        if type(self.streams[0]).prior_mean is InducingVariables.prior_mean:
            return None  # the streams' variables have a zero prior mean whatever the mean function
        means = [self._per_stream(mean_module, i, s.prior_mean) for i, s in enumerate(self.streams)]
        if all(m is None for m in means):
            return None
        given = next(m for m in means if m is not None)
        zero = torch.zeros(self.num_inducing, dtype=given.dtype, device=given.device)
        return torch.stack([zero if m is None else m for m in means])

    def unshared_jitter(self, other: InducingVariables, kuu: Tensor) -> Tensor:
        """``(S, M)``: each stream's jitter variances that the same stream of ``other`` does not share
        (:meth:`~gpytorch_hippo.inducing.base.InducingVariables.unshared_jitter`).

        :param other: another batch of ``S`` streams (any other set: the base class's rule).
        :param kuu: the ``Kuu`` of these streams, ``(S, M, M)`` dense.
        """
        if not isinstance(other, BatchedInducingVariables) or len(other.streams) != len(self.streams):
            return super().unshared_jitter(other, kuu)
        batched = None if self._engine is None else self._engine.unshared_jitter(self.streams, other.streams, kuu)
        if batched is not None:
            return batched
        return self._stack(lambda i, s: s.unshared_jitter(other.streams[i], kuu[i]))

    def jitter_variance(self, kuu: Tensor) -> Tensor:
        """``(S, M)``: the variances of the jitter that :meth:`Kuu` adds to each stream.

        :param kuu: the ``Kuu`` of these streams, ``(S, M, M)`` dense.
        """
        if self._engine is not None:
            return self._engine.jitter_variance(self.streams, kuu)
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
        """Each stream's inputs ``x[s]`` against its own support; the error names the stream.

        :param x: inputs ``(S, N, 1)`` (others are not checked).
        :param what: how the error message names the inputs (default ``"training inputs"``).
        """
        if x.dim() < 3:
            return
        supports = self.stream_supports()
        if supports is not None and x.shape[-1] == 1 and x.shape[-2] > 0:
            times = x[..., 0].detach().double().cpu()
            relative = max(1e-9, 8 * torch.finfo(x.dtype).eps) if x.is_floating_point() else 1e-9  # as each stream's check
            tolerance = relative * supports.abs().max(-1).values.clamp_min(1.0)
            inside = (times.min(-1).values >= supports[:, 0] - tolerance) & (times.max(-1).values <= supports[:, 1] + tolerance)
            if bool(inside.all()):
                return
        for i, stream in enumerate(self.streams):
            try:
                stream.check_inputs_within_support(x[i], what)
            except InputsOutsideSupportError as error:
                raise InputsOutsideSupportError(f"stream {i}: {error}") from None

    def coverage_advice(self, cause: str) -> str:
        """The first stream's advice (:meth:`~gpytorch_hippo.inducing.base.InducingVariables.coverage_advice`).

        :param cause: ``"before"``, ``"beyond"`` or ``"too few"``.
        """
        return self.streams[0].coverage_advice(cause)

    # ------------------------------------------------------------------ streams that move (HiPPO clocks)
    @property
    def t(self) -> Tensor:
        """``(S,)``: each stream's clock (HiPPO bases)."""
        return stream_clocks(self.streams)

    def advance(self, t_new: float | Tensor) -> None:
        """Move each stream's bases to its ``t_new`` (a float for all, or ``(S,)``); a stream whose ``t_new``
        equals its clock stays where it is (e.g. a stream without data in this task).

        :param t_new: the new end times: a number for every stream, or a tensor ``(S,)``.
        """
        self._check_movable("advance(t_new)")
        targets = torch.as_tensor(t_new, dtype=torch.float64).detach().cpu()
        if targets.dim() == 0:
            targets = targets.expand(len(self.streams))
        if targets.shape != (len(self.streams),):
            raise ValueError(f"t_new must be a number or have shape ({len(self.streams)},), got {tuple(targets.shape)}")
        advance_streams = getattr(type(self.streams[0]), "advance_streams", None)
        if advance_streams is not None:  # the streams' own batched move: every stream checked before any moves
            advance_streams(self.streams, targets)
            return
        for i in (targets != stream_clocks(self.streams)).nonzero().squeeze(-1).tolist():
            try:
                self.streams[i].advance(float(targets[i]))
            except ValueError as error:
                raise ValueError(f"stream {i}: {error}") from None


def stream_clocks(streams: Sequence[nn.Module]) -> Tensor:
    """``(S,)`` float64: the clocks ``t`` (the last of their breakpoints) of streams that have them, read in one concatenation.

    :param streams: the ``S`` single-stream sets, each with a ``breakpoints`` buffer (HiPPO bases).
    """
    breakpoints = [cast(Tensor, s.breakpoints) for s in streams]
    ends = torch.tensor([b.shape[0] for b in breakpoints]).cumsum(0) - 1
    return torch.cat(breakpoints).detach().cpu().double()[ends]


def _bytes(tensor: Tensor) -> bytes:
    return tensor.detach().cpu().contiguous().numpy().tobytes()


def _state_key(module: nn.Module, seen: dict | None = None) -> tuple:
    """The values of every parameter and buffer of ``module`` (streams with equal keys have equal covariances);
    ``seen`` memoises the values of tensor objects read before (``id -> (tensor, bytes)``)."""
    seen = {} if seen is None else seen
    key = []
    for prefix, sub in module.named_modules():
        own = itertools.chain(
            sub.named_parameters(recurse=False, remove_duplicate=False), sub.named_buffers(recurse=False, remove_duplicate=False)
        )
        for name, tensor in own:
            known = seen.get(id(tensor))
            if known is None or known[0] is not tensor:
                known = seen[id(tensor)] = (tensor, _bytes(tensor))
            key.append((prefix, name, known[1]))
    return tuple(key)


def share_equal_buffers(modules: list[nn.Module]) -> None:
    """Make the buffers that all ``modules`` hold with equal values one tensor object (e.g. the Fourier draws
    of one seed), so that their copies and state keys read it once.

    :param modules: the modules (e.g. the streams' sets), all with the buffers of ``modules[0]``; changed in place.
    """
    for name, first in modules[0].named_buffers():
        owners = []
        for module in modules[1:]:
            path, _, leaf = name.rpartition(".")
            owner = module.get_submodule(path) if path else module
            tensor = dict(owner.named_buffers(recurse=False, remove_duplicate=False)).get(leaf)
            if tensor is None or tensor.shape != first.shape or tensor.dtype != first.dtype or not torch.equal(tensor, first):
                break
            owners.append((owner, leaf))
        else:
            for owner, leaf in owners:
                setattr(owner, leaf, first)


def _batched_modules(module: nn.Module, size: int) -> set:
    """The GPyTorch kernels, means and likelihoods within ``module`` whose batch shape is ``(size,)``."""
    kinds = (gpytorch.kernels.Kernel, gpytorch.means.Mean, gpytorch.likelihoods.Likelihood)
    return {sub for sub in module.modules() if isinstance(sub, kinds) and getattr(sub, "batch_shape", None) == torch.Size([size])}
