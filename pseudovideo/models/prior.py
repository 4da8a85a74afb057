r"""Priors :math:`p(z)` over VQ tokens (thesis §5.3): autoregressive (ImageGPT/VideoGPT) and masked (MaskGIT/Phenaki).

Tokens of shape ``token_shape`` — ``(h, w)`` for an image, ``(t, h, w)`` for a video, so an image is
a 1-frame video — are flattened in raster order (time, then rows, then columns) into a sequence
:math:`z_1, \dots, z_L`. Both priors share one Transformer over that sequence (token embedding with one
extra symbol, learned positions, pre-norm blocks, a linear head to the :math:`K` codes) and differ only
in their attention mask, their extra symbol and how they are trained and sampled:

* ``AutoregressiveTokenPrior``: :math:`p(z) = \prod_i p(z_i \mid z_{<i})` with causal self-attention on
  :math:`[\mathrm{BOS}, z_1, \dots, z_{L-1}]`, maximum likelihood, ancestral sampling with a temperature.
* ``MaskedTokenPrior``: bidirectional attention on tokens some of which are replaced by ``[MASK]``.
  Training draws :math:`u \sim U(0, 1)` per sequence, masks :math:`\lceil \cos(\pi u / 2) L \rceil` random positions and
  scores the masked ones by cross-entropy. Decoding starts fully masked; at step :math:`s = 1, \dots, S` it
  samples every masked position, keeps the most confident and re-masks the
  :math:`\lfloor \cos(\pi s / (2 S)) L \rfloor` least confident, so step :math:`S` fills every token. Confidence is
  MaskGIT's: the log-probability of the sampled code plus ``choice_temperature (1 - s / S)`` times
  Gumbel noise (0 gives the purely greedy order, which fills the easiest tokens, e.g. background,
  first and collapses diversity).
"""

from __future__ import annotations

import math
from typing import cast

import torch
import torch.nn.functional as F
from torch import nn
from tqdm import tqdm

from probseq._validation import check_int, check_real

from .._random import multinomial, rand
from .._validation import check_generator
from .quantizer import check_tokens
from .tokenizer import transformer_stack


class TokenPrior(nn.Module):
    """The shared Transformer: ``(B, L)`` symbols in ``[0, K]`` -> ``(B, L, K)`` logits over the codes.

    :param codebook_size: the number of codes :math:`K` (at least 2); symbol :math:`K` is the extra one.
    :param token_shape: the shape of one sample's tokens, ``(h, w)`` or ``(t, h, w)``.
    :param dim: the Transformer's width, a multiple of ``heads``.
    :param heads: the attention heads per layer.
    :param layers: the number of Transformer blocks.
    """

    causal: bool = False

    def __init__(self, codebook_size: int, token_shape: tuple[int, ...], dim: int = 64, heads: int = 4, layers: int = 4):
        super().__init__()
        check_int(codebook_size, "codebook_size", low=2)
        if not isinstance(token_shape, (tuple, list, torch.Size)):
            raise ValueError(f"token_shape must be a tuple of positive integers, got {token_shape!r}")
        token_shape = tuple(token_shape)
        if not token_shape:
            raise ValueError(f"token_shape must be a tuple of positive integers, got {token_shape!r}")
        token_shape = tuple(check_int(n, "token_shape entries") for n in token_shape)
        for name, value in [("dim", dim), ("heads", heads), ("layers", layers)]:
            check_int(value, name)
        if dim % heads:
            raise ValueError(f"dim ({dim}) must be a multiple of heads ({heads})")
        self.codebook_size, self.token_shape = codebook_size, token_shape
        self.length = math.prod(token_shape)
        self.special = codebook_size  # [BOS] for the autoregressive prior, [MASK] for the masked one
        self.embed = nn.Embedding(codebook_size + 1, dim)
        self.position = nn.Parameter(0.02 * torch.randn(self.length, dim))
        self.blocks = cast(nn.TransformerEncoder, transformer_stack(dim, heads, layers))  # never None: layers >= 1
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, codebook_size)

    def network(self, symbols: torch.Tensor) -> torch.Tensor:
        r"""Logits ``(B, n, K)`` for ``(B, n)`` symbols, :math:`n \le L` (causal attention if ``self.causal``).

        :param symbols: ``(B, n)`` int64 symbols in ``[0, K]`` (codes and the extra symbol).
        """
        steps = symbols.shape[1]
        hidden = self.embed(symbols) + self.position[:steps]
        if self.causal:
            mask = nn.Transformer.generate_square_subsequent_mask(steps, device=symbols.device, dtype=hidden.dtype)
            hidden = self.blocks(hidden, mask=mask, is_causal=True)
        else:
            hidden = self.blocks(hidden)
        return self.head(self.norm(hidden))

    def _flatten(self, tokens: torch.Tensor) -> torch.Tensor:
        check_tokens(tokens, self.codebook_size)
        if tokens.dim() < 1 or tuple(tokens.shape[1:]) != self.token_shape or tokens.shape[0] == 0:
            raise ValueError(f"tokens must have shape (B, {', '.join(map(str, self.token_shape))}) with B >= 1, got {tuple(tokens.shape)}")
        return tokens.long().reshape(tokens.shape[0], self.length)

    def _check_sampling(self, num_samples, temperature):
        check_int(num_samples, "num_samples")
        check_real(temperature, "temperature", low=0.0, low_open=True)


def sample_codes(logits: torch.Tensor, temperature: float, generator: torch.Generator | None):
    r"""Draw one code per row of ``(..., K)`` logits from :math:`\operatorname{softmax}(\mathrm{logits} / \mathrm{temperature})`; also its
    probability.

    :param logits: ``(..., K)`` unnormalised log-probabilities.
    :param temperature: divides the logits; 1 samples the model's distribution, smaller values sharpen it.
    :param generator: the random generator of the draws (``None``: PyTorch's global one).
    """
    probabilities = (logits / temperature).softmax(-1)
    flat = probabilities.reshape(-1, probabilities.shape[-1])
    codes = multinomial(flat, 1, generator).reshape(probabilities.shape[:-1])
    return codes, probabilities.gather(-1, codes[..., None]).squeeze(-1)


class AutoregressiveTokenPrior(TokenPrior):
    r"""ImageGPT/VideoGPT: :math:`p(z) = \prod_i p(z_i \mid z_{<i})` in raster order, causal self-attention."""

    causal = True

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        r"""Logits ``(B, *token_shape, K)`` of :math:`p(z_i \mid z_{<i})` at every position :math:`i`.

        :param tokens: ``(B, *token_shape)`` int64 codes in ``[0, K)``.
        """
        flat = self._flatten(tokens)
        bos = torch.full_like(flat[:, :1], self.special)
        return self.network(torch.cat([bos, flat[:, :-1]], dim=1)).reshape(*tokens.shape, self.codebook_size)

    def loss(self, tokens: torch.Tensor) -> torch.Tensor:
        """Negative log-likelihood in nats per token (maximum likelihood training).

        :param tokens: ``(B, *token_shape)`` int64 codes in ``[0, K)``.
        """
        return F.cross_entropy(self(tokens).reshape(-1, self.codebook_size), tokens.reshape(-1).long())

    @torch.no_grad()
    def sample(
        self, num_samples: int, temperature: float = 1.0, generator: torch.Generator | None = None, progress: bool = False
    ) -> torch.Tensor:
        r"""``(num_samples, *token_shape)`` tokens drawn one at a time from :math:`p(z_i \mid z_{<i})^{1/\mathrm{temperature}}`.

        :param num_samples: the number of token arrays drawn.
        :param temperature: the sampling temperature, > 0 (1: the model's distribution).
        :param generator: the random generator of the draws (``None``: PyTorch's global one).
        :param progress: whether to show a progress bar over the positions.
        """
        self._check_sampling(num_samples, temperature)
        device = self.position.device
        symbols = torch.full((num_samples, 1), self.special, dtype=torch.long, device=device)
        for _ in tqdm(range(self.length), desc="AR sampling", disable=not progress, leave=False):
            codes, _ = sample_codes(self.network(symbols)[:, -1], temperature, generator)
            symbols = torch.cat([symbols, codes[:, None]], dim=1)
        return symbols[:, 1:].reshape(num_samples, *self.token_shape)


class MaskedTokenPrior(TokenPrior):
    """MaskGIT/Phenaki: bidirectional Transformer predicting masked tokens, iterative decoding."""

    def forward(self, tokens: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Logits ``(B, *token_shape, K)`` given ``tokens`` with the positions where ``mask`` is True hidden.

        :param tokens: ``(B, *token_shape)`` int64 codes in ``[0, K)`` (values at masked positions are ignored).
        :param mask: ``(B, *token_shape)`` bool, True where the token is replaced by ``[MASK]``.
        """
        flat = self._flatten(tokens)
        if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool or mask.shape != tokens.shape:
            raise ValueError(f"mask must be a bool tensor of the tokens' shape {tuple(tokens.shape)}")
        symbols = flat.masked_fill(mask.reshape(flat.shape), self.special)
        return self.network(symbols).reshape(*tokens.shape, self.codebook_size)

    def random_mask(self, batch_size: int, generator: torch.Generator | None = None) -> torch.Tensor:
        r"""``(B, *token_shape)`` masks hiding :math:`\lceil \cos(\pi u / 2) L \rceil` random positions, :math:`u \sim U(0, 1)`.

        :param batch_size: the number of masks :math:`B`.
        :param generator: the random generator of the draws (``None``: PyTorch's global one).
        """
        check_int(batch_size, "batch_size", low=0)
        check_generator(generator)
        device = self.position.device
        ratio = torch.cos(math.pi / 2 * rand(batch_size, generator, device))
        count = (ratio * self.length).ceil().clamp(1, self.length)
        ranks = rand((batch_size, self.length), generator, device).argsort(1).argsort(1)
        return (ranks < count[:, None]).reshape(batch_size, *self.token_shape)

    def loss(self, tokens: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """Cross-entropy of the masked positions under a cosine-schedule random mask (nats per token).

        :param tokens: ``(B, *token_shape)`` int64 codes in ``[0, K)``.
        :param generator: the random generator of the mask (``None``: PyTorch's global one).
        """
        self._flatten(tokens)
        mask = self.random_mask(tokens.shape[0], generator)
        logits = self(tokens, mask)
        return F.cross_entropy(logits[mask], tokens[mask].long())

    @torch.no_grad()
    def sample(
        self,
        num_samples: int,
        steps: int = 8,
        temperature: float = 1.0,
        generator: torch.Generator | None = None,
        choice_temperature: float = 4.5,
    ) -> torch.Tensor:
        """``(num_samples, *token_shape)`` tokens by ``steps`` rounds of MaskGIT decoding (module docstring).

        :param num_samples: the number of token arrays drawn.
        :param steps: the number of decoding rounds :math:`S`.
        :param temperature: the sampling temperature of the codes, > 0.
        :param generator: the random generator of the draws (``None``: PyTorch's global one).
        :param choice_temperature: the scale of the Gumbel noise added to the confidences, annealed
            linearly to 0 at the last step (0: greedy order).
        """
        self._check_sampling(num_samples, temperature)
        check_int(steps, "steps")
        check_real(choice_temperature, "choice_temperature", low=0.0)
        check_generator(generator)
        device = self.position.device
        tokens = torch.zeros(num_samples, self.length, dtype=torch.long, device=device)
        masked = torch.ones(num_samples, self.length, dtype=torch.bool, device=device)
        for step in range(1, steps + 1):
            logits = self.network(tokens.masked_fill(masked, self.special))
            codes, probability = sample_codes(logits, temperature, generator)
            tokens = torch.where(masked, codes, tokens)
            uniform = rand(probability.shape, generator, device)
            gumbel = -torch.log((-torch.log(uniform.clamp_min(1e-20))).clamp_min(1e-20))
            confidence = probability.log() + choice_temperature * (1 - step / steps) * gumbel
            confidence = confidence.masked_fill(~masked, math.inf)  # revealed tokens are never re-masked
            still_masked = int(masked[0].sum())
            remask = min(math.floor(math.cos(math.pi * step / (2 * steps)) * self.length), still_masked - 1)
            masked = torch.zeros_like(masked)
            if remask > 0:
                masked.scatter_(1, confidence.topk(remask, dim=1, largest=False).indices, True)
        return tokens.reshape(num_samples, *self.token_shape)
