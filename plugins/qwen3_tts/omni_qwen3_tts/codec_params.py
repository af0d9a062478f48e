"""How many weights a Qwen codec holds, from its geometry alone (no torch).

Why counted, not a constant: the planner sized the vocoders' weights from
round figures. Qwen3-Omni's code2wav was taken as 200 M parameters while its
release config builds 216 M, and the Qwen3-TTS tokenizer was 170 M whatever
its config, the tiny demo preset's 0.2 M included. These functions follow
``speech_tokenizer/decoder.py`` and ``encoder.py`` module by module; tests
hold them to the modules' own count (parameters and buffers) for several
geometries, so a change of one without the other fails.
"""

from __future__ import annotations

import math
from typing import Any


def _conv(in_dim: int, out_dim: int, kernel: int, groups: int = 1, bias: bool = True) -> int:
    """A 1-D convolution's (or transposed one's) weight and bias."""
    return in_dim // groups * out_dim * kernel + (out_dim if bias else 0)


def _attention(hidden: int, heads: int, kv_heads: int, head_dim: int, bias: bool) -> int:
    """q, k, v and o projections (no q/k norms: the codecs' transformers have none)."""
    total = 2 * hidden * heads * head_dim + 2 * hidden * kv_heads * head_dim
    return total + (heads * head_dim + 2 * kv_heads * head_dim + hidden if bias else 0)


def codec_decoder_params(cfg: Any, width: int, projected: bool = True) -> int:
    """A ``CodecDecoder`` body of geometry ``cfg``: its sliding-window transformer
    (projected in and out of ``latent_dim`` where ``projected``), its upsampling and
    its SnakeBeta decoder. The code embedding in front is a subclass's, counted by
    :func:`speech_decoder_params` (Qwen3-TTS) or the caller (code2wav's table)."""
    hidden = cfg.hidden_size
    head_dim = cfg.head_dim or hidden // cfg.num_attention_heads
    attention = _attention(
        hidden, cfg.num_attention_heads, cfg.num_key_value_heads, head_dim, cfg.attention_bias
    )
    layer = attention + 3 * hidden * cfg.intermediate_size + 4 * hidden  # norms, scales
    total = cfg.num_hidden_layers * layer + hidden  # and the final norm
    if projected:
        total += 2 * cfg.latent_dim * hidden + hidden + cfg.latent_dim
    for factor in cfg.upsampling_ratios:  # a transposed convolution, then a ConvNeXt block
        total += _conv(width, width, factor)
        total += _conv(width, width, 7, groups=width) + 2 * width  # depthwise, LayerNorm
        total += 2 * 4 * width * width + 5 * width + width  # its MLP and gamma
    total += _conv(width, cfg.decoder_dim, 7)
    for i, rate in enumerate(cfg.upsample_rates):
        in_dim, out_dim = cfg.decoder_dim // 2**i, cfg.decoder_dim // 2 ** (i + 1)
        total += 2 * in_dim + _conv(in_dim, out_dim, 2 * rate)  # SnakeBeta, transposed conv
        # three residual units: two SnakeBetas, a kernel-7 and a 1x1 convolution each
        total += 3 * (4 * out_dim + _conv(out_dim, out_dim, 7) + _conv(out_dim, out_dim, 1))
    last = cfg.decoder_dim // 2 ** len(cfg.upsample_rates)
    return total + 2 * last + _conv(last, 1, 7)


def speech_decoder_params(cfg: Any) -> int:
    """Qwen3-TTS's 12 Hz decoder (a ``DecoderConfig``): :func:`codec_decoder_params` and its code
    embedding: the split quantizer's codebooks (vector sums and usage counts) and 1x1
    projections, and the causal pre-convolution."""
    half = cfg.codebook_dim // 2
    codebooks = cfg.num_quantizers * cfg.codebook_size * (half + 1)
    projections = 2 * 2 * half * cfg.codebook_dim  # in and out, semantic and acoustic
    pre_conv = _conv(cfg.codebook_dim, cfg.latent_dim, 3)
    return codec_decoder_params(cfg, cfg.latent_dim) + codebooks + projections + pre_conv


def speech_encoder_params(cfg: Any) -> int:
    """Qwen3-TTS's 12 Hz encoder (an ``EncoderConfig``; Mimi's layout), which the vocoder's
    process keeps beside the decoder (voice cloning encodes with it): its SEANet
    convolutions, causal transformer, downsampling and quantizer (codebooks are buffers,
    counted as they take memory too)."""
    filters, hidden = cfg.num_filters, cfg.hidden_size
    total = _conv(cfg.audio_channels, filters, cfg.kernel_size)
    scale = 1
    for ratio in reversed(cfg.upsampling_ratios):
        channels = scale * filters
        inner = channels // cfg.compress
        block = _conv(channels, inner, cfg.residual_kernel_size) + _conv(inner, channels, 1)
        if cfg.use_conv_shortcut:
            block += _conv(channels, channels, 1)
        total += cfg.num_residual_layers * block + _conv(channels, 2 * channels, 2 * ratio)
        scale *= 2
    total += _conv(scale * filters, hidden, cfg.last_kernel_size)
    head_dim = cfg.head_dim or hidden // cfg.num_attention_heads
    attention = _attention(
        hidden, cfg.num_attention_heads, cfg.num_key_value_heads, head_dim, cfg.attention_bias
    )
    # GELU MLP without biases, two LayerNorms (weight and bias), two layer scales
    total += cfg.num_hidden_layers * (attention + 2 * hidden * cfg.intermediate_size + 6 * hidden)
    encoder_rate = math.ceil(cfg.encoder_frame_rate)
    if cfg.frame_rate != encoder_rate:
        kernel = 2 * int(encoder_rate / cfg.frame_rate)
        total += _conv(hidden, hidden, kernel, bias=False)
    codebook = cfg.codebook_size * (cfg.codebook_dim + 1) + 1  # sums, usage, initialized
    total += cfg.num_quantizers * codebook
    if cfg.vector_quantization_hidden_dimension != hidden:  # in and out, in both quantizers
        total += 2 * 2 * hidden * cfg.vector_quantization_hidden_dimension
    return total
