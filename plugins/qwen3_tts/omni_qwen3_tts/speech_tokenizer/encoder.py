"""The 12 Hz codec encoder (Mimi layout): 24 kHz waveform -> 16 codebooks per frame.

Used for voice cloning: the reference audio's codes are part of the Base
variant's in-context prompt. The tree matches transformers' ``MimiModel``
without its decoding half (the release drops ``upsample``,
``decoder_transformer`` and ``decoder``): a SEANet convolutional encoder, a
causal transformer (LayerNorm, GELU MLP, layer scale), a stride-2
downsampling conv from the 25 Hz encoder rate to 12.5 Hz, and a split
residual vector quantizer searched by Euclidean distance.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ..config import EncoderConfig
from ..layers import Attention, register_rope, rope_cos_sin
from .convs import CausalConv1d
from .decoder import LayerScale


class _ELU(nn.ELU):
    """An activation slot in the SEANet layer list (holds no weights)."""


def _conv(cfg: EncoderConfig, cin: int, cout: int, kernel: int, **kw) -> CausalConv1d:
    kw.setdefault("pad_mode", cfg.pad_mode)
    return CausalConv1d(cin, cout, kernel, **kw)


class ResnetBlock(nn.Module):
    """SEANet residual block: ELU, conv(k), ELU, conv(1), identity (or 1x1 conv) shortcut."""

    def __init__(self, cfg: EncoderConfig, dim: int, dilations: tuple[int, int]):
        super().__init__()
        hidden = dim // cfg.compress
        self.block = nn.ModuleList(
            [
                _ELU(),
                _conv(cfg, dim, hidden, cfg.residual_kernel_size, dilation=dilations[0]),
                _ELU(),
                _conv(cfg, hidden, dim, 1, dilation=dilations[1]),
            ]
        )
        self.shortcut: nn.Module = nn.Identity()
        if cfg.use_conv_shortcut:
            self.shortcut = _conv(cfg, dim, dim, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x
        for module in self.block:
            h = module(h)
        return self.shortcut(x) + h


class SEANetEncoder(nn.Module):
    """Conv stem; per ratio: residual blocks, ELU, strided conv doubling channels; ELU, conv."""

    def __init__(self, cfg: EncoderConfig):
        super().__init__()
        layers: list[nn.Module] = [_conv(cfg, cfg.audio_channels, cfg.num_filters, cfg.kernel_size)]
        scale = 1
        for ratio in reversed(cfg.upsampling_ratios):
            channels = scale * cfg.num_filters
            for j in range(cfg.num_residual_layers):
                layers.append(ResnetBlock(cfg, channels, (cfg.dilation_growth_rate**j, 1)))
            layers.append(_ELU())
            layers.append(_conv(cfg, channels, channels * 2, ratio * 2, stride=ratio))
            scale *= 2
        layers.append(_ELU())
        layers.append(_conv(cfg, scale * cfg.num_filters, cfg.hidden_size, cfg.last_kernel_size))
        self.layers = nn.ModuleList(layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


class _GeluMLP(nn.Module):
    def __init__(self, hidden: int, intermediate: int):
        super().__init__()
        self.fc1 = nn.Linear(hidden, intermediate, bias=False)
        self.fc2 = nn.Linear(intermediate, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


class EncoderTransformerLayer(nn.Module):
    def __init__(self, cfg: EncoderConfig, layer: int):
        super().__init__()
        self.self_attn = Attention(
            cfg.hidden_size,
            cfg.num_attention_heads,
            cfg.num_key_value_heads,
            cfg.attn_head_dim,
            layer,
            bias=cfg.attention_bias,
            qk_norm_eps=None,
        )
        self.mlp = _GeluMLP(cfg.hidden_size, cfg.intermediate_size)
        self.input_layernorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.norm_eps)
        self.post_attention_layernorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.norm_eps)
        self.self_attn_layer_scale = LayerScale(cfg.hidden_size, cfg.layer_scale_initial_scale)
        self.mlp_layer_scale = LayerScale(cfg.hidden_size, cfg.layer_scale_initial_scale)

    def forward(self, x, cos, sin, mask):
        x = x + self.self_attn_layer_scale(self.self_attn(self.input_layernorm(x), cos, sin, mask))
        return x + self.mlp_layer_scale(self.mlp(self.post_attention_layernorm(x)))


class EncoderTransformer(nn.Module):
    """Causal transformer over the 25 Hz latents (full causal mask, as the release runs it)."""

    def __init__(self, cfg: EncoderConfig):
        super().__init__()
        self.layers = nn.ModuleList(
            EncoderTransformerLayer(cfg, i) for i in range(cfg.num_hidden_layers)
        )
        register_rope(self, cfg.attn_head_dim, cfg.rope_theta)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        steps = x.shape[1]
        positions = torch.arange(steps, device=x.device)[None].expand(x.shape[0], -1)
        cos, sin = rope_cos_sin(positions, self.inv_freq, x.dtype)
        idx = torch.arange(steps, device=x.device)
        mask = (idx[None, :] <= idx[:, None])[None, None]
        for layer in self.layers:
            x = layer(x, cos, sin, mask)
        return x


class _Codebook(nn.Module):
    """Mimi codebook: buffers ``initialized``, ``cluster_usage``, ``embed_sum``."""

    def __init__(self, size: int, dim: int):
        super().__init__()
        self.register_buffer("initialized", torch.ones(1))
        self.register_buffer("cluster_usage", torch.ones(size))
        self.register_buffer("embed_sum", torch.zeros(size, dim))

    def vectors(self) -> torch.Tensor:
        return self.embed_sum / self.cluster_usage.clamp(min=1e-5)[:, None]


class _VQ(nn.Module):
    def __init__(self, size: int, dim: int):
        super().__init__()
        self.codebook = _Codebook(size, dim)


class _RVQ(nn.Module):
    def __init__(self, cfg: EncoderConfig, count: int):
        super().__init__()
        self.layers = nn.ModuleList(_VQ(cfg.codebook_size, cfg.codebook_dim) for _ in range(count))
        self.input_proj: nn.Module | None = None
        self.output_proj: nn.Module | None = None
        if cfg.vector_quantization_hidden_dimension != cfg.hidden_size:
            dim = cfg.vector_quantization_hidden_dimension
            self.input_proj = nn.Conv1d(cfg.hidden_size, dim, 1, bias=False)
            self.output_proj = nn.Conv1d(dim, cfg.hidden_size, 1, bias=False)

    def encode(self, x: torch.Tensor, count: int) -> torch.Tensor:
        """``x`` ``[B, C, T]`` -> codes ``[count, B, T]`` by greedy residual nearest neighbours."""
        if self.input_proj is not None:
            x = self.input_proj(x)
        residual = x.transpose(1, 2)  # [B, T, D]
        codes = []
        for vq in self.layers[:count]:
            table = vq.codebook.vectors()
            flat = residual.reshape(-1, residual.shape[-1])
            index = torch.cdist(flat[None].float(), table[None].float())[0].argmin(-1)
            index = index.view(residual.shape[:-1])
            residual = residual - F.embedding(index, table)
            codes.append(index)
        return torch.stack(codes)


class _SplitRVQ(nn.Module):
    def __init__(self, cfg: EncoderConfig):
        super().__init__()
        self.semantic = cfg.num_semantic_quantizers
        self.total = cfg.num_quantizers
        self.semantic_residual_vector_quantizer = _RVQ(cfg, self.semantic)
        self.acoustic_residual_vector_quantizer = _RVQ(cfg, cfg.num_quantizers - self.semantic)

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        codes = self.semantic_residual_vector_quantizer.encode(x, self.semantic)
        if self.total > self.semantic:
            rest = self.acoustic_residual_vector_quantizer.encode(x, self.total - self.semantic)
            codes = torch.cat([codes, rest], dim=0)
        return codes.transpose(0, 1)  # [B, K, T]


class Encoder(nn.Module):
    """``encoder``: waveform ``[B, L]`` (24 kHz) -> codes ``[B, K, ceil(L / 1920)]``."""

    def __init__(self, cfg: EncoderConfig):
        super().__init__()
        self.cfg = cfg
        self.encoder = SEANetEncoder(cfg)
        self.encoder_transformer = EncoderTransformer(cfg)
        encoder_rate = math.ceil(cfg.encoder_frame_rate)
        self.downsample: nn.Module | None = None
        if cfg.frame_rate != encoder_rate:
            kernel = 2 * int(encoder_rate / cfg.frame_rate)
            self.downsample = CausalConv1d(
                cfg.hidden_size, cfg.hidden_size, kernel, stride=2, bias=False, pad_mode="replicate"
            )
        self.quantizer = _SplitRVQ(cfg)

    @torch.no_grad()
    def forward(self, wav: torch.Tensor) -> torch.Tensor:
        x = self.encoder(wav[:, None])
        x = self.encoder_transformer(x.transpose(1, 2)).transpose(1, 2)
        if self.downsample is not None:
            x = self.downsample(x)
        return self.quantizer.encode(x)
