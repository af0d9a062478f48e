"""The audio tower (``thinker.audio_tower``): per-clip log-mel in, thinker-width embeddings out.

Shape of the computation, as the release runs it:

1. each clip's mel ``[128, T]`` is cut into chunks of ``2 * n_window`` frames
   (100 in the release); every chunk goes through three 3x3 stride-2 convs
   (GELU after each) on its own, then ``conv_out`` flattens channels x
   frequency into ``d_model``. A whole chunk yields 13 tokens;
2. sinusoidal positions are added *per chunk* (positions 0..12 restart in
   every chunk), which is why the tower has no length limit of its own;
3. the transformer layers attend within windows of
   ``n_window_infer // (2 * n_window)`` consecutive chunks of one clip
   (8 chunks = 104 tokens = 8 s in the release);
4. ``ln_post``, ``proj1``, activation, ``proj2`` map to the thinker's width.

Windows: the reference builds these windows only under flash-attention-2
(``cu_seqlens``); under sdpa/eager it passes no mask, so every token of the
whole batch attends to every other (clips included). The windows are what the
release was trained and is served with, so we implement them, batched as a
padded ``[windows, longest window, d_model]`` tensor with a key-padding mask
(equivalent to the block-diagonal mask the reference's
``_prepare_attention_mask`` would build). Consequence: we equal the sdpa
reference exactly only for a single clip that fits in one window (up to 8 s in
the release); longer clips equal the reference run with its own block mask.

Padding quirk reproduced: a clip's short tail chunk is zero-padded to the full
chunk width before the convs, so its last tokens see the convs' responses to
padding (the reference pads every chunk of a batch to the widest one). A clip
shorter than one chunk is not padded when the reference runs it alone; we
emulate that per clip (masking the padded conv outputs back to zero), so every
clip's embeddings are independent of what it is batched with.

Parameter names mirror the checkpoint under ``thinker.audio_tower.``; the
sinusoid table is computed (the reference's is a non-persistent buffer, absent
from checkpoints), so loading is strict and ``to_empty`` cannot leave it unset.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ..config import AudioEncoderConfig
from .mel import tokens_per_chunk

_MAX_TIMESCALE = 10_000.0


def _activation(name: str):
    """The config's ``activation_function`` as a callable (the convs always use exact GELU)."""
    if name == "gelu":
        return F.gelu
    if name in ("gelu_new", "gelu_pytorch_tanh"):
        return lambda x: F.gelu(x, approximate="tanh")
    if name == "relu":
        return F.relu
    raise ValueError(f"unsupported audio activation_function {name!r}")


def sinusoid_positions(length: int, channels: int) -> torch.Tensor:
    """``[length, channels]`` float32 Whisper-style table: sines in the first half, cosines after.

    Timescales are geometric from 1 to 10000 over ``channels // 2`` entries,
    computed in float32 the way the reference fills its buffer.
    """
    if channels % 2:
        raise ValueError(f"sinusoidal positions need an even width, got {channels}")
    half = channels // 2
    step = math.log(_MAX_TIMESCALE) / (half - 1)
    rates = torch.exp(-step * torch.arange(half, dtype=torch.float32))
    angles = torch.arange(length)[:, None] * rates[None, :]
    return torch.cat([torch.sin(angles), torch.cos(angles)], dim=1)


@dataclass(frozen=True)
class _Layout:
    """Index bookkeeping for one batch of clips, computed on the host from the lengths alone.

    chunks: total conv chunks; ``chunk_width`` mel frames each (zero-padded).
    conv_widths: per chunk, the frames each conv stage may keep (0 = keep all).
    window_index: ``[windows, longest window]`` flat indices into the conv
        output ``[chunks * tokens_per_chunk (+1 zero row)]``.
    key_mask: ``[windows, longest window]`` which window slots hold real tokens
        (None when all do).
    token_index: for every output token, in clip order, its flat slot in the
        window tensor.
    tokens_per_clip: output rows per clip.
    """

    chunks: int
    chunk_counts: list[int]
    conv_widths: np.ndarray | None
    window_index: np.ndarray
    key_mask: np.ndarray | None
    token_index: np.ndarray
    tokens_per_clip: list[int]


class AudioAttention(nn.Module):
    """Bidirectional multi-head self-attention over padded windows."""

    def __init__(self, config: AudioEncoderConfig) -> None:
        super().__init__()
        width = config.d_model
        self.num_heads = config.encoder_attention_heads
        self.head_dim = width // self.num_heads
        self.q_proj = nn.Linear(width, width)
        self.k_proj = nn.Linear(width, width)
        self.v_proj = nn.Linear(width, width)
        self.out_proj = nn.Linear(width, width)

    def forward(self, x: torch.Tensor, key_mask: torch.Tensor | None) -> torch.Tensor:
        windows, length, width = x.shape

        def heads(t: torch.Tensor) -> torch.Tensor:
            return t.view(windows, length, self.num_heads, self.head_dim).transpose(1, 2)

        out = F.scaled_dot_product_attention(
            heads(self.q_proj(x)),
            heads(self.k_proj(x)),
            heads(self.v_proj(x)),
            attn_mask=key_mask,
            scale=self.head_dim**-0.5,
        )
        return self.out_proj(out.transpose(1, 2).reshape(windows, length, width))


class AudioEncoderLayer(nn.Module):
    """Pre-norm transformer block: attention and a two-layer MLP, each with a residual."""

    def __init__(self, config: AudioEncoderConfig) -> None:
        super().__init__()
        width = config.d_model
        self.self_attn = AudioAttention(config)
        self.self_attn_layer_norm = nn.LayerNorm(width)
        self.fc1 = nn.Linear(width, config.encoder_ffn_dim)
        self.fc2 = nn.Linear(config.encoder_ffn_dim, width)
        self.final_layer_norm = nn.LayerNorm(width)
        self._act = _activation(config.activation_function)

    def forward(self, x: torch.Tensor, key_mask: torch.Tensor | None) -> torch.Tensor:
        x = x + self.self_attn(self.self_attn_layer_norm(x), key_mask)
        x = x + self.fc2(self._act(self.fc1(self.final_layer_norm(x))))
        if x.dtype == torch.float16:
            # float16 overflows in deep stacks; the reference clips just inside the range.
            bound = torch.finfo(torch.float16).max - 1000
            x = x.clamp(-bound, bound)
        return x


class AudioEncoder(nn.Module):
    """``thinker.audio_tower``: a batch of per-clip mels -> per-clip ``[N_i, output_dim]``."""

    def __init__(self, config: AudioEncoderConfig) -> None:
        super().__init__()
        config.validate()
        self.config = config
        hidden = config.downsample_hidden_size
        self.chunk_width = 2 * config.n_window
        self.chunk_tokens = tokens_per_chunk(self.chunk_width)
        self.chunks_per_window = max(1, config.n_window_infer // self.chunk_width)
        freq = config.num_mel_bins
        for _ in range(3):
            freq = (freq + 1) // 2
        self.conv2d1 = nn.Conv2d(1, hidden, 3, 2, padding=1)
        self.conv2d2 = nn.Conv2d(hidden, hidden, 3, 2, padding=1)
        self.conv2d3 = nn.Conv2d(hidden, hidden, 3, 2, padding=1)
        self.conv_out = nn.Linear(hidden * freq, config.d_model, bias=False)
        self.layers = nn.ModuleList(AudioEncoderLayer(config) for _ in range(config.encoder_layers))
        self.ln_post = nn.LayerNorm(config.d_model)
        self.proj1 = nn.Linear(config.d_model, config.d_model)
        self.proj2 = nn.Linear(config.d_model, config.output_dim)
        self._act = _activation(config.activation_function)

    # ----------------------------------------------------------------- sizes
    def token_count(self, mel_frames: int) -> int:
        """Output rows for a clip of ``mel_frames`` frames (the prompt's placeholder count)."""
        whole, rest = divmod(mel_frames, self.chunk_width)
        return whole * self.chunk_tokens + tokens_per_chunk(rest)

    def _layout(self, lengths: Sequence[int]) -> _Layout:
        width, per_chunk, group = self.chunk_width, self.chunk_tokens, self.chunks_per_window
        counts = [-(-t // width) for t in lengths]
        frames = []  # valid mel frames of every chunk, clip after clip
        short = []  # chunks that the reference would convolve unpadded (clip < one chunk)
        window_of = []  # window id of every chunk
        windows = 0
        for t, n in zip(lengths, counts, strict=True):
            if n == 0:
                continue
            sizes = np.full(n, width, dtype=np.int64)
            sizes[-1] = t - width * (n - 1)
            frames.append(sizes)
            short.append(np.full(n, n == 1 and t < width))
            window_of.append(windows + np.arange(n) // group)
            windows += -(-n // group)
        tokens_per_clip = [self.token_count(t) for t in lengths]
        chunks = sum(counts)
        if chunks == 0:
            empty = np.zeros((0, 0), dtype=np.int64)
            return _Layout(0, counts, None, empty, None, empty.ravel(), tokens_per_clip)
        sizes = np.concatenate(frames)
        is_short = np.concatenate(short)
        chunk_window = np.concatenate(window_of)

        stages = [sizes]
        for _ in range(3):  # each stride-2 conv keeps ceil(n / 2) frames
            stages.append(-(-stages[-1] // 2))
        valid = stages[3]  # tokens per chunk
        conv_widths = None
        if is_short.any():
            conv_widths = np.where(is_short[None, :], np.stack(stages[1:]), 0)  # [3, chunks]

        slots = np.arange(per_chunk)[None, :] < valid[:, None]
        flat = np.flatnonzero(slots.ravel())  # conv-output slot of every token, in clip order
        token_window = np.repeat(chunk_window, valid)
        per_window = np.bincount(token_window, minlength=windows)
        starts = np.cumsum(per_window) - per_window
        position = np.arange(flat.size) - starts[token_window]
        longest = int(per_window.max())
        window_index = np.full((windows, longest), chunks * per_chunk, dtype=np.int64)
        window_index[token_window, position] = flat
        key_mask = None
        if (per_window != longest).any():
            key_mask = np.zeros((windows, longest), dtype=bool)
            key_mask[token_window, position] = True
        token_index = token_window * longest + position
        return _Layout(
            chunks, counts, conv_widths, window_index, key_mask, token_index, tokens_per_clip
        )

    # --------------------------------------------------------------- forward
    def _convolve(self, chunks: torch.Tensor, conv_widths: torch.Tensor | None) -> torch.Tensor:
        """``[n, 1, mel, width]`` -> ``[n, tokens_per_chunk, d_model]`` (before positions)."""
        x = chunks
        for stage, conv in enumerate((self.conv2d1, self.conv2d2, self.conv2d3)):
            x = F.gelu(conv(x))
            if conv_widths is not None:
                keep = conv_widths[stage]
                limit = torch.where(keep > 0, keep, x.shape[-1])
                mask = torch.arange(x.shape[-1], device=x.device)[None, :] < limit[:, None]
                x = x * mask[:, None, None, :].to(x.dtype)
        n, channels, freq, steps = x.shape
        return self.conv_out(x.permute(0, 3, 1, 2).reshape(n, steps, channels * freq))

    def forward(self, features: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """Encode clips in one batch: ``features[i]`` is ``[num_mel_bins, T_i]``.

        Returns one ``[audio_token_count(T_i), output_dim]`` tensor per clip;
        each clip's result does not depend on the others in the batch.
        """
        proj = self.proj2.weight
        device, dtype = proj.device, proj.dtype
        lengths = [int(f.shape[-1]) for f in features]
        for f in features:
            if f.dim() != 2 or f.shape[0] != self.config.num_mel_bins:
                raise ValueError(
                    f"expected mel features [{self.config.num_mel_bins}, T], got {tuple(f.shape)}"
                )
        plan = self._layout(lengths)
        if plan.chunks == 0:
            return [proj.new_zeros(0, self.config.output_dim) for _ in features]

        width = self.chunk_width
        pieces = [
            F.pad(f.to(device=device, dtype=dtype), (0, n * width - t))
            for f, t, n in zip(features, lengths, plan.chunk_counts, strict=True)
            if n
        ]
        mel = torch.cat(pieces, dim=1)  # [mel, chunks * width]
        chunks = mel.view(mel.shape[0], plan.chunks, width).transpose(0, 1).unsqueeze(1)
        conv_widths = None
        if plan.conv_widths is not None:
            conv_widths = torch.as_tensor(plan.conv_widths, device=device)

        step = max(1, self.config.conv_chunksize)
        if plan.chunks <= step:
            x = self._convolve(chunks, conv_widths)
        else:  # bound the conv activations' memory, as the reference does
            x = torch.cat(
                [
                    self._convolve(
                        chunks[i : i + step],
                        None if conv_widths is None else conv_widths[:, i : i + step],
                    )
                    for i in range(0, plan.chunks, step)
                ]
            )
        positions = sinusoid_positions(x.shape[1], x.shape[2]).to(device=device, dtype=dtype)
        x = (x + positions).flatten(0, 1)
        x = torch.cat([x, x.new_zeros(1, x.shape[1])])  # the slot empty window places read

        hidden = x[torch.as_tensor(plan.window_index, device=device)]
        key_mask = None
        if plan.key_mask is not None:
            key_mask = torch.as_tensor(plan.key_mask, device=device)[:, None, None, :]
        for layer in self.layers:
            hidden = layer(hidden, key_mask)

        tokens = hidden.flatten(0, 1)[torch.as_tensor(plan.token_index, device=device)]
        out = self.proj2(self._act(self.proj1(self.ln_post(tokens))))
        return list(out.split(plan.tokens_per_clip))


__all__ = ["AudioAttention", "AudioEncoder", "AudioEncoderLayer", "sinusoid_positions"]
