"""Qwen3-Omni's codec decoder (``code2wav.*`` in the checkpoint, prefix stripped).

Only the first step is Qwen3-Omni's own: every frame's codes index one
embedding table (``code_embedding``, ``num_quantizers`` blocks of
``codebook_size`` rows, codebook ``q`` at offset ``q * codebook_size``) and
the vectors are averaged. Everything after that — the sliding-window
transformer, the upsampling with ConvNeXt blocks, the SnakeBeta decoder, the
clamp, and the stateful streaming — is Qwen3-TTS's codec decoder,
:class:`omni_qwen3_tts.speech_tokenizer.decoder.CodecDecoder`, built with the
two settings where the releases differ:

* ``projected=False``: code2wav's transformer runs at ``hidden_size``
  throughout (no ``input_proj`` / ``output_proj``);
* ``trim_left=True``: code2wav's decoder blocks trim their transposed
  convolutions' overhang on both sides, so each looks one input ahead and
  ``F`` frames decode to ``F * 1920 - 555`` samples at the release's rates
  (:attr:`Code2Wav.lookahead_samples`), not ``F * 1920``.

The module names are the shared modules' own (``pre_transformer.layers.*``,
``upsample.*``, ``decoder.*``), which are exactly the release's under
``code2wav.``, plus ``code_embedding.weight``.

Streaming: :meth:`Code2Wav.stream` decodes each frame once and the
concatenated chunks equal :meth:`Code2Wav.decode` of all frames (the
unchunked forward). The release's own ``chunked_decode`` (300-frame chunks
with 25 frames of context) is an approximation that also loses
``lookahead_samples`` at every chunk boundary; a stream loses nothing. The
samples that need the next frame are held back: after ``F`` frames a stream
has produced exactly the ``F * 1920 - 555`` samples of the full decode, the
first chunk giving 555 fewer than its frames' worth and every later chunk
exactly its frames' worth.
"""

from __future__ import annotations

import torch
from torch import nn

from omni_qwen3_tts.speech_tokenizer.decoder import CodecDecoder
from omni_qwen3_tts.speech_tokenizer.streaming import StreamState

from .config import SAMPLE_RATE, Code2WavConfig

__all__ = ["Code2Wav", "StreamState"]


class Code2Wav(CodecDecoder):
    """Codes ``[B, num_quantizers, F]`` -> float32 audio ``[B, 1, F * 1920 - 555]`` in [-1, 1].

    Codes must lie in ``0..codebook_size-1`` (as the talker produces them);
    like the release, they are not checked on the hot path.
    """

    def __init__(self, cfg: Code2WavConfig):
        super().__init__(cfg, cfg.hidden_size, projected=False, trim_left=True)
        self.code_embedding = nn.Embedding(cfg.codebook_size * cfg.num_quantizers, cfg.hidden_size)

    @property
    def samples_per_frame(self) -> int:
        return self.total_upsample

    @property
    def sample_rate(self) -> int:
        return SAMPLE_RATE

    def output_samples(self, frames: int) -> int:
        """Samples of the full decode of ``frames`` frames (0 for none)."""
        return max(frames * self.total_upsample - self.lookahead_samples, 0)

    def embed(self, codes: torch.Tensor, state: StreamState | None = None) -> torch.Tensor:
        """Mean of the frame's code vectors: ``[B, Q, T]`` -> ``[B, T, hidden]`` (no look-back)."""
        offsets = torch.arange(codes.shape[1], device=codes.device) * self.cfg.codebook_size
        return self.code_embedding(codes + offsets[None, :, None]).mean(1)

    @torch.no_grad()
    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        """All frames at once (the reference's forward): float32 ``[B, 1, output_samples(F)]``."""
        self._check_codes(codes)
        if codes.shape[-1] == 0:
            return torch.zeros(codes.shape[0], 1, 0, device=codes.device)
        return self(codes).float()

    @torch.no_grad()
    def stream(self, codes: torch.Tensor, state: StreamState) -> torch.Tensor:
        """The next frames ``[B, Q, n]`` of the streams in ``state``: float32 ``[B, 1, N]``.

        ``N = n * 1920``, less 555 if this is the streams' first chunk (then
        all rows must be starting; :meth:`stream_rows` takes rows at
        different stages). Concatenated, a stream's chunks equal
        :meth:`decode` of all its frames, however the frames were chunked.
        Concurrent streams batch: ``StreamState.stack`` their states, stream
        the stacked codes, ``split`` the state and ``adopt`` each row back.
        """
        return super().stream(codes, state).float()

    @torch.no_grad()
    def stream_rows(self, codes: torch.Tensor, state: StreamState) -> list[torch.Tensor]:
        """:meth:`stream` for rows that may start or continue: float32 ``[1, N_row]`` per row."""
        return [wav.float() for wav in super().stream_rows(codes, state)]
