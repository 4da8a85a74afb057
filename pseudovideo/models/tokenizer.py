r"""Transformer VQ tokenizers (thesis §5.3): the image VQ-VAE and the C-ViViT video tokenizer of Phenaki.

``VideoTokenizer`` cuts a ``(B, T, C, H, W)`` video into ``tubelet_frames x patch_size x patch_size``
tubelets (2x4x4 in the thesis), embeds each with a linear map, and runs spatial Transformer layers
(attention among the ``h w`` tubelets of one time step) then causal temporal layers (attention
among the ``t`` time steps at one spatial position, earlier steps only). Features are quantised to
tokens of shape ``(T/2, H/4, W/4)``; the decoder mirrors the encoder (temporal, then spatial layers)
and maps each token back to its tubelet of pixels. ``ImageTokenizer`` is the 1-frame case: 4x4
patches, spatial layers only, tokens ``(H/4, W/4)``.

Training minimises thesis eq. (5.6), :math:`-\log p(x \mid e_k) + L_\mathrm{vq}` (van den Oord et al.,
*Neural Discrete Representation Learning*, 2017, with the weights of :mod:`pseudovideo.models.quantizer`),
with a Gaussian likelihood, i.e. the pixel MSE plus the quantiser's codebook and commitment terms.
Phenaki's adversarial and perceptual losses are not used.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from probseq._optional import missing
from probseq._validation import check_int, check_tensor

from ..scaling import check_model_range

try:
    from einops import rearrange
except ImportError as _error:
    raise missing("einops", "video", "pseudovideo.models.tokenizer") from _error
from .quantizer import VectorQuantizer, check_tokens


class TokenizerOutput(NamedTuple):
    """What :meth:`VideoTokenizer.forward` returns.

    :param reconstruction: the decoded pixels, shaped like the input.
    :param tokens: ``(B, *token_shape)`` int64 codes.
    :param loss: scalar training loss, ``reconstruction_loss + vq_loss``.
    :param reconstruction_loss: scalar pixel MSE (the Gaussian negative log-likelihood up to constants).
    :param vq_loss: scalar codebook term plus ``beta`` times the commitment term.
    :param perplexity: scalar codebook usage in this batch (:func:`~pseudovideo.models.quantizer.codebook_perplexity`).
    """

    reconstruction: torch.Tensor  # same shape as the input
    tokens: torch.Tensor  # int64, shape (B, *token_shape)
    # reconstruction_loss + vq_loss: the VQ-VAE loss of van den Oord et al. (2017), thesis eq. (5.6),
    # -log p(x | k) + ||sg(f(x)) - e_k||² + beta ||f(x) - sg(e_k)||²
    loss: torch.Tensor
    reconstruction_loss: torch.Tensor  # pixel MSE (Gaussian negative log-likelihood up to constants)
    vq_loss: torch.Tensor  # codebook + beta * commitment
    perplexity: torch.Tensor  # codebook usage in this batch


def transformer_stack(dim: int, heads: int, layers: int) -> nn.TransformerEncoder | None:
    """``layers`` pre-norm Transformer blocks (PyTorch's own) with a 4x MLP and no dropout.

    :param dim: the width, a multiple of ``heads``.
    :param heads: the attention heads per block.
    :param layers: the number of blocks (0 gives ``None``).
    """
    if layers == 0:
        return None
    block = nn.TransformerEncoderLayer(dim, heads, 4 * dim, dropout=0.0, activation="gelu", batch_first=True, norm_first=True)
    return nn.TransformerEncoder(block, layers, enable_nested_tensor=False)


class FactorisedTransformer(nn.Module):
    """Spatial and causal temporal attention over ``(B, t, s, dim)`` tubelet features (C-ViViT).

    ``temporal_first`` runs the temporal layers before the spatial ones (the decoder's order).

    :param dim: the feature width, a multiple of ``heads``.
    :param heads: the attention heads per layer.
    :param spatial_layers: the number of spatial layers (attention among a time step's tubelets).
    :param temporal_layers: the number of causal temporal layers (attention among a position's time steps).
    :param temporal_first: whether the temporal layers run first.
    """

    def __init__(self, dim: int, heads: int, spatial_layers: int, temporal_layers: int, temporal_first: bool = False):
        super().__init__()
        self.spatial = transformer_stack(dim, heads, spatial_layers)
        self.temporal = transformer_stack(dim, heads, temporal_layers)
        self.temporal_first = temporal_first
        self.norm = nn.LayerNorm(dim)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        """The transformed, layer-normalised features, shape ``(B, t, s, dim)``.

        :param features: ``(B, t, s, dim)``: ``t`` time steps of ``s`` tubelets each.
        """
        stages = [self._temporal, self._spatial] if self.temporal_first else [self._spatial, self._temporal]
        for stage in stages:
            features = stage(features)
        return self.norm(features)

    def _spatial(self, features):
        if self.spatial is None:
            return features
        batch = features.shape[0]
        return rearrange(self.spatial(rearrange(features, "b t s d -> (b t) s d")), "(b t) s d -> b t s d", b=batch)

    def _temporal(self, features):
        if self.temporal is None:
            return features
        batch, steps = features.shape[:2]
        causal = nn.Transformer.generate_square_subsequent_mask(steps, device=features.device, dtype=features.dtype)
        flat = rearrange(features, "b t s d -> (b s) t d")
        return rearrange(self.temporal(flat, mask=causal, is_causal=True), "(b s) t d -> b t s d", b=batch)


class VideoTokenizer(nn.Module):
    r"""C-ViViT VQ tokenizer: ``(B, T, C, H, W)`` videos <-> ``(B, T/tubelet_frames, H/p, W/p)`` tokens.

    :param num_frames: the videos' frames :math:`T`, a multiple of ``tubelet_frames``.
    :param image_size: the frames' height and width in pixels, a multiple of ``patch_size``.
    :param channels: the frames' channels.
    :param patch_size: a tubelet's height and width :math:`p` in pixels (4 in the thesis).
    :param tubelet_frames: a tubelet's frames (2 in the thesis).
    :param dim: the Transformer's width, a multiple of ``heads``.
    :param heads: the attention heads per layer.
    :param spatial_layers: the spatial Transformer layers of the encoder and of the decoder each.
    :param temporal_layers: the causal temporal layers of the encoder and of the decoder each.
    :param code_dim: the width of the code vectors.
    :param codebook_size: the number of codes :math:`K` (1024 in the thesis).
    :param beta: the commitment weight :math:`\beta` of the VQ loss (:mod:`pseudovideo.models.quantizer`).
    """

    def __init__(
        self,
        num_frames: int,
        image_size: int,
        channels: int = 1,
        patch_size: int = 4,
        tubelet_frames: int = 2,
        dim: int = 64,
        heads: int = 4,
        spatial_layers: int = 2,
        temporal_layers: int = 2,
        code_dim: int = 32,
        codebook_size: int = 1024,
        beta: float = 0.25,
    ):
        super().__init__()
        for name, value in [
            ("num_frames", num_frames),
            ("image_size", image_size),
            ("channels", channels),
            ("patch_size", patch_size),
            ("tubelet_frames", tubelet_frames),
            ("dim", dim),
            ("heads", heads),
            ("code_dim", code_dim),
        ]:
            check_int(value, name)
        if image_size % patch_size:
            raise ValueError(f"image_size ({image_size}) must be a multiple of patch_size ({patch_size})")
        if num_frames % tubelet_frames:
            raise ValueError(f"num_frames ({num_frames}) must be a multiple of tubelet_frames ({tubelet_frames})")
        if dim % heads:
            raise ValueError(f"dim ({dim}) must be a multiple of heads ({heads})")
        check_int(spatial_layers, "spatial_layers", low=0)
        check_int(temporal_layers, "temporal_layers", low=0)
        if spatial_layers < 0 or temporal_layers < 0 or spatial_layers + temporal_layers == 0:
            raise ValueError(
                f"need spatial_layers, temporal_layers >= 0 and at least one layer, got {spatial_layers} and {temporal_layers}"
            )
        self.num_frames, self.image_size, self.channels = num_frames, image_size, channels
        self.patch_size, self.tubelet_frames = patch_size, tubelet_frames
        self.grid_shape = (num_frames // tubelet_frames, image_size // patch_size, image_size // patch_size)
        self.token_shape: tuple[int, ...] = self.grid_shape  # (h, w) for ImageTokenizer
        steps, side = self.grid_shape[0], self.grid_shape[1]
        pixels = tubelet_frames * patch_size * patch_size * channels
        self.embed_tubelets = nn.Linear(pixels, dim)
        self.encoder_position = nn.Parameter(0.02 * torch.randn(steps, side * side, dim))
        self.encoder = FactorisedTransformer(dim, heads, spatial_layers, temporal_layers)
        self.to_code = nn.Linear(dim, code_dim)
        self.quantizer = VectorQuantizer(code_dim, codebook_size, beta)
        self.from_code = nn.Linear(code_dim, dim)
        self.decoder_position = nn.Parameter(0.02 * torch.randn(steps, side * side, dim))
        self.decoder = FactorisedTransformer(dim, heads, spatial_layers, temporal_layers, temporal_first=True)
        self.to_tubelets = nn.Linear(dim, pixels)

    @property
    def codebook_size(self) -> int:
        return self.quantizer.codebook_size

    def forward(self, videos: torch.Tensor) -> TokenizerOutput:
        r"""Encode, quantise and decode ``videos``; the loss is thesis eq. (5.6), the VQ-VAE loss of van den Oord et al. (2017),
        :math:`-\log p(x \mid k) + \lVert \mathrm{sg}(f(x)) - e_k \rVert^2 + \beta \lVert f(x) - \mathrm{sg}(e_k) \rVert^2`,
        with a Gaussian likelihood.

        :param videos: ``(B, T, C, H, W)`` videos (``(B, C, H, W)`` images for :class:`ImageTokenizer`), in ``[-1, 1]``.
        """
        quantized = self.quantizer(self.features(videos))
        reconstruction = self._pixels(quantized.quantized)
        reconstruction_loss = F.mse_loss(reconstruction, videos)
        return TokenizerOutput(
            reconstruction,
            quantized.indices,
            reconstruction_loss + quantized.loss,
            reconstruction_loss,
            quantized.loss,
            quantized.perplexity,
        )

    def encode(self, videos: torch.Tensor) -> torch.Tensor:
        r"""The int64 tokens ``(B, *token_shape)`` of ``videos`` (thesis eq. (5.5), nearest codes
        :math:`k = \arg\min_i \lVert f(x) - e_i \rVert`); the codebook is not updated.

        :param videos: ``(B, T, C, H, W)`` videos (``(B, C, H, W)`` images for :class:`ImageTokenizer`), in ``[-1, 1]``.
        """
        return self.quantizer(self.features(videos), update_codebook=False).indices

    def decode(self, tokens: torch.Tensor) -> torch.Tensor:
        """Pixels of ``(B, *token_shape)`` tokens, shaped like the tokenizer's input.

        :param tokens: ``(B, *token_shape)`` int64 codes in ``[0, codebook_size)``.
        """
        check_tokens(tokens, self.codebook_size)
        if tokens.dim() < 1 or tuple(tokens.shape[1:]) != self.token_shape or tokens.shape[0] == 0:
            raise ValueError(f"tokens must have shape (B, {', '.join(map(str, self.token_shape))}) with B >= 1, got {tuple(tokens.shape)}")
        return self._pixels(self.quantizer.lookup(tokens))

    def features(self, videos: torch.Tensor) -> torch.Tensor:
        """Pre-quantisation features ``f(x)``, shape ``(B, *token_shape, code_dim)``.

        :param videos: ``(B, T, C, H, W)`` videos (``(B, C, H, W)`` images for :class:`ImageTokenizer`), in ``[-1, 1]``.
        """
        self._check_input(videos)
        tubelets = rearrange(
            videos.reshape(-1, self.num_frames, self.channels, self.image_size, self.image_size),
            "b (t pt) c (h ph) (w pw) -> b t (h w) (pt ph pw c)",
            pt=self.tubelet_frames,
            ph=self.patch_size,
            pw=self.patch_size,
        )
        features = self.encoder(self.embed_tubelets(tubelets) + self.encoder_position)
        return self.to_code(features).reshape(-1, *self.token_shape, self.to_code.out_features)

    def _pixels(self, codes):
        steps, side = self.grid_shape[0], self.grid_shape[1]
        features = self.from_code(codes.reshape(codes.shape[0], steps, side * side, -1))
        tubelets = self.to_tubelets(self.decoder(features + self.decoder_position))
        videos = rearrange(
            tubelets,
            "b t (h w) (pt ph pw c) -> b (t pt) c (h ph) (w pw)",
            h=side,
            pt=self.tubelet_frames,
            ph=self.patch_size,
            pw=self.patch_size,
        )
        return videos.reshape(codes.shape[0], *self.input_shape)

    @property
    def input_shape(self) -> tuple[int, ...]:
        """Shape of one input: ``(T, C, H, W)``."""
        return (self.num_frames, self.channels, self.image_size, self.image_size)

    def _check_input(self, videos):
        if not isinstance(videos, torch.Tensor) or not videos.is_floating_point():
            raise TypeError("videos must be a floating-point tensor")
        if videos.dtype != self.embed_tubelets.weight.dtype:
            raise TypeError(
                f"videos have dtype {videos.dtype} but the tokenizer's parameters are "
                f"{self.embed_tubelets.weight.dtype}: convert one of them (e.g. tokenizer.double())"
            )
        if videos.dim() != len(self.input_shape) + 1 or tuple(videos.shape[1:]) != self.input_shape:
            raise ValueError(f"videos must have shape (B, {', '.join(map(str, self.input_shape))}), got {tuple(videos.shape)}")
        check_tensor(videos, "videos", non_empty=True)
        return check_model_range(videos, "videos")


class ImageTokenizer(VideoTokenizer):
    r"""Image VQ-VAE: ``(B, C, H, W)`` images <-> ``(B, H/p, W/p)`` tokens, spatial Transformer layers only.

    :param image_size: the frames' height and width in pixels, a multiple of ``patch_size``.
    :param channels: the frames' channels.
    :param patch_size: a tubelet's height and width :math:`p` in pixels (4 in the thesis).
    :param dim: the Transformer's width, a multiple of ``heads``.
    :param heads: the attention heads per layer.
    :param spatial_layers: the spatial Transformer layers of the encoder and of the decoder each.
    :param code_dim: the width of the code vectors.
    :param codebook_size: the number of codes :math:`K` (1024 in the thesis).
    :param beta: the commitment weight :math:`\beta` of the VQ loss (:mod:`pseudovideo.models.quantizer`).
    """

    def __init__(
        self,
        image_size: int,
        channels: int = 1,
        patch_size: int = 4,
        dim: int = 64,
        heads: int = 4,
        spatial_layers: int = 4,
        code_dim: int = 32,
        codebook_size: int = 1024,
        beta: float = 0.25,
    ):
        super().__init__(
            1,
            image_size,
            channels,
            patch_size,
            tubelet_frames=1,
            dim=dim,
            heads=heads,
            spatial_layers=spatial_layers,
            temporal_layers=0,
            code_dim=code_dim,
            codebook_size=codebook_size,
            beta=beta,
        )
        self.token_shape = self.token_shape[1:]

    @property
    def input_shape(self) -> tuple[int, ...]:
        return (self.channels, self.image_size, self.image_size)
