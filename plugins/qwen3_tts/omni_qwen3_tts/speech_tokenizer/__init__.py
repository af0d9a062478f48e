"""The 12 Hz speech tokenizer (codec): Mimi-style encoder and our decoder.

:class:`SpeechTokenizer` is the module whose ``state_dict`` matches
``speech_tokenizer/model.safetensors`` (``encoder.*``, ``decoder.*``).
"""

from __future__ import annotations

import torch
from torch import nn

from ..config import SpeechTokenizerConfig
from .decoder import Decoder
from .encoder import Encoder

__all__ = ["Decoder", "Encoder", "SpeechTokenizer"]


class SpeechTokenizer(nn.Module):
    """Encoder (reference audio -> codes) and decoder (codes -> 24 kHz audio)."""

    def __init__(self, cfg: SpeechTokenizerConfig):
        super().__init__()
        self.cfg = cfg
        self.encoder = Encoder(cfg.encoder)
        self.decoder = Decoder(cfg.decoder)
        # What the streaming vocoder reads of any codec: output rate, samples per code frame.
        self.samples_per_frame: int = cfg.decode_upsample_rate
        self.sample_rate: int = cfg.output_sample_rate

    @torch.no_grad()
    def encode(self, wav: torch.Tensor) -> torch.Tensor:
        """One mono 24 kHz waveform ``[L]`` -> codes ``[ceil(L / 1920), 16]`` (int64).

        Like the release, frames beyond ``ceil(L / encode_downsample_rate)`` are
        dropped and only the first ``encoder_valid_num_quantizers`` codebooks
        are kept.
        """
        if wav.dim() != 1:
            raise ValueError(f"encode expects one mono waveform [samples], got {tuple(wav.shape)}")
        param = next(self.encoder.parameters())
        codes = self.encoder(wav.to(param.device, param.dtype)[None])[0]
        frames = -(-wav.shape[0] // self.cfg.encode_downsample_rate)
        return codes[: self.cfg.encoder_valid_num_quantizers, :frames].transpose(0, 1).long()

    @torch.no_grad()
    def decode(self, codes: torch.Tensor, reference: torch.Tensor | None = None) -> torch.Tensor:
        """Frames ``[T, 16]`` -> float32 waveform ``[T * 1920]``.

        With ``reference`` codes (voice cloning), they are decoded in front of
        the generated frames for context and their share of the audio is cut
        off again, as the release does. Decoding runs in chunks of 300 frames
        with 25 frames of left context, as the release does.
        """
        full = codes if reference is None else torch.cat([reference.to(codes), codes], dim=0)
        device = next(self.decoder.parameters()).device
        wav = self.decoder.chunked_decode(full.clamp(min=0).T[None].to(device))[0, 0]
        if reference is not None:
            cut = int(reference.shape[0] / max(full.shape[0], 1) * wav.shape[0])
            wav = wav[cut:]
        return wav.float()
