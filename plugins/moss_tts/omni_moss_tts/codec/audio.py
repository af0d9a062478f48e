"""Turning a reference clip into what the tokenizer's encoder expects.

MOSS-TTS's processor prepares every clip the same way before encoding it:
channels averaged to mono, resampled to 24 kHz, then loudness-normalised
towards -20 dBFS with the gain limited to +-3 dB (so quiet or loud clips are
nudged, not rescaled wholesale). The codes of a voice-cloning reference
depend on all three steps, so we repeat them in that order.

Resampling difference: the release resamples with torchaudio's windowed-sinc
``functional.resample`` (its defaults); we use ``soxr`` (high quality), which
torchaudio does not need to be installed for. Both are band-limited
resamplers, but their filters differ, so clips at other rates give samples
that differ slightly, and occasionally a different code on later
codebooks. Clips already at 24 kHz are not resampled and match exactly.
"""

from __future__ import annotations

import numpy as np
import torch

TARGET_DBFS = -20.0
MAX_GAIN_DB = 3.0


def to_mono(samples: np.ndarray | torch.Tensor) -> torch.Tensor:
    """``[N]``, ``[C, N]`` or ``[N, C]`` -> float32 ``[N]`` (channel mean).

    For 2-D input the shorter axis is taken as the channel axis (a clip has
    far more samples than channels; ``soundfile`` gives ``[N, C]``,
    ``torchaudio`` ``[C, N]``).
    """
    wav = torch.as_tensor(np.asarray(samples) if not torch.is_tensor(samples) else samples)
    wav = wav.to(torch.float32)
    if wav.dim() == 1:
        return wav
    if wav.dim() != 2:
        raise ValueError(f"expected audio [N], [C, N] or [N, C], got shape {tuple(wav.shape)}")
    channel_axis = 0 if wav.shape[0] <= wav.shape[1] else 1
    return wav.mean(dim=channel_axis)


def loudness_normalize(wav: torch.Tensor) -> torch.Tensor:
    """Scale ``wav`` towards -20 dBFS (mean-square power), by at most +-3 dB."""
    wav = wav.to(torch.float32)
    if wav.numel() == 0:
        return wav
    level = 10.0 * torch.log10(torch.mean(wav**2) + 1e-9)
    gain = min(max(float(TARGET_DBFS - level), -MAX_GAIN_DB), MAX_GAIN_DB)
    return wav * (10.0 ** (gain / 20.0))


def resample(wav: torch.Tensor, rate: int, target: int) -> torch.Tensor:
    """``wav`` ``[N]`` from ``rate`` to ``target`` Hz (``soxr``, high quality); as is if equal."""
    if rate == target:
        return wav
    if rate <= 0:
        raise ValueError(f"sample rate must be positive, got {rate}")
    import soxr

    out = soxr.resample(wav.detach().cpu().numpy().astype(np.float32), rate, target, "HQ")
    return torch.from_numpy(np.ascontiguousarray(out, dtype=np.float32))


def prepare_reference(
    samples: np.ndarray | torch.Tensor, rate: int, target_rate: int = 24000
) -> torch.Tensor:
    """A clip at ``rate`` Hz -> float32 mono ``[N]`` at ``target_rate``, ready for ``encode``."""
    return loudness_normalize(resample(to_mono(samples), int(rate), target_rate))
