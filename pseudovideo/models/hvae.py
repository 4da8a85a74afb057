r"""The HVAE of §5.2.1: a fixed heat-equation encoder (pseudo-video supervision) vs a learnable one.

Latents :math:`z_1, \dots, z_T` have the image's shape. The generative model is shared by both variants,

.. math::

    p(z_T) = \mathcal{N}(m, \operatorname{diag} s^2), \quad
    p(z_{t-1} \mid z_t) = \mathcal{N}(z_t + f_\theta(z_t, t), \sigma_t^2 I), \quad
    p(x \mid z_1) = \operatorname{Bernoulli}(g_\theta(z_1))

(the residual mean of Rissanen et al.'s decoder), and the negative ELBO (thesis eq. (5.1)) is

.. math::

    -\mathbb{E}_q\left[\log p(x \mid z_1) + \sum_t \log p(z_{t-1} \mid z_t) + \log p(z_T) - \log q(z_{1:T} \mid x)\right].

Encoders:

* ``"heat"``: :math:`q(z_t \mid x) = \mathcal{N}(F_h(\tau_t) x, \sigma_h^2 I)` independently over :math:`t` (the frames of
  ``make_pseudo_video(x, T + 1, "heat")``, :math:`z_T` the most dissipated), no parameters;
* ``"learned"``: :math:`q(z_1 \mid x) q(z_2 \mid z_1) \cdots q(z_T \mid z_{T-1})`, each
  :math:`\mathcal{N}(\cdot + m_\phi(\cdot, t), \operatorname{diag} s_\phi(\cdot, t)^2)`
  from one network of the decoder's architecture (the standard bottom-up HVAE).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from probseq._validation import check_int, check_real, check_tensor

from .._random import randn
from .._validation import check_generator
from ..augment import make_pseudo_video

ENCODERS = ("heat", "learned")


class TimeConditionedConvNet(nn.Module):
    """Small residual conv net ``f(z, t)``: ``out_channels`` maps from ``in_channels`` and a level embedding.

    :param in_channels: the input's channels.
    :param out_channels: the output's channels (the output layer starts at zero).
    :param num_levels: the largest level :math:`t`; levels ``0..num_levels`` have embeddings.
    :param width: the hidden channels.
    """

    def __init__(self, in_channels: int, out_channels: int, num_levels: int, width: int = 32):
        super().__init__()
        self.level_embedding = nn.Embedding(num_levels + 1, width)
        self.inputs = nn.Conv2d(in_channels, width, 3, padding=1)
        self.body = nn.ModuleList(nn.Conv2d(width, width, 3, padding=1) for _ in range(3))
        self.outputs = nn.Conv2d(width, out_channels, 3, padding=1)
        for parameter in self.outputs.parameters():  # weight and bias: start as the identity residual (decoder) / zero logits
            nn.init.zeros_(parameter)

    def forward(self, z: torch.Tensor, level: int) -> torch.Tensor:
        """``f(z, level)``, shape ``(B, out_channels, H, W)``.

        :param z: ``(B, in_channels, H, W)`` input maps.
        :param level: the level :math:`t`, in ``0..num_levels``.
        """
        hidden = self.inputs(z) + self.level_embedding.weight[level][None, :, None, None]
        for layer in self.body:
            hidden = hidden + layer(nn.functional.silu(hidden))
        return self.outputs(nn.functional.silu(hidden))


class HeatHVAE(nn.Module):
    r"""HVAE with ``num_latents`` image-shaped latents and a ``"heat"`` or ``"learned"`` encoder.

    :param encoder: ``"heat"`` (fixed heat-dissipation encoder) or ``"learned"`` (module docstring).
    :param num_latents: the number of latents :math:`T`.
    :param channels: the images' channels.
    :param width: the hidden channels of the networks.
    :param image_size: the images' height and width, in pixels.
    :param max_std: the heat encoder's largest blur width in pixels (at least 0.5, the smallest).
    :param noise_std: the heat encoder's noise standard deviation :math:`\sigma_h > 0`.
    """

    def __init__(
        self,
        encoder: str,
        num_latents: int = 18,
        channels: int = 1,
        width: int = 32,
        image_size: int = 28,
        max_std: float = 20.0,
        noise_std: float = 0.01,
    ):
        super().__init__()
        if encoder not in ENCODERS:
            raise ValueError(f"encoder must be one of {ENCODERS}, got {encoder!r}")
        check_int(num_latents, "num_latents")
        for name, value in (("channels", channels), ("width", width), ("image_size", image_size)):
            check_int(value, name)
        max_std = check_real(max_std, "max_std", low=0.5)  # the heat encoder's blur widths run from 0.5 pixels
        noise_std = check_real(noise_std, "noise_std", low=0.0, low_open=True)  # log q needs sigma_h > 0
        self.encoder, self.num_latents, self.noise_std, self.max_std = encoder, num_latents, noise_std, max_std
        self.decoder_mean = TimeConditionedConvNet(channels, channels, num_latents, width)
        self.decoder_log_std = nn.Parameter(torch.full((num_latents + 1,), math.log(max(noise_std, 1e-3) * 1.25)))
        self.likelihood = TimeConditionedConvNet(channels, channels, num_latents, width)
        self.prior_mean = nn.Parameter(torch.zeros(channels, image_size, image_size))
        self.prior_log_std = nn.Parameter(torch.zeros(channels, image_size, image_size))
        if encoder == "learned":
            self.encoder_net = TimeConditionedConvNet(channels, 2 * channels, num_latents, width)

    def encode(self, x: torch.Tensor, generator: torch.Generator | None = None):
        r"""Samples ``[z_1, ..., z_T]`` and ``sum_t log q`` per example.

        :param x: ``(B, channels, image_size, image_size)`` binary images, values in :math:`\{0, 1\}`.
        :param generator: the random generator of the encoder's samples (``None``: PyTorch's global one).
        """
        if self.encoder == "heat":
            means = make_pseudo_video(x, self.num_latents + 1, "heat", max_std=self.max_std, noise_std=0.0)
            latents: list[torch.Tensor] = []
            log_q: float | torch.Tensor = 0.0
            for t in range(1, self.num_latents + 1):
                mean = means[:, self.num_latents - t]
                noise = randn(mean.shape, generator, mean.dtype, mean.device)
                latents.append(mean + self.noise_std * noise)
                log_q = log_q + _normal_log_prob(latents[-1], mean, torch.tensor(self.noise_std, device=mean.device))
            return latents, log_q
        latents, log_q, previous = [], 0.0, x
        for t in range(1, self.num_latents + 1):
            shift, log_std = self.encoder_net(previous, t).chunk(2, dim=1)
            mean = previous + shift
            std = (log_std + math.log(self.noise_std)).clamp(-7, 2).exp()  # starts at the heat encoder's sigma_h
            noise = randn(mean.shape, generator, mean.dtype, mean.device)
            z = mean + std * noise
            log_q = log_q + _normal_log_prob(z, mean, std)
            latents.append(z)
            previous = z
        return latents, log_q

    def forward(self, x: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        r""":meth:`negative_elbo`, the training loss: calling the model, as data-parallel wrappers require, trains it.

        :param x: ``(B, channels, image_size, image_size)`` binary images, values in :math:`\{0, 1\}`.
        :param generator: the random generator of the encoder's samples (``None``: PyTorch's global one).
        """
        return self.negative_elbo(x, generator)

    def negative_elbo(self, x: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        r"""Mean over the batch of ``-ELBO(x)`` in nats, one reparameterised sample of ``q``; ``x`` in ``{0, 1}``.

        :param x: ``(B, channels, image_size, image_size)`` binary images, values in :math:`\{0, 1\}`.
        :param generator: the random generator of the encoder's samples (``None``: PyTorch's global one).
        """
        if not isinstance(x, torch.Tensor) or x.dim() != 4 or not x.is_floating_point():
            raise ValueError(f"x must be a floating (B, C, H, W) tensor of binary pixels, got {getattr(x, 'shape', x)!r}")
        expected = tuple(self.prior_mean.shape)
        if tuple(x.shape[1:]) != expected:
            raise ValueError(f"x must have shape (B, {', '.join(map(str, expected))}), got {tuple(x.shape)}")
        check_tensor(x, "x", non_empty=True)
        if not bool(((x >= 0) & (x <= 1)).all()):
            raise ValueError("x must hold pixels in [0, 1] (binary for the Bernoulli likelihood)")
        check_generator(generator)
        latents, log_q = self.encode(x, generator)
        logits = self.likelihood(latents[0], 0)
        log_p = -nn.functional.binary_cross_entropy_with_logits(logits, x, reduction="none").flatten(1).sum(1)
        for t in range(2, self.num_latents + 1):
            mean = latents[t - 1] + self.decoder_mean(latents[t - 1], t)
            log_p = log_p + _normal_log_prob(latents[t - 2], mean, self.decoder_log_std[t].exp())
        log_p = log_p + _normal_log_prob(latents[-1], self.prior_mean, self.prior_log_std.exp())
        return (log_q - log_p).mean()

    @torch.no_grad()
    def sample(self, num_samples: int, generator: torch.Generator | None = None) -> torch.Tensor:
        """Ancestral samples; returns the Bernoulli means ``sigmoid(g(z_1))`` in ``[0, 1]``.

        :param num_samples: the number of images drawn.
        :param generator: the random generator of the samples (``None``: PyTorch's global one).
        """
        check_int(num_samples, "num_samples", low=0)
        check_generator(generator)
        shape = (num_samples, *self.prior_mean.shape)
        device = self.prior_mean.device  # the noise keeps the default dtype, as before
        z = self.prior_mean + self.prior_log_std.exp() * randn(shape, generator, None, device)
        for t in range(self.num_latents, 1, -1):
            z = z + self.decoder_mean(z, t) + self.decoder_log_std[t].exp() * randn(shape, generator, None, device)
        return torch.sigmoid(self.likelihood(z, 0))


def _normal_log_prob(value: torch.Tensor, mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
    """``sum log N(value; mean, std^2)`` over all but the batch dimension."""
    std = std.expand(value.shape)
    log_density = -0.5 * ((value - mean) / std) ** 2 - std.log() - 0.5 * math.log(2 * math.pi)
    return log_density.flatten(1).sum(1)
