"""Causal convolutions and activations of the 12 Hz codec.

Every convolution pads only on the left, so an output sample depends on
inputs at or before it: that is what makes chunked (streaming) decoding with
enough left context equal to decoding everything at once. The ``stream``
methods go one step further: they carry each operation's look-back in a
:class:`~.streaming.StreamState` between chunks, so a stream decodes every
frame once and still equals the full decode.

Qwen3-Omni's code2wav shares these modules; its one difference is that its
upsampling transposed convolutions also trim their overhang on the left
(``left_trim``), which gives each of them a look-ahead of one input step.
A stream emits such a layer's untrimmed outputs, so a stream's first chunk
leads with samples the full decode trims away: the state's *lead* (see
:meth:`~.streaming.StreamState.zero_lead`) zeroes them before every
operation with look-back, where the full decode has its zero padding, and
the decoder crops them from the audio.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from omni_core.engine.cpu_linear import float32_matmul, linear_gelu

if TYPE_CHECKING:
    from .streaming import StreamState


class CausalConv1d(nn.Module):
    """``Conv1d`` left-padded by ``effective_kernel - stride`` (right-padded to a full stride)."""

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int,
        dilation: int = 1,
        stride: int = 1,
        groups: int = 1,
        bias: bool = True,
        pad_mode: str = "constant",
        time_major: bool = False,
    ):
        """``time_major``: long inputs run channels-last (see :func:`time_major`); the
        decoder's convolutions opt in, the encoder's keep the release's exact path."""
        super().__init__()
        self.time_major = time_major and pad_mode == "constant"
        self.conv = nn.Conv1d(
            in_channels,
            out_channels,
            kernel_size,
            stride=stride,
            dilation=dilation,
            groups=groups,
            bias=bias,
        )
        self.stride = stride
        self.effective_kernel = (kernel_size - 1) * dilation + 1
        self.left_pad = self.effective_kernel - stride
        self.pad_mode = pad_mode

    def extra_right_padding(self, length: int) -> int:
        """Right zeros so that the last window is complete (only matters for stride > 1)."""
        frames = (length - self.effective_kernel + self.left_pad) / self.stride + 1
        ideal = (math.ceil(frames) - 1) * self.stride + (self.effective_kernel - self.left_pad)
        return max(ideal - length, 0)

    def _channels_last(self, x: torch.Tensor) -> bool:
        return self.time_major and _long_enough(x, self.conv.in_channels)

    def _convolve(self, x: torch.Tensor, channels_last: bool) -> torch.Tensor:
        if not channels_last:
            return self.conv(x)
        conv = self.conv
        out = F.conv2d(
            time_major(x).unsqueeze(2),
            conv.weight.unsqueeze(2),
            conv.bias,
            stride=(1, conv.stride[0]),
            dilation=(1, conv.dilation[0]),
            groups=conv.groups,
        )
        return out.squeeze(2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        right = self.extra_right_padding(x.shape[-1])
        channels_last = self._channels_last(x)
        if channels_last:
            x = pad_time(x, self.left_pad, right)
        elif self.pad_mode == "constant":
            x = F.pad(x, (self.left_pad, right))
        else:
            x = _pad_non_constant(x, self.left_pad, right, self.pad_mode)
        return self._convolve(x, channels_last)

    def stream(self, x: torch.Tensor, state: StreamState) -> torch.Tensor:
        """The next samples of a stream: the full decode's zero padding, then the carried tail."""
        if self.stride != 1 or self.pad_mode != "constant":
            raise ValueError("only stride-1, zero-padded causal convolutions can stream")
        channels_last = self._channels_last(x)
        if self.left_pad == 0:
            return self._convolve(x, channels_last)
        x = state.zero_lead(x)
        tail = state.tail(self, x, self.left_pad)
        joined = cat_time(tail, x) if channels_last else torch.cat((tail, x), dim=-1)
        state.keep_tail(self, joined, self.left_pad)
        return self._convolve(joined, channels_last)


def _long_enough(x: torch.Tensor, channels: int) -> bool:
    """Whether channels-last pays for ``x``: at least as many time steps (all rows) as channels.

    Measured here (2 threads) on the Qwen3-TTS decoder's shapes: with a long
    input through few channels, torch's channels-first convolution copies the
    whole signal to and from the layout its kernel wants, which cost more than
    the convolution itself in bf16 (96 channels, 23040 steps, kernel 1: 2.9
    against 0.33 ms; kernel 7: 3.4 against 1.0; float32 1.8 against 1.2 and
    8.9 against 6.6). With few steps through many channels the kernel's weight
    rearrangement dominates instead and channels-first is as fast or faster.
    On GPUs (not measured) the release's layout is kept.
    """
    return x.is_cpu and x.shape[0] * x.shape[-1] >= channels


def time_major(x: torch.Tensor) -> torch.Tensor:
    """``x`` ``[B, C, T]`` laid out time-major (channels innermost): a copy unless it is.

    Viewed with a unit axis, such a tensor is ``channels_last``, the layout
    oneDNN's convolutions compute in; element-wise ops keep it, so between two
    channels-last convolutions the signal is never rearranged.
    """
    return x.transpose(1, 2).contiguous().transpose(1, 2)


def cat_time(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``torch.cat((a, b), -1)`` of ``[B, C, T]`` signals, time-major."""
    return torch.cat((a.transpose(1, 2), b.transpose(1, 2)), dim=1).transpose(1, 2)


def pad_time(x: torch.Tensor, left: int, right: int) -> torch.Tensor:
    """``F.pad(x, (left, right))`` of a ``[B, C, T]`` signal, time-major."""
    return F.pad(x.transpose(1, 2), (0, 0, left, right)).transpose(1, 2)


def _pad_non_constant(x: torch.Tensor, left: int, right: int, mode: str) -> torch.Tensor:
    """Reflect padding that also works when the input is shorter than the padding."""
    length = x.shape[-1]
    if mode == "reflect":
        longest = max(left, right)
        extra = 0
        if length <= longest:
            extra = longest - length + 1
            x = F.pad(x, (0, extra))
        out = F.pad(x, (left, right), mode="reflect")
        return out[..., : out.shape[-1] - extra] if extra else out
    return F.pad(x, (left, right), mode=mode)


class CausalTransConv1d(nn.Module):
    """``ConvTranspose1d`` with the ``kernel - stride`` overhang trimmed on the right.

    ``left_trim`` (Qwen3-Omni's code2wav: ``kernel - stride``; Qwen3-TTS: 0)
    also drops that many first outputs, so ``T`` inputs give
    ``T * stride - left_trim`` outputs and output ``j`` is the untrimmed
    output ``j + left_trim``: a look-ahead into the next input.
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int,
        stride: int = 1,
        left_trim: int = 0,
    ):
        super().__init__()
        if not 0 <= left_trim <= kernel_size - stride:
            raise ValueError(f"left_trim {left_trim} outside 0..kernel - stride")
        self.conv = nn.ConvTranspose1d(in_channels, out_channels, kernel_size, stride=stride)
        self.right_trim = kernel_size - stride
        self.left_trim = left_trim
        self.stride = stride
        # Earlier inputs whose kernels still overlap the outputs of a new one.
        self.overlap_inputs = math.ceil(kernel_size / stride) - 1

    def _untrimmed(self, x: torch.Tensor) -> torch.Tensor:
        """``self.conv(x)``, as one product and an overlap-add when the input is short.

        Why: the decoder's first upsampling layers hold the codec's largest
        weights (Qwen3-TTS: 1536x768x16) and see a few dozen inputs per
        chunk, where torch's transposed convolution costs 22-31 ms whatever
        the length (it rearranges the weight at every call), against 3-9 ms
        for the product (measured here, 2 threads, 17 and 49 inputs, float32
        and bf16). Long inputs through small weights are the other way round.
        The CPU only: GPUs keep the release's convolution.
        The sum is reordered: equal within float rounding (about 1e-6
        relative in float32).
        """
        conv, rows = self.conv, x.shape[0] * x.shape[-1]
        if x.is_cpu and 2 * rows <= conv.in_channels and conv.groups == 1:
            out = _transposed_conv_as_product(x, conv.weight, conv.bias, self.stride)
            # where the next layers run channels-last (see _long_enough), hand them that
            return time_major(out) if _long_enough(out, conv.out_channels) else out
        if not _long_enough(x, conv.in_channels):
            return conv(x)
        out = F.conv_transpose2d(
            time_major(x).unsqueeze(2),
            conv.weight.unsqueeze(2),
            conv.bias,
            stride=(1, self.stride),
            groups=conv.groups,
        )
        return out.squeeze(2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self._untrimmed(x)
        if self.left_trim > 0 or self.right_trim > 0:
            x = x[..., self.left_trim : x.shape[-1] - self.right_trim]
        return x

    def stream(self, x: torch.Tensor, state: StreamState) -> torch.Tensor:
        """Outputs of the new inputs, completed by the overhang of the carried ones.

        These are the *untrimmed* outputs (``stride`` per input): with a
        ``left_trim``, a starting row's first ``left_trim`` of them are trimmed
        in the full decode, which the state records as lead (see module doc).
        """
        carried = self.overlap_inputs
        if carried == 0:  # kernel == stride: every input owns its outputs
            out = self._untrimmed(x)
        else:
            # Before the stream's start the full decode has no inputs at all.
            x = state.zero_lead(x)
            tail = state.tail(self, x, carried)
            if _long_enough(x, self.conv.in_channels):
                joined = cat_time(tail, x)
            else:
                joined = torch.cat((tail, x), dim=-1)
            state.keep_tail(self, joined, carried)
            start = carried * self.stride
            out = self._untrimmed(joined)[..., start : start + x.shape[-1] * self.stride]
        state.upsample_lead(self.stride, self.left_trim)
        return out


def _transposed_conv_as_product(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, stride: int
) -> torch.Tensor:
    """``conv_transpose1d(x, weight, bias, stride)`` as ``x^T W`` then an overlap-add.

    ``weight`` is ``[in, out, kernel]``, read in place as ``[in, out * kernel]``:
    every input step yields ``kernel`` outputs per channel, and ``fold`` adds
    the ones that land on the same output sample. The product goes to oneDNN in
    float32 on the CPU (:func:`~omni_core.engine.cpu_linear.float32_matmul`:
    2-2.6x MKL's speed at these shapes on a 2-core AMD EPYC; a 4-frame chunk of
    one stream 22.5 -> 20.7 ms per frame).
    """
    batch, channels, steps = x.shape
    _, out_channels, kernel = weight.shape
    rows = x.transpose(1, 2).reshape(batch * steps, channels)
    columns = float32_matmul(rows, weight.reshape(channels, out_channels * kernel))
    columns = columns.view(batch, steps, out_channels * kernel).transpose(1, 2)
    length = (steps - 1) * stride + kernel
    out = F.fold(columns, (1, length), (1, kernel), stride=(1, stride))[:, :, 0]
    return out if bias is None else out + bias[:, None]


class SnakeBeta(nn.Module):
    """``x + sin(x * e^alpha)^2 / e^beta`` per channel (alpha, beta stored in log scale)."""

    def __init__(self, channels: int):
        super().__init__()
        self.alpha = nn.Parameter(torch.zeros(channels))
        self.beta = nn.Parameter(torch.zeros(channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        alpha = self.alpha.exp()[None, :, None]
        inverse_beta = 1.0 / (self.beta.exp()[None, :, None] + 1e-9)
        if torch.is_grad_enabled():
            return x + torch.sin(x * alpha).pow(2) * inverse_beta
        # Inference: one scratch tensor updated in place. On the CPU these
        # element-wise passes over long audio-rate signals are a large part of
        # the decode, and every fresh full-size temporary costs page faults.
        wave = torch.mul(x, alpha)
        wave.sin_().square_()
        return torch.addcmul(x, wave, inverse_beta)


class ConvNeXtBlock(nn.Module):
    """Depthwise causal conv (k=7), LayerNorm, 4x pointwise MLP with GELU, scaled residual."""

    def __init__(self, dim: int):
        super().__init__()
        self.dwconv = CausalConv1d(dim, dim, 7, groups=dim, time_major=True)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.pwconv1 = nn.Linear(dim, 4 * dim)
        self.pwconv2 = nn.Linear(4 * dim, dim)
        self.gamma = nn.Parameter(torch.full((dim,), 1e-6))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._pointwise(x, self.dwconv(x))

    def stream(self, x: torch.Tensor, state: StreamState) -> torch.Tensor:
        return self._pointwise(x, self.dwconv.stream(x, state))

    def _pointwise(self, x: torch.Tensor, mixed: torch.Tensor) -> torch.Tensor:
        h = self.pwconv2(linear_gelu(self.pwconv1, self.norm(mixed.transpose(1, 2))))
        return x + (self.gamma * h).transpose(1, 2)
