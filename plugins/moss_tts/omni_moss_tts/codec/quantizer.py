"""Residual quantizer: the encoder's latent -> ``num_quantizers`` codes per frame, and back.

Each stage projects the residual into a small codebook space (weight-normed
1x1 convolutions, saved as ``parametrizations.weight.original0/1`` plus a
bias), picks the nearest codebook entry, projects the entry back and
subtracts it from the residual. Decoding is the sum of every stage's
projected entry, followed by the output projection.

Two lookups exist. LFQ (the release's ``rlfq``): encodings and codebook are
L2-normalised before the distance, but the entry used afterwards is the
raw one, and the stage output is written ``z_e + (z_q - z_e)`` (a no-op in
exact arithmetic, kept because its rounding is part of what later stages
see). Plain VQ (``rvq``): raw distances and the raw entry. Distances use the
expanded form ``|e|^2 - 2 e.c + |c|^2`` with the first maximum of the negated
distance winning, as in the release, so codes agree on near ties too.

Plain VQ decoding applies each stage's ``out_proj`` to its entry, as the
release's encode path does; the release's own ``decode_codes`` for ``rvq``
leaves it out and so fails whenever ``codebook_dim != rvq_dim``. Only LFQ is
used by released checkpoints.

Everything here runs in float32 (weights are upcast), as the release does,
whatever the dtype of the transformers around it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .config import QuantizerSpec


def _wn_conv(c_in: int, c_out: int) -> nn.Module:
    """A weight-normed 1x1 convolution with bias, or nothing when the widths agree."""
    if c_in == c_out:
        return nn.Identity()
    # Built on the CPU, then moved to the device the model is being built on: weight_norm
    # splits the weight at once, which on the meta device (build_empty) runs torch's
    # Python reference kernels, whose first call imports dynamo (1.4 s of CPU in the
    # codec's process). A 1x1 convolution is small.
    conv = nn.Conv1d(c_in, c_out, kernel_size=1, device=torch.device("cpu"))
    return nn.utils.parametrizations.weight_norm(conv).to(torch.get_default_device())


def _apply(proj: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """``proj`` on ``x`` ``[B, C, T]`` in float32."""
    if isinstance(proj, nn.Identity):
        return x.float()
    return F.conv1d(x.float(), proj.weight.float(), proj.bias.float())


def _squared_distances(encodings: torch.Tensor, codebook: torch.Tensor) -> torch.Tensor:
    return (
        encodings.pow(2).sum(1, keepdim=True)
        - 2 * encodings @ codebook.t()
        + codebook.pow(2).sum(1, keepdim=True).t()
    )


class CodebookStage(nn.Module):
    """One residual stage: ``in_proj``, ``codebook``, ``out_proj``."""

    def __init__(self, dim: int, codebook_size: int, codebook_dim: int, normalized: bool):
        super().__init__()
        self.normalized = normalized
        self.in_proj = _wn_conv(dim, codebook_dim)
        self.out_proj = _wn_conv(codebook_dim, dim)
        self.codebook = nn.Embedding(codebook_size, codebook_dim)

    def quantize(self, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``residual`` ``[B, dim, T]`` -> (its quantized value, codes ``[B, T]``)."""
        z_e = _apply(self.in_proj, residual)
        b, c, t = z_e.shape
        encodings = z_e.transpose(1, 2).reshape(-1, c)
        codebook = self.codebook.weight.float()
        if self.normalized:
            encodings, codebook = F.normalize(encodings), F.normalize(codebook)
        codes = (-_squared_distances(encodings, codebook)).max(1)[1].reshape(b, t)
        z_q = self.lookup(codes)
        if self.normalized:
            z_q = z_e + (z_q - z_e)
        return _apply(self.out_proj, z_q), codes

    def lookup(self, codes: torch.Tensor) -> torch.Tensor:
        """Raw codebook entries ``[B, codebook_dim, T]`` of ``codes`` ``[B, T]``."""
        return F.embedding(codes, self.codebook.weight).transpose(1, 2).float()

    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        return _apply(self.out_proj, self.lookup(codes))


class ResidualQuantizer(nn.Module):
    def __init__(self, spec: QuantizerSpec):
        super().__init__()
        self.spec = spec
        self.input_proj = _wn_conv(spec.input_dim, spec.rvq_dim)
        self.output_proj = _wn_conv(spec.rvq_dim, spec.output_dim)
        normalized = spec.kind == "lfq"
        self.quantizers = nn.ModuleList(
            CodebookStage(spec.rvq_dim, spec.codebook_size, spec.codebook_dim, normalized)
            for _ in range(spec.num_quantizers)
        )

    def encode(self, latent: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """``latent`` ``[B, input_dim, T]`` -> codes ``[Q, B, T]``.

        ``lengths``: valid frames per row; frames past them are zeroed before
        each lookup and never update the residual (their codes are junk).
        """
        residual = _apply(self.input_proj, latent)
        t = residual.shape[-1]
        valid = (torch.arange(t, device=latent.device)[None, :] < lengths[:, None])[:, None]
        codes = []
        for stage in self.quantizers:
            quantized, stage_codes = stage.quantize(residual * valid)
            residual = residual - quantized * valid
            codes.append(stage_codes)
        return torch.stack(codes)

    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        """Codes ``[Q', B, T]`` (the first ``Q'`` stages) -> latent ``[B, output_dim, T]``."""
        q, b, t = codes.shape
        total = torch.zeros(b, self.spec.rvq_dim, t, device=codes.device, dtype=torch.float32)
        for stage, stage_codes in zip(self.quantizers[:q], codes, strict=True):
            total = total + stage.decode(stage_codes)
        return _apply(self.output_proj, total)
