"""ECAPA-TDNN speaker encoder (Base variant): reference audio -> x-vector of talker width.

The x-vector takes the place of a named speaker's embedding in the prompt.
The front end is the release's log-mel: 128 Slaney-normalised mel bins at
24 kHz (n_fft 1024, hop 256, window 1024, 0-12 kHz), reflect padding and a
magnitude STFT. The Slaney filterbank is computed here (no librosa needed).
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn

from .config import SpeakerEncoderConfig


def _hz_to_mel(freq: np.ndarray) -> np.ndarray:
    """Slaney mel scale: linear below 1 kHz (200/3 Hz per mel), logarithmic above."""
    f_sp = 200.0 / 3
    mels = freq / f_sp
    min_log_hz, min_log_mel, logstep = 1000.0, 1000.0 / f_sp, math.log(6.4) / 27.0
    log_part = min_log_mel + np.log(np.maximum(freq, 1e-10) / min_log_hz) / logstep
    return np.where(freq >= min_log_hz, log_part, mels)


def _mel_to_hz(mels: np.ndarray) -> np.ndarray:
    f_sp = 200.0 / 3
    freqs = f_sp * mels
    min_log_hz, min_log_mel, logstep = 1000.0, 1000.0 / f_sp, math.log(6.4) / 27.0
    return np.where(mels >= min_log_mel, min_log_hz * np.exp(logstep * (mels - min_log_mel)), freqs)


def slaney_mel_filters(sr: int, n_fft: int, n_mels: int, fmin: float, fmax: float) -> np.ndarray:
    """Triangular mel filterbank ``[n_mels, 1 + n_fft // 2]`` with Slaney area normalisation."""
    fft_freqs = np.linspace(0, sr / 2, 1 + n_fft // 2)
    mel_points = _mel_to_hz(
        np.linspace(_hz_to_mel(np.array(fmin)), _hz_to_mel(np.array(fmax)), n_mels + 2)
    )
    widths = np.diff(mel_points)
    ramps = mel_points[:, None] - fft_freqs[None, :]
    weights = np.zeros((n_mels, len(fft_freqs)))
    for i in range(n_mels):
        lower = -ramps[i] / widths[i]
        upper = ramps[i + 2] / widths[i + 1]
        weights[i] = np.maximum(0, np.minimum(lower, upper))
    weights *= (2.0 / (mel_points[2 : n_mels + 2] - mel_points[:n_mels]))[:, None]
    return weights.astype(np.float32)


def log_mel(
    wav: torch.Tensor,
    sr: int = 24000,
    n_fft: int = 1024,
    n_mels: int = 128,
    hop: int = 256,
    win: int = 1024,
    fmin: float = 0.0,
    fmax: float = 12000.0,
) -> torch.Tensor:
    """``wav`` ``[B, L]`` -> log-mel ``[B, frames, n_mels]`` (the speaker encoder's input)."""
    basis = torch.from_numpy(slaney_mel_filters(sr, n_fft, n_mels, fmin, fmax)).to(wav.device)
    pad = (n_fft - hop) // 2
    padded = torch.nn.functional.pad(wav[:, None], (pad, pad), mode="reflect")[:, 0]
    spec = torch.stft(
        padded,
        n_fft,
        hop_length=hop,
        win_length=win,
        window=torch.hann_window(win, device=wav.device),
        center=False,
        onesided=True,
        return_complex=True,
    )
    magnitude = torch.sqrt(torch.view_as_real(spec).pow(2).sum(-1) + 1e-9)
    mel = torch.matmul(basis, magnitude)
    return torch.log(mel.clamp(min=1e-5)).transpose(1, 2)


class TDNNBlock(nn.Module):
    """Conv1d ('same' length, reflect padding) + ReLU."""

    def __init__(self, cin: int, cout: int, kernel: int, dilation: int):
        super().__init__()
        self.conv = nn.Conv1d(
            cin, cout, kernel, dilation=dilation, padding="same", padding_mode="reflect"
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.conv(x))


class Res2NetBlock(nn.Module):
    """Channel groups processed in a cascade: group i adds group i-1's output before its conv."""

    def __init__(self, cin: int, cout: int, scale: int, kernel: int, dilation: int):
        super().__init__()
        self.scale = scale
        self.blocks = nn.ModuleList(
            TDNNBlock(cin // scale, cout // scale, kernel, dilation) for _ in range(scale - 1)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        outs = []
        prev = None
        for i, part in enumerate(torch.chunk(x, self.scale, dim=1)):
            if i == 0:
                cur = part
            elif i == 1:
                cur = self.blocks[0](part)
            else:
                cur = self.blocks[i - 1](part + prev)
            outs.append(cur)
            prev = cur
        return torch.cat(outs, dim=1)


class SEBlock(nn.Module):
    """Squeeze-excitation: time-mean, bottleneck, sigmoid gate per channel."""

    def __init__(self, cin: int, se: int, cout: int):
        super().__init__()
        self.conv1 = nn.Conv1d(cin, se, 1, padding="same", padding_mode="reflect")
        self.conv2 = nn.Conv1d(se, cout, 1, padding="same", padding_mode="reflect")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate = torch.sigmoid(self.conv2(torch.relu(self.conv1(x.mean(dim=2, keepdim=True)))))
        return x * gate


class SERes2NetBlock(nn.Module):
    def __init__(self, cin: int, cout: int, scale: int, se: int, kernel: int, dilation: int):
        super().__init__()
        self.tdnn1 = TDNNBlock(cin, cout, 1, 1)
        self.res2net_block = Res2NetBlock(cout, cout, scale, kernel, dilation)
        self.tdnn2 = TDNNBlock(cout, cout, 1, 1)
        self.se_block = SEBlock(cout, se, cout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.se_block(self.tdnn2(self.res2net_block(self.tdnn1(x))))


class AttentiveStatsPool(nn.Module):
    """Attention-weighted mean and std over time, conditioned on global mean/std."""

    def __init__(self, channels: int, attention_channels: int):
        super().__init__()
        self.tdnn = TDNNBlock(channels * 3, attention_channels, 1, 1)
        self.conv = nn.Conv1d(
            attention_channels, channels, 1, padding="same", padding_mode="reflect"
        )

    @staticmethod
    def _stats(x: torch.Tensor, weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        mean = (weights * x).sum(2)
        std = torch.sqrt((weights * (x - mean[..., None]).pow(2)).sum(2).clamp(1e-12))
        return mean, std

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        steps = x.shape[-1]
        uniform = torch.full_like(x[:, :1], 1.0 / steps)
        mean, std = self._stats(x, uniform)
        context = torch.cat(
            [x, mean[..., None].expand(-1, -1, steps), std[..., None].expand(-1, -1, steps)], 1
        )
        attention = torch.softmax(self.conv(torch.tanh(self.tdnn(context))), dim=2)
        mean, std = self._stats(x, attention)
        return torch.cat((mean, std), dim=1)[..., None]


class SpeakerEncoder(nn.Module):
    """``speaker_encoder``: log-mel ``[B, frames, mel_dim]`` -> x-vector ``[B, enc_dim]``."""

    def __init__(self, cfg: SpeakerEncoderConfig):
        super().__init__()
        self.cfg = cfg
        ch, ks, dil = cfg.enc_channels, cfg.enc_kernel_sizes, cfg.enc_dilations
        blocks: list[nn.Module] = [TDNNBlock(cfg.mel_dim, ch[0], ks[0], dil[0])]
        for i in range(1, len(ch) - 1):
            blocks.append(
                SERes2NetBlock(
                    ch[i - 1], ch[i], cfg.enc_res2net_scale, cfg.enc_se_channels, ks[i], dil[i]
                )
            )
        self.blocks = nn.ModuleList(blocks)
        self.mfa = TDNNBlock(ch[-1], ch[-1], ks[-1], dil[-1])
        self.asp = AttentiveStatsPool(ch[-1], cfg.enc_attention_channels)
        self.fc = nn.Conv1d(ch[-1] * 2, cfg.enc_dim, 1, padding="same", padding_mode="reflect")

    @torch.no_grad()
    def forward(self, mels: torch.Tensor) -> torch.Tensor:
        x = mels.transpose(1, 2)
        outs = []
        for block in self.blocks:
            x = block(x)
            outs.append(x)
        x = self.mfa(torch.cat(outs[1:], dim=1))
        return self.fc(self.asp(x))[..., 0]

    @torch.no_grad()
    def embed(self, wav: torch.Tensor) -> torch.Tensor:
        """One mono waveform ``[L]`` at ``cfg.sample_rate`` -> x-vector ``[enc_dim]``."""
        param = next(self.parameters())
        mels = log_mel(wav.float()[None].to(param.device), sr=self.cfg.sample_rate)
        return self(mels.to(param.dtype))[0]
