"""The audio front end: 16 kHz mono waveform -> 128-bin Whisper log-mel, and the token budget.

What the release's processor does (transformers 4.57.3, ``Qwen3OmniMoeProcessor``
calling ``WhisperFeatureExtractor`` with ``feature_size=128``, ``padding=True``,
``return_attention_mask=True``; torch path), and what :func:`log_mel` reproduces:

* 400-sample periodic Hann window, hop 160, ``center=True`` with reflect padding
  of 200 samples at both ends, power spectrum (``|X|^2``), the last STFT frame
  dropped -- so a clip of ``L`` samples gives ``L // 160`` frames (10 ms each);
* slaney-scale, slaney-normalised triangular filters from 0 to 8 kHz over the
  201 FFT bins, applied in float32;
* ``log10(max(mel, 1e-10))``, then floored at (the clip's maximum - 8), then
  ``(x + 4) / 4``. The maximum is taken over every frame of the (padded) row.

Batching quirk of the reference: several clips in one processor call are
zero-padded to the longest, so a shorter clip's last frames see zeros instead
of the reflect padding, its floor uses the padded row's maximum, and its valid
length (the attention mask's sum) is ``min(ceil(L / 160), P // 160)`` for a
padded length ``P`` -- one frame more than the ``L // 160`` it gets alone when
``L`` is not a multiple of 160. ``log_mel(..., padded_length=P)`` reproduces a
clip's slice of such a batch exactly; the default is the clip on its own.

Maximum length: the audio tower has no hard limit (positions restart every
100-frame chunk and the release's attention windows are 8 s), so the bound is
the thinker's context. transformers 4.57.x's processor, however, truncates each
clip to its first 30 s: the release's ``preprocessor_config.json`` sets
``n_samples`` 4,800,000 (300 s) without ``chunk_length``, and the extractor
recomputes ``n_samples`` from the default 30 s ``chunk_length`` (later
transformers and vLLM pass ``truncation=False``). We do not truncate unless
asked (``max_samples=REFERENCE_MAX_SAMPLES`` reproduces 4.57.x).

The filter bank is built with numpy; everything else is torch (imported lazily,
so :func:`audio_token_count` stays usable where torch is not).
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np
    import torch

SAMPLE_RATE = 16_000
N_FFT = 400
HOP_LENGTH = 160
NUM_MEL_BINS = 128
# transformers 4.57.x's effective truncation (30 s); see the module docstring.
REFERENCE_MAX_SAMPLES = 30 * SAMPLE_RATE
# The release's conv chunk (2 * n_window mel frames); its placeholder formula hard-codes it.
CHUNK_FRAMES = 100

_LOG10_FLOOR = 1e-10
_DYNAMIC_RANGE = 8.0


def _halve_up(n: int) -> int:
    """Length after one 3x3 stride-2 conv with padding 1: ceil(n / 2)."""
    return -(-n // 2)


def tokens_per_chunk(frames: int) -> int:
    """Tokens one conv chunk of ``frames`` mel frames yields: three stride-2 halvings."""
    return _halve_up(_halve_up(_halve_up(frames)))


def audio_token_count(mel_frames: int, chunk_frames: int = CHUNK_FRAMES) -> int:
    """Audio placeholder tokens (= encoder output rows) for a clip of ``mel_frames`` frames.

    Whole ``chunk_frames`` chunks give 13 tokens each (100 frames -> 50 -> 25 ->
    13); the remainder chunk is downsampled the same way on its own. Equal to
    the reference's ``_get_feat_extract_output_lengths`` for the release's
    100-frame chunks; the tower pads a short tail chunk, but padding never adds
    tokens.
    """
    if mel_frames < 0:
        raise ValueError(f"mel_frames must be >= 0, got {mel_frames}")
    whole, rest = divmod(mel_frames, chunk_frames)
    return whole * tokens_per_chunk(chunk_frames) + tokens_per_chunk(rest)


def mel_frame_count(num_samples: int, padded_length: int | None = None) -> int:
    """Valid mel frames for a clip of ``num_samples`` samples, as the processor counts them.

    Alone (or the longest of a batch): ``num_samples // 160``. Zero-padded to
    ``padded_length`` samples with longer clips: every hop that starts inside
    the clip counts, capped by the padded row's frame count.
    """
    if padded_length is None or padded_length == num_samples:
        return num_samples // HOP_LENGTH
    if padded_length < num_samples:
        raise ValueError(f"padded_length {padded_length} < clip length {num_samples}")
    return min(-(-num_samples // HOP_LENGTH), padded_length // HOP_LENGTH)


def _hz_to_mel_slaney(hz: np.ndarray) -> np.ndarray:
    """Slaney's mel scale: linear (3 mels per 200 Hz) below 1 kHz, logarithmic above."""
    import numpy as np

    hz = np.asarray(hz, dtype=np.float64)
    mel = 3.0 * hz / 200.0
    above = hz >= 1000.0
    mel[above] = 15.0 + np.log(hz[above] / 1000.0) * (27.0 / np.log(6.4))
    return mel


def _mel_to_hz_slaney(mel: np.ndarray) -> np.ndarray:
    import numpy as np

    mel = np.asarray(mel, dtype=np.float64)
    hz = 200.0 * mel / 3.0
    above = mel >= 15.0
    hz[above] = 1000.0 * np.exp((np.log(6.4) / 27.0) * (mel[above] - 15.0))
    return hz


@functools.lru_cache(maxsize=4)
def mel_filters(num_mel_bins: int = NUM_MEL_BINS) -> np.ndarray:
    """The ``[N_FFT // 2 + 1, num_mel_bins]`` float64 filter bank (read-only, cached).

    Triangles whose corners are equally spaced on the slaney mel scale between
    0 Hz and 8 kHz, evaluated at the FFT bin frequencies, each scaled by
    2 / (its width in Hz) so every band carries about the same energy.
    """
    import numpy as np

    bin_hz = np.linspace(0.0, SAMPLE_RATE // 2, N_FFT // 2 + 1)
    lo, hi = _hz_to_mel_slaney(np.array([0.0, 8000.0]))
    corners = _mel_to_hz_slaney(np.linspace(lo, hi, num_mel_bins + 2))
    widths = np.diff(corners)
    offsets = corners[None, :] - bin_hz[:, None]  # [bins, num_mel_bins + 2]
    rising = -offsets[:, :-2] / widths[:-1]
    falling = offsets[:, 2:] / widths[1:]
    bank = np.maximum(0.0, np.minimum(rising, falling))
    bank *= 2.0 / (corners[2:] - corners[:-2])[None, :]
    bank.setflags(write=False)
    return bank


_TORCH_FILTERS: dict[tuple[Any, int], torch.Tensor] = {}


def _filters_on(device: torch.device, num_mel_bins: int) -> torch.Tensor:
    import torch

    key = (device, num_mel_bins)
    bank = _TORCH_FILTERS.get(key)
    if bank is None:
        bank = torch.tensor(mel_filters(num_mel_bins), dtype=torch.float32).T.contiguous()
        bank = _TORCH_FILTERS[key] = bank.to(device)
    return bank


def log_mel(
    waveform: np.ndarray | torch.Tensor,
    *,
    padded_length: int | None = None,
    max_samples: int | None = None,
    num_mel_bins: int = NUM_MEL_BINS,
) -> torch.Tensor:
    """``[num_mel_bins, frames]`` float32 log-mel of a mono 16 kHz clip: valid frames only.

    ``padded_length`` reproduces the clip's slice of a batched processor call
    whose longest clip has that many samples (see the module docstring);
    ``max_samples`` truncates first, as a truncating processor would. A torch
    input is processed on its own device; a numpy one on the CPU. Clips
    shorter than 201 samples cannot be reflect-padded and are rejected, as the
    reference does.
    """
    import torch

    wave = torch.as_tensor(waveform)
    if wave.dim() != 1:
        raise ValueError(f"expected a mono waveform [samples], got shape {tuple(wave.shape)}")
    wave = wave.to(torch.float32)
    if max_samples is not None:
        wave = wave[:max_samples]
        if padded_length is not None:
            padded_length = min(padded_length, max_samples)
    length = int(wave.shape[0])
    frames = mel_frame_count(length, padded_length)
    if padded_length is not None and padded_length > length:
        wave = torch.nn.functional.pad(wave, (0, padded_length - length))
    if wave.shape[0] <= N_FFT // 2:
        raise ValueError(
            f"a clip needs more than {N_FFT // 2} samples (reflect padding), got {wave.shape[0]}"
        )
    window = torch.hann_window(N_FFT, device=wave.device)
    spec = torch.stft(wave, N_FFT, HOP_LENGTH, window=window, return_complex=True)
    power = spec[:, :-1].abs() ** 2  # the reference drops the final frame
    mel = _filters_on(wave.device, num_mel_bins) @ power
    logs = torch.clamp(mel, min=_LOG10_FLOOR).log10()
    logs = torch.maximum(logs, logs.max() - _DYNAMIC_RANGE)
    return ((logs + 4.0) / 4.0)[:, :frames]


__all__ = [
    "CHUNK_FRAMES",
    "HOP_LENGTH",
    "NUM_MEL_BINS",
    "N_FFT",
    "REFERENCE_MAX_SAMPLES",
    "SAMPLE_RATE",
    "audio_token_count",
    "log_mel",
    "mel_filters",
    "mel_frame_count",
    "tokens_per_chunk",
]
