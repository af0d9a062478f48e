"""The 12 Hz codec decoder: 16 codebooks per frame -> 1920 samples of 24 kHz audio.

Pipeline (release layout, names match ``decoder.*`` in the checkpoint):
split RVQ dequantisation (1 semantic + N-1 acoustic codebooks, each group
with its own 1x1 projections) -> causal pre-conv -> sliding-window
transformer -> transposed-conv upsampling with ConvNeXt blocks -> SnakeBeta
decoder blocks (transposed conv + dilated residual units) -> clamp to [-1, 1].

Everything is causal. :meth:`Decoder.stream` carries every operation's
look-back between chunks (``streaming.py``), so a stream decodes each frame
once and equals the full decode. The release instead re-decodes a fixed left
context (25 frames) with every chunk, an approximation we keep available as
:meth:`Decoder.decode_chunk`; with at least :meth:`Decoder.exact_context_frames`
of context that too reproduces the full decode, at a much higher cost.

Qwen3-Omni's code2wav (``omni_qwen3_omni.code2wav``) is the same computation
after its first step, under the same module names: :class:`CodecDecoder`
holds that shared part (``pre_transformer``, ``upsample``, ``decoder``, the
full and the streamed pass), and each codec adds only how codes become the
transformer's input (here: split RVQ and ``pre_conv``; there: one summed
embedding table). The differences are constructor parameters: whether the
transformer projects in and out of its width, and whether the decoder
blocks' transposed convolutions trim on the left (code2wav's do, which makes
its full decode ``lookahead_samples`` short of whole frames).
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..codec_footprint import CodecFootprint, decoder_footprint
from ..config import DecoderConfig
from ..layers import Attention, RMSNorm, SwiGLU, register_rope, rope_cos_sin
from .convs import CausalConv1d, CausalTransConv1d, ConvNeXtBlock, SnakeBeta
from .streaming import StreamState, WindowKV


class Codebook(nn.Module):
    """EMA codebook stored as ``embedding_sum / cluster_usage`` (as trained).

    Every decode (every vocoder chunk) reads all vectors, while the two
    parameters only change when weights are loaded or moved, so the quotient
    is cached and recomputed whenever either parameter's storage or version
    counter changes (loading weights after construction still takes effect).
    """

    def __init__(self, size: int, dim: int):
        super().__init__()
        self.cluster_usage = nn.Parameter(torch.ones(size))
        self.embedding_sum = nn.Parameter(torch.zeros(size, dim))
        self._cached: tuple[tuple[Any, ...], torch.Tensor] | None = None

    def _state_key(self) -> tuple[Any, ...] | None:
        """What identifies the parameters' contents; ``None`` when the cache must not be used.

        Writes through ``param.data`` bypass the version counter and are not seen.
        Inference tensors have no version counter, and a result built with grad
        enabled would carry a graph that must not be reused.
        """
        params = (self.embedding_sum, self.cluster_usage)
        if any(p.is_inference() for p in params):
            return None
        if torch.is_grad_enabled() and any(p.requires_grad for p in params):
            return None
        return tuple(item for p in params for item in (p.data_ptr(), p._version, p.dtype, p.device))

    def vectors(self) -> torch.Tensor:
        """The code vectors ``[size, dim]``."""
        key = self._state_key()
        if key is not None and self._cached is not None and self._cached[0] == key:
            return self._cached[1]
        vectors = self.embedding_sum / self.cluster_usage.clamp(min=1e-5)[:, None]
        self._cached = None if key is None else (key, vectors)
        return vectors


class _VQ(nn.Module):
    def __init__(self, size: int, dim: int):
        super().__init__()
        self._codebook = Codebook(size, dim)


class _VQStack(nn.Module):
    def __init__(self, count: int, size: int, dim: int):
        super().__init__()
        self.layers = nn.ModuleList(_VQ(size, dim) for _ in range(count))


class ResidualQuantizer(nn.Module):
    """A group of residual codebooks with input/output 1x1 projections (no bias)."""

    def __init__(self, count: int, size: int, dim: int, outer_dim: int):
        super().__init__()
        self.input_proj = nn.Conv1d(outer_dim, dim, 1, bias=False)  # used by encoding only
        self.output_proj = nn.Conv1d(dim, outer_dim, 1, bias=False)
        self.vq = _VQStack(count, size, dim)

    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        """``codes`` ``[B, K, T]`` -> ``[B, outer_dim, T]``: sum of code vectors, projected."""
        total = None
        for i in range(codes.shape[1]):
            part = F.embedding(codes[:, i], self.vq.layers[i]._codebook.vectors())
            total = part if total is None else total + part
        assert total is not None
        return self.output_proj(total.transpose(1, 2))


class SplitQuantizer(nn.Module):
    """First codebook (semantic) and the rest (acoustic) dequantised separately and summed."""

    def __init__(self, cfg: DecoderConfig):
        super().__init__()
        dim = cfg.codebook_dim // 2
        self.rvq_first = ResidualQuantizer(1, cfg.codebook_size, dim, cfg.codebook_dim)
        self.rvq_rest = ResidualQuantizer(
            cfg.num_quantizers - 1, cfg.codebook_size, dim, cfg.codebook_dim
        )

    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        out = self.rvq_first.decode(codes[:, :1])
        if codes.shape[1] > 1:
            out = out + self.rvq_rest.decode(codes[:, 1:])
        return out


class LayerScale(nn.Module):
    """Per-channel scale of a residual branch (parameter ``scale``; both codecs' transformers)."""

    def __init__(self, channels: int, initial: float):
        super().__init__()
        self.scale = nn.Parameter(torch.full((channels,), initial))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.scale * x


class CodecTransformerLayer(nn.Module):
    """Pre-norm layer with layer-scaled residuals (no q/k norm).

    ``cfg`` is a :class:`DecoderConfig` or any config with the same
    transformer fields (Qwen3-Omni's ``Code2WavConfig``).
    """

    def __init__(self, cfg: Any, layer: int):
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
        self.mlp = SwiGLU(cfg.hidden_size, cfg.intermediate_size)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn_layer_scale = LayerScale(cfg.hidden_size, cfg.layer_scale_initial_scale)
        self.mlp_layer_scale = LayerScale(cfg.hidden_size, cfg.layer_scale_initial_scale)

    def forward(self, x, cos, sin, mask, store=None):
        attended = self.self_attn(self.input_layernorm(x), cos, sin, mask, store)
        x = x + self.self_attn_layer_scale(attended)
        return x + self.mlp_layer_scale(self.mlp(self.post_attention_layernorm(x)))


class CodecTransformer(nn.Module):
    """``pre_transformer``: latent -> hidden -> layers (sliding window) -> latent.

    With ``projected=False`` (code2wav) there are no ``input_proj`` /
    ``output_proj``: the layers run at the latent width (``hidden_size``).
    """

    def __init__(self, cfg: Any, projected: bool = True):
        super().__init__()
        self.window = cfg.sliding_window
        self.layers = nn.ModuleList(
            CodecTransformerLayer(cfg, i) for i in range(cfg.num_hidden_layers)
        )
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.input_proj: nn.Module | None = None
        self.output_proj: nn.Module | None = None
        if projected:
            self.input_proj = nn.Linear(cfg.latent_dim, cfg.hidden_size)
            self.output_proj = nn.Linear(cfg.hidden_size, cfg.latent_dim)
        register_rope(self, cfg.attn_head_dim, cfg.rope_theta)

    def _project_in(self, x: torch.Tensor) -> torch.Tensor:
        return x if self.input_proj is None else self.input_proj(x)

    def _project_out(self, x: torch.Tensor) -> torch.Tensor:
        x = self.norm(x)
        return x if self.output_proj is None else self.output_proj(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` ``[B, T, latent]`` -> ``[B, T, latent]``."""
        x = self._project_in(x)
        steps = x.shape[1]
        positions = torch.arange(steps, device=x.device)[None].expand(x.shape[0], -1)
        cos, sin = rope_cos_sin(positions, self.inv_freq, x.dtype)
        q = torch.arange(steps, device=x.device)[:, None]
        k = torch.arange(steps, device=x.device)[None, :]
        mask = ((k <= q) & (k > q - self.window))[None, None]
        for layer in self.layers:
            x = layer(x, cos, sin, mask)
        return self._project_out(x)

    def stream(self, x: torch.Tensor, state: StreamState) -> torch.Tensor:
        """The next frames ``[B, n, latent]``, attending to the carried window.

        Keys are the ``window - 1`` carried ones (relative positions
        ``-(window-1)..-1``) and the chunk's own (``0..n-1``); query ``i``
        sees key ``r`` when ``i - window < r <= i`` and the key is real
        (not before the stream's start), exactly the full decode's mask.
        """
        x = self._project_in(x)
        steps = x.shape[1]
        carried = state.keys[0].shape[2]
        arange = torch.arange(steps, device=x.device)
        cos, sin = rope_cos_sin(state.position[:, None] + arange[None], self.inv_freq, x.dtype)
        key = torch.arange(carried + steps, device=x.device) - carried
        query = arange[:, None]
        in_window = (key[None] <= query) & (key[None] > query - self.window)  # [n, S]
        real = key[None] >= -state.valid[:, None]  # [B, S]
        mask = (in_window[None] & real[:, None])[:, None]
        store = WindowKV(state)
        for layer in self.layers:
            x = layer(x, cos, sin, mask, store)
        state.valid = (state.valid + steps).clamp(max=carried)
        state.position = state.position + steps
        state.fresh = [False] * state.batch
        return self._project_out(x)


class ResidualUnit(nn.Module):
    def __init__(self, dim: int, dilation: int):
        super().__init__()
        self.act1 = SnakeBeta(dim)
        self.conv1 = CausalConv1d(dim, dim, 7, dilation=dilation, time_major=True)
        self.act2 = SnakeBeta(dim)
        self.conv2 = CausalConv1d(dim, dim, 1, time_major=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv2(self.act2(self.conv1(self.act1(x))))

    def stream(self, x: torch.Tensor, state: StreamState) -> torch.Tensor:
        return x + self.conv2.stream(self.act2(self.conv1.stream(self.act1(x), state)), state)


class DecoderBlock(nn.Module):
    """SnakeBeta, transposed conv upsampling by ``rate``, then residual units (dilation 1, 3, 9).

    ``trim_left`` (code2wav): the transposed conv also trims its ``rate``
    overhang on the left (see :class:`CausalTransConv1d`).
    """

    def __init__(self, in_dim: int, out_dim: int, rate: int, trim_left: bool = False):
        super().__init__()
        self.block = nn.ModuleList(
            [
                SnakeBeta(in_dim),
                CausalTransConv1d(in_dim, out_dim, 2 * rate, rate, rate if trim_left else 0),
                *(ResidualUnit(out_dim, d) for d in (1, 3, 9)),
            ]
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for module in self.block:
            x = module(x)
        return x

    def stream(self, x: torch.Tensor, state: StreamState) -> torch.Tensor:
        for module in self.block:
            x = _stream(module, x, state)
        return x


def _stream(module: nn.Module, x: torch.Tensor, state: StreamState) -> torch.Tensor:
    """A module's streaming step; modules without look-back (activations) just run."""
    step = getattr(module, "stream", None)
    return step(x, state) if step is not None else module(x)


class CodecDecoder(nn.Module):
    """The codec decoder after its code embedding, shared by Qwen3-TTS and Qwen3-Omni.

    Modules (the names both releases use): ``pre_transformer``
    (:class:`CodecTransformer`), ``upsample`` (per ratio, a transposed conv
    with kernel = stride and a :class:`ConvNeXtBlock`) and ``decoder`` (a
    causal conv to ``decoder_dim``, one :class:`DecoderBlock` per rate, each
    halving the width, SnakeBeta and a causal conv to one channel).
    Subclasses add their code embedding and implement :meth:`embed`.

    ``cfg`` is a :class:`DecoderConfig` or a config with the same fields
    (``num_quantizers``, the transformer's, ``upsampling_ratios``,
    ``upsample_rates``, ``decoder_dim``); ``width`` is the channel count
    between the transformer and the decoder; ``projected`` and ``trim_left``
    are passed to :class:`CodecTransformer` and :class:`DecoderBlock`.
    """

    def __init__(self, cfg: Any, width: int, projected: bool = True, trim_left: bool = False):
        super().__init__()
        self.cfg = cfg
        self.width = width
        self.pre_transformer = CodecTransformer(cfg, projected)
        self.upsample = nn.ModuleList(
            nn.ModuleList([CausalTransConv1d(width, width, factor, factor), ConvNeXtBlock(width)])
            for factor in cfg.upsampling_ratios
        )
        stages: list[nn.Module] = [CausalConv1d(width, cfg.decoder_dim, 7, time_major=True)]
        for i, rate in enumerate(cfg.upsample_rates):
            stages.append(
                DecoderBlock(
                    cfg.decoder_dim // 2**i, cfg.decoder_dim // 2 ** (i + 1), rate, trim_left
                )
            )
        out_dim = cfg.decoder_dim // 2 ** len(cfg.upsample_rates)
        stages += [SnakeBeta(out_dim), CausalConv1d(out_dim, 1, 7, time_major=True)]
        self.decoder = nn.ModuleList(stages)
        self.total_upsample = math.prod((*cfg.upsampling_ratios, *cfg.upsample_rates))
        self.lookahead_samples = _lookahead_samples(
            cfg.upsampling_ratios, cfg.upsample_rates, trim_left
        )

    def embed(self, codes: torch.Tensor, state: StreamState | None = None) -> torch.Tensor:
        """Codes ``[B, K, T]`` -> the transformer's input ``[B, T, width or latent]``.

        With ``state``, as the next frames of that stream.
        """
        raise NotImplementedError

    def embed_tail(self) -> int:
        """Elements per row that :meth:`embed` carries between chunks (none here)."""
        return 0

    def footprint(self) -> CodecFootprint:
        """What a stream, a chunk and captured chunks take beyond the weights (bytes)."""
        itemsize = next(self.parameters()).element_size()
        return decoder_footprint(self.cfg, self.width, self.embed_tail(), itemsize)

    def _check_codes(self, codes: torch.Tensor) -> None:
        if codes.dim() != 3 or codes.shape[1] != self.cfg.num_quantizers:
            got = codes.shape[1] if codes.dim() == 3 else f"shape {tuple(codes.shape)}"
            raise ValueError(f"the decoder expects {self.cfg.num_quantizers} codebooks, got {got}")

    @torch.no_grad()
    def forward(self, codes: torch.Tensor) -> torch.Tensor:
        """Codes ``[B, K, T]`` -> waveform ``[B, 1, T * total_upsample - lookahead_samples]``."""
        self._check_codes(codes)
        hidden = self.pre_transformer(self.embed(codes)).transpose(1, 2)
        for trans_conv, convnext in self.upsample:
            hidden = convnext(trans_conv(hidden))
        for stage in self.decoder:
            hidden = stage(hidden)
        return hidden.clamp(-1.0, 1.0)

    def new_stream(self, batch: int = 1) -> StreamState:
        """An empty stream state for ``batch`` rows (see :meth:`stream`)."""
        cfg = self.cfg
        param = next(self.parameters())
        return StreamState(
            batch,
            cfg.num_hidden_layers,
            cfg.num_key_value_heads,
            cfg.sliding_window,
            cfg.attn_head_dim,
            param.device,
            param.dtype,
        )

    @torch.no_grad()
    def stream(self, codes: torch.Tensor, state: StreamState) -> torch.Tensor:
        """The audio of the next frames ``[B, K, n]`` of a stream: ``[B, 1, N]``.

        Concatenating the audio of successive calls equals ``self(all codes)``
        (up to float rounding); ``state`` carries what each causal operation
        needs from earlier frames. ``N`` is ``n * total_upsample``, less
        ``lookahead_samples`` in a stream's first chunk; with a look-ahead,
        the rows must therefore all start their streams or all continue them
        (:meth:`stream_rows` takes any mix).
        """
        wav, cuts = self._stream(codes, state, uniform=True)
        return wav[..., cuts[0] :] if cuts[0] else wav

    @torch.no_grad()
    def stream_rows(self, codes: torch.Tensor, state: StreamState) -> list[torch.Tensor]:
        """:meth:`stream` for rows that may be at different stages: one ``[1, N_row]`` per row."""
        wav, cuts = self._stream(codes, state, uniform=False)
        return [wav[row, :, cut:] for row, cut in enumerate(cuts)]

    def _stream(
        self, codes: torch.Tensor, state: StreamState, uniform: bool, every_row: bool = False
    ) -> tuple[torch.Tensor, list[int]]:
        """The stream's audio with each starting row's lead still in front, and the leads.

        ``every_row``: track the lead on the device for every row, whichever
        starts (see :meth:`StreamState.begin_chunk`; a captured chunk).
        """
        self._check_codes(codes)
        if codes.shape[0] != state.batch:
            raise ValueError(f"codes have {codes.shape[0]} rows, the stream {state.batch}")
        starting = state.begin_chunk(self.lookahead_samples > 0, every_row)
        cuts = [self.lookahead_samples if s else 0 for s in starting or [False] * state.batch]
        if uniform and len(set(cuts)) > 1:
            state.end_chunk()
            raise ValueError(
                "some rows start their streams with this chunk and others continue theirs; "
                "their audio differs in length (use stream_rows)"
            )
        if codes.shape[-1] == 0:
            state.end_chunk()
            param = next(self.parameters())
            return codes.new_zeros((state.batch, 1, 0), dtype=param.dtype), [0] * state.batch
        try:
            hidden = self.pre_transformer.stream(self.embed(codes, state), state).transpose(1, 2)
            for trans_conv, convnext in self.upsample:
                hidden = convnext.stream(trans_conv.stream(hidden, state), state)
            for stage in self.decoder:
                hidden = _stream(stage, hidden, state)
        finally:
            state.end_chunk()
        return hidden.clamp(-1.0, 1.0), cuts

    def exact_context_frames(self) -> int:
        """Left context (frames) after which chunked decoding equals full decoding.

        Sums each causal stage's look-back, converted to frames at the rate it
        runs at: pre-conv (2), the transformer's window per layer, ConvNeXt
        depthwise convs (6 steps each), the first decoder conv, each block's
        transposed conv (one input step) and residual units (6*(1+3+9)
        steps), and the output conv.
        """
        cfg = self.cfg
        frames = 2.0 + cfg.num_hidden_layers * (cfg.sliding_window - 1)
        rate = 1
        for factor in cfg.upsampling_ratios:
            rate *= factor
            frames += 6 / rate
        frames += 6 / rate
        for up in cfg.upsample_rates:
            frames += 1 / rate
            rate *= up
            frames += 6 * (1 + 3 + 9) / rate
        frames += 6 / rate
        return math.ceil(frames) + 1

    @torch.no_grad()
    def decode_chunk(self, codes: torch.Tensor, left_context: int) -> torch.Tensor:
        """Decode ``codes`` ``[B, K, T]`` whose first ``left_context`` frames were already played.

        Returns only the audio of the new frames:
        ``[B, 1, (T - left_context) * total_upsample - lookahead_samples]``.
        """
        if not 0 <= left_context <= codes.shape[-1]:
            raise ValueError(f"left_context {left_context} outside 0..{codes.shape[-1]}")
        wav = self(codes)
        return wav[..., left_context * self.total_upsample :]

    @torch.no_grad()
    def chunked_decode(
        self, codes: torch.Tensor, chunk_size: int = 300, left_context: int = 25
    ) -> torch.Tensor:
        """Decode in chunks of ``chunk_size`` frames, each with ``left_context`` earlier frames.

        With a look-ahead, every chunk's audio lacks its last
        ``lookahead_samples`` (as in the release's ``chunked_decode``).
        """
        pieces = []
        start = 0
        total = codes.shape[-1]
        while start < total:
            stop = min(start + chunk_size, total)
            context = min(left_context, start)
            pieces.append(self.decode_chunk(codes[..., start - context : stop], context))
            start = stop
        return torch.cat(pieces, dim=-1)


def _lookahead_samples(
    ratios: tuple[int, ...] | list[int], rates: tuple[int, ...] | list[int], trim_left: bool
) -> int:
    """Samples a full decode falls short of whole frames (left-trimmed decoder blocks).

    Each block trims ``rate`` outputs on the left, after the earlier blocks'
    trims were upsampled by its rate: 555 for rates (8, 5, 4, 3). Streaming
    crops a row's lead within its first chunk, so the lead must stay shorter
    than one frame's samples at every block.
    """
    if not trim_left:
        return 0
    per_frame, lead = math.prod(ratios), 0
    for rate in rates:
        per_frame *= rate
        lead = lead * rate + rate
        if lead >= per_frame:
            raise ValueError(
                f"upsample_rates {list(rates)} with upsampling_ratios {list(ratios)}: the "
                "left-trimmed blocks would trim a whole frame's samples or more"
            )
    return lead


class Decoder(CodecDecoder):
    """``decoder``: codes ``[B, K, T]`` -> waveform ``[B, 1, T * total_upsample]`` in [-1, 1]."""

    def __init__(self, cfg: DecoderConfig):
        super().__init__(cfg, cfg.latent_dim)
        self.quantizer = SplitQuantizer(cfg)
        self.pre_conv = CausalConv1d(cfg.codebook_dim, cfg.latent_dim, 3)

    def embed(self, codes: torch.Tensor, state: StreamState | None = None) -> torch.Tensor:
        latent = self.quantizer.decode(codes)
        hidden = self.pre_conv(latent) if state is None else self.pre_conv.stream(latent, state)
        return hidden.transpose(1, 2)

    def embed_tail(self) -> int:
        return self.pre_conv.left_pad * self.pre_conv.conv.in_channels
